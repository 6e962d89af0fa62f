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
//! 2. **The need**: the route's measured handler latency at the **median** (p50, fixed;
//!    the constant's comment says why). A least need that holds whatever was measured (or a fixed
//!    one, with admission [`off`](AdmissionLayer::off)) is the deadline layer's
//!    [`min_remaining`](crate::deadline::DeadlineLayerBuilder::min_remaining), which refuses
//!    before this layer is reached: together they refuse below the larger of the two.
//!    A route is the request's path (for gRPC, `/package.Service/Method`), hashed into one of
//!    [`routes`](AdmissionLayerBuilder::routes) models (default 16). A model measures one
//!    route, the first to arrive there; a route whose model another route holds is admitted
//!    and not measured, so no route is refused for another's latency (raise `routes` for a
//!    service with many). A model is trusted once it holds **100 samples** of its last
//!    **30 s** (the fixed window of every model; the constants' comments say why those);
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
//! whose model refused: at most [`routes`](AdmissionLayerBuilder::routes) values, whatever
//! paths clients send.
//!
//! # Ordering
//!
//! Inside [`DeadlineLayer`](crate::deadline::DeadlineLayer), which gives it the deadline:
//! `Deadline → Admission → Pushback → your service` (the `server()` preset).
//!
//! # Concurrency rule
//!
//! Clones of a layer share its models. Recording is the latency model's (one relaxed add per
//! sample, see the [latency model](crate::latency)); the cached need of a route is one word per tick (core's
//! `TickCache`, model-checked there: an atomic maximum, so a reader computing from an older
//! tick never overwrites a newer need). A model's owner is claimed once, by a compare-and-swap
//! from "none": of two routes racing for it one wins for good, the other is admitted
//! unmeasured. Needs are estimates: a request racing a rotation of the model is judged by a
//! need a moment old.

mod future;
mod service;

pub(crate) use future::AdmissionFuture;
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
/// Each model's window: the need follows the handler's latency over the last 30 s. Long
/// enough to hold [`MIN_SAMPLES`] answers of a route served a few times a second; short
/// enough that a route which got slower (or recovered) is judged by its new latency within
/// half a minute, before a deadline-bound caller's retries have all been spent on it.
const WINDOW: Duration = Duration::from_secs(30);
/// Answers a model holds before its need is trusted: 100. The median of 100 samples lies
/// between the 40th and the 60th percentile of the handler's latency 95 % of the time (a
/// binomial(100, 0.5) is within ±10 of 50), close enough to refuse on; fewer would let a
/// handful of slow first answers (a cold cache, a connection being made) refuse a route.
const MIN_SAMPLES: u64 = 100;
/// The quantile of a route's handler latency a request must have left: the median (fixed: a
/// knob once). A request with less than the median left is more likely to be cut off by its
/// deadline than to finish, so refusing it saves more work than it loses; a higher quantile
/// would refuse requests that would more likely have made it (and, near the deadline a
/// caller's retry lands on, refuse its retries too), a lower one would admit work that is
/// more likely wasted. A least time whatever was measured is the deadline layer's
/// `min_remaining`.
const QUANTILE: f64 = 0.5;
/// The routes a layer keeps models for unless told otherwise.
const DEFAULT_ROUTES: usize = 16;

/// Refuses requests whose remaining deadline is below their route's measured need (see the
/// [module docs](self)).
///
/// ```
/// use backstop::deadline::DeadlineLayer;
/// use backstop::server::admission::AdmissionLayer;
/// use std::time::Duration;
/// use tower::ServiceBuilder;
///
/// // Refused: a request with less than 5 ms left, or less than its route's p50.
/// let server = ServiceBuilder::new()
///     .layer(DeadlineLayer::builder().min_remaining(Duration::from_millis(5)).build().unwrap())
///     .layer(AdmissionLayer::builder().routes(64).build().unwrap())
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
    routes: usize,
    /// [`AdmissionLayer::off`]: no models, a need of zero.
    off: bool,
}

#[derive(Debug)]
pub(crate) struct Shared {
    start: Instant,
    /// [`AdmissionLayer::off`]: a need of zero, nothing measured.
    off: bool,
    /// The count of route slots (the deadline layer of `server()` labels as many).
    routes: usize,
    /// The routes: each model measures the path that holds its slot (claimed by the first
    /// request hashed there); another path hashed there is admitted unmeasured.
    slots: RouteSlots,
    /// One per slot, or none when off.
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
    /// The defaults: p50 of each of 16 routes' handler latency over 30 s, trusted from 100
    /// samples.
    pub fn new() -> Self {
        Self::builder().build().expect("the defaults are valid")
    }

    /// A builder for tuned knobs.
    pub fn builder() -> AdmissionLayerBuilder {
        AdmissionLayerBuilder {
            routes: DEFAULT_ROUTES,
            off: false,
        }
    }

    /// A layer that refuses nothing and measures nothing (a need of zero): every request
    /// passes (its response body wrapped, so the stack's type stays the same). For a stack
    /// whose type has admission in it, such as the `server()` preset, to turn it off. A
    /// fixed need instead of a measured one is the deadline layer's
    /// [`min_remaining`](crate::deadline::DeadlineLayerBuilder::min_remaining) with admission
    /// off.
    ///
    /// ```
    /// use backstop::server::admission::AdmissionLayer;
    /// use std::time::Duration;
    ///
    /// assert_eq!(AdmissionLayer::off().need("/any"), Some(Duration::ZERO));
    /// ```
    pub fn off() -> Self {
        AdmissionLayerBuilder {
            off: true,
            ..Self::builder()
        }
        .build()
        .expect("the defaults are valid")
    }

    /// What a request to `path` needs now: `None` while its model is not trusted (admitted).
    pub fn need(&self, path: &str) -> Option<Duration> {
        let us = self.shared.need_us(self.shared.route(path), Instant::now());
        (us != UNTRUSTED).then(|| Duration::from_micros(us))
    }

    /// The count of route slots.
    pub(crate) fn routes(&self) -> usize {
        self.shared.routes
    }
}

impl Default for AdmissionLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl AdmissionLayerBuilder {
    /// Latency models, each measuring the first route whose path hashes to it (default 16,
    /// 1..=1024; 4 KiB each); a route whose model another holds is admitted unmeasured. Also
    /// the bound on the `route` values of the layer's metric (see the [module docs](self)),
    /// and, in the `server()` preset, of the deadline layer's.
    #[must_use]
    pub fn routes(mut self, routes: usize) -> Self {
        self.routes = routes;
        self
    }

    /// Checks the knobs and builds the layer.
    ///
    /// # Errors
    ///
    /// When `routes` is not in 1..=1024.
    pub fn build(self) -> Result<AdmissionLayer, ConfigError> {
        if !(1..=1024).contains(&self.routes) {
            return Err(ConfigError::new(
                "routes",
                format!("must be in 1..=1024, got {}", self.routes),
            ));
        }
        let routes = if self.off { 0 } else { self.routes };
        let models = (0..routes)
            .map(|_| {
                Ok(Route {
                    model: LatencyModel::builder()
                        .window(WINDOW)
                        .min_samples(MIN_SAMPLES)
                        .build()?,
                    cached: TickCache::new(),
                })
            })
            .collect::<Result<Box<[Route]>, ConfigError>>()?;
        Ok(AdmissionLayer {
            shared: Arc::new(Shared {
                start: Instant::now(),
                off: self.off,
                routes: self.routes,
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
    /// and unmeasured, when off or when another path holds the slot, so a route is never
    /// refused for another route's latency.
    pub(crate) fn route(&self, path: &str) -> usize {
        if self.models.is_empty() {
            return usize::MAX;
        }
        self.slots.slot(path).unwrap_or(usize::MAX)
    }

    /// Counts a refusal of `path` under its model's slot, `route` (only a measured route is
    /// refused, so it holds one).
    #[cfg(feature = "metrics")]
    pub(crate) fn count_refusal(&self, route: usize, path: &str) {
        let slot = (route < self.slots.len()).then_some(route);
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
        if self.off {
            return 0;
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
        let need = match r.model.quantile(QUANTILE, now_us) {
            Some(q) => (q.as_micros() as u64).min(UNTRUSTED - 1),
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
        assert_eq!(knob(b().routes(0).build()), "routes");
        assert_eq!(knob(b().routes(2000).build()), "routes");
        assert!(b().build().is_ok());
        assert!(b().routes(1024).build().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn the_need_follows_the_route_once_trusted() {
        let layer = AdmissionLayer::new();
        let shared = &layer.shared;
        let (fast, slow) = (shared.route("/fast"), shared.route("/slow"));
        assert_ne!(fast, slow, "these two paths hash apart");
        let now = Instant::now();
        for _ in 0..MIN_SAMPLES - 1 {
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
    fn off_keeps_no_model_and_refuses_nothing() {
        let layer = AdmissionLayer::off();
        assert!(!layer.shared.measures());
        assert_eq!(layer.need("/any"), Some(Duration::ZERO));
        let route = layer.shared.route("/any");
        assert!(!layer.shared.refuses(route, Duration::ZERO, Instant::now()));
        assert_eq!(
            layer.routes(),
            DEFAULT_ROUTES,
            "the deadline layer's labels follow"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_model_forgets_what_is_older_than_its_window() {
        let layer = AdmissionLayer::new();
        let shared = &layer.shared;
        let slow = shared.route("/slow");
        for _ in 0..MIN_SAMPLES {
            shared.record(slow, Duration::from_millis(200), Instant::now());
        }
        tokio::time::advance(TICK).await;
        assert!(layer.need("/slow").is_some(), "trusted");
        // Past the window, the samples are gone: cold again, every request admitted.
        tokio::time::advance(2 * WINDOW).await;
        assert_eq!(layer.need("/slow"), None);
    }
}
