//! The attempt bound on its own, without the facade: what an à-la-carte stack gets from
//! `backstop::client::attempt`.

use backstop::AttemptTimedOut;
use backstop::client::attempt::{Adaptive, AttemptBound, AttemptTimeoutLayer};
use backstop::client::retry::hedge::HedgeDelay;
use http::{Request, Response};
use std::{convert::Infallible, time::Duration};
use tokio::time::{Instant, sleep};
use tower::{Layer, ServiceExt, service_fn};

const MS: Duration = Duration::from_millis(1);

/// A dependency that answers after the delay its request names in `x-delay-ms`, echoing the
/// `grpc-timeout` it was told.
fn dependency() -> impl tower::Service<
    Request<()>,
    Response = Response<()>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<()>, Infallible>> + Send,
> + Clone {
    service_fn(|req: Request<()>| async move {
        let delay: u64 = req.headers()["x-delay-ms"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let told = req.headers().get("grpc-timeout").cloned();
        sleep(Duration::from_millis(delay)).await;
        let mut response = Response::new(());
        if let Some(told) = told {
            response.headers_mut().insert("told", told);
        }
        Ok(response)
    })
}

fn call(delay_ms: u64) -> Request<()> {
    Request::builder()
        .header("x-delay-ms", delay_ms.to_string())
        .body(())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_fixed_bound_cuts_the_attempt_at_its_bound() {
    let layer = AttemptTimeoutLayer::new(AttemptBound::Fixed(100 * MS)).unwrap();
    let svc = layer.layer(dependency());
    let start = Instant::now();
    let err = svc.clone().oneshot(call(500)).await.unwrap_err();
    assert!(is_attempt_timed_out(&*err), "{err}");
    assert_eq!(start.elapsed(), 100 * MS);
    // A faster answer passes untouched.
    assert!(svc.oneshot(call(50)).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn the_adaptive_bound_follows_the_measured_latency_once_trusted() {
    let adaptive = Adaptive::new().floor(10 * MS);
    let layer = AttemptTimeoutLayer::new(AttemptBound::Adaptive(adaptive)).unwrap();
    // Untrusted: the ceiling.
    assert_eq!(layer.current_bound(), Some(Duration::from_secs(10)));
    let svc = layer.layer(dependency());
    for _ in 0..100 {
        svc.clone().oneshot(call(20)).await.unwrap();
    }
    assert_eq!(layer.latency().count, 100);
    // The model's cached bound is re-read after 100 ms.
    sleep(200 * MS).await;
    let bound = layer.current_bound().unwrap();
    // The model reads the middle of a bucket (buckets are 6.25 % wide).
    assert!(
        bound >= 56 * MS && bound <= 64 * MS,
        "p99 × 3 of 20 ms: {bound:?}"
    );
    // A hang is cut at that bound, not at the ceiling.
    let start = Instant::now();
    let err = svc.oneshot(call(5_000)).await.unwrap_err();
    assert!(is_attempt_timed_out(&*err));
    // tokio's timer wheel fires on the millisecond.
    let took = start.elapsed();
    assert!(took >= bound && took - bound < MS, "{took:?} for {bound:?}");
}

#[tokio::test(start_paused = true)]
async fn a_measured_hedge_delay_waits_for_a_trusted_model() {
    let layer = AttemptTimeoutLayer::new(AttemptBound::Adaptive(Adaptive::new())).unwrap();
    let delay = layer.hedge_delay(0.95).unwrap();
    assert_eq!(delay.delay(), None, "no hedge before the model is trusted");
    let svc = layer.layer(dependency());
    for _ in 0..100 {
        svc.clone().oneshot(call(40)).await.unwrap();
    }
    sleep(200 * MS).await;
    let d = delay.delay().expect("trusted");
    assert!(
        d >= 40 * MS && d <= 43 * MS,
        "the p95 bucket's upper edge: {d:?}"
    );
    assert_eq!(layer.hedge_delay(1.0).unwrap_err().knob(), "hedge_quantile");
}

fn is_attempt_timed_out(err: &(dyn std::error::Error + 'static)) -> bool {
    backstop::find::<AttemptTimedOut>(err).is_some()
}

/// A request to `path` answered after `delay_ms`.
fn call_to(path: &str, delay_ms: u64) -> Request<()> {
    let mut req = call(delay_ms);
    *req.uri_mut() = format!("http://dep{path}").parse().unwrap();
    req
}

/// Issue 25, 5: a keyed layer bounds, hedges and reserves each route from its own model. A
/// route whose model is not trusted yet gets the ceiling and no hedge or reserve, never the
/// values the other routes set.
#[tokio::test(start_paused = true)]
async fn a_keyed_layer_gives_each_route_its_own_bound_hedge_delay_and_reserve() {
    use backstop::RouteKey;
    use backstop::client::retry::RetryReserve;
    let layer = AttemptTimeoutLayer::new(AttemptBound::Adaptive(Adaptive::new().floor(10 * MS)))
        .unwrap()
        .per_key(RouteKey::Path, 64)
        .unwrap();
    let hedge = layer.hedge_delay(0.95).unwrap();
    let reserve = layer.retry_reserve(0.5).unwrap();
    let svc = layer.layer(dependency());
    for _ in 0..100 {
        svc.clone().oneshot(call_to("/fast", 10)).await.unwrap();
        svc.clone().oneshot(call_to("/slow", 400)).await.unwrap();
    }
    sleep(200 * MS).await;
    assert_eq!(layer.keys(), ["/fast", "/slow"]);
    assert_eq!(layer.key_latency("/slow").unwrap().count, 100);
    // Every call had a key: the layer's own model (the overflow) saw none.
    assert_eq!(layer.latency().count, 0);
    let get = http::Method::GET;
    let uri = |p: &str| -> http::Uri { format!("http://dep{p}").parse().unwrap() };
    let within = |d: Option<Duration>, ms: u32| {
        let d = d.expect("trusted");
        assert!(
            d >= MS * ms && d <= MS * ms * 107 / 100,
            "{d:?} for {ms} ms"
        );
    };
    within(hedge.delay_for(&get, &uri("/fast")), 10);
    within(hedge.delay_for(&get, &uri("/slow")), 400);
    within(reserve.reserve_for(&get, &uri("/fast")), 10);
    within(reserve.reserve_for(&get, &uri("/slow")), 400);
    // Read again from the keys' cached words.
    within(hedge.delay_for(&get, &uri("/slow")), 400);
    // A new route: no hedge and no reserve until its own model is trusted.
    assert_eq!(hedge.delay_for(&get, &uri("/new")), None);
    assert_eq!(reserve.reserve_for(&get, &uri("/new")), None);
    // Each route's attempt is cut at its own bound: /fast's hang at p99 × 3 of 10 ms, /slow's
    // 1 s call passes (p99 × 3 of 400 ms), and a new route gets the ceiling.
    let start = Instant::now();
    let err = svc
        .clone()
        .oneshot(call_to("/fast", 5_000))
        .await
        .unwrap_err();
    assert!(is_attempt_timed_out(&*err));
    assert!(start.elapsed() < 35 * MS, "{:?}", start.elapsed());
    assert!(svc.clone().oneshot(call_to("/slow", 1_000)).await.is_ok());
    assert!(svc.clone().oneshot(call_to("/new", 5_000)).await.is_ok());
}

/// Issue 25, 5: the table is bounded. Past `max_keys` routes, new routes use the layer's own
/// model, and the routes in the table keep theirs (nothing is evicted before a key has been
/// idle for 30 min, fixed).
#[tokio::test(start_paused = true)]
async fn a_keyed_layer_holds_at_most_max_keys_models() {
    use backstop::RouteKey;
    let layer = AttemptTimeoutLayer::new(AttemptBound::Adaptive(Adaptive::new()))
        .unwrap()
        .per_key(RouteKey::Path, 8)
        .unwrap();
    assert_eq!(
        layer.per_key(RouteKey::Path, 0).unwrap_err().knob(),
        "max_keys"
    );
    let svc = layer.layer(dependency());
    for i in 0..1_000 {
        svc.clone()
            .oneshot(call_to(&format!("/item/{i}"), 1))
            .await
            .unwrap();
    }
    assert_eq!(layer.keys().len(), 8);
    assert_eq!(layer.key_latency("/item/0").unwrap().count, 1);
    assert_eq!(
        layer.latency().count,
        992,
        "the rest went to the layer's own model"
    );
    // Once the keys have been idle for 30 min, a new route takes their place: the idle keys
    // go together (their bounds are the ceiling by then, as a fresh model's), as in the
    // breaker's table.
    sleep(Duration::from_secs(30 * 60) + 10 * MS).await;
    svc.clone().oneshot(call_to("/late", 1)).await.unwrap();
    assert_eq!(layer.keys(), ["/late"]);
    svc.oneshot(call_to("/item/0", 1)).await.unwrap();
    assert_eq!(layer.keys(), ["/item/0", "/late"]);
    assert_eq!(
        layer.key_latency("/item/0").unwrap().count,
        1,
        "a fresh model"
    );
}

/// A `call` that panics leaves the attempt layer's keyed table usable (nothing is held
/// across `inner.call`; the table's lock is not held there): the key's next calls are
/// bounded and answered. Checked with the bulkhead's leaked permit (outside audit).
#[tokio::test(start_paused = true)]
async fn a_call_that_panics_leaves_the_keyed_table_usable() {
    use backstop::RouteKey;
    use backstop_test_support::{call_catching, panicking};
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    let panics = Arc::new(AtomicBool::new(true));
    let layer = AttemptTimeoutLayer::new(AttemptBound::Fixed(100 * MS))
        .unwrap()
        .per_key(RouteKey::Path, 1)
        .unwrap();
    let mut service = layer.layer(panicking::<Request<String>>(panics.clone()));
    let req = || Request::get("http://a/item").body(String::new()).unwrap();
    assert!(call_catching(&mut service, req()).is_err());
    panics.store(false, Ordering::SeqCst);
    for _ in 0..3 {
        assert_eq!(service.clone().oneshot(req()).await.unwrap().status(), 200);
    }
}
