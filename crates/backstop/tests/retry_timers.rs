//! The retry layer's attempt timer is not armed when the deadline layer polling it already
//! wakes the task by the attempt's deadline; these tests hold what must not change with it:
//! every call still ends at its own deadline — one earlier than the enclosing one, one moved
//! to another task after a first poll inside a handler, or one whose retry or hedge waits for
//! a transport that is not ready.
//!
//! Each call is bounded by a guard `timeout` far past its deadline: a call that no timer wakes
//! would otherwise hang (paused time only moves to registered timers); with the guard, it fails.

use backstop::client::retry::{ReplayBody, RetryConfig};
use backstop::deadline::{Deadline, DeadlineLayer};
use backstop::is_deadline_exceeded;
use http::{Request, Response};
use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    task::Poll,
    time::Duration,
};
use tokio::time::Instant;
use tower::{Layer, ServiceExt, service_fn};

const MS: Duration = Duration::from_millis(1);
const GUARD: Duration = Duration::from_secs(60);

/// A dependency that never answers, and arms no timer.
fn hung() -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    service_fn(|_req: Request<ReplayBody<String>>| {
        std::future::pending::<Result<Response<String>, Infallible>>()
    })
}

fn request() -> Request<String> {
    backstop_test_support::http_request(None)
}

/// Inside a handler with one second left, a call carrying its own, earlier deadline (a request
/// extension) ends at that one: the handler's deadline layer does not cover it.
#[tokio::test(start_paused = true)]
async fn an_earlier_deadline_than_the_handlers_arms_its_own_timer() {
    let retry = RetryConfig::http().build().unwrap().layer(hung());
    let handler = service_fn(move |_req: Request<String>| {
        let retry = retry.clone();
        async move {
            let mut req = request();
            req.extensions_mut()
                .insert(Deadline::after(Duration::from_millis(300)));
            let start = Instant::now();
            let err = retry.oneshot(req).await.unwrap_err();
            assert!(is_deadline_exceeded(&*err), "{err}");
            assert_eq!(start.elapsed(), 300 * MS);
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let response = tokio::time::timeout(
        GUARD,
        DeadlineLayer::new()
            .layer(handler)
            .oneshot(backstop_test_support::http_request(Some("1S"))),
    )
    .await
    .expect("the call ended at its own deadline")
    .unwrap();
    assert_eq!(response.status(), 200);
}

/// A retried call polled once inside a handler and then moved to a task of its own ends at
/// its deadline there (its timer wakes the task it is polled on).
#[tokio::test(start_paused = true)]
async fn a_call_moved_to_another_task_arms_its_timer_there() {
    let retry = RetryConfig::http().build().unwrap().layer(hung());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let tx = Arc::new(Mutex::new(Some(tx)));
    let handler = service_fn(move |_req: Request<String>| {
        let retry = retry.clone();
        let tx = tx.clone();
        async move {
            let mut call = Box::pin(retry.oneshot(request()));
            let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            assert!(first.is_pending());
            let _ = tx.lock().unwrap().take().unwrap().send(tokio::spawn(call));
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let start = Instant::now();
    let response = DeadlineLayer::new()
        .layer(handler)
        .oneshot(backstop_test_support::http_request(Some("1S")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let result = tokio::time::timeout(GUARD, rx.await.unwrap())
        .await
        .expect("the moved call ended at its deadline")
        .unwrap();
    let err = result.unwrap_err();
    assert!(is_deadline_exceeded(&*err), "{err}");
    // The handler's deadline: one second less the server's 1 ms lead.
    assert_eq!(start.elapsed(), 999 * MS);
}

type Req = Request<ReplayBody<String>>;

/// A transport that takes one call, then is not ready until its handle allows more (what
/// `tower::limit::ConcurrencyLimit(1)` does while the first call is in flight).
fn one_at_a_time() -> (
    tower_test::mock::Mock<Req, Response<String>>,
    tower_test::mock::Handle<Req, Response<String>>,
) {
    let (mock, mut handle) = tower_test::mock::pair();
    handle.allow(1);
    (mock, handle)
}

/// A call through the retry layer, on a task of its own, bounded by the guard (its response's
/// status, or its error).
type Spawned = tokio::task::JoinHandle<
    Result<Result<http::StatusCode, backstop::BoxError>, tokio::time::error::Elapsed>,
>;

/// Runs a call through `layer` over `mock`, its deadline 100 ms away, on a task of its own;
/// returns that task, with the instant the call started.
fn spawn_with_100ms_left(
    layer: backstop::client::retry::RetryLayer<backstop::HttpClassifier>,
    mock: tower_test::mock::Mock<Req, Response<String>>,
) -> (Spawned, Instant) {
    let mut req = request();
    req.extensions_mut().insert(Deadline::after(100 * MS));
    let start = Instant::now();
    let call = tokio::spawn(tokio::time::timeout(GUARD, async move {
        let response = layer.layer(mock).oneshot(req).await?;
        Ok(response.status())
    }));
    (call, start)
}

/// The attempts `call` made: it must end with the deadline's error, 100 ms after `start`.
async fn attempts_of_a_call_that_ended_at_its_deadline(call: Spawned, start: Instant) -> u32 {
    let err = call
        .await
        .unwrap()
        .expect("the call ended at its deadline")
        .unwrap_err();
    assert!(is_deadline_exceeded(&*err), "{err}");
    assert_eq!(start.elapsed(), 100 * MS);
    let info = err
        .downcast_ref::<backstop::client::retry::RetryError>()
        .unwrap();
    info.attempts()
}

/// A hedged call whose transport is not ready when its hedge is due (the first attempt hangs
/// and holds the only slot) still ends at its deadline, with the deadline's error; and the
/// hedge still goes the moment the transport is ready again.
#[tokio::test(start_paused = true)]
async fn a_hedge_waiting_for_the_transport_still_ends_at_the_deadline() {
    use backstop::client::retry::hedge::Hedging;
    let (mock, mut handle) = one_at_a_time();
    let layer = RetryConfig::http()
        .hedging(Hedging::new(10 * MS).max_attempts(3))
        .no_budget()
        .build()
        .unwrap();
    let (call, start) = spawn_with_100ms_left(layer, mock);
    // The first attempt hangs and keeps the slot.
    let (_first, _never) = handle.next_request().await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    // The hedge was due at 10 ms; the transport is ready again at 50 ms: it goes then.
    tokio::time::sleep(50 * MS).await;
    handle.allow(1);
    let (_hedge, _never_either) = handle.next_request().await.unwrap();
    assert_eq!(start.elapsed(), 50 * MS);
    // The third attempt is due at 60 ms and never gets a slot: the deadline ends the wait.
    let attempts = attempts_of_a_call_that_ended_at_its_deadline(call, start).await;
    assert_eq!(attempts, 2);
}

/// A budget with tokens to spare that counts what it gives and gets back.
#[derive(Debug, Default)]
struct Counted {
    withdrawn: std::sync::atomic::AtomicUsize,
    refunded: std::sync::atomic::AtomicUsize,
}

impl backstop::client::retry::Budget for Counted {
    fn record_success(&self) {}
    fn try_withdraw(&self) -> bool {
        self.withdrawn
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        true
    }
    fn refund(&self) {
        self.refunded
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn balance(&self) -> f64 {
        1.0
    }
}

/// A retry whose transport is not ready after its backoff waits for it only until the
/// deadline: the call then ends with the deadline's error, the retry never sent and its
/// budget token given back.
#[tokio::test(start_paused = true)]
async fn a_retry_waiting_for_the_transport_still_ends_at_the_deadline() {
    let (mock, mut handle) = one_at_a_time();
    let budget = Arc::new(Counted::default());
    let layer = RetryConfig::http()
        .backoff(backstop::client::retry::backoff::constant(10 * MS))
        .budget(budget.clone())
        .build()
        .unwrap();
    let (call, start) = spawn_with_100ms_left(layer, mock);
    let (_first, send) = handle.next_request().await.unwrap();
    send.send_response(Response::builder().status(503).body(String::new()).unwrap());
    let attempts = attempts_of_a_call_that_ended_at_its_deadline(call, start).await;
    assert_eq!(attempts, 1, "the retry was never sent");
    let counts = |n: &std::sync::atomic::AtomicUsize| n.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        (counts(&budget.withdrawn), counts(&budget.refunded)),
        (1, 1)
    );
    drop(handle);
}
