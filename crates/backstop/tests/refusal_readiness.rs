//! A request a layer refuses without calling inside gives back the readiness its caller
//! reserved for it: the `ConcurrencyLimit` permit (or `Buffer` slot) that `poll_ready` took is
//! free for another clone of the same stack at once. Held, a clone kept in a struct field
//! (`svc.ready().await?.call(req)`) and refused once would stall every other caller of a
//! limit of one until it was next called or dropped.
//!
//! Each test: two clones, `a` and `b`, of one stack over a transport with room for one
//! call; `a` is readied and its request refused (every refusal path of the library, client
//! and server); `b` must then get ready without waiting.

use backstop::client::breaker::{BreakerConfig, Mode};
use backstop::client::overload::bulkhead::BulkheadLayer;
use backstop::client::overload::throttle::{AdaptiveThrottle, ThrottleLayer};
use backstop::client::retry::{ReplayBody, RetryConfig, RetryOverrides};
use backstop::deadline::{Deadline, PropagateDeadlineLayer};
use backstop::idempotency::{IdempotencyLayer, MemoryStore};
use backstop::{HttpClassifier, is_breaker_open, is_deadline_exceeded};
use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use std::{convert::Infallible, sync::Arc, time::Duration};
use tower::limit::ConcurrencyLimit;
use tower::{Layer, Service, ServiceExt, service_fn};

type Body = Full<Bytes>;

/// A transport with room for one call in flight, answering 200 at once.
fn one_at_a_time<B: Send + 'static>() -> ConcurrencyLimit<
    impl Service<
        Request<B>,
        Response = Response<Body>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
    > + Clone,
> {
    ConcurrencyLimit::new(
        service_fn(|_req: Request<B>| async {
            Ok::<_, Infallible>(Response::new(Body::default()))
        }),
        1,
    )
}

fn get() -> Request<Body> {
    Request::get("http://dependency/item")
        .body(Body::default())
        .unwrap()
}

fn with_spent_deadline() -> Request<Body> {
    let mut req = get();
    req.extensions_mut().insert(Deadline::after(Duration::ZERO));
    req
}

/// `req` with retries off (the retry layer's sent-once path).
fn sent_once(mut req: Request<Body>) -> Request<Body> {
    req.extensions_mut().insert(RetryOverrides::no_retries());
    req
}

/// `b` gets ready without waiting for `a` (paused time: a wait would run the 5 s out).
async fn gets_ready<S: Service<Request<Body>>>(b: &mut S) {
    tokio::time::timeout(Duration::from_secs(5), b.ready())
        .await
        .expect("the other clone waited: the refused call kept the readiness reserved for it")
        .ok()
        .expect("ready");
}

/// Readies one clone of `stack` and has it call `req`, then checks that another clone gets
/// ready at once; returns the first call's result.
async fn called_then_other_ready<S>(stack: S, req: Request<Body>) -> Result<S::Response, S::Error>
where
    S: Service<Request<Body>> + Clone,
{
    let (mut a, mut b) = (stack.clone(), stack);
    let result = match a.ready().await {
        Ok(a) => a.call(req).await,
        Err(_) => panic!("the first clone got no readiness"),
    };
    gets_ready(&mut b).await;
    result
}

/// Control: a call that is sent gives its permit back when it ends.
#[tokio::test(start_paused = true)]
async fn a_sent_call_gives_its_permit_back() {
    let stack = backstop::client::http()
        .build()
        .unwrap()
        .layer(one_at_a_time());
    called_then_other_ready(stack, get()).await.unwrap();
}

/// The preset's deadline layer refuses a call whose deadline has passed, over a
/// `ConcurrencyLimit` and over a `Buffer` (how a transport that is not `Clone` is shared).
#[tokio::test(start_paused = true)]
async fn a_spent_deadline_in_the_preset() {
    let stack = backstop::client::http()
        .build()
        .unwrap()
        .layer(one_at_a_time());
    let err = called_then_other_ready(stack, with_spent_deadline()).await;
    assert!(is_deadline_exceeded(&*err.unwrap_err()));

    let transport = tower::buffer::Buffer::new(
        service_fn(|_req: Request<ReplayBody<Body>>| async {
            Ok::<_, Infallible>(Response::new(Body::default()))
        }),
        1,
    );
    let stack = backstop::client::http().build().unwrap().layer(transport);
    let err = called_then_other_ready(stack, with_spent_deadline()).await;
    assert!(is_deadline_exceeded(&*err.unwrap_err()));
}

/// `PropagateDeadline` alone refuses a call whose deadline has passed.
#[tokio::test(start_paused = true)]
async fn a_spent_deadline_at_propagate_deadline_alone() {
    let stack = PropagateDeadlineLayer::builder()
        .build()
        .unwrap()
        .layer(one_at_a_time());
    let err = called_then_other_ready(stack, with_spent_deadline()).await;
    assert!(is_deadline_exceeded(&*err.unwrap_err()));
}

/// The retry layer alone, retries off for the request (its sent-once path), refuses a call
/// whose deadline has passed.
#[tokio::test(start_paused = true)]
async fn a_spent_deadline_at_the_retry_layer_sending_once() {
    let stack = RetryConfig::http().build().unwrap().layer(one_at_a_time());
    let err = called_then_other_ready(stack, sent_once(with_spent_deadline())).await;
    assert!(is_deadline_exceeded(&*err.unwrap_err()));
}

/// An open breaker, alone and in the preset (retries off for the request, so the breaker
/// refuses on the caller's own readiness).
#[tokio::test(start_paused = true)]
async fn an_open_breaker() {
    let breaker = BreakerConfig::http().build().unwrap();
    breaker.set_mode(Mode::ForcedOpen);
    let stack = breaker.layer(one_at_a_time());
    let err = called_then_other_ready(stack, get()).await;
    assert!(is_breaker_open(&*err.unwrap_err()));

    let client = backstop::client::http().build().unwrap();
    client.breaker_layer().set_mode(Mode::ForcedOpen);
    let stack = client.layer(one_at_a_time());
    let err = called_then_other_ready(stack, sent_once(get())).await;
    assert!(is_breaker_open(&*err.unwrap_err()));
}

/// A throttle that refuses every call (it saw 1 000 calls and no accept, and may refuse
/// them all).
#[tokio::test(start_paused = true)]
async fn a_throttled_call() {
    let throttle = AdaptiveThrottle::builder()
        .max_probability(1.0)
        .seed(1)
        .build()
        .unwrap();
    for _ in 0..1_000 {
        throttle.record_request();
    }
    assert!(throttle.probability() > 0.99);
    let stack =
        ThrottleLayer::with(Arc::new(throttle), HttpClassifier::new()).layer(one_at_a_time());
    // Readied and refused until one refusal is seen (the draw is seeded).
    let mut refused = false;
    for _ in 0..20 {
        refused |= called_then_other_ready(stack.clone(), get()).await.is_err();
    }
    assert!(refused, "the throttle refused none of 20 calls");
}

/// A bulkhead of one with no queue refuses a second call while the first holds its permit;
/// the transport has room for two, and the refused call's room is free again at once.
#[tokio::test(start_paused = true)]
async fn a_full_bulkhead() {
    let (release, held) = tokio::sync::watch::channel(false);
    let transport = ConcurrencyLimit::new(
        service_fn(move |_req: Request<Body>| {
            let mut held = held.clone();
            async move {
                let _ = held.wait_for(|released| *released).await;
                Ok::<_, Infallible>(Response::new(Body::default()))
            }
        }),
        2,
    );
    let bulkhead = BulkheadLayer::builder(1).max_queue(0).build().unwrap();
    let stack = bulkhead.layer(transport);
    let (mut first, mut a, mut b) = (stack.clone(), stack.clone(), stack);
    let first = tokio::spawn(first.ready().await.unwrap().call(get()));
    tokio::task::yield_now().await;
    let refused = a.ready().await.unwrap().call(get()).await;
    assert!(
        refused.is_err(),
        "the bulkhead has no room for a second call"
    );
    // The first call still holds one of the transport's two permits: the other is free.
    gets_ready(&mut b).await;
    release.send(true).unwrap();
    first.await.unwrap().unwrap();
}

/// The server's deadline layer rejects a malformed `grpc-timeout` on arrival.
#[tokio::test(start_paused = true)]
async fn a_malformed_timeout_at_the_server() {
    let stack = backstop::server().layer(one_at_a_time());
    let mut req = get();
    req.headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static("soon"));
    let response = called_then_other_ready(stack, req).await.unwrap();
    assert_eq!(response.status(), 400);
}

/// The idempotency layer refuses a request with two keys (400) before the handler runs.
#[tokio::test(start_paused = true)]
async fn a_bad_idempotency_key() {
    let stack = IdempotencyLayer::new(MemoryStore::new()).layer(one_at_a_time());
    let mut req = Request::post("http://dependency/orders")
        .body(Body::from("order"))
        .unwrap();
    req.headers_mut()
        .append("idempotency-key", HeaderValue::from_static("one"));
    req.headers_mut()
        .append("idempotency-key", HeaderValue::from_static("two"));
    let response = called_then_other_ready(stack, req).await.unwrap();
    assert_eq!(response.status(), 400);
}

/// A handler of `orders` (counted in the returned runs) that holds requests to `held_path`
/// until the sender says `true`.
#[allow(clippy::type_complexity)]
fn holding_handler(
    held_path: &'static str,
) -> (
    tokio::sync::watch::Sender<bool>,
    Arc<std::sync::atomic::AtomicUsize>,
    impl Service<
        Request<Body>,
        Response = Response<Body>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
    > + Clone,
) {
    let (release, held) = tokio::sync::watch::channel(false);
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = service_fn(move |req: Request<Body>| {
        let mut held = held.clone();
        if req.uri().path() == "/orders" {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        async move {
            if req.uri().path() == held_path {
                let _ = held.wait_for(|released| *released).await;
            }
            Ok::<_, Infallible>(Response::new(Body::from("charged")))
        }
    });
    (release, runs, handler)
}

fn keyed_post(key: &'static str) -> Request<Body> {
    Request::post("http://dependency/orders")
        .header("idempotency-key", key)
        .body(Body::from("order"))
        .unwrap()
}

fn slow_get() -> Request<Body> {
    Request::get("http://dependency/slow")
        .body(Body::default())
        .unwrap()
}

fn waiting_for_the_original() -> IdempotencyLayer<MemoryStore> {
    IdempotencyLayer::builder(MemoryStore::new())
        .wait_in_flight(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Sends a keyed POST and, 10 ms later, a duplicate of it, each on a clone of `stack`
/// readied first; returns both calls 10 ms after that.
async fn original_and_duplicate<S>(
    stack: &S,
    key: &'static str,
) -> (
    tokio::task::JoinHandle<Result<S::Response, backstop::BoxError>>,
    tokio::task::JoinHandle<Result<S::Response, backstop::BoxError>>,
)
where
    S: Service<Request<Body>> + Clone + Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<backstop::BoxError>,
    S::Future: Send + 'static,
{
    let mut sent = Vec::new();
    for _ in 0..2 {
        let mut clone = stack.clone();
        let call = match clone.ready().await {
            Ok(ready) => ready.call(keyed_post(key)),
            Err(_) => panic!("not ready"),
        };
        sent.push(tokio::spawn(async move { call.await.map_err(Into::into) }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let duplicate = sent.pop().unwrap();
    (sent.pop().unwrap(), duplicate)
}

/// A duplicate of a keyed request still running, waiting for the original's answer
/// (`wait_in_flight`), never calls the handler: it holds none of the handler's capacity while
/// it waits. The handler takes two at a time; the original holds one, so a third caller
/// gets the other while the duplicate waits; then both keyed requests get the one answer.
#[tokio::test(start_paused = true)]
async fn a_duplicate_waiting_for_the_original() {
    let (release, runs, handler) = holding_handler("/orders");
    let stack = waiting_for_the_original().layer(ConcurrencyLimit::new(handler, 2));
    let (original, duplicate) = original_and_duplicate(&stack, "order-42").await;
    let mut other = stack;
    gets_ready(&mut other).await;
    release.send(true).unwrap();
    assert_eq!(original.await.unwrap().unwrap().status(), 200);
    let duplicate = duplicate.await.unwrap().unwrap();
    assert_eq!(duplicate.status(), 200);
    assert_eq!(duplicate.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// The same over a `Buffer` of one in front of the handler: a request for another route is
/// not held up by the duplicate's wait.
#[tokio::test(start_paused = true)]
async fn a_duplicate_waiting_holds_no_buffer_slot() {
    let (release, _, handler) = holding_handler("/orders");
    let stack = waiting_for_the_original().layer(tower::buffer::Buffer::new(handler, 1));
    let (original, duplicate) = original_and_duplicate(&stack, "order-43").await;
    let answer = tokio::time::timeout(Duration::from_secs(5), stack.oneshot(get()))
        .await
        .expect("another route waited for the duplicate's wait")
        .unwrap();
    assert_eq!(answer.status(), 200);
    release.send(true).unwrap();
    assert_eq!(original.await.unwrap().unwrap().status(), 200);
    assert_eq!(duplicate.await.unwrap().unwrap().status(), 200);
}

/// A completed key's replay needs none of the handler's capacity. The replay's caller
/// readied the stack (the handler's only permit); at its call the permit goes back, another
/// caller takes it and holds it, and the replay is still answered.
#[tokio::test(start_paused = true)]
async fn a_replay_is_answered_while_the_handler_is_busy() {
    let (release, _, handler) = holding_handler("/slow");
    let stack = IdempotencyLayer::new(MemoryStore::new()).layer(ConcurrencyLimit::new(handler, 1));
    let first = stack.clone().oneshot(keyed_post("order-7")).await.unwrap();
    assert_eq!(first.status(), 200);
    let mut replay = stack.clone();
    replay.ready().await.unwrap();
    let busy = tokio::spawn(stack.oneshot(slow_get()));
    tokio::task::yield_now().await;
    let answer = tokio::time::timeout(Duration::from_secs(5), replay.call(keyed_post("order-7")))
        .await
        .expect("the replay waited for the handler's capacity")
        .unwrap();
    assert_eq!(answer.headers()["idempotent-replayed"], "true");
    release.send(true).unwrap();
    busy.await.unwrap().unwrap();
}

/// A keyed request dropped while it waits for the handler's service (its key claimed, the
/// handler not started) leaves the key free: nothing ran, and a retry runs the handler.
#[tokio::test(start_paused = true)]
async fn a_keyed_request_dropped_before_its_handler_leaves_the_key_free() {
    let (release, runs, handler) = holding_handler("/slow");
    let stack = IdempotencyLayer::new(MemoryStore::new()).layer(ConcurrencyLimit::new(handler, 1));
    // The keyed caller readies the stack (the handler's only permit) and calls; at its call
    // the permit goes back and the busy call takes it, so the keyed request claims its key
    // and waits for the handler's service, and is dropped there.
    let mut post = stack.clone();
    post.ready().await.unwrap();
    let busy = tokio::spawn(stack.clone().oneshot(slow_get()));
    tokio::task::yield_now().await;
    let waited = tokio::time::timeout(Duration::from_millis(100), post.call(keyed_post("order-8")));
    assert!(waited.await.is_err(), "the handler was busy");
    release.send(true).unwrap();
    busy.await.unwrap().unwrap();
    let retry = stack.oneshot(keyed_post("order-8")).await.unwrap();
    assert_eq!(retry.status(), 200);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}
