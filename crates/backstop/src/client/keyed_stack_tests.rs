//! The per-route table through the stack, with a breaker idle time shorter than the latency
//! models' 30 s window (a constant for users, 5 min; the crate's tests can set it), so a model
//! still holds its samples when a test looks at it after the idle time.

use crate::client::attempt::AttemptBound;
use crate::client::breaker::{BreakerConfig, State};
use crate::{ClientLayer, HttpClassifier, ReplayBody, RouteKey};
use http::{Request, Response};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower::{ServiceBuilder, ServiceExt, service_fn};

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

/// One key, idle after a second, opened by two failures, open for 60 s (no jitter).
fn one_route_table() -> BreakerConfig<HttpClassifier> {
    BreakerConfig::http()
        .per_key(RouteKey::Path)
        .max_keys(1)
        .idle_keys_after(S)
        .consecutive_failures(2)
        .open_duration(60 * S, 60 * S)
        .jitter(false)
}

fn single_attempts(breaker: BreakerConfig<HttpClassifier>) -> ClientLayer<HttpClassifier> {
    crate::client::http()
        .breaker(breaker)
        .throttle(None)
        .max_attempts(1)
        .attempt(AttemptBound::None)
        .build()
        .unwrap()
}

fn get(path: &str) -> Request<String> {
    Request::get(format!("http://dep{path}"))
        .body(String::new())
        .unwrap()
}

fn breaker_keys(stack: &ClientLayer<HttpClassifier>) -> Vec<String> {
    stack
        .breaker_layer()
        .keys()
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

/// An open route's breaker stays through its open time, called or not, though it is idle and
/// another route needs its place; after its open time it makes room, and re-added later it is
/// a fresh (closed) breaker.
///
/// Its latency model stays and goes with it. Was a defect (the last finding of the builder's
/// outside attack), fixed: "a breaker held open keeps its key while the latency model table
/// may evict that route's model". An open breaker lets none of its route's calls reach the
/// model, so the model went idle and a new route took its place; the route's probe after the
/// open time was then bounded by a fresh model (the ceiling), not by its own latency.
#[tokio::test(start_paused = true)]
async fn an_open_routes_breaker_is_not_evicted_while_open_and_comes_back_fresh() {
    let stack = single_attempts(one_route_table());
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    // Every call answers after 1 ms: 503 for /a, 200 for any other path.
    let dep = service_fn(move |req: Request<ReplayBody<String>>| {
        count.fetch_add(1, Ordering::SeqCst);
        let status = if req.uri().path() == "/a" { 503 } else { 200 };
        async move {
            tokio::time::sleep(MS).await;
            let response = Response::builder().status(status).body(String::new());
            Ok::<_, Infallible>(response.unwrap())
        }
    });
    let attempts = || seen.load(Ordering::SeqCst);
    let client = ServiceBuilder::new().layer(stack.clone()).service(dep);
    for _ in 0..2 {
        client.clone().oneshot(get("/a")).await.unwrap();
    }
    assert_eq!(
        stack.breaker_layer().key_snapshot("/a").unwrap().state,
        State::Open
    );
    assert_eq!(stack.attempt_layer().key_latency("/a").unwrap().count, 2);
    tokio::time::advance(5 * S).await;
    // /b wants the one place: /a is idle but open, so /b goes to the overflow breaker, and
    // to the overflow model.
    client.clone().oneshot(get("/b")).await.unwrap();
    assert_eq!(
        stack.breaker_layer().key_snapshot("/a").unwrap().state,
        State::Open
    );
    assert!(stack.breaker_layer().key_snapshot("/b").is_none());
    assert_eq!(stack.attempt_layer().keys(), ["/a"]);
    assert_eq!(stack.attempt_layer().key_latency("/a").unwrap().count, 2);
    // /a is still refused locally.
    let before = attempts();
    let refused = client.clone().oneshot(get("/a")).await;
    assert!(refused.is_err(), "an open route's call went through");
    assert_eq!(attempts(), before);
    // Many routes hammering the full table do not push it out either.
    for i in 0..50 {
        client
            .clone()
            .oneshot(get(&format!("/r{i}")))
            .await
            .unwrap();
    }
    assert_eq!(
        stack.breaker_layer().key_snapshot("/a").unwrap().state,
        State::Open
    );
    // Past its open time (and idle), /a makes room for /b.
    tokio::time::advance(61 * S).await;
    client.clone().oneshot(get("/b")).await.unwrap();
    let keys = breaker_keys(&stack);
    assert_eq!(keys, ["/b"]);
    assert_eq!(stack.attempt_layer().keys(), keys, "the model went with it");
    // /a re-added once /b is idle: a fresh breaker, closed, nothing counted.
    tokio::time::advance(2 * S).await;
    let response = client.clone().oneshot(get("/a")).await.unwrap();
    assert_eq!(response.status(), 503, "sent, not refused");
    let fresh = stack.breaker_layer().key_snapshot("/a").unwrap();
    assert_eq!(
        (fresh.state, fresh.failures, fresh.opens),
        (State::Closed, 1, 0)
    );
}
