//! Deadline-aware admission (servers): a request whose remaining deadline is below what the
//! handler needs is refused at once, without running the handler.
//!
//! # Why
//!
//! An overloaded server that starts every request does work whose caller will have left:
//! Google's SRE book ("Addressing Cascading Failures") has the server look at the remaining
//! time and reject the calls that would exceed it. Refusing costs microseconds; the handler's
//! work goes to requests that can still be answered in time.
//!
//! # Semantics
//!
//! For each request:
//!
//! 1. **No deadline** (no [`Deadline`](crate::deadline::Deadline) extension, which an outer
//!    [`DeadlineLayer`](crate::deadline::DeadlineLayer) puts on a request with a deadline): it
//!    passes, and its handler's latency is measured. (The layer reads the request only, not
//!    [`current()`](crate::deadline::current): that is for handlers.)
//! 2. **The need**: the route's measured handler latency at the [`quantile`](AdmissionLayerBuilder::quantile)
//!    (default the median, p50), at least [`min_need`](AdmissionLayerBuilder::min_need)
//!    (default 0); or a [`fixed`](AdmissionLayerBuilder::fixed) need instead of measuring.
//!    A route is the request's path (for gRPC, `/package.Service/Method`), hashed into one of
//!    [`routes`](AdmissionLayerBuilder::routes) models (default 16). A model measures one
//!    route, the first to arrive there; a route whose model another route holds is admitted
//!    and not measured, so no route is refused for another's latency (raise `routes` for a
//!    service with many). A model is trusted once it holds [`min_samples`](AdmissionLayerBuilder::min_samples)
//!    samples (default 100) of its [`window`](AdmissionLayerBuilder::window) (default 30 s);
//!    until then (**cold start**) every request is admitted. The need is read from the model
//!    at most every 100 ms and cached.
//! 3. **The rule**: remaining deadline < need → refused with DEADLINE_EXCEEDED
//!    (gRPC trailers-only, `grpc-status: 4`) or HTTP 504, carrying
//!    [`Rejection::DeadlineExceeded`](crate::Rejection) and
//!    [`NotExecuted`](crate::NotExecuted) (an idempotency layer outside releases the
//!    request's key); the handler is not called.
//!    Otherwise the handler runs.
//! 4. **Measured**: the time from the handler's `call` to its response (or error), for every
//!    request it answers. A handler dropped before it answers (its deadline cancelled it, the
//!    client left) is not measured: the model is of what the handler takes to finish.
//!    Measuring a handler cancelled at its deadline as needing at least the time it had
//!    (a censored sample) was tried and measured in the storm lab's `overload` scenario with
//!    no bulkhead: goodput did not move (255.6/s either way), but once the fault ended the
//!    need stayed at the deadline, every request was refused, and refused requests teach the
//!    model nothing, so the route did not recover within the run (it recovers at once
//!    without them). BENCHMARKS.md has the numbers.
//!
//! Metric (feature `metrics`): `backstop.admission.rejections`, labelled `route` with the path
//! whose model refused (with a fixed need, which keeps no models, the path that holds the
//! refused request's slot, claimed then): at most [`routes`](AdmissionLayerBuilder::routes)
//! values, whatever paths clients send; a path whose slot another holds is counted without
//! `route`.
//!
//! # Ordering
//!
//! Inside [`DeadlineLayer`](crate::deadline::DeadlineLayer), which gives it the deadline:
//! `Deadline → Admission → Pushback → your service` (the `server()` preset).
//!
//! # Concurrency rule
//!
//! Clones of a layer share its models. Recording is the latency model's (one relaxed add per
//! sample, see [`LatencyModel`]); the cached need of a route is one word per tick (core's
//! `TickCache`, model-checked there: an atomic maximum, so a reader computing from an older
//! tick never overwrites a newer need). A model's owner is claimed once, by a compare-and-swap
//! from "none": of two routes racing for it one wins for good, the other is admitted
//! unmeasured. Needs are estimates: a request racing a rotation of the model is judged by a
//! need a moment old.

mod future;
mod service;

pub use future::AdmissionFuture;
pub use service::Admission;

use crate::ConfigError;
use crate::deadline::route::RouteSlots;
use crate::latency::LatencyModel;
use crate::rt::tick::TickCache;
use std::{sync::Arc, time::Duration};
use tokio::time::Instant;
use tower_layer::Layer;

/// The cached need's refresh period.
const TICK: Duration = Duration::from_millis(100);
/// The cached value of an untrusted model: admit.
const UNTRUSTED: u64 = u32::MAX as u64;

/// Refuses requests whose remaining deadline is below their route's measured need (see the
/// [module docs](self)).
///
/// ```
/// use backstop::deadline::DeadlineLayer;
/// use backstop::server::admission::AdmissionLayer;
/// use std::time::Duration;
/// use tower::ServiceBuilder;
///
/// let server = ServiceBuilder::new()
///     .layer(DeadlineLayer::new())
///     .layer(AdmissionLayer::builder().quantile(0.9).min_need(Duration::from_millis(5)).build().unwrap())
///     .service(tower::service_fn(|_req: http::Request<String>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
///     }));
/// # let _ = server;
/// ```
#[derive(Debug, Clone)]
pub struct AdmissionLayer {
    shared: Arc<Shared>,
}

/// Builds an [`AdmissionLayer`].
#[derive(Debug, Clone)]
pub struct AdmissionLayerBuilder {
    quantile: f64,
    min_need: Duration,
    fixed: Option<Duration>,
    routes: usize,
    window: Duration,
    min_samples: u64,
}

#[derive(Debug)]
pub(crate) struct Shared {
    start: Instant,
    quantile: f64,
    min_need_us: u64,
    fixed_us: Option<u64>,
    /// The routes: each model measures the path that holds its slot (claimed by the first
    /// request hashed there); another path hashed there is admitted unmeasured.
    slots: RouteSlots,
    /// One per slot, or none with a fixed need.
    models: Box<[Route]>,
    /// `backstop.admission.rejections`, per slot.
    #[cfg(feature = "metrics")]
    rejections: crate::deadline::route::RouteCounters,
}

#[derive(Debug)]
struct Route {
    model: LatencyModel,
    /// The need in µs (`UNTRUSTED`: admit), per tick.
    cached: TickCache,
}

impl AdmissionLayer {
    /// The defaults: p50 of each route's handler latency over 30 s, trusted from 100 samples.
    pub fn new() -> Self {
        Self::builder().build().expect("the defaults are valid")
    }

    /// A builder for tuned knobs.
    pub fn builder() -> AdmissionLayerBuilder {
        AdmissionLayerBuilder {
            quantile: 0.5,
            min_need: Duration::ZERO,
            fixed: None,
            routes: 16,
            window: Duration::from_secs(30),
            min_samples: 100,
        }
    }

    /// A layer that refuses nothing and measures nothing (a fixed need of zero): every
    /// request passes (its response body wrapped, so the stack's type stays the same). For a
    /// stack whose type has admission in it, such as the `server()` preset, to turn
    /// it off.
    ///
    /// ```
    /// use backstop::server::admission::AdmissionLayer;
    /// use std::time::Duration;
    ///
    /// assert_eq!(AdmissionLayer::off().need("/any"), Some(Duration::ZERO));
    /// ```
    pub fn off() -> Self {
        Self::builder()
            .fixed(Duration::ZERO)
            .build()
            .expect("a valid need")
    }

    /// What a request to `path` needs now: `None` while its model is not trusted (admitted).
    pub fn need(&self, path: &str) -> Option<Duration> {
        let us = self.shared.need_us(self.shared.route(path), Instant::now());
        (us != UNTRUSTED).then(|| Duration::from_micros(us))
    }
}

impl Default for AdmissionLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl AdmissionLayerBuilder {
    /// The quantile of the route's handler latency a request must have left (default 0.5,
    /// in (0, 1)): higher refuses more of the requests that could still have made it.
    #[must_use]
    pub fn quantile(mut self, quantile: f64) -> Self {
        self.quantile = quantile;
        self
    }

    /// The least a request must have left, whatever was measured (default 0).
    #[must_use]
    pub fn min_need(mut self, min_need: Duration) -> Self {
        self.min_need = min_need;
        self
    }

    /// A fixed need instead of a measured one (no models are kept).
    #[must_use]
    pub fn fixed(mut self, need: Duration) -> Self {
        self.fixed = Some(need);
        self
    }

    /// Latency models, each measuring the first route whose path hashes to it (default 16,
    /// 1..=1024; 4 KiB each); a route whose model another holds is admitted unmeasured. Also
    /// the bound on the `route` values of the layer's metric (see the [module docs](self)).
    #[must_use]
    pub fn routes(mut self, routes: usize) -> Self {
        self.routes = routes;
        self
    }

    /// The models' window (default 30 s; see [`LatencyModel`]).
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Samples a model needs before it is trusted (default 100).
    #[must_use]
    pub fn min_samples(mut self, min_samples: u64) -> Self {
        self.min_samples = min_samples;
        self
    }

    /// Checks the knobs and builds the layer.
    ///
    /// # Errors
    ///
    /// When `quantile` is not in (0, 1), `min_need` or `fixed` exceeds an hour, `routes` is
    /// not in 1..=1024, or the model's `window` / `min_samples` are invalid (as
    /// [`LatencyModel`]'s builder says).
    pub fn build(self) -> Result<AdmissionLayer, ConfigError> {
        if !(self.quantile > 0.0 && self.quantile < 1.0) {
            return Err(ConfigError::new(
                "quantile",
                format!("must be in (0, 1), got {}", self.quantile),
            ));
        }
        let hour = Duration::from_secs(3600);
        if self.min_need > hour {
            return Err(ConfigError::new(
                "min_need",
                format!("must be at most 1 hour, got {:?}", self.min_need),
            ));
        }
        if self.fixed.is_some_and(|f| f > hour) {
            return Err(ConfigError::new(
                "fixed",
                format!("must be at most 1 hour, got {:?}", self.fixed),
            ));
        }
        if !(1..=1024).contains(&self.routes) {
            return Err(ConfigError::new(
                "routes",
                format!("must be in 1..=1024, got {}", self.routes),
            ));
        }
        let routes = if self.fixed.is_some() { 0 } else { self.routes };
        let models = (0..routes)
            .map(|_| {
                Ok(Route {
                    model: LatencyModel::builder()
                        .window(self.window)
                        .min_samples(self.min_samples)
                        .build()?,
                    cached: TickCache::new(),
                })
            })
            .collect::<Result<Box<[Route]>, ConfigError>>()?;
        Ok(AdmissionLayer {
            shared: Arc::new(Shared {
                start: Instant::now(),
                quantile: self.quantile,
                min_need_us: self.min_need.as_micros() as u64,
                fixed_us: self.fixed.map(|f| f.as_micros() as u64),
                slots: RouteSlots::new(self.routes),
                models,
                #[cfg(feature = "metrics")]
                rejections: crate::deadline::route::RouteCounters::new(self.routes),
            }),
        })
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Admission::from_shared(inner, self.shared.clone())
    }
}

impl Shared {
    fn micros(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.start).as_micros()).unwrap_or(u64::MAX)
    }

    /// The model of `path`: the slot it holds (see [`RouteSlots`]); `usize::MAX`, admitted
    /// and unmeasured, with a fixed need or when another path holds the slot, so a route is
    /// never refused for another route's latency.
    pub(crate) fn route(&self, path: &str) -> usize {
        if self.models.is_empty() {
            return usize::MAX;
        }
        self.slots.slot(path).unwrap_or(usize::MAX)
    }

    /// Counts a refusal of `path`, whose model is `route`, under the path that holds its slot
    /// (a fixed need keeps no models: the slot is claimed here).
    #[cfg(feature = "metrics")]
    pub(crate) fn count_refusal(&self, route: usize, path: &str) {
        let slot = if route < self.slots.len() {
            Some(route)
        } else {
            self.slots.slot(path)
        };
        self.rejections.increment(slot, path, |route| {
            crate::rt::metrics::describe();
            let name = crate::metrics::ADMISSION_REJECTIONS;
            match route {
                Some(route) => metrics::counter!(name, "route" => route),
                None => metrics::counter!(name),
            }
        });
    }

    /// The need of `route`'s requests in µs (`UNTRUSTED`: admit).
    #[inline]
    pub(crate) fn need_us(&self, route: usize, now: Instant) -> u64 {
        if let Some(fixed) = self.fixed_us {
            return fixed.max(self.min_need_us);
        }
        let Some(r) = self.models.get(route) else {
            return UNTRUSTED;
        };
        let now_us = self.micros(now);
        let tick = now_us / TICK.as_micros() as u64;
        match r.cached.get(tick) {
            Some(need) => u64::from(need),
            None => self.refresh(r, now_us, tick),
        }
    }

    #[cold]
    #[inline(never)]
    fn refresh(&self, r: &Route, now_us: u64, tick: u64) -> u64 {
        let need = match r.model.quantile(self.quantile, now_us) {
            Some(q) => (q.as_micros() as u64)
                .max(self.min_need_us)
                .min(UNTRUSTED - 1),
            None => UNTRUSTED,
        };
        u64::from(r.cached.publish(tick, need as u32))
    }

    /// A handler of `route` answered after `latency`.
    #[inline]
    pub(crate) fn record(&self, route: usize, latency: Duration, now: Instant) {
        if let Some(r) = self.models.get(route) {
            r.model.record(latency, self.micros(now));
        }
    }

    /// Whether `route`'s handler must be measured at all.
    pub(crate) fn measures(&self) -> bool {
        !self.models.is_empty()
    }

    /// Whether a request with `remaining` time left is refused.
    pub(crate) fn refuses(&self, route: usize, remaining: Duration, now: Instant) -> bool {
        let need = self.need_us(route, now);
        need != UNTRUSTED && (remaining.as_micros() as u64) < need
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_names_its_knob() {
        let b = AdmissionLayer::builder;
        let knob = |r: Result<AdmissionLayer, ConfigError>| r.unwrap_err().knob().to_owned();
        assert_eq!(knob(b().quantile(0.0).build()), "quantile");
        assert_eq!(knob(b().quantile(1.0).build()), "quantile");
        assert_eq!(
            knob(b().min_need(Duration::from_secs(4000)).build()),
            "min_need"
        );
        assert_eq!(knob(b().fixed(Duration::from_secs(4000)).build()), "fixed");
        assert_eq!(knob(b().routes(0).build()), "routes");
        assert_eq!(knob(b().routes(2000).build()), "routes");
        assert!(b().min_samples(0).build().is_err());
        assert!(b().build().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn the_need_follows_the_route_once_trusted() {
        let layer = AdmissionLayer::builder().min_samples(10).build().unwrap();
        let shared = &layer.shared;
        let (fast, slow) = (shared.route("/fast"), shared.route("/slow"));
        assert_ne!(fast, slow, "these two paths hash apart");
        let now = Instant::now();
        for _ in 0..9 {
            shared.record(slow, Duration::from_millis(200), now);
        }
        assert_eq!(layer.need("/slow"), None, "cold: admitted");
        shared.record(slow, Duration::from_millis(200), now);
        assert_eq!(layer.need("/slow"), None, "cached for the tick");
        tokio::time::advance(TICK).await;
        let need = layer.need("/slow").unwrap();
        assert!((190..=210).contains(&need.as_millis()), "{need:?}");
        assert_eq!(layer.need("/fast"), None);
        assert!(shared.refuses(slow, Duration::from_millis(100), Instant::now()));
        assert!(!shared.refuses(slow, Duration::from_millis(300), Instant::now()));
        assert!(!shared.refuses(fast, Duration::ZERO, Instant::now()));
    }

    #[test]
    fn a_fixed_need_keeps_no_model() {
        let layer = AdmissionLayer::builder()
            .fixed(Duration::from_millis(50))
            .build()
            .unwrap();
        assert!(!layer.shared.measures());
        assert_eq!(layer.need("/any"), Some(Duration::from_millis(50)));
    }
}
