//! The shared model of backstop: what every layer crate must agree on.
//!
//! `backstop-core` holds the pieces that the deadline, retry and circuit breaker layers have in
//! common, so that they speak about a request and its result in one vocabulary:
//!
//! - [`grpc`]: gRPC status [`Code`]s, the header names backstop reads and writes, and detection
//!   of gRPC traffic ([`is_grpc`]) by its `content-type`.
//! - [`reject`]: [`Rejection`], the failures backstop itself decides (a deadline that has passed,
//!   a malformed `grpc-timeout`), and how each becomes a response a client understands: a
//!   trailers-only gRPC response, or an HTTP status with a short text body.
//! - [`ResponseBody`]: the body of a response that is either the inner service's or one of
//!   our local rejections, so server-side layers keep `Error = S::Error` and fit
//!   `axum::Router::layer` and `tonic::transport::Server::layer` without `HandleErrorLayer`.
//! - [`classify`]: [`Outcome`], [`Classify`] and the [`HttpClassifier`] / [`GrpcClassifier`]
//!   presets, so the retry layer and the breaker agree on what a result means.
//! - [`hint`]: [`ServerHint`], parsing `Retry-After` and `grpc-retry-pushback-ms`.
//! - [`latency`]: [`LatencyModel`](latency::LatencyModel), the measured latency of one
//!   dependency as quantiles over a rolling window, from which time bounds are derived.
//! - [`ConfigError`]: the error every backstop builder returns, naming the knob at fault;
//!   [`DeadlineExceeded`], [`AttemptTimedOut`], [`BreakerOpen`], [`ClientThrottled`] and
//!   [`BulkheadFull`], the errors our layers add.
//!
//! The plumbing backstop's own crates share (timers, per-core striping, seeded mixing, a
//! dependency's name, metric helpers) sits in a hidden module, `__private`: it is not part
//! of the public API and has no semver promise.
//!
//! # Example
//!
//! ```
//! use backstop_core::{grpc::Code, is_grpc, Rejection};
//! use http::{header::CONTENT_TYPE, HeaderMap, HeaderValue};
//!
//! let mut headers = HeaderMap::new();
//! headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc+proto"));
//! assert!(is_grpc(&headers));
//!
//! // The same rejection, answered the way each kind of client expects.
//! let grpc = Rejection::DeadlineExceeded.into_response::<String>(true);
//! assert_eq!(grpc.status(), 200);
//! assert_eq!(grpc.headers()["grpc-status"], "4");
//!
//! let http = Rejection::DeadlineExceeded.into_response::<String>(false);
//! assert_eq!(http.status(), 504);
//! assert_eq!(Code::from_i32(4), Code::DeadlineExceeded);
//! ```
//!
//! # Semantics
//!
//! A request is gRPC when its `content-type` is `application/grpc`, alone or followed by
//! `+format` or parameters (ASCII case insensitive): `application/grpc`,
//! `application/grpc+proto`, `application/grpc; charset=utf-8`. gRPC-Web
//! (`application/grpc-web…`) is not: it carries its status in the body, and is classified as
//! plain HTTP.
//!
//! Local rejections map as follows:
//!
//! | rejection                   | gRPC (HTTP 200, trailers-only)            | HTTP |
//! |-----------------------------|-------------------------------------------|------|
//! | [`Rejection::DeadlineExceeded`] | `grpc-status: 4` DEADLINE_EXCEEDED    | 504  |
//! | [`Rejection::MalformedTimeout`] | `grpc-status: 13` INTERNAL "malformed grpc-timeout" | 400 |
//! | [`Rejection::AttemptTimedOut`] | `grpc-status: 4` DEADLINE_EXCEEDED "attempt timed out" | 504 |
//! | [`Rejection::BreakerOpen`] | `grpc-status: 14` UNAVAILABLE + `grpc-retry-pushback-ms` (-1 when no time can be promised) | 503 + `Retry-After` (none when no time can be promised) |
//! | [`Rejection::ClientThrottled`] | `grpc-status: 14` UNAVAILABLE "throttled by client" + `grpc-retry-pushback-ms: -1` | 503 |
//! | [`Rejection::BulkheadFull`] | `grpc-status: 14` UNAVAILABLE "bulkhead full" + `grpc-retry-pushback-ms: -1` | 503 |
//!
//! Every local response carries its [`Rejection`] in its extensions, so a layer further out can
//! tell our own answer from one the dependency gave. A refusal a server layer makes before its
//! handler runs carries [`NotExecuted`] too (nothing happened: an idempotency layer releases
//! the key); a `Rejection` alone says who answered, not whether the work was done.
//!
//! # Feature flags
//!
//! - `metrics` (off by default): [`metrics`](mod@metrics), the names and labels every layer
//!   records through the `metrics` facade.
//! - `axum` (off by default): [`IntoResponse`](axum_core::response::IntoResponse) for the
//!   local rejections ([`axum`](mod@axum)), so an axum handler can return them.
//! - `h2` (off by default): recognise HTTP/2 `REFUSED_STREAM` and graceful `GOAWAY` errors
//!   from the `h2` crate (under hyper and tonic) in [`classify::classify_error`].
#![doc(test(attr(deny(warnings))))]

#[doc(hidden)]
#[path = "private/mod.rs"]
pub mod __private;
mod attempt;
#[cfg(feature = "axum")]
pub mod axum;
mod body;
pub mod classify;
mod error;
pub mod grpc;
mod hedge;
pub mod hint;
pub mod latency;
#[cfg(feature = "metrics")]
pub mod metrics;
mod name;
pub mod reject;
mod reserve;
mod route;

pub use attempt::FinalAttempt;
pub use body::ResponseBody;
pub use classify::{Classify, GrpcClassifier, HttpClassifier, Outcome, Retryable};
pub use error::{
    AttemptTimedOut, BoxError, BreakerOpen, BulkheadFull, ClientThrottled, ConfigError,
    DeadlineExceeded, find, is_deadline_exceeded,
};
pub use grpc::{Code, is_grpc};
pub use hedge::HedgeDelay;
pub use hint::ServerHint;
pub use reject::{NotExecuted, Rejection};
pub use reserve::RetryReserve;
pub use route::{KeyFn, RouteKey};
