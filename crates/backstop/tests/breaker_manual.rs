//! The breaker used without tower: `BreakerLayer::try_acquire` and its `CallPermit`, under the
//! same rules as the `Breaker` service (paused time, so the open time is exact).

use backstop::client::breaker::{BreakerConfig, BreakerLayer, Mode, State};
use backstop::{HttpClassifier, Outcome, Retryable, ServerHint};
use std::time::Duration;

/// A breaker that opens after 4 failures out of 4 calls (count window of 10), for 5 s
/// (jitter aside: at most 5 s), with 2 probes.
fn breaker() -> BreakerLayer<HttpClassifier> {
    BreakerConfig::http()
        .count_window(10)
        .minimum_calls(4)
        .probes(2)
        .open_duration(Duration::from_secs(5), Duration::from_secs(60))
        .build()
        .unwrap()
}

fn fail(breaker: &BreakerLayer<HttpClassifier>, n: usize) {
    for _ in 0..n {
        breaker.try_acquire().expect("admitted").failure();
    }
}

#[tokio::test(start_paused = true)]
async fn outcomes_open_the_breaker_and_an_open_one_refuses_with_its_time_left() {
    let breaker = breaker();
    breaker.try_acquire().unwrap().success();
    fail(&breaker, 2);
    assert_eq!(breaker.snapshot().state, State::Closed);
    assert_eq!(
        (breaker.snapshot().calls, breaker.snapshot().failures),
        (3, 2)
    );
    fail(&breaker, 1);
    // 3 failures out of 4 calls, above the 50 % rate with the minimum reached.
    assert_eq!(breaker.snapshot().state, State::Open);
    let refused = breaker.try_acquire().unwrap_err();
    let left = refused
        .retry_after()
        .expect("an open breaker says for how long");
    assert!(left <= Duration::from_secs(5) && left >= Duration::from_millis(2500));
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_the_probes_only_and_their_successes_close_it() {
    let breaker = breaker();
    fail(&breaker, 4);
    assert_eq!(breaker.snapshot().state, State::Open);
    tokio::time::advance(Duration::from_secs(5)).await;
    let first = breaker.try_acquire().expect("a probe");
    let second = breaker.try_acquire().expect("a second probe");
    assert_eq!(breaker.snapshot().state, State::HalfOpen);
    // Every slot taken: refused, with no time promised.
    assert_eq!(breaker.try_acquire().unwrap_err().retry_after(), None);
    first.success();
    assert_eq!(breaker.snapshot().state, State::HalfOpen);
    second.success();
    assert_eq!(breaker.snapshot().state, State::Closed);
    assert!(breaker.try_acquire().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_permit_gives_its_probe_slot_back_and_a_failed_probe_reopens() {
    let breaker = breaker();
    fail(&breaker, 4);
    tokio::time::advance(Duration::from_secs(5)).await;
    let first = breaker.try_acquire().unwrap();
    let second = breaker.try_acquire().unwrap();
    assert!(breaker.try_acquire().is_err());
    // Cancelled: the slot is free again, and nothing was decided.
    drop(first);
    assert_eq!(breaker.snapshot().state, State::HalfOpen);
    let third = breaker.try_acquire().expect("the slot given back");
    third.record(Outcome::Ignored);
    assert_eq!(breaker.snapshot().state, State::HalfOpen);
    second.failure();
    assert_eq!(breaker.snapshot().state, State::Open);
    assert_eq!(breaker.snapshot().reopens, 1);
}

#[tokio::test(start_paused = true)]
async fn throttled_and_ignored_outcomes_count_as_the_service_counts_them() {
    let breaker = breaker();
    let throttled = Outcome::Throttled {
        retryable: Retryable::Always,
        hint: Some(ServerHint::RetryAfter(Duration::from_secs(1))),
    };
    for _ in 0..6 {
        breaker.try_acquire().unwrap().record(throttled);
        breaker.try_acquire().unwrap().record(Outcome::Ignored);
        breaker.try_acquire().unwrap().record(Outcome::Rejected);
    }
    assert_eq!(breaker.snapshot().state, State::Closed);
    assert_eq!(breaker.snapshot().calls, 0);

    // A caller who wants a rate limit counted records it as the failure it means to them.
    let counting = BreakerConfig::http()
        .count_window(10)
        .minimum_calls(4)
        .build()
        .unwrap();
    for _ in 0..4 {
        counting
            .try_acquire()
            .unwrap()
            .record(Outcome::failure(Retryable::Always));
    }
    assert_eq!(counting.snapshot().state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn modes_apply_to_permits_too() {
    let breaker = breaker();
    breaker.set_mode(Mode::ForcedOpen);
    assert!(breaker.try_acquire().is_err());
    breaker.set_mode(Mode::Disabled);
    fail(&breaker, 10);
    assert_eq!(breaker.snapshot().state, State::Closed);
    assert_eq!(breaker.snapshot().calls, 0);
    breaker.set_mode(Mode::MetricsOnly);
    fail(&breaker, 4);
    // Open by its counts, yet letting every call through.
    assert_eq!(breaker.snapshot().state, State::Open);
    assert!(breaker.try_acquire().is_ok());
}

/// Permits and the service share one breaker: failures recorded by hand open it for the
/// service's calls too.
#[tokio::test(start_paused = true)]
async fn permits_and_the_service_share_one_breaker() {
    use tower::{Layer, ServiceExt, service_fn};
    let breaker = breaker();
    let service = breaker.layer(service_fn(|_req: http::Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    }));
    fail(&breaker, 4);
    let err = service
        .oneshot(http::Request::new(String::new()))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "circuit breaker open");
}
