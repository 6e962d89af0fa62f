//! The per-attempt timeout that sits inside the breaker, so a timed-out attempt is a failure
//! the breaker counts (a timeout outside it would cancel the call, which counts as nothing),
//! and the latency model it feeds.
//!
//! # How the bound is picked
//!
//! [`AttemptBound::Adaptive`] (the presets' default): `clamp(p99 × 3, floor, ceiling)` from
//! the dependency's own [latency model](crate::latency), re-read at
//! most every 100 ms, where the floor follows the model too, `clamp(p99 × 20, 250 ms, 1 s)`
//! (20 and 250 ms fixed, [`Adaptive::floor`] a knob), and the ceiling is
//! 10 s by default; never more than 80 % of what is left of the
//! request's deadline (fixed; the lab chose 0.8, see BENCHMARKS.md): an attempt to a dependency slower than
//! its callers' deadlines then times out before the deadline, a failure the breaker counts,
//! where an expired deadline (the caller's own) would count as nothing. The share is kept
//! only where a retry may follow: an attempt marked final (the retry layer marks a
//! call it sends once, its last attempt and last hedge by count, and every attempt of a request
//! whose timeouts its policy would not retry, such as a gRPC call or a POST without an
//! idempotency key) may take the whole deadline, as gRPC's own clients give a single-attempt
//! call; so may an attempt whose share would leave less than a retry needs: the retry layer's
//! least wait (which the presets take from their backoff and deadline offset when they build
//! the stack; zero for a layer used alone) and then the model's median call (the upper edge of its p50 bucket,
//! what the presets' retry reserve asks for). No retry could finish in that room, and the
//! reserve would refuse to send one: with p50 ≈ 1 s and a 1.3 s deadline the first attempt
//! gets all 1.3 s. A model not trusted (cold, or emptied by an idle spell) has no median, and
//! the reserve then asks for none: the least wait alone decides, as it decides whether the
//! retry layer sends a retry (a cold preset with a 100 ms deadline: the share would leave
//! 20 ms, less than its 25 ms backoff, so the first attempt gets all 100 ms). Until the model
//! first holds 100 samples (the first seconds of traffic), the `ceiling` applies.
//!
//! # Trust decays, it is not discarded
//!
//! An idle spell empties the model's window (its samples count for 30 to 45 s), but a quiet
//! minute says nothing new about the dependency: the bound then comes from the samples the
//! model still holds, however old (the [latency model](crate::latency)'s aged quantile),
//! doubled for every minute since they left the window, and clamped as
//! usual: 60 ms for a 20 ms dependency becomes 85 ms after 30 s of silence past the window,
//! 120 ms after a minute, the 10 s ceiling after about nine. Once traffic is back and the
//! window holds 100 samples again, the bound is the fresh one. Before, one POST's
//! `grpc-timeout` flipped between `1590m` and the ceiling after 30 to 45 s without calls.
//!
//! Why p99 × 3: the timeout's job is to cut attempts that will not answer, without cutting
//! the slow tail of attempts that would. At p99 × 3 an attempt is cut only when it is three
//! times slower than all but 1 % of recent calls, so false timeouts stay well under 1 % even
//! when latency doubles between two reads of the model, while a dependency that stops
//! answering is cut after a few of its usual round trips. Timed-out attempts are recorded at
//! their bound (censored), so a dependency that slows down raises the bound within the model's
//! window instead of the timeout spiralling down. So are attempts dropped before they ended (a
//! hedge's loser, a call its caller gave up on), at the time they ran: each took at least that
//! long. Measured hedging needs them: recording only the winners of hedged calls, the model
//! sees the tail shorter than it is and hedges too early. Quantiles up to the hedge delay read
//! right; above it, where a censored sample says only "at least", they read low.
//!
//! Why a floor, and why it follows the model: a latency *step* of more than 3× looks, at
//! first, exactly like a hang. With a bound of p99 × 3 of a fast dependency (say 30 ms),
//! every call is cut the moment its latency steps to 200 ms, and the breaker, which counts
//! timeouts as failures (20 in a row open the presets' breaker, 20 ms of traffic at 1000
//! requests/s), opens long before the censored samples have raised the bound. So the bound
//! is never less than the floor, which absorbs a step of up to 20 times the measured p99, and
//! never less than 250 ms (a step to 250 ms, from however fast). A fixed floor of 1 s cut a
//! 20 ms dependency's hang after 1 s per attempt; the measured floor cuts it after 400 ms
//! (and a 10 ms dependency's after 250 ms). The floor never goes above 1 s, so a dependency
//! whose p99 is 50 ms or more keeps the floor of 1 s it had, and a dependency whose p99 is
//! above 333 ms is bounded by p99 × 3 alone (the storm lab's `hang`, `brownout` and `drift`
//! scenarios chose these numbers; BENCHMARKS.md has the runs). Lower the floor (`floor`, which caps the measured one) for a dependency
//! whose latency you know to be steady.
//!
//! # A model per key, keyed as the breaker is
//!
//! A layer keeps one model for every call it bounds unless it is keyed
//! ([`AttemptTimeoutLayer::per_key`], with the [`RouteKey`](crate::RouteKey) a keyed
//! breaker uses; the client presets key their attempt layer so, when the stack is built, as
//! soon as their breaker is keyed). Then each key has its own model, built empty from the
//! layer's (same bound, window and name), so a rare slow route among fast ones is bounded by
//! its own latency, not cut at the bound the fast routes set (the storm lab's `routes`
//! scenario: a `/report` taking 2 s among 10 ms routes). The rules:
//!
//! - **A key whose model is not trusted yet** (fewer than 100 samples in its window) gets the
//!   cold-start bound, the ceiling capped by the deadline's share, and no hedge delay or retry
//!   reserve: never the bound, delay or reserve of other keys, which would be the bug again.
//!   Once its samples leave the window, its bound decays from them as below.
//! - **Requests without a key**, and new keys while the table is full, use the layer's own
//!   model (the overflow), as a keyed breaker's overflow breaker takes them.
//! - **The table is bounded**: at most `max_keys` models (about 4 KiB each). A key is evicted
//!   only to make room for a new one, the one idle longest, and only once it has gone
//!   30 min (fixed) without a call: by then its aged bound is the ceiling and its delays
//!   are `None`, what a fresh model gives, so evicting it changes no bound. The breaker evicts
//!   an idle key after 5 min; a rare route's model would lose its aged samples too early at
//!   that pace.
//! - **Hedge delays and retry reserves follow the key**: the retry layer reads them per
//!   request ([`HedgeDelay::delay_for`](crate::client::retry::hedge::HedgeDelay::delay_for),
//!   [`RetryReserve::reserve_for`](crate::client::retry::RetryReserve::reserve_for), with the
//!   request's method and URI), and a [`MeasuredDelay`] of a keyed layer answers from the
//!   request's key's model; otherwise `/report` would be hedged at the fast routes' p95. No
//!   per-request state passes between the layers: the key is a function of the request.
//!
//! # Concurrency rule
//!
//! Clones of one layer share one model and one cached bound (an atomic word, refreshed by
//! whichever attempt finds it stale; racing refreshes write the same value); a keyed layer's
//! clones share its table of per-key models, read without a lock (`arc-swap`) and grown under
//! a mutex (a loom model checks an add and an eviction racing a lookup). Each attempt
//! holds its core's handle to them (`backstop::rt::stripe`), so no reference count is
//! shared across cores. An attempt's bound is picked at the call (one clock read), so its
//! end is known to the layers inside; an attempt answered on its first poll records nothing
//! (it took no measurable time) and arms no timer; every other attempt reads the clock when
//! it first waits and when it ends (or is dropped).
//!
//! # The attempt's end, told to the layers inside
//!
//! Each bounded attempt tells the layers between it and the transport when it ends: in
//! `grpc-timeout` where this layer writes the header, and always as the request's
//! [`Deadline`](crate::deadline::Deadline) extension, moved up to the attempt's end when that comes
//! first (added when the call has no deadline). For those layers the attempt's end is the
//! deadline: a layer of yours that writes a third-party API's own deadline header says the
//! attempt's bound, and `SemconvLayer` records an attempt the bound dropped as
//! timed out, with a deadline or without one, whether or not `grpc-timeout` is sent. A call
//! without a deadline pays for the extension (an allocation).

mod config;
mod future;
mod keyed;
mod layer;
#[cfg(test)]
mod model_tests;
mod service;
mod shared;

pub use config::{Adaptive, AttemptBound};
pub(crate) use future::AttemptTimeoutFuture;
pub use layer::{AttemptTimeoutLayer, MeasuredDelay};
pub use service::AttemptTimeout;

#[cfg(test)]
mod tests {
    use super::*;
    use shared::three_digits;
    use std::time::Duration;

    #[test]
    fn every_knob_is_validated_by_name() {
        let a = Adaptive::new;
        for (bound, knob) in [
            (AttemptBound::Fixed(Duration::ZERO), "attempt_timeout"),
            (AttemptBound::Adaptive(a().quantile(0.3)), "quantile"),
            (AttemptBound::Adaptive(a().quantile(1.0)), "quantile"),
            (AttemptBound::Adaptive(a().multiplier(0.9)), "multiplier"),
            (
                AttemptBound::Adaptive(a().multiplier(f64::NAN)),
                "multiplier",
            ),
            (AttemptBound::Adaptive(a().floor(Duration::ZERO)), "floor"),
            (
                AttemptBound::Adaptive(a().deadline_share(0.0)),
                "deadline_share",
            ),
            (
                AttemptBound::Adaptive(a().deadline_share(1.5)),
                "deadline_share",
            ),
            (
                AttemptBound::Adaptive(
                    a().floor(Duration::from_secs(2))
                        .ceiling(Duration::from_secs(1)),
                ),
                "ceiling",
            ),
        ] {
            let err = AttemptTimeoutLayer::new(bound).unwrap_err();
            assert_eq!(err.knob(), knob, "{bound:?}");
        }
        assert!(AttemptTimeoutLayer::new(AttemptBound::Adaptive(a())).is_ok());
        assert!(AttemptTimeoutLayer::new(AttemptBound::None).is_ok());
    }

    #[test]
    fn shares_are_rounded_down_to_three_digits() {
        let us = Duration::from_micros;
        assert_eq!(three_digits(us(799_987)), us(799_000));
        assert_eq!(three_digits(us(999)), us(999));
        assert_eq!(three_digits(us(1_234_567)), us(1_230_000));
        assert_eq!(three_digits(us(0)), us(0));
        for n in [1u64, 7, 1_000, 123_456, 987_654_321] {
            let d = three_digits(us(n));
            assert!(
                d <= us(n) && d.as_micros() as f64 >= n as f64 * 0.99 - 1.0,
                "{n}"
            );
        }
    }

    /// A quantile read from a trusted model (age zero).
    fn fresh(ms: u64) -> Option<(Duration, Duration)> {
        Some((Duration::from_millis(ms), Duration::ZERO))
    }

    #[test]
    fn the_bound_is_clamped_and_the_ceiling_applies_until_trusted() {
        let a = Adaptive::new();
        assert_eq!(a.bound(None), Duration::from_secs(10));
        // The floor: p99 × 20, from 250 ms to 1 s.
        assert_eq!(a.bound(fresh(1)), Duration::from_millis(250));
        assert_eq!(a.bound(fresh(10)), Duration::from_millis(250));
        assert_eq!(a.bound(fresh(20)), Duration::from_millis(400));
        assert_eq!(a.bound(fresh(50)), Duration::from_secs(1));
        assert_eq!(a.bound(fresh(200)), Duration::from_secs(1));
        assert_eq!(a.bound(fresh(500)), Duration::from_millis(1500));
        // A floor below 250 ms wins.
        let low = a.floor(Duration::from_millis(10));
        assert_eq!(low.bound(fresh(1)), Duration::from_millis(10));
        assert_eq!(low.bound(fresh(50)), Duration::from_millis(150));
        assert_eq!(a.bound(fresh(60_000)), Duration::from_secs(10));
    }

    /// Issue 25, 4: a stale quantile doubles every minute of age on its way to the ceiling.
    #[test]
    fn a_stale_bound_widens_with_its_age_up_to_the_ceiling() {
        let low = Adaptive::new().floor(Duration::from_millis(10));
        let aged = |ms, s| Some((Duration::from_millis(ms), Duration::from_secs(s)));
        assert_eq!(low.bound(aged(20, 0)), Duration::from_millis(60));
        assert_eq!(low.bound(aged(20, 60)), Duration::from_millis(120));
        assert_eq!(low.bound(aged(20, 180)), Duration::from_millis(480));
        let half = low.bound(aged(20, 30));
        assert!(
            half.abs_diff(Duration::from_micros(84_853)) < Duration::from_micros(2),
            "{half:?}"
        );
        assert_eq!(low.bound(aged(20, 600)), Duration::from_secs(10));
        assert_eq!(low.bound(aged(20, 1_200)), Duration::from_secs(10));
        assert_eq!(low.bound(aged(20, u64::MAX / 4)), Duration::from_secs(10));
        // The default floor follows the widened quantile: 40 ms × 20.
        assert_eq!(
            Adaptive::new().bound(aged(20, 60)),
            Duration::from_millis(800)
        );
    }
}
