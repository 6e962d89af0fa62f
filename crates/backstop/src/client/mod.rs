//! Client presets: the whole outbound stack as one layer, in the right order.

pub mod attempt;
pub mod breaker;
pub(crate) mod call;
pub(crate) mod deadline;
pub mod overload;
pub mod retry;

use crate::client::attempt::{Adaptive, AttemptBound, AttemptTimeout, AttemptTimeoutLayer};
use crate::client::breaker::{Breaker, BreakerConfig, BreakerLayer};
use crate::client::overload::bulkhead::{Bulkhead, BulkheadLayer};
use crate::client::overload::throttle::{Throttle, ThrottleLayer};
use crate::client::retry::hedge::Hedging;
use crate::client::retry::{Retry, RetryConfig, RetryLayer};
use crate::deadline::{PropagateDeadline, PropagateDeadlineLayer};
use crate::idempotency::{IdempotencyKey, IdempotencyKeyLayer};
use crate::{ConfigError, GrpcClassifier, HttpClassifier, ResponseBody};
use std::time::Duration;
use tower_layer::Layer;

/// The client stack's configuration, checked by [`build`](Self::build) into the
/// [`ClientLayer`] that stacks it, as one layer:
/// `PropagateDeadline → Bulkhead → Throttle → IdempotencyKey → Retry → Breaker → attempt
/// timeout → your client` (the bulkhead limits nothing unless [`bulkhead`](Self::bulkhead)
/// gives it a limit; the key layer stamps nothing unless
/// [`idempotency_keys`](Self::idempotency_keys) turns it on).
///
/// Made by [`http()`] or [`grpc()`] with every default, and tuned by replacing a part. Clones
/// share the retry budget, the throttle's window, the bulkhead's permits, the breaker and the
/// latency model, so build one per dependency and clone it into every client that calls that
/// dependency.
///
/// # Overload: the throttle on, the bulkhead off
///
/// The presets' [`ThrottleLayer`] ([adaptive throttling](crate::client::overload::throttle), on by
/// default) refuses, locally and at once, a share of first attempts while the dependency
/// accepts fewer than half of the calls it is sent (`K` = 2 over 30 s): it costs nothing
/// while the dependency is healthy (it refuses nothing while half its calls succeed, so an
/// ordinary error rate never trips it), needs no number only the user knows, and is what
/// keeps an overloaded dependency's queue short enough to answer anyone in time. It sits
/// outside the retry layer, so the retry budget keeps governing retries and a refused call
/// buffers no body. Turn it off with `.throttle(ThrottleLayer::off())`.
///
/// The [`BulkheadLayer`] (a limit on calls in flight, their wait bounded by the deadline) is
/// **off** by default: its one useful number is the dependency's capacity in calls in flight
/// (its rate × its latency, by Little's law), which only its owner knows, and a generous
/// guess would bind only when it is already too late while costing every call a
/// compare-and-swap on one word all cores share. Give it a limit with
/// `.bulkhead(BulkheadLayer::new(64)?)`.
///
/// Both refusals are local rejections ([`Outcome::Rejected`](crate::Outcome)):
/// never sent, never retried, never a breaker failure. An HTTP caller gets
/// [`ClientThrottled`](crate::ClientThrottled) (inside a
/// [`RetryError`](crate::client::retry::RetryError) saying 0 attempts) or
/// [`BulkheadFull`](crate::BulkheadFull); a gRPC caller a trailers-only UNAVAILABLE
/// with `grpc-retry-pushback-ms: -1`.
///
/// Its setters never panic: a value out of range (a zero timeout, 11 attempts) is kept, with
/// the knob it belongs to, for [`build`](ClientBuilder::build), which returns it as a
/// [`ConfigError`]. Only what `build` returns is a [`Layer`]: an unchecked stack cannot be
/// layered, nor handed to `backstop::reqwest::BackstopMiddleware`.
#[derive(Debug, Clone)]
pub struct ClientBuilder<C> {
    deadline: PropagateDeadlineLayer,
    bulkhead: BulkheadLayer,
    throttle: ThrottleLayer<C>,
    keys: IdempotencyKeyLayer,
    retry: RetryLayer<C>,
    breaker: BreakerLayer<C>,
    /// The attempt layer the stack uses: `own_attempt`, keyed as the breaker is when the
    /// breaker is keyed and `own_attempt` has no key of its own ([`ClientBuilder::breaker`]).
    attempt: AttemptTimeoutLayer,
    /// The attempt layer as given ([`ClientBuilder::attempt`]) or the default.
    own_attempt: AttemptTimeoutLayer,
    hedging: Option<Hedge>,
    /// The quantile of the attempt layer's model a retry must have left
    /// ([`ClientBuilder::retry_reserve`]), kept so replacing the retry or attempt layer keeps it.
    reserve: Option<f64>,
    /// The dependency's name ([`ClientBuilder::name`]).
    name: Option<std::sync::Arc<str>>,
    /// Which layers were passed in named: used as given, never renamed.
    passed: Passed,
    /// The first misconfiguration a setter met, kept for [`ClientBuilder::build`]: setters
    /// never panic.
    error: Option<ConfigError>,
}

/// Which of a [`ClientBuilder`]'s layers the user passed in with a name of their own: kept
/// exactly as given (the stack never renames or rebuilds a layer that may be shared with
/// another stack). The others (the stack's own, and those passed in unnamed) take the
/// stack's name.
#[derive(Debug, Clone, Copy, Default)]
struct Passed {
    deadline: bool,
    bulkhead: bool,
    throttle: bool,
    retry: bool,
    breaker: bool,
    attempt: bool,
}

/// The service [`http()`] builds around a transport `S`: name it in a struct field or axum
/// `State` without spelling out the onion.
pub type HttpClient<S> = PropagateDeadline<
    Bulkhead<
        Throttle<
            IdempotencyKey<Retry<Breaker<AttemptTimeout<S>, HttpClassifier>, HttpClassifier>>,
            HttpClassifier,
        >,
    >,
>;

/// The service [`grpc()`] builds around a transport `S` (for a tonic `Channel`, `S` is the
/// channel behind its `map_request` adapter, as in the crate docs).
pub type GrpcClient<S> = PropagateDeadline<
    Bulkhead<
        Throttle<
            IdempotencyKey<Retry<Breaker<AttemptTimeout<S>, GrpcClassifier>, GrpcClassifier>>,
            GrpcClassifier,
        >,
    >,
>;

/// The response of a client preset whose transport answers `Response<B>`: the body is wrapped
/// by the deadline (which bounds the stream), the bulkhead and the throttle (which may answer
/// a gRPC call themselves), the retry layer and the breaker (which read the trailers of a gRPC
/// stream).
pub type ClientResponse<B, C> = http::Response<
    crate::deadline::DeadlineBody<
        ResponseBody<
            ResponseBody<
                crate::client::retry::RetryBody<crate::client::breaker::BreakerBody<B, C>, C>,
            >,
        >,
    >,
>;

/// What a response of a stack with a retry layer in it says of its call
/// ([`CallInfo::of`](crate::client::retry::CallInfo::of)): how many attempts it took (the first
/// included) and, when the response is a failure that was not retried, why
/// ([`GiveUp`](crate::client::retry::GiveUp)); 0 attempts for a local rejection made before the call
/// reached the retry layer (a deadline already spent). Any body type: the retry layer's
/// [`CallInfo`](crate::client::retry::CallInfo) extension survives body and layer wrapping, and
/// tonic keeps it in `tonic::Response::extensions()`.
///
/// ```
/// use backstop::client::call_info;
/// # #[allow(dead_code)]
/// fn log<B>(response: &http::Response<B>) {
///     let info = call_info(response);
///     println!("{} attempts, gave up: {:?}", info.attempts(), info.gave_up());
/// }
/// ```
pub fn call_info<B>(response: &http::Response<B>) -> crate::client::retry::CallInfo {
    crate::client::retry::CallInfo::of(response)
}

/// What an error of a stack with a retry layer in it says of its call: the
/// [`CallInfo`](crate::client::retry::CallInfo) of the [`RetryError`](crate::client::retry::RetryError)
/// found in its source chain (attempts 0 when its deadline had passed before any was sent).
/// `None` for an error the retry layer did not return (the deadline layer's own
/// [`DeadlineExceeded`](crate::DeadlineExceeded) once the time told to the server has passed).
///
/// ```
/// use backstop::client::error_info;
/// use backstop::client::retry::{CallInfo, GiveUp, RetryError};
///
/// let err: backstop::BoxError = Box::new(RetryError::new(2, Some(GiveUp::Budget), "reset".into()));
/// assert_eq!(error_info(&*err), Some(CallInfo::new(2, Some(GiveUp::Budget))));
/// ```
pub fn error_info(
    err: &(dyn std::error::Error + 'static),
) -> Option<crate::client::retry::CallInfo> {
    crate::find::<crate::client::retry::RetryError>(err).map(crate::client::retry::RetryError::info)
}

/// How the preset hedges, kept so replacing the retry or attempt layer keeps it.
#[derive(Debug, Clone)]
enum Hedge {
    /// Up to `max_attempts` attempts, each after the measured `quantile`, read from the
    /// stack's attempt layer whenever it changes.
    Measured {
        quantile: f64,
        max_attempts: u32,
    },
    Custom(Hedging),
}

/// The preset for HTTP dependencies: [`PropagateDeadlineLayer::new`], the bulkhead off,
/// [`ThrottleLayer::http`] (adaptive throttling with its defaults; why on, and the bulkhead
/// off: [`ClientBuilder`]), [`RetryConfig::http`] (3 attempts, decorrelated jitter, the 10 %
/// ratio budget), the breaker of [`http_breaker`], and attempts bounded by measured latency
/// ([`Adaptive`]: p99 × 3, from a floor of p99 × 20 held
/// between 250 ms and 1 s to 10 s, 10 s until 100 calls are measured; see
/// [`timeout`](crate::client::attempt)).
pub fn http() -> ClientBuilder<HttpClassifier> {
    ClientBuilder::new(
        RetryConfig::http().build().expect("the defaults are valid"),
        http_breaker().build().expect("the defaults are valid"),
    )
    .retry_reserve(Some(0.5))
    .throttle(ThrottleLayer::http())
}

/// The preset for gRPC dependencies: as [`http()`] with [`ThrottleLayer::grpc`],
/// [`RetryConfig::grpc`] and [`grpc_breaker`] (status codes from trailers-only responses and
/// trailers).
pub fn grpc() -> ClientBuilder<GrpcClassifier> {
    ClientBuilder::new(
        RetryConfig::grpc().build().expect("the defaults are valid"),
        grpc_breaker().build().expect("the defaults are valid"),
    )
    .retry_reserve(Some(0.5))
    .throttle(ThrottleLayer::grpc())
}

/// The breaker of the [`http()`] preset, to tune and pass to [`ClientBuilder::breaker`]:
/// [`BreakerConfig::http`] opening at **80 %** failures over the 10 s window (20 calls
/// minimum) or after **20 failures in a row**, open **1 s doubling to at most 3 s** (each
/// open time jittered to `[d/2, d]`).
///
/// Why so short an open time: how long the breaker stays open after the dependency is back
/// is the time its callers keep failing for nothing. With the breaker crate's own 5 s
/// doubling to 300 s, the open time grows with the outage (after a 20 s outage it had doubled
/// twice: calls failed 5–7 s after the dependency was back; the lab's `outage`, a 30 s
/// fault, never recovered within the 15 s after it, 25 % success), while with 1 s to 3 s the
/// callers are back within 1–2 s (45–49 % success, the most the fault allows). The price is
/// probing: while the dependency is down, each client stack sends at most `probes` (3) calls
/// per open period of 1.5–3 s, about one call a second: light for one service, and for a
/// fleet of N instances N calls a second to a dependency that is down. A dependency that must
/// not be probed that often (a large fleet, a slow restart) wants a longer `open_duration`:
/// `http_breaker().open_duration(Duration::from_secs(5), Duration::from_secs(60))`.
///
/// Why not the breaker's own 50 %: behind the retry layer's budget, a dependency that still
/// answers half its calls costs at most 10 % more load and retries save most of the failed
/// half, while an open breaker would fail all of it. The breaker is for a dependency that is
/// (nearly) down, and 20 failures in a row see that within 20 calls, where a rate over a
/// 10 s window full of earlier successes takes seconds. (The storm lab's `brownout` and
/// `outage` scenarios measure both.)
pub fn http_breaker() -> BreakerConfig<HttpClassifier> {
    tuned(BreakerConfig::http())
}

/// The breaker of the [`grpc()`] preset: as [`http_breaker`], with
/// [`BreakerConfig::grpc`].
pub fn grpc_breaker() -> BreakerConfig<GrpcClassifier> {
    tuned(BreakerConfig::grpc())
}

fn tuned<C>(config: BreakerConfig<C>) -> BreakerConfig<C> {
    config
        .failure_rate(0.8)
        .consecutive_failures(20)
        .open_duration(OPEN_BASE, OPEN_MAX)
}

/// The presets' first open time: see [`http_breaker`].
const OPEN_BASE: Duration = Duration::from_secs(1);
/// The presets' longest open time: see [`http_breaker`].
const OPEN_MAX: Duration = Duration::from_secs(3);

impl<C> ClientBuilder<C> {
    /// A client stack from its retry and breaker layers (deadline propagation with its
    /// defaults, attempts bounded by measured latency with the [`Adaptive`] defaults). The
    /// throttle and the bulkhead are off (a throttle needs a classifier of the stack's
    /// kind: [`http()`] and [`grpc()`] add theirs); add them with
    /// [`throttle`](Self::throttle) and [`bulkhead`](Self::bulkhead).
    pub fn new(retry: RetryLayer<C>, breaker: BreakerLayer<C>) -> Self {
        // Layers passed in with a name are kept as passed (see `name`).
        let passed = Passed {
            retry: !retry.name().is_empty(),
            breaker: !breaker.name().is_empty(),
            ..Passed::default()
        };
        let attempt = AttemptTimeoutLayer::new(AttemptBound::Adaptive(Adaptive::new()))
            .expect("the defaults are valid");
        Self {
            deadline: PropagateDeadlineLayer::new(),
            bulkhead: BulkheadLayer::off(),
            throttle: ThrottleLayer::off(),
            keys: IdempotencyKeyLayer::off(),
            retry,
            breaker,
            attempt: attempt.clone(),
            own_attempt: attempt,
            hedging: None,
            reserve: None,
            name: None,
            passed,
            error: None,
        }
        .rekeyed()
    }

    /// Keys the attempt layer's latency models as the breaker's breakers are keyed (same
    /// [`BreakerKey`](crate::client::breaker::BreakerKey), same `max_keys`), unless the attempt
    /// layer has a key of its own or was passed in with a name (used as passed): decided here, when the stack is configured, never per
    /// request. A route then gets its own bound, hedge delay and retry reserve, as it gets its
    /// own breaker.
    fn rekeyed(mut self) -> Self {
        self.attempt = match (self.own_attempt.key(), self.breaker.key()) {
            // A layer passed in with a name is used as passed (it may be another stack's).
            (None, Some((key, max_keys))) if !self.passed.attempt => {
                match self.own_attempt.per_key(key.clone(), max_keys) {
                    Ok(keyed) => keyed,
                    Err(e) => return self.failed(e),
                }
            }
            _ => self.own_attempt.clone(),
        };
        self
    }

    /// Keeps the first misconfiguration for [`build`](Self::build); the stack is left as it
    /// was before the setter that met it.
    fn failed(mut self, error: ConfigError) -> Self {
        self.error.get_or_insert(error);
        self
    }

    /// Checks the configuration: `Ok` with the stack as a [`ClientLayer`] (the only form of it
    /// that is a [`Layer`]), or the first knob a setter refused (setters never panic; they keep
    /// the error for here). A stack that was not checked cannot be layered, so a
    /// misconfiguration is an error where the stack is built, never a panic at a request.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let err = backstop::client::http()
    ///     .timeout(Duration::ZERO)
    ///     .max_attempts(2)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.knob(), "timeout");
    /// assert!(backstop::client::http().max_attempts(2).build().is_ok());
    /// ```
    ///
    /// An unchecked stack is not a layer, so this does not compile (11 attempts would be
    /// out of range; before `build` existed as the only way in, it panicked at the first
    /// request):
    ///
    /// ```compile_fail
    /// use http::{Request, Response};
    /// use tower::{ServiceBuilder, service_fn};
    ///
    /// let transport = service_fn(|_: Request<backstop::ReplayBody<String>>| async {
    ///     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    /// });
    /// let client = ServiceBuilder::new()
    ///     .layer(backstop::client::http().max_attempts(11))
    ///     .service(transport);
    /// ```
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`] a setter met, naming its knob.
    pub fn build(self) -> Result<ClientLayer<C>, ConfigError> {
        match self.error {
            Some(error) => Err(error),
            None => Ok(ClientLayer { stack: self }),
        }
    }

    /// Names the dependency: every event and metric of the stack's layers carries it as
    /// `dependency` (with the request's method and path, the attempt, and the status or
    /// error, for events). A stack left unnamed is allowed; its events carry
    /// `dependency = ""`.
    ///
    /// Naming is configuration, so call it before the stack serves: every layer of the stack
    /// that has no name of its own (the stack's defaults, the layers [`timeout`](Self::timeout)
    /// and [`attempt_timeout`](Self::attempt_timeout) build, and a layer you passed in
    /// unnamed) is built again under the name, with state of its own (each layer's `named`).
    /// Two stacks named from clones of one template are two dependencies: they share nothing
    /// the stack made itself (breaker, latency model, retry budget, throttle, permits), only
    /// what you gave explicitly to be shared (a [`RetryConfig::budget`], a throttle built
    /// [`with`](ThrottleLayer::with) an `AdaptiveThrottle` of yours). A layer you passed in
    /// with a name of its own is used exactly as you passed it, name and state: name a layer
    /// yourself to share it between stacks.
    ///
    /// ```
    /// let template = backstop::client::http().max_attempts(2);
    /// let inventory = template.clone().name("inventory").build()?;
    /// let billing = template.name("billing").build()?;
    /// assert_eq!(inventory.dependency(), "inventory");
    /// assert_eq!(inventory.retry_layer().name(), "inventory");
    /// assert_eq!(billing.breaker_layer().name(), "billing");
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn name(mut self, name: &str) -> Self
    where
        C: Clone,
    {
        self.name = Some(name.into());
        let passed = self.passed;
        if !passed.deadline {
            self.deadline = self.deadline.named(name);
        }
        if !passed.bulkhead {
            self.bulkhead = self.bulkhead.named(name);
        }
        if !passed.throttle {
            self.throttle = self.throttle.named(name);
        }
        if !passed.retry {
            self.retry = self.retry.named(name);
        }
        if !passed.breaker {
            self.breaker = self.breaker.named(name);
        }
        if !passed.attempt {
            self.own_attempt = self.own_attempt.named(name);
        }
        // Hedging and the reserve read the new latency model.
        self.rekeyed().rehedge()
    }

    /// A layer passed in, as the stack uses it: as given when it has a name of its own
    /// (`true`), else named as the stack when the stack has a name.
    fn adopt<L>(
        &self,
        layer: L,
        name_of: impl Fn(&L) -> &str,
        named: impl FnOnce(&L, &str) -> L,
    ) -> (L, bool) {
        if !name_of(&layer).is_empty() {
            return (layer, true);
        }
        (self.own(layer, named), false)
    }

    /// `layer`, named as the stack is, for a layer the stack builds itself.
    fn own<L>(&self, layer: L, named: impl FnOnce(&L, &str) -> L) -> L {
        match &self.name {
            Some(name) => named(&layer, name),
            None => layer,
        }
    }

    /// Gives every call at most `timeout` (or what is left of an inherited deadline, if less),
    /// sent to the server in `grpc-timeout`: the short form of
    /// `.deadline(PropagateDeadlineLayer::builder().timeout(timeout).build()?)`, with the
    /// deadline layer's other knobs at their defaults.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let client = backstop::client::http().timeout(Duration::from_secs(2)).max_attempts(2);
    /// # let _ = client;
    /// ```
    ///
    /// # Errors
    ///
    /// Kept for [`build`](Self::build): `timeout` is zero (every call would fail at once).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        match PropagateDeadlineLayer::builder()
            .timeout(timeout)
            .send_grpc_timeout(self.deadline.sends_grpc_timeout())
            .build()
        {
            Ok(deadline) => {
                self.deadline = self.own(deadline, PropagateDeadlineLayer::named);
                self.passed.deadline = false;
            }
            Err(e) => return self.failed(e),
        }
        self
    }

    /// Attempts per request, the first included (default 3): the short form of rebuilding the
    /// retry policy with [`RetryConfig::max_attempts`] ([`RetryLayer::with_config`]). Keeps the
    /// policy's other knobs, its budget, and the layer's stats and name: a clone made before
    /// keeps counting into the same stats, with the old policy.
    ///
    /// # Errors
    ///
    /// Kept for [`build`](Self::build): `n` is not in `1..=10`.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self
    where
        C: Clone,
    {
        match self
            .retry
            .with_config(self.retry.config().clone().max_attempts(n))
        {
            Ok(retry) => self.retry = retry,
            Err(e) => return self.failed(e),
        }
        self.rehedge()
    }

    /// Replaces the deadline propagation (e.g. a per-call `timeout` or a `fraction`). A
    /// layer built with [`send_grpc_timeout(false)`](crate::deadline::PropagateDeadlineLayerBuilder::send_grpc_timeout)
    /// turns the header off for the whole stack, as [`send_grpc_timeout`](Self::send_grpc_timeout)
    /// does. Its timeout, fraction, offset and `min_remaining` apply as given; one thing the
    /// stack decides for it: it writes no `grpc-timeout` itself, the attempt bound innermost
    /// does, for each attempt, less this layer's offset (one writer per attempt, so a retry
    /// tells the time really left), and the layer puts the deadline on the request for the
    /// layers inside.
    #[must_use]
    pub fn deadline(mut self, layer: PropagateDeadlineLayer) -> Self {
        let (layer, passed) = self.adopt(
            layer,
            PropagateDeadlineLayer::name,
            PropagateDeadlineLayer::named,
        );
        (self.deadline, self.passed.deadline) = (layer, passed);
        self
    }

    /// Whether calls tell the dependency their deadline in `grpc-timeout` (default: they
    /// do). Turn it off for third-party HTTP APIs, which have no business knowing your
    /// internal deadlines (and may log or reject an unknown header): no attempt carries the
    /// header, and one the caller put on the request is removed. Nothing else changes: each
    /// call is still bounded by its deadline, each attempt by its bound, retries still fit
    /// before the deadline, and each attempt carries its deadline on the request as a
    /// [`Deadline`](crate::deadline::Deadline) extension (the attempt's own end when its bound
    /// ends first, with a deadline or without one).
    ///
    /// To tell such an API the deadline in a header of its own, read that extension in a
    /// layer between the preset and the transport, where it is the attempt's deadline:
    ///
    /// ```
    /// use backstop::ReplayBody;
    /// use backstop::deadline::Deadline;
    /// use http::{HeaderValue, Request, Response};
    /// use std::{convert::Infallible, time::Duration};
    /// use tower::{ServiceBuilder, ServiceExt, service_fn};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), backstop::BoxError> {
    /// let partner = backstop::client::http()
    ///     .name("partner")
    ///     .timeout(Duration::from_secs(2))
    ///     .send_grpc_timeout(false)
    ///     .build()?;
    /// let client = ServiceBuilder::new()
    ///     .layer(partner)
    ///     .map_request(|mut req: Request<ReplayBody<String>>| {
    ///         if let Some(deadline) = req.extensions().get::<Deadline>().copied() {
    ///             let ms = deadline.remaining().as_millis().to_string();
    ///             req.headers_mut().insert("x-timeout-ms", HeaderValue::try_from(ms).unwrap());
    ///         }
    ///         req
    ///     })
    ///     .service(service_fn(|req: Request<ReplayBody<String>>| async move {
    ///         assert!(req.headers().get("grpc-timeout").is_none());
    ///         // The attempt's own end: its share of the 2 s (80 %), as a retry could follow.
    ///         assert_eq!(req.headers()["x-timeout-ms"], "1600");
    ///         Ok::<_, Infallible>(Response::new(String::new()))
    ///     }));
    /// let request = Request::builder().header("grpc-timeout", "9S").body(String::new())?;
    /// client.oneshot(request).await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn send_grpc_timeout(mut self, send: bool) -> Self {
        self.deadline = self.deadline.send_grpc_timeout(send);
        self
    }

    /// Replaces the retry layer (hedging, when set, is kept).
    #[must_use]
    pub fn retry(mut self, layer: RetryLayer<C>) -> Self
    where
        C: Clone,
    {
        let (layer, passed) = self.adopt(layer, RetryLayer::name, RetryLayer::named);
        (self.retry, self.passed.retry) = (layer, passed);
        self.rehedge()
    }

    /// Replaces the breaker. A keyed breaker ([`BreakerConfig::per_key`]) keys the attempt
    /// layer's latency models the same way, unless that layer has a key of its own
    /// ([`AttemptTimeoutLayer::per_key`]) or was passed in with a name (used as passed, so it
    /// can be shared: key it yourself): each route is then bounded, hedged and given a
    /// retry reserve from its own measured latency, so a rare slow route is not cut at the
    /// bound the fast ones set (see [`backstop::client::attempt`](crate::client::attempt)).
    #[must_use]
    pub fn breaker(mut self, layer: BreakerLayer<C>) -> Self
    where
        C: Clone,
    {
        let (layer, passed) = self.adopt(layer, BreakerLayer::name, BreakerLayer::named);
        (self.breaker, self.passed.breaker) = (layer, passed);
        self.rekeyed().rehedge()
    }

    /// Replaces the adaptive throttle (on in the presets: [`ClientBuilder`] says why), e.g. a
    /// tuned [`AdaptiveThrottle`](crate::client::overload::throttle::AdaptiveThrottle) or one shared
    /// by two stacks, or [`ThrottleLayer::off`] to turn it off.
    ///
    /// ```
    /// use backstop::client::overload::throttle::ThrottleLayer;
    ///
    /// let client = backstop::client::http().name("search").throttle(ThrottleLayer::off()).build()?;
    /// assert!(!client.throttle_layer().is_on());
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn throttle(mut self, layer: ThrottleLayer<C>) -> Self
    where
        C: Clone,
    {
        let (layer, passed) = self.adopt(layer, ThrottleLayer::name, ThrottleLayer::named);
        (self.throttle, self.passed.throttle) = (layer, passed);
        self
    }

    /// Caps the calls in flight to the dependency with a [`BulkheadLayer`] (off in the
    /// presets: [`ClientBuilder`] says why): a call that cannot get a permit before its
    /// deadline is refused at once, never sent. A user call holds one permit across its
    /// retries. [`BulkheadLayer::off`] turns it off again.
    ///
    /// ```
    /// use backstop::client::overload::bulkhead::BulkheadLayer;
    ///
    /// let client = backstop::client::http().name("search").bulkhead(BulkheadLayer::new(64)?).build()?;
    /// assert_eq!(client.bulkhead_layer().max_concurrency(), 64);
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn bulkhead(mut self, layer: BulkheadLayer) -> Self {
        let (layer, passed) = self.adopt(layer, BulkheadLayer::name, BulkheadLayer::named);
        (self.bulkhead, self.passed.bulkhead) = (layer, passed);
        self
    }

    /// Bounds each attempt by a fixed `timeout` instead of measured latency, inside the
    /// breaker: an attempt that times out is a failure the breaker counts and the retry layer
    /// may retry (if the request is idempotent), within the request's deadline. A new latency
    /// model comes with it.
    ///
    /// # Errors
    ///
    /// Kept for [`build`](Self::build): `timeout` is zero (every attempt would fail).
    #[must_use]
    pub fn attempt_timeout(self, timeout: Duration) -> Self
    where
        C: Clone,
    {
        match AttemptTimeoutLayer::new(AttemptBound::Fixed(timeout)) {
            Ok(layer) => self.attempt(layer),
            Err(e) => self.failed(e),
        }
    }

    /// Replaces the attempt bound and its latency model (tuned [`Adaptive`] knobs, a fixed
    /// bound, or none). Measured hedging, when set, then reads the new model. A layer with a
    /// name of its own is used as passed, and so is not keyed after a keyed breaker: give it
    /// its key with [`AttemptTimeoutLayer::per_key`] to share per-route models between stacks.
    #[must_use]
    pub fn attempt(mut self, layer: AttemptTimeoutLayer) -> Self
    where
        C: Clone,
    {
        let (layer, passed) =
            self.adopt(layer, AttemptTimeoutLayer::name, AttemptTimeoutLayer::named);
        (self.own_attempt, self.passed.attempt) = (layer, passed);
        self.rekeyed().rehedge()
    }

    /// Hedges slow requests: while an attempt is slower than the dependency's measured p95,
    /// another copy is sent, up to `max_attempts` in all, and the first answer that commits
    /// wins (the rules: [`backstop::client::retry::hedge`](crate::client::retry::hedge)). Only requests the retry policy's
    /// idempotency rule allows are hedged (for gRPC, opt in with
    /// [`Idempotency::All`](crate::client::retry::Idempotency::All) when every method of the
    /// dependency is safe to run twice), a copy goes beside an attempt in flight only once
    /// the body is complete in the replay buffer (a hedge due before waits for it), and every
    /// hedge takes a token from the retry budget, so retries and hedges
    /// together stay within its ratio. No hedge goes before the latency model is trusted
    /// (100 calls in its window).
    ///
    /// ```
    /// let client = backstop::client::http().hedging(2);
    /// # let _ = client;
    /// ```
    ///
    /// # Errors
    ///
    /// Kept for [`build`](Self::build): `max_attempts` is not in `2..=10`.
    #[must_use]
    pub fn hedging(self, max_attempts: u32) -> Self
    where
        C: Clone,
    {
        self.hedging_at(0.95, max_attempts)
    }

    /// Hedges as [`hedging`](Self::hedging) does, after the measured `quantile` of the
    /// dependency's latency instead of its p95 (0.99: fewer calls hedged, later). The delay
    /// is read from the stack's attempt layer when the stack is configured, so it follows a
    /// replaced attempt layer, [`name`](Self::name) and a keyed [`breaker`](Self::breaker).
    ///
    /// ```
    /// let client = backstop::client::http().hedging_at(0.99, 2).name("search");
    /// # let _ = client;
    /// ```
    ///
    /// # Errors
    ///
    /// Kept for [`build`](Self::build): `max_attempts` is not in `2..=10`, or `quantile` is
    /// not in (0, 1).
    #[must_use]
    pub fn hedging_at(mut self, quantile: f64, max_attempts: u32) -> Self
    where
        C: Clone,
    {
        self.hedging = Some(Hedge::Measured {
            quantile,
            max_attempts,
        });
        self.rehedge()
    }

    /// Hedges as `hedging` says (e.g. a fixed delay). A delay read off
    /// [`attempt_layer`](ClientLayer::attempt_layer) ([`AttemptTimeoutLayer::hedge_delay`]) reads
    /// that layer's model, which [`name`](Self::name), [`attempt`](Self::attempt) and a keyed
    /// [`breaker`](Self::breaker) replace: for a measured quantile, use
    /// [`hedging_at`](Self::hedging_at), which follows them.
    ///
    /// # Errors
    ///
    /// Kept for [`build`](Self::build): `hedging` is invalid (its `max_attempts` outside
    /// `2..=10`).
    #[must_use]
    pub fn hedging_with(mut self, hedging: Hedging) -> Self
    where
        C: Clone,
    {
        self.hedging = Some(Hedge::Custom(hedging));
        self.rehedge()
    }

    /// A retry is started only if, after its backoff, the `quantile` of the attempt layer's
    /// measured latency is still left of the deadline ([`RetryConfig::reserve`] with
    /// [`AttemptTimeoutLayer::retry_reserve`]); `None`: no reserve, only the retry policy's
    /// `min_attempt_time`. The presets use `Some(0.5)`: with a dependency whose median call
    /// takes 1 s, a failure with 300 ms left is returned at once
    /// ([`GiveUp::Reserve`](crate::client::retry::GiveUp::Reserve)) instead of a retry that would
    /// time out and count as one more failure of the breaker. Nothing is asked for until the
    /// model is trusted. The retry layer is handed the attempt layer's model here, when the
    /// stack is built, as measured hedging is; replacing either layer keeps the setting. The
    /// retry layer gets the reserve through [`RetryLayer::with_config`] (its budget, stats and
    /// name kept).
    ///
    /// ```
    /// let client = backstop::client::http().retry_reserve(Some(0.9));
    /// # let _ = client;
    /// ```
    ///
    /// # Errors
    ///
    /// Kept for [`build`](Self::build): `quantile` is not in (0, 1).
    #[must_use]
    pub fn retry_reserve(mut self, quantile: Option<f64>) -> Self
    where
        C: Clone,
    {
        if let Some(q) = quantile
            && let Err(e) = self.attempt.retry_reserve(q)
        {
            return self.failed(e);
        }
        if self.reserve.is_some() && quantile.is_none() {
            match self
                .retry
                .with_config(self.retry.config().clone().no_reserve())
            {
                Ok(retry) => self.retry = retry,
                Err(e) => return self.failed(e),
            }
        }
        self.reserve = quantile;
        self.rehedge()
    }

    /// Applies the hedging and reserve settings to the current retry layer.
    fn rehedge(mut self) -> Self
    where
        C: Clone,
    {
        if self.hedging.is_none() && self.reserve.is_none() {
            return self;
        }
        let mut policy = self.retry.config().clone();
        match &self.hedging {
            None => {}
            Some(Hedge::Custom(h)) => policy = policy.hedging(h.clone()),
            Some(Hedge::Measured {
                quantile,
                max_attempts,
            }) => match self.attempt.hedge_delay(*quantile) {
                Ok(delay) => {
                    policy = policy.hedging(Hedging::new(delay).max_attempts(*max_attempts))
                }
                Err(e) => return self.failed(e),
            },
        }
        if let Some(q) = self.reserve {
            match self.attempt.retry_reserve(q) {
                Ok(reserve) => policy = policy.reserve(reserve),
                Err(e) => return self.failed(e),
            }
        }
        match self.retry.with_config(policy) {
            Ok(retry) => self.retry = retry,
            Err(e) => return self.failed(e),
        }
        self
    }

    /// The reserve a retry must have left, as a handle to the attempt layer's model, when
    /// [`retry_reserve`](Self::retry_reserve) is set (for the service config's retry layers).
    #[cfg(feature = "service-config")]
    pub(crate) fn measured_reserve(&self) -> Option<crate::client::attempt::MeasuredDelay> {
        self.reserve.map(|q| {
            self.attempt
                .retry_reserve(q)
                .expect("checked when it was set")
        })
    }

    /// The least time a retry of this stack waits before it is sent, for the attempt bound:
    /// the retry layer's least first backoff, and the offset the retry's deadline is told
    /// less.
    pub(crate) fn retry_wait(&self) -> Duration {
        self.retry
            .config()
            .least_retry_wait()
            .saturating_add(self.deadline.offset())
    }
}

impl ClientBuilder<HttpClassifier> {
    /// Says the dependency de-duplicates `Idempotency-Key`s (it runs behind
    /// [`IdempotencyLayer`](crate::idempotency::IdempotencyLayer) or keeps the same
    /// promise), and stamps a fresh key (128 random bits from the OS) on each POST and PATCH
    /// that has none, once per logical call, outside the retry layer: every attempt of a call
    /// carries the same key. Off by default.
    ///
    /// What changes: a keyed request is one the retry policy's
    /// [`Idempotency::Standard`](crate::client::retry::Idempotency::Standard) rule allows, so a POST
    /// that failed retryably (a 503, a reset, an attempt timed out) is **retried**, within the
    /// budget and the deadline, where without keys it is returned. It is **hedged** only when
    /// the stack hedges at all ([`hedging`](Self::hedging), off by default): a hedged copy
    /// (or a retry) of a keyed POST that meets the server while the original is still in
    /// flight is refused before it runs, with 409 and `Retry-After`, which the
    /// [`HttpClassifier`] reads as "come back later" (a throttled, always-retryable failure,
    /// like a 429): it never wins the race, the original's answer is the one returned, and a
    /// further copy waits at least the `Retry-After` (within the budget and the deadline).
    /// Each such copy still costs the server a store lookup, so hedge keyed POSTs with a
    /// delay well above their usual latency, or let the server answer duplicates by waiting
    /// for the original (`wait_in_flight`). A key the caller set is left alone. Other
    /// methods (GET, PUT, DELETE, …) get no key: they are idempotent already.
    ///
    /// HTTP only: a gRPC call is a POST too, and [`IdempotencyLayer`] passes gRPC through (the
    /// crate docs of [`backstop::idempotency`](crate::idempotency) say why), so the gRPC preset has no such knob.
    ///
    /// [`IdempotencyLayer`]: crate::idempotency::IdempotencyLayer
    ///
    /// ```
    /// let payments = backstop::client::http().name("payments").idempotency_keys(true).build()?;
    /// assert!(payments.key_layer().is_on());
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn idempotency_keys(mut self, dedups: bool) -> Self {
        self.keys = if dedups {
            IdempotencyKeyLayer::new()
        } else {
            IdempotencyKeyLayer::off()
        };
        self
    }

    /// As [`idempotency_keys(true)`](Self::idempotency_keys) with a key layer of your own
    /// (other methods, or a seeded generator in tests).
    #[must_use]
    pub fn idempotency_key_layer(mut self, layer: IdempotencyKeyLayer) -> Self {
        self.keys = layer;
        self
    }
}

/// A checked client stack: what [`ClientBuilder::build`] returns, and the only form of the
/// stack that is a [`Layer`] (so a misconfiguration is an error where the stack is built,
/// never a panic at the first request). Clones share the retry budget, the throttle's
/// window, the bulkhead's permits, the breaker and the latency model: build one per
/// dependency and clone it into every client that calls that dependency.
///
/// ```
/// use std::time::Duration;
///
/// let billing = backstop::client::http().name("billing").timeout(Duration::from_secs(2)).build()?;
/// assert_eq!(billing.dependency(), "billing");
/// assert_eq!(billing.retry_layer().stats().retries, 0);
/// # Ok::<(), backstop::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClientLayer<C> {
    stack: ClientBuilder<C>,
}

impl<C> ClientLayer<C> {
    /// The attempt bound's layer: [`latency`](AttemptTimeoutLayer::latency) is the
    /// dependency's measured latency, [`current_bound`](AttemptTimeoutLayer::current_bound)
    /// the bound an attempt gets now.
    pub fn attempt_layer(&self) -> &AttemptTimeoutLayer {
        &self.stack.attempt
    }

    /// The dependency's measured latency: count and quantiles over the model's window.
    pub fn latency(&self) -> crate::latency::LatencySnapshot {
        self.stack.attempt.latency()
    }

    /// The dependency's name: the stack's ([`name`](ClientBuilder::name)), else its retry layer's
    /// (`""` when neither is named).
    pub fn dependency(&self) -> &str {
        self.stack
            .name
            .as_deref()
            .unwrap_or_else(|| self.stack.retry.name())
    }

    /// The key-stamping layer (off unless [`idempotency_keys`](ClientBuilder::idempotency_keys) or
    /// [`idempotency_key_layer`](ClientBuilder::idempotency_key_layer) turned it on).
    pub fn key_layer(&self) -> &IdempotencyKeyLayer {
        &self.stack.keys
    }

    /// The deadline propagation layer.
    pub fn deadline_layer(&self) -> &PropagateDeadlineLayer {
        &self.stack.deadline
    }

    /// The bulkhead (off unless [`bulkhead`](ClientBuilder::bulkhead) gave it a limit), for its
    /// [`in_flight`](BulkheadLayer::in_flight) and [`waiting`](BulkheadLayer::waiting) counts.
    pub fn bulkhead_layer(&self) -> &BulkheadLayer {
        &self.stack.bulkhead
    }

    /// The adaptive throttle, for its [`throttle`](ThrottleLayer::throttle)'s probability and
    /// refusals.
    pub fn throttle_layer(&self) -> &ThrottleLayer<C> {
        &self.stack.throttle
    }

    /// The retry layer, for its [`stats`](RetryLayer::stats).
    pub fn retry_layer(&self) -> &RetryLayer<C> {
        &self.stack.retry
    }

    /// The breaker, for its [`snapshot`](BreakerLayer::snapshot) and manual modes (a keyed
    /// breaker's routes are in [`keys`](BreakerLayer::keys); its `snapshot` is the overflow
    /// breaker's).
    pub fn breaker_layer(&self) -> &BreakerLayer<C> {
        &self.stack.breaker
    }

    /// The reserve a retry must have left (for the service config's retry layers).
    #[cfg(feature = "service-config")]
    pub(crate) fn measured_reserve(&self) -> Option<crate::client::attempt::MeasuredDelay> {
        self.stack.measured_reserve()
    }
}

impl<S, C> Layer<S> for ClientLayer<C> {
    type Service = PropagateDeadline<
        Bulkhead<Throttle<IdempotencyKey<Retry<Breaker<AttemptTimeout<S>, C>, C>>, C>>,
    >;

    fn layer(&self, inner: S) -> Self::Service {
        let stack = &self.stack;
        // One writer of each attempt's `grpc-timeout`, decided here: the attempt bound,
        // innermost, from the deadline each attempt carries on the request (less the deadline
        // layer's offset); the deadline and retry layers write none. No writer at all when
        // the deadline layer says the header is not to be sent.
        // The attempt bound keeps its share of the deadline for a retry only where one could
        // be sent: after the retry layer's least backoff, before the deadline less the offset.
        let attempt = stack.attempt.retry_wait(stack.retry_wait());
        let inner = if stack.deadline.sends_grpc_timeout() {
            attempt
                .write_grpc_timeout(stack.deadline.offset())
                .layer(inner)
        } else {
            attempt.layer(inner)
        };
        let inner = stack.breaker.layer(inner);
        let inner = stack
            .retry
            .grpc_timeout_written_inside(stack.deadline.offset())
            .layer(inner);
        // Outside the retry layer: one key per logical call, the same on every attempt.
        let inner = stack.keys.layer(inner);
        // Outside the retry layer, inside the deadline (which gives the bulkhead its wait's
        // end): a refused call costs no key, no body copy and no retry state, and a call holds
        // one permit across its retries.
        let inner = stack.throttle.layer(inner);
        let inner = stack.bulkhead.layer(inner);
        stack.deadline.send_grpc_timeout(false).layer(inner)
    }
}
