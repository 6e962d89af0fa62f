//! The pushback report from the caller's side (client::call, server::pushback): a call reports to
//! the request whose handler called it, however the handler runs it, and to no other request.

use backstop::BoxError;
use backstop::client::retry::{ReplayBody, RetryConfig, backoff};
use backstop::server::pushback::{PushbackLayer, retries_exhausted};
use http::{Request, Response};
use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

const NO_RETRY: &str = "backstop-no-retry";

fn retry() -> RetryConfig<backstop::HttpClassifier> {
    RetryConfig::http()
        .max_attempts(3)
        .backoff(backoff::constant(Duration::from_millis(5)))
        .no_budget()
}

/// The HTTP client preset with 3 attempts, no budget and no throttle (so only the retry rule
/// decides).
fn preset() -> backstop::ClientLayer<backstop::HttpClassifier> {
    backstop::client::http()
        .retry(retry())
        .throttle(None)
        .build()
        .unwrap()
}

/// C: always 503, counting attempts.
fn c<B: Send + 'static>(
    count: Arc<AtomicU64>,
) -> impl Service<Request<B>, Response = Response<String>, Error = Infallible, Future: Send> + Clone
{
    service_fn(move |_req: Request<B>| {
        count.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, Infallible>(reply(503)))
    })
}

/// A GET of `path` with an empty body.
fn get(path: &str) -> Request<String> {
    Request::get(path).body(String::new()).unwrap()
}

/// An answer with this status and an empty body.
fn reply<T>(status: T) -> Response<String>
where
    T: TryInto<http::StatusCode>,
    T::Error: Into<http::Error>,
{
    Response::builder()
        .status(status)
        .body(String::new())
        .unwrap()
}

/// A retry layer (3 attempts, no budget) around C, and C's attempt count.
fn failing() -> (
    Arc<AtomicU64>,
    impl Service<Request<String>, Response = Response<impl Send>, Error = BoxError, Future: Send>
    + Clone
    + Send
    + 'static,
) {
    let count = Arc::new(AtomicU64::new(0));
    let client = retry()
        .build()
        .unwrap()
        .layer(c::<ReplayBody<String>>(count.clone()));
    (count, client)
}

/// A → B → C in one process, B behind `server()`. B's handler passes the request it was
/// given on to C through its own client preset (a proxy handler: `client.oneshot(req)`), or,
/// with `forward = false`, builds a fresh request. The PushbackLayer docs: "A client call
/// reports to the request whose handler made it (called it)"; retry docs: "the failing
/// dependency sees at most `max_attempts` attempts per user request".
///
/// With `b_falls_back`, B's handler answers 200 after its call gave up (a fallback of its
/// own), and X's handler, whose one call then succeeded, answers 500 for a reason of its own.
async fn chain(forward: bool, b_falls_back: bool) -> (u64, Response<()>) {
    let count = Arc::new(AtomicU64::new(0));
    let b_client = preset().layer(c::<ReplayBody<ReplayBody<String>>>(count.clone()));
    let handler = service_fn(move |req: Request<ReplayBody<String>>| {
        let b_client = b_client.clone();
        async move {
            let out = if forward {
                req
            } else {
                Request::get("/c").body(ReplayBody::empty()).unwrap()
            };
            let answer = b_client.oneshot(out).await?;
            if b_falls_back {
                assert_eq!(answer.status(), 503, "B's call gave up");
                return Ok::<_, BoxError>(reply(200));
            }
            Ok::<_, BoxError>(reply(answer.status()))
        }
    });
    let b = ServiceBuilder::new()
        .layer(backstop::server())
        .service(handler);
    let a = preset().layer(b);
    // A's call is made by the handler of a server X (the user's request enters there).
    let x = ServiceBuilder::new()
        .layer(backstop::server())
        .service(service_fn(move |_req: Request<String>| {
            let a = a.clone();
            async move {
                let answer = a.oneshot(get("/b")).await?;
                if b_falls_back {
                    assert_eq!(answer.status(), 200, "A's retry of B succeeded");
                    assert_eq!(
                        backstop::client::call_info(&answer).gave_up(),
                        None,
                        "X's one call did not give up"
                    );
                    return Ok::<_, BoxError>(reply(500));
                }
                Ok::<_, BoxError>(reply(answer.status()))
            }
        }));
    let response = x.oneshot(get("/x")).await.unwrap();
    (count.load(Ordering::SeqCst), response.map(|_| ()))
}

#[tokio::test(start_paused = true)]
async fn a_fresh_request_reports_to_its_handler() {
    // Control: holds.
    let (attempts, response) = chain(false, false).await;
    assert_eq!(response.status(), 503);
    assert_eq!(attempts, 3, "C sees max_attempts per user request");
}

#[tokio::test(start_paused = true)]
async fn a_forwarded_request_reports_to_its_own_handler() {
    let (attempts, response) = chain(true, false).await;
    assert_eq!(response.status(), 503);
    assert_eq!(
        attempts, 3,
        "B's handler forwarded the request it received: its client's give-up went to A's \
         call context carried on the request (the Call extension), not to B's request, so B \
         did not say 'do not retry' and A retried B: C saw {attempts} attempts"
    );
}

/// A request's give-up must not leak into another request's answer when both handlers run
/// interleaved on one thread (one task polling both, as a `join!`). X's handler makes a call
/// that gives up and answers 503; Y's handler answers 503 on its own, having made a call that
/// succeeded, polled in between X's polls.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn interleaved_handlers_on_one_thread_do_not_share_a_give_up() {
    let (_, failing) = failing();
    let ok =
        retry()
            .build()
            .unwrap()
            .layer(service_fn(|_req: Request<ReplayBody<String>>| async {
                tokio::time::sleep(Duration::from_millis(3)).await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }));
    let handler = service_fn(move |req: Request<String>| {
        let failing = failing.clone();
        let ok = ok.clone();
        async move {
            if req.uri().path() == "/x" {
                let r = failing.oneshot(get("/")).await?;
                assert!(retries_exhausted());
                Ok::<_, BoxError>(reply(r.status()))
            } else {
                for _ in 0..10 {
                    let _ = ok.clone().oneshot(get("/")).await?;
                    assert!(!retries_exhausted(), "Y sees X's give-up");
                }
                Ok(reply(500))
            }
        }
    });
    let server = ServiceBuilder::new()
        .layer(PushbackLayer::new())
        .service(handler);
    let x = server.clone().oneshot(get("/x"));
    let y = server.clone().oneshot(get("/y"));
    let (x, y) = tokio::join!(x, y);
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x.headers()[NO_RETRY], "1");
    assert!(
        y.headers().get(NO_RETRY).is_none(),
        "X's give-up leaked into Y"
    );
}

/// Nested servers: an outer server's handler calls an inner server (in process) whose
/// handler's call gives up; the outer handler answers 500 of its own without any client
/// call: the outer request made no call that gave up and must not be stamped.
#[tokio::test(start_paused = true)]
async fn nested_servers_keep_their_own_flags() {
    let (_, failing) = failing();
    let inner = ServiceBuilder::new()
        .layer(backstop::server())
        .service(service_fn(move |_req: Request<String>| {
            let failing = failing.clone();
            async move {
                let r = failing.oneshot(get("/")).await?;
                Ok::<_, BoxError>(reply(r.status()))
            }
        }));
    let outer = ServiceBuilder::new()
        .layer(backstop::server())
        .service(service_fn(move |_req: Request<String>| {
            let inner = inner.clone();
            async move {
                let r = inner.oneshot(get("/in")).await?;
                assert_eq!(
                    r.headers()[NO_RETRY],
                    "1",
                    "the inner server stamped its answer"
                );
                assert!(
                    !retries_exhausted(),
                    "the inner request's give-up leaked out"
                );
                Ok::<_, BoxError>(reply(500))
            }
        }));
    let r = outer.oneshot(get("/out")).await.unwrap();
    assert_eq!(r.status(), 500);
    assert!(r.headers().get(NO_RETRY).is_none());
}

/// A handler that made a call which gave up, then panicked (caught by an outer handler with
/// `catch_unwind`): the outer request's scope is put back, and it is not marked.
#[tokio::test(start_paused = true)]
async fn a_panicking_nested_handler_leaves_the_outer_scope_clean() {
    use futures_util::FutureExt;
    let (_, failing) = failing();
    let inner = ServiceBuilder::new()
        .layer(PushbackLayer::new())
        .service(service_fn(move |_req: Request<String>| {
            let failing = failing.clone();
            async move {
                let _ = failing.oneshot(get("/")).await;
                assert!(retries_exhausted());
                panic!("handler panicked");
                #[allow(unreachable_code)]
                Ok::<Response<String>, BoxError>(Response::new(String::new()))
            }
        }));
    let outer = ServiceBuilder::new()
        .layer(PushbackLayer::new())
        .service(service_fn(move |_req: Request<String>| {
            let inner = inner.clone();
            async move {
                let caught = std::panic::AssertUnwindSafe(inner.oneshot(get("/in")))
                    .catch_unwind()
                    .await;
                assert!(caught.is_err());
                assert!(
                    !retries_exhausted(),
                    "the panicking handler's mark leaked out"
                );
                Ok::<_, BoxError>(reply(500))
            }
        }));
    let r = outer.oneshot(get("/out")).await.unwrap();
    assert!(r.headers().get(NO_RETRY).is_none());
    // And nothing is left on this thread.
    assert!(!retries_exhausted());
}

/// A call made in the handler, polled once, then dropped; the handler answers 503 of its own:
/// the call never gave up, so the answer is not stamped. And one made, then raced in
/// `select!` against a short sleep that wins: not stamped either.
#[tokio::test(start_paused = true)]
async fn a_dropped_or_lost_race_call_does_not_stamp() {
    let (_, failing) = failing();
    let handler = service_fn(move |req: Request<String>| {
        let mut failing = failing.clone();
        async move {
            let call = failing.ready().await?.call(get("/"));
            if req.uri().path() == "/drop" {
                let mut call = Box::pin(call);
                let pending = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(call.as_mut().poll(cx).is_pending())
                })
                .await;
                assert!(pending);
                drop(call);
            } else {
                tokio::select! {
                    _ = call => panic!("the call should lose"),
                    _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                }
            }
            // Let any timers the dropped call had armed fire.
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, BoxError>(reply(503))
        }
    });
    let server = ServiceBuilder::new()
        .layer(PushbackLayer::new())
        .service(handler);
    for path in ["/drop", "/select"] {
        let r = server.clone().oneshot(get(path)).await.unwrap();
        assert!(r.headers().get(NO_RETRY).is_none(), "{path}");
    }
}

/// A call made in the handler and moved into a `JoinSet` reports; the handler answers after it.
#[tokio::test(start_paused = true)]
async fn a_call_moved_into_a_joinset_reports() {
    let count = Arc::new(AtomicU64::new(0));
    let client = preset().layer(c::<ReplayBody<String>>(count.clone()));
    let handler = service_fn(move |_req: Request<String>| {
        let mut client = client.clone();
        async move {
            let call = client.ready().await?.call(get("/"));
            let mut set = tokio::task::JoinSet::new();
            set.spawn(call);
            let r = set.join_next().await.unwrap().unwrap()?;
            Ok::<_, BoxError>(reply(r.status()))
        }
    });
    let server = ServiceBuilder::new()
        .layer(backstop::server())
        .service(handler);
    let r = server.oneshot(get("/")).await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(count.load(Ordering::SeqCst), 3);
    assert_eq!(r.headers()[NO_RETRY], "1");
}

/// A call whose body is too long to keep for replay is sent once; when it fails with a
/// downstream "do not retry", the retry layer gives up for `Hint` (an `exhausts_retries`
/// reason), which the docs say is reported to the handler's request: "when a RetryLayer
/// used by the handler gave up on a retryable failure (attempts, budget, deadline, or a
/// downstream "do not retry"), stamps "do not retry" on the handler's failed response".
#[tokio::test(start_paused = true)]
async fn an_unreplayable_call_that_hears_do_not_retry_reports() {
    let count = Arc::new(AtomicU64::new(0));
    let counter = count.clone();
    let c = service_fn(move |_req: Request<ReplayBody<String>>| {
        counter.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, Infallible>(
            Response::builder()
                .status(503)
                .header(NO_RETRY, "1")
                .body(String::new())
                .unwrap(),
        ))
    });
    let layer = retry().build().unwrap();
    let client = layer.clone().layer(c);
    let handler = service_fn(move |_req: Request<String>| {
        let client = client.clone();
        async move {
            // A PUT (idempotent) of 100 KiB: over the 64 KiB replay limit.
            let big = "x".repeat(100 * 1024);
            let r = client.oneshot(Request::put("/").body(big).unwrap()).await?;
            let info = backstop::client::call_info(&r);
            Ok::<_, BoxError>(
                Response::builder()
                    .status(r.status())
                    .header("gave-up", format!("{:?}", info.gave_up()))
                    .body(())
                    .unwrap(),
            )
        }
    });
    let server = ServiceBuilder::new()
        .layer(PushbackLayer::new())
        .service(handler);
    let r = server.oneshot(get("/")).await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let gave_up = r.headers()["gave-up"].to_str().unwrap().to_owned();
    assert!(
        r.headers().get(NO_RETRY).is_some(),
        "the call gave up for {gave_up} (exhausts_retries: {}) but B's 503 was not stamped",
        backstop::client::retry::GiveUp::Hint.exhausts_retries()
    );
}

/// The same forwarding, seen from the user's request X: B's call to C gives up, but B's handler
/// falls back and answers 200, so A's call (X's one call) succeeds without giving up. X then
/// answers 500 for a reason of its own: a failure its callers may retry. B's give-up must have
/// gone to B's request (whose 200 is not stamped), not to X's through the request B was
/// forwarded: X's 500 carries no "do not retry". (Found by an outside attack: the context on
/// the forwarded request carried X's flag into B's client.)
#[tokio::test(start_paused = true)]
async fn a_forwarded_requests_give_up_stays_out_of_the_callers_answer() {
    let (attempts, response) = chain(true, true).await;
    assert_eq!(response.status(), 500);
    assert_eq!(attempts, 3, "B's three attempts");
    assert!(
        response.headers().get(NO_RETRY).is_none(),
        "X's 500 was stamped 'do not retry' by B's give-up"
    );
}

/// Our own rejection (an open breaker's `BreakerOpen`) met by a call: the retry docs say
/// "When a retry layer gives up on a retryable failure (...) or meets our own rejection, it
/// marks the request it serves". A call with a small body marks it; the same call with a body
/// too long to keep (sent once) does not.
#[tokio::test(start_paused = true)]
async fn our_own_rejection_marks_whatever_the_body_size() {
    let open = service_fn(|_req: Request<ReplayBody<String>>| async {
        Err::<Response<String>, BoxError>(Box::new(backstop::BreakerOpen::new(None)))
    });
    let client = retry().build().unwrap().layer(open);
    let handler = service_fn(move |req: Request<String>| {
        let client = client.clone();
        async move {
            let size = if req.uri().path() == "/big" {
                100 * 1024
            } else {
                10
            };
            let r = client
                .oneshot(Request::put("/").body("x".repeat(size)).unwrap())
                .await;
            assert!(r.is_err());
            Ok::<_, BoxError>(reply(503))
        }
    });
    let server = ServiceBuilder::new()
        .layer(PushbackLayer::new())
        .service(handler);
    let small = server.clone().oneshot(get("/small")).await.unwrap();
    assert_eq!(
        small.headers()[NO_RETRY],
        "1",
        "control: a small body marks"
    );
    let big = server.oneshot(get("/big")).await.unwrap();
    assert!(
        big.headers().get(NO_RETRY).is_some(),
        "a call with a body over max_replay_bytes met our own rejection and did not mark"
    );
}

/// A Buffer between the first layer (PropagateDeadline, which begins the call in the handler)
/// and the retry layer (called on the Buffer's worker): the call still reports to the handler's
/// request, and the retry still tells no more than the handler's deadline.
#[tokio::test(start_paused = true)]
async fn a_buffer_between_the_deadline_and_retry_layers_keeps_both() {
    let count = Arc::new(AtomicU64::new(0));
    let told = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (counter, log) = (count.clone(), told.clone());
    let c = service_fn(move |req: Request<ReplayBody<String>>| {
        counter.fetch_add(1, Ordering::SeqCst);
        log.lock().unwrap().push(
            req.headers()
                .get("grpc-timeout")
                .map(|v| v.to_str().unwrap().to_owned()),
        );
        std::future::ready(Ok::<_, Infallible>(reply(503)))
    });
    let client = ServiceBuilder::new()
        .layer(backstop::deadline::PropagateDeadlineLayer::new())
        .layer(tower::buffer::BufferLayer::new(8))
        .layer(retry().build().unwrap())
        .service(c);
    let handler = service_fn(move |_req: Request<String>| {
        let client = client.clone();
        async move {
            let r = client.oneshot(get("/")).await?;
            Ok::<_, BoxError>(reply(r.status()))
        }
    });
    let server = ServiceBuilder::new()
        .layer(backstop::server())
        .service(handler);
    let r = server
        .oneshot(
            Request::get("/")
                .header("grpc-timeout", "2S")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(count.load(Ordering::SeqCst), 3);
    assert_eq!(r.headers()[NO_RETRY], "1");
    for t in told.lock().unwrap().iter() {
        let t = t.as_deref().expect("told");
        assert!(backstop_test_support::told_ms(t) < 2000, "{t}");
    }
}
