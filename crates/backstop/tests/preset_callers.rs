//! An outside review of the client preset from the caller's side: calls polled then dropped,
//! raced in `select!`, pushed into `FuturesUnordered`, spawned into a `JoinSet` and aborted,
//! polled then spawned, run under `block_in_place`, and stacks wrapped in `Buffer` and
//! `ConcurrencyLimit`. A call its caller drops is no failure of the dependency: the breaker,
//! the throttle and the bulkhead must come out as if it had not been made, and a probe or a
//! permit it held must come back.

use backstop::client::attempt::AttemptBound;
use backstop::client::breaker::{BreakerConfig, State};
use backstop::client::overload::bulkhead::BulkheadLayer;
use backstop::client::overload::throttle::AdaptiveThrottle;
use backstop::client::retry::Budget;
use backstop::client::retry::{RatioBudget, RetryConfig, backoff};
use backstop::{ClientLayer, HttpClassifier, ReplayBody};
use futures_util::StreamExt;
use http::{Request, Response};
use std::{
    convert::Infallible,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    task::Poll,
    time::Duration,
};
use tower::{ServiceBuilder, ServiceExt, service_fn};

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

fn get(path: &str) -> Request<String> {
    Request::get(format!("http://dep{path}"))
        .body(String::new())
        .unwrap()
}

fn status(code: u16) -> Response<String> {
    Response::builder()
        .status(code)
        .body(String::new())
        .unwrap()
}

/// A dependency that counts its calls and the `grpc-timeout` values of each: `/slow` answers
/// 200 after 1 s, `/fail` 503 at once, the rest 200 after 5 ms.
#[allow(clippy::type_complexity)]
fn dependency() -> (
    Arc<AtomicUsize>,
    Arc<Mutex<Vec<usize>>>,
    impl backstop_test_support::Dependency<Request<ReplayBody<String>>>,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let headers = Arc::new(Mutex::new(Vec::new()));
    let (c, h) = (calls.clone(), headers.clone());
    let svc = service_fn(move |req: Request<ReplayBody<String>>| {
        c.fetch_add(1, Ordering::SeqCst);
        h.lock()
            .unwrap()
            .push(req.headers().get_all("grpc-timeout").iter().count());
        let path = req.uri().path().to_owned();
        async move {
            match path.as_str() {
                "/slow" => {
                    tokio::time::sleep(S).await;
                    Ok::<_, Infallible>(status(200))
                }
                "/fail" => Ok(status(503)),
                _ => {
                    tokio::time::sleep(5 * MS).await;
                    Ok(status(200))
                }
            }
        }
    });
    (calls, headers, svc)
}

fn stack() -> ClientLayer<HttpClassifier> {
    backstop::client::http()
        .name("dep")
        .timeout(10 * S)
        .bulkhead(BulkheadLayer::builder(4))
        .throttle(Some(AdaptiveThrottle::builder().seed(3)))
        .breaker(
            backstop::client::http_breaker()
                .consecutive_failures(3)
                .jitter(false),
        )
        .build()
        .unwrap()
}

/// What must hold once every call a caller dropped is gone: no permit held, no failure or
/// call counted by the breaker, no request counted by the throttle.
fn nothing_left(layer: &ClientLayer<HttpClassifier>, how: &str) {
    assert_eq!(
        layer.bulkhead_layer().in_flight(),
        0,
        "{how}: a permit is held"
    );
    let snapshot = layer.breaker_layer().snapshot();
    assert_eq!(
        (snapshot.state, snapshot.calls, snapshot.failures),
        (State::Closed, 0, 0),
        "{how}: the breaker counted a dropped call"
    );
    assert_eq!(
        layer.throttle_layer().throttle().window_counts(),
        (0, 0),
        "{how}: the throttle counted a dropped call"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_polled_then_dropped_leaves_nothing_behind() {
    let layer = stack();
    let (calls, _, dep) = dependency();
    let client = ServiceBuilder::new().layer(layer.clone()).service(dep);
    for _ in 0..10 {
        let mut call = Box::pin(client.clone().oneshot(get("/slow")));
        // Poll it until it reached the dependency, then drop it.
        while calls.load(Ordering::SeqCst) == 0 {
            let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            assert!(polled.is_pending());
            tokio::task::yield_now().await;
        }
        tokio::time::advance(100 * MS).await;
        let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        assert!(polled.is_pending());
        drop(call);
        calls.store(0, Ordering::SeqCst);
    }
    nothing_left(&layer, "poll then drop");
}

#[tokio::test(start_paused = true)]
async fn calls_lost_in_select_leave_nothing_behind() {
    let layer = stack();
    let (_, _, dep) = dependency();
    let client = ServiceBuilder::new().layer(layer.clone()).service(dep);
    for _ in 0..30 {
        tokio::select! {
            _ = client.clone().oneshot(get("/slow")) => panic!("the slow call won"),
            _ = tokio::time::sleep(50 * MS) => {}
        }
    }
    nothing_left(&layer, "select!");
    // The stack still serves, its permits all there.
    let answered = client.clone().oneshot(get("/ok")).await.unwrap();
    assert_eq!(answered.status(), 200);
}

#[tokio::test(start_paused = true)]
async fn futures_unordered_dropped_half_way_leaves_nothing_behind() {
    let layer = stack();
    let (_, _, dep) = dependency();
    let client = ServiceBuilder::new().layer(layer.clone()).service(dep);
    let mut set = futures_util::stream::FuturesUnordered::new();
    for i in 0..12 {
        let path = if i % 3 == 0 { "/ok" } else { "/slow" };
        set.push(client.clone().oneshot(get(path)));
    }
    // Take two results (the bulkhead's queue refuses some at once), then drop the rest.
    for _ in 0..2 {
        let _ = set.next().await.unwrap();
    }
    drop(set);
    assert_eq!(layer.bulkhead_layer().in_flight(), 0);
    assert_eq!(layer.bulkhead_layer().waiting(), 0);
    let snapshot = layer.breaker_layer().snapshot();
    assert_eq!(snapshot.failures, 0, "a dropped call counted as a failure");
    let (requests, accepts) = layer.throttle_layer().throttle().window_counts();
    assert_eq!(
        requests, accepts,
        "a dropped call counted as a request not accepted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_joinset_aborted_leaves_nothing_behind() {
    let layer = stack();
    let (_, _, dep) = dependency();
    let client = ServiceBuilder::new().layer(layer.clone()).service(dep);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let c = client.clone();
        set.spawn(async move { c.oneshot(get("/slow")).await });
    }
    tokio::time::sleep(100 * MS).await;
    assert_eq!(layer.bulkhead_layer().in_flight(), 4);
    assert_eq!(layer.bulkhead_layer().waiting(), 4);
    set.abort_all();
    while set.join_next().await.is_some() {}
    assert_eq!(layer.bulkhead_layer().waiting(), 0);
    nothing_left(&layer, "JoinSet aborted");
}

/// Half-open probes dropped by their callers give their slots back: the breaker probes again
/// and closes, instead of staying half-open with every slot taken by a call that is gone.
#[tokio::test(start_paused = true)]
async fn probes_dropped_by_their_callers_give_their_slots_back() {
    let layer = backstop::client::http()
        .throttle(None)
        .max_attempts(1)
        .attempt(AttemptBound::None)
        .breaker(
            BreakerConfig::http()
                .consecutive_failures(2)
                .probes(2)
                .open_duration(S, S)
                .jitter(false),
        )
        .build()
        .unwrap();
    let (_, _, dep) = dependency();
    let client = ServiceBuilder::new().layer(layer.clone()).service(dep);
    for _ in 0..2 {
        client.clone().oneshot(get("/fail")).await.unwrap();
    }
    assert_eq!(layer.breaker_layer().snapshot().state, State::Open);
    tokio::time::advance(2 * S).await;
    // Two probes, each dropped by a select! before its answer.
    for _ in 0..2 {
        tokio::select! {
            _ = client.clone().oneshot(get("/slow")) => panic!("the probe answered"),
            _ = tokio::time::sleep(10 * MS) => {}
        }
    }
    let snapshot = layer.breaker_layer().snapshot();
    assert_eq!(snapshot.probes_in_flight, 0, "{snapshot:?}");
    // The next calls probe, succeed, and close it.
    for _ in 0..2 {
        let r = client.clone().oneshot(get("/ok")).await;
        assert!(r.is_ok(), "refused after the dropped probes: {r:?}");
    }
    assert_eq!(layer.breaker_layer().snapshot().state, State::Closed);
}

/// A call dropped while it waits for its retry: the retry was never sent, so its budget token
/// comes back ("`refund`: the token of a `try_withdraw` whose retry was not sent after all").
#[tokio::test(start_paused = true)]
async fn a_call_dropped_in_its_backoff_gives_its_budget_token_back() {
    let budget = Arc::new(RatioBudget::new());
    let layer = backstop::client::http()
        .throttle(None)
        .retry(
            RetryConfig::http()
                .budget(budget.clone())
                .backoff(backoff::constant(200 * MS)),
        )
        .build()
        .unwrap();
    let (calls, _, dep) = dependency();
    let client = ServiceBuilder::new().layer(layer.clone()).service(dep);
    let before = budget.balance();
    tokio::select! {
        _ = client.clone().oneshot(get("/fail")) => panic!("answered"),
        _ = tokio::time::sleep(100 * MS) => {}
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the retry was not sent");
    let after = budget.balance();
    assert!(
        (after - before).abs() < 1e-9,
        "the budget lost a token to a retry never sent: {before} -> {after}"
    );
}

/// A call polled once on the caller's task, then spawned, ends as awaited in place: one
/// header per attempt, the answer, nothing left.
#[tokio::test(start_paused = true)]
async fn a_call_polled_then_spawned_ends_as_awaited() {
    let layer = stack();
    let (calls, headers, dep) = dependency();
    let client = ServiceBuilder::new().layer(layer.clone()).service(dep);
    let mut call = Box::pin(client.clone().oneshot(get("/ok")));
    let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
    assert!(polled.is_pending());
    let response = tokio::spawn(call).await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(*headers.lock().unwrap(), [1]);
    assert_eq!(layer.bulkhead_layer().in_flight(), 0);
    assert_eq!(layer.throttle_layer().throttle().window_counts(), (1, 1));
}

/// `block_in_place` + `block_on` from inside a server handler with a deadline: the call keeps
/// the handler's deadline, one header per attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_in_place_and_block_on_keep_the_handlers_deadline() {
    let layer = backstop::client::http().throttle(None).build().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let dep = service_fn(move |req: Request<ReplayBody<String>>| {
        log.lock().unwrap().push(
            req.headers()
                .get_all("grpc-timeout")
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>(),
        );
        async { Ok::<_, Infallible>(status(200)) }
    });
    let client = ServiceBuilder::new().layer(layer).service(dep);
    let handler = service_fn(move |_req: Request<String>| {
        let client = client.clone();
        async move {
            let response = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(client.oneshot(get("/x")))
            });
            assert_eq!(response.unwrap().status(), 200);
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let server = ServiceBuilder::new()
        .layer(backstop::server())
        .service(handler);
    let request = Request::get("/")
        .header("grpc-timeout", "300m")
        .body(String::new())
        .unwrap();
    let response = server.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].len(), 1, "{seen:?}");
    let value = &seen[0][0];
    let ms: u64 = value.trim_end_matches('m').parse().unwrap_or(u64::MAX);
    assert!(value.ends_with('m') && ms <= 300, "told {value}");
}

/// A stack wrapped in a `Buffer` and a `ConcurrencyLimit` from outside, its calls dropped by
/// their callers while queued or in flight: nothing left, and the stack serves on.
#[tokio::test(start_paused = true)]
async fn a_buffered_limited_stack_whose_calls_are_dropped_serves_on() {
    let layer = stack();
    let (_, headers, dep) = dependency();
    let client = ServiceBuilder::new().layer(layer.clone()).service(dep);
    let client = tower::limit::ConcurrencyLimit::new(client, 2);
    let client = tower::buffer::Buffer::new(client, 16);
    let mut set = futures_util::stream::FuturesUnordered::new();
    for _ in 0..10 {
        set.push(client.clone().oneshot(get("/slow")));
    }
    let _ = tokio::time::timeout(200 * MS, set.next()).await;
    drop(set);
    tokio::time::sleep(10 * MS).await;
    nothing_left(&layer, "Buffer + ConcurrencyLimit");
    let answered = client.clone().oneshot(get("/ok")).await.unwrap();
    assert_eq!(answered.status(), 200);
    assert!(headers.lock().unwrap().iter().all(|&n| n == 1));
}

/// A hedge that wins: the loser, cancelled, is no failure of the breaker nor a request the
/// throttle did not see accepted, and the call held one bulkhead permit across its copies.
#[tokio::test(start_paused = true)]
async fn a_hedges_loser_is_no_failure_and_the_call_holds_one_permit() {
    use backstop::client::retry::{Idempotency, hedge::Hedging};
    let layer = backstop::client::http()
        .throttle(Some(AdaptiveThrottle::builder().seed(1)))
        .bulkhead(BulkheadLayer::builder(1).max_queue(0))
        .retry(
            RetryConfig::http()
                .idempotency(Idempotency::All)
                .hedging(Hedging::new(20 * MS).max_attempts(3)),
        )
        .build()
        .unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    let dep = service_fn(move |_req: Request<ReplayBody<String>>| {
        let i = count.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(if i == 0 { S } else { 5 * MS }).await;
            Ok::<_, Infallible>(status(200))
        }
    });
    let client = ServiceBuilder::new().layer(layer.clone()).service(dep);
    let response = client.clone().oneshot(get("/x")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(n.load(Ordering::SeqCst), 2);
    assert_eq!(layer.retry_layer().stats().hedges, 1);
    let snapshot = layer.breaker_layer().snapshot();
    assert_eq!((snapshot.calls, snapshot.failures), (1, 0), "{snapshot:?}");
    assert_eq!(layer.throttle_layer().throttle().window_counts(), (1, 1));
    assert_eq!(layer.bulkhead_layer().in_flight(), 0);
    // Dropped while both copies are in flight: nothing counted, the permit back.
    tokio::select! {
        _ = client.clone().oneshot(get("/x")) => {}
        _ = tokio::time::sleep(25 * MS) => {}
    }
    let _ = n;
    assert_eq!(layer.bulkhead_layer().in_flight(), 0);
    let snapshot = layer.breaker_layer().snapshot();
    assert_eq!(snapshot.failures, 0, "{snapshot:?}");
}
