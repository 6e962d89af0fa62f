//! The adaptive throttle as a layer: what it counts, what it refuses, what a refused caller
//! sees, and that its counts hold whatever the caller does with the future (drop it, race it,
//! put a `Buffer` around the layer).

use backstop::classify::classify_error;
use backstop::client::overload::throttle::{AdaptiveThrottle, ThrottleLayer};
use backstop::client::retry::{CallInfo, GiveUp, RetryError};
use backstop::{ClientThrottled, Outcome, Rejection};
use backstop_test_support::{get, grpc_call, grpc_reply, reply};
use http::{Request, Response};
use std::{convert::Infallible, sync::Arc, time::Duration};
use tower::{Layer, Service, ServiceExt, service_fn};

fn seeded() -> Arc<AdaptiveThrottle> {
    Arc::new(
        AdaptiveThrottle::builder()
            .max_probability(0.9)
            .seed(11)
            .build()
            .unwrap(),
    )
}

/// A dependency answering every call with `status`.
fn answering(
    status: u16,
) -> impl Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future = std::future::Ready<Result<Response<String>, Infallible>>,
> + Clone {
    service_fn(move |_req: Request<String>| std::future::ready(Ok(reply(status))))
}

#[tokio::test(start_paused = true)]
async fn a_healthy_dependency_is_never_throttled() {
    let throttle = seeded();
    let layer = ThrottleLayer::with(throttle.clone(), backstop::HttpClassifier::new());
    let client = layer.layer(answering(200));
    for _ in 0..1000 {
        let response = client.clone().oneshot(get()).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(throttle.window_counts(), (1000, 1000));
    assert_eq!(throttle.rejections(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_overloaded_dependency_sees_about_k_times_what_it_accepts() {
    let throttle = seeded();
    let layer = ThrottleLayer::with(throttle.clone(), backstop::HttpClassifier::new());
    // Capacity 500 calls/s (one every 2 ms), refusing the rest with 503; offered 2000/s.
    let sent = Arc::new(std::sync::Mutex::new((
        0u64,
        None::<tokio::time::Instant>,
        0u64,
    )));
    let seen = sent.clone();
    let dependency = service_fn(move |_req: Request<String>| {
        let mut state = seen.lock().unwrap();
        state.0 += 1;
        let now = tokio::time::Instant::now();
        let free = state
            .1
            .is_none_or(|last| now - last >= Duration::from_millis(2));
        if free {
            state.1 = Some(now);
            state.2 += 1;
        }
        std::future::ready(Ok::<_, Infallible>(reply(if free { 200 } else { 503 })))
    });
    let client = layer.layer(dependency);
    let mut refused = 0;
    let calls = 40_000; // 20 s
    for i in 0..calls {
        tokio::time::advance(Duration::from_micros(500)).await;
        match client.clone().oneshot(get()).await {
            Ok(_) => {}
            Err(err) => {
                assert!(backstop::find::<ClientThrottled>(&*err).is_some());
                assert!(i > 0);
                refused += 1;
            }
        }
    }
    let (sent, _, accepted) = *sent.lock().unwrap();
    assert_eq!(sent + refused, calls);
    // At equilibrium the dependency sees about K × what it accepts (K = 2), not the surge.
    let ratio = sent as f64 / accepted as f64;
    assert!(
        (1.8..2.4).contains(&ratio),
        "{ratio}: {sent} sent, {accepted} accepted"
    );
    assert!(sent < calls / 2, "{sent}");
}

#[tokio::test(start_paused = true)]
async fn a_refused_caller_sees_a_local_rejection_never_retried() {
    let throttle = Arc::new(
        AdaptiveThrottle::builder()
            .max_probability(1.0)
            .seed(1)
            .build()
            .unwrap(),
    );
    for _ in 0..1000 {
        throttle.record_request();
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    let http = ThrottleLayer::with(throttle.clone(), backstop::HttpClassifier::new())
        .layer(answering(200));
    let err = http.oneshot(get()).await.unwrap_err();
    assert!(backstop::find::<ClientThrottled>(&*err).is_some(), "{err}");
    let info = backstop::find::<RetryError>(&*err).map(RetryError::info);
    assert_eq!(info, Some(CallInfo::new(0, Some(GiveUp::Throttled))));
    assert_eq!(classify_error(&*err), Outcome::Rejected);

    let grpc_dependency =
        service_fn(|_req: Request<String>| std::future::ready(Ok::<_, Infallible>(grpc_reply(0))));
    let grpc =
        ThrottleLayer::with(throttle, backstop::GrpcClassifier::new()).layer(grpc_dependency);
    let response = grpc.oneshot(grpc_call("x")).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(response.headers()["grpc-retry-pushback-ms"], "-1");
    assert_eq!(
        response.extensions().get::<Rejection>(),
        Some(&Rejection::ClientThrottled)
    );
    assert_eq!(
        CallInfo::of(&response),
        CallInfo::new(0, Some(GiveUp::Throttled))
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_at_its_deadline_is_a_request_without_an_accept() {
    let throttle = seeded();
    let layer = ThrottleLayer::with(throttle.clone(), backstop::HttpClassifier::new());
    let (mock, mut handle) = tower_test::mock::pair::<Request<String>, Response<String>>();
    let mut client = layer.layer(mock);
    let within = |ms: u64| {
        let mut req = get();
        req.extensions_mut()
            .insert(backstop::deadline::Deadline::after(Duration::from_millis(
                ms,
            )));
        req
    };
    // Polled, then dropped before its deadline: its caller let go, nothing is counted.
    tokio_test::assert_ready_ok!(tokio_test::task::spawn(()).enter(|cx, _| client.poll_ready(cx)));
    let mut call = tokio_test::task::spawn(client.call(within(1_000)));
    tokio_test::assert_pending!(call.poll());
    drop(call);
    // Raced by a timer in `select!` and lost, without a deadline: nothing either.
    client.ready().await.unwrap();
    let call = client.call(get());
    tokio::select! {
        _ = call => panic!("the mock never answers"),
        () = tokio::time::sleep(Duration::from_millis(10)) => {}
    }
    assert_eq!(throttle.window_counts(), (0, 0));
    // Still unanswered at its deadline, then dropped (the deadline layer outside does this):
    // a request the dependency did not accept.
    client.ready().await.unwrap();
    let call = client.call(within(10));
    tokio::select! {
        _ = call => panic!("the mock never answers"),
        () = tokio::time::sleep(Duration::from_millis(10)) => {}
    }
    assert_eq!(throttle.window_counts(), (1, 0));
    // Answered through a `Buffer` around the layer.
    let buffered = tower::buffer::Buffer::new(layer.layer(answering(200)), 8);
    let answered = tokio::spawn(buffered.oneshot(get()));
    assert!(answered.await.unwrap().is_ok());
    drop(handle.next_request());
    assert_eq!(throttle.window_counts(), (2, 1));
}

/// A caller racing copies of a call to a healthy dependency (the first answer wins, the rest
/// are dropped) never trips the throttle: the losers are let go of, not refused by the
/// dependency.
#[tokio::test(start_paused = true)]
async fn racing_callers_never_throttle_a_healthy_dependency() {
    use futures_util::{StreamExt, stream::FuturesUnordered};
    let throttle = seeded();
    let layer = ThrottleLayer::with(throttle.clone(), backstop::HttpClassifier::new());
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let count = sent.clone();
    let client = layer.layer(tower::service_fn(move |_req: Request<String>| {
        let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            let ms = if n.is_multiple_of(3) { 5 } else { 50 };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, std::convert::Infallible>(Response::new(String::new()))
        }
    }));
    for _ in 0..200 {
        let mut race: FuturesUnordered<_> = (0..3)
            .map(|_| {
                let mut req = get();
                req.extensions_mut()
                    .insert(backstop::deadline::Deadline::after(Duration::from_secs(1)));
                client.clone().oneshot(req)
            })
            .collect();
        assert!(race.next().await.unwrap().is_ok());
        drop(race);
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    assert_eq!(throttle.rejections(), 0);
    assert_eq!(throttle.probability(), 0.0);
}

#[tokio::test(start_paused = true)]
async fn an_off_throttle_sends_everything_and_counts_nothing() {
    let layer = ThrottleLayer::<backstop::HttpClassifier>::off();
    let client = layer.layer(answering(503));
    for _ in 0..300 {
        let response = client.clone().oneshot(get()).await.unwrap();
        assert_eq!(response.status(), 503);
        tokio::time::advance(Duration::from_millis(20)).await;
    }
    assert_eq!(layer.throttle().window_counts(), (0, 0));
    assert_eq!(layer.throttle().rejections(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_call_an_inner_breaker_refused_counts_as_accepted() {
    let throttle = seeded();
    let layer = ThrottleLayer::with(throttle.clone(), backstop::HttpClassifier::new());
    let open = layer.layer(service_fn(|_req: Request<String>| async {
        Err::<Response<String>, _>(backstop::BreakerOpen::new(None))
    }));
    for _ in 0..100 {
        let err = open.clone().oneshot(get()).await.unwrap_err();
        assert!(err.is::<backstop::BreakerOpen>(), "{err}");
    }
    // The dependency never saw these: no evidence of overload, nothing to throttle later.
    assert_eq!(throttle.window_counts(), (100, 100));
    assert_eq!(throttle.probability(), 0.0);
    // The same for a gRPC answer carrying the breaker's rejection.
    let throttle = seeded();
    let layer = ThrottleLayer::with(throttle.clone(), backstop::GrpcClassifier::new());
    let open = layer.layer(service_fn(|_req: Request<String>| async {
        let refusal = Rejection::BreakerOpen { retry_after: None }.into_response::<String>(true);
        Ok::<_, Infallible>(refusal.map(|_| String::new()))
    }));
    for _ in 0..10 {
        open.clone().oneshot(grpc_call("")).await.unwrap();
    }
    assert_eq!(throttle.window_counts(), (10, 10));
}

/// Calls in flight are not refusals: a dependency that answers every call in 1 s, called
/// 100 times a second, is never throttled, in its first second (all calls in flight, none
/// answered yet) or after. A call is counted as a request when its outcome is known; counted
/// when it was sent, the first second read as 100 requests and no accept, and nearly every
/// call was refused.
#[tokio::test(start_paused = true)]
async fn calls_in_flight_to_a_slow_dependency_are_not_throttled() {
    let throttle = seeded();
    let layer = ThrottleLayer::with(throttle.clone(), backstop::HttpClassifier::new());
    let slow = service_fn(|_req: Request<String>| async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok::<_, Infallible>(reply(200))
    });
    let client = layer.layer(slow);
    let mut calls = Vec::new();
    for _ in 0..300 {
        calls.push(tokio::spawn(client.clone().oneshot(get())));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status(), 200);
    }
    assert_eq!(throttle.rejections(), 0);
    assert_eq!(throttle.window_counts(), (300, 300));
}

/// A `call` that panics takes nothing for good from the throttle, the retry budget or a
/// hedged call (none holds a permit across `inner.call`; a call never answered counts as
/// nothing): the next calls go through. Checked with the bulkhead's leaked permit (outside
/// audit).
#[tokio::test(start_paused = true)]
async fn a_call_that_panics_leaves_the_throttle_and_the_budget_as_they_were() {
    use backstop::client::retry::RetryConfig;
    use backstop::client::retry::hedge::Hedging;
    use backstop_test_support::{call_catching, panicking};
    use std::sync::atomic::{AtomicBool, Ordering};
    let panics = Arc::new(AtomicBool::new(true));
    let throttle = seeded();
    let mut throttled = ThrottleLayer::with(throttle.clone(), backstop::HttpClassifier::new())
        .layer(panicking::<Request<String>>(panics.clone()));
    let retries = RetryConfig::http().seed(1).build().unwrap();
    let mut retried = retries.layer(panicking(panics.clone()));
    let hedged = RetryConfig::http()
        .hedging(Hedging::new(Duration::from_millis(10)))
        .seed(1)
        .build()
        .unwrap();
    let mut hedging = hedged.layer(panicking(panics.clone()));
    assert!(call_catching(&mut throttled, get()).is_err());
    assert!(call_catching(&mut retried, get()).is_err());
    assert!(call_catching(&mut hedging, get()).is_err());
    panics.store(false, Ordering::SeqCst);
    for _ in 0..3 {
        assert_eq!(
            throttled.clone().oneshot(get()).await.unwrap().status(),
            200
        );
        assert_eq!(retried.clone().oneshot(get()).await.unwrap().status(), 200);
        assert_eq!(hedging.clone().oneshot(get()).await.unwrap().status(), 200);
    }
    assert_eq!(throttle.probability(), 0.0);
}
