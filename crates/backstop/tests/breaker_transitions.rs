//! Every transition of the breaker, with mock services under paused time.

use backstop::BreakerOpen;
use backstop::client::breaker::{
    Breaker, BreakerConfig, BreakerLayer, Mode, Reason, State, Transition,
};
use backstop::{BoxError, GrpcClassifier, HttpClassifier, Rejection};
use backstop_test_support::{Handle, MS, Mock, S, get, grpc_call, grpc_reply, reply};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::time::advance;
use tokio_test::{assert_pending, assert_ready_ok, task};
use tower::{Layer, Service, ServiceExt};
use tower_test::mock;

struct Harness<C> {
    layer: BreakerLayer<C>,
    service: Breaker<Mock, C>,
    handle: Handle,
}

fn harness<C: Clone>(config: BreakerConfig<C>) -> Harness<C> {
    let layer = config.build().unwrap();
    let (mock, handle) = mock::pair();
    Harness {
        service: layer.layer(mock),
        layer,
        handle,
    }
}

/// Deterministic: no jitter, small minimum, fixed seed.
fn http() -> BreakerConfig<HttpClassifier> {
    BreakerConfig::http().minimum_calls(4).jitter(false).seed(1)
}

/// gRPC, opening on the first failure.
fn grpc() -> BreakerConfig<GrpcClassifier> {
    BreakerConfig::grpc().minimum_calls(1).jitter(false)
}

impl Harness<GrpcClassifier> {
    /// One gRPC call answered by the dependency with a trailers-only `code`.
    async fn call_grpc(&mut self, code: u8) {
        self.handle.allow(1);
        let future = self.service.ready().await.unwrap().call(grpc_call(""));
        let (_, send) = self.handle.next_request().await.unwrap();
        send.send_response(grpc_reply(code));
        future.await.unwrap();
    }
}

impl<C> Harness<C>
where
    C: backstop::Classify<Response<String>> + Clone + Send + Sync + 'static,
{
    /// One call answered by the dependency with `status`; the response status, or the error.
    async fn call(&mut self, status: u16) -> Result<u16, BoxError> {
        self.handle.allow(1);
        let future = self.service.ready().await?.call(get());
        let (_, send) = self
            .handle
            .next_request()
            .await
            .expect("reached the dependency");
        send.send_response(reply(status));
        future.await.map(|r| r.status().as_u16())
    }
}

impl Harness<HttpClassifier> {
    /// One call that the breaker must refuse without reaching the dependency.
    async fn refused(&mut self) -> BreakerOpen {
        self.handle.allow(1);
        let err = self
            .service
            .ready()
            .await
            .unwrap()
            .call(get())
            .await
            .expect_err("refused");
        // A fresh task poll, so tokio's cooperative budget cannot hide a request.
        tokio::task::yield_now().await;
        assert!(
            self.handle.poll_request().is_pending(),
            "a refused call never reaches the dependency"
        );
        *err.downcast_ref::<BreakerOpen>().expect("BreakerOpen")
    }

    async fn open_it(&mut self) {
        for _ in 0..4 {
            assert_eq!(self.call(503).await.unwrap(), 503);
        }
        assert_eq!(self.layer.snapshot().state, State::Open);
    }
}

#[tokio::test(start_paused = true)]
async fn opens_on_the_failure_rate_once_minimum_calls_are_seen() {
    let mut h = harness(http());
    // Three failures out of three: below minimum_calls (4), stays closed.
    for _ in 0..3 {
        h.call(500).await.unwrap();
    }
    let snap = h.layer.snapshot();
    assert_eq!(
        (snap.state, snap.calls, snap.failures),
        (State::Closed, 3, 3)
    );
    assert_eq!(snap.failure_rate, Some(1.0));
    // The fourth reaches the minimum: 4 of 4 failed, open.
    h.call(500).await.unwrap();
    assert_eq!(h.layer.snapshot().state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn a_success_never_opens_the_next_failure_does() {
    let mut h = harness(http());
    for _ in 0..2 {
        h.call(500).await.unwrap();
    }
    h.call(200).await.unwrap();
    // 2 failures of 4 calls = 50 % at the minimum, but the last call succeeded: the rates
    // are checked when a failure is recorded.
    h.call(200).await.unwrap();
    assert_eq!(h.layer.snapshot().state, State::Closed);
    h.call(500).await.unwrap(); // 3 of 5
    assert_eq!(h.layer.snapshot().state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn below_the_failure_rate_stays_closed() {
    let mut h = harness(http().failure_rate(0.5));
    for i in 0..100 {
        h.call(if i % 3 == 2 { 500 } else { 200 }).await.unwrap();
    }
    let snap = h.layer.snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!((snap.calls, snap.failures), (100, 33));
}

#[tokio::test(start_paused = true)]
async fn ignored_and_rejected_results_never_count() {
    let mut h = harness(http());
    for _ in 0..10 {
        assert_eq!(h.call(404).await.unwrap(), 404);
    }
    // Our own local rejection, e.g. a deadline spent further in: not the dependency's fault.
    h.handle.allow(1);
    let future = h.service.ready().await.unwrap().call(get());
    let (_, send) = h.handle.next_request().await.unwrap();
    send.send_error(backstop::DeadlineExceeded::new());
    assert!(future.await.is_err());
    let snap = h.layer.snapshot();
    assert_eq!((snap.state, snap.calls), (State::Closed, 0));
}

/// A rate limit (429) is honoured through its `Retry-After`, not by closing the dependency
/// off: 25 throttled calls leave the breaker closed and uncounted; with a classifier that
/// calls a 429 a failure (what `count_throttled(true)` was) the same calls open it.
#[tokio::test(start_paused = true)]
async fn throttled_calls_count_for_nothing_unless_asked() {
    let mut h = harness(http());
    for _ in 0..25 {
        assert_eq!(h.call(429).await.unwrap(), 429);
    }
    let snap = h.layer.snapshot();
    assert_eq!(
        (snap.state, snap.calls, snap.failures),
        (State::Closed, 0, 0)
    );

    let mut h = harness(http().classifier(ThrottledFails(HttpClassifier::new())));
    for _ in 0..4 {
        assert_eq!(h.call(429).await.unwrap(), 429);
    }
    assert_eq!(h.layer.snapshot().state, State::Open);
}

/// gRPC RESOURCE_EXHAUSTED is throttling too; UNAVAILABLE is a failure.
#[tokio::test(start_paused = true)]
async fn resource_exhausted_counts_for_nothing_unavailable_counts() {
    for (code, counted) in [(8, false), (14, true)] {
        let mut h = harness(grpc());
        h.call_grpc(code).await;
        let snap = h.layer.snapshot();
        assert_eq!(snap.failures, u64::from(counted), "code {code}");
        let state = if counted { State::Open } else { State::Closed };
        assert_eq!(snap.state, state, "code {code}");
    }
}

#[tokio::test(start_paused = true)]
async fn transport_errors_are_failures() {
    let mut h = harness(http());
    for _ in 0..4 {
        h.handle.allow(1);
        let future = h.service.ready().await.unwrap().call(get());
        let (_, send) = h.handle.next_request().await.unwrap();
        send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        let err = future.await.unwrap_err();
        assert!(
            err.downcast_ref::<std::io::Error>().is_some(),
            "passed through untouched"
        );
    }
    assert_eq!(h.layer.snapshot().state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn open_refuses_at_once_and_says_when_to_come_back() {
    let mut h = harness(http());
    h.open_it().await;
    let snap = h.layer.snapshot();
    // Exported as a remaining duration, with a counter of openings.
    assert_eq!(snap.open_for, Some(5 * S));
    assert_eq!(snap.opens, 1);
    assert_eq!(h.refused().await.retry_after(), Some(5 * S));
    advance(2 * S).await;
    assert_eq!(h.refused().await.retry_after(), Some(3 * S));
    assert_eq!(h.layer.snapshot().open_for, Some(3 * S));
}

#[tokio::test(start_paused = true)]
async fn grpc_callers_get_unavailable_with_a_pushback() {
    let mut h = harness(grpc());
    h.call_grpc(14).await;
    assert_eq!(h.layer.snapshot().state, State::Open);

    h.handle.allow(1);
    let response = h
        .service
        .ready()
        .await
        .unwrap()
        .call(grpc_call(""))
        .await
        .unwrap();
    assert!(response.body().is_local());
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(response.headers()["grpc-retry-pushback-ms"], "5000");
    assert_eq!(
        response.extensions().get::<Rejection>(),
        Some(&Rejection::BreakerOpen {
            retry_after: Some(5 * S)
        })
    );
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_exactly_the_probes_and_closes_when_all_succeed() {
    let mut h = harness(http().probes(3));
    h.open_it().await;
    advance(5 * S).await;

    // Three probes go through; a fourth call is refused while they are in flight.
    h.handle.allow(4);
    let mut probes = Vec::new();
    for _ in 0..3 {
        let future = h.service.ready().await.unwrap().call(get());
        let (_, send) = h.handle.next_request().await.unwrap();
        probes.push((task::spawn(future), send));
    }
    let snap = h.layer.snapshot();
    assert_eq!((snap.state, snap.probes_in_flight), (State::HalfOpen, 3));
    // No time to promise while probes are in flight: callers are told not to retry.
    assert_eq!(h.refused().await.retry_after(), None);

    for (i, (mut future, send)) in probes.into_iter().enumerate() {
        send.send_response(reply(200));
        assert_ready_ok!(future.poll());
        let want = if i < 2 {
            State::HalfOpen
        } else {
            State::Closed
        };
        assert_eq!(h.layer.snapshot().state, want);
    }
    let snap = h.layer.snapshot();
    assert_eq!(
        (snap.calls, snap.reopens),
        (0, 0),
        "closed with an empty window"
    );
    assert_eq!(h.call(200).await.unwrap(), 200);
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_reopens_for_twice_as_long_up_to_the_cap() {
    let mut h = harness(http().probes(2));
    h.open_it().await;
    let mut open = 5 * S;
    for reopens in 1..=8 {
        assert_eq!(h.refused().await.retry_after(), Some(open));
        advance(open - MS).await;
        h.refused().await;
        advance(MS).await;
        assert_eq!(
            h.call(503).await.unwrap(),
            503,
            "the probe reaches the dependency"
        );
        let snap = h.layer.snapshot();
        assert_eq!((snap.state, snap.reopens), (State::Open, reopens));
        open = (open * 2).min(300 * S);
    }
    assert_eq!(open, 300 * S);
}

#[tokio::test(start_paused = true)]
async fn open_time_is_jittered_and_reproducible_with_a_seed() {
    async fn open_times(seed: u64) -> Vec<Duration> {
        let mut h = harness(http().jitter(true).seed(seed).probes(1));
        h.open_it().await;
        let mut times = Vec::new();
        for _ in 0..6 {
            let wait = h.refused().await.retry_after().unwrap();
            times.push(wait);
            advance(wait).await;
            h.call(503).await.unwrap(); // the probe fails: re-open
        }
        times
    }
    let a = open_times(7).await;
    assert_eq!(a, open_times(7).await, "same seed, same open times");
    assert_ne!(a, open_times(8).await);
    let mut nominal = 5 * S;
    for t in &a {
        assert!(
            *t >= nominal / 2 && *t <= nominal,
            "{t:?} within [{:?}, {nominal:?}]",
            nominal / 2
        );
        nominal = (nominal * 2).min(300 * S);
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_admitted_while_closed_decides_nothing_later() {
    let mut h = harness(http().probes(1).slow_calls(S, 1.0));
    // A slow call admitted while closed.
    h.handle.allow(1);
    let late = h.service.ready().await.unwrap().call(get());
    let (_, late_send) = h.handle.next_request().await.unwrap();
    let mut late = task::spawn(late);
    assert_pending!(late.poll());

    h.open_it().await;
    advance(5 * S).await;
    // Half-open: one probe in flight.
    h.handle.allow(1);
    let probe = h.service.ready().await.unwrap().call(get());
    let (_, probe_send) = h.handle.next_request().await.unwrap();
    let mut probe = task::spawn(probe);

    // The old call ends now, slow and failed: it belongs to an old generation.
    late_send.send_response(reply(503));
    assert_ready_ok!(late.poll());
    assert_eq!(h.layer.snapshot().state, State::HalfOpen);

    probe_send.send_response(reply(200));
    assert_ready_ok!(probe.poll());
    assert_eq!(h.layer.snapshot().state, State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_probe_gives_its_slot_back() {
    let mut h = harness(http().probes(1));
    h.open_it().await;
    advance(5 * S).await;
    h.handle.allow(1);
    let probe = h.service.ready().await.unwrap().call(get());
    let _ = h.handle.next_request().await.unwrap();
    h.refused().await;
    drop(probe); // cancelled: records nothing
    let snap = h.layer.snapshot();
    assert_eq!((snap.state, snap.probes_in_flight), (State::HalfOpen, 0));
    assert_eq!(h.call(200).await.unwrap(), 200, "the slot is free again");
    assert_eq!(h.layer.snapshot().state, State::Closed);
}

#[tokio::test(start_paused = true)]
async fn an_ignored_probe_gives_its_slot_back() {
    let mut h = harness(http().probes(1));
    h.open_it().await;
    advance(5 * S).await;
    assert_eq!(h.call(404).await.unwrap(), 404);
    assert_eq!(h.layer.snapshot().state, State::HalfOpen);
    h.call(200).await.unwrap();
    assert_eq!(h.layer.snapshot().state, State::Closed);
}

#[tokio::test(start_paused = true)]
async fn slow_calls_open_the_breaker() {
    let mut h = harness(http().slow_calls(100 * MS, 0.5));
    for i in 0..4 {
        h.handle.allow(1);
        let future = h.service.ready().await.unwrap().call(get());
        let (_, send) = h.handle.next_request().await.unwrap();
        if i % 2 == 1 {
            advance(100 * MS).await;
        }
        send.send_response(reply(200));
        future.await.unwrap();
    }
    let snap = h.layer.snapshot();
    assert_eq!(snap.state, State::Open);
    assert_eq!(snap.slow_calls, 2);
    assert_eq!(snap.failures, 0);
}

#[tokio::test(start_paused = true)]
async fn calls_cancelled_after_the_slow_duration_count_as_slow() {
    let mut h = harness(http().slow_calls(100 * MS, 0.5));
    for i in 0..4 {
        h.handle.allow(1);
        let future = h.service.ready().await.unwrap().call(get());
        let _request = h.handle.next_request().await.unwrap();
        // The caller gives up (its deadline): before the slow duration, then after it.
        advance(if i % 2 == 0 { 50 * MS } else { 100 * MS }).await;
        drop(future);
    }
    let snap = h.layer.snapshot();
    assert_eq!(
        (snap.calls, snap.slow_calls),
        (2, 2),
        "early drops count as nothing"
    );
    // Two more abandoned after the slow duration: 4 of 4 slow, at the minimum: open.
    for _ in 0..2 {
        h.handle.allow(1);
        let future = h.service.ready().await.unwrap().call(get());
        let _request = h.handle.next_request().await.unwrap();
        advance(200 * MS).await;
        drop(future);
    }
    assert_eq!(h.layer.snapshot().state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn a_slow_probe_is_a_failed_probe() {
    let mut h = harness(http().probes(1).slow_calls(100 * MS, 1.0));
    h.open_it().await;
    advance(5 * S).await;
    h.handle.allow(1);
    let future = h.service.ready().await.unwrap().call(get());
    let (_, send) = h.handle.next_request().await.unwrap();
    advance(150 * MS).await;
    send.send_response(reply(200));
    future.await.unwrap();
    assert_eq!(h.layer.snapshot().state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn consecutive_failures_open_below_the_minimum() {
    let mut h = harness(
        http()
            .minimum_calls(100)
            .count_window(100)
            .consecutive_failures(3),
    );
    h.call(500).await.unwrap();
    h.call(500).await.unwrap();
    h.call(200).await.unwrap(); // resets the run
    h.call(500).await.unwrap();
    h.call(500).await.unwrap();
    assert_eq!(h.layer.snapshot().state, State::Closed);
    h.call(500).await.unwrap();
    assert_eq!(h.layer.snapshot().state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn failures_age_out_of_the_time_window() {
    let mut h = harness(http().time_window(10 * S, 10));
    for _ in 0..3 {
        h.call(500).await.unwrap();
    }
    advance(10 * S).await;
    // The three failures left the window: one more failure is 1 of 1, below the minimum.
    h.call(500).await.unwrap();
    let snap = h.layer.snapshot();
    assert_eq!((snap.state, snap.calls), (State::Closed, 1));
}

#[tokio::test(start_paused = true)]
async fn the_count_window_really_slides() {
    // tower-resilience's count window never slides: 1000 successes then need 1000 failures.
    let mut h = harness(http().count_window(10).minimum_calls(10));
    for _ in 0..1000 {
        h.call(200).await.unwrap();
    }
    for _ in 0..4 {
        h.call(500).await.unwrap();
    }
    assert_eq!(h.layer.snapshot().state, State::Closed);
    h.call(500).await.unwrap(); // 5 of the last 10
    assert_eq!(h.layer.snapshot().state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn manual_modes() {
    let mut h = harness(http());
    h.layer.set_mode(Mode::ForcedOpen);
    // Forced open has no end anyone can promise: callers are told not to retry.
    assert_eq!(h.refused().await.retry_after(), None);
    assert_eq!(h.layer.snapshot().mode, Mode::ForcedOpen);

    h.layer.set_mode(Mode::Disabled);
    for _ in 0..10 {
        h.call(503).await.unwrap();
    }
    let snap = h.layer.snapshot();
    assert_eq!(
        (snap.state, snap.calls),
        (State::Closed, 0),
        "disabled records nothing"
    );

    h.layer.set_mode(Mode::MetricsOnly);
    h.open_it().await;
    // Open, but metrics-only never refuses: calls still reach the dependency.
    assert_eq!(h.call(200).await.unwrap(), 200);
    assert_eq!(h.layer.snapshot().state, State::Open);

    h.layer.set_mode(Mode::Normal);
    h.refused().await;
    h.layer.reset();
    let snap = h.layer.snapshot();
    assert_eq!((snap.state, snap.calls), (State::Closed, 0));
    assert_eq!(h.call(200).await.unwrap(), 200);
}

#[tokio::test(start_paused = true)]
async fn the_hook_sees_every_transition_with_its_reason() {
    let seen: Arc<Mutex<Vec<Transition>>> = Arc::default();
    let sink = seen.clone();
    let mut h = harness(
        http()
            .probes(1)
            .on_state_change(move |t| sink.lock().unwrap().push(*t)),
    );
    h.open_it().await;
    advance(5 * S).await;
    h.call(503).await.unwrap();
    advance(10 * S).await;
    h.call(200).await.unwrap();
    h.layer.reset();
    let seen = seen.lock().unwrap();
    let path: Vec<_> = seen.iter().map(|t| (t.from, t.to)).collect();
    use State::*;
    assert_eq!(
        path,
        [
            (Closed, Open),
            (Open, HalfOpen),
            (HalfOpen, Open),
            (Open, HalfOpen),
            (HalfOpen, Closed),
            (Closed, Closed)
        ]
    );
    assert_eq!(
        seen[0].reason,
        Reason::FailureRate {
            rate: 1.0,
            calls: 4
        }
    );
    assert_eq!(seen[0].open_for, Some(5 * S));
    assert_eq!(seen[1].reason, Reason::OpenElapsed);
    assert_eq!(seen[2].reason, Reason::ProbeFailed);
    assert_eq!(seen[2].open_for, Some(10 * S));
    assert_eq!(seen[4].reason, Reason::ProbesSucceeded);
    assert_eq!(seen[5].reason, Reason::Reset);
    let generations: Vec<_> = seen.iter().map(|t| t.generation).collect();
    assert_eq!(generations, [1, 2, 3, 4, 5, 6]);
}

#[tokio::test(start_paused = true)]
async fn slow_start_admits_a_rising_share() {
    let mut h = harness(http().probes(1).slow_start(10 * S));
    h.open_it().await;
    advance(5 * S).await;
    h.call(200).await.unwrap();
    assert_eq!(h.layer.snapshot().state, State::Closed);

    async fn admitted(h: &mut Harness<HttpClassifier>, n: usize) -> usize {
        let mut passed = 0;
        for _ in 0..n {
            h.handle.allow(1);
            let mut future = task::spawn(h.service.ready().await.unwrap().call(get()));
            match future.poll() {
                std::task::Poll::Ready(result) => {
                    let err = result.unwrap_err();
                    assert!(err.downcast_ref::<BreakerOpen>().is_some());
                }
                std::task::Poll::Pending => {
                    let (_, send) = h.handle.next_request().await.unwrap();
                    send.send_response(reply(200));
                    future.await.unwrap();
                    passed += 1;
                }
            }
        }
        passed
    }
    let start = admitted(&mut h, 100).await;
    assert!(
        (9..=11).contains(&start),
        "{start} of 100 at the start of the ramp"
    );
    advance(5 * S).await;
    let middle = admitted(&mut h, 100).await;
    assert!((54..=56).contains(&middle), "{middle} of 100 half way");
    advance(5 * S).await;
    assert_eq!(admitted(&mut h, 100).await, 100);
}

#[tokio::test(start_paused = true)]
async fn grpc_outcomes_in_trailers_are_recorded_at_the_end_of_the_body() {
    let layer = BreakerConfig::new(GrpcClassifier::new())
        .minimum_calls(2)
        .jitter(false)
        .build()
        .unwrap();
    let (mock, mut handle) = mock::pair::<Request<String>, Response<Streamed>>();
    let mut service = layer.clone().layer(mock);

    // A streamed response whose trailers say UNAVAILABLE: a failure, known at the end.
    for recorded in 0..2 {
        let (response, mut tx) = committed(&mut service, &mut handle).await;
        assert_eq!(
            layer.snapshot().calls,
            recorded,
            "not decided by the headers"
        );
        tx.send_data(Bytes::from_static(b"msg")).await.unwrap();
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("14"));
        tx.send_trailers(trailers).await.unwrap();
        drop(tx);
        let collected = response.into_body().collect().await.unwrap();
        assert!(collected.trailers().is_some());
    }
    assert_eq!(layer.snapshot().state, State::Open);

    // A body dropped before its end counts as nothing.
    layer.reset();
    let (response, _tx) = committed(&mut service, &mut handle).await;
    drop(response);
    assert_eq!(layer.snapshot().calls, 0);

    // Defect: a stream that ended without trailers counted as a success; gRPC treats a
    // missing status as an error.
    for _ in 0..2 {
        let (response, mut tx) = committed(&mut service, &mut handle).await;
        tx.send_data(Bytes::from_static(b"msg")).await.unwrap();
        drop(tx);
        response.into_body().collect().await.unwrap();
    }
    let snapshot = layer.snapshot();
    assert_eq!((snapshot.calls, snapshot.state), (2, State::Open));
}

type Streamed = http_body_util::channel::Channel<Bytes, std::convert::Infallible>;

/// One gRPC call through `service` answered with headers but no status (committed, its
/// outcome to come in trailers): the response the caller got, and the sender of its body.
async fn committed<S>(
    service: &mut S,
    handle: &mut mock::Handle<Request<String>, Response<Streamed>>,
) -> (
    S::Response,
    http_body_util::channel::Sender<Bytes, std::convert::Infallible>,
)
where
    S: tower::Service<Request<String>>,
    S::Error: std::fmt::Debug,
{
    handle.allow(1);
    let future = service.ready().await.unwrap().call(grpc_call(""));
    let (_, send) = handle.next_request().await.unwrap();
    let (tx, body) = Streamed::new(4);
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    send.send_response(response);
    (future.await.unwrap(), tx)
}

#[tokio::test(start_paused = true)]
async fn clones_share_one_breaker_and_memory_is_fixed() {
    let mut h = harness(http());
    let before = h.layer.snapshot().shared_bytes;
    let (mock, mut other_handle) = mock::pair::<Request<String>, Response<String>>();
    let mut other = h.layer.clone().layer(mock);
    for _ in 0..2 {
        h.call(503).await.unwrap();
        other_handle.allow(1);
        let future = other.ready().await.unwrap().call(get());
        let (_, send) = other_handle.next_request().await.unwrap();
        send.send_response(reply(503));
        future.await.unwrap();
    }
    assert_eq!(h.layer.snapshot().state, State::Open);
    for _ in 0..10_000 {
        h.layer.snapshot();
    }
    assert_eq!(h.layer.snapshot().shared_bytes, before);
    // A word per bucket per core (at most 16 cores) plus a few words: a few KiB at most.
    assert!(before < 8 * 1024, "{before} bytes of shared state");
}

/// The HTTP classifier, with a rate limit (429) called a failure.
#[derive(Debug, Clone)]
struct ThrottledFails(HttpClassifier);

impl<B> backstop::Classify<Response<B>> for ThrottledFails {
    fn classify(
        &self,
        result: Result<&Response<B>, &(dyn std::error::Error + 'static)>,
    ) -> backstop::Outcome {
        match self.0.classify(result) {
            backstop::Outcome::Throttled { retryable, .. } => backstop::Outcome::failure(retryable),
            outcome => outcome,
        }
    }
}
