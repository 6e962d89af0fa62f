//! What bounds an attempt: none, a fixed bound, or one derived from measured latency.

use crate::ConfigError;
use std::time::Duration;

/// How long it takes a stale bound (the model emptied by an idle spell) to double on its way
/// to the ceiling; see the [module docs](crate::client::attempt).
pub(crate) const STALE_DOUBLING: Duration = Duration::from_secs(60);

/// How many times the measured quantile the floor is (fixed: a knob once): the largest step
/// of latency, as a multiple of what was measured, absorbed rather than cut as a hang (a step
/// is cut at first like a hang, and the breaker counts every cut attempt). The lab's `hang`,
/// `brownout` and `drift` scenarios chose 20.
const STEP: f64 = 20.0;

/// The lowest the measured floor goes (fixed: a knob once; a lower `floor` still wins): the
/// shortest bound of any dependency, however fast, so a 10 ms dependency's hang is cut after
/// 250 ms, not after 200 ms of noise.
const MIN_FLOOR: Duration = Duration::from_millis(250);

/// The quantile of the measured latency the adaptive bound is taken from: p99 (fixed: a knob
/// once). It is the highest quantile a model trusted from 100 samples of a 30 s window
/// estimates from more than one sample (p99.9 would follow the single slowest call), and the
/// tail the multiplier's headroom is over: a call above 3 × p99 is a hang, not the tail. How
/// tight the bound is stays with `multiplier`, `floor` and `ceiling`.
const QUANTILE: f64 = 0.99;

/// How each attempt is bounded.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum AttemptBound {
    /// No bound of its own: the request's deadline alone ends it.
    None,
    /// The same bound for every attempt.
    Fixed(Duration),
    /// A bound derived from measured latency.
    Adaptive(Adaptive),
}

/// `clamp(p99 × multiplier, the floor, ceiling)` of the dependency's measured latency (p99
/// fixed), where the floor follows the model: `p99 × 20`, between 250 ms and `floor` (fixed
/// but for `floor`); see the [module docs](crate::client::attempt) for the defaults and why.
///
/// ```
/// use backstop::client::attempt::Adaptive;
/// use std::time::Duration;
///
/// let bound = Adaptive::new()
///     .multiplier(4.0)
///     .floor(Duration::from_millis(20))
///     .ceiling(Duration::from_secs(5));
/// assert!(bound.validate().is_ok());
/// assert_eq!(
///     Adaptive::new().multiplier(0.5).validate().unwrap_err().knob(),
///     "multiplier"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adaptive {
    pub(super) quantile: f64,
    multiplier: f64,
    floor: Duration,
    ceiling: Duration,
    pub(super) deadline_share: f64,
}

/// The largest share of what is left of a request's deadline that one attempt may take: 80 %
/// (fixed: a knob once). The attempt then times out, and the breaker counts it, before the
/// deadline expires (an expired deadline is the caller's, never counted), with room left for
/// a retry. Not applied to an attempt the retry layer marked final, nor to one whose share
/// would leave less than a retry's least wait and the model's median call: no retry needs
/// the room. Chosen by the lab (BENCHMARKS.md): 0.8 kept the `brownout` success of a fixed
/// half-deadline bound and lifted `slow`'s from 45.1 % to 50.0 %; 0.5 cost retries their
/// time. A user who wants attempts shorter still bounds them with `ceiling`.
const DEADLINE_SHARE: f64 = 0.8;

impl Default for Adaptive {
    fn default() -> Self {
        Self::new()
    }
}

impl Adaptive {
    /// p99 × 3, at least p99 × 20 within 250 ms to 1 s, at most 10 s (and 10 s until the
    /// model is first trusted); see the [module docs](crate::client::attempt) for why.
    pub fn new() -> Self {
        Self {
            quantile: QUANTILE,
            multiplier: 3.0,
            floor: Duration::from_secs(1),
            ceiling: Duration::from_secs(10),
            deadline_share: DEADLINE_SHARE,
        }
    }

    /// The quantile the bound is taken from, in [0.5, 1) ([`QUANTILE`] for users; the
    /// crate's tests set others).
    #[must_use]
    #[cfg(test)]
    pub(crate) fn quantile(mut self, q: f64) -> Self {
        self.quantile = q;
        self
    }

    /// How many times the p99 an attempt may take, at least 1 (default 3).
    #[must_use]
    pub fn multiplier(mut self, n: f64) -> Self {
        self.multiplier = n;
        self
    }

    /// The highest the floor goes (default 1 s; more than zero, at most 1 h): the shortest bound of a
    /// dependency whose quantile × 20 is above it; a floor below 250 ms is the floor of every
    /// dependency, however fast. A floor of 10 ms makes the bound
    /// p99 × 3 for any dependency slower than 3.3 ms.
    #[must_use]
    pub fn floor(mut self, floor: Duration) -> Self {
        self.floor = floor;
        self
    }

    /// The longest bound, also the bound before the model is trusted (default 10 s; at least
    /// the floor).
    #[must_use]
    pub fn ceiling(mut self, ceiling: Duration) -> Self {
        self.ceiling = ceiling;
        self
    }

    /// The largest share, in (0, 1], of what is left of the request's deadline that one
    /// attempt may take ([`DEADLINE_SHARE`] for users; the crate's tests set others).
    #[must_use]
    #[cfg(test)]
    pub(crate) fn deadline_share(mut self, share: f64) -> Self {
        self.deadline_share = share;
        self
    }

    /// Checks every knob.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `multiplier`, `floor` or `ceiling`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.quantile >= 0.5 && self.quantile < 1.0) {
            return Err(ConfigError::new(
                "quantile",
                format!("must be in [0.5, 1), got {}", self.quantile),
            ));
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err(ConfigError::new(
                "multiplier",
                format!("must be at least 1, got {}", self.multiplier),
            ));
        }
        if !(self.deadline_share > 0.0 && self.deadline_share <= 1.0) {
            return Err(ConfigError::new(
                "deadline_share",
                format!("must be in (0, 1], got {}", self.deadline_share),
            ));
        }
        if self.floor.is_zero() || self.floor > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "floor",
                format!(
                    "must be greater than zero and at most 1h, got {:?}",
                    self.floor
                ),
            ));
        }
        if self.ceiling < self.floor || self.ceiling > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "ceiling",
                format!(
                    "must be between the floor ({:?}) and 1h, got {:?}",
                    self.floor, self.ceiling
                ),
            ));
        }
        Ok(())
    }

    /// The bound for a measured quantile and its age (zero while the model is trusted; see
    /// `LatencyModel::quantile_aged`):
    /// the quantile doubled for every [`STALE_DOUBLING`] of age, times `multiplier`, clamped
    /// between the floor (the quantile × [`STEP`], within [`MIN_FLOOR`] and `floor`) and the
    /// ceiling.
    pub(super) fn bound(&self, measured: Option<(Duration, Duration)>) -> Duration {
        let Some((q, age)) = measured else {
            return self.ceiling;
        };
        // Past 20 doublings (20 min) any bound is the ceiling; the cap keeps mul_f64 finite.
        let doublings = age.as_secs_f64() / STALE_DOUBLING.as_secs_f64();
        if doublings >= 20.0 {
            return self.ceiling;
        }
        let q = scaled(q, doublings.exp2());
        // The floor follows the model, within `min_floor` and `floor` (the lower wins).
        let floor = scaled(q, STEP).max(MIN_FLOOR).min(self.floor);
        scaled(q, self.multiplier).clamp(floor, self.ceiling)
    }
}

/// `d × factor`, saturated at `Duration::MAX` (`mul_f64` panics past it: a `multiplier` of
/// 1e300 is a valid knob).
fn scaled(d: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

impl AttemptBound {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        match self {
            AttemptBound::Fixed(d) if d.is_zero() => Err(ConfigError::new(
                "attempt_timeout",
                "must be greater than zero",
            )),
            AttemptBound::Adaptive(a) => a.validate(),
            _ => Ok(()),
        }
    }
}
