//! The presets end to end, with a mock dependency under paused time.

use backstop::AttemptTimedOut;
use backstop::client::attempt::{Adaptive, AttemptBound};
use backstop::deadline::PropagateDeadlineLayerBuilder;
use backstop::prelude::*;
use backstop::{BreakerOpen, ClientLayer, ReplayBody};
use backstop_test_support::{Latency, adjustable as slow, timed};
use http::{Request, Response};
use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

fn get() -> Request<String> {
    Request::get("http://dep/x").body(String::new()).unwrap()
}

/// A dependency that answers every call with `status`.
fn answering(status: u16) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    service_fn(move |_req: Request<ReplayBody<String>>| async move {
        let response = Response::builder().status(status).body(String::new());
        Ok::<_, std::convert::Infallible>(response.unwrap())
    })
}

#[tokio::test(start_paused = true)]
async fn an_outage_costs_the_dependency_probes_not_retries() {
    let hits = Arc::new(AtomicU32::new(0));
    let seen = hits.clone();
    let down = service_fn(move |_req: Request<ReplayBody<String>>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async {
            let response = Response::builder().status(503).body(String::new());
            Ok::<_, std::convert::Infallible>(response.unwrap())
        }
    });
    let backend = backstop::client::http()
        .breaker(BreakerConfig::http().minimum_calls(10).jitter(false))
        .build()
        .unwrap();
    let mut client = ServiceBuilder::new().layer(backend.clone()).service(down);

    let mut refused = 0;
    for _ in 0..100 {
        match client.ready().await.unwrap().call(get()).await {
            Ok(response) => assert_eq!(response.status(), 503),
            Err(err) => {
                assert!(
                    backstop::find::<BreakerOpen>(err.as_ref()).is_some(),
                    "{err}"
                );
                refused += 1;
            }
        }
    }
    let snap = backend.breaker_layer().snapshot();
    assert_eq!(snap.state, State::Open);
    // The breaker opened after 10 failed attempts; the other calls never left the process.
    assert_eq!(hits.load(Ordering::SeqCst), 10);
    assert!(refused >= 95, "{refused} refused");
    // Three requests made 3 attempts each and the fourth was retried once into the open
    // breaker, which refused it: no retry was ever sent past the breaker.
    let stats = backend.retry_layer().stats();
    assert_eq!(stats.retries, 7, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_attempt_is_a_failure_the_breaker_counts() {
    let backend = one_attempt_two_to_open(backstop::client::http().attempt(
        backstop::client::attempt::AttemptBound::Fixed(Duration::from_millis(100)),
    ));
    let client = ServiceBuilder::new().layer(backend.clone()).service(hung());
    for _ in 0..2 {
        let err = client.clone().oneshot(get()).await.unwrap_err();
        assert!(
            backstop::find::<AttemptTimedOut>(err.as_ref()).is_some(),
            "{err}"
        );
    }
    assert_eq!(backend.breaker_layer().snapshot().state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn the_primitives_stack_as_plain_layers() {
    let ok = service_fn(|_req: Request<ReplayBody<String>>| async {
        Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    });
    let breaker = BreakerConfig::http().build().unwrap();
    let client = ServiceBuilder::new()
        .layer(PropagateDeadlineLayer::new())
        .layer(RetryConfig::http().build().unwrap())
        .layer(breaker.clone())
        .service(ok);
    let response = client.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(breaker.snapshot().calls, 1);
}

/// A dependency that never answers.
fn hung() -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    slow(Arc::new(std::sync::Mutex::new(None)))
}

/// A deadline of `ms` milliseconds per call.
fn deadline_of(ms: u64) -> PropagateDeadlineLayerBuilder {
    PropagateDeadlineLayer::builder().timeout(Duration::from_millis(ms))
}

/// One attempt per request and a breaker that opens after two failures: each timed-out
/// attempt shows in the breaker at once.
fn one_attempt_two_to_open(
    backend: backstop::ClientBuilder<backstop::HttpClassifier>,
) -> backstop::ClientLayer<backstop::HttpClassifier> {
    backend
        .retry(RetryConfig::http().max_attempts(1))
        .breaker(opens_after_two())
        .build()
        .unwrap()
}

/// Sends `n` calls, one every `every`, each on its own task with a 3 s deadline; returns
/// the tasks' results (true: a 200).
macro_rules! load {
    ($client:expr, $n:expr, $every:expr) => {{
        let mut tasks = Vec::new();
        for _ in 0..$n {
            let client = $client.clone();
            tasks.push(tokio::spawn(async move {
                let call = client.oneshot(get());
                matches!(
                    tokio::time::timeout(Duration::from_secs(3), call).await,
                    Ok(Ok(ref r)) if r.status() == 200
                )
            }));
            tokio::time::sleep($every).await;
        }
        let mut ok = 0u32;
        for t in tasks {
            ok += u32::from(t.await.unwrap());
        }
        ok
    }};
}

/// A latency for [`slow`] to answer in (`None`: it hangs), changed as the test goes.
fn latency_of(latency: Duration) -> Latency {
    Arc::new(std::sync::Mutex::new(Some(latency)))
}

/// `backend` in front of [`slow`] answering in `latency`, and that latency, to change.
fn slow_behind(
    backend: &ClientLayer<HttpClassifier>,
    latency: Duration,
) -> (
    impl Service<
        Request<String>,
        Response = Response<impl std::fmt::Debug + Send>,
        Error = BoxError,
        Future: Send,
    > + Clone
    + Send
    + 'static,
    Latency,
) {
    let latency = latency_of(latency);
    (backend.layer(slow(latency.clone())), latency)
}

/// A dependency answering in 20 ms, but for the call after a [`warm_up!`] of 200, which takes
/// 1 s (one a measured hedge delay hedges).
fn slow_after_warm_up() -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    scripted(|n| match n {
        200 => Duration::from_secs(1),
        _ => Duration::from_millis(20),
    })
}

/// [`load!`] of `n` calls 10 ms apart, then 200 ms for their measurements to settle: the
/// count of 200s.
macro_rules! warm_up {
    ($client:expr, $n:expr) => {{
        let ok = load!($client, $n, Duration::from_millis(10));
        tokio::time::advance(Duration::from_millis(200)).await;
        ok
    }};
}

/// The HTTP preset as it is, and with an attempt bound of a [`low_floor`].
fn preset_and_low_floor() -> (ClientLayer<HttpClassifier>, ClientLayer<HttpClassifier>) {
    let preset = backstop::client::http().build().unwrap();
    let tuned = backstop::client::http()
        .attempt(low_floor())
        .build()
        .unwrap();
    (preset, tuned)
}

/// An adaptive bound with a 10 ms floor, so p99 × 3 shows for a 20 ms dependency.
fn low_floor() -> AttemptBound {
    AttemptBound::Adaptive(Adaptive::new().floor(Duration::from_millis(10)))
}

#[tokio::test(start_paused = true)]
async fn the_preset_measures_latency_and_bounds_attempts_by_it() {
    let latency = latency_of(Duration::from_millis(20));
    let (preset, tuned) = preset_and_low_floor();
    for backend in [&preset, &tuned] {
        // Cold: the ceiling.
        assert_eq!(
            backend.attempt_layer().current_bound(),
            Some(Duration::from_secs(10))
        );
        assert_eq!(backend.latency().p99, None);
        let client = backend.layer(slow(latency.clone()));
        assert_eq!(load!(client, 200, Duration::from_millis(10)), 200);
        let snap = backend.latency();
        assert_eq!(snap.count, 200);
        let p99 = snap.p99.unwrap();
        assert!(
            p99.abs_diff(Duration::from_millis(20)) < Duration::from_millis(1),
            "{p99:?}"
        );
    }
    tokio::time::advance(Duration::from_millis(200)).await;
    // Warm: p99 × 3, but never below the floor (by default p99 × 20, from 250 ms to 1 s).
    let bound = tuned.attempt_layer().current_bound().unwrap();
    assert!(
        bound.abs_diff(Duration::from_millis(60)) < Duration::from_millis(2),
        "{bound:?}"
    );
    let bound = preset.attempt_layer().current_bound().unwrap();
    assert!(
        bound.abs_diff(Duration::from_millis(400)) < Duration::from_millis(10),
        "{bound:?}"
    );
}

/// Issue 25, 3: a trusted 20 ms dependency that hangs is cut at its measured floor
/// (p99 × 20 = 400 ms) with the defaults, where the fixed 1 s floor held each attempt 1 s.
#[tokio::test(start_paused = true)]
async fn a_fast_dependency_s_hang_is_cut_near_its_measured_floor() {
    let backend = backstop::client::http().max_attempts(1).build().unwrap();
    let (client, latency) = slow_behind(&backend, Duration::from_millis(20));
    assert_eq!(warm_up!(client, 200), 200);
    *latency.lock().unwrap() = None;
    let (result, took) = timed(client.oneshot(get())).await;
    let err = result.unwrap_err();
    assert!(
        backstop::find::<AttemptTimedOut>(err.as_ref()).is_some(),
        "{err}"
    );
    assert!(
        took.abs_diff(Duration::from_millis(400)) < Duration::from_millis(10),
        "cut after {took:?}"
    );
}

/// A dependency that accepts calls and never answers: with the presets' defaults the
/// attempts time out at the measured bound, the breaker opens within 2 s at 100 requests/s,
/// and from then on callers are answered at once.
#[tokio::test(start_paused = true)]
async fn a_hung_dependency_opens_the_breaker_by_default() {
    let backend = backstop::client::http().build().unwrap();
    let (client, latency) = slow_behind(&backend, Duration::from_millis(20));
    assert_eq!(warm_up!(client, 300), 300);

    *latency.lock().unwrap() = None;
    let hung_at = tokio::time::Instant::now();
    let mut opened_after = None;
    // 100 requests/s, each checked for the breaker's state as it goes (bounded: 5 s).
    let mut tasks = Vec::new();
    for _ in 0..500 {
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let result = tokio::time::timeout(Duration::from_secs(3), c.oneshot(get())).await;
            let ok = matches!(result, Ok(Ok(ref r)) if r.status() == 200);
            (started, tokio::time::Instant::now() - started, !ok)
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
        if opened_after.is_none() && backend.breaker_layer().snapshot().state == State::Open {
            opened_after = Some(hung_at.elapsed());
        }
    }
    let opened_after = opened_after.expect("the breaker opened");
    println!("breaker open {opened_after:?} after the dependency hung");
    assert!(
        opened_after <= Duration::from_secs(2),
        "opened after {opened_after:?}"
    );
    // Every request sent after the breaker opened failed at once, within its deadline, but
    // for the half-open probes (at most 3 per open period; the open time is 2.5 to 5 s).
    let mut slow = 0;
    for t in tasks {
        let (started, took, failed) = t.await.unwrap();
        assert!(
            failed,
            "no request to a hung dependency succeeds: sent {:?} after, took {took:?}",
            started - hung_at
        );
        assert!(took <= Duration::from_secs(3) + Duration::from_millis(1));
        if started >= hung_at + opened_after + Duration::from_millis(10)
            && took >= Duration::from_millis(1)
        {
            slow += 1;
        }
    }
    assert!(slow <= 6, "{slow} requests waited after the breaker opened");
}

/// Latency drifts from 20 ms to 100 ms: the first attempts time out at the old bound and are
/// recorded at it, so the bound grows instead of spiralling down, and within the model's
/// window the calls succeed again.
#[tokio::test(start_paused = true)]
async fn the_bound_follows_a_slowing_dependency() {
    let backend = backstop::client::http()
        .attempt(low_floor())
        .breaker(
            BreakerConfig::http()
                .minimum_calls(1_000_000)
                .consecutive_failures(1_000_000),
        )
        .build()
        .unwrap();
    let (client, latency) = slow_behind(&backend, Duration::from_millis(20));
    assert_eq!(warm_up!(client, 300), 300);
    let before = backend.attempt_layer().current_bound().unwrap();
    *latency.lock().unwrap() = Some(Duration::from_millis(100));
    load!(client, 3_000, Duration::from_millis(10));
    tokio::time::advance(Duration::from_millis(200)).await;
    let after = backend.attempt_layer().current_bound().unwrap();
    assert!(
        after >= Duration::from_millis(280),
        "{before:?} → {after:?}"
    );
    assert_eq!(load!(client, 300, Duration::from_millis(10)), 300);
}

/// The attempt's bound on the wire: once the measured bound is shorter than what is left of
/// the deadline, `grpc-timeout` says the bound, so the server gives up when the attempt will.
#[tokio::test(start_paused = true)]
async fn grpc_timeout_says_the_attempt_bound_when_it_is_shorter() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<Duration>::new()));
    let log = seen.clone();
    let dependency = service_fn(move |req: Request<ReplayBody<String>>| {
        let header = req.headers().get("grpc-timeout").cloned();
        log.lock().unwrap().push(
            header
                .map(|v| backstop::wire::grpc_timeout::decode_header(&v).unwrap())
                .unwrap_or(Duration::MAX),
        );
        async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, std::convert::Infallible>(Response::new(String::new()))
        }
    });
    let backend = backstop::client::http()
        .deadline(deadline_of(5_000))
        .attempt(low_floor())
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(dependency);
    // Cold: the ceiling (10 s), capped at 80 % of the 5 s left.
    client.clone().oneshot(get()).await.unwrap();
    assert_eq!(seen.lock().unwrap()[0], Duration::from_secs(4));
    assert_eq!(warm_up!(client, 200), 200);
    // Warm: the bound (p99 × 3 ≈ 60 ms) is what the server is told.
    client.clone().oneshot(get()).await.unwrap();
    let last = *seen.lock().unwrap().last().unwrap();
    assert!(
        last.abs_diff(Duration::from_millis(60)) < Duration::from_millis(2),
        "{last:?}"
    );
    // Without a deadline nothing is told, bound or not.
    let bare = ServiceBuilder::new()
        .layer(
            backstop::client::http()
                .attempt(low_floor())
                .build()
                .unwrap(),
        )
        .service(service_fn(|req: Request<ReplayBody<String>>| async move {
            assert!(req.headers().get("grpc-timeout").is_none());
            Ok::<_, std::convert::Infallible>(Response::new(String::new()))
        }));
    bare.oneshot(get()).await.unwrap();
}

/// Under a deadline, an attempt after which a retry may follow takes at most 80 % of what is
/// left (`tests/wire.rs`); the one attempt of a call sent once takes all of it, is told all
/// of it, and its timeout still reaches the breaker (the attempt bound, polled first, fires
/// at the deadline's instant), so a dependency slower than its callers' deadlines opens the
/// breaker.
#[tokio::test(start_paused = true)]
async fn a_single_attempt_takes_the_whole_deadline_and_its_timeout_is_counted() {
    let seen = Arc::new(std::sync::Mutex::new(None));
    let log = seen.clone();
    let hang = service_fn(move |req: Request<ReplayBody<String>>| {
        *log.lock().unwrap() = req.headers().get("grpc-timeout").cloned();
        std::future::pending::<Result<Response<String>, std::convert::Infallible>>()
    });
    let backend = one_attempt_two_to_open(backstop::client::http().deadline(deadline_of(400)));
    let client = ServiceBuilder::new().layer(backend.clone()).service(hang);
    for _ in 0..2 {
        let started = tokio::time::Instant::now();
        let err = client.clone().oneshot(get()).await.unwrap_err();
        assert!(backstop::is_deadline_exceeded(err.as_ref()), "{err}");
        assert_eq!(started.elapsed(), Duration::from_millis(400));
        let told = seen.lock().unwrap().clone().unwrap();
        assert_eq!(
            backstop::wire::grpc_timeout::decode_header(&told).unwrap(),
            Duration::from_millis(400)
        );
    }
    assert_eq!(backend.breaker_layer().snapshot().state, State::Open);
}

/// A gRPC attempt that runs out of its share of the deadline is reported as DEADLINE_EXCEEDED
/// (a trailers-only response), as the deadline's own expiry is: tonic would turn the error
/// into UNKNOWN.
#[tokio::test(start_paused = true)]
async fn a_grpc_attempt_out_of_time_answers_deadline_exceeded() {
    let sent = Arc::new(AtomicU32::new(0));
    let counted = sent.clone();
    let client = ServiceBuilder::new()
        .layer(
            backstop::client::grpc()
                .deadline(deadline_of(400))
                .build()
                .unwrap(),
        )
        .service(service_fn(move |_req: Request<ReplayBody<String>>| {
            counted.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Result<Response<String>, std::convert::Infallible>>()
        }));
    let request = || {
        Request::post("http://dep/pkg.Svc/Call")
            .header("content-type", "application/grpc")
            .body(String::new())
            .unwrap()
    };
    // A call marked idempotent may be retried after an attempt timeout: its first attempt
    // keeps a share for the retry, is cut at 80 % of the deadline (320 ms) and retried; the
    // retry runs into the deadline.
    let mut idempotent = request();
    idempotent
        .extensions_mut()
        .insert(backstop::client::retry::RetryOverrides::new().idempotent(true));
    let started = tokio::time::Instant::now();
    let response = client.clone().oneshot(idempotent).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(
        sent.load(Ordering::SeqCst),
        2,
        "the first attempt was cut and retried"
    );
    assert!(started.elapsed() <= Duration::from_millis(400));
    // A plain gRPC call is not retried after a timeout: its attempt gets the whole deadline.
    let started = tokio::time::Instant::now();
    let response = client.oneshot(request()).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(started.elapsed(), Duration::from_millis(400));
    assert_eq!(sent.load(Ordering::SeqCst), 3, "one attempt");
}

/// A dependency whose `n`th call (counting from 0) takes `latency(n)`.
fn scripted(
    latency: impl Fn(u32) -> Duration + Clone + Send + 'static,
) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    let calls = Arc::new(AtomicU32::new(0));
    service_fn(move |_req: Request<ReplayBody<String>>| {
        let delay = latency(calls.fetch_add(1, Ordering::SeqCst));
        async move {
            tokio::time::sleep(delay).await;
            Ok(Response::new(String::new()))
        }
    })
}

/// Measured hedging: nothing is hedged before the model is trusted; once it is, an attempt
/// slower than the measured p95 is overtaken by a hedge, and the attempt dropped is no breaker
/// failure, but a censored latency sample (it took at least as long as it ran).
#[tokio::test(start_paused = true)]
async fn measured_hedging_overtakes_a_slow_attempt_once_the_model_is_warm() {
    let backend = backstop::client::http().hedging(0.95, 2).build().unwrap();
    // Call 0 (cold) and call 201 (warm) take 1 s; every other one 20 ms.
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(scripted(|n| match n {
            0 | 201 => Duration::from_secs(1),
            _ => Duration::from_millis(20),
        }));
    let (result, took) = timed(client.clone().oneshot(get())).await;
    result.unwrap();
    assert_eq!(took, Duration::from_secs(1), "cold: no hedge");
    assert_eq!(warm_up!(client, 200), 200);
    assert_eq!(backend.retry_layer().stats().hedges, 0);

    let (result, took) = timed(client.clone().oneshot(get())).await;
    result.unwrap();
    // The hedge goes at the measured p95 (20 ms, within a bucket) and answers in 20 ms.
    assert!(
        took >= Duration::from_millis(40) && took <= Duration::from_millis(42),
        "{took:?}"
    );
    assert_eq!(backend.retry_layer().stats().hedges, 1);
    let breaker = backend.breaker_layer().snapshot();
    assert_eq!(breaker.failures, 0, "{breaker:?}");
    assert_eq!(
        backend.latency().count,
        203,
        "the dropped attempt is a censored sample"
    );
}

/// The short paths: `.timeout(d)` sends the deadline, `.max_attempts(1)` turns retries off,
/// the preset's service type has a name, and a refusal is told by `is_breaker_open`.
#[tokio::test(start_paused = true)]
async fn the_short_paths_configure_the_same_stack() {
    struct App<S> {
        client: backstop::HttpClient<S>,
    }
    let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = sent.clone();
    let failing = service_fn(move |req: Request<ReplayBody<String>>| {
        seen.lock()
            .unwrap()
            .push(req.headers().get("grpc-timeout").cloned());
        async {
            let response = Response::builder().status(503).body(String::new());
            Ok::<_, std::convert::Infallible>(response.unwrap())
        }
    });
    let backend = backstop::client::http()
        .timeout(Duration::from_millis(250))
        .max_attempts(1)
        .breaker(opens_after_two())
        .build()
        .unwrap();
    let app = App {
        client: tower::Layer::layer(&backend, failing),
    };
    for _ in 0..2 {
        let response = app.client.clone().oneshot(get()).await.unwrap();
        assert_eq!(response.status(), 503);
    }
    // One attempt each, told the whole 250 ms deadline (no retry follows it).
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].as_ref().unwrap(), "250m");
    assert_eq!(backend.retry_layer().stats().retries, 0);
    let err = app.client.clone().oneshot(get()).await.unwrap_err();
    assert!(backstop::is_breaker_open(err.as_ref()), "{err}");
    assert!(!backstop::is_deadline_exceeded(err.as_ref()));
}

/// A setter never panics: `build` checks every part and names the first knob out of range,
/// in the onion's order (the deadline's before the retry policy's), whatever the order of
/// the setters.
#[test]
fn max_attempts_out_of_range_names_the_knob() {
    let client = backstop::client::http()
        .max_attempts(0)
        .timeout(Duration::ZERO)
        .name("inventory");
    assert_eq!(client.build().unwrap_err().knob(), "timeout");
    let client = backstop::client::http().max_attempts(0).name("inventory");
    assert_eq!(client.build().unwrap_err().knob(), "max_attempts");
    let every = [
        backstop::client::http().timeout(Duration::ZERO).build(),
        backstop::client::http()
            .attempt(backstop::client::attempt::AttemptBound::Fixed(
                Duration::ZERO,
            ))
            .build(),
        backstop::client::http().hedging(0.95, 11).build(),
        backstop::client::http().retry_reserve(Some(1.5)).build(),
        backstop::client::http().hedging(1.0, 2).build(),
    ];
    let knobs: Vec<_> = every
        .iter()
        .map(|r| r.as_ref().unwrap_err().knob())
        .collect();
    assert_eq!(
        knobs,
        [
            "timeout",
            "attempt_timeout",
            "hedging.max_attempts",
            "reserve_quantile",
            "hedge_quantile"
        ]
    );
}

/// A stack layered without `build` and a misconfiguration kept panics when it is built, with
/// the knob in the message.
#[test]
#[should_panic(expected = "max_attempts")]
fn a_misconfigured_stack_panics_when_it_is_layered() {
    let client = backstop::client::http().max_attempts(0).build().unwrap();
    let _ = ServiceBuilder::new()
        .layer(client)
        .service(backstop_test_support::adjustable::<
            Request<ReplayBody<String>>,
        >(Latency::default()));
}

/// An attempt that runs out of its bound is the same failure whichever timer fires first: the
/// client's (the dependency hangs) or the server's (it answers DEADLINE_EXCEEDED when the
/// `grpc-timeout` it was told runs out). Both give up for the same reason, and the caller sees
/// DEADLINE_EXCEEDED both times.
#[tokio::test(start_paused = true)]
async fn an_expired_grpc_attempt_gives_up_for_the_same_reason_either_way() {
    let answers_at_its_deadline = service_fn(|req: Request<ReplayBody<String>>| {
        let told = req.headers()["grpc-timeout"].clone();
        async move {
            let told = backstop::wire::grpc_timeout::decode_header(&told).unwrap();
            tokio::time::sleep(told).await;
            let response = Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", "4")
                .body(String::new());
            Ok::<_, std::convert::Infallible>(response.unwrap())
        }
    });
    let request = || {
        Request::post("http://dep/pkg.Svc/Call")
            .header("content-type", "application/grpc")
            .body(String::new())
            .unwrap()
    };
    let preset = || {
        backstop::client::grpc()
            .timeout(Duration::from_secs(1))
            .attempt(backstop::client::attempt::AttemptBound::Fixed(
                Duration::from_millis(100),
            ))
            .build()
            .unwrap()
    };
    let (server_side, client_side) = (preset(), preset());
    let by_server = ServiceBuilder::new()
        .layer(server_side.clone())
        .service(answers_at_its_deadline)
        .oneshot(request())
        .await
        .unwrap();
    let by_client = ServiceBuilder::new()
        .layer(client_side.clone())
        .service(hung())
        .oneshot(request())
        .await
        .unwrap();
    for (response, backend) in [(by_server, &server_side), (by_client, &client_side)] {
        assert_eq!(response.headers()["grpc-status"], "4");
        let stats = backend.retry_layer().stats();
        assert_eq!(
            stats.gave_up(backstop::client::retry::GiveUp::NotIdempotent),
            1,
            "{stats:?}"
        );
        assert_eq!(
            stats.gave_up(backstop::client::retry::GiveUp::NotRetryable),
            0,
            "{stats:?}"
        );
    }
}

/// Each response tells how many attempts its call took and, when it gave up, why — the same
/// reason the stats count.
#[tokio::test(start_paused = true)]
async fn each_response_tells_its_attempts_and_why_it_gave_up() {
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    // The first call fails, then every other one.
    let flaky = service_fn(move |_req: Request<ReplayBody<String>>| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            let status = if n == 0 || n >= 2 { 503 } else { 200 };
            let response = Response::builder().status(status).body(String::new());
            Ok::<_, std::convert::Infallible>(response.unwrap())
        }
    });
    let backend = backstop::client::http().build().unwrap();
    let client = ServiceBuilder::new().layer(backend).service(flaky);
    let info = |r: &backstop::ClientResponse<String, backstop::HttpClassifier>| {
        let info = backstop::client::call_info(r);
        (info.attempts(), info.gave_up())
    };
    // 503 then 200: two attempts, nothing given up.
    let ok = client.clone().oneshot(get()).await.unwrap();
    assert_eq!((ok.status().as_u16(), info(&ok)), (200, (2, None)));
    // 503 three times: the attempts ran out.
    let out = client.clone().oneshot(get()).await.unwrap();
    assert_eq!(
        (out.status().as_u16(), info(&out)),
        (503, (3, Some(backstop::client::retry::GiveUp::Attempts)))
    );
    // A POST is not retried.
    let post = Request::post("http://dep/x").body(String::new()).unwrap();
    let once = client.clone().oneshot(post).await.unwrap();
    assert_eq!(
        info(&once),
        (1, Some(backstop::client::retry::GiveUp::NotIdempotent))
    );
}

/// A breaker that opens once two calls have failed (no jitter).
fn opens_after_two() -> BreakerConfig<backstop::HttpClassifier> {
    BreakerConfig::http().minimum_calls(2).jitter(false)
}

/// The deadline layer leaves `grpc-timeout` to the attempt bound inside it, which writes it
/// once per attempt: every attempt the dependency sees carries exactly one value, the one the
/// stack means, whatever the bound (none, fixed, measured), for retries too, and with a
/// shorter header set by the caller.
#[tokio::test(start_paused = true)]
async fn every_attempt_carries_one_grpc_timeout_whatever_the_bound() {
    type Seen = Arc<std::sync::Mutex<Vec<Vec<http::HeaderValue>>>>;
    // Answers 503 to the first `fail` attempts, 200 after.
    fn recording(
        seen: Seen,
        fail: u32,
    ) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
        let calls = Arc::new(AtomicU32::new(0));
        service_fn(move |req: Request<ReplayBody<String>>| {
            seen.lock().unwrap().push(
                req.headers()
                    .get_all("grpc-timeout")
                    .iter()
                    .cloned()
                    .collect(),
            );
            let status = if calls.fetch_add(1, Ordering::SeqCst) < fail {
                503
            } else {
                200
            };
            async move {
                let response = Response::builder().status(status).body(String::new());
                Ok(response.unwrap())
            }
        })
    }
    async fn sent(
        backend: backstop::ClientBuilder<backstop::HttpClassifier>,
        fail: u32,
        req: Request<String>,
    ) -> Vec<Vec<http::HeaderValue>> {
        let seen = Seen::default();
        let client = ServiceBuilder::new()
            .layer(backend.build().unwrap())
            .service(recording(seen.clone(), fail));
        let response = client.oneshot(req).await.unwrap();
        assert_eq!(response.status(), 200);
        seen.lock().unwrap().clone()
    }
    let one = |values: &[&str]| -> Vec<Vec<http::HeaderValue>> {
        values
            .iter()
            .map(|v| vec![http::HeaderValue::from_str(v).unwrap()])
            .collect()
    };
    let none = AttemptBound::None;
    let fixed = AttemptBound::Fixed(Duration::from_millis(300));
    let preset = || backstop::client::http().deadline(deadline_of(1_000));

    // No attempt bound: the deadline layer's value, as it would have written it.
    assert_eq!(sent(preset().attempt(none), 0, get()).await, one(&["1S"]));
    // A fixed bound shorter than what is left: the bound, once.
    assert_eq!(
        sent(preset().attempt(fixed), 0, get()).await,
        one(&["300m"])
    );
    // The measured bound, cold: 80 % of what is left, once.
    assert_eq!(sent(preset(), 0, get()).await, one(&["800m"]));
    // A caller's shorter header is replaced, not kept beside the stack's.
    let mut req = get();
    req.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("500m"));
    assert_eq!(sent(preset().attempt(none), 0, req).await, one(&["500m"]));
    // Retries: each attempt is told once (the backoff is spent from the deadline, so later
    // attempts are told less).
    let retried = sent(preset().attempt(none), 2, get()).await;
    assert_eq!(retried.len(), 3);
    assert!(
        retried.iter().all(|values| values.len() == 1),
        "{retried:?}"
    );
    assert_eq!(retried[0], one(&["1S"])[0]);
    let told = |v: &http::HeaderValue| backstop::wire::grpc_timeout::decode_header(v).unwrap();
    assert!(told(&retried[1][0]) < Duration::from_secs(1));
    assert!(told(&retried[2][0]) <= told(&retried[1][0]));
    // The deadline layer alone still writes its own header.
    let seen = Seen::default();
    let alone = ServiceBuilder::new()
        .layer(deadline_of(1_000).build().unwrap())
        .service(recording(seen.clone(), 0));
    alone
        .oneshot(Request::new(ReplayBody::empty()))
        .await
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), one(&["1S"]));
}

/// Call `n`'s latency from a seeded log-normal distribution: median 10 ms, σ = 1 (so p95 ≈
/// 52 ms, p99 ≈ 102 ms), by Box–Muller from two uniforms drawn for `n`.
fn log_normal(seed: u64, n: u32) -> Duration {
    // SplitMix64 of `seed + k`: a uniform in [0, 1) per draw, the same on every run.
    let unit = |k: u64| {
        let mut z = seed.wrapping_add(k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let k = 2 * u64::from(n);
    let (u1, u2) = (unit(k).max(f64::MIN_POSITIVE), unit(k + 1));
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    Duration::from_secs_f64(0.010 * z.exp())
}

/// Measured hedging hedges about one call in twenty, as its p95 promises, on a dependency with
/// a long tail: the attempts it drops are censored samples in the latency model (each took at
/// least as long as it ran), not samples it never saw. (Recording winners only, the model read
/// the tail too short: its p99 fell to half the true one and 8 % of calls were hedged.)
#[tokio::test(start_paused = true)]
async fn measured_hedging_hedges_about_one_call_in_twenty() {
    let backend = backstop::client::http().hedging(0.95, 2).build().unwrap();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(scripted(|n| log_normal(7, n)));
    let every = Duration::from_millis(5); // 200 calls a second
    // 10 s to warm the model up and let the hedges settle it; then 30 s, a whole window.
    assert_eq!(load!(client, 2_000, every), 2_000);
    let before = backend.retry_layer().stats().hedges;
    let calls = 6_000;
    assert_eq!(load!(client, calls, every), calls);
    let hedged = backend.retry_layer().stats().hedges - before;
    let rate = f64::from(hedged as u32) / f64::from(calls);
    // The delay the hedges go at: the model's p95, which is the true one (≈ 52 ms).
    use backstop::client::retry::hedge::HedgeDelay;
    let delay = backend.attempt_layer().hedge_delay(0.95).unwrap().delay();
    let delay = delay.expect("a trusted model");
    println!("hedged {rate:.4} of calls, at {delay:?}");
    assert!((0.04..=0.06).contains(&rate), "hedged {rate:.4} of calls");
    assert!(
        delay >= Duration::from_millis(45) && delay <= Duration::from_millis(60),
        "the hedge delay: {delay:?}"
    );
}

/// A hedged request under the preset: the first attempt (sent from the deadline layer's call,
/// the header owed to the attempt bound) and the hedge (sent later by the retry layer) each
/// carry exactly one `grpc-timeout`, the hedge's shorter by the time that passed.
#[tokio::test(start_paused = true)]
async fn a_hedged_request_tells_each_attempt_once() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<Vec<http::HeaderValue>>::new()));
    let log = seen.clone();
    let calls = Arc::new(AtomicU32::new(0));
    let dependency = service_fn(move |req: Request<ReplayBody<String>>| {
        log.lock().unwrap().push(
            req.headers()
                .get_all("grpc-timeout")
                .iter()
                .cloned()
                .collect(),
        );
        let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Ok::<_, std::convert::Infallible>(Response::new(String::new()))
        }
    });
    let backend = backstop::client::http()
        .deadline(deadline_of(1_000))
        .attempt(AttemptBound::None)
        .retry(
            RetryConfig::http().hedging(backstop::client::retry::hedge::Hedging::new(
                Duration::from_millis(50),
            )),
        )
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(dependency);
    client.oneshot(get()).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.iter().all(|values| values.len() == 1), "{seen:?}");
    let told = |v: &http::HeaderValue| backstop::wire::grpc_timeout::decode_header(v).unwrap();
    assert_eq!(told(&seen[0][0]), Duration::from_secs(1));
    assert_eq!(told(&seen[1][0]), Duration::from_millis(950));
    assert_eq!(backend.retry_layer().stats().hedges, 1);
}

/// The server preset caps a caller's deadline at an hour, whatever the header says (the
/// largest it can say included); a deadline layer of the user's own replaces the cap.
#[tokio::test(start_paused = true)]
async fn the_server_preset_caps_an_incoming_deadline_at_an_hour() {
    use backstop::deadline::{DeadlineLayer, current};
    let left = |layer: backstop::ServerLayer, header: &'static str| async move {
        let server =
            ServiceBuilder::new()
                .layer(layer)
                .service(service_fn(|_req: Request<String>| async {
                    let left = current().map(|d| d.remaining());
                    Ok::<_, std::convert::Infallible>(Response::new(format!("{left:?}")))
                }));
        let request = Request::builder()
            .header("grpc-timeout", header)
            .body(String::new())
            .unwrap();
        let response = server.oneshot(request).await.unwrap();
        http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes()
    };
    let hour = Duration::from_secs(3600);
    for header in ["99999999H", "2H", "3601S"] {
        let said = left(backstop::server(), header).await;
        assert_eq!(said, format!("{:?}", Some(hour)), "{header}");
    }
    // Below the cap: what was asked, less the server's 1 ms lead.
    let said = left(backstop::server(), "30M").await;
    let asked = Duration::from_secs(1800) - Duration::from_millis(1);
    assert_eq!(said, format!("{:?}", Some(asked)));
    // The user's own layer, with no cap.
    let uncapped = backstop::server().deadline(DeadlineLayer::new());
    let said = left(uncapped, "2H").await;
    let asked = Duration::from_secs(7200) - Duration::from_millis(1);
    assert_eq!(said, format!("{:?}", Some(asked)));
}

/// Issue 25, 2: a dependency whose calls take 1 s, a caller's deadline of 1.3 s. Once the
/// model is trusted, a call that failed after 1 s has 300 ms left: a retry fits on the wire,
/// but the preset's reserve (the measured p50) does not, so none is sent (before, it was, got
/// what was left, and timed out as one more failure for the breaker) and the response says
/// why.
#[tokio::test(start_paused = true)]
async fn no_retry_is_started_that_the_measured_latency_says_cannot_finish() {
    let calls = Arc::new(AtomicU32::new(0));
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (seen, fails) = (calls.clone(), failing.clone());
    let second = service_fn(move |_req: Request<ReplayBody<String>>| {
        seen.fetch_add(1, Ordering::SeqCst);
        let status = if fails.load(Ordering::SeqCst) {
            503
        } else {
            200
        };
        async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let response = Response::builder().status(status).body(String::new());
            Ok::<_, std::convert::Infallible>(response.unwrap())
        }
    });
    let builder = backstop::client::http().timeout(Duration::from_millis(1300));
    let backend = builder.clone().build().unwrap();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(second.clone());
    assert_eq!(load!(client, 200, Duration::from_millis(10)), 200);
    let p50 = backend.latency().p50.expect("trusted");
    assert!(p50.abs_diff(Duration::from_secs(1)) < Duration::from_millis(35));

    failing.store(true, Ordering::SeqCst);
    let before = calls.load(Ordering::SeqCst);
    let response = client.clone().oneshot(get()).await.unwrap();
    let info = backstop::client::call_info(&response);
    assert_eq!(response.status(), 503);
    assert_eq!(
        (info.attempts(), info.gave_up()),
        (1, Some(backstop::client::retry::GiveUp::Reserve))
    );
    assert_eq!(
        calls.load(Ordering::SeqCst) - before,
        1,
        "no retry was sent"
    );
    assert_eq!(backend.retry_layer().stats().retries, 0);

    // Without the reserve, the old behaviour: a retry with about 300 ms for a 1 s call (and,
    // as the jitter of the unseeded backoff falls, sometimes a third attempt in the last
    // tens of milliseconds).
    let bare = builder.retry_reserve(None).build().unwrap();
    let before = calls.load(Ordering::SeqCst);
    let client = ServiceBuilder::new().layer(bare).service(second.clone());
    let _ = client.oneshot(get()).await;
    let sent = calls.load(Ordering::SeqCst) - before;
    assert!(sent >= 2, "{sent}: a retry was sent");
}

/// Issue 25, 4: a quiet minute no longer forgets what was measured. 200 calls to a 20 ms
/// dependency, then silence: once the calls have left the model's window (45 s), the bound
/// was the 10 s ceiling; now it is the last measured one, doubling every minute of silence
/// on its way there.
#[tokio::test(start_paused = true)]
async fn a_quiet_minute_widens_the_bound_instead_of_forgetting_it() {
    let latency = latency_of(Duration::from_millis(20));
    let (preset, tuned) = preset_and_low_floor();
    for backend in [&preset, &tuned] {
        let client = backend.layer(slow(latency.clone()));
        assert_eq!(load!(client, 200, Duration::from_millis(10)), 200);
    }
    let bound = |b: &backstop::ClientLayer<_>| b.attempt_layer().current_bound().unwrap();
    tokio::time::advance(Duration::from_millis(200)).await;
    let warm = bound(&tuned);
    assert!(warm.abs_diff(Duration::from_millis(60)) < Duration::from_millis(2));
    // A minute later (the samples left the window at 45 s): the model is empty, the bound
    // is not.
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(tuned.latency().p99, None);
    let quiet = bound(&tuned);
    assert!(
        quiet > warm && quiet < 2 * warm,
        "{warm:?} → {quiet:?} after a quiet minute"
    );
    // The preset's floor follows the widened p99 too (about 25 ms × 20), below the ceiling.
    let floor = bound(&preset);
    assert!(
        floor.abs_diff(Duration::from_millis(500)) < Duration::from_millis(20),
        "{floor:?}"
    );
    // Ten more minutes: the ceiling.
    tokio::time::advance(Duration::from_secs(600)).await;
    assert_eq!(bound(&tuned), Duration::from_secs(10));
}

/// A dependency whose `/report` takes `took` and every other route 10 ms.
fn a_slow_report(
    took: Duration,
) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    service_fn(move |req: Request<ReplayBody<String>>| async move {
        let took = if req.uri().path() == "/report" {
            took
        } else {
            Duration::from_millis(10)
        };
        tokio::time::sleep(took).await;
        Ok(Response::new(String::new()))
    })
}

/// The HTTP preset's breaker, one per path.
fn path_keyed_breaker() -> BreakerConfig<HttpClassifier> {
    backstop::client::http_breaker().per_key(backstop::RouteKey::Path)
}

/// Issue 25, 5: `/report`, 0.5 % of the calls, takes 2 s; the other routes 10 ms; a 5 s
/// deadline. With one model for the dependency, `/report` is cut at the bound the fast
/// routes set (their 250 ms floor) on every attempt, about half the time. With the breaker keyed per path, the
/// preset keys the attempt layer the same way: `/report` gets the cold-start ceiling (capped
/// by the deadline's share) until its own model is trusted, then its own p99 × 3, and every
/// call to it succeeds.
#[tokio::test(start_paused = true)]
async fn a_rare_slow_route_is_not_cut_at_the_fast_routes_bound_under_a_keyed_breaker() {
    let dependency = a_slow_report(Duration::from_millis(2_000));
    let keyed_breaker = path_keyed_breaker();
    let keyed = backstop::client::http()
        .timeout(Duration::from_secs(5))
        .breaker(keyed_breaker)
        .build()
        .unwrap();
    let single = backstop::client::http()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    assert!(keyed.attempt_layer().key().is_some());
    assert!(single.attempt_layer().key().is_none());
    let mut report_ok = Vec::new();
    // One model first, so the keyed preset's models are read right after its run.
    for backend in [&single, &keyed] {
        let client = ServiceBuilder::new()
            .layer(backend.clone())
            .service(dependency.clone());
        // 1 000 calls a second for 25 s: /report is every 200th (125 calls, 5 a second, so
        // its own model is trusted after about 20 s).
        let mut tasks = Vec::new();
        for i in 0..25_000u32 {
            let path = match i % 200 {
                7 => "/report",
                n if n % 2 == 0 => "/a",
                _ => "/b",
            };
            let req = Request::get(format!("http://dep{path}"))
                .body(String::new())
                .unwrap();
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let ok = matches!(client.oneshot(req).await, Ok(r) if r.status() == 200);
                (path, ok)
            }));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (mut sent, mut ok, mut fast_ok) = (0u32, 0u32, 0u32);
        for t in tasks {
            match t.await.unwrap() {
                ("/report", good) => {
                    sent += 1;
                    ok += u32::from(good);
                }
                (_, good) => fast_ok += u32::from(good),
            }
        }
        assert_eq!(sent, 125);
        assert_eq!(fast_ok, 25_000 - 125, "the fast routes all succeed");
        report_ok.push(ok);
    }
    assert_eq!(report_ok[1], 125, "keyed: every /report call succeeds");
    // One model: /report's attempts are cut at the fast routes' bound until their censored
    // samples (three attempts per call, 1.5 % of the model) lift its p99, then pass until
    // they no longer do: 61 of 125 got through.
    assert!(report_ok[0] < 100, "one model: {} of 125", report_ok[0]);
    // /report's own model is trusted: its bound is its own, not the fast routes' 250 ms.
    let report = keyed.attempt_layer().key_latency("/report").unwrap();
    assert!(
        report
            .p99
            .is_some_and(|p99| p99 >= Duration::from_millis(1_900)),
        "{report:?}"
    );
    assert!(keyed.latency().count == 0, "every call had a key");
}

/// Issue 25, 1 (refined): p50 ≈ 1 s, a deadline of 1.3 s. The first attempt is not the last
/// by count, but its 80 % share (1.04 s) would leave 260 ms, less than the median call: no
/// retry could finish there (the reserve refuses it). So it takes the whole deadline, and a
/// call of 1.2 s succeeds; before, it was cut at 1.04 s and the call failed with no retry.
#[tokio::test(start_paused = true)]
async fn an_attempt_no_retry_could_follow_takes_the_whole_deadline() {
    let backend = backstop::client::http()
        .timeout(Duration::from_millis(1300))
        .build()
        .unwrap();
    let (client, latency) = slow_behind(&backend, Duration::from_secs(1));
    assert_eq!(warm_up!(client, 200), 200);
    let p50 = backend.latency().p50.expect("trusted");
    assert!(p50.abs_diff(Duration::from_secs(1)) < Duration::from_millis(35));

    *latency.lock().unwrap() = Some(Duration::from_millis(1200));
    let started = tokio::time::Instant::now();
    let response = client.clone().oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(backstop::client::call_info(&response).attempts(), 1);
    assert_eq!(started.elapsed(), Duration::from_millis(1200));
    // A hang is cut at the deadline, by the attempt's own bound (counted by the breaker),
    // not at 1.04 s.
    *latency.lock().unwrap() = None;
    let (_, took) = timed(client.oneshot(get())).await;
    assert!(
        took >= Duration::from_millis(1280) && took <= Duration::from_millis(1300),
        "{took:?}"
    );
}

/// Issue 25, 5: with a keyed breaker the preset's measured hedging reads each route's own
/// model. After 300 calls to a 10 ms route, a 200 ms call to a new route is not hedged (its
/// model is not trusted yet); with one model it was, at the fast route's p95, and the
/// dependency got every such call twice.
#[tokio::test(start_paused = true)]
async fn a_keyed_preset_hedges_a_route_at_its_own_p95() {
    let dependency = a_slow_report(Duration::from_millis(200));
    let keyed_breaker = path_keyed_breaker();
    let keyed = backstop::client::http()
        .hedging(0.95, 2)
        .breaker(keyed_breaker)
        .build()
        .unwrap();
    let single = backstop::client::http().hedging(0.95, 2).build().unwrap();
    let mut attempts = Vec::new();
    for backend in [&keyed, &single] {
        let client = ServiceBuilder::new()
            .layer(backend.clone())
            .service(dependency.clone());
        for _ in 0..300 {
            let req = Request::get("http://dep/a").body(String::new()).unwrap();
            assert_eq!(client.clone().oneshot(req).await.unwrap().status(), 200);
        }
        tokio::time::advance(Duration::from_millis(200)).await;
        let req = Request::get("http://dep/report")
            .body(String::new())
            .unwrap();
        let response = client.oneshot(req).await.unwrap();
        attempts.push(backstop::client::call_info(&response).attempts());
    }
    assert_eq!(
        attempts,
        [1, 2],
        "keyed: not hedged; one model: hedged at /a's p95"
    );
}

/// A stack built again from its template with other knobs (attempts, hedging, the reserve)
/// is a new stack: its stats start at zero and count its own calls, while the first stack
/// and its clones keep theirs (share a stack by cloning what `build` returned).
#[tokio::test(start_paused = true)]
async fn a_stack_built_again_with_other_knobs_counts_its_own_calls() {
    let template = backstop::client::http()
        .name("inventory")
        // Three failures in a row would trip the throttle, which is not under test.
        .throttle(None);
    let three = template.clone().build().unwrap();
    let client = tower::Layer::layer(&three.clone(), answering(503));
    client.oneshot(get()).await.unwrap();
    assert_eq!(
        three.retry_layer().stats().retries,
        2,
        "3 attempts: 2 retries, counted by every clone"
    );

    let two = template
        .max_attempts(2)
        .hedging(0.95, 2)
        .retry_reserve(Some(0.9))
        .build()
        .unwrap();
    assert_eq!(two.retry_layer().stats().retries, 0, "a new stack");
    assert_eq!(two.retry_layer().name(), "inventory");
    tower::Layer::layer(&two, answering(503))
        .oneshot(get())
        .await
        .unwrap();
    tower::Layer::layer(&three, answering(503))
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(two.retry_layer().stats().retries, 1, "two attempts");
    assert_eq!(three.retry_layer().stats().retries, 4, "2 + 2");
}

/// Naming is configuration: two stacks named from clones of one template are two
/// dependencies (one's open breaker does not refuse the other's calls, their stats are their
/// own); clones of one built stack are one dependency (a clone's calls open the breaker the
/// other clone sees).
#[tokio::test(start_paused = true)]
async fn stacks_named_from_one_template_share_nothing_and_clones_share_everything() {
    let template = backstop::client::http()
        .max_attempts(1)
        .throttle(None)
        .breaker(opens_after_two());
    let inventory = template.clone().name("inventory").build().unwrap();
    let billing = template.name("billing").build().unwrap();
    let client = tower::Layer::layer(&inventory, answering(503));
    for _ in 0..2 {
        client.clone().oneshot(get()).await.unwrap();
    }
    let err = client.clone().oneshot(get()).await.unwrap_err();
    assert!(backstop::is_breaker_open(err.as_ref()), "{err}");
    let other = tower::Layer::layer(&billing, answering(503));
    let response = other.oneshot(get()).await.unwrap();
    assert_eq!(
        response.status(),
        503,
        "billing's breaker is its own, closed"
    );
    assert_eq!(billing.breaker_layer().name(), "billing");
    assert_eq!(inventory.breaker_layer().name(), "inventory");

    let stack = backstop::client::http()
        .name("search")
        .breaker(opens_after_two())
        .build()
        .unwrap();
    let clone = stack.clone();
    let client = tower::Layer::layer(&stack, answering(503));
    // Its two failures open it: the clone's handle sees them.
    let _ = client.oneshot(get()).await;
    assert_eq!(
        clone.breaker_layer().snapshot().state,
        backstop::client::breaker::State::Open
    );
}

// Names as configuration: what two stacks named from one template share (nothing the stack
// made itself), and what follows a `name` given after other knobs.

/// Two stacks named from one template have throttles of their own: one dependency's overload
/// never makes the other stack refuse calls to a healthy dependency (found by an outside
/// review: `ThrottleLayer::named` kept the template's `AdaptiveThrottle`).
#[tokio::test(start_paused = true)]
async fn named_stacks_from_one_template_do_not_share_the_throttle_window() {
    let template = backstop::client::http().max_attempts(1);
    let inventory = template.clone().name("inventory").build().unwrap();
    let billing = template.name("billing").build().unwrap();
    // Inventory is overloaded: 429 (throttled: not accepted by the throttle, not counted by
    // the breaker, not retried with one attempt).
    let overloaded = tower::Layer::layer(&inventory, answering(429));
    for _ in 0..100 {
        let _ = overloaded.clone().oneshot(get()).await;
    }
    // The throttle's cached probability is recomputed at most every 100 ms.
    tokio::time::advance(Duration::from_millis(200)).await;
    // Billing is healthy and was never called.
    let healthy = tower::Layer::layer(&billing, answering(200));
    let mut refused = 0;
    for _ in 0..20 {
        if let Err(err) = healthy.clone().oneshot(get()).await {
            assert!(
                backstop::find::<backstop::ClientThrottled>(err.as_ref()).is_some(),
                "{err}"
            );
            refused += 1;
        }
    }
    assert_eq!(
        refused, 0,
        "billing's calls were refused by inventory's throttle window"
    );
    assert!(
        !Arc::ptr_eq(
            inventory.throttle_layer().throttle(),
            billing.throttle_layer().throttle()
        ),
        "two named stacks share one AdaptiveThrottle"
    );
}

/// Two stacks named from one template have retry budgets of their own: inventory's failures
/// leave billing its retries (found by an outside review: `RetryLayer::named` kept the
/// policy's default budget).
#[tokio::test(start_paused = true)]
async fn named_stacks_from_one_template_do_not_share_the_retry_budget() {
    let template = backstop::client::http().max_attempts(2).throttle(None);
    let inventory = template.clone().name("inventory").build().unwrap();
    let billing = template.name("billing").build().unwrap();
    // Inventory answers 429 (always retryable, not a breaker failure): its retries drain
    // the budget until one is refused for it.
    let overloaded = tower::Layer::layer(&inventory, answering(429));
    let mut drained = false;
    for _ in 0..200 {
        let response = overloaded.clone().oneshot(get()).await.unwrap();
        if backstop::client::call_info(&response).gave_up()
            == Some(backstop::client::retry::GiveUp::Budget)
        {
            drained = true;
            break;
        }
    }
    assert!(drained, "inventory's budget never ran out");
    // Billing's first call fails once: its retry should come from a budget of its own.
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let flaky = service_fn(move |_req: Request<ReplayBody<String>>| {
        let status = if seen.fetch_add(1, Ordering::SeqCst) == 0 {
            503
        } else {
            200
        };
        async move {
            let response = Response::builder().status(status).body(String::new());
            Ok::<_, std::convert::Infallible>(response.unwrap())
        }
    });
    let response = tower::Layer::layer(&billing, flaky)
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(
        (
            response.status(),
            backstop::client::call_info(&response).gave_up()
        ),
        (http::StatusCode::OK, None),
        "billing's retry was refused by the budget inventory drained"
    );
}

/// A measured hedge delay reads the model of the stack `build` makes, with `name` given
/// before or after `hedging` (found by an outside review, when setters re-derived layers: a
/// delay read off `attempt_layer()` read a model `name` later replaced, never trusted, and
/// the stack never hedged).
#[tokio::test(start_paused = true)]
async fn a_measured_hedge_delay_follows_name_given_before_or_after_it() {
    async fn hedges_of(name_first: bool) -> u64 {
        let stack = backstop::client::http().throttle(None);
        let stack = if name_first {
            stack.name("search")
        } else {
            stack
        };
        let stack = stack.hedging(0.95, 2);
        let stack = if name_first {
            stack
        } else {
            stack.name("search")
        };
        let stack = stack.build().unwrap();
        let client = stack.layer(slow_after_warm_up());
        assert_eq!(warm_up!(client, 200), 200);
        client.clone().oneshot(get()).await.unwrap();
        stack.retry_layer().stats().hedges
    }
    assert_eq!(hedges_of(true).await, 1, "named first");
    assert_eq!(hedges_of(false).await, 1, "named after hedging");
}

/// Clones of one keyed stack share its per-route latency models (one dependency, one model
/// per route), whichever clone made the calls.
#[tokio::test(start_paused = true)]
async fn clones_of_a_keyed_stack_share_its_route_models() {
    let first = backstop::client::http()
        .throttle(None)
        .breaker(path_keyed_breaker())
        .name("search")
        .build()
        .unwrap();
    let second = first.clone();
    let client = ServiceBuilder::new()
        .layer(first.clone())
        .service(scripted(|_| Duration::from_millis(20)));
    assert_eq!(load!(client, 50, Duration::from_millis(10)), 50);
    assert_eq!(second.attempt_layer().keys(), first.attempt_layer().keys());
    assert_eq!(second.attempt_layer().key_latency("/x").unwrap().count, 50);
}

/// The builder's setters record values; `build` makes the stack from all of them, so their
/// order never matters: a short form wins over the same knob of a part's config before or
/// after it, and the stack's classifier is the one every layer uses.
#[tokio::test(start_paused = true)]
async fn the_setters_order_never_changes_the_stack() {
    let policy = || PropagateDeadlineLayer::builder().timeout(Duration::from_secs(9));
    let retry = || RetryConfig::http().max_attempts(4);
    let orders = [
        backstop::client::http()
            .timeout(Duration::from_millis(300))
            .deadline(policy())
            .max_attempts(2)
            .retry(retry())
            .breaker(path_keyed_breaker())
            .hedging(0.95, 2)
            .name("search"),
        backstop::client::http()
            .name("search")
            .hedging(0.95, 2)
            .breaker(path_keyed_breaker())
            .retry(retry())
            .max_attempts(2)
            .deadline(policy())
            .timeout(Duration::from_millis(300)),
    ];
    for builder in orders {
        let stack = builder.attempt(AttemptBound::None).build().unwrap();
        let policy = format!("{:?}", stack.retry_layer().config());
        assert!(policy.contains("max_attempts: 2,"), "{policy}");
        assert_eq!(stack.retry_layer().name(), "search");
        assert_eq!(stack.breaker_layer().name(), "search");
        assert!(stack.breaker_layer().is_keyed());
        assert!(matches!(
            stack.attempt_layer().key(),
            Some(backstop::RouteKey::Path)
        ));
        let (seen, dependency) = {
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let log = seen.clone();
            let dependency = service_fn(move |req: Request<ReplayBody<String>>| {
                log.lock()
                    .unwrap()
                    .push(req.headers().get("grpc-timeout").cloned());
                async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }
            });
            (seen, dependency)
        };
        ServiceBuilder::new()
            .layer(stack)
            .service(dependency)
            .oneshot(get())
            .await
            .unwrap();
        let told = seen.lock().unwrap().clone();
        assert_eq!(told, vec![Some(http::HeaderValue::from_static("300m"))]);
    }
}

/// A measured hedge delay follows a keyed breaker given after it, which keys the stack's
/// attempt layer (found by an outside review when setters re-derived layers: a delay read
/// off `attempt_layer()` read a model a keyed breaker given later replaced).
#[tokio::test(start_paused = true)]
async fn a_measured_hedge_delay_follows_a_keyed_breaker_given_after_it() {
    let stack = backstop::client::http()
        .throttle(None)
        .name("search")
        .hedging(0.95, 2)
        .breaker(path_keyed_breaker())
        .build()
        .unwrap();
    let client = stack.layer(slow_after_warm_up());
    assert_eq!(warm_up!(client, 200), 200);
    client.clone().oneshot(get()).await.unwrap();
    assert_eq!(stack.retry_layer().stats().hedges, 1);
}
