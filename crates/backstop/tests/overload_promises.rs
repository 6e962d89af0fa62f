//! The overload layers' promises under what callers do: each test is a case an outside review
//! of the throttle, the bulkhead and admission found broken (a route refused for another's
//! latency, a racing caller tripping the throttle, local refusals shrinking the bulkhead's
//! hold time, a permit held past the response), kept so it stays fixed.

use backstop::{
    ReplayBody,
    deadline::{Deadline, bulkhead::BulkheadLayer},
    prelude::*,
    retry::throttle::{AdaptiveThrottle, ThrottleLayer},
};
use backstop_core::{BulkheadFull, HttpClassifier};
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

fn patient<C: Clone>(config: BreakerConfig<C>) -> BreakerLayer<C> {
    config
        .count_window(100_000)
        .minimum_calls(100_000)
        .build()
        .unwrap()
}

fn get_within(ms: u64) -> Request<String> {
    let mut req = backstop_test_support::get();
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_millis(ms)));
    req
}

/// Server preset docs: "admission refuses only a request whose caller gave it less time
/// than half of *this route's* requests take". Routes are FNV-hashed into 16 models; two
/// ordinary paths `/api/report` and `/api/items` share model 1, so a 5 ms route is refused
/// (504, handler never called) with 150 ms left (30× what it takes) because a 200 ms route
/// shares its model.
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

/// Preset docs: the throttle "refuses nothing while half its calls succeed, so an
/// ordinary error rate never trips it". A caller racing three calls to a perfectly healthy
/// dependency (FuturesUnordered / select!, first answer wins, the losers dropped) has every
/// dropped loser counted as a request without an accept: p ≈ 1/3, and the healthy dependency
/// is throttled.
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
    let throttle = Arc::new(AdaptiveThrottle::builder().seed(28).build().unwrap());
    let backend = backstop::client::http()
        .throttle(ThrottleLayer::with(throttle.clone(), HttpClassifier::new()));
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

/// Bulkhead docs: "a call that cannot get a permit in time fails fast ... not at the
/// deadline". In the preset (Bulkhead → Throttle → …) every call the throttle (or the
/// breaker) refuses locally takes a bulkhead permit for ~0 µs and is an "answer" feeding the
/// hold-time mean; after an overload episode the mean has collapsed and the very case of the
/// existing test `a_full_bulkhead_refuses_a_call_that_cannot_wait_at_once_and_never_sends_it`
/// now waits to its deadline instead of failing fast.
#[tokio::test(start_paused = true)]
async fn local_refusals_do_not_shrink_the_bulkheads_hold_time() {
    let dependency = service_fn(|_req: Request<ReplayBody<String>>| async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok::<_, Infallible>(backstop_test_support::reply(200))
    });
    let throttle = Arc::new(
        AdaptiveThrottle::builder()
            .max_probability(1.0)
            .seed(28)
            .build()
            .unwrap(),
    );
    let backend = backstop::client::http()
        .breaker(patient(BreakerConfig::http()))
        .throttle(ThrottleLayer::with(throttle.clone(), HttpClassifier::new()))
        .bulkhead(BulkheadLayer::new(1).unwrap());
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
        assert!(backstop_core::find::<backstop_core::ClientThrottled>(&*err).is_some());
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
    assert!(
        backstop_core::find::<BulkheadFull>(&*err).is_some(),
        "{err}"
    );
    assert!(holder.await.unwrap().is_ok());
    assert_eq!(
        waited,
        Duration::ZERO,
        "refused only at its deadline; the bulkhead's hold time read {hold:?} for a 300 ms dependency"
    );
}

/// Bulkhead docs: "A permit is held from the grant to the response future's end:
/// its response (headers; a streamed body is not held ...)". A caller that keeps the completed
/// future (`pin!` + `&mut fut` in a select! loop, then reads the body in the same scope) keeps
/// the permit until the future is dropped: the permit is released on drop, not on Ready.
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
