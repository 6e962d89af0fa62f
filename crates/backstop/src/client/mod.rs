//! Client presets: the whole outbound stack as one layer, in the right order.

pub mod attempt;
pub mod breaker;
pub(crate) mod call;
pub(crate) mod deadline;
#[cfg(all(test, not(loom)))]
mod keyed_stack_tests;
pub mod overload;
pub mod retry;

#[cfg(feature = "service-config")]
use crate::client::attempt::MeasuredDelay;
use crate::client::attempt::{Adaptive, AttemptBound, AttemptTimeout, AttemptTimeoutLayer};
use crate::client::breaker::{Breaker, BreakerConfig, BreakerLayer};
use crate::client::overload::bulkhead::{Bulkhead, BulkheadLayer, BulkheadLayerBuilder};
use crate::client::overload::throttle::{
    AdaptiveThrottle, AdaptiveThrottleBuilder, Throttle, ThrottleLayer,
};
use crate::client::retry::hedge::Hedging;
use crate::client::retry::{Retry, RetryConfig, RetryLayer};
use crate::deadline::{PropagateDeadline, PropagateDeadlineLayer, PropagateDeadlineLayerBuilder};
use crate::idempotency::{IdempotencyKey, IdempotencyKeyLayer};
use crate::{ConfigError, GrpcClassifier, HttpClassifier, ResponseBody};
use std::{sync::Arc, time::Duration};
use tower_layer::Layer;

/// The client stack's configuration, checked by [`build`](Self::build) into the
/// [`ClientLayer`] that stacks it, as one layer, always in this order:
/// `PropagateDeadline → Bulkhead → Throttle → IdempotencyKey → Retry → Breaker → adaptive
/// limit → attempt timeout → your client` (the bulkhead limits nothing unless
/// [`bulkhead`](Self::bulkhead) gives it a limit; the adaptive limit is on in the presets,
/// [`adaptive_limit`](Self::adaptive_limit); the key layer stamps nothing unless
/// [`idempotency_keys`](Self::idempotency_keys) turns it on).
///
/// Made by [`http()`] or [`grpc()`] with every default, and tuned by its setters. Every setter
/// only records a value: the layers are made once, by `build`, from everything set, so the
/// order of the setters never matters. Three rules decide what `build` makes:
///
/// | rule | why |
/// |---|---|
/// | One classifier for the whole stack (the preset's, or [`classifier`](Self::classifier)'s); the classifier inside a [`RetryConfig`] or [`BreakerConfig`] given to [`retry`](Self::retry) or [`breaker`](Self::breaker) is not used. | The retry layer, the breaker and the throttle must agree on what a failure is, or the breaker opens on answers the retry layer calls fine. |
/// | A short form on the builder wins over the same knob of a part's config, whatever the order: [`timeout`](Self::timeout) and [`send_grpc_timeout`](Self::send_grpc_timeout) over [`deadline`](Self::deadline)'s, [`max_attempts`](Self::max_attempts), [`hedging`](Self::hedging) and [`retry_reserve`](Self::retry_reserve) over [`retry`](Self::retry)'s. | So `.timeout(2s)` means 2 s, before or after a `.deadline(..)`. |
/// | Every layer is made by `build` and named by [`name`](Self::name); the attempt bound's latency models and the adaptive limit are keyed as the breaker is ([`BreakerConfig::per_key`]). | One dependency, one name on every metric; each route bounded, hedged, given its reserve and limited from its own latency, as it gets its own breaker. |
///
/// Clones of the [`ClientLayer`] share the retry budget, the throttle's window, the
/// bulkhead's permits, the breaker and the latency model, so build one per dependency and
/// clone it into every client that calls that dependency; two `build`s are two dependencies
/// (they share nothing but a [`RetryConfig::budget`] you gave both).
///
/// # Overload: the throttle and the adaptive limit on, the bulkhead off
///
/// The presets' adaptive throttle ([`backstop::client::overload::throttle`](crate::client::overload::throttle),
/// on by default) refuses, locally and at once, a share of first attempts while the dependency
/// accepts fewer than half of the calls it is sent (`K` = 2 over 30 s): it costs nothing
/// while the dependency is healthy (it refuses nothing while more than half its calls are answered, so an
/// ordinary error rate never trips it), needs no number only the user knows, and is what
/// keeps an overloaded dependency's queue short enough to answer anyone in time. It sits
/// outside the retry layer, so the retry budget keeps governing retries and a refused call
/// buffers no body. Turn it off with `.throttle(None)`.
///
/// The adaptive limit ([`adaptive_limit`](Self::adaptive_limit), on by default) bounds the
/// attempts in flight with a limit it learns: it holds nothing back until the dependency is
/// queueing enough to threaten the calls' deadlines, then keeps the attempts in flight near
/// what the dependency serves within them, follows its capacity when that changes, and goes
/// back to holding nothing once the calls stop finding it reached. An attempt whose wait for
/// a permit would outlast its deadline is refused at once; one waits at most 1 s.
///
/// The bulkhead (a fixed limit on calls in flight, their wait bounded by the deadline) is
/// **off** by default: its one useful number is the dependency's capacity in calls in flight
/// (its rate × its latency, by Little's law), which only its owner knows. Give it a limit with
/// `.bulkhead(BulkheadLayer::builder(64))` as a hard cap on calls, a user call holding one
/// permit across its retries.
///
/// The three refusals are local rejections ([`Outcome::Rejected`](crate::Outcome)):
/// never sent, never retried, never a breaker failure. An HTTP caller gets
/// [`ClientThrottled`](crate::ClientThrottled) (inside a
/// [`RetryError`](crate::client::retry::RetryError) saying 0 attempts) or
/// [`BulkheadFull`](crate::BulkheadFull) (the adaptive limit's inside a `RetryError`, its
/// knob `adaptive_limit`); a gRPC caller a trailers-only UNAVAILABLE
/// with `grpc-retry-pushback-ms: -1`.
///
/// Setters never panic and never fail: `build` checks every part and returns the first
/// value out of range (a zero timeout, 11 attempts) as a [`ConfigError`] naming its knob.
/// Only what `build` returns is a [`Layer`]: an unchecked stack cannot be layered, nor handed
/// to `backstop::reqwest::BackstopMiddleware`.
#[derive(Debug, Clone)]
pub struct ClientBuilder<C> {
    classifier: C,
    name: Option<Arc<str>>,
    deadline: PropagateDeadlineLayerBuilder,
    timeout: Option<Duration>,
    send_grpc_timeout: Option<bool>,
    bulkhead: Option<BulkheadLayerBuilder>,
    adaptive_limit: bool,
    throttle: Option<AdaptiveThrottleBuilder>,
    keys: IdempotencyKeyLayer,
    retry: RetryConfig<C>,
    max_attempts: Option<u32>,
    /// `(quantile, max_attempts)`: hedge after the measured quantile.
    hedging: Option<(f64, u32)>,
    /// The quantile of the measured latency a retry must have left.
    reserve: Reserve,
    breaker: BreakerConfig<C>,
    attempt: AttemptBound,
}

/// The measured reserve a retry must have left: the presets' default, or the user's.
#[derive(Debug, Clone, Copy)]
enum Reserve {
    /// The presets': this quantile, unless the retry policy has a reserve of its own.
    Preset(f64),
    /// [`ClientBuilder::retry_reserve`]'s: wins over the retry policy's.
    Set(Option<f64>),
}

/// The service [`http()`] builds around a transport `S`: name it in a struct field or axum
/// `State` without spelling out the onion.
pub type HttpClient<S> = PropagateDeadline<
    Bulkhead<
        Throttle<
            IdempotencyKey<
                Retry<
                    Breaker<Bulkhead<AttemptTimeout<S>, Arc<HttpClassifier>>, HttpClassifier>,
                    HttpClassifier,
                >,
            >,
            HttpClassifier,
        >,
    >,
>;

/// The service [`grpc()`] builds around a transport `S` (for a tonic `Channel`, `S` is the
/// channel behind its `map_request` adapter, as in the crate docs).
pub type GrpcClient<S> = PropagateDeadline<
    Bulkhead<
        Throttle<
            IdempotencyKey<
                Retry<
                    Breaker<Bulkhead<AttemptTimeout<S>, Arc<GrpcClassifier>>, GrpcClassifier>,
                    GrpcClassifier,
                >,
            >,
            GrpcClassifier,
        >,
    >,
>;

/// The response of a client preset whose transport answers `Response<B>`: the body is wrapped
/// by the deadline (which bounds the stream), the bulkhead and the throttle (which may answer
/// a gRPC call themselves), the retry layer and the breaker (which read the trailers of a gRPC
/// stream), and the adaptive limit (which may answer an attempt itself).
pub type ClientResponse<B, C> = http::Response<
    crate::deadline::DeadlineBody<
        ResponseBody<
            ResponseBody<
                crate::client::retry::RetryBody<
                    crate::client::breaker::BreakerBody<ResponseBody<B>, C>,
                    C,
                >,
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

/// The preset for HTTP dependencies: [`PropagateDeadlineLayer::new`], the bulkhead off,
/// [`AdaptiveThrottle::new`] (adaptive throttling with its defaults) and the adaptive limit
/// on (why on, and the bulkhead off: [`ClientBuilder`]), [`RetryConfig::http`] (3 attempts, decorrelated jitter, the 10 %
/// ratio budget), the breaker of [`http_breaker`], and attempts bounded by measured latency
/// ([`Adaptive`]: p99 × 3, from a floor of p99 × 20 held
/// between 250 ms and 1 s to 10 s, 10 s until 100 calls are measured; see
/// [`timeout`](crate::client::attempt)).
pub fn http() -> ClientBuilder<HttpClassifier> {
    ClientBuilder::new(HttpClassifier::new())
        .breaker(http_breaker())
        .preset_reserve()
        .throttle(Some(AdaptiveThrottle::builder()))
        .adaptive_limit(true)
}

/// The preset for gRPC dependencies: as [`http()`] with
/// [`RetryConfig::grpc`] and [`grpc_breaker`] (status codes from trailers-only responses and
/// trailers).
pub fn grpc() -> ClientBuilder<GrpcClassifier> {
    ClientBuilder::new(GrpcClassifier::new())
        .breaker(grpc_breaker())
        .preset_reserve()
        .throttle(Some(AdaptiveThrottle::builder()))
        .adaptive_limit(true)
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

/// The cap of the presets' adaptive limit: attempts in flight to one dependency. High enough
/// never to bind by itself (a dependency answering 10 000 calls a second in 1 s), low enough
/// to bound a stack's memory when the dependency hangs and no deadline ends its calls.
const ADAPTIVE_CAP: u32 = 10_000;

/// The presets' first open time: see [`http_breaker`].
const OPEN_BASE: Duration = Duration::from_secs(1);
/// The presets' longest open time: see [`http_breaker`].
const OPEN_MAX: Duration = Duration::from_secs(3);

impl<C: Clone> ClientBuilder<C> {
    /// A client stack that classifies with `classifier`: deadline propagation with its
    /// defaults, [`RetryConfig::new`] and [`BreakerConfig::new`] (their defaults), attempts
    /// bounded by measured latency with the [`Adaptive`] defaults, no throttle, no bulkhead,
    /// no adaptive limit, no retry reserve. [`http()`] and [`grpc()`] are this with the presets' tuning.
    pub fn new(classifier: C) -> Self {
        Self {
            retry: RetryConfig::new(classifier.clone()),
            breaker: BreakerConfig::new(classifier.clone()),
            classifier,
            name: None,
            deadline: PropagateDeadlineLayer::builder(),
            timeout: None,
            send_grpc_timeout: None,
            bulkhead: None,
            adaptive_limit: false,
            throttle: None,
            keys: IdempotencyKeyLayer::off(),
            max_attempts: None,
            hedging: None,
            reserve: Reserve::Set(None),
            attempt: AttemptBound::Adaptive(Adaptive::new()),
        }
    }

    /// The presets' reserve: the measured median, unless the retry policy given has a
    /// reserve of its own.
    fn preset_reserve(mut self) -> Self {
        self.reserve = Reserve::Preset(0.5);
        self
    }

    /// The stack with another classifier (for every layer: the rules in [`ClientBuilder`]),
    /// e.g. a [`GrpcClassifier`] that retries more codes:
    ///
    /// ```
    /// use backstop::{Code, GrpcClassifier};
    ///
    /// let classifier = GrpcClassifier::new().retryable_codes([Code::Unavailable, Code::Aborted]);
    /// let client = backstop::client::grpc().classifier(classifier).build()?;
    /// # let _ = client;
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn classifier<D: Clone>(self, classifier: D) -> ClientBuilder<D> {
        ClientBuilder {
            retry: self.retry.classifier(classifier.clone()),
            breaker: self.breaker.classifier(classifier.clone()),
            classifier,
            name: self.name,
            deadline: self.deadline,
            timeout: self.timeout,
            send_grpc_timeout: self.send_grpc_timeout,
            bulkhead: self.bulkhead,
            adaptive_limit: self.adaptive_limit,
            throttle: self.throttle,
            keys: self.keys,
            max_attempts: self.max_attempts,
            hedging: self.hedging,
            reserve: self.reserve,
            attempt: self.attempt,
        }
    }

    /// Names the dependency: every layer the stack makes carries it, so every event and
    /// metric of the stack says `dependency` (with the request's method and path, the
    /// attempt, and the status or error, for events). A stack left unnamed is allowed; its
    /// events carry `dependency = ""`.
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
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Gives every call at most `timeout` (or what is left of an inherited deadline, if less),
    /// sent to the server in `grpc-timeout`; wins over the timeout of
    /// [`deadline`](Self::deadline)'s policy.
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
    /// [`build`](Self::build) refuses a zero `timeout` (every call would fail at once).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The deadline propagation policy: a [`fraction`](PropagateDeadlineLayerBuilder::fraction)
    /// of what is left, an [`offset`](PropagateDeadlineLayerBuilder::offset) kept back for the
    /// network, a [`min_remaining`](PropagateDeadlineLayerBuilder::min_remaining) below which a
    /// call is not sent. What the stack decides for it: it writes no `grpc-timeout` itself;
    /// the attempt bound, innermost, does, for each attempt, less the offset (one writer per
    /// attempt, so a retry tells the time really left), and the layer puts the deadline on
    /// the request for the layers inside.
    ///
    /// ```
    /// use backstop::deadline::PropagateDeadlineLayer;
    /// use std::time::Duration;
    ///
    /// let client = backstop::client::grpc()
    ///     .deadline(PropagateDeadlineLayer::builder().offset(Duration::from_millis(5)))
    ///     .timeout(Duration::from_secs(1))
    ///     .build()?;
    /// # let _ = client;
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn deadline(mut self, policy: PropagateDeadlineLayerBuilder) -> Self {
        self.deadline = policy;
        self
    }

    /// Whether calls tell the dependency their deadline in `grpc-timeout` (default: they
    /// do); wins over [`deadline`](Self::deadline)'s. Turn it off for third-party HTTP APIs,
    /// which have no business knowing your internal deadlines (and may log or reject an
    /// unknown header): no attempt carries the header, and one the caller put on the request
    /// is removed. Nothing else changes: each call is still bounded by its deadline, each
    /// attempt by its bound, retries still fit before the deadline, and each attempt carries
    /// its deadline on the request as a [`Deadline`](crate::deadline::Deadline) extension
    /// (the attempt's own end when its bound ends first, with a deadline or without one).
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
        self.send_grpc_timeout = Some(send);
        self
    }

    /// Attempts per request, the first included (default 3); wins over
    /// [`retry`](Self::retry)'s [`RetryConfig::max_attempts`].
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) refuses `n` outside `1..=10`.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// The retry policy: backoff, budget, idempotency rule, replay limit, reserve, seed (the
    /// presets: [`RetryConfig::new`]'s defaults). Its classifier is not used (the stack's
    /// is: [`ClientBuilder`]'s rules), and the builder's short forms win over its knobs.
    ///
    /// ```
    /// use backstop::client::retry::{RetryConfig, backoff};
    /// use std::time::Duration;
    ///
    /// let client = backstop::client::http()
    ///     .retry(RetryConfig::http().backoff(backoff::constant(Duration::from_millis(50))))
    ///     .build()?;
    /// # let _ = client;
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn retry(mut self, policy: RetryConfig<C>) -> Self {
        self.retry = policy;
        self
    }

    /// The breaker's policy (the presets: [`http_breaker`] or [`grpc_breaker`]). Its
    /// classifier is not used (the stack's is). A keyed breaker ([`BreakerConfig::per_key`])
    /// keys the attempt bound's latency models the same way: each route is then bounded,
    /// hedged and given a retry reserve from its own measured latency, so a rare slow route
    /// is not cut at the bound the fast ones set (see
    /// [`backstop::client::attempt`](crate::client::attempt)).
    #[must_use]
    pub fn breaker(mut self, policy: BreakerConfig<C>) -> Self {
        self.breaker = policy;
        self
    }

    /// The adaptive throttle (on in the presets: [`ClientBuilder`] says why), tuned, or
    /// `None` to turn it off.
    ///
    /// ```
    /// use backstop::client::overload::throttle::AdaptiveThrottle;
    ///
    /// let off = backstop::client::http().name("search").throttle(None).build()?;
    /// assert!(!off.throttle_layer().is_on());
    /// let gentle = backstop::client::http().throttle(Some(AdaptiveThrottle::builder().k(3.0)));
    /// # let _ = gentle;
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn throttle(mut self, throttle: Option<AdaptiveThrottleBuilder>) -> Self {
        self.throttle = throttle;
        self
    }

    /// Caps the calls in flight to the dependency (off in the presets: [`ClientBuilder`]
    /// says why): a call that cannot get a permit before its deadline is refused at once,
    /// never sent. A user call holds one permit across its retries.
    ///
    /// ```
    /// use backstop::client::overload::bulkhead::BulkheadLayer;
    ///
    /// let client = backstop::client::http().name("search").bulkhead(BulkheadLayer::builder(64)).build()?;
    /// assert_eq!(client.bulkhead_layer().max_concurrency(), 64);
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn bulkhead(mut self, bulkhead: BulkheadLayerBuilder) -> Self {
        self.bulkhead = Some(bulkhead);
        self
    }

    /// Bounds the attempts in flight to the dependency with a limit learnt from its answers
    /// (on in the presets; [`ClientBuilder`] says why): an
    /// [adaptive bulkhead](crate::client::overload::bulkhead#the-adaptive-limit) with a cap of
    /// 10 000, inside the breaker, named as the stack, and keyed as the breaker is
    /// ([`BreakerConfig::per_key`]: each route its own limit). It starts at the cap and is halved
    /// only while the dependency queues enough to threaten the calls' deadlines; a stack whose
    /// calls carry no deadline is never cut. `false` takes it out.
    ///
    /// ```
    /// let client = backstop::client::http().name("search").build()?;
    /// assert!(client.adaptive_limit_layer().is_adaptive());
    /// assert_eq!(client.adaptive_limit_layer().limit(), 10_000);
    /// let off = backstop::client::http().adaptive_limit(false).build()?;
    /// assert!(!off.adaptive_limit_layer().is_on());
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn adaptive_limit(mut self, on: bool) -> Self {
        self.adaptive_limit = on;
        self
    }

    /// How each attempt is bounded, inside the breaker (default: by measured latency,
    /// [`Adaptive`]'s defaults): an attempt that times out is a failure the breaker counts
    /// and the retry layer may retry (if the request is idempotent), within the request's
    /// deadline. [`AttemptBound::Fixed`] for a fixed bound, [`AttemptBound::None`] for none;
    /// hedging and the retry reserve read the latency model all three keep.
    ///
    /// ```
    /// use backstop::client::attempt::AttemptBound;
    /// use std::time::Duration;
    ///
    /// let client = backstop::client::http().attempt(AttemptBound::Fixed(Duration::from_millis(300)));
    /// # let _ = client;
    /// ```
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) refuses a bound [`AttemptBound`] says is invalid (a zero fixed
    /// bound, an adaptive knob out of range).
    #[must_use]
    pub fn attempt(mut self, bound: AttemptBound) -> Self {
        self.attempt = bound;
        self
    }

    /// Hedges slow requests: while an attempt is slower than the measured `quantile` of the
    /// dependency's latency (0.95 is a good start; 0.99 hedges fewer calls, later), another
    /// copy is sent, up to `max_attempts` in all, and the first answer that commits wins (the
    /// rules: [`backstop::client::retry::hedge`](crate::client::retry::hedge)). Only requests
    /// the retry policy's idempotency rule allows are hedged (for gRPC, opt in with
    /// [`Idempotency::All`](crate::client::retry::Idempotency::All) when every method of the
    /// dependency is safe to run twice), a copy goes beside an attempt in flight only once
    /// the body is complete in the replay buffer (a hedge due before waits for it), and every
    /// hedge takes a token from the retry budget, so retries and hedges together stay within
    /// its ratio. No hedge goes before the latency model is trusted (100 calls in its window).
    /// Wins over [`retry`](Self::retry)'s [`RetryConfig::hedging`] (a fixed delay goes there).
    ///
    /// ```
    /// let client = backstop::client::http().hedging(0.95, 2);
    /// # let _ = client;
    /// ```
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) refuses `max_attempts` outside `2..=10` and `quantile` outside
    /// (0, 1).
    #[must_use]
    pub fn hedging(mut self, quantile: f64, max_attempts: u32) -> Self {
        self.hedging = Some((quantile, max_attempts));
        self
    }

    /// A retry is started only if, after its backoff, the `quantile` of the measured latency
    /// is still left of the deadline; `None`: no measured reserve (the retry policy's own
    /// [`RetryConfig::reserve`], if it has one, and the fixed 1 ms). Wins over the retry
    /// policy's reserve. The presets use 0.5 unless the retry policy you give has a reserve
    /// of its own (then that one): with a dependency whose median call takes 1 s, a failure with 300 ms left
    /// is returned at once ([`GiveUp::Reserve`](crate::client::retry::GiveUp::Reserve))
    /// instead of a retry that would time out and count as one more failure of the breaker.
    /// Nothing is asked for until the model is trusted.
    ///
    /// ```
    /// let client = backstop::client::http().retry_reserve(Some(0.9));
    /// # let _ = client;
    /// ```
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) refuses a `quantile` outside (0, 1).
    #[must_use]
    pub fn retry_reserve(mut self, quantile: Option<f64>) -> Self {
        self.reserve = Reserve::Set(quantile);
        self
    }

    /// Checks every part and makes the stack: `Ok` with the stack as a [`ClientLayer`] (the
    /// only form of it that is a [`Layer`]), or the first value out of range, naming its
    /// knob. A stack that was not checked cannot be layered, so a misconfiguration is an
    /// error where the stack is built, never a panic at a request.
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
    /// out of range):
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
    /// The first [`ConfigError`] of the parts, checked in this order: deadline, bulkhead,
    /// throttle, retry policy (`max_attempts` included), breaker, attempt bound, hedging,
    /// reserve.
    pub fn build(self) -> Result<ClientLayer<C>, ConfigError>
    where
        C: Send + Sync + 'static,
    {
        let name = self.name.as_deref();
        // The deadline: the policy, with the builder's short forms over it.
        let mut policy = self.deadline;
        if let Some(timeout) = self.timeout {
            policy = policy.timeout(timeout);
        }
        if let Some(send) = self.send_grpc_timeout {
            policy = policy.send_grpc_timeout(send);
        }
        let mut deadline = policy.build()?;
        let mut bulkhead = match self.bulkhead {
            Some(b) => b.build()?,
            None => BulkheadLayer::off(),
        };
        let mut limit = if self.adaptive_limit {
            BulkheadLayer::builder(ADAPTIVE_CAP)
                .max_queue(ADAPTIVE_CAP)
                .adaptive(true)
                .build()?
        } else {
            BulkheadLayer::off()
        };
        let mut throttle = match self.throttle {
            Some(t) => ThrottleLayer::with(Arc::new(t.build()?), self.classifier.clone()),
            None => ThrottleLayer::off(),
        };
        let mut retry = self.retry.classifier(self.classifier.clone());
        if let Some(n) = self.max_attempts {
            retry = retry.max_attempts(n);
        }
        retry.validate()?;
        let mut breaker = self.breaker.classifier(self.classifier.clone()).build()?;
        let mut attempt = AttemptTimeoutLayer::new(self.attempt)?;
        if let Some(name) = name {
            deadline = deadline.named(name);
            bulkhead = bulkhead.named(name);
            limit = limit.named(name);
            throttle = throttle.named(name);
            breaker = breaker.named(name);
            attempt = attempt.named(name);
        }
        // The attempt bound's models keyed as the breaker's breakers are: each route its own
        // bound, hedge delay and reserve.
        // The same keys on the same clock: a key idle as long as the breaker's may make room
        // in both tables, and a key whose breaker is open stays in both (its calls are refused
        // before they reach the model), so a route with a breaker of its own has a model of
        // its own.
        if let (Some((key, max_keys)), Some(idle)) = (breaker.key(), breaker.key_idle()) {
            attempt = attempt.per_key_idle(key.clone(), max_keys, idle, breaker.key_busy())?;
            // The adaptive limit likewise: each route learns its own concurrency.
            if limit.is_on() {
                limit = limit.per_key_idle(key.clone(), max_keys, idle, breaker.key_busy());
            }
        }
        // Hedging and the reserve read the attempt bound's model, made just above. The retry
        // policy, hedging included, is checked before the reserve (the onion's order of the
        // errors `build` reports).
        if let Some((quantile, max_attempts)) = self.hedging {
            let delay = attempt.hedge_delay(quantile)?;
            retry = retry.hedging(Hedging::new(delay).max_attempts(max_attempts));
        }
        retry.validate()?;
        let quantile = match self.reserve {
            Reserve::Set(quantile) => quantile,
            Reserve::Preset(quantile) => retry.reserve.is_none().then_some(quantile),
        };
        let reserve = match quantile {
            Some(quantile) => Some(attempt.retry_reserve(quantile)?),
            None => None,
        };
        if let Some(reserve) = &reserve {
            retry = retry.reserve(reserve.clone());
        }
        // Checked above, hedging included: built without checking it a third time.
        let mut retry = RetryLayer::from_policy(retry);
        if let Some(name) = name {
            retry = retry.named(name);
        }
        // One writer of each attempt's `grpc-timeout`, decided here: the attempt bound,
        // innermost, from the deadline each attempt carries on the request (less the deadline
        // layer's offset); the deadline and retry layers write none. No writer at all when
        // the deadline layer says the header is not to be sent. The attempt bound keeps its
        // share of the deadline for a retry only where one could be sent: after the retry
        // layer's least backoff, before the deadline less the offset.
        let offset = deadline.offset();
        let wait = retry.config().least_retry_wait().saturating_add(offset);
        attempt = attempt.retry_wait(wait);
        if deadline.sends_grpc_timeout() {
            attempt = attempt.write_grpc_timeout(offset);
        }
        Ok(ClientLayer {
            name: self.name,
            outer: deadline.send_grpc_timeout(false),
            #[cfg(feature = "service-config")]
            deadline,
            bulkhead,
            limit,
            classifier: Arc::new(self.classifier),
            throttle,
            keys: self.keys,
            retry: retry.grpc_timeout_written_inside(offset),
            breaker,
            attempt,
            #[cfg(feature = "service-config")]
            reserve,
        })
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
    /// # let _ = payments;
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
    name: Option<Arc<str>>,
    /// As configured (whether the header is sent, its offset), for the service config's stack.
    #[cfg(feature = "service-config")]
    deadline: PropagateDeadlineLayer,
    /// The stack's outermost layer: `deadline`, writing no header (the attempt bound does).
    outer: PropagateDeadlineLayer,
    bulkhead: BulkheadLayer,
    /// The adaptive limit on attempts, inside the breaker.
    limit: BulkheadLayer,
    /// The stack's classifier, shared by the adaptive limit's services (the other layers keep
    /// theirs in their own state).
    classifier: Arc<C>,
    throttle: ThrottleLayer<C>,
    keys: IdempotencyKeyLayer,
    retry: RetryLayer<C>,
    breaker: BreakerLayer<C>,
    attempt: AttemptTimeoutLayer,
    /// The reserve the retry layer was given, for the service config's retry layers.
    #[cfg(feature = "service-config")]
    reserve: Option<MeasuredDelay>,
}

impl<C> ClientLayer<C> {
    /// The attempt bound's layer: [`latency`](AttemptTimeoutLayer::latency) is the
    /// dependency's measured latency, [`current_bound`](AttemptTimeoutLayer::current_bound)
    /// the bound an attempt gets now, [`key_latency`](AttemptTimeoutLayer::key_latency) a
    /// route's.
    pub fn attempt_layer(&self) -> &AttemptTimeoutLayer {
        &self.attempt
    }

    /// The dependency's measured latency: count and quantiles over the model's window.
    pub fn latency(&self) -> crate::latency::LatencySnapshot {
        self.attempt.latency()
    }

    /// The dependency's name ([`name`](ClientBuilder::name); `""` when unnamed).
    pub fn dependency(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    /// The bulkhead (off unless [`bulkhead`](ClientBuilder::bulkhead) gave it a limit), for its
    /// [`in_flight`](BulkheadLayer::in_flight) and [`waiting`](BulkheadLayer::waiting) counts.
    pub fn bulkhead_layer(&self) -> &BulkheadLayer {
        &self.bulkhead
    }

    /// The adaptive limit on attempts (on unless [`adaptive_limit`](ClientBuilder::adaptive_limit)
    /// took it out), for its learnt [`limit`](BulkheadLayer::limit) and
    /// [`in_flight`](BulkheadLayer::in_flight) count.
    pub fn adaptive_limit_layer(&self) -> &BulkheadLayer {
        &self.limit
    }

    /// The adaptive limit around `inner`, judging answers with the stack's classifier (for
    /// the service config's stack, built as this one).
    #[cfg(feature = "service-config")]
    pub(crate) fn limit_around<S>(&self, inner: S) -> Bulkhead<S, Arc<C>> {
        self.limit.layer_classified(inner, &self.classifier)
    }

    /// The adaptive throttle, for its [`throttle`](ThrottleLayer::throttle)'s probability and
    /// refusals.
    pub fn throttle_layer(&self) -> &ThrottleLayer<C> {
        &self.throttle
    }

    /// The retry layer, for its [`stats`](RetryLayer::stats).
    pub fn retry_layer(&self) -> &RetryLayer<C> {
        &self.retry
    }

    /// The breaker, for its [`snapshot`](BreakerLayer::snapshot) and manual modes (a keyed
    /// breaker's routes are in [`keys`](BreakerLayer::keys); its `snapshot` is the overflow
    /// breaker's).
    pub fn breaker_layer(&self) -> &BreakerLayer<C> {
        &self.breaker
    }

    /// The deadline layer as configured (for the service config's stack).
    #[cfg(feature = "service-config")]
    pub(crate) fn deadline_layer(&self) -> &PropagateDeadlineLayer {
        &self.deadline
    }

    /// The reserve a retry must have left (for the service config's retry layers).
    #[cfg(feature = "service-config")]
    pub(crate) fn measured_reserve(&self) -> Option<MeasuredDelay> {
        self.reserve.clone()
    }
}

impl<S, C> Layer<S> for ClientLayer<C> {
    type Service = PropagateDeadline<
        Bulkhead<
            Throttle<IdempotencyKey<Retry<Breaker<Bulkhead<AttemptTimeout<S>, Arc<C>>, C>, C>>, C>,
        >,
    >;

    fn layer(&self, inner: S) -> Self::Service {
        // The onion `build` made, outermost last.
        let inner = self.attempt.layer(inner);
        // Inside the breaker: an attempt it refuses takes no permit. Outside the attempt
        // bound: the wait for a permit is bounded by the deadline, not by the attempt's bound,
        // and an attempt's latency is measured from when it holds one.
        let inner = self.limit.layer_classified(inner, &self.classifier);
        let inner = self.breaker.layer(inner);
        let inner = self.retry.layer(inner);
        // Outside the retry layer: one key per logical call, the same on every attempt.
        let inner = self.keys.layer(inner);
        // Outside the retry layer, inside the deadline (which gives the bulkhead its wait's
        // end): a refused call costs no key, no body copy and no retry state, and a call holds
        // one permit across its retries.
        let inner = self.throttle.layer(inner);
        let inner = self.bulkhead.layer(inner);
        self.outer.layer(inner)
    }
}
