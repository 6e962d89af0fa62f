use crate::RouteKey;
use crate::client::breaker::shared::{Keyed, Shared};
use crate::client::breaker::state::Settings;
use crate::client::breaker::window::{CountRing, MAX_COUNT_WINDOW, TimeRing, Window};
use crate::client::breaker::{BreakerLayer, Mode, Transition};
use crate::rt::DependencyName;
use crate::{ConfigError, GrpcClassifier, HttpClassifier};
use std::{fmt, sync::Arc, time::Duration};

/// A hook called on every change of state (see [`BreakerConfig::on_state_change`]).
pub(crate) type Hook = Arc<dyn Fn(&Transition) + Send + Sync>;

/// The configuration of a circuit breaker; [`build`](BreakerConfig::build) validates it and
/// makes the [`BreakerLayer`](crate::client::breaker::BreakerLayer).
///
/// Defaults (every one a knob below):
///
/// | knob | default |
/// |---|---|
/// | window | time, 10 s in 10 buckets of 1 s |
/// | `failure_rate` | 0.5: open when half the calls in the window failed |
/// | `slow_calls` | off |
/// | `minimum_calls` | 20 calls in the window before any rate counts |
/// | `consecutive_failures` | off |
/// | `probes` | 3 half-open probes, all must succeed |
/// | `open_duration` | 5 s, doubling per consecutive re-open (fixed), at most 300 s |
/// | `jitter` | on: equal jitter, each open time uniform in `[d/2, d]` |
/// | a throttled call (HTTP 429, gRPC RESOURCE_EXHAUSTED) | counts for nothing (fixed): a rate limit says "slower", not "down", and is honoured through its `Retry-After` or pushback; to count it, give the breaker a classifier that calls it a failure |
/// | `slow_start` | off |
/// | mode | [`Mode::Normal`]; change it at run time with [`BreakerLayer::set_mode`](crate::client::breaker::BreakerLayer::set_mode) |
#[derive(Clone)]
pub struct BreakerConfig<C> {
    pub(crate) classifier: C,
    window: WindowKind,
    failure_rate: f64,
    slow_calls: Option<(Duration, f64)>,
    minimum_calls: u32,
    consecutive_failures: Option<u32>,
    probes: u16,
    open_base: Duration,
    open_max: Duration,
    open_multiplier: f64,
    jitter: bool,
    seed: Option<u64>,
    slow_start: Option<Duration>,
    pub(crate) mode: Mode,
    pub(crate) hook: Option<Hook>,
    pub(crate) key: Option<RouteKey>,
    pub(crate) max_keys: usize,
    pub(crate) key_idle: Duration,
    /// Set by [`BreakerLayer::named`], for the layer and every key's breaker.
    pub(crate) name: DependencyName,
}

#[derive(Debug, Clone, Copy)]
enum WindowKind {
    Time { length: Duration, buckets: u32 },
    Count(u32),
}

/// How the open time grows per consecutive re-open (fixed: a knob once). Doubling reaches the
/// longest open time in a few re-opens of a dependency that stays down, while one that comes
/// back after a short outage is probed again within about twice the first open time; the
/// longest time is the knob ([`BreakerConfig::open_duration`]).
const OPEN_MULTIPLIER: f64 = 2.0;

/// How long a key of a keyed breaker must go without a call before its breaker may be evicted
/// to make room for another key (fixed: a knob once; counted in milliseconds, and an open
/// breaker stays until its open time is over too, whatever this says). 5 minutes is long
/// enough that a route called every few minutes keeps the breaker that counted its failures,
/// and short enough that a full table makes room for new routes within minutes of old ones
/// going quiet; a table that fills faster than keys go idle is what `max_keys` is for. In a
/// stack, the attempt bound's per-route latency models follow the same idle time.
const KEY_IDLE: Duration = Duration::from_secs(300);

impl<C: fmt::Debug> fmt::Debug for BreakerConfig<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerConfig")
            .field("classifier", &self.classifier)
            .field("window", &self.window)
            .field("failure_rate", &self.failure_rate)
            .field("slow_calls", &self.slow_calls)
            .field("minimum_calls", &self.minimum_calls)
            .field("consecutive_failures", &self.consecutive_failures)
            .field("probes", &self.probes)
            .field("open_base", &self.open_base)
            .field("open_max", &self.open_max)
            .field("open_multiplier", &self.open_multiplier)
            .field("jitter", &self.jitter)
            .field("seed", &self.seed)
            .field("slow_start", &self.slow_start)
            .field("mode", &self.mode)
            .field("on_state_change", &self.hook.is_some())
            .field("per_key", &self.key)
            .field("max_keys", &self.max_keys)
            .field("key_idle", &self.key_idle)
            .field("name", &self.name.get())
            .finish()
    }
}

impl BreakerConfig<HttpClassifier> {
    /// The defaults, with [`HttpClassifier`]: 5xx and transport errors are failures, 4xx are
    /// ignored.
    pub fn http() -> Self {
        Self::new(HttpClassifier::new())
    }
}

impl BreakerConfig<GrpcClassifier> {
    /// The defaults, with [`GrpcClassifier`]: UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL,
    /// UNKNOWN, DATA_LOSS, RESOURCE_EXHAUSTED and transport errors are failures (from a
    /// trailers-only response or from the trailers); client-error codes are ignored.
    pub fn grpc() -> Self {
        Self::new(GrpcClassifier::new())
    }
}

impl<C> BreakerConfig<C> {
    /// The defaults, with `classifier` deciding what a result means.
    pub fn new(classifier: C) -> Self {
        Self {
            classifier,
            window: WindowKind::Time {
                length: Duration::from_secs(10),
                buckets: 10,
            },
            failure_rate: 0.5,
            slow_calls: None,
            minimum_calls: 20,
            consecutive_failures: None,
            probes: 3,
            open_base: Duration::from_secs(5),
            open_max: Duration::from_secs(300),
            open_multiplier: OPEN_MULTIPLIER,
            jitter: true,
            seed: None,
            slow_start: None,
            mode: Mode::Normal,
            hook: None,
            key: None,
            max_keys: 64,
            key_idle: KEY_IDLE,
            name: DependencyName::default(),
        }
    }

    /// Replaces the classifier.
    #[must_use]
    pub fn classifier<C2>(self, classifier: C2) -> BreakerConfig<C2> {
        BreakerConfig {
            classifier,
            window: self.window,
            failure_rate: self.failure_rate,
            slow_calls: self.slow_calls,
            minimum_calls: self.minimum_calls,
            consecutive_failures: self.consecutive_failures,
            probes: self.probes,
            open_base: self.open_base,
            open_max: self.open_max,
            open_multiplier: self.open_multiplier,
            jitter: self.jitter,
            seed: self.seed,
            slow_start: self.slow_start,
            mode: self.mode,
            key: self.key,
            max_keys: self.max_keys,
            key_idle: self.key_idle,
            hook: self.hook,
            name: self.name,
        }
    }

    /// A time window: the calls of the last `length`, in `buckets` buckets (default 10 s in
    /// 10). The window slides one bucket at a time. At most 1000 buckets of at least 1 ms.
    #[must_use]
    pub fn time_window(mut self, length: Duration, buckets: u32) -> Self {
        self.window = WindowKind::Time { length, buckets };
        self
    }

    /// A count window: exactly the last `calls` calls (1 to 100 000), one byte each.
    #[must_use]
    pub fn count_window(mut self, calls: u32) -> Self {
        self.window = WindowKind::Count(calls);
        self
    }

    /// The failure rate that opens the breaker, in (0, 1] (default 0.5).
    #[must_use]
    pub fn failure_rate(mut self, rate: f64) -> Self {
        self.failure_rate = rate;
        self
    }

    /// Slow-call detection: a call is slow when it takes at least `duration` (to its outcome:
    /// the response headers, or the trailers of a gRPC response); the breaker opens when the
    /// share of slow calls in the window reaches `rate`, in (0, 1]. Off by default. A slow
    /// half-open probe counts as a failed probe.
    #[must_use]
    pub fn slow_calls(mut self, duration: Duration, rate: f64) -> Self {
        self.slow_calls = Some((duration, rate));
        self
    }

    /// Calls the window must hold before its rates count (default 20, at least 1).
    #[must_use]
    pub fn minimum_calls(mut self, calls: u32) -> Self {
        self.minimum_calls = calls;
        self
    }

    /// Also open after `n` failures in a row while closed, whatever the rates (off by
    /// default; at least 1).
    #[must_use]
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.consecutive_failures = Some(n);
        self
    }

    /// Probe calls let through while half-open (default 3, 1 to 1000): the breaker closes
    /// when all of them succeed and re-opens on the first that fails.
    #[must_use]
    pub fn probes(mut self, probes: u16) -> Self {
        self.probes = probes;
        self
    }

    /// The open time: `base` the first time (default 5 s), doubled at each consecutive re-open
    /// (a failed probe), at most `max` (default 300 s, at most one day). Back to `base` once
    /// the breaker closes.
    #[must_use]
    pub fn open_duration(mut self, base: Duration, max: Duration) -> Self {
        self.open_base = base;
        self.open_max = max;
        self
    }

    /// Equal jitter on the open time (default on): each open time `d` becomes uniform in
    /// `[d/2, d]`, so a fleet of clients does not probe in step.
    #[must_use]
    pub fn jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// Seeds the jitter, for reproducible open times (default: a random seed). The jitter of
    /// each open time is a function of the seed and the breaker's generation.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// After closing, admit a share of calls rising linearly from 10 % to 100 % over `length`
    /// (off by default); the rest are refused with no `retry_after` (do not retry).
    #[must_use]
    pub fn slow_start(mut self, length: Duration) -> Self {
        self.slow_start = Some(length);
        self
    }

    /// Calls `hook` on every change of state, in the thread that made it. Keep it short: it
    /// runs inside a call.
    #[must_use]
    pub fn on_state_change(mut self, hook: impl Fn(&Transition) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// A breaker per key of the request instead of one for the whole dependency: per host
    /// ([`RouteKey::Authority`]), per path, or per route ([`RouteKey::custom`]), each with
    /// this configuration, at most [`max_keys`](Self::max_keys) of them; see
    /// [the module docs](crate::client::breaker#a-breaker-per-key) for the bounds.
    ///
    /// ```
    /// use backstop::RouteKey;
    /// use backstop::client::breaker::BreakerConfig;
    ///
    /// let per_host = BreakerConfig::http().per_key(RouteKey::Authority).max_keys(16).build().unwrap();
    /// assert!(per_host.is_keyed());
    /// ```
    #[must_use]
    pub fn per_key(mut self, key: RouteKey) -> Self {
        self.key = Some(key);
        self
    }

    /// The most keys with a breaker of their own (default 64, at most 10 000); further keys
    /// take the place of idle ones whose breaker is not open, or share the overflow breaker
    /// (see [the module docs](crate::client::breaker#a-breaker-per-key)).
    #[must_use]
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n;
        self
    }

    /// How long a key must go without a call before its breaker may be evicted ([`KEY_IDLE`]
    /// for users; from 1 s to one day: the crate's tests set shorter ones).
    #[must_use]
    #[cfg(test)]
    pub(crate) fn idle_keys_after(mut self, idle: Duration) -> Self {
        self.key_idle = idle;
        self
    }

    /// Checks every knob and derives the machine's settings and window's shape (what
    /// [`build`](Self::build) does first; its docs list the rules).
    pub(crate) fn validate(&self) -> Result<(Settings, WindowSpec), ConfigError> {
        const DAY: Duration = Duration::from_secs(86_400);
        if !(1..=10_000).contains(&self.max_keys) {
            return Err(ConfigError::new(
                "max_keys",
                format!("must be in 1..=10000, got {}", self.max_keys),
            ));
        }
        if self.key_idle < Duration::from_secs(1) || self.key_idle > DAY {
            return Err(ConfigError::new(
                "idle_keys_after",
                format!("must be between 1s and one day, got {:?}", self.key_idle),
            ));
        }
        let ppm = |knob: &'static str, rate: f64| {
            if rate > 0.0 && rate <= 1.0 {
                Ok(((rate * 1_000_000.0).round() as u64).max(1))
            } else {
                Err(ConfigError::new(
                    knob,
                    format!("must be in (0, 1], got {rate}"),
                ))
            }
        };
        let failure_ppm = ppm("failure_rate", self.failure_rate)?;
        let slow_ppm = match self.slow_calls {
            Some((d, _)) if d.is_zero() => {
                return Err(ConfigError::new(
                    "slow_calls",
                    "duration must be above zero",
                ));
            }
            Some((_, rate)) => Some(ppm("slow_calls", rate)?),
            None => None,
        };
        if self.minimum_calls == 0 {
            return Err(ConfigError::new("minimum_calls", "must be at least 1"));
        }
        if self.consecutive_failures == Some(0) {
            return Err(ConfigError::new(
                "consecutive_failures",
                "must be at least 1",
            ));
        }
        if !(1..=1000).contains(&self.probes) {
            return Err(ConfigError::new(
                "probes",
                format!("must be in 1..=1000, got {}", self.probes),
            ));
        }
        if self.open_base.is_zero() {
            return Err(ConfigError::new("open_duration", "base must be above zero"));
        }
        if self.open_max < self.open_base || self.open_max > DAY {
            return Err(ConfigError::new(
                "open_duration",
                format!(
                    "max must be between the base ({:?}) and one day, got {:?}",
                    self.open_base, self.open_max
                ),
            ));
        }
        if let Some(length) = self.slow_start
            && (length.is_zero() || length > DAY)
        {
            return Err(ConfigError::new(
                "slow_start",
                format!("must be between 1µs and one day, got {length:?}"),
            ));
        }
        let window = match self.window {
            WindowKind::Time { length, buckets } => {
                if !(1..=1000).contains(&buckets) {
                    return Err(ConfigError::new(
                        "time_window",
                        format!("buckets must be in 1..=1000, got {buckets}"),
                    ));
                }
                let bucket = length / buckets;
                if bucket < Duration::from_millis(1) || length > DAY {
                    return Err(ConfigError::new(
                        "time_window",
                        format!(
                            "buckets must be at least 1ms and the window at most one day, got {buckets} in {length:?}"
                        ),
                    ));
                }
                WindowSpec::Time {
                    bucket_us: bucket.as_micros() as u64,
                    buckets: buckets as usize,
                }
            }
            WindowKind::Count(n) => {
                if !(1..=MAX_COUNT_WINDOW).contains(&n) {
                    return Err(ConfigError::new(
                        "count_window",
                        format!("must be in 1..={MAX_COUNT_WINDOW}, got {n}"),
                    ));
                }
                if self.minimum_calls > n {
                    return Err(ConfigError::new(
                        "minimum_calls",
                        format!(
                            "must not exceed the count window ({n}), got {}",
                            self.minimum_calls
                        ),
                    ));
                }
                WindowSpec::Count(n as usize)
            }
        };
        let settings = Settings {
            failure_ppm,
            slow_ppm,
            minimum_calls: u64::from(self.minimum_calls),
            consecutive_failures: self.consecutive_failures,
            probes: self.probes,
            open_base_us: self.open_base.as_micros() as u64,
            open_max_us: self.open_max.as_micros() as u64,
            open_multiplier: self.open_multiplier,
            jitter: self.jitter,
            seed: self.seed.unwrap_or_else(random_seed),
            slow_start_us: self.slow_start.map(|d| d.as_micros() as u64),
        };
        Ok((settings, window))
    }

    /// The configuration checked once ([`validate`](Self::validate)): what a breaker is built
    /// from without a second check, so building one cannot fail (a keyed layer builds each
    /// key's from it).
    pub(crate) fn check(self) -> Result<Checked<C>, ConfigError> {
        let (settings, window) = self.validate()?;
        Ok(Checked {
            config: self,
            settings,
            window,
        })
    }

    /// The slow-call duration, if slow calls are detected.
    pub(crate) fn slow_duration(&self) -> Option<Duration> {
        self.slow_calls.map(|(d, _)| d)
    }
}

/// A seed that differs between breakers and processes, without a random-number crate: std's
/// randomly keyed hasher.
/// The shape of a breaker's window, checked: [`build`](Self::build) makes one, which cannot fail.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WindowSpec {
    /// Buckets of `bucket_us` microseconds, `buckets` of them.
    Time { bucket_us: u64, buckets: usize },
    /// The last `n` calls.
    Count(usize),
}

impl WindowSpec {
    /// A new, empty window of this shape.
    pub(crate) fn build(self) -> Window {
        match self {
            WindowSpec::Time { bucket_us, buckets } => Window::Time(TimeRing::new(
                bucket_us,
                buckets,
                crate::rt::stripe::count(),
            )),
            WindowSpec::Count(n) => Window::Count(CountRing::new(n)),
        }
    }
}

/// A [`BreakerConfig`] whose knobs were checked, with what the check derived.
#[derive(Debug, Clone)]
pub(crate) struct Checked<C> {
    pub(crate) config: BreakerConfig<C>,
    pub(crate) settings: Settings,
    pub(crate) window: WindowSpec,
}

impl<C: Clone> Checked<C> {
    /// The configuration of a new key's breaker in a keyed layer, in `mode`: this one, with a
    /// seed of its own unless the configuration gave one (so keys' open times do not jitter
    /// in step).
    pub(crate) fn for_key(&self, mode: crate::client::breaker::Mode) -> Self {
        let mut checked = self.clone();
        checked.config.mode = mode;
        if checked.config.seed.is_none() {
            checked.settings.seed = random_seed();
        }
        checked
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(0u64)
}

impl<C> BreakerConfig<C> {
    /// Validates the configuration and builds the layer. Clones of the layer, and every
    /// service it builds, share one breaker (or, [`per_key`](Self::per_key), one table of
    /// breakers).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the knob, when:
    /// - `failure_rate` or the `slow_calls` rate is not in (0, 1], or the slow-call duration
    ///   is zero;
    /// - `minimum_calls` is zero, or larger than a count window;
    /// - `consecutive_failures` is zero;
    /// - `probes` is not in 1..=1000;
    /// - `open_duration`'s base is zero, its max is below the base or above one day;
    /// - `time_window` has 0 or more than 1000 buckets, or buckets shorter than 1 ms;
    /// - `count_window` is not in 1..=100 000;
    /// - `slow_start` is zero or longer than one day;
    /// - `max_keys` is not in 1..=10 000.
    pub fn build(mut self) -> Result<BreakerLayer<C>, ConfigError>
    where
        C: Clone,
    {
        let config = Arc::new(self.clone());
        let key = self.key.take();
        let checked = self.check()?;
        let keyed = key.map(|key| {
            // Each new key's breaker: this configuration, unkeyed, checked once here.
            let (max_keys, idle) = (checked.config.max_keys, checked.config.key_idle);
            Arc::new(Keyed::new(key, checked.clone(), max_keys, idle))
        });
        Ok(BreakerLayer::from_shared(
            Shared::from_checked(checked, keyed),
            config,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knob<C: Clone>(config: BreakerConfig<C>) -> String {
        config.build().map(drop).unwrap_err().knob().to_owned()
    }

    #[test]
    fn defaults_build() {
        assert!(BreakerConfig::http().build().is_ok());
        assert!(BreakerConfig::grpc().count_window(100).build().is_ok());
    }

    #[test]
    fn every_rule_names_its_knob() {
        let ms = Duration::from_millis;
        let c = BreakerConfig::http;
        assert_eq!(knob(c().failure_rate(0.0)), "failure_rate");
        assert_eq!(knob(c().failure_rate(1.5)), "failure_rate");
        assert_eq!(knob(c().failure_rate(f64::NAN)), "failure_rate");
        assert_eq!(knob(c().slow_calls(ms(100), 0.0)), "slow_calls");
        assert_eq!(knob(c().slow_calls(ms(0), 0.5)), "slow_calls");
        assert_eq!(knob(c().minimum_calls(0)), "minimum_calls");
        assert_eq!(
            knob(c().count_window(10).minimum_calls(11)),
            "minimum_calls"
        );
        assert_eq!(knob(c().consecutive_failures(0)), "consecutive_failures");
        assert_eq!(knob(c().probes(0)), "probes");
        assert_eq!(knob(c().probes(1001)), "probes");
        assert_eq!(knob(c().open_duration(ms(0), ms(10))), "open_duration");
        assert_eq!(knob(c().open_duration(ms(10), ms(5))), "open_duration");
        assert_eq!(
            knob(c().open_duration(ms(10), Duration::from_secs(86_401))),
            "open_duration"
        );
        assert_eq!(knob(c().time_window(ms(10), 0)), "time_window");
        assert_eq!(knob(c().time_window(ms(10), 11)), "time_window");
        assert_eq!(knob(c().time_window(ms(10_000), 1001)), "time_window");
        assert_eq!(knob(c().count_window(0)), "count_window");
        assert_eq!(knob(c().count_window(100_001)), "count_window");
        assert_eq!(knob(c().slow_start(ms(0))), "slow_start");
        assert_eq!(knob(c().max_keys(0)), "max_keys");
        assert_eq!(knob(c().max_keys(10_001)), "max_keys");
        assert_eq!(knob(c().idle_keys_after(ms(999))), "idle_keys_after");
        assert_eq!(
            knob(c().idle_keys_after(Duration::from_secs(86_401))),
            "idle_keys_after"
        );
        let err = c().failure_rate(2.0).build().map(drop).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid `failure_rate`: must be in (0, 1], got 2"
        );
    }
}
