//! backstop: deadlines that travel with the request, retries that cannot storm, and a circuit
//! breaker that fails fast while a dependency is down — as tower layers, stacked in the right
//! order for you.
//!
//! # Example
//!
//! ```
//! use backstop::prelude::*;
//! use http::{Request, Response};
//! use std::time::Duration;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), backstop::BoxError> {
//! // Any tower HTTP client: hyper-util's, a tonic Channel, reqwest behind an adapter.
//! let transport = service_fn(|_req: Request<ReplayBody<String>>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
//! });
//!
//! // One layer per dependency; clones share its retry budget and its breaker.
//! let backend = backstop::client::http().timeout(Duration::from_secs(2)).build()?;
//! let client = ServiceBuilder::new().layer(backend.clone()).service(transport);
//!
//! let response = client.oneshot(Request::new(String::new())).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(backend.breaker_layer().snapshot().state, State::Closed);
//! # Ok(())
//! # }
//! ```
//!
//! # The onion
//!
//! ```text
//!            client side                                      server side
//!  ┌──────────────────────────────────────┐        ┌─────────────────────────────────┐
//!  │ PropagateDeadline  the whole budget  │        │ Deadline   read grpc-timeout,   │
//!  │ ┌──────────────────────────────────┐ │  wire  │            cancel at expiry     │
//!  │ │ Bulkhead  calls in flight (off)  │ │ ─────▶ │ ┌─────────────────────────────┐ │
//!  │ │ ┌──────────────────────────────┐ │ │        │ │ Admission  too little time? │ │
//!  │ │ │ Throttle  first attempts     │ │ │        │ │ ┌─────────────────────────┐ │ │
//!  │ │ │ ┌──────────────────────────┐ │ │ │        │ │ │ Pushback "do not retry" │ │ │
//!  │ │ │ │ Retry  budget, backoff   │ │ │ │        │ │ │ ┌─────────────────────┐ │ │ │
//!  │ │ │ │ ┌──────────────────────┐ │ │ │ │        │ │ │ │ your handler        │ │ │ │
//!  │ │ │ │ │ Breaker  per attempt │ │ │ │ │        │ │ │ └─────────────────────┘ │ │ │
//!  │ │ │ │ │ ┌──────────────────┐ │ │ │ │ │        │ │ └─────────────────────────┘ │ │
//!  │ │ │ │ │ │ attempt timeout  │ │ │ │ │ │        │ └─────────────────────────────┘ │
//!  │ │ │ │ │ │ ┌──────────────┐ │ │ │ │ │ │        └─────────────────────────────────┘
//!  │ │ │ │ │ │ │ your client  │ │ │ │ │ │ │
//! ```
//!
//! Why this order, from the outside in:
//!
//! 1. **Deadline outermost**: every attempt, backoff and wait comes out of one budget, so a
//!    retry can never run past what the caller was promised, and each attempt's
//!    `grpc-timeout` is what is left, not a fresh timeout.
//! 2. **Bulkhead, then throttle, outside the retry layer**: they bound *calls*, not
//!    attempts. The bulkhead (off unless given a limit) reads the deadline the outer layer
//!    put on the request to decide at once whether a permit can come in time, and a call
//!    holds one permit across its retries; the adaptive throttle (on) refuses a share of
//!    first attempts while the dependency accepts fewer than half, so the retry budget keeps
//!    governing retries alone. A refusal by either is never sent and never retried, and
//!    costs no body copy. ([`ClientLayer`] says why one is on and the other off.)
//! 3. **Retry outside the breaker**: each attempt asks the breaker. When the dependency is
//!    down the breaker answers at once with a local rejection, which is never retried, so an
//!    outage costs probes, not `attempts × callers`.
//! 4. **Breaker outside the attempt timeout**: a timed-out attempt is a failure the breaker
//!    sees. (A timeout outside it would cancel the call, and a cancelled call counts as
//!    nothing.)
//! 5. **On the server**, the deadline goes first so the handler's whole work is bounded;
//!    admission next, where the deadline is known, refuses a request with less time left
//!    than its route's handler takes (measured); the pushback layer sits next to the
//!    handler, where it can see that the handler's own retries gave up.
//!
//! # Presets
//!
//! - [`client::http()`], [`client::grpc()`]: the client stack as one [`ClientLayer`] (what
//!   [`ClientBuilder::build`] returns), with
//!   every default, tuned by giving a part its policy (`.retry(..)`, `.breaker(..)`,
//!   `.deadline(..)`, `.throttle(..)`, `.bulkhead(..)`, `.attempt(..)`): setters only record,
//!   `build` makes the whole stack at once, so their order never matters (the rules:
//!   [`ClientBuilder`]). Attempts are bounded by the
//!   dependency's measured latency by default ([`client::attempt`]: p99 × 3, with a floor of p99 × 20 held between 250 ms and 1 s, at most 10 s), and
//!   [`ClientLayer::latency`] shows what was measured. [`ClientBuilder::hedging`] hedges slow
//!   idempotent requests at the measured p95, paid from the retry budget.
//!   [`ClientBuilder::idempotency_keys`] says the dependency de-duplicates keys: POSTs and
//!   PATCHes get one `Idempotency-Key` per call (outside the retry layer) and become
//!   retryable.
//! - [`server()`]: `Deadline → Admission → Pushback`, one [`ServerLayer`] that keeps
//!   `Error = S::Error` ([`ServerLayer::admission`] tunes or turns off admission).
//!
//! Short forms for the common knobs, which win over the same knob of a part's policy:
//! `.timeout(d)` (the caller's deadline per call), `.max_attempts(n)`, `.hedging(quantile, n)`,
//! `.retry_reserve(quantile)`; the preset's service types are
//! named [`HttpClient<S>`] and [`GrpcClient<S>`], its response [`ClientResponse<B, C>`].
//!
//! Per request, a [`RetryOverrides`](crate::client::retry::RetryOverrides) extension turns retries
//! off, declares the request idempotent (or not), caps its attempts or turns hedging off.
//!
//! Every layer is a plain tower `Layer`: `.layer(X)` in a `ServiceBuilder`, in the order the
//! presets use or your own.
//!
//! # Errors
//!
//! What a client preset returns when it does not return the dependency's own response:
//!
//! | error | when | test with |
//! |---|---|---|
//! | [`BreakerOpen`] | the breaker refused the call (open, or half-open with its probes taken); nothing was sent | [`is_breaker_open`] |
//! | [`ClientThrottled`] | the adaptive throttle refused the call: the dependency accepted too few lately; nothing was sent | `backstop::find::<ClientThrottled>` |
//! | [`BulkheadFull`] | the bulkhead (when given a limit) had no permit that could come before the deadline; nothing was sent | `backstop::find::<BulkheadFull>` |
//! | [`DeadlineExceeded`] | the call's deadline passed (before it was sent, while waiting to retry, or in flight) | [`is_deadline_exceeded`] |
//! | [`AttemptTimedOut`] | the last attempt ran out of its bound and no retry followed | [`is_attempt_timed_out`] |
//! | the transport's error | the last attempt failed in transport and no retry followed | — |
//!
//! A gRPC request gets the local ones as responses instead (trailers-only UNAVAILABLE with a
//! pushback for the breaker, the throttle and the bulkhead, DEADLINE_EXCEEDED for the two
//! timeouts), so tonic reports them as statuses.
//!
//! Every error the retry layer returns comes wrapped in a
//! [`RetryError`](crate::client::retry::RetryError): how many attempts the call took and why it
//! was not retried ([`client::error_info`]), with the error above as its source. So test with
//! the functions of the table (they search the source chain), not with a downcast of the
//! outer error; print the chain to see both. A response says the same in its
//! [`CallInfo`](crate::client::retry::CallInfo) extension ([`client::call_info`]), whatever wraps it:
//! a tonic generated client finds it in `tonic::Response::extensions()`.
//!
//! # tonic
//!
//! A tonic client: the retry layer hands the channel a replayable body, mapped back with
//! `tonic::body::Body::new`. (With the `tonic` feature, `.layer(backstop::tonic::TonicBodyLayer)`
//! does it as a named layer, and the client's type is
//! [`TonicClient<Channel>`](crate::tonic::TonicClient).)
//!
//! ```no_run
//! use backstop::ReplayBody;
//! use tonic::{body::Body, transport::Endpoint};
//! use tower::ServiceBuilder;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let channel = Endpoint::from_static("http://127.0.0.1:50051").connect_lazy();
//! let channel = ServiceBuilder::new()
//!     .layer(backstop::client::grpc().build()?)
//!     .map_request(|r: http::Request<ReplayBody<Body>>| r.map(Body::new))
//!     .service(channel);
//! // Generated clients take it as is: `GreeterClient::new(channel)`.
//! let _grpc = tonic::client::Grpc::new(channel);
//! # Ok(())
//! # }
//! ```
//!
//! A tonic server:
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let routes = tonic::service::Routes::default();
//! // `routes`: your generated services, e.g. `Routes::new(GreeterServer::new(greeter))`.
//! tonic::transport::Server::builder()
//!     .layer(backstop::server())
//!     .add_routes(routes)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! # axum
//!
//! ```
//! use axum::{routing::get, Router};
//! use backstop::deadline::current;
//! use http::Request;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! async fn handler() -> String {
//!     // The caller's deadline, for this handler and every call it makes.
//!     match current() {
//!         Some(d) => format!("{} ms left", d.remaining().as_millis()),
//!         None => "no deadline".to_owned(),
//!     }
//! }
//! let app = Router::new().route("/", get(handler)).layer(backstop::server());
//!
//! let request = Request::get("/").header("grpc-timeout", "250m").body(axum::body::Body::empty()).unwrap();
//! let response = app.oneshot(request).await.unwrap();
//! assert_eq!(response.status(), 200);
//! # }
//! ```
//!
//! # Feature flags
//!
//! - `axum` (off): [`axum::CallError`], so `?` on a call's error in an axum handler
//!   answers 504, 503 (with `Retry-After`) or 502; and `IntoResponse` for backstop's local
//!   errors ([`axum`](crate::axum#the-local-errors-as-responses)).
//! - `h2` (off): HTTP/2 `REFUSED_STREAM` and graceful `GOAWAY` count as "not processed", so
//!   they are retried for every method.
//! - `metrics` (off): every layer records counters, gauges and a latency histogram through
//!   the [`metrics`](https://docs.rs/metrics) facade, for the exporter you already use; the
//!   names and labels are in [`metrics`](mod@metrics). With it, [`semconv::SemconvLayer`]
//!   records each call's duration under OpenTelemetry's semantic conventions
//!   (`http.client.request.duration`, `rpc.client.duration`).
//! - `service-config` (off): gRPC's service config JSON ([`service_config`]).
//! - `reqwest` (off): reqwest's client as a tower service ([`reqwest`]); `reqwest-middleware`
//!   (off): the client preset as a reqwest-middleware `Middleware`.
//! - `redis` (off): the idempotency layer's Redis store, for a fleet of servers sharing one
//!   record of keys.
//! - `tonic` (off): [`tonic::TonicBodyLayer`], the body conversion a tonic `Channel` needs
//!   as a named layer, so a client's type is writable: [`tonic::TonicClient<Channel>`].
#![doc(test(attr(deny(warnings))))]

// The rooms, from the wire inwards: what a request and its answer mean (`classify`, `wire`),
// the one deadline (`deadline`), the client's onion (`client`), the server's (`server`), the
// idempotency-key protocol, whose two ends live on either side of the wire (`idempotency`), and
// the integrations.
#[cfg(feature = "axum")]
pub mod axum;
pub mod classify;
pub mod client;
pub mod deadline;
mod error;
pub mod idempotency;
pub mod latency;
#[cfg(feature = "service-config")]
pub mod methods;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "reqwest")]
pub mod reqwest;
mod route;
mod rt;
#[cfg(feature = "metrics")]
pub mod semconv;
pub mod server;
#[cfg(feature = "service-config")]
pub mod service_config;
#[cfg(feature = "tonic")]
pub mod tonic;
pub mod wire;

pub use classify::{Classify, GrpcClassifier, HttpClassifier, Outcome, Retryable};
pub use client::retry::ReplayBody;
pub use client::{ClientBuilder, ClientLayer, ClientResponse, GrpcClient, HttpClient};
pub use error::{
    AttemptTimedOut, BoxError, BreakerOpen, BulkheadFull, ClientThrottled, ConfigError,
    DeadlineExceeded, find, is_deadline_exceeded,
};
pub use route::{KeyFn, RouteKey};
pub(crate) use rt::attempt::FinalAttempt;
pub use server::{ServerLayer, server};
pub use wire::body::ResponseBody;
pub use wire::grpc::{Code, is_grpc};
pub use wire::hint::ServerHint;
pub use wire::reject::{NotExecuted, Rejection};

/// Whether `err` (or an error in its source chain) is an open breaker's refusal: the call never
/// left the process, and [`BreakerOpen::retry_after`] says when calls pass again.
///
/// ```
/// use backstop::{BoxError, BreakerOpen, is_breaker_open};
///
/// let err: BoxError = Box::new(BreakerOpen::new(None));
/// assert!(is_breaker_open(err.as_ref()));
/// ```
pub fn is_breaker_open(err: &(dyn std::error::Error + 'static)) -> bool {
    find::<BreakerOpen>(err).is_some()
}

/// Whether `err` (or an error in its source chain) is an attempt that ran out of its bound
/// (the attempt timeout inside the breaker), returned when no retry followed.
pub fn is_attempt_timed_out(err: &(dyn std::error::Error + 'static)) -> bool {
    find::<AttemptTimedOut>(err).is_some()
}

/// The names most stacks need, in one import: `use backstop::prelude::*;`.
pub mod prelude {
    pub use crate::client::attempt::{Adaptive, AttemptBound, AttemptTimeoutLayer};
    pub use crate::client::breaker::{BreakerConfig, BreakerLayer, Mode, State};
    pub use crate::client::overload::{bulkhead::BulkheadLayer, throttle::ThrottleLayer};
    pub use crate::client::retry::{ReplayBody, RetryConfig, RetryLayer};
    pub use crate::deadline::{
        Deadline, DeadlineFutureExt, DeadlineLayer, PropagateDeadlineLayer, current,
    };
    pub use crate::server::admission::AdmissionLayer;
    pub use crate::server::pushback::PushbackLayer;
    pub use crate::{BoxError, GrpcClassifier, HttpClassifier};
}
