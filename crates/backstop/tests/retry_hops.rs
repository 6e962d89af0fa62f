//! Across hops: A → B → C where C always fails. With `PushbackLayer` on B, C sees at most
//! `max_attempts` attempts per user request instead of `max_attempts²`.

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

fn grpc_request() -> Request<String> {
    backstop_test_support::grpc_call("")
}

fn unavailable() -> Response<String> {
    Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", "14")
        .body(String::new())
        .unwrap()
}

fn policy() -> RetryConfig<backstop::GrpcClassifier> {
    RetryConfig::grpc()
        .max_attempts(3)
        .backoff(backoff::constant(Duration::from_millis(5)))
        .no_budget()
}

/// C: always UNAVAILABLE, counting attempts.
fn c(count: Arc<AtomicU64>) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    service_fn(move |_req: Request<ReplayBody<String>>| {
        count.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, Infallible>(unavailable()))
    })
}

/// B: a server whose handler calls C through a retry layer.
fn b(
    count: Arc<AtomicU64>,
    pushback: bool,
) -> impl Service<
    Request<ReplayBody<String>>,
    Response = Response<String>,
    Error = BoxError,
    Future = impl Send,
> + Clone
+ Send {
    let client = policy().build().unwrap().layer(c(count));
    service_fn(move |_req: Request<ReplayBody<String>>| {
        let client = client.clone();
        async move {
            let response = client.oneshot(grpc_request()).await;
            // Inside B's PushbackLayer scope the give-up is visible to the handler.
            assert_eq!(retries_exhausted(), pushback);
            response.map(|r| r.map(|body| body.into_inner()))
        }
    })
}

async fn attempts_on_c(pushback: bool) -> (u64, Response<String>) {
    let count = Arc::new(AtomicU64::new(0));
    let retry = policy().build().unwrap();
    let response = if pushback {
        let server = ServiceBuilder::new()
            .layer(PushbackLayer::new())
            .service(b(count.clone(), true));
        retry.layer(server).oneshot(grpc_request()).await.unwrap()
    } else {
        retry
            .layer(b(count.clone(), false))
            .oneshot(grpc_request())
            .await
            .unwrap()
    };
    (
        count.load(Ordering::SeqCst),
        response.map(|body| body.into_inner()),
    )
}

#[tokio::test(start_paused = true)]
async fn pushback_bounds_the_attempts_on_the_failing_hop() {
    let (with, response) = attempts_on_c(true).await;
    assert_eq!(with, 3, "C sees max_attempts per user request");
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(response.headers()["grpc-retry-pushback-ms"], "-1");

    let (without, _) = attempts_on_c(false).await;
    assert_eq!(without, 9, "without pushback the attempts multiply");
}

#[tokio::test(start_paused = true)]
async fn successes_and_unmarked_failures_are_not_stamped() {
    let ok = ServiceBuilder::new()
        .layer(PushbackLayer::new())
        .service(service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(unavailable())
        }));
    let response = ok.oneshot(grpc_request()).await.unwrap();
    assert!(response.headers().get("grpc-retry-pushback-ms").is_none());
    assert!(!retries_exhausted());
}

#[tokio::test(start_paused = true)]
async fn retried_calls_can_run_on_spawned_tasks() {
    // The retry future is Send, also when the inner error is already a BoxError.
    let count = Arc::new(AtomicU64::new(0));
    let client = policy().build().unwrap().layer(b(count.clone(), false));
    let task = tokio::spawn(async move { client.oneshot(grpc_request()).await });
    let response = task.await.unwrap().unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
}

/// The same across plain HTTP hops: B's exhausted 503 says "do not retry" in backstop's own
/// header, with no gRPC header on it, and A does not retry it.
#[tokio::test(start_paused = true)]
async fn a_plain_http_hop_says_do_not_retry_without_grpc_headers() {
    let count = Arc::new(AtomicU64::new(0));
    let c_count = count.clone();
    let c = service_fn(move |_req: Request<ReplayBody<String>>| {
        c_count.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, Infallible>(
            Response::builder().status(503).body(String::new()).unwrap(),
        ))
    });
    let http_policy = || {
        RetryConfig::http()
            .max_attempts(3)
            .backoff(backoff::constant(Duration::from_millis(5)))
            .no_budget()
    };
    let client = http_policy().build().unwrap().layer(c);
    let b = ServiceBuilder::new()
        .layer(PushbackLayer::new())
        .service(service_fn(move |_req: Request<ReplayBody<String>>| {
            let client = client.clone();
            async move {
                let response = client
                    .oneshot(Request::get("/c").body(String::new()).unwrap())
                    .await;
                response.map(|r| r.map(|body| body.into_inner()))
            }
        }));
    let response = http_policy()
        .build()
        .unwrap()
        .layer(b)
        .oneshot(Request::get("/b").body(String::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["backstop-no-retry"], "1");
    assert!(response.headers().get("grpc-retry-pushback-ms").is_none());
    assert_eq!(count.load(Ordering::SeqCst), 3, "A did not retry B");
}

/// How B's handler makes its call to C.
#[derive(Debug, Clone, Copy)]
enum Caller {
    /// Calls, then spawns the call's future onto another task and awaits it.
    CallThenSpawn,
    /// Polls the call once, then moves it into a `FuturesUnordered`.
    PollThenMove,
    /// Through the client preset (whose deadline layer begins the call) under a
    /// `ConcurrencyLimit`, the call then spawned.
    PresetUnderLimit,
    /// Through the client preset behind a `Buffer`, whose worker task calls the preset's
    /// layers: the call begins outside the handler, so it cannot report to it.
    PresetBehindBuffer,
}

/// B's handler makes its call to C as `caller` says; B is under a `PushbackLayer`.
async fn b_reports(caller: Caller) -> (u64, Response<String>) {
    use futures_util::{StreamExt, stream::FuturesUnordered};
    let count = Arc::new(AtomicU64::new(0));
    let c = c(count.clone());
    let retry = policy().build().unwrap().layer(c.clone());
    let preset = backstop::client::grpc().retry(policy()).build().unwrap();
    let limited = tower::limit::ConcurrencyLimit::new(preset.layer(c.clone()), 4);
    let buffered = tower::buffer::Buffer::new(preset.layer(c), 8);
    let handler = service_fn(move |_req: Request<String>| {
        let retry = retry.clone();
        let mut buffered = buffered.clone();
        let mut limited = limited.clone();
        async move {
            let answer = match caller {
                Caller::CallThenSpawn => {
                    // Called here (`oneshot` would call only once polled, on the new task).
                    let mut retry = retry;
                    let call = retry.ready().await.unwrap().call(grpc_request());
                    tokio::spawn(call)
                        .await
                        .unwrap()
                        .unwrap()
                        .map(|b| b.into_inner())
                }
                Caller::PollThenMove => {
                    let mut retry = retry;
                    let mut call = Box::pin(retry.call(grpc_request()));
                    let first = std::future::poll_fn(|cx| {
                        std::task::Poll::Ready(call.as_mut().poll(cx).is_pending())
                    });
                    assert!(first.await, "C's backoff keeps the call pending");
                    let mut set = FuturesUnordered::new();
                    set.push(call);
                    set.next().await.unwrap().unwrap().map(|b| b.into_inner())
                }
                Caller::PresetUnderLimit => {
                    let call = limited.ready().await.unwrap().call(grpc_request());
                    let answer = tokio::spawn(call).await.unwrap().unwrap();
                    answer.map(|_| String::new())
                }
                Caller::PresetBehindBuffer => {
                    let call = buffered.ready().await.unwrap().call(grpc_request());
                    call.await.unwrap().map(|_| String::new())
                }
            };
            Ok::<_, BoxError>(answer)
        }
    });
    let server = ServiceBuilder::new()
        .layer(PushbackLayer::new())
        .service(handler);
    let response = server.oneshot(grpc_request()).await.unwrap();
    (count.load(Ordering::SeqCst), response)
}

/// A call reports to the request whose handler made it, however the handler runs it
/// afterwards: spawned, or moved between futures. (A thread-local mark set while the call's
/// future was polled lost the spawned ones.)
#[tokio::test(start_paused = true)]
async fn a_call_reports_its_give_up_wherever_the_handler_runs_it() {
    for caller in [
        Caller::CallThenSpawn,
        Caller::PollThenMove,
        Caller::PresetUnderLimit,
    ] {
        let (attempts, response) = b_reports(caller).await;
        assert_eq!(attempts, 3, "{caller:?}: C saw the retries");
        assert_eq!(response.headers()["grpc-status"], "14", "{caller:?}");
        assert_eq!(
            response
                .headers()
                .get("grpc-retry-pushback-ms")
                .map(|v| v.as_bytes()),
            Some(&b"-1"[..]),
            "{caller:?}: B tells its callers not to retry"
        );
    }
}

/// What a call cannot do: one whose first backstop layer is called by a `Buffer`'s worker
/// begins outside the handler, so B does not learn that it gave up (the rule in
/// `PushbackLayer`'s docs). C still sees only the client's own attempts.
#[tokio::test(start_paused = true)]
async fn a_call_begun_on_a_buffer_worker_does_not_report() {
    let (attempts, response) = b_reports(Caller::PresetBehindBuffer).await;
    assert_eq!(attempts, 3);
    assert_eq!(response.headers()["grpc-status"], "14");
    assert!(response.headers().get("grpc-retry-pushback-ms").is_none());
}
