//! How long to wait before each retry.
//!
//! Every strategy draws from a random number generator that the retry layer seeds per request
//! (from an injectable seed, so tests are exact), so two requests failing together do not
//! retry together. The distributions, for retry number `n ≥ 1` with the previous delay `prev`
//! (`base` for the first retry):
//!
//! | strategy | delay |
//! |---|---|
//! | [`decorrelated(base, cap)`](decorrelated) (default) | uniform in `[base, min(cap, 3·prev)]`: the cap bounds the envelope *before* sampling, so there is no pile-up at the cap |
//! | [`exponential(base, cap)`](exponential) + [`Jitter::None`] | `min(cap, base·2ⁿ⁻¹)` |
//! | … + [`Jitter::Full`] | uniform in `[0, min(cap, base·2ⁿ⁻¹)]` |
//! | … + [`Jitter::Equal`] | `e/2 +` uniform in `[0, e/2]`, with `e = min(cap, base·2ⁿ⁻¹)` |
//! | … + [`Jitter::Proportional(f)`](Jitter::Proportional) | uniform in `[e·(1 − f), min(cap, e·(1 + f))]`: capped before sampling, so no pile-up at the cap |
//! | [`decorrelated_v2(median, cap)`](decorrelated_v2) | Polly's smooth decorrelated jitter: the first delay's median is about `median` (0.9×), the `n`th grows as `median·2ⁿ⁻¹`, with no spikes; clamped to `cap` |
//! | [`constant(d)`](constant) | `d` |

use crate::ConfigError;
use std::{fmt, ops::RangeBounds, time::Duration};

/// A source of randomness for one request: a seeded, fast, non-cryptographic generator.
///
/// The retry layer gives each request its own, seeded from
/// [`RetryConfig::seed`](crate::client::retry::RetryConfig::seed) when one is set (so a seeded layer's delays
/// are exact), at random otherwise; a [`Backoff`] draws its jitter from it. Which algorithm
/// it runs is not part of the API: a seed gives the same sequence within one version of
/// backstop, not across versions.
///
/// ```
/// use backstop::client::retry::backoff::Rng;
///
/// let (mut a, mut b) = (Rng::with_seed(7), Rng::with_seed(7));
/// assert_eq!(a.u64(..), b.u64(..));
/// let x = a.u64(10..=20);
/// assert!((10..=20).contains(&x));
/// let f = a.f64();
/// assert!((0.0..1.0).contains(&f));
/// ```
#[derive(Clone)]
pub struct Rng(fastrand::Rng);

impl Rng {
    /// A generator seeded with `seed`: the same seed gives the same sequence.
    pub fn with_seed(seed: u64) -> Self {
        Self(fastrand::Rng::with_seed(seed))
    }

    /// A uniformly random `u64` in `range`.
    ///
    /// # Panics
    ///
    /// When `range` is empty.
    pub fn u64(&mut self, range: impl RangeBounds<u64>) -> u64 {
        self.0.u64(range)
    }

    /// A uniformly random `f64` in `[0, 1)`.
    pub fn f64(&mut self) -> f64 {
        self.0.f64()
    }
}

impl fmt::Debug for Rng {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rng").finish_non_exhaustive()
    }
}

/// Per-request backoff state, kept by the retry layer between retries.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct BackoffState {
    /// The number of the retry being scheduled: 1 for the first retry.
    pub retry: u32,
    /// The previous delay (zero before the first retry).
    pub prev: Duration,
    /// Strategy-specific memory (used by [`decorrelated_v2`]).
    pub aux: f64,
}

/// A backoff strategy: the delay before the next retry.
///
/// The constructors and setters of this module never fail; a strategy's knobs are checked
/// once, by [`validate`](Backoff::validate), when the retry layer is built
/// ([`RetryConfig::build`](crate::client::retry::RetryConfig::build)), like every other knob of the layer.
pub trait Backoff: fmt::Debug + Send + Sync {
    /// The delay before retry `state.retry`; implementations update `state` as they need.
    fn next_delay(&self, state: &mut BackoffState, rng: &mut Rng) -> Duration;

    /// Checks the strategy's knobs. Default: nothing to check.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the knob out of its range.
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }

    /// A lower bound of the first retry's delay: no first retry goes sooner. The client
    /// presets tell the attempt bound inside (`AttemptTimeoutLayer::retry_wait`), so it keeps
    /// room for a retry only where one could be sent. Default: zero, always a true bound.
    fn least_first_delay(&self) -> Duration {
        Duration::ZERO
    }
}

/// The longest delay a backoff may be configured with (its `cap`, or a constant delay), 1 h,
/// checked by [`Backoff::validate`]: a retry an hour later serves no caller. (A gRPC service
/// config's `maxBackoff`, unbounded in gRFC A6, is clamped to it.)
pub const MAX_DELAY: Duration = Duration::from_secs(3600);

fn check(knob: &'static str, base: Duration, cap: Duration) -> Result<(), ConfigError> {
    if base.is_zero() || base > MAX_DELAY {
        return Err(ConfigError::new(
            knob,
            format!("must be greater than zero and at most 1h, got {base:?}"),
        ));
    }
    if cap > MAX_DELAY {
        return Err(ConfigError::new(
            "cap",
            format!("must be at most 1h, got {cap:?}"),
        ));
    }
    if cap < base {
        return Err(ConfigError::new(
            "cap",
            format!("{cap:?} is shorter than `{knob}` ({base:?})"),
        ));
    }
    Ok(())
}

/// Uniform in `[lo, hi]`.
/// `nanos` as a `Duration`; the caller keeps it at or under a `Duration`'s own nanoseconds.
fn from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let secs = u64::try_from(nanos / NANOS_PER_SEC).unwrap_or(u64::MAX);
    // The remainder is under 10^9: it fits a u32.
    Duration::new(secs, (nanos % NANOS_PER_SEC) as u32)
}

fn uniform(rng: &mut Rng, lo: Duration, hi: Duration) -> Duration {
    if hi <= lo {
        return lo;
    }
    let span = (hi - lo).as_nanos().min(u128::from(u64::MAX)) as u64;
    lo + Duration::from_nanos(rng.u64(0..=span))
}

/// Decorrelated jitter; see [`decorrelated`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decorrelated {
    base: Duration,
    cap: Duration,
}

/// Decorrelated jitter (the default): each delay is uniform in `[base, min(cap, 3·prev)]`.
/// `base` must be more than zero and `cap` between `base` and 1 h (checked by
/// [`Backoff::validate`]).
pub fn decorrelated(base: Duration, cap: Duration) -> Decorrelated {
    Decorrelated { base, cap }
}

impl Backoff for Decorrelated {
    fn validate(&self) -> Result<(), ConfigError> {
        check("base", self.base, self.cap)
    }

    fn least_first_delay(&self) -> Duration {
        self.base
    }

    fn next_delay(&self, state: &mut BackoffState, rng: &mut Rng) -> Duration {
        let prev = if state.prev.is_zero() {
            self.base
        } else {
            state.prev
        };
        let hi = prev.saturating_mul(3).min(self.cap);
        let d = uniform(rng, self.base, hi);
        state.prev = d;
        d
    }
}

/// How [`exponential`] backoff is randomised.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Jitter {
    /// No randomness: every client retries at the same instants.
    None,
    /// Uniform in `[0, e]`.
    Full,
    /// `e/2` plus uniform in `[0, e/2]`.
    Equal,
    /// Uniform within `±f·e` of `e`, `f` in (0, 1]: `e × random(1 − f, 1 + f)`. The jitter
    /// applies after the cap, so a wait at the cap may go `f·cap` past it (at most
    /// [`MAX_DELAY`]): gRFC A6 as updated in 2024 (`f` = 0.2), which grpc-js and grpcio follow.
    Proportional(f64),
}

/// Exponential backoff; see [`exponential`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exponential {
    base: Duration,
    cap: Duration,
    jitter: Jitter,
    multiplier: f64,
}

/// Exponential backoff: the envelope `e = min(cap, base·2ⁿ⁻¹)`, with [`Jitter::Full`]; change it
/// with [`Exponential::jitter`] and the growth with [`Exponential::multiplier`].
///
/// With a multiplier and [`Jitter::Proportional`]`(0.2)` this is gRFC A6's formula as updated
/// in 2024: retry `n` waits `min(initialBackoff × backoffMultiplier^(n−1), maxBackoff) ×
/// random(0.8, 1.2)` (A6's 2017 text had full jitter, `random(0, …)`).
///
/// `base` must be more than zero and `cap` between `base` and 1 h (checked by
/// [`Backoff::validate`]).
pub fn exponential(base: Duration, cap: Duration) -> Exponential {
    Exponential {
        base,
        cap,
        jitter: Jitter::Full,
        multiplier: 2.0,
    }
}

impl Exponential {
    /// Sets the jitter (a [`Jitter::Proportional`] factor must be in (0, 1]).
    #[must_use]
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The envelope's growth per retry (default 2): `e = min(cap, base·multiplierⁿ⁻¹)`. It
    /// must be a finite number greater than zero (gRFC A6's `backoffMultiplier` rule).
    #[must_use]
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// The envelope of retry `retry` (counted from 1).
    fn envelope(&self, retry: u32) -> Duration {
        let shift = retry.saturating_sub(1).min(62);
        if self.multiplier == 2.0 {
            // Exact integer arithmetic for the common case, in nanoseconds: base · 2^shift
            // overflows only far above any cap (a `Duration` is under 2^94 ns; 2^62 more
            // does not fit a u128), and then the cap is the answer.
            return self
                .base
                .as_nanos()
                .checked_mul(1u128 << shift)
                .map_or(self.cap, |n| from_nanos(n.min(self.cap.as_nanos())));
        }
        let secs = self.base.as_secs_f64() * self.multiplier.powi(shift as i32);
        Duration::try_from_secs_f64(secs).map_or(self.cap, |e| e.min(self.cap))
    }
}

impl Backoff for Exponential {
    fn validate(&self) -> Result<(), ConfigError> {
        check("base", self.base, self.cap)?;
        if let Jitter::Proportional(f) = self.jitter
            && !(f > 0.0 && f <= 1.0)
        {
            return Err(ConfigError::new(
                "jitter",
                format!("proportional factor must be in (0, 1], got {f}"),
            ));
        }
        if !(self.multiplier.is_finite() && self.multiplier > 0.0) {
            return Err(ConfigError::new(
                "multiplier",
                format!(
                    "must be a finite number greater than zero, got {}",
                    self.multiplier
                ),
            ));
        }
        Ok(())
    }

    fn least_first_delay(&self) -> Duration {
        let e = self.envelope(1);
        match self.jitter {
            Jitter::None => e,
            Jitter::Full => Duration::ZERO,
            Jitter::Equal => e / 2,
            Jitter::Proportional(f) => e.mul_f64((1.0 - f).clamp(0.0, 1.0)),
        }
    }

    fn next_delay(&self, state: &mut BackoffState, rng: &mut Rng) -> Duration {
        let e = self.envelope(state.retry);
        let d = match self.jitter {
            Jitter::None => e,
            Jitter::Full => uniform(rng, Duration::ZERO, e),
            Jitter::Equal => uniform(rng, e / 2, e),
            Jitter::Proportional(f) => {
                let lo = e.mul_f64(1.0 - f);
                uniform(rng, lo, e.saturating_add(e.mul_f64(f)).min(MAX_DELAY))
            }
        };
        state.prev = d;
        d
    }
}

/// Smooth decorrelated jitter; see [`decorrelated_v2`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecorrelatedV2 {
    median: Duration,
    cap: Duration,
}

/// Polly's "decorrelated jitter V2": delays whose median for retry `n` is about
/// `median·2ⁿ⁻¹`, smooth (no spikes), never piling up at the cap (they are clamped to it).
///
/// `median` must be more than zero and `cap` between `median` and 1 h (checked by
/// [`Backoff::validate`]).
pub fn decorrelated_v2(median: Duration, cap: Duration) -> DecorrelatedV2 {
    DecorrelatedV2 { median, cap }
}

impl Backoff for DecorrelatedV2 {
    fn validate(&self) -> Result<(), ConfigError> {
        check("median", self.median, self.cap)
    }

    fn next_delay(&self, state: &mut BackoffState, rng: &mut Rng) -> Duration {
        // The formula of Polly's DecorrelatedJitterBackoffV2: with t = k + U(0, 1) for the
        // k-th retry counted from 0, f(t) = 2^t · tanh(√(p·t)); the delay is
        // (f(t) − f(t_prev)) / rp · median. (Counting from 1 doubled every median.)
        const P: f64 = 4.0;
        const RP_SCALING: f64 = 1.0 / 1.4;
        let k = state.retry.max(1) - 1;
        let t = f64::from(k.min(60)) + rng.f64();
        let next = t.exp2() * (P * t).sqrt().tanh();
        let delta = (next - state.aux).max(0.0);
        state.aux = next;
        let secs = delta * RP_SCALING * self.median.as_secs_f64();
        let d = Duration::try_from_secs_f64(secs)
            .unwrap_or(self.cap)
            .min(self.cap);
        state.prev = d;
        d
    }
}

/// A constant delay; see [`constant`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Constant(Duration);

/// The same delay before every retry (no jitter: prefer [`decorrelated`]). Zero retries at
/// once; the delay must be at most 1 h (checked by [`Backoff::validate`]).
pub fn constant(delay: Duration) -> Constant {
    Constant(delay)
}

impl Backoff for Constant {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.0 > MAX_DELAY {
            return Err(ConfigError::new(
                "delay",
                format!("must be at most 1h, got {:?}", self.0),
            ));
        }
        Ok(())
    }

    fn least_first_delay(&self) -> Duration {
        self.0
    }

    fn next_delay(&self, state: &mut BackoffState, _: &mut Rng) -> Duration {
        state.prev = self.0;
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::{Rng, *};
    use proptest::prelude::{any, prop_assert, prop_assert_eq, proptest};

    const MS: Duration = Duration::from_millis(1);

    fn run(b: &dyn Backoff, seed: u64, n: u32) -> Vec<Duration> {
        let mut rng = Rng::with_seed(seed);
        let mut state = BackoffState::default();
        (1..=n)
            .map(|retry| {
                state.retry = retry;
                b.next_delay(&mut state, &mut rng)
            })
            .collect()
    }

    #[test]
    fn a_fixed_seed_gives_an_exact_sequence() {
        let b = decorrelated(10 * MS, 1000 * MS);
        assert_eq!(run(&b, 7, 6), run(&b, 7, 6));
        assert_ne!(run(&b, 7, 6), run(&b, 8, 6));
    }

    /// gRFC A6's formula (2024): retry n waits min(initial × multiplier^(n−1), max) ×
    /// random(0.8, 1.2), past the cap by at most a fifth of it.
    #[test]
    fn a6_backoff_is_exponential_with_a_multiplier_and_a_fifth_either_side() {
        let envelope = exponential(100 * MS, 1000 * MS)
            .multiplier(1.5)
            .jitter(Jitter::None);
        assert_eq!(
            run(&envelope, 1, 7),
            [
                100_000, 150_000, 225_000, 337_500, 506_250, 759_375, 1_000_000
            ]
            .map(Duration::from_micros)
            .to_vec()
        );
        let a6 = exponential(100 * MS, 1000 * MS)
            .multiplier(1.5)
            .jitter(Jitter::Proportional(0.2));
        let (mut below, mut above) = (0, 0);
        for seed in 0..50 {
            for (n, d) in run(&a6, seed, 7).into_iter().enumerate() {
                let e = envelope.envelope(n as u32 + 1);
                assert!(
                    d >= e.mul_f64(0.8),
                    "retry {}: {d:?} below 0.8 × {e:?}",
                    n + 1
                );
                assert!(
                    d <= e.mul_f64(1.2),
                    "retry {}: {d:?} above 1.2 × {e:?}",
                    n + 1
                );
                below += usize::from(d < e);
                above += usize::from(d > e);
            }
        }
        // Both sides of the envelope, the cap's included (A6 jitters after the cap).
        assert!(below > 100 && above > 100, "{below} below, {above} above");
        assert!(run(&a6, 3, 7).len() == 7);
        assert_eq!(a6.least_first_delay(), 80 * MS);
        // A multiplier below 1 shrinks, far retries do not overflow, and bad ones are named.
        let shrink = exponential(100 * MS, 1000 * MS).multiplier(0.5);
        assert_eq!(shrink.envelope(2), 50 * MS);
        let huge = exponential(MS, 1000 * MS).multiplier(1e9);
        assert_eq!(huge.envelope(u32::MAX), 1000 * MS);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = exponential(MS, MS).multiplier(bad).validate().unwrap_err();
            assert_eq!(err.knob(), "multiplier");
        }
    }

    #[test]
    fn exponential_without_jitter_doubles_to_the_cap() {
        let b = exponential(10 * MS, 100 * MS).jitter(Jitter::None);
        assert_eq!(
            run(&b, 1, 6),
            [10, 20, 40, 80, 100, 100].map(|m| m * MS).to_vec()
        );
        // Far retries neither overflow nor panic.
        let mut state = BackoffState {
            retry: u32::MAX,
            ..Default::default()
        };
        assert_eq!(b.next_delay(&mut state, &mut Rng::with_seed(1)), 100 * MS);
    }

    #[test]
    fn exponential_doubles_past_the_thirty_second_retry_without_jumping_to_the_cap() {
        // A tiny base doubles for more than 31 retries before it meets the cap: each
        // retry's envelope is min(cap, base·2ⁿ⁻¹), never the cap early (it once was, from
        // retry 33 on: 4.29 s, then 3600 s).
        let b =
            exponential(Duration::from_nanos(1), Duration::from_secs(3600)).jitter(Jitter::None);
        for retry in [1u32, 2, 32, 33, 34, 42] {
            let expected = Duration::from_nanos(1u64 << (retry - 1));
            assert_eq!(b.envelope(retry), expected, "retry {retry}");
        }
        // 2^41 ns ≈ 2199 s < 3600 s < 2^42 ns ≈ 4398 s: retry 43 is the first at the cap.
        assert_eq!(b.envelope(43), Duration::from_secs(3600));
        // The largest base and shift overflow the arithmetic and answer the cap.
        let huge = exponential(Duration::MAX, Duration::MAX).jitter(Jitter::None);
        assert_eq!(huge.envelope(63), Duration::MAX);
        assert_eq!(huge.envelope(u32::MAX), Duration::MAX);
        assert_eq!(from_nanos(Duration::MAX.as_nanos()), Duration::MAX);
    }

    #[test]
    fn constant_is_constant() {
        assert_eq!(run(&constant(5 * MS), 1, 3), vec![5 * MS; 3]);
    }

    #[test]
    fn configuration_is_validated() {
        assert_eq!(
            decorrelated(Duration::ZERO, MS)
                .validate()
                .unwrap_err()
                .knob(),
            "base"
        );
        assert_eq!(
            decorrelated(2 * MS, MS).validate().unwrap_err().knob(),
            "cap"
        );
        assert_eq!(
            exponential(Duration::ZERO, MS)
                .validate()
                .unwrap_err()
                .knob(),
            "base"
        );
        assert_eq!(
            decorrelated_v2(Duration::ZERO, MS)
                .validate()
                .unwrap_err()
                .knob(),
            "median"
        );
        for f in [0.0, 1.5, f64::NAN] {
            let err = exponential(MS, MS).jitter(Jitter::Proportional(f));
            assert_eq!(err.validate().unwrap_err().knob(), "jitter");
        }
    }

    /// Share of samples equal to the cap: a point mass shows up as a large share.
    fn share_at_cap(b: &dyn Backoff, cap: Duration, retries: u32) -> f64 {
        let mut at_cap = 0;
        let mut total = 0;
        for seed in 0..2000 {
            for d in run(b, seed, retries) {
                total += 1;
                if d == cap {
                    at_cap += 1;
                }
            }
        }
        f64::from(at_cap) / f64::from(total)
    }

    /// No strategy's first delay is ever below what it says is its least.
    #[test]
    fn the_least_first_delay_bounds_every_first_delay() {
        let ms = Duration::from_millis;
        let strategies: Vec<Box<dyn Backoff>> = vec![
            Box::new(decorrelated(ms(25), ms(1_000))),
            Box::new(decorrelated_v2(ms(50), ms(1_000))),
            Box::new(constant(ms(40))),
            Box::new(exponential(ms(100), ms(1_000))),
            Box::new(exponential(ms(100), ms(1_000)).jitter(Jitter::None)),
            Box::new(exponential(ms(100), ms(1_000)).jitter(Jitter::Equal)),
            Box::new(exponential(ms(100), ms(1_000)).jitter(Jitter::Proportional(0.3))),
        ];
        let least: Vec<Duration> = strategies.iter().map(|b| b.least_first_delay()).collect();
        assert_eq!(
            least,
            [ms(25), ms(0), ms(40), ms(0), ms(100), ms(50), ms(70)],
            "what each says"
        );
        for (b, least) in strategies.iter().zip(least) {
            for seed in 0..2_000 {
                let mut state = BackoffState {
                    retry: 1,
                    ..Default::default()
                };
                let first = b.next_delay(&mut state, &mut Rng::with_seed(seed));
                assert!(first >= least, "{b:?}: {first:?} < {least:?}");
            }
        }
    }

    #[test]
    fn no_point_mass_at_the_cap() {
        let cap = 200 * MS;
        assert!(share_at_cap(&decorrelated(10 * MS, cap), cap, 10) < 0.01);
        assert!(share_at_cap(&exponential(10 * MS, cap), cap, 10) < 0.01);
        assert!(share_at_cap(&exponential(10 * MS, cap).jitter(Jitter::Equal), cap, 10) < 0.01);
        // Without jitter every late retry sits on the cap: the failure mode the others avoid.
        let none = exponential(10 * MS, cap).jitter(Jitter::None);
        assert!(share_at_cap(&none, cap, 10) >= 0.5);
    }

    #[test]
    fn decorrelated_quantiles_follow_the_uniform_envelope() {
        // First retry: uniform in [base, 3·base] = [10, 30] ms; median ≈ 20 ms.
        let b = decorrelated(10 * MS, 1000 * MS);
        let mut firsts: Vec<Duration> = (0..4000).map(|s| run(&b, s, 1)[0]).collect();
        firsts.sort();
        let q = |p: f64| firsts[((firsts.len() as f64) * p) as usize].as_secs_f64() * 1000.0;
        assert!((q(0.25) - 15.0).abs() < 1.0, "{}", q(0.25));
        assert!((q(0.5) - 20.0).abs() < 1.0, "{}", q(0.5));
        assert!((q(0.75) - 25.0).abs() < 1.0, "{}", q(0.75));
    }

    #[test]
    fn decorrelated_v2_median_grows_about_twofold() {
        let b = decorrelated_v2(100 * MS, Duration::from_secs(3600));
        let median_of = |retry: usize| {
            let mut v: Vec<f64> = (0..2000)
                .map(|s| run(&b, s, 6)[retry].as_secs_f64())
                .collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let ratio = median_of(4) / median_of(3);
        assert!(ratio > 1.6 && ratio < 2.4, "{ratio}");
        // Defect: the first retry's median was 2× the configured median (retries counted
        // from 1 where the V2 formula counts from 0). Polly's own scaling puts it at ≈ 0.9×.
        let first = median_of(0) / 0.1;
        assert!(
            first > 0.75 && first < 1.1,
            "first median {first}× the configured one"
        );
    }

    /// Defect: proportional jitter clamped after sampling, putting ~27 % of delays exactly on
    /// the cap. The envelope is capped before sampling, and the jitter spreads around it
    /// (gRFC A6, 2024): nothing piles up on the cap, nothing goes past `f` of it.
    #[test]
    fn proportional_jitter_does_not_pile_up_at_the_cap() {
        let b = exponential(10 * MS, 200 * MS).jitter(Jitter::Proportional(0.5));
        let delays: Vec<Duration> = (0..2000).flat_map(|s| run(&b, s, 8)).collect();
        let at_cap = delays.iter().filter(|&&d| d == 200 * MS).count();
        assert!(
            at_cap * 1000 < delays.len(),
            "{at_cap} of {} on the cap",
            delays.len()
        );
        assert!(delays.iter().all(|&d| d <= 300 * MS));
        assert!(delays.iter().any(|&d| d > 200 * MS));
    }

    /// Polly's V2 formula, draw by draw: retry `n` (k = n − 1) draws u from the request's
    /// generator, t = k + u, f(t) = 2^t · tanh(√(4t)), and waits (f(t) − f(t_prev)) / 1.4 ×
    /// median, f(t_prev) = 0 before the first retry. A twin generator of the same seed gives
    /// the same draws, so each delay is known to the nanosecond's rounding.
    #[test]
    fn decorrelated_v2_follows_pollys_formula_draw_by_draw() {
        let b = decorrelated_v2(100 * MS, MAX_DELAY);
        for seed in 0..20 {
            let mut draws = Rng::with_seed(seed);
            let mut f_prev = 0.0;
            for (k, d) in run(&b, seed, 6).into_iter().enumerate() {
                let t = k as f64 + draws.f64();
                let f = 2f64.powf(t) * (4.0 * t).sqrt().tanh();
                let want = (f - f_prev) / 1.4 * 0.1;
                f_prev = f;
                assert!(
                    (d.as_secs_f64() - want).abs() < 2e-9,
                    "seed {seed}, retry {}: {d:?}, formula {want} s",
                    k + 1
                );
            }
        }
    }

    /// What V2's delays add up to needs no draw: the differences telescope to f(t₆) / 1.4 ×
    /// median, and t₆ lies in [5, 6), so with a 100 ms median the six delays sum to between
    /// 2⁵·tanh(2√5) / 1.4 × 0.1 s = 2.2851 s and 2⁶·tanh(2√6) / 1.4 × 0.1 s = 4.5709 s; the
    /// first alone is below 2·tanh(2) / 1.4 × 0.1 s = 137.72 ms. A memory (`aux`) ahead of the
    /// next value gives no wait, not the cap.
    #[test]
    fn decorrelated_v2_delays_telescope() {
        let b = decorrelated_v2(100 * MS, MAX_DELAY);
        for seed in 0..200 {
            let delays = run(&b, seed, 6);
            let sum: f64 = delays.iter().map(Duration::as_secs_f64).sum();
            assert!((2.2851..4.5710).contains(&sum), "seed {seed}: {sum} s");
            assert!(
                delays[0] < Duration::from_micros(137_719),
                "{:?}",
                delays[0]
            );
        }
        let mut state = BackoffState {
            retry: 1,
            prev: Duration::ZERO,
            aux: 1e6,
        };
        assert_eq!(
            b.next_delay(&mut state, &mut Rng::with_seed(1)),
            Duration::ZERO
        );
        assert!(state.aux < 2.0, "the memory moves to f(t) = {}", state.aux);
    }

    /// The integer path doubles exactly up to its last shift: retry 32 is 1 ns × 2³¹ =
    /// 2.147483648 s, well under a 1 h cap (not the cap).
    #[test]
    fn exponential_doubles_exactly_through_the_31st_shift() {
        let b = exponential(Duration::from_nanos(1), MAX_DELAY).jitter(Jitter::None);
        assert_eq!(b.envelope(31), Duration::from_nanos(1 << 30));
        assert_eq!(b.envelope(32), Duration::from_nanos(1 << 31));
        let mut state = BackoffState {
            retry: 32,
            ..Default::default()
        };
        let d = b.next_delay(&mut state, &mut Rng::with_seed(1));
        assert_eq!(d, Duration::from_nanos(2_147_483_648));
    }

    /// The limits are inclusive: 1 h itself is a valid base, cap or constant delay, and a
    /// proportional factor of 1; a nanosecond more, or a negative factor, is named.
    #[test]
    fn the_limits_themselves_are_valid() {
        let over = MAX_DELAY + Duration::from_nanos(1);
        assert!(decorrelated(MAX_DELAY, MAX_DELAY).validate().is_ok());
        assert!(exponential(MS, MAX_DELAY).validate().is_ok());
        assert!(constant(MAX_DELAY).validate().is_ok());
        assert_eq!(constant(over).validate().unwrap_err().knob(), "delay");
        assert_eq!(
            decorrelated(over, over).validate().unwrap_err().knob(),
            "base"
        );
        assert_eq!(decorrelated(MS, over).validate().unwrap_err().knob(), "cap");
        for f in [0.2, 1.0] {
            let b = exponential(MS, MS).jitter(Jitter::Proportional(f));
            assert!(b.validate().is_ok(), "{f}");
        }
        let negative = exponential(MS, MS).jitter(Jitter::Proportional(-0.5));
        assert_eq!(negative.validate().unwrap_err().knob(), "jitter");
    }

    /// Whether `d` is within `f·e` of `e`, give or take 1 µs of rounding. The lower bound
    /// saturates: for f near 1, e·(1 − f) is under the slack (zero at f = 1), where a plain
    /// subtraction panicked (the property test below drew such an `f` rarely).
    fn within_f_of(d: Duration, e: Duration, f: f64) -> bool {
        let slack = MS / 1000;
        d >= e.mul_f64(1.0 - f).saturating_sub(slack) && d <= e.mul_f64(1.0 + f) + slack
    }

    /// A proportional factor of 1 (the largest valid) spreads over `[0, 2e]`.
    #[test]
    fn a_proportional_factor_of_one_reaches_down_to_zero() {
        let b = exponential(MS, MS).jitter(Jitter::Proportional(1.0));
        assert_eq!(b.least_first_delay(), Duration::ZERO);
        for seed in 0..200 {
            for d in run(&b, seed, 3) {
                assert!(within_f_of(d, MS, 1.0), "seed {seed}: {d:?}");
            }
        }
    }

    /// The generator's state stays out of logs.
    #[test]
    fn the_generator_debugs_without_its_state() {
        assert_eq!(format!("{:?}", Rng::with_seed(7)), "Rng { .. }");
    }

    proptest! {
        #[test]
        fn every_strategy_stays_within_its_bounds(
            seed in any::<u64>(),
            base_ms in 1u64..1000,
            extra_ms in 0u64..100_000,
            f in 0.01f64..=1.0,
        ) {
            let base = Duration::from_millis(base_ms);
            let cap = base + Duration::from_millis(extra_ms);
            for d in run(&decorrelated(base, cap), seed, 12) {
                prop_assert!(d >= base && d <= cap);
            }
            for jitter in [Jitter::None, Jitter::Full, Jitter::Equal, Jitter::Proportional(f)] {
                let b = exponential(base, cap).jitter(jitter);
                for (i, d) in run(&b, seed, 12).into_iter().enumerate() {
                    let e = base.saturating_mul(1 << i).min(cap);
                    match jitter {
                        Jitter::None => prop_assert_eq!(d, e),
                        Jitter::Equal => prop_assert!(d >= e / 2 && d <= e),
                        Jitter::Full => prop_assert!(d <= e),
                        // After the cap: within ±f·e of the capped envelope.
                        Jitter::Proportional(f) => prop_assert!(within_f_of(d, e, f)),
                    }
                }
            }
            for d in run(&decorrelated_v2(base, cap), seed, 12) {
                prop_assert!(d <= cap);
            }
        }
    }
}
