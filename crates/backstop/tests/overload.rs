//! The presets under overload, with a mock dependency under paused time: the client's
//! throttle (on by default) and bulkhead (a knob) refuse calls locally, and a refused call is
//! never sent, never retried and never a breaker failure; the server preset's admission
//! refuses a request too short of time without calling its handler.

use backstop::ReplayBody;
use backstop::client::overload::bulkhead::BulkheadLayer;
use backstop::client::overload::throttle::{AdaptiveThrottle, AdaptiveThrottleBuilder};
use backstop::client::retry::{CallInfo, GiveUp};
use backstop::client::{call_info, error_info};
use backstop::deadline::Deadline;
use backstop::prelude::*;
use backstop::server::admission::AdmissionLayer;
use backstop::{BulkheadFull, ClientThrottled};
use futures_util::{StreamExt, stream::FuturesUnordered};
use http::{Request, Response};
use std::{
    convert::Infallible,
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

/// A dependency that counts the calls it is sent and answers each with `reply` after
/// `latency`.
fn dependency(
    hits: &Arc<AtomicU32>,
    latency: Duration,
    reply: fn() -> Response<String>,
) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    let hits = hits.clone();
    service_fn(move |_req: Request<ReplayBody<String>>| {
        hits.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(latency).await;
            Ok::<_, Infallible>(reply())
        }
    })
}

fn unavailable() -> Response<String> {
    backstop_test_support::reply(503)
}

fn grpc_unavailable() -> Response<String> {
    backstop_test_support::grpc_reply(14)
}

fn ok() -> Response<String> {
    backstop_test_support::reply(200)
}

/// A breaker that never opens in these tests, so every call it sees reaches the dependency,
/// and whose window (of calls, not time) counts them all.
fn patient<C: Clone>(config: BreakerConfig<C>) -> BreakerConfig<C> {
    config.count_window(100_000).minimum_calls(100_000)
}

/// A throttle of its own, seeded so its draws repeat, classifying with `C`'s defaults.
fn seeded_throttle() -> Option<AdaptiveThrottleBuilder> {
    Some(AdaptiveThrottle::builder().seed(28))
}

#[test]
fn the_presets_throttle_by_default_and_limit_nothing_until_told() {
    let http = backstop::client::http().name("search").build().unwrap();
    assert!(http.throttle_layer().is_on());
    assert!(!http.bulkhead_layer().is_on());
    let grpc = backstop::client::grpc().build().unwrap();
    assert!(grpc.throttle_layer().is_on());
    assert!(!grpc.bulkhead_layer().is_on());
    let off = backstop::client::http()
        .name("search")
        .throttle(None)
        .build()
        .unwrap();
    assert!(!off.throttle_layer().is_on());
    assert_eq!(off.dependency(), "search");
}

#[tokio::test(start_paused = true)]
async fn a_throttled_http_call_is_refused_not_sent_not_retried_not_a_breaker_failure() {
    let hits = Arc::new(AtomicU32::new(0));
    let backend = backstop::client::http()
        .breaker(patient(BreakerConfig::http()))
        .throttle(seeded_throttle())
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(dependency(&hits, Duration::from_millis(5), unavailable));

    let (mut throttled, mut answered) = (0, 0);
    for _ in 0..300 {
        match backstop_test_support::get_from(&client).await {
            Ok(response) => {
                assert_eq!(response.status(), 503);
                answered += 1;
            }
            Err(err) => {
                assert!(
                    backstop::find::<ClientThrottled>(err.as_ref()).is_some(),
                    "{err}"
                );
                assert_eq!(
                    error_info(err.as_ref()),
                    Some(CallInfo::new(0, Some(GiveUp::Throttled)))
                );
                throttled += 1;
            }
        }
        tokio::time::advance(Duration::from_millis(20)).await;
    }
    // The throttle acts once a second's worth of calls is in its window, and then refuses
    // up to 90 % of them.
    assert!(
        throttled >= 150,
        "{throttled} throttled, {answered} answered"
    );
    assert_eq!(backend.throttle_layer().throttle().rejections(), throttled);
    // A refused call never reached the retry layer: it neither asked for a retry nor was
    // one; every attempt the dependency saw belongs to an answered call.
    let stats = backend.retry_layer().stats();
    assert_eq!(stats.requests, answered);
    assert_eq!(
        u64::from(hits.load(Ordering::SeqCst)),
        answered + stats.retries
    );
    // The breaker counted the attempts sent, and nothing else.
    let snap = backend.breaker_layer().snapshot();
    assert_eq!(snap.calls, u64::from(hits.load(Ordering::SeqCst)));
    assert_eq!(snap.failures, snap.calls);
}

#[tokio::test(start_paused = true)]
async fn a_throttled_grpc_call_is_a_trailers_only_unavailable_never_sent() {
    let hits = Arc::new(AtomicU32::new(0));
    let backend = backstop::client::grpc()
        .breaker(patient(BreakerConfig::grpc()))
        .throttle(seeded_throttle())
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(dependency(
            &hits,
            Duration::from_millis(5),
            grpc_unavailable,
        ));

    let mut throttled = 0;
    for _ in 0..300 {
        let response = client
            .clone()
            .oneshot(backstop_test_support::grpc_call(""))
            .await
            .unwrap();
        assert_eq!(response.headers()["grpc-status"], "14");
        if call_info(&response).gave_up() == Some(GiveUp::Throttled) {
            assert_eq!(call_info(&response).attempts(), 0);
            assert_eq!(response.headers()["grpc-retry-pushback-ms"], "-1");
            assert_eq!(
                response.extensions().get::<backstop::Rejection>(),
                Some(&backstop::Rejection::ClientThrottled)
            );
            throttled += 1;
        }
        tokio::time::advance(Duration::from_millis(20)).await;
    }
    assert!(throttled >= 150, "{throttled} throttled");
    let stats = backend.retry_layer().stats();
    assert_eq!(stats.requests, 300 - throttled);
    let sent = u64::from(hits.load(Ordering::SeqCst));
    assert_eq!(sent, stats.requests + stats.retries);
    assert_eq!(backend.breaker_layer().snapshot().calls, sent);
}

#[tokio::test(start_paused = true)]
async fn a_healthy_dependency_is_never_throttled() {
    let hits = Arc::new(AtomicU32::new(0));
    let backend = backstop::client::http().build().unwrap();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(dependency(&hits, Duration::from_millis(5), ok));
    for _ in 0..300 {
        let response = backstop_test_support::get_from(&client).await.unwrap();
        assert_eq!(response.status(), 200);
        tokio::time::advance(Duration::from_millis(20)).await;
    }
    assert_eq!(hits.load(Ordering::SeqCst), 300);
    assert_eq!(backend.throttle_layer().throttle().rejections(), 0);
}

/// A GET whose caller gives it `ms` milliseconds.
fn get_within(ms: u64) -> Request<String> {
    let mut req = backstop_test_support::get();
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_millis(ms)));
    req
}

#[tokio::test(start_paused = true)]
async fn a_full_bulkhead_refuses_a_call_that_cannot_wait_at_once_and_never_sends_it() {
    let hits = Arc::new(AtomicU32::new(0));
    let backend = backstop::client::http()
        .breaker(patient(BreakerConfig::http()))
        .bulkhead(BulkheadLayer::builder(1))
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(dependency(&hits, Duration::from_millis(300), ok));
    // One answer teaches the bulkhead that a call holds its permit 300 ms.
    client.clone().oneshot(get_within(1_000)).await.unwrap();
    assert_eq!(
        backend.bulkhead_layer().hold_time(),
        Duration::from_millis(300)
    );

    let holder = tokio::spawn(client.clone().oneshot(get_within(1_000)));
    tokio::task::yield_now().await;
    assert_eq!(backend.bulkhead_layer().in_flight(), 1);
    // 200 ms left, and the permit is 300 ms away: refused now, not at the deadline.
    let asked = tokio::time::Instant::now();
    let err = client.clone().oneshot(get_within(200)).await.unwrap_err();
    assert_eq!(asked.elapsed(), Duration::ZERO);
    let full = backstop::find::<BulkheadFull>(err.as_ref()).expect("a bulkhead refusal");
    assert_eq!(full.knob(), "max_concurrency");
    assert!(holder.await.unwrap().is_ok());

    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "the refused call was not sent"
    );
    let stats = backend.retry_layer().stats();
    assert_eq!((stats.requests, stats.retries), (2, 0));
    assert_eq!(backend.breaker_layer().snapshot().calls, 2);
}

/// A dependency that counts its calls in `hits` and answers each gRPC OK after 300 ms.
fn slow_grpc_ok(
    hits: &Arc<AtomicU32>,
) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    dependency(hits, Duration::from_millis(300), || {
        backstop_test_support::grpc_reply(0)
    })
}

/// Sends a gRPC call through `client`, which holds the one permit of its bulkhead (no queue),
/// then another while it runs: returns the second call's answer, then the first's.
async fn a_call_beside_the_permit_holder<S, B>(client: &S) -> (Response<B>, Response<B>)
where
    S: Service<Request<String>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug + Send,
    B: Send + 'static,
{
    let holder = tokio::spawn(client.clone().oneshot(backstop_test_support::grpc_call("")));
    tokio::task::yield_now().await;
    let response = client
        .clone()
        .oneshot(backstop_test_support::grpc_call(""))
        .await
        .unwrap();
    (response, holder.await.unwrap().unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_full_bulkhead_answers_grpc_with_a_trailers_only_unavailable() {
    let hits = Arc::new(AtomicU32::new(0));
    let backend = backstop::client::grpc()
        .bulkhead(BulkheadLayer::builder(1).max_queue(0))
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(slow_grpc_ok(&hits));
    let (response, answered) = a_call_beside_the_permit_holder(&client).await;
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(response.headers()["grpc-retry-pushback-ms"], "-1");
    assert_eq!(
        response.extensions().get::<backstop::Rejection>(),
        Some(&backstop::Rejection::BulkheadFull)
    );
    assert_eq!(answered.headers()["grpc-status"], "0");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(backend.retry_layer().stats().requests, 1);
    assert_eq!(backend.breaker_layer().snapshot().calls, 1);
}

/// A handler that counts its calls and takes 100 ms.
fn handler(
    calls: &Arc<AtomicU32>,
) -> impl tower::Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
+ Clone {
    let calls = calls.clone();
    service_fn(move |_req: Request<String>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn the_server_preset_refuses_a_request_shorter_than_its_route_needs() {
    let calls = Arc::new(AtomicU32::new(0));
    let preset = backstop::server();
    let server = ServiceBuilder::new()
        .layer(preset.clone())
        .service(handler(&calls));
    // Cold: everything is admitted while the route's model learns (100 answers).
    for _ in 0..100 {
        let req = backstop_test_support::http_request(Some("1S"));
        assert_eq!(server.clone().oneshot(req).await.unwrap().status(), 200);
    }
    tokio::time::advance(Duration::from_millis(100)).await;
    let need = preset.admission_layer().need("/").expect("trusted");
    assert!((95..=105).contains(&need.as_millis()), "{need:?}");

    // 50 ms left where the route takes 100: refused at once, the handler not called.
    let req = backstop_test_support::http_request(Some("50m"));
    assert_eq!(server.clone().oneshot(req).await.unwrap().status(), 504);
    let req = backstop_test_support::grpc_request(Some("50m"));
    let response = server.clone().oneshot(req).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(calls.load(Ordering::SeqCst), 100);
    // Enough time, or no deadline at all: admitted.
    let req = backstop_test_support::http_request(Some("500m"));
    assert_eq!(server.clone().oneshot(req).await.unwrap().status(), 200);
    let req = backstop_test_support::http_request(None);
    assert_eq!(server.clone().oneshot(req).await.unwrap().status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 102);
}

#[tokio::test(start_paused = true)]
async fn the_server_preset_without_admission_calls_every_handler() {
    let calls = Arc::new(AtomicU32::new(0));
    let server = ServiceBuilder::new()
        .layer(backstop::server().admission(AdmissionLayer::off()))
        .service(handler(&calls));
    for _ in 0..100 {
        let req = backstop_test_support::http_request(Some("1S"));
        server.clone().oneshot(req).await.unwrap();
    }
    tokio::time::advance(Duration::from_millis(100)).await;
    // Cancelled at its deadline by the deadline layer, but called.
    let req = backstop_test_support::http_request(Some("50m"));
    assert_eq!(server.clone().oneshot(req).await.unwrap().status(), 504);
    assert_eq!(calls.load(Ordering::SeqCst), 101);
}

#[cfg(feature = "service-config")]
#[tokio::test(start_paused = true)]
async fn the_service_config_client_keeps_the_presets_bulkhead_for_every_method() {
    let hits = Arc::new(AtomicU32::new(0));
    let config =
        backstop::service_config::ServiceConfig::from_json(r#"{ "methodConfig": [] }"#).unwrap();
    let backend = backstop::client::grpc()
        .bulkhead(BulkheadLayer::builder(1).max_queue(0))
        .service_config(config)
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(backend)
        .service(slow_grpc_ok(&hits));
    let (response, answered) = a_call_beside_the_permit_holder(&client).await;
    assert_eq!(
        response.extensions().get::<backstop::Rejection>(),
        Some(&backstop::Rejection::BulkheadFull)
    );
    assert_eq!(answered.headers()["grpc-status"], "0");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

// The promises under what callers do: cases an outside review of the throttle, the bulkhead
// and admission found broken (a route refused for another's latency, a racing caller tripping
// the throttle, local refusals shrinking the bulkhead's hold time, a permit held past the
// response), kept so they stay fixed.

/// Admission refuses only a request whose caller gave it less time than half of *its own
/// route's* requests take. `/api/report` and `/api/items` hash into the same one of the 16
/// models: the model measures the first to arrive (the 200 ms report), and the 5 ms items
/// route, never measured, is admitted with 150 ms left.
#[tokio::test(start_paused = true)]
async fn a_route_is_never_refused_for_another_routes_latency() {
    let items_calls = Arc::new(AtomicU32::new(0));
    let calls = items_calls.clone();
    let handler = service_fn(move |req: Request<String>| {
        let slow = req.uri().path() == "/api/report";
        if !slow {
            calls.fetch_add(1, Ordering::SeqCst);
        }
        async move {
            let took = if slow { 200 } else { 5 };
            tokio::time::sleep(Duration::from_millis(took)).await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let preset = backstop::server();
    let server = ServiceBuilder::new().layer(preset.clone()).service(handler);
    let at = |path: &str, timeout: &str| {
        Request::builder()
            .uri(path)
            .header("grpc-timeout", timeout)
            .body(String::new())
            .unwrap()
    };
    // The slow report route gets its 100 answers (each well within its 5 s).
    for _ in 0..100 {
        let response = server
            .clone()
            .oneshot(at("/api/report", "5S"))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    tokio::time::advance(Duration::from_millis(100)).await;
    // The fast route has never been measured: "cold routes admit"...
    let need = preset.admission_layer().need("/api/items");
    // ...and a caller giving it 150 ms (30 × what it takes) must be served.
    let response = server
        .clone()
        .oneshot(at("/api/items", "150m"))
        .await
        .unwrap();
    assert_eq!(
        (
            response.status().as_u16(),
            items_calls.load(Ordering::SeqCst)
        ),
        (200, 1),
        "/api/items refused, handler not called; its need read {need:?} (the report route's p50)"
    );
}

/// The throttle refuses nothing while half its calls succeed. A caller racing three calls to
/// a healthy dependency (FuturesUnordered, the first answer wins, the losers dropped before
/// their deadline) never trips it: a loser let go of counts as nothing.
#[tokio::test(start_paused = true)]
async fn racing_calls_to_a_healthy_dependency_never_throttle_it() {
    let hits = Arc::new(AtomicU32::new(0));
    let h = hits.clone();
    let dependency = service_fn(move |_req: Request<ReplayBody<String>>| {
        let n = h.fetch_add(1, Ordering::SeqCst);
        async move {
            // Every call succeeds; one in three is the quick one.
            let ms = if n.is_multiple_of(3) { 5 } else { 50 };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, Infallible>(backstop_test_support::reply(200))
        }
    });
    let backend = backstop::client::http()
        .throttle(seeded_throttle())
        .build()
        .unwrap();
    let throttle = backend.throttle_layer().throttle().clone();
    let client = ServiceBuilder::new().layer(backend).service(dependency);
    let mut failed = 0;
    for _ in 0..200 {
        let mut race: FuturesUnordered<_> = (0..3)
            .map(|_| client.clone().oneshot(backstop_test_support::get()))
            .collect();
        // The first *successful* answer wins; the losers are dropped.
        let mut won = false;
        while let Some(result) = race.next().await {
            if matches!(result, Ok(ref r) if r.status() == 200) {
                won = true;
                break;
            }
        }
        failed += usize::from(!won);
        drop(race);
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    assert_eq!(
        (throttle.rejections(), failed),
        (0, 0),
        "a dependency that answered every call it was sent, 200 OK, is throttled (p = {})",
        throttle.probability()
    );
}

/// A call that cannot get a permit in time fails fast, not at its deadline, also after an
/// overload episode: in the preset (Bulkhead → Throttle → …) a call the throttle (or the
/// breaker) refuses holds its permit for no time, and is no sample of the hold-time mean the
/// bulkhead's wait is judged by (the case of
/// `a_full_bulkhead_refuses_a_call_that_cannot_wait_at_once_and_never_sends_it`, after 20
/// throttle refusals).
#[tokio::test(start_paused = true)]
async fn local_refusals_do_not_shrink_the_bulkheads_hold_time() {
    let dependency = service_fn(|_req: Request<ReplayBody<String>>| async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok::<_, Infallible>(backstop_test_support::reply(200))
    });
    let backend = backstop::client::http()
        .breaker(patient(BreakerConfig::http()))
        .throttle(Some(
            AdaptiveThrottle::builder().max_probability(1.0).seed(28),
        ))
        .bulkhead(BulkheadLayer::builder(1))
        .build()
        .unwrap();
    let throttle = backend.throttle_layer().throttle().clone();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(dependency);
    client.clone().oneshot(get_within(1_000)).await.unwrap();
    assert_eq!(
        backend.bulkhead_layer().hold_time(),
        Duration::from_millis(300)
    );
    // An overload episode: the throttle refuses (here driven through its public counters).
    for _ in 0..1_000 {
        throttle.record_request();
    }
    tokio::time::advance(Duration::from_millis(200)).await;
    for _ in 0..20 {
        let err = client.clone().oneshot(get_within(1_000)).await.unwrap_err();
        assert!(backstop::find::<backstop::ClientThrottled>(&*err).is_some());
    }
    // The episode leaves the window; the dependency still holds a call 300 ms.
    tokio::time::advance(Duration::from_secs(31)).await;
    let hold = backend.bulkhead_layer().hold_time();
    let holder = tokio::spawn(client.clone().oneshot(get_within(1_000)));
    tokio::task::yield_now().await;
    assert_eq!(backend.bulkhead_layer().in_flight(), 1);
    let asked = Instant::now();
    let err = client.clone().oneshot(get_within(200)).await.unwrap_err();
    let waited = asked.elapsed();
    assert!(backstop::find::<BulkheadFull>(&*err).is_some(), "{err}");
    assert!(holder.await.unwrap().is_ok());
    assert_eq!(
        waited,
        Duration::ZERO,
        "refused only at its deadline; the bulkhead's hold time read {hold:?} for a 300 ms dependency"
    );
}

/// A permit is given back when the response arrives, also to a caller that keeps the completed
/// future (`pin!` and `&mut fut` in a `select!` loop, then reads the body in the same scope).
#[tokio::test(start_paused = true)]
async fn a_bulkhead_permit_is_given_back_when_the_response_arrives() {
    let layer = BulkheadLayer::new(1).unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|_req: Request<()>| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<_, Infallible>(Response::new(()))
        }));
    svc.ready().await.unwrap();
    let mut call = pin!(svc.call(Request::new(())));
    let response = loop {
        tokio::select! {
            r = &mut call => break r.unwrap(),
            () = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
    };
    // The response's headers are here: the permit should be back.
    let _ = response;
    assert_eq!(
        layer.in_flight(),
        0,
        "the permit outlives the response future's end"
    );
}
