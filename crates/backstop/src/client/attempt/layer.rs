//! The attempt layer: its configuration, its model, and the hedge delay read from it.

use super::{
    AttemptBound, AttemptTimeout,
    keyed::{KEY_IDLE, Keyed},
    shared::{REFRESH, Room, Shared},
};
use crate::latency::LatencyModel;
use crate::rt::{DependencyName, stripe};
use crate::{ConfigError, RouteKey};
use http::{Method, Uri};
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::time::Instant;
use tower_layer::Layer;

/// Bounds each call (an attempt, under the retry layer) and measures how long it took.
///
/// Clones share one [latency model](crate::latency) ([`AttemptTimeoutLayer::latency`]); with
/// [`AttemptBound::Adaptive`] they share the bound derived from it. A call that runs out of
/// time fails with [`AttemptTimedOut`](crate::AttemptTimedOut) and is recorded at its bound.
#[derive(Debug, Clone)]
pub struct AttemptTimeoutLayer {
    handles: stripe::Handles<Shared>,
    shared: Arc<Shared>,
    /// A model per key ([`per_key`](Self::per_key)); `shared` takes the overflow.
    pub(super) keyed: Option<Arc<Keyed>>,
    /// `Some(offset)`: the services write every attempt's `grpc-timeout`
    /// ([`write_grpc_timeout`](Self::write_grpc_timeout)).
    writes: Option<Duration>,
    /// The least a retry waits before it is sent ([`retry_wait`](Self::retry_wait)).
    retry_wait: Duration,
}

impl AttemptTimeoutLayer {
    /// A layer bounding each call as `bound` says, with a latency model of the defaults
    /// (30 s window, trusted from 100 samples).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for a zero fixed bound (`attempt_timeout`) or an adaptive knob out of
    /// its range.
    pub fn new(bound: AttemptBound) -> Result<Self, ConfigError> {
        Self::with_model(bound, LatencyModel::new())
    }

    /// As [`new`](Self::new), with a model of the crate's own making (its unit tests build
    /// models with a short window or trusted from one sample).
    pub(crate) fn with_model(
        bound: AttemptBound,
        model: LatencyModel,
    ) -> Result<Self, ConfigError> {
        bound.validate()?;
        let shared = Arc::new(Shared {
            model,
            origin: Instant::now(),
            bound,
            cached: AtomicU64::new(0),
            median: AtomicU64::new(0),
            name: DependencyName::default(),
            #[cfg(feature = "metrics")]
            duration: std::sync::OnceLock::new(),
            #[cfg(feature = "metrics")]
            key: None,
        });
        Ok(Self {
            handles: stripe::Handles::new(&shared),
            shared,
            keyed: None,
            writes: None,
            retry_wait: Duration::ZERO,
        })
    }

    /// The same layer with a latency model (and so a bound, a hedge delay and a retry
    /// reserve) per key of its requests, as a breaker keyed by the same [`RouteKey`]
    /// has a breaker per key; the client presets key it so when their breaker
    /// is keyed. Each key's model is built empty from this layer's (same bound, window and
    /// name); until it is trusted the key's attempts get the cold-start bound (the ceiling,
    /// capped by the deadline's share), never the bound of other keys. This layer's own model
    /// takes requests without a key and, while a table of `max_keys` models is full of keys
    /// used in the last 30 min, new keys; see the [module docs](super)
    /// for the rule and why.
    ///
    /// ```
    /// use backstop::RouteKey;
    /// use backstop::client::attempt::{Adaptive, AttemptBound, AttemptTimeoutLayer};
    ///
    /// let layer = AttemptTimeoutLayer::new(AttemptBound::Adaptive(Adaptive::new()))?
    ///     .per_key(RouteKey::Path, 64)?;
    /// assert!(layer.key().is_some());
    /// assert_eq!(
    ///     AttemptTimeoutLayer::new(AttemptBound::None)?.per_key(RouteKey::Path, 0).unwrap_err().knob(),
    ///     "max_keys"
    /// );
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `max_keys` unless it is in `1..=10000` (the breaker's bound).
    pub fn per_key(&self, key: RouteKey, max_keys: usize) -> Result<Self, ConfigError> {
        self.per_key_idle(key, max_keys, KEY_IDLE, None)
    }

    /// [`per_key`](Self::per_key) with another idle time before a key may be evicted, and
    /// what says how much longer a key must stay whatever its last call (the client builder
    /// keys this layer as its breaker, with the breaker's idle time and open keys).
    pub(crate) fn per_key_idle(
        &self,
        key: RouteKey,
        max_keys: usize,
        idle: Duration,
        busy: Option<crate::rt::table::KeyBusy>,
    ) -> Result<Self, ConfigError> {
        // The breaker's bound: the client builder keys this layer as its breaker.
        if !(1..=10_000).contains(&max_keys) {
            return Err(ConfigError::new(
                "max_keys",
                format!("must be in 1..=10000, got {max_keys}"),
            ));
        }
        Ok(Self {
            keyed: Some(Arc::new(Keyed::new(
                crate::rt::table::Keyed::new(key, max_keys, idle, busy),
                self.shared.clone(),
            ))),
            ..self.clone()
        })
    }

    /// What the layer keys its models by, if it does ([`per_key`](Self::per_key)).
    pub fn key(&self) -> Option<&RouteKey> {
        self.keyed.as_ref().map(|k| k.key())
    }

    /// The keys that have a model of their own now, sorted (empty unless keyed).
    pub fn keys(&self) -> Vec<String> {
        self.keyed.as_ref().map_or_else(Vec::new, |k| k.keys())
    }

    /// What `key`'s model holds now, if it has one (a keyed layer; see
    /// [`latency`](Self::latency) for the layer's own, which takes requests without one).
    pub fn key_latency(&self, key: &str) -> Option<crate::latency::LatencySnapshot> {
        let entry = self.keyed.as_ref()?.get(key)?;
        Some(
            entry
                .shared
                .model
                .snapshot(entry.shared.now_us(Instant::now())),
        )
    }

    /// This layer's configuration for the dependency `name`: with the `metrics` feature,
    /// attempt durations are recorded as `backstop.client.attempt.duration{dependency}`.
    /// Naming is configuration, done before the layer serves: the layer returned measures
    /// with a latency model of its own (same bound, window and keys, empty), and the layers
    /// cloned before keep theirs.
    ///
    /// ```
    /// use backstop::client::attempt::{Adaptive, AttemptBound, AttemptTimeoutLayer};
    ///
    /// let layer = AttemptTimeoutLayer::new(AttemptBound::Adaptive(Adaptive::new()))?.named("inventory");
    /// assert_eq!(layer.name(), "inventory");
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn named(&self, name: &str) -> Self {
        let shared = Arc::new(self.shared.renamed(DependencyName::new(name)));
        let keyed = self.keyed.as_ref().map(|keyed| {
            Arc::new(Keyed::new(
                crate::rt::table::Keyed::new(
                    keyed.key().clone(),
                    keyed.max_keys(),
                    keyed.idle(),
                    keyed.busy(),
                ),
                shared.clone(),
            ))
        });
        Self {
            handles: stripe::Handles::new(&shared),
            shared,
            keyed,
            writes: self.writes,
            retry_wait: self.retry_wait,
        }
    }

    /// The dependency's name (`""` when unnamed).
    pub fn name(&self) -> &str {
        self.shared.name.get()
    }

    /// How attempts are bounded.
    pub fn bound(&self) -> AttemptBound {
        self.shared.bound
    }

    /// What the model holds now: count and quantiles of the calls of the last window. A
    /// keyed layer's own model holds only the calls without a key of their own (no key, or a
    /// full table); [`key_latency`](Self::key_latency) reads a key's.
    pub fn latency(&self) -> crate::latency::LatencySnapshot {
        self.shared
            .model
            .snapshot(self.shared.now_us(Instant::now()))
    }

    /// The bound an attempt starting now would get (under the current deadline, if any), from
    /// the layer's own model (of a keyed layer: that of calls without a key of their own).
    pub fn current_bound(&self) -> Option<Duration> {
        let deadline = crate::deadline::current().map(|d| d.instant());
        self.shared
            .bound_at(Instant::now(), deadline, Room::Retry(self.retry_wait))
    }
}

impl AttemptTimeoutLayer {
    /// A hedge delay read from this layer's latency model: the `quantile` of the calls of the
    /// last window, read as the upper edge of its bucket (at most 6.25 % above it, never below
    /// the samples it stands for; the `backstop` client preset's hedging uses
    /// p95: a hedge then goes for about one call in twenty), re-read at most every 100 ms. No
    /// hedge is sent until the model is trusted.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `hedge_quantile` unless `quantile` is in (0, 1).
    pub fn hedge_delay(&self, quantile: f64) -> Result<MeasuredDelay, ConfigError> {
        if !(quantile > 0.0 && quantile < 1.0) {
            return Err(ConfigError::new(
                "hedge_quantile",
                format!("must be in (0, 1), got {quantile}"),
            ));
        }
        Ok(self.measured(quantile))
    }
}

impl AttemptTimeoutLayer {
    fn measured(&self, quantile: f64) -> MeasuredDelay {
        MeasuredDelay {
            shared: self.shared.clone(),
            quantile,
            cached: Arc::new(AtomicU64::new(0)),
            keyed: self
                .keyed
                .as_ref()
                .map(|k| (k.clone(), k.delay_slot(quantile))),
        }
    }
}

impl AttemptTimeoutLayer {
    /// A retry reserve read from this layer's latency model (for the retry layer's
    /// `RetryConfig::reserve`, through [`RetryReserve`](crate::client::retry::RetryReserve)): the
    /// `quantile` of the calls of the last window, read as [`hedge_delay`](Self::hedge_delay)
    /// reads it (the upper edge of its bucket, re-read at most every 100 ms). The client
    /// presets use p50: a retry is not started unless, after its backoff, the median call
    /// could still finish before the deadline. No reserve is asked for until the model is
    /// trusted. The retry layer holds this handle from when the stack is built; it reads no
    /// state of this layer's attempts.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `reserve_quantile` unless `quantile` is in (0, 1).
    pub fn retry_reserve(&self, quantile: f64) -> Result<MeasuredDelay, ConfigError> {
        if !(quantile > 0.0 && quantile < 1.0) {
            return Err(ConfigError::new(
                "reserve_quantile",
                format!("must be in (0, 1), got {quantile}"),
            ));
        }
        Ok(self.measured(quantile))
    }
}

/// A duration that follows the dependency's measured latency: a hedge delay
/// ([`AttemptTimeoutLayer::hedge_delay`]) or a retry reserve
/// ([`AttemptTimeoutLayer::retry_reserve`]).
///
/// Of a keyed layer ([`AttemptTimeoutLayer::per_key`]), it is read per request
/// ([`delay_for`](crate::client::retry::hedge::HedgeDelay::delay_for),
/// [`reserve_for`](crate::client::retry::RetryReserve::reserve_for), which the retry layer calls)
/// from the model of the request's key, as the attempt layer bounds it: a route is hedged at
/// its own p95 and keeps its own reserve; a key whose model is not trusted yet gets no hedge
/// and asks for no reserve (never the other keys' values). `delay()` and `reserve()`, without
/// a request, read the layer's own model.
///
/// Clones share one cached value: an atomic word `refresh at (ms) << 32 | delay (µs) + 1`,
/// refreshed by whichever hedged request finds it stale (racing refreshes write the same
/// value); `+ 1` keeps zero for "not trusted". Each key caches its own word per quantile.
#[derive(Debug, Clone)]
pub struct MeasuredDelay {
    shared: Arc<Shared>,
    quantile: f64,
    cached: Arc<AtomicU64>,
    /// A keyed layer's models, and the slot of this quantile's word in each key's entry.
    keyed: Option<(Arc<Keyed>, Option<usize>)>,
}

impl crate::client::retry::hedge::HedgeDelay for MeasuredDelay {
    fn delay(&self) -> Option<Duration> {
        self.read(&self.shared, Some(&self.cached))
    }

    fn delay_for(&self, method: &Method, uri: &Uri) -> Option<Duration> {
        self.read_for(method, uri)
    }
}

impl crate::client::retry::RetryReserve for MeasuredDelay {
    fn reserve(&self) -> Option<Duration> {
        self.read(&self.shared, Some(&self.cached))
    }

    fn reserve_for(&self, method: &Method, uri: &Uri) -> Option<Duration> {
        self.read_for(method, uri)
    }
}

impl MeasuredDelay {
    /// From the model of the request's key (a keyed layer), or the layer's own.
    fn read_for(&self, method: &Method, uri: &Uri) -> Option<Duration> {
        let Some((keyed, slot)) = &self.keyed else {
            return self.read(&self.shared, Some(&self.cached));
        };
        match keyed.entry(method, uri) {
            Some(entry) => self.read(&entry.shared, slot.map(|i| &entry.delays[i])),
            None => self.read(&self.shared, Some(&self.cached)),
        }
    }

    /// The quantile's upper edge in `shared`'s model, from the `cached` word while it is
    /// fresh (no word: read each time).
    fn read(&self, shared: &Shared, cached: Option<&AtomicU64>) -> Option<Duration> {
        let now_us = shared.now_us(Instant::now());
        let now_ms = now_us / 1_000;
        let word = cached.map_or(0, |c| c.load(Ordering::Acquire));
        let value = if word != 0 && now_ms < word >> 32 {
            word & u64::from(u32::MAX)
        } else {
            // The bucket's upper edge, not its midpoint: a delay below the samples it stands
            // for would hedge calls of the usual latency.
            let measured = shared.model.quantile_ceiling(self.quantile, now_us);
            let value = measured.map_or(0, |d| {
                u64::try_from(d.as_micros())
                    .unwrap_or(u64::MAX)
                    .min(u64::from(u32::MAX) - 1)
                    + 1
            });
            let until = (now_ms + REFRESH.as_millis() as u64).min(u64::from(u32::MAX));
            if let Some(cached) = cached {
                cached.store((until << 32) | value, Ordering::Release);
            }
            value
        };
        value.checked_sub(1).map(Duration::from_micros)
    }
}

impl<S> Layer<S> for AttemptTimeoutLayer {
    type Service = AttemptTimeout<S>;

    fn layer(&self, inner: S) -> AttemptTimeout<S> {
        AttemptTimeout {
            inner,
            handles: self.handles.clone(),
            keyed: self.keyed.clone(),
            writes: self.writes,
            retry_wait: self.retry_wait,
        }
    }
}

impl AttemptTimeoutLayer {
    /// The same layer (sharing its model), its services writing every attempt's
    /// `grpc-timeout`: the shorter of the attempt's bound and the request's deadline less
    /// `offset`. For a stack whose outer deadline layer leaves the header to this one, as the
    /// client presets build theirs: `PropagateDeadlineLayer::send_grpc_timeout(false)` outside
    /// (with this `offset`), the retry layer's `grpc_timeout_written_inside(offset)` between.
    /// One header write per attempt, decided when the stack is built; and no header read, the
    /// deadline layer having taken a caller's off the request.
    #[must_use]
    pub(crate) fn write_grpc_timeout(&self, offset: Duration) -> Self {
        Self {
            writes: Some(offset),
            ..self.clone()
        }
    }

    /// The same layer (sharing its model), told that the retry layer outside waits at least
    /// `wait` before a retry (its backoff's least first delay, and any offset between the
    /// deadline and what a retry may use). An adaptive bound keeps its share of the deadline
    /// for a retry only where what the share leaves holds that wait and the model's median
    /// call: with less, no retry could finish (the presets' retry reserve would refuse it), and
    /// the attempt gets all that is left. Before the model is trusted there is no median (and
    /// the reserve asks for none), so the wait alone decides. The presets set it from their
    /// retry layer when the stack is built; the default, zero, counts the median call alone.
    #[must_use]
    pub(crate) fn retry_wait(&self, wait: Duration) -> Self {
        Self {
            retry_wait: wait,
            ..self.clone()
        }
    }
}
