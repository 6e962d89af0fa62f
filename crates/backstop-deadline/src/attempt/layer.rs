//! The attempt layer: its configuration, its model, and the hedge delay read from it.

use super::{
    AttemptBound, AttemptTimeout,
    shared::{REFRESH, Shared},
};
use backstop_core::{__private::stripe, ConfigError, latency::LatencyModel};
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
/// Clones share one [`LatencyModel`] ([`AttemptTimeoutLayer::latency`]); with
/// [`AttemptBound::Adaptive`] they share the bound derived from it. A call that runs out of
/// time fails with [`AttemptTimedOut`](backstop_core::AttemptTimedOut) and is recorded at its bound.
#[derive(Debug, Clone)]
pub struct AttemptTimeoutLayer {
    handles: stripe::Handles<Shared>,
    shared: Arc<Shared>,
    /// `Some(offset)`: the services write every attempt's `grpc-timeout`
    /// ([`write_grpc_timeout`](Self::write_grpc_timeout)).
    writes: Option<Duration>,
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

    /// As [`new`](Self::new), with a model of your own.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_model(bound: AttemptBound, model: LatencyModel) -> Result<Self, ConfigError> {
        bound.validate()?;
        let shared = Arc::new(Shared {
            model,
            origin: Instant::now(),
            bound,
            cached: AtomicU64::new(0),
            name: backstop_core::__private::DependencyName::default(),
            #[cfg(feature = "metrics")]
            duration: std::sync::OnceLock::new(),
        });
        Ok(Self {
            handles: stripe::Handles::new(&shared),
            shared,
            writes: None,
        })
    }

    /// Names the dependency: with the `metrics` feature, attempt durations are recorded as
    /// `backstop.client.attempt.duration{dependency}` (unnamed: `""`).
    ///
    /// # Errors
    ///
    /// When the layer already has another name.
    pub fn set_name(&self, name: &str) -> Result<(), ConfigError> {
        self.shared.name.set(name)
    }

    /// How attempts are bounded.
    pub fn bound(&self) -> AttemptBound {
        self.shared.bound
    }

    /// What the model holds now: count and quantiles of the calls of the last window.
    pub fn latency(&self) -> backstop_core::latency::LatencySnapshot {
        self.shared
            .model
            .snapshot(self.shared.now_us(Instant::now()))
    }

    /// The bound an attempt starting now would get (under the current deadline, if any).
    pub fn current_bound(&self) -> Option<Duration> {
        let deadline = crate::current().map(|d| d.instant());
        self.shared.bound_at(Instant::now(), deadline, false)
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
        Ok(MeasuredDelay {
            shared: self.shared.clone(),
            quantile,
            cached: Arc::new(AtomicU64::new(0)),
        })
    }
}

impl AttemptTimeoutLayer {
    /// A retry reserve read from this layer's latency model (for backstop-retry's
    /// `RetryConfig::reserve`, through [`RetryReserve`](backstop_core::RetryReserve)): the
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
        Ok(MeasuredDelay {
            shared: self.shared.clone(),
            quantile,
            cached: Arc::new(AtomicU64::new(0)),
        })
    }
}

/// A duration that follows the dependency's measured latency: a hedge delay
/// ([`AttemptTimeoutLayer::hedge_delay`]) or a retry reserve
/// ([`AttemptTimeoutLayer::retry_reserve`]).
///
/// Clones share one cached value: an atomic word `refresh at (ms) << 32 | delay (µs) + 1`,
/// refreshed by whichever hedged request finds it stale (racing refreshes write the same
/// value); `+ 1` keeps zero for "not trusted".
#[derive(Debug, Clone)]
pub struct MeasuredDelay {
    shared: Arc<Shared>,
    quantile: f64,
    cached: Arc<AtomicU64>,
}

impl backstop_core::HedgeDelay for MeasuredDelay {
    fn delay(&self) -> Option<Duration> {
        self.read()
    }
}

impl backstop_core::RetryReserve for MeasuredDelay {
    fn reserve(&self) -> Option<Duration> {
        self.read()
    }
}

impl MeasuredDelay {
    /// The quantile's upper edge, from the cached word while it is fresh.
    fn read(&self) -> Option<Duration> {
        let now_us = self.shared.now_us(Instant::now());
        let now_ms = now_us / 1_000;
        let word = self.cached.load(Ordering::Acquire);
        let value = if word != 0 && now_ms < word >> 32 {
            word & u64::from(u32::MAX)
        } else {
            // The bucket's upper edge, not its midpoint: a delay below the samples it stands
            // for would hedge calls of the usual latency.
            let measured = self.shared.model.quantile_ceiling(self.quantile, now_us);
            let value = measured.map_or(0, |d| {
                u64::try_from(d.as_micros())
                    .unwrap_or(u64::MAX)
                    .min(u64::from(u32::MAX) - 1)
                    + 1
            });
            let until = (now_ms + REFRESH.as_millis() as u64).min(u64::from(u32::MAX));
            self.cached.store((until << 32) | value, Ordering::Release);
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
            writes: self.writes,
        }
    }
}

impl AttemptTimeoutLayer {
    /// The same layer (sharing its model), its services writing every attempt's
    /// `grpc-timeout`: the shorter of the attempt's bound and the request's deadline less
    /// `offset`. For a stack whose outer deadline layer leaves the header to this one, as the
    /// client presets build theirs: `PropagateDeadlineLayer::send_grpc_timeout(false)` outside
    /// (with this `offset`), the retry layer's `grpc_timeout_written_inside(offset)` between.
    /// One header write per attempt, decided when the stack is built.
    ///
    /// Without it (the default) the layer only shortens a `grpc-timeout` already on the
    /// request to its bound, when that is shorter.
    ///
    /// ```
    /// use backstop_deadline::PropagateDeadlineLayer;
    /// use backstop_deadline::attempt::{AttemptBound, AttemptTimeoutLayer};
    /// use http::{Request, Response};
    /// use std::{convert::Infallible, time::Duration};
    /// use tower::{ServiceBuilder, ServiceExt, service_fn};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), backstop_core::BoxError> {
    /// let deadline = PropagateDeadlineLayer::builder()
    ///     .timeout(Duration::from_secs(2))
    ///     .offset(Duration::from_millis(10))
    ///     .build()?;
    /// let attempt = AttemptTimeoutLayer::new(AttemptBound::Fixed(Duration::from_secs(5)))?
    ///     .write_grpc_timeout(deadline.offset());
    /// let svc = ServiceBuilder::new()
    ///     .layer(deadline.send_grpc_timeout(false))
    ///     .layer(attempt)
    ///     .service(service_fn(|req: Request<String>| async move {
    ///         let told = req.headers()["grpc-timeout"].clone();
    ///         Ok::<_, Infallible>(Response::builder().header("told", told).body(String::new()).unwrap())
    ///     }));
    /// let response = svc.oneshot(Request::new(String::new())).await?;
    /// // The deadline's 2 s less the 10 ms offset: shorter than the attempt's 5 s bound.
    /// assert_eq!(response.headers()["told"], "1990m");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn write_grpc_timeout(&self, offset: Duration) -> Self {
        Self {
            writes: Some(offset),
            ..self.clone()
        }
    }
}
