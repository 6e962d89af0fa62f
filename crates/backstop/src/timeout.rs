//! The per-attempt timeout that sits inside the breaker, so a timed-out attempt is a failure
//! the breaker counts (a timeout outside it would cancel the call, which counts as nothing),
//! and the latency model it feeds.
//!
//! # How the bound is picked
//!
//! [`AttemptBound::Adaptive`] (the presets' default): `clamp(p99 × 3, floor, ceiling)` from
//! the dependency's own [`LatencyModel`], re-read at most every 100 ms, with a floor of 1 s
//! and a ceiling of 10 s by default, and never more than 80 % of what is left of the
//! request's deadline ([`Adaptive::deadline_share`]): an attempt to a dependency slower than
//! its callers' deadlines then times out before the deadline, a failure the breaker counts,
//! where an expired deadline (the caller's own) would count as nothing. The share is kept
//! only where a retry may follow: an attempt marked [`FinalAttempt`] (the retry layer marks a
//! call it sends once and its last attempt by count) may take the whole deadline, as gRPC's
//! own clients give a single-attempt call. Until the model holds
//! 100 samples (the first seconds of traffic, or after an idle spell), the `ceiling` applies.
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
//! saw the tail shorter than it is and hedged too early (a log-normal dependency with a true
//! p99 of 102 ms read as 52 ms, and 8 % of calls were hedged at the "p95"; with them, 4.9 %,
//! at the true p95). Quantiles up to the hedge delay read right; above it, where a censored
//! sample says only "at least", they read low (that p99 as 68 ms).
//!
//! Why a floor of 1 s: a latency *step* of more than 3× looks, at first, exactly like a hang.
//! With a bound of p99 × 3 of a fast dependency (say 30 ms), every call is cut the moment
//! its latency steps to 200 ms, and the breaker, which counts timeouts as failures, opens
//! long before the censored samples have raised the bound: in the storm lab's brownout (10 →
//! 210 ms and half the calls failing, 1000 requests/s), a 10 ms floor opened the breaker 10
//! times and kept 45.1 % of calls (an earlier build), where a floor of 1 s keeps the 76.6 % of a fixed bound.
//! So by default the measured bound only matters for dependencies whose p99 is above 333 ms,
//! and a dependency that hangs is cut after 1 s. Lower the floor for a dependency whose
//! latency you know to be steady.
//!
//! # Concurrency rule
//!
//! Clones of one layer share one model and one cached bound (an atomic word, refreshed by
//! whichever attempt finds it stale; racing refreshes write the same value). Each attempt
//! holds its core's handle to them (`backstop_core::__private::stripe`), so no reference count is
//! shared across cores. An attempt answered on its first poll reads no clock and records
//! nothing (it took no measurable time); every other attempt reads the clock when it first
//! waits and when it ends (or is dropped).

use backstop_core::__private::timer::LazySleep;
use backstop_core::{
    __private::stripe, AttemptTimedOut, BoxError, ConfigError, FinalAttempt, latency::LatencyModel,
};
use http::Request;
use pin_project_lite::pin_project;
use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

/// How each attempt is bounded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AttemptBound {
    /// No bound of its own: the request's deadline alone ends it.
    None,
    /// The same bound for every attempt.
    Fixed(Duration),
    /// A bound derived from measured latency.
    Adaptive(Adaptive),
}

/// `clamp(quantile × multiplier, floor, ceiling)` of the dependency's measured latency; see the
/// [module docs](self) for the defaults and why.
///
/// ```
/// use backstop::timeout::Adaptive;
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
    quantile: f64,
    multiplier: f64,
    floor: Duration,
    ceiling: Duration,
    deadline_share: f64,
}

impl Default for Adaptive {
    fn default() -> Self {
        Self::new()
    }
}

impl Adaptive {
    /// p99 × 3, at least 1 s, at most 10 s (and 10 s until the model is trusted); see the
    /// [module docs](self) for why.
    pub fn new() -> Self {
        Self {
            quantile: 0.99,
            multiplier: 3.0,
            floor: Duration::from_secs(1),
            ceiling: Duration::from_secs(10),
            deadline_share: 0.8,
        }
    }

    /// The quantile the bound is taken from, in [0.5, 1) (default 0.99).
    #[must_use]
    pub fn quantile(mut self, q: f64) -> Self {
        self.quantile = q;
        self
    }

    /// How many times the quantile an attempt may take, at least 1 (default 3).
    #[must_use]
    pub fn multiplier(mut self, n: f64) -> Self {
        self.multiplier = n;
        self
    }

    /// The shortest bound (default 1 s; more than zero).
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
    /// attempt may take (default 0.8): the attempt then times out, and the breaker counts it,
    /// before the deadline expires (an expired deadline is the caller's, never counted). Not
    /// applied to an attempt marked [`FinalAttempt`]: no retry needs the room. In
    /// the lab, when it was chosen, 0.8 kept the brownout's success of a fixed half-deadline
    /// bound (76.9 %) and lifted the slow scenario's from 45.1 % to 50.0 %; 0.5 cost retries
    /// their time (76.7 %).
    #[must_use]
    pub fn deadline_share(mut self, share: f64) -> Self {
        self.deadline_share = share;
        self
    }

    /// Checks every knob.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `quantile`, `multiplier`, `deadline_share`, `floor` or
    /// `ceiling`.
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
        if self.floor.is_zero() {
            return Err(ConfigError::new("floor", "must be greater than zero"));
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

    fn bound(&self, measured: Option<Duration>) -> Duration {
        match measured {
            Some(q) => q.mul_f64(self.multiplier).clamp(self.floor, self.ceiling),
            None => self.ceiling,
        }
    }
}

impl AttemptBound {
    fn validate(&self) -> Result<(), ConfigError> {
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

/// `d` rounded down to three significant digits of microseconds.
fn three_digits(d: Duration) -> Duration {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let mut scale = 1;
    while us / scale >= 1_000 {
        scale *= 10;
    }
    Duration::from_micros(us / scale * scale)
}

/// How often a cached adaptive bound is read again from the model.
const REFRESH: Duration = Duration::from_millis(100);

/// What every clone of one layer shares: the model and the cached bound.
#[derive(Debug)]
pub(crate) struct Shared {
    model: LatencyModel,
    origin: Instant,
    bound: AttemptBound,
    /// `refresh at (ms since origin) << 32 | bound (µs)`; zero: never computed.
    cached: AtomicU64,
    name: backstop_core::__private::DependencyName,
    /// `backstop.client.attempt.duration`, registered on the first attempt that waited.
    #[cfg(feature = "metrics")]
    duration: std::sync::OnceLock<metrics::Histogram>,
}

impl Shared {
    /// An attempt that waited ended after `took` (feature `metrics`; otherwise nothing).
    #[inline(always)]
    fn meter_duration(&self, took: Duration) {
        #[cfg(feature = "metrics")]
        self.duration
            .get_or_init(|| {
                use backstop_core::metrics as names;
                backstop_core::__private::metrics::describe();
                metrics::histogram!(
                    names::CLIENT_ATTEMPT_DURATION,
                    "dependency" => self.name.get().to_owned()
                )
            })
            .record(took.as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = took;
    }

    fn now_us(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.origin).as_micros()).unwrap_or(u64::MAX)
    }

    /// `bound`, at most the adaptive bound's share of what is left of the request's deadline
    /// at `now` (a fixed bound is taken as given). A share is rounded down to three
    /// significant digits (at most 1 % shorter): calls a few microseconds apart then get the
    /// same bound, so its header value is reused rather than encoded and allocated again (and
    /// HPACK can index it).
    fn capped(
        &self,
        bound: Duration,
        now: Instant,
        deadline: Option<Instant>,
        whole: bool,
    ) -> Duration {
        if let AttemptBound::Adaptive(a) = self.bound
            && let Some(deadline) = deadline
        {
            let left = deadline.saturating_duration_since(now);
            // Integer arithmetic: Duration::mul_f64 goes through floating-point seconds.
            let left_us = u64::try_from(left.as_micros()).unwrap_or(u64::MAX);
            // A final attempt may take all that is left: its share was room for a retry.
            let share_ppm = if whole {
                1_000_000
            } else {
                (a.deadline_share * 1e6) as u64
            };
            let share = Duration::from_micros(
                u64::try_from(u128::from(left_us) * u128::from(share_ppm) / 1_000_000)
                    .unwrap_or(u64::MAX),
            );
            if share < bound {
                return three_digits(share);
            }
        }
        bound
    }

    /// Whether the bound depends on the request's deadline (an adaptive one takes at most its
    /// share of what is left).
    #[inline]
    fn capped_by_deadline(&self) -> bool {
        matches!(self.bound, AttemptBound::Adaptive(_))
    }

    /// The bound of an attempt that starts at `now` under `deadline` (the request's): the
    /// fixed one, or the adaptive one from the model, capped by the deadline's share.
    fn bound_at(&self, now: Instant, deadline: Option<Instant>, whole: bool) -> Option<Duration> {
        self.model_bound(now)
            .map(|bound| self.capped(bound, now, deadline, whole))
    }

    /// The fixed bound, or the adaptive one from the model (cached for 100 ms), uncapped.
    fn model_bound(&self, now: Instant) -> Option<Duration> {
        let adaptive = match self.bound {
            AttemptBound::None => return None,
            AttemptBound::Fixed(d) => return Some(d),
            AttemptBound::Adaptive(a) => a,
        };
        let now_us = self.now_us(now);
        let now_ms = now_us / 1_000;
        let word = self.cached.load(Ordering::Acquire);
        if word != 0 && now_ms < word >> 32 {
            return Some(Duration::from_micros(word & u64::from(u32::MAX)));
        }
        let measured = self.model.quantile(adaptive.quantile, now_us);
        let bound = adaptive.bound(measured);
        let us = u64::try_from(bound.as_micros())
            .unwrap_or(u64::MAX)
            .min(u64::from(u32::MAX));
        let until = (now_ms + REFRESH.as_millis() as u64).min(u64::from(u32::MAX));
        self.cached.store((until << 32) | us, Ordering::Release);
        Some(Duration::from_micros(us))
    }
}

/// Bounds each call (an attempt, under the retry layer) and measures how long it took.
///
/// Clones share one [`LatencyModel`] ([`AttemptTimeoutLayer::latency`]); with
/// [`AttemptBound::Adaptive`] they share the bound derived from it. A call that runs out of
/// time fails with [`AttemptTimedOut`] and is recorded at its bound.
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
        #[cfg(feature = "deadline")]
        let deadline = backstop_deadline::current().map(|d| d.instant());
        #[cfg(not(feature = "deadline"))]
        let deadline = None;
        self.shared.bound_at(Instant::now(), deadline, false)
    }
}

#[cfg(feature = "retry")]
impl AttemptTimeoutLayer {
    /// A hedge delay read from this layer's latency model: the `quantile` of the calls of the
    /// last window, read as the upper edge of its bucket (at most 6.25 % above it, never below
    /// the samples it stands for; the client preset's [`hedging`](crate::client::ClientLayer::hedging) uses
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

/// A hedge delay that follows the dependency's measured latency
/// ([`AttemptTimeoutLayer::hedge_delay`]).
///
/// Clones share one cached value: an atomic word `refresh at (ms) << 32 | delay (µs) + 1`,
/// refreshed by whichever hedged request finds it stale (racing refreshes write the same
/// value); `+ 1` keeps zero for "not trusted".
#[cfg(feature = "retry")]
#[derive(Debug, Clone)]
pub struct MeasuredDelay {
    shared: Arc<Shared>,
    quantile: f64,
    cached: Arc<AtomicU64>,
}

#[cfg(feature = "retry")]
impl backstop_retry::hedge::HedgeDelay for MeasuredDelay {
    fn delay(&self) -> Option<Duration> {
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
    /// use backstop::deadline::PropagateDeadlineLayer;
    /// use backstop::timeout::{AttemptBound, AttemptTimeoutLayer};
    /// use http::{Request, Response};
    /// use std::{convert::Infallible, time::Duration};
    /// use tower::{ServiceBuilder, ServiceExt, service_fn};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), backstop::BoxError> {
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
    #[cfg(feature = "deadline")]
    #[must_use]
    pub fn write_grpc_timeout(&self, offset: Duration) -> Self {
        Self {
            writes: Some(offset),
            ..self.clone()
        }
    }
}

/// The service of [`AttemptTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct AttemptTimeout<S> {
    inner: S,
    handles: stripe::Handles<Shared>,
    /// `Some(offset)`: this layer writes every attempt's `grpc-timeout` (its outer deadline
    /// layer does not); `None`: it only shortens a header already on the request.
    writes: Option<Duration>,
}

impl<S, B, RB> Service<Request<B>> for AttemptTimeout<S>
where
    S: Service<Request<B>, Response = http::Response<RB>>,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<RB>;
    type Error = BoxError;
    type Future = AttemptTimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let handle = self.handles.current().clone();
        let told = write_attempt_grpc_timeout(&handle, self.writes, &mut req);
        let deadline = match told {
            Some(_) => None,
            // Only an adaptive bound is capped by the deadline, and only where a retry may
            // follow (the cap leaves it room).
            None if handle.capped_by_deadline() => request_deadline(&req),
            None => None,
        };
        let whole = FinalAttempt::is_on(&req);
        AttemptTimeoutFuture {
            future: self.inner.call(req),
            handle,
            told,
            start: None,
            deadline,
            whole,
            sleep: LazySleep::new(),
        }
    }
}

/// The request's deadline, if it carries one: the earlier of its `Deadline` extension (an
/// outer `PropagateDeadline` that leaves the header to this layer, or the retry layer) and
/// what its `grpc-timeout` says is left.
#[cfg(feature = "deadline")]
#[inline]
fn request_deadline<B>(req: &Request<B>) -> Option<Instant> {
    let carried = req
        .extensions()
        .get::<backstop_deadline::Deadline>()
        .map(|d| d.instant());
    // A deadline layer that writes its header carries the deadline there. The names of a
    // small map are compared first: cheaper than hashing a custom name for the many requests
    // without it.
    let headers = req.headers();
    let name = backstop_core::grpc::GRPC_TIMEOUT;
    if headers.keys_len() <= 8 && !headers.keys().any(|n| *n == name) {
        return carried;
    }
    let told = headers
        .get(name)
        .and_then(|v| backstop_deadline::grpc_timeout::decode_header(v).ok())
        .and_then(|left| Instant::now().checked_add(left));
    // The earlier of the two: neither may say more time than the other allows.
    match (carried, told) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(not(feature = "deadline"))]
#[inline]
fn request_deadline<B>(_: &Request<B>) -> Option<Instant> {
    None
}

/// Writes the attempt's `grpc-timeout` where it is this layer's to write, and returns the
/// bound written and when it ends (the attempt's timer ends then too), or `None` when none
/// was, and the timer picks the bound when the attempt first waits.
///
/// - `writes` is `Some(offset)` (the client presets, decided when the stack is built: their
///   deadline layer writes no header): with a deadline on the request, this layer is the one
///   writer of every attempt's header, the shorter of its bound and the deadline less
///   `offset`.
/// - Otherwise, when the request already tells the server how long it has (an outer
///   `PropagateDeadline` or the retry layer wrote it) and the attempt's bound is shorter, the
///   header is rewritten to the bound: the server gives up when this attempt will.
#[cfg(feature = "deadline")]
#[inline(always)]
fn write_attempt_grpc_timeout<B>(
    shared: &Shared,
    writes: Option<Duration>,
    req: &mut Request<B>,
) -> Option<(Duration, Instant)> {
    use backstop_core::grpc::GRPC_TIMEOUT;
    use backstop_deadline::grpc_timeout;
    // Needed to write the header, or to cap an adaptive bound.
    let deadline = if writes.is_some() || shared.capped_by_deadline() {
        request_deadline(req)
    } else {
        None
    };
    // The instant the server is to be told, when this layer is the header's writer.
    let owed = writes
        .zip(deadline)
        .map(|(offset, at)| at.checked_sub(offset).unwrap_or(at));
    if matches!(shared.bound, AttemptBound::None) && owed.is_none() {
        return None;
    }
    let header = match owed {
        Some(_) => None,
        None => Some(
            req.headers()
                .get(GRPC_TIMEOUT)
                .and_then(|v| grpc_timeout::decode_header(v).ok())?,
        ),
    };
    let now = Instant::now();
    // The last attempt gets the whole deadline: its share was kept for a retry.
    let bound = shared.bound_at(now, deadline, FinalAttempt::is_on(req));
    let shorter = bound.filter(|&bound| match (owed, header) {
        (Some(at), _) => now.checked_add(bound).is_some_and(|end| end < at),
        (None, left) => left.is_some_and(|left| bound < left),
    });
    // A bound changes at most every 100 ms (a fixed one never): the header value is shared
    // with the last calls that sent the same one. It says the bound rounded down to three
    // significant digits (at most 1 % less): the server gives up no later than this attempt.
    let (told, result) = match (shorter, owed) {
        (Some(bound), _) => (bound, Some((bound, now + bound))),
        // What is left until the deadline less the offset.
        (None, Some(at)) => (at.saturating_duration_since(now), None),
        // What is told is already no longer than the bound.
        (None, None) => return None,
    };
    match grpc_timeout::coarse_header_value(told) {
        Some((value, _)) => {
            req.headers_mut().insert(GRPC_TIMEOUT, value);
            result
        }
        // Nothing left to tell (the deadline layer refuses to send with nothing left, so only
        // a clock that went past it in between, or an offset longer than what is left, gets
        // here): the header says the least it can, and the timer picks the bound when the
        // attempt first waits.
        None => {
            if owed.is_some() {
                let least = http::HeaderValue::from_static("1n");
                req.headers_mut().insert(GRPC_TIMEOUT, least);
            }
            None
        }
    }
}

#[cfg(not(feature = "deadline"))]
fn write_attempt_grpc_timeout<B>(
    _: &Shared,
    _: Option<Duration>,
    _: &mut Request<B>,
) -> Option<(Duration, Instant)> {
    None
}

pin_project! {
    /// The response future of [`AttemptTimeout`].
    ///
    /// The attempt's time starts when it first waits (a future does nothing before), and the
    /// clock and the timer are only touched then: an attempt that is ready on its first poll
    /// never reads the clock or the timer wheel.
    #[must_use = "futures do nothing unless polled"]
    pub struct AttemptTimeoutFuture<F> {
        #[pin]
        future: F,
        handle: Arc<stripe::Handle<Shared>>,
        // The bound and its end, when picked at the call (it was written on the wire).
        told: Option<(Duration, Instant)>,
        // When the attempt first waited, its bound, and when that ends; taken when it ends, so
        // one still here when the future is dropped was cancelled.
        start: Option<(Instant, Option<Duration>, Option<Instant>)>,
        // The request's deadline, which caps an adaptive bound picked at the first wait.
        deadline: Option<Instant>,
        // A final attempt (`FinalAttempt`): the cap is all that is left, not the share.
        whole: bool,
        #[pin]
        sleep: LazySleep,
    }

    impl<F> PinnedDrop for AttemptTimeoutFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // Dropped while it waited (a hedge that lost, a caller that gave up): censored, it
            // took at least as long as it ran. Left out, the model would see only the winners
            // of hedged calls, read the tail too short and hedge too early.
            if let Some((start, ..)) = this.start.take() {
                let shared: &Shared = this.handle;
                let now = Instant::now();
                shared
                    .model
                    .record(now.saturating_duration_since(start), shared.now_us(now));
            }
        }
    }
}

impl<F> std::fmt::Debug for AttemptTimeoutFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptTimeoutFuture")
            .field("started", &self.start.map(|(at, ..)| at))
            .field("bound", &self.start.and_then(|(_, b, _)| b))
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for AttemptTimeoutFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<http::Response<B>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let shared: &Shared = this.handle;
        if let Poll::Ready(result) = this.future.poll(cx) {
            // Ended: nothing is left for the drop to record.
            let Some((start, ..)) = this.start.take() else {
                return Poll::Ready(result.map_err(Into::into));
            };
            let now = Instant::now();
            shared.meter_duration(now.saturating_duration_since(start));
            // A failure once the bound the server (and the transport: tonic arms a timer from
            // the header) was told has run out is this attempt's timeout, whichever side's
            // timer fired first: a transport error, or the server's own DEADLINE_EXCEEDED.
            // So the same situation is always the same failure, retried (or not) and counted
            // for the same reason.
            let expired = match &result {
                Ok(response) => is_deadline_exceeded(response),
                Err(_) => true,
            };
            if !expired || this.told.is_none_or(|(_, end)| now < end) {
                if result.is_ok() {
                    shared
                        .model
                        .record(now.saturating_duration_since(start), shared.now_us(now));
                }
                return Poll::Ready(result.map_err(Into::into));
            }
            if let Some((bound, _)) = *this.told {
                shared.model.record(bound, shared.now_us(now));
            }
            return Poll::Ready(Err(Box::new(AttemptTimedOut::new())));
        }
        let (start, bound, end) = match *this.start {
            Some(started) => started,
            None => {
                let now = Instant::now();
                let (bound, end) = match *this.told {
                    Some((bound, end)) => (Some(bound), Some(end)),
                    None => {
                        let bound = shared.bound_at(now, *this.deadline, *this.whole);
                        (bound, bound.map(|b| now + b))
                    }
                };
                *this.start = Some((now, bound, end));
                (now, bound, end)
            }
        };
        let Some(end) = end else {
            return Poll::Pending;
        };
        // Its own timer, whatever the layers around it arm.
        ready!(this.sleep.as_mut().poll_until(cx, end));
        *this.start = None;
        let bound = bound.expect("a timer only with a bound");
        // Censored: it took at least its bound.
        shared.model.record(bound, shared.now_us(start + bound));
        shared.meter_duration(bound);
        Poll::Ready(Err(Box::new(AttemptTimedOut::new())))
    }
}

/// A trailers-only gRPC DEADLINE_EXCEEDED (`grpc-status: 4` in the response headers).
fn is_deadline_exceeded<B>(response: &http::Response<B>) -> bool {
    response
        .headers()
        .get(backstop_core::grpc::GRPC_STATUS)
        .is_some_and(|code| code.as_bytes() == b"4")
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_bound_is_clamped_and_the_ceiling_applies_until_trusted() {
        let a = Adaptive::new();
        assert_eq!(a.bound(None), Duration::from_secs(10));
        assert_eq!(
            a.bound(Some(Duration::from_millis(1))),
            Duration::from_secs(1)
        );
        assert_eq!(
            a.bound(Some(Duration::from_millis(500))),
            Duration::from_millis(1500)
        );
        let low = a.floor(Duration::from_millis(10));
        assert_eq!(
            low.bound(Some(Duration::from_millis(1))),
            Duration::from_millis(10)
        );
        assert_eq!(
            low.bound(Some(Duration::from_millis(50))),
            Duration::from_millis(150)
        );
        assert_eq!(
            a.bound(Some(Duration::from_secs(60))),
            Duration::from_secs(10)
        );
    }
}
