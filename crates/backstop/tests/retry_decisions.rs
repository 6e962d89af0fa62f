//! Every branch of the retry decision order, with mock services under paused time.

use backstop::client::retry::{
    Budget, GiveUp, Idempotency, RatioBudget, ReplayBody, RetryConfig, RetryLayer, backoff,
};
use backstop::deadline::Deadline;
use backstop::{BoxError, Rejection};
use backstop_test_support::{self as support, MS, reply};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use std::{sync::Arc, time::Duration};
use tokio::time::{Instant, advance};
use tokio_test::{assert_pending, assert_ready};
use tower::{Layer, ServiceExt};
use tower_test::mock;

type Req = Request<ReplayBody<String>>;
type Mock = support::Mock<Req>;
type Handle = support::Handle<Req>;

fn get() -> Request<String> {
    support::get_with("payload")
}

fn post() -> Request<String> {
    support::post("payload")
}

fn grpc() -> Request<String> {
    support::grpc_call("msg")
}

/// A GET whose deadline is `left` away.
fn get_within(left: Duration) -> Request<String> {
    let mut req = get();
    req.extensions_mut().insert(Deadline::after(left));
    req
}

/// A deterministic policy: fixed 10 ms backoff, no budget unless given.
fn policy() -> RetryConfig<backstop::HttpClassifier> {
    RetryConfig::http()
        .backoff(backoff::constant(10 * MS))
        .no_budget()
        .seed(1)
}

struct Harness {
    layer: RetryLayer<backstop::HttpClassifier>,
    handle: Handle,
    result: Option<Result<Response<String>, BoxError>>,
    call: tokio_test::task::Spawn<
        tower::util::Oneshot<
            backstop::client::retry::Retry<Mock, backstop::HttpClassifier>,
            Request<String>,
        >,
    >,
}

fn start(layer: RetryLayer<backstop::HttpClassifier>, req: Request<String>) -> Harness {
    let (mock, handle) = mock::pair();
    let service = layer.layer(mock);
    let mut call = tokio_test::task::spawn(service.oneshot(req));
    assert_pending!(call.poll());
    Harness {
        layer,
        handle,
        result: None,
        call,
    }
}

impl Harness {
    /// Answers the next attempt and lets the retry layer see the answer.
    async fn answer(&mut self, status: u16) -> Req {
        let (req, send) = self.handle.next_request().await.expect("an attempt");
        send.send_response(reply(status));
        self.poll();
        req
    }

    fn poll(&mut self) {
        if self.result.is_none()
            && let std::task::Poll::Ready(result) = self.call.poll()
        {
            self.result = Some(result.map(|r| r.map(|body| body.into_inner())));
        }
    }

    /// Advances virtual time and lets the retry layer run.
    async fn advance(&mut self, by: Duration) {
        advance(by).await;
        self.poll();
    }

    fn no_more_attempts(&mut self) {
        assert!(!matches!(
            self.handle.poll_request(),
            std::task::Poll::Ready(Some(_))
        ));
    }

    fn done(&mut self) -> Result<Response<String>, BoxError> {
        self.poll();
        self.result.take().expect("the call is done")
    }
}

#[tokio::test(start_paused = true)]
async fn success_is_returned_and_deposits_in_the_budget() {
    // No reserve: the balance is what was deposited (one deposit is under the token a second
    // the burst limit always allows).
    let budget = Arc::new(RatioBudget::builder().min_per_sec(0).build().unwrap());
    let mut h = start(policy().budget(budget.clone()).build().unwrap(), get());
    h.answer(200).await;
    assert_eq!(h.done().unwrap().status(), 200);
    assert!((budget.balance() - 0.1).abs() < 1e-9);
    assert_eq!(h.layer.stats().retries, 0);
}

#[tokio::test(start_paused = true)]
async fn a_503_get_is_retried_after_the_backoff_with_the_same_request() {
    let mut h = start(policy().build().unwrap(), get());
    let first = h.answer(503).await;
    assert_pending!(h.call.poll());
    h.no_more_attempts();
    advance(9 * MS).await;
    assert_pending!(h.call.poll());
    h.no_more_attempts();
    advance(MS).await;
    assert_pending!(h.call.poll());
    let second = h.answer(200).await;
    assert_eq!(h.done().unwrap().status(), 200);
    assert_eq!(first.uri(), second.uri());
    assert_eq!(first.method(), second.method());
    let body = second.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"payload");
    assert_eq!(h.layer.stats().retries, 1);
}

#[tokio::test(start_paused = true)]
async fn final_failures_and_caller_errors_are_not_retried() {
    for (status, why) in [(500, Some(GiveUp::NotRetryable)), (404, None), (400, None)] {
        let mut h = start(policy().build().unwrap(), get());
        h.answer(status).await;
        assert_eq!(h.done().unwrap().status(), status);
        h.no_more_attempts();
        if let Some(why) = why {
            assert_eq!(h.layer.stats().gave_up(why), 1);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn attempts_are_capped_at_max_attempts() {
    let mut h = start(policy().max_attempts(3).build().unwrap(), get());
    for _ in 0..3 {
        h.answer(503).await;
        h.advance(10 * MS).await;
    }
    assert_eq!(h.done().unwrap().status(), 503);
    h.no_more_attempts();
    let stats = h.layer.stats();
    assert_eq!(stats.retries, 2);
    assert_eq!(stats.gave_up(GiveUp::Attempts), 1);
    assert!((stats.amplification() - 3.0).abs() < 1e-9);
}

#[tokio::test(start_paused = true)]
async fn non_idempotent_requests_are_retried_only_when_not_processed() {
    // POST + 503: may have been processed.
    let mut h = start(policy().build().unwrap(), post());
    h.answer(503).await;
    assert_eq!(h.done().unwrap().status(), 503);
    assert_eq!(h.layer.stats().gave_up(GiveUp::NotIdempotent), 1);

    // POST + 429: provably not processed.
    let mut h = start(policy().build().unwrap(), post());
    h.answer(429).await;
    h.advance(10 * MS).await;
    h.answer(200).await;
    assert_eq!(h.done().unwrap().status(), 200);

    // POST + connection refused: not processed either.
    let mut h = start(policy().build().unwrap(), post());
    let (_, send) = h.handle.next_request().await.unwrap();
    send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    h.poll();
    h.advance(10 * MS).await;
    h.answer(200).await;
    assert_eq!(h.done().unwrap().status(), 200);

    // POST + Idempotency-Key, or a policy that trusts every method.
    let mut keyed = post();
    keyed
        .headers_mut()
        .insert("idempotency-key", "k-1".parse().unwrap());
    for (layer, req) in [
        (policy().build().unwrap(), keyed),
        (
            policy().idempotency(Idempotency::All).build().unwrap(),
            post(),
        ),
    ] {
        let mut h = start(layer, req);
        h.answer(503).await;
        h.advance(10 * MS).await;
        h.answer(200).await;
        assert_eq!(h.done().unwrap().status(), 200);
    }
}

/// A gRPC call with an `idempotency-key` in its metadata is not made idempotent by it: no
/// standard server de-duplicates gRPC by that key (`IdempotencyLayer` passes gRPC through),
/// so a failure that may have been processed is not retried (found by an outside attack).
/// `Idempotency::allows` says the same.
#[tokio::test(start_paused = true)]
async fn a_grpc_call_is_not_made_idempotent_by_an_idempotency_key() {
    let mut keyed = post();
    keyed
        .headers_mut()
        .insert("idempotency-key", "k-1".parse().unwrap());
    keyed
        .headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    assert!(!Idempotency::Standard.allows(keyed.method(), keyed.headers()));
    let mut h = start(policy().build().unwrap(), keyed);
    h.answer(503).await;
    assert_eq!(h.done().unwrap().status(), 503);
    assert_eq!(h.layer.stats().gave_up(GiveUp::NotIdempotent), 1);
}

#[tokio::test(start_paused = true)]
async fn a_do_not_retry_hint_is_honoured() {
    let mut h = start(policy().build().unwrap(), get());
    let (_, send) = h.handle.next_request().await.unwrap();
    send.send_response(
        Response::builder()
            .status(503)
            .header("grpc-retry-pushback-ms", "-1")
            .body(String::new())
            .unwrap(),
    );
    assert_eq!(h.done().unwrap().status(), 503);
    assert_eq!(h.layer.stats().gave_up(GiveUp::Hint), 1);
}

#[tokio::test(start_paused = true)]
async fn retry_after_sets_the_wait() {
    let mut h = start(policy().build().unwrap(), get());
    let (_, send) = h.handle.next_request().await.unwrap();
    send.send_response(
        Response::builder()
            .status(429)
            .header("retry-after", "2")
            .body(String::new())
            .unwrap(),
    );
    assert_pending!(h.call.poll());
    advance(Duration::from_millis(1999)).await;
    assert_pending!(h.call.poll());
    h.no_more_attempts();
    advance(MS).await;
    assert_pending!(h.call.poll());
    h.answer(200).await;
    assert_eq!(h.done().unwrap().status(), 200);
}

#[tokio::test(start_paused = true)]
async fn a_hostile_retry_after_never_outlives_the_deadline() {
    let req = get_within(Duration::from_secs(5));
    let start_at = Instant::now();
    let mut h = start(policy().build().unwrap(), req);
    let (_, send) = h.handle.next_request().await.unwrap();
    send.send_response(
        Response::builder()
            .status(503)
            .header("retry-after", "99999999999")
            .body(String::new())
            .unwrap(),
    );
    // Returned at once, not after 30 s nor 3000 years: a wait over the 30 s the layer holds
    // a call for ends the retries for the hint, whatever the deadline.
    assert_eq!(h.done().unwrap().status(), 503);
    assert_eq!(Instant::now(), start_at);
    assert_eq!(h.layer.stats().gave_up(GiveUp::Hint), 1);
}

#[tokio::test(start_paused = true)]
async fn no_retry_is_started_that_cannot_finish_before_the_deadline() {
    let layer = policy().build().unwrap();
    // 10.9 ms left: 10 ms of backoff + the 1 ms an attempt needs at least do not fit.
    let mut h = start(layer.clone(), get_within(Duration::from_micros(10_900)));
    h.answer(503).await;
    assert_eq!(h.done().unwrap().status(), 503);
    assert_eq!(layer.stats().gave_up(GiveUp::Deadline), 1);
    // 11 ms left: they do. The request carries its `grpc-timeout`, which each attempt
    // refreshes.
    let mut req = get_within(11 * MS);
    req.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("11m"));
    let mut h = start(layer, req);
    h.answer(503).await;
    h.advance(10 * MS).await;
    let retry = h.answer(200).await;
    // The retry's grpc-timeout is what is left: 1 ms.
    assert_eq!(retry.headers()["grpc-timeout"], "1000000n");
    assert_eq!(h.done().unwrap().status(), 200);
}

/// A call with 1.3 s to its deadline whose first attempt answers 503 after `first_took`: its
/// retry goes out after the 10 ms backoff and answers 200.
async fn a_503_after_then_a_retry(
    layer: &RetryLayer<backstop::HttpClassifier>,
    first_took: Duration,
) {
    let mut h = start(layer.clone(), get_within(1300 * MS));
    h.advance(first_took).await;
    h.answer(503).await;
    h.advance(10 * MS).await;
    h.answer(200).await;
    assert_eq!(h.done().unwrap().status(), 200);
}

/// Issue 25, 2: a dependency whose calls take about 1 s, a 1.3 s deadline, and a first
/// attempt that failed after 1.04 s. A retry fits on the wire (`min_attempt_time` 1 ms), but
/// not the 1 s its calls take: with the reserve, none is sent, and the reason says why.
#[tokio::test(start_paused = true)]
async fn no_retry_is_started_that_the_reserve_says_cannot_finish() {
    let layer = policy().reserve(Duration::from_secs(1)).build().unwrap();
    let mut h = start(layer.clone(), get_within(1300 * MS));
    h.advance(1040 * MS).await;
    h.answer(503).await;
    assert_eq!(h.done().unwrap().status(), 503);
    h.no_more_attempts();
    assert_eq!(layer.stats().gave_up(GiveUp::Reserve), 1);
    assert_eq!(layer.stats().gave_up(GiveUp::Deadline), 0);
    assert_eq!(layer.stats().retries, 0);
    // With 1.01 s left after the backoff, it does.
    a_503_after_then_a_retry(&layer, 280 * MS).await;
    assert_eq!(layer.stats().retries, 1);
}

/// A reserve that says nothing (a latency model not trusted yet) asks for nothing.
#[tokio::test(start_paused = true)]
async fn a_reserve_of_none_leaves_the_deadline_rule_alone() {
    #[derive(Debug)]
    struct Untrusted;
    impl backstop::client::retry::RetryReserve for Untrusted {
        fn reserve(&self) -> Option<Duration> {
            None
        }
    }
    let layer = policy().reserve(Untrusted).build().unwrap();
    a_503_after_then_a_retry(&layer, 1040 * MS).await;
    assert_eq!(layer.stats().retries, 1);
}

#[tokio::test(start_paused = true)]
async fn the_task_local_deadline_counts_too() {
    let layer = policy().build().unwrap();
    let (mock, mut handle) = mock::pair::<Req, Response<String>>();
    let service = layer.layer(mock);
    let call = Deadline::after(5 * MS).scope(service.oneshot(get()));
    let mut call = tokio_test::task::spawn(call);
    assert_pending!(call.poll());
    let (req, send) = handle.next_request().await.unwrap();
    // A deadline to keep, not a header to write: the request carried none.
    assert!(req.headers().get("grpc-timeout").is_none());
    send.send_response(reply(503));
    assert_eq!(assert_ready!(call.poll()).unwrap().status(), 503);
    assert_eq!(layer.stats().gave_up(GiveUp::Deadline), 1);
}

#[tokio::test(start_paused = true)]
async fn an_empty_budget_stops_retries() {
    let budget: Arc<dyn Budget> = Arc::new(RatioBudget::builder().min_per_sec(0).build().unwrap());
    let mut h = start(policy().budget(budget).build().unwrap(), get());
    h.answer(503).await;
    assert_eq!(h.done().unwrap().status(), 503);
    assert_eq!(h.layer.stats().gave_up(GiveUp::Budget), 1);
}

#[tokio::test(start_paused = true)]
async fn a_body_longer_than_the_replay_cap_is_sent_once() {
    let layer = policy().max_replay_bytes(4).build().unwrap();
    // Known up front (size hint): passed through.
    let mut h = start(layer.clone(), get());
    let req = h.answer(503).await;
    assert_eq!(h.done().unwrap().status(), 503);
    assert!(!req.body().is_replayable());
    // Defect (issue 23, 13): this one was reported as no give-up and not counted.
    assert_eq!(layer.stats().gave_up(GiveUp::NotReplayable), 1);

    // Discovered while streaming: read past the cap, then not replayable.
    let (mut tx, body) =
        http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(4);
    let (mock, mut handle) = mock::pair::<Request<ReplayBody<_>>, Response<String>>();
    let service = layer.layer(mock);
    let req = Request::get("http://svc/").body(body).unwrap();
    let mut call = tokio_test::task::spawn(service.oneshot(req));
    assert_pending!(call.poll());
    let (req, send) = handle.next_request().await.unwrap();
    tx.send_data(Bytes::from_static(b"0123456789"))
        .await
        .unwrap();
    drop(tx);
    let sent = req.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&sent[..], b"0123456789");
    send.send_response(reply(503));
    let response = assert_ready!(call.poll()).unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        response
            .extensions()
            .get::<backstop::client::retry::CallInfo>()
            .unwrap()
            .gave_up(),
        Some(GiveUp::NotReplayable)
    );
    assert_eq!(layer.stats().gave_up(GiveUp::NotReplayable), 2);
}

/// A body too long to keep, on a request whose failure would not have been retried anyway,
/// gives up for that reason (the decision order of a retried call), not `NotReplayable`.
#[tokio::test(start_paused = true)]
async fn a_call_too_long_to_replay_gives_up_for_the_first_reason() {
    let layer = policy().max_replay_bytes(4).build().unwrap();
    for (req, status, why) in [
        (post(), 503, GiveUp::NotIdempotent),
        (get(), 501, GiveUp::NotRetryable),
    ] {
        let mut h = start(layer.clone(), req);
        h.answer(status).await;
        assert_eq!(h.done().unwrap().status(), status);
        assert_eq!(h.layer.stats().gave_up(why), 1, "{why}");
    }
    // A success gives nothing up.
    let mut h = start(layer.clone(), get());
    h.answer(200).await;
    assert_eq!(h.done().unwrap().status(), 200);
    assert_eq!(layer.stats().gave_ups().map(|(_, n)| n).sum::<u64>(), 2);
}

/// An attempt bound inside the breaker (the facade's `AttemptTimeout`) fails an attempt with
/// `AttemptTimedOut`: the retry layer retries it for an idempotent request, within the
/// deadline, and not for a POST.
#[tokio::test(start_paused = true)]
async fn an_attempt_timed_out_inside_is_retried_when_idempotent() {
    // Three attempts for the GET (the default), one for the POST.
    for (req, attempts) in [(get(), 3), (post(), 1)] {
        let layer = policy().build().unwrap();
        let timed_out = tower::service_fn(|_req: Req| async {
            Err::<Response<String>, _>(backstop::AttemptTimedOut::new())
        });
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = calls.clone();
        let svc = tower::ServiceBuilder::new()
            .layer(layer.clone())
            .map_request(move |r: Req| {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                r
            })
            .service(timed_out);
        let err = svc.oneshot(req).await.unwrap_err();
        assert!(backstop::find::<backstop::AttemptTimedOut>(err.as_ref()).is_some());
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), attempts);
        let why = if attempts == 1 {
            GiveUp::NotIdempotent
        } else {
            GiveUp::Attempts
        };
        assert_eq!(layer.stats().gave_up(why), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn an_outer_wire_offset_is_kept_on_retries() {
    let mut req = get_within(Duration::from_millis(500));
    // What an outer PropagateDeadline with a 20 ms offset would have written.
    req.headers_mut()
        .insert("grpc-timeout", "480m".parse().unwrap());
    let mut h = start(policy().build().unwrap(), req);
    let first = h.answer(503).await;
    // The first attempt goes out as the outer layer wrote it.
    assert_eq!(first.headers()["grpc-timeout"], "480m");
    h.advance(10 * MS).await;
    let second = h.answer(200).await;
    assert_eq!(second.headers()["grpc-timeout"], "470000u");
}

#[tokio::test(start_paused = true)]
async fn our_own_rejections_are_never_retried() {
    let mut h = start(policy().build().unwrap(), get());
    let (_, send) = h.handle.next_request().await.unwrap();
    send.send_response(
        Rejection::DeadlineExceeded
            .into_response::<()>(false)
            .map(|_| String::new()),
    );
    assert_eq!(h.done().unwrap().status(), 504);
    h.no_more_attempts();
}

#[tokio::test(start_paused = true)]
async fn max_attempts_one_passes_the_request_through() {
    let mut h = start(policy().max_attempts(1).build().unwrap(), get());
    let req = h.answer(503).await;
    assert!(!req.body().is_replayable());
    assert!(req.headers().get("grpc-timeout").is_none());
    assert_eq!(h.done().unwrap().status(), 503);
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_retry_instants() {
    async fn second_attempt_at(seed: u64) -> Duration {
        let layer = RetryConfig::http().no_budget().seed(seed).build().unwrap();
        let t0 = Instant::now();
        let mut h = start(layer, get());
        h.answer(503).await;
        // Bounded: the backoff's cap is 1 s.
        for _ in 0..1_000 {
            h.advance(MS).await;
            if let std::task::Poll::Ready(Some((_, send))) = h.handle.poll_request() {
                send.send_response(reply(200));
                return Instant::now() - t0;
            }
        }
        panic!("no retry within the backoff cap");
    }
    let a = second_attempt_at(42).await;
    assert_eq!(a, second_attempt_at(42).await);
    // decorrelated(25 ms, 1 s): the first wait is in [25, 75] ms.
    assert!(a >= 25 * MS && a <= 76 * MS, "{a:?}");
}

#[tokio::test(start_paused = true)]
async fn grpc_trailers_only_failures_are_retried_with_the_attempt_count() {
    let layer = RetryConfig::grpc()
        .backoff(backoff::constant(10 * MS))
        .no_budget()
        .build()
        .unwrap();
    let (mock, mut handle) = mock::pair::<Req, Response<String>>();
    let mut call = tokio_test::task::spawn(layer.layer(mock).oneshot(grpc()));
    assert_pending!(call.poll());
    let unavailable = || {
        Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "14")
            .body(String::new())
            .unwrap()
    };
    let (first, send) = handle.next_request().await.unwrap();
    assert!(first.headers().get("grpc-previous-rpc-attempts").is_none());
    send.send_response(unavailable());
    assert_pending!(call.poll());
    advance(10 * MS).await;
    assert_pending!(call.poll());
    let (second, send) = handle.next_request().await.unwrap();
    assert_eq!(second.headers()["grpc-previous-rpc-attempts"], "1");
    // Headers without a status: committed, returned even if the trailers later fail.
    send.send_response(
        Response::builder()
            .header("content-type", "application/grpc")
            .body(String::new())
            .unwrap(),
    );
    let response = assert_ready!(call.poll()).unwrap();
    assert!(response.headers().get("grpc-status").is_none());
    assert!(!matches!(
        handle.poll_request(),
        std::task::Poll::Ready(Some(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn post_is_never_sent_twice_for_grpc_without_a_safe_code() {
    let layer = RetryConfig::grpc().no_budget().build().unwrap();
    let (mock, mut handle) = mock::pair::<Req, Response<String>>();
    let mut call = tokio_test::task::spawn(layer.layer(mock).oneshot(grpc()));
    assert_pending!(call.poll());
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(
        Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "13")
            .body(String::new())
            .unwrap(),
    );
    assert_ready!(call.poll()).unwrap();
    assert!(!matches!(
        handle.poll_request(),
        std::task::Poll::Ready(Some(_))
    ));
}

/// Per-request overrides of the policy, as a request extension.
#[tokio::test(start_paused = true)]
async fn a_request_can_override_retries_and_idempotency() {
    use backstop::client::retry::RetryOverrides;
    let attempts = |overrides: Option<RetryOverrides>, req: Request<String>| async move {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = calls.clone();
        let failing = tower::service_fn(move |_req: Req| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<_, BoxError>(reply(503)) }
        });
        let mut req = req;
        if let Some(o) = overrides {
            req.extensions_mut().insert(o);
        }
        let layer = policy().build().unwrap();
        let response = tower::ServiceBuilder::new()
            .layer(layer.clone())
            .service(failing)
            .oneshot(req)
            .await
            .unwrap();
        assert_eq!(response.status(), 503);
        calls.load(std::sync::atomic::Ordering::SeqCst)
    };
    // The policy's 3 attempts for a GET, 1 for a POST.
    assert_eq!(attempts(None, get()).await, 3);
    assert_eq!(attempts(None, post()).await, 1);
    // Retries off for this GET; a POST the caller declares idempotent; a cap of 2.
    assert_eq!(attempts(Some(RetryOverrides::no_retries()), get()).await, 1);
    assert_eq!(
        attempts(Some(RetryOverrides::new().idempotent(true)), post()).await,
        3
    );
    assert_eq!(
        attempts(Some(RetryOverrides::new().idempotent(false)), get()).await,
        1
    );
    assert_eq!(
        attempts(Some(RetryOverrides::new().max_attempts(2)), get()).await,
        2
    );
    // More than the policy allows is allowed per request, up to the crate's limit.
    assert_eq!(
        attempts(Some(RetryOverrides::new().max_attempts(50)), get()).await,
        10
    );
}

#[tokio::test(start_paused = true)]
async fn an_error_says_how_many_attempts_the_call_took_and_why_it_stopped() {
    let reset = || std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
    let mut h = start(policy().max_attempts(3).build().unwrap(), get());
    for _ in 0..3 {
        let (_, send) = h.handle.next_request().await.expect("an attempt");
        send.send_error(reset());
        h.poll();
        h.advance(10 * MS).await;
    }
    let err = h.done().unwrap_err();
    let info = err
        .downcast_ref::<backstop::client::retry::RetryError>()
        .expect("a RetryError");
    assert_eq!(
        (info.attempts(), info.gave_up()),
        (3, Some(GiveUp::Attempts))
    );
    assert_eq!(err.to_string(), "3 attempts, not retried: attempts");
    // The last attempt's error is its source, where classifiers and `find` look.
    let io = backstop::find::<std::io::Error>(&*err).expect("the transport's error");
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);

    // A POST that may have been processed: one attempt, and why.
    let mut h = start(policy().build().unwrap(), post());
    let (_, send) = h.handle.next_request().await.expect("an attempt");
    send.send_error(reset());
    h.poll();
    let err = h.done().unwrap_err();
    let info = err
        .downcast_ref::<backstop::client::retry::RetryError>()
        .unwrap();
    assert_eq!(
        (info.attempts(), info.gave_up()),
        (1, Some(GiveUp::NotIdempotent))
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_deadline_passed_before_it_was_sent_took_no_attempt() {
    let (mock, _handle) = mock::pair::<Request<ReplayBody<String>>, Response<String>>();
    let mut req = get();
    req.extensions_mut()
        .insert(backstop::deadline::Deadline::after(Duration::ZERO));
    let err = policy()
        .build()
        .unwrap()
        .layer(mock)
        .oneshot(req)
        .await
        .unwrap_err();
    let info = err
        .downcast_ref::<backstop::client::retry::RetryError>()
        .unwrap();
    assert_eq!((info.attempts(), info.gave_up()), (0, None));
    assert!(backstop::is_deadline_exceeded(&*err));
}

#[tokio::test(start_paused = true)]
async fn a_response_tells_what_the_call_did_when_there_is_something_to_tell() {
    use backstop::client::retry::CallInfo;
    // One attempt answered: no extension, read as that one attempt.
    let mut h = start(policy().build().unwrap(), get());
    h.answer(200).await;
    let ok = h.done().unwrap();
    assert!(ok.extensions().get::<CallInfo>().is_none());
    assert_eq!(CallInfo::of(&ok), CallInfo::new(1, None));

    // A retry: the extension says both attempts.
    let mut h = start(policy().build().unwrap(), get());
    h.answer(503).await;
    h.advance(Duration::from_secs(1)).await;
    h.answer(200).await;
    let ok = h.done().unwrap();
    assert_eq!(
        ok.extensions().get::<CallInfo>(),
        Some(&CallInfo::new(2, None))
    );

    // One attempt given up on: the reason rides on the response.
    let mut h = start(policy().build().unwrap(), post());
    h.answer(503).await;
    let failed = h.done().unwrap();
    assert_eq!(
        failed.extensions().get::<CallInfo>(),
        Some(&CallInfo::new(1, Some(GiveUp::NotIdempotent)))
    );

    // A local rejection answered inside the layer (an open breaker's, say) says its attempt.
    let mut h = start(policy().build().unwrap(), get());
    let (_, send) = h.handle.next_request().await.expect("an attempt");
    let mut rejected = reply(503);
    rejected
        .extensions_mut()
        .insert(backstop::Rejection::BreakerOpen { retry_after: None });
    send.send_response(rejected);
    h.poll();
    let rejected = h.done().unwrap();
    assert_eq!(
        rejected.extensions().get::<CallInfo>(),
        Some(&CallInfo::new(1, None))
    );

    // A rejection made outside the retry layer carries no extension: no attempt.
    let mut outside = Response::new(String::new());
    outside
        .extensions_mut()
        .insert(backstop::Rejection::DeadlineExceeded);
    assert_eq!(CallInfo::of(&outside), CallInfo::new(0, None));
}
