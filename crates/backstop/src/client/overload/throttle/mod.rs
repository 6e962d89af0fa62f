//! Adaptive throttling of first attempts: the client refuses, locally, a share of the calls
//! the dependency has lately been refusing anyway.
//!
//! # Why
//!
//! A retry budget bounds *retries*; an overloaded dependency (slow and partly failing, not
//! down) still receives every first attempt, spends work on each, and refusing them costs it
//! nearly as much as serving them. Google's SRE book ("Handling Overload", client-side
//! throttling) lets each client measure, over a sliding window, the `requests` it made and
//! the `accepts` the dependency answered, and refuse a new call locally with probability
//!
//! ```text
//! p = max(0, (requests − K × accepts) / (requests + 1))
//! ```
//!
//! With `K = 2` (the default) a client refuses nothing while the dependency accepts at
//! least half of its calls, and then lets it see about `K ×` what it accepts: enough to
//! notice it recover, never the whole surge. From Envoy's admission control it keeps a
//! maximum rejection probability (a knob) and a minimum request rate below which nothing is
//! refused (fixed at one request a second over the window: a client with a few calls in
//! flight and little history would otherwise count its pending calls as refusals). Envoy's
//! aggression exponent and accept predicate were knobs once and are gone: `K` says how
//! eager the throttle is, and what counts as accepted is the rule below.
//!
//! # Semantics
//!
//! - **Counts.** Every call through the [`ThrottleLayer`] is a request (refused ones too, as
//!   the SRE rule says), counted when it ends: a refusal at once, a sent call when its outcome
//!   is known, with its accept (counted when sent, the calls in flight would read as refused:
//!   a dependency answering in 1 s at 100 calls a second would show 100 requests and no
//!   accept for its first second, and be throttled); a call whose result is an accepted
//!   outcome is an accept (the dependency answered:
//!   [`Outcome::Success`] and [`Outcome::Ignored`], i.e. the dependency answered, a caller
//!   error included; a gRPC stream whose status is in its trailers counts as accepted when
//!   its headers arrive: the server took it). A call dropped before its answer is a request
//!   without an accept if its deadline (the request's `Deadline` extension, which the
//!   deadline layer outside puts there, else the current one) had passed: the dependency did
//!   not answer in time. Dropped earlier, or without a deadline, it counts as nothing: a lost
//!   race, a `select!` or a hedge let go of says nothing about the dependency. A call a circuit breaker inside refused
//!   ([`BreakerOpen`](crate::BreakerOpen), or a gRPC response carrying
//!   [`Rejection::BreakerOpen`](crate::Rejection)) is counted as accepted, whatever
//!   the accept rule says: the dependency never saw it, and the breaker already stands
//!   between it and the callers. Counted as refused, an outage would fill the window with
//!   refusals, and the throttle would go on refusing most calls for a window's length after
//!   the breaker closed; counted as
//!   accepted, the throttle acts on what the dependency itself answers: overload, which
//!   the breaker (opening on a dependency that is down) does not see. The same holds for a
//!   call the presets' adaptive limit refused inside ([`BulkheadFull`](crate::BulkheadFull),
//!   or [`Rejection::BulkheadFull`](crate::Rejection)): the limit stands between the
//!   dependency and the callers for overload, and counted as refused, its refusals would keep
//!   the throttle refusing for a window's length after the overload ended. The rule is one:
//!   a call refused before it was sent (an open breaker, a full bulkhead or limit, another
//!   throttle inside) is accepted; the adaptive limit leaves the same calls out of what it
//!   measures.
//! - **Window.** 30 s (fixed) in 30 time buckets, a striped
//!   ring: an old bucket is forgotten whole as the window slides.
//! - **Recovery.** Refusals count as requests, so once the dependency answers every call
//!   again the probability p falls by the rule's own step, to about 1 − K × (1 − p) per
//!   window: from 0.9 with `K` = 2, to 0.8, 0.6, 0.2, then 0, a few window lengths (about
//!   two minutes). A larger `K` lets go sooner.
//! - **Decision.** The probability is recomputed at most once per bucket / 10 (100 ms at
//!   the defaults) and cached, from the calls before it; each call then draws against it (a seeded draw with
//!   [`AdaptiveThrottleBuilder::seed`], for tests).
//! - **What the caller sees.** A refused call is never sent: an HTTP caller gets a
//!   [`ClientThrottled`](crate::ClientThrottled) error inside a
//!   [`RetryError`](crate::client::retry::RetryError) whose [`CallInfo`](crate::client::retry::CallInfo) says 0 attempts,
//!   given up for [`GiveUp::Throttled`](crate::client::retry::GiveUp::Throttled); a gRPC caller gets
//!   UNAVAILABLE "throttled by client" with `grpc-retry-pushback-ms: -1` (trailers-only)
//!   carrying the same `CallInfo`. Classifiers report it as
//!   [`Outcome::Rejected`]: never retried, never a
//!   breaker failure. Metrics: `backstop.throttle.rejections` and
//!   `backstop.throttle.probability`.
//!
//! # Ordering
//!
//! Outside the retry layer (`PropagateDeadline → Throttle → Retry → …`): it gates first
//! attempts only, so the retry budget keeps governing retries, and a throttled call costs
//! no body buffering and no retry state.
//!
//! # Concurrency rule
//!
//! Clones of a layer, and every layer given the same `Arc<AdaptiveThrottle>`, share one
//! window. Counting is one compare-and-swap on the caller's stripe of a time-tagged slot
//! (a ring: a write never moves between buckets, an old bucket is never read back); the
//! cached probability is one word per tick (an atomic maximum, so a thread
//! that recomputed from an older tick never overwrites a newer value; model-checked in
//! core). A reader racing writers sees some of them: the probability is
//! an estimate from counts that are each exact, and no bound depends on a racing write.

mod future;
mod layer;
mod service;

pub(crate) use future::ThrottleFuture;
pub use layer::ThrottleLayer;
pub use service::Throttle;

use crate::rt::stripe;
use crate::rt::stripe::Ring;
use crate::rt::tick::TickCache;
use crate::{ConfigError, Outcome};
#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// Ticks of the cached probability per bucket.
const TICKS_PER_BUCKET: u64 = 10;

/// The accepted outcomes: the dependency answered ([`Outcome::Success`], or
/// [`Outcome::Ignored`], a caller error such as HTTP 4xx).
pub(crate) fn answered(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Success | Outcome::Ignored)
}

/// The shared state of an adaptive throttle: a sliding window of requests and accepts, and
/// the rejection probability they give. See the [module docs](self).
///
/// ```
/// use backstop::client::overload::throttle::AdaptiveThrottle;
///
/// let throttle = AdaptiveThrottle::builder().k(2.0).seed(1).build().unwrap();
/// // 100 calls, 10 accepted: p = (100 − 2 × 10) / 101.
/// for i in 0..100 {
///     throttle.record_request();
///     if i % 10 == 0 {
///         throttle.record_accept();
///     }
/// }
/// assert!((throttle.probability() - 80.0 / 101.0).abs() < 1e-6);
/// ```
#[derive(Debug)]
pub struct AdaptiveThrottle {
    start: Instant,
    bucket_nanos: u64,
    buckets: u64,
    tick_nanos: u64,
    k: f64,
    max_probability: f64,
    min_requests: f64,
    accept: fn(&Outcome) -> bool,
    seed: Option<u64>,
    sequence: AtomicU64,
    requests: Ring<32>,
    accepts: Ring<32>,
    /// The probability × `u32::MAX`, per tick.
    cached: TickCache,
    rejections: AtomicU64,
    /// `backstop.throttle.probability` of every layer that refused a call through this
    /// throttle (one per named layer sharing it): set at each recompute from then on, so it
    /// falls back when refusals stop. A lock, taken only there (at most once a tick) and when
    /// a layer first refuses.
    #[cfg(feature = "metrics")]
    gauges: std::sync::Mutex<Vec<metrics::Gauge>>,
}

/// Below this many requests a second over the window nothing is refused (fixed: a knob once):
/// a client with a few calls in flight and little history would otherwise count its pending
/// calls as refusals; 1 a second is 30 requests in the default window.
const MIN_RPS: f64 = 1.0;

/// The sliding window the throttle measures over (fixed: a knob once). 30 s is long enough
/// that a few quiet seconds do not reset what the throttle learnt of an overload, and short
/// enough that it lets go within about two minutes of a recovery (see the module docs); the
/// lever a user has on how hard it throttles is `K` ([`AdaptiveThrottleBuilder::k`]) and
/// the cap ([`AdaptiveThrottleBuilder::max_probability`]).
const WINDOW: Duration = Duration::from_secs(30);

/// Builds an [`AdaptiveThrottle`]: setters take any value, [`build`](Self::build) checks.
#[derive(Debug, Clone)]
pub struct AdaptiveThrottleBuilder {
    k: f64,
    max_probability: f64,
    window: Duration,
    buckets: u32,
    accept: fn(&Outcome) -> bool,
    seed: Option<u64>,
}

impl AdaptiveThrottle {
    /// A throttle with the defaults: `K` = 2, at most 90 % refused, acting from
    /// 1 request a second, a 30 s window in 30 buckets, successes and caller errors accepted.
    pub fn new() -> Self {
        Self::builder().build().expect("the defaults are valid")
    }

    /// A builder for a tuned throttle.
    pub fn builder() -> AdaptiveThrottleBuilder {
        AdaptiveThrottleBuilder {
            k: 2.0,
            max_probability: 0.9,
            window: WINDOW,
            buckets: 30,
            accept: answered,
            seed: None,
        }
    }

    fn nanos(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.start);
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Counts a request (every call, refused or not).
    pub fn record_request(&self) {
        self.request_at(self.nanos());
    }

    /// Counts an accept (a call the dependency accepted).
    pub fn record_accept(&self) {
        self.accept_at(self.nanos());
    }

    /// Whether `outcome` counts as accepted.
    pub fn accepts(&self, outcome: &Outcome) -> bool {
        (self.accept)(outcome)
    }

    /// The rejection probability now (recomputed from the window).
    pub fn probability(&self) -> f64 {
        self.compute(self.nanos() / self.bucket_nanos)
    }

    /// Requests and accepts in the window now.
    pub fn window_counts(&self) -> (u64, u64) {
        let epoch = self.nanos() / self.bucket_nanos;
        (
            self.sum(&self.requests, epoch),
            self.sum(&self.accepts, epoch),
        )
    }

    /// Calls refused so far.
    pub fn rejections(&self) -> u64 {
        self.rejections.load(Ordering::Relaxed)
    }

    /// Whether to refuse a call: `true` to refuse (the refusal counted as a request).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn admit_request(&self) -> bool {
        self.admit().is_none()
    }

    /// Decides a call: `None` to refuse it (the refusal is counted as a request), or the
    /// instant it was let through, to count it when its outcome is known
    /// ([`sent_ended`](Self::sent_ended), with its accept), so calls in flight never read as
    /// refused. Counted in the bucket of that instant, the call reads no clock at its end.
    pub(crate) fn admit(&self) -> Option<u64> {
        let nanos = self.nanos();
        // Decided on the window before this call.
        let p = self.cached_probability(nanos);
        if p == 0 {
            return Some(nanos);
        }
        let draw = match self.seed {
            Some(seed) => {
                let n = self.sequence.fetch_add(1, Ordering::Relaxed);
                crate::rt::mix::splitmix(seed, n) as u32
            }
            None => fastrand::u32(..),
        };
        if draw < p {
            self.request_at(nanos);
            self.rejections.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(nanos)
    }

    /// A call let through at `sent` (from [`admit`](Self::admit)) ended: a request, and an
    /// accept when `accepted`.
    pub(crate) fn sent_ended(&self, sent: u64, accepted: bool) {
        self.request_at(sent);
        if accepted {
            self.accept_at(sent);
        }
    }

    fn request_at(&self, nanos: u64) {
        let epoch = nanos / self.bucket_nanos;
        let _ = self.requests.update(stripe::index(), epoch, |n| {
            Some((n + 1).min(u64::from(u32::MAX)))
        });
    }

    fn accept_at(&self, nanos: u64) {
        let epoch = nanos / self.bucket_nanos;
        let _ = self.accepts.update(stripe::index(), epoch, |n| {
            Some((n + 1).min(u64::from(u32::MAX)))
        });
    }

    fn sum(&self, ring: &Ring<32>, epoch: u64) -> u64 {
        ring.fold(epoch, self.buckets, true, 0u64, u64::saturating_add)
    }

    /// The probability from the window's counts at `epoch`.
    fn compute(&self, epoch: u64) -> f64 {
        let requests = self.sum(&self.requests, epoch) as f64;
        let accepts = self.sum(&self.accepts, epoch) as f64;
        probability(
            requests,
            accepts,
            self.k,
            self.max_probability,
            self.min_requests,
        )
    }

    /// The cached probability as a fraction of `u32::MAX`, recomputed once per tick.
    #[inline]
    fn cached_probability(&self, nanos: u64) -> u32 {
        let tick = nanos / self.tick_nanos;
        match self.cached.get(tick) {
            Some(p) => p,
            None => self.refresh(nanos, tick),
        }
    }

    #[cold]
    #[inline(never)]
    fn refresh(&self, nanos: u64, tick: u64) -> u32 {
        let p = self.compute(nanos / self.bucket_nanos);
        #[cfg(feature = "metrics")]
        for gauge in self.gauges.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            gauge.set(p);
        }
        self.cached.publish(tick, (p * f64::from(u32::MAX)) as u32)
    }

    /// Makes `gauge` follow the probability at each recompute (each layer gives its own,
    /// once).
    #[cfg(feature = "metrics")]
    pub(crate) fn report_to(&self, gauge: &metrics::Gauge) {
        self.gauges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(gauge.clone());
    }
}

impl Default for AdaptiveThrottle {
    fn default() -> Self {
        Self::new()
    }
}

/// The SRE rule with Envoy's cap and floor: `max(0, (requests − k × accepts) / (requests + 1))`,
/// capped at `max`, 0 below `min_requests`.
fn probability(requests: f64, accepts: f64, k: f64, max: f64, min_requests: f64) -> f64 {
    if requests < min_requests || requests == 0.0 {
        return 0.0;
    }
    let p = ((requests - k * accepts) / (requests + 1.0)).max(0.0);
    p.min(max)
}

impl AdaptiveThrottleBuilder {
    /// `K`, the multiplier of accepts (default 2, SRE's; at least 1): the dependency sees up
    /// to `K ×` what it accepts. Lower is more aggressive (1.1 refuses as soon as more than
    /// 9 % of calls are not accepted).
    #[must_use]
    pub fn k(mut self, k: f64) -> Self {
        self.k = k;
        self
    }

    /// The most calls ever refused, in (0, 1] (default 0.9): some calls always go, so the
    /// throttle sees a recovery.
    #[must_use]
    pub fn max_probability(mut self, max: f64) -> Self {
        self.max_probability = max;
        self
    }

    /// The sliding window ([`WINDOW`] for users, 100 ms to 1 hour; the crate's tests set a
    /// shorter one, to slide buckets out in few steps).
    #[must_use]
    #[cfg(test)]
    pub(crate) fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The window's buckets (30, in 1..=1000, each at least 1 ms): the window slides a bucket
    /// at a time (fixed for users: a knob once; the crate's tests set fewer, to reach a
    /// bucket's reuse in few steps).
    #[must_use]
    #[cfg(test)]
    pub(crate) fn buckets(mut self, buckets: u32) -> Self {
        self.buckets = buckets;
        self
    }

    /// Seeds the refusal draws (tests; default: a thread-local random generator).
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Checks the knobs and builds the throttle.
    ///
    /// # Errors
    ///
    /// When `k` is below 1 (or NaN), or `max_probability` not in (0, 1].
    pub fn build(self) -> Result<AdaptiveThrottle, ConfigError> {
        if !(self.k >= 1.0 && self.k.is_finite()) {
            return Err(ConfigError::new(
                "k",
                format!("must be at least 1, got {}", self.k),
            ));
        }
        if !(self.max_probability > 0.0 && self.max_probability <= 1.0) {
            return Err(ConfigError::new(
                "max_probability",
                format!("must be in (0, 1], got {}", self.max_probability),
            ));
        }
        if self.window < Duration::from_millis(100) || self.window > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "window",
                format!("must be between 100ms and 1 hour, got {:?}", self.window),
            ));
        }
        if !(1..=1000).contains(&self.buckets)
            || self.window / self.buckets < Duration::from_millis(1)
        {
            return Err(ConfigError::new(
                "buckets",
                format!(
                    "must be in 1..=1000 with buckets of at least 1ms, got {}",
                    self.buckets
                ),
            ));
        }
        let bucket_nanos = (self.window / self.buckets).as_nanos() as u64;
        let stripes = stripe::count();
        Ok(AdaptiveThrottle {
            start: Instant::now(),
            bucket_nanos,
            buckets: u64::from(self.buckets),
            tick_nanos: (bucket_nanos / TICKS_PER_BUCKET).max(1),
            k: self.k,
            max_probability: self.max_probability,
            min_requests: MIN_RPS * self.window.as_secs_f64(),
            accept: self.accept,
            seed: self.seed,
            sequence: AtomicU64::new(0),
            requests: Ring::new(self.buckets as usize, stripes),
            accepts: Ring::new(self.buckets as usize, stripes),
            cached: TickCache::new(),
            rejections: AtomicU64::new(0),
            #[cfg(feature = "metrics")]
            gauges: std::sync::Mutex::new(Vec::new()),
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_rule_in_numbers() {
        // SRE: nothing refused while accepts ≥ requests / K.
        assert_eq!(probability(100.0, 50.0, 2.0, 1.0, 0.0), 0.0);
        assert_eq!(probability(100.0, 60.0, 2.0, 1.0, 0.0), 0.0);
        assert!((probability(100.0, 0.0, 2.0, 1.0, 0.0) - 100.0 / 101.0).abs() < 1e-12);
        assert!((probability(100.0, 25.0, 2.0, 1.0, 0.0) - 50.0 / 101.0).abs() < 1e-12);
        // The cap, the minimum rate.
        assert_eq!(probability(100.0, 0.0, 2.0, 0.9, 0.0), 0.9);
        assert_eq!(probability(99.0, 0.0, 2.0, 1.0, 100.0), 0.0);
        assert_eq!(probability(100.0, 0.0, 2.0, 1.0, 100.0), 100.0 / 101.0);
        assert_eq!(probability(0.0, 0.0, 2.0, 1.0, 0.0), 0.0);
    }

    #[test]
    fn every_rule_names_its_knob() {
        let b = AdaptiveThrottle::builder;
        let knob = |r: Result<AdaptiveThrottle, ConfigError>| r.unwrap_err().knob().to_owned();
        assert_eq!(knob(b().k(0.5).build()), "k");
        assert_eq!(knob(b().k(f64::NAN).build()), "k");
        assert_eq!(knob(b().max_probability(0.0).build()), "max_probability");
        assert_eq!(knob(b().max_probability(1.5).build()), "max_probability");
        assert_eq!(
            knob(b().window(Duration::from_millis(10)).build()),
            "window"
        );
        assert_eq!(
            knob(b().window(Duration::from_secs(7200)).build()),
            "window"
        );
        assert_eq!(knob(b().buckets(0).build()), "buckets");
        assert_eq!(
            knob(b().window(Duration::from_millis(100)).buckets(1000).build()),
            "buckets"
        );
        assert!(b().build().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn old_buckets_slide_out_of_the_window() {
        let t = AdaptiveThrottle::builder()
            .window(Duration::from_secs(10))
            .buckets(10)
            .seed(3)
            .build()
            .unwrap();
        for _ in 0..100 {
            t.record_request();
        }
        assert_eq!(t.probability(), 0.9, "capped");
        tokio::time::advance(Duration::from_secs(5)).await;
        for _ in 0..100 {
            t.record_request();
            t.record_accept();
        }
        assert_eq!(t.window_counts(), (200, 100));
        assert_eq!(t.probability(), 0.0);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(
            t.window_counts(),
            (100, 100),
            "the first second left the window"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_cached_probability_follows_within_a_tick() {
        let t = AdaptiveThrottle::builder()
            .window(Duration::from_secs(10))
            .buckets(10)
            .max_probability(1.0)
            .seed(3)
            .build()
            .unwrap();
        assert!(!t.admit_request(), "nothing measured: admitted");
        for _ in 0..999 {
            t.record_request();
        }
        // Same tick: the cached 0 holds.
        assert!(!t.admit_request());
        tokio::time::advance(Duration::from_millis(100)).await;
        let refused = (0..1000).filter(|_| t.admit_request()).count();
        assert!(refused > 980, "{refused}");
        assert_eq!(t.rejections(), refused as u64);
    }

    #[tokio::test(start_paused = true)]
    async fn seeded_draws_repeat() {
        let run = || {
            let t = AdaptiveThrottle::builder().seed(9).build().unwrap();
            for i in 0..100 {
                t.record_request();
                if i % 3 == 0 {
                    t.record_accept();
                }
            }
            (0..200).map(|_| t.admit_request()).collect::<Vec<_>>()
        };
        let (a, b) = (run(), run());
        assert_eq!(a, b);
        let refused = a.iter().filter(|r| **r).count();
        // p ≈ (100 − 68) / 101 ≈ 0.32, drifting as the refused calls count as requests.
        assert!((40..=110).contains(&refused), "{refused}");
    }
}

/// Loom models of the shared state: `RUSTFLAGS="--cfg loom" cargo test -p backstop
/// --lib loom` (what `.ci/run` does).
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    fn throttle() -> AdaptiveThrottle {
        AdaptiveThrottle::builder()
            .max_probability(1.0)
            .build()
            .unwrap()
    }

    /// Two threads counting into one bucket lose no count.
    #[test]
    fn loom_concurrent_counts_are_kept() {
        loom::model(|| {
            let t = Arc::new(throttle());
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let t = t.clone();
                    loom::thread::spawn(move || {
                        t.request_at(5);
                        t.accept_at(5);
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            assert_eq!(t.sum(&t.requests, 0), 2);
            assert_eq!(t.sum(&t.accepts, 0), 2);
        });
    }

    /// A window of two 1 s buckets, so an epoch's slot is reused two epochs on.
    fn two_buckets(max_probability: f64) -> AdaptiveThrottle {
        AdaptiveThrottle::builder()
            .window(Duration::from_secs(2))
            .buckets(2)
            .max_probability(max_probability)
            .build()
            .unwrap()
    }

    /// A call sent in epoch 0 ends (and is counted, in its sending's bucket) while another
    /// thread's call of epoch 2 rotates that bucket's slot: the late count lands in epoch 0
    /// (then is reset by epoch 2) or is refused as late, but never moves into epoch 2, whose
    /// window holds exactly what was counted in it.
    #[test]
    fn loom_a_late_count_racing_a_rotation_stays_in_its_bucket() {
        loom::model(|| {
            let t = Arc::new(two_buckets(1.0));
            let second = t.bucket_nanos;
            let late = {
                let t = t.clone();
                loom::thread::spawn(move || t.sent_ended(second / 2, true))
            };
            let rotating = {
                let t = t.clone();
                loom::thread::spawn(move || t.request_at(2 * second + 1))
            };
            late.join().unwrap();
            rotating.join().unwrap();
            assert_eq!(t.sum(&t.requests, 2), 1);
            assert_eq!(t.sum(&t.accepts, 2), 0);
        });
    }

    /// A refresh of the cached probability computed before a rotation (from a window full of
    /// refusals) races one computed after it (the old bucket gone): whichever publishes last,
    /// the newer tick's value is the one cached, and every value any reader is handed is at
    /// most `max_probability`.
    #[test]
    fn loom_a_stale_refresh_never_overwrites_a_newer_one() {
        loom::model(|| {
            let t = Arc::new(two_buckets(0.5));
            let second = t.bucket_nanos;
            // Epoch 1: ten calls, none accepted (p = 10 / 11, capped at 0.5).
            for _ in 0..10 {
                t.request_at(second);
            }
            let cap = (0.5 * f64::from(u32::MAX)) as u32;
            let stale = {
                let t = t.clone();
                loom::thread::spawn(move || t.cached_probability(second))
            };
            let fresh = {
                let t = t.clone();
                loom::thread::spawn(move || {
                    // Epoch 3: epoch 1 has left the window; one call, accepted.
                    t.sent_ended(3 * second, true);
                    t.cached_probability(3 * second)
                })
            };
            let seen_stale = stale.join().unwrap();
            let seen_fresh = fresh.join().unwrap();
            // The stale reader computed from epoch 1's refusals (capped), or from a window
            // already rotated (below the minimum rate: 0), or took the newer value.
            assert!(seen_stale == cap || seen_stale == 0, "{seen_stale}");
            assert_eq!(seen_fresh, 0);
            let newest = 3 * second / t.tick_nanos;
            assert_eq!(t.cached.get(newest), Some(0));
        });
    }
}
