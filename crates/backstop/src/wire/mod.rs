//! What travels on the wire, and what backstop answers itself.
//!
//! - [`grpc`]: gRPC status [`Code`](grpc::Code)s, the header names backstop reads and writes,
//!   and detection of gRPC traffic ([`is_grpc`](crate::is_grpc)) by its `content-type`.
//! - [`grpc_timeout`]: the `grpc-timeout` codec (gRPC's PROTOCOL-HTTP2), strict on what it
//!   reads, exact on what it writes.
//! - [`ServerHint`](crate::ServerHint) (at the crate's root): a server's `Retry-After` and
//!   `grpc-retry-pushback-ms`, and [`NO_RETRY`], backstop's own "do not retry" header.
//! - [`Rejection`](crate::Rejection) (at the crate's root): the answers backstop gives itself (a deadline
//!   that passed, a malformed `grpc-timeout`, an open breaker, …), each as the response a
//!   client understands: a trailers-only gRPC response, or an HTTP status with a short body.
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
//! | [`Rejection::DeadlineExceeded`](crate::Rejection::DeadlineExceeded) | `grpc-status: 4` DEADLINE_EXCEEDED    | 504  |
//! | [`Rejection::MalformedTimeout`](crate::Rejection::MalformedTimeout) | `grpc-status: 13` INTERNAL "malformed grpc-timeout" | 400 |
//! | [`Rejection::AttemptTimedOut`](crate::Rejection::AttemptTimedOut) | `grpc-status: 4` DEADLINE_EXCEEDED "attempt timed out" | 504 |
//! | [`Rejection::BreakerOpen`](crate::Rejection::BreakerOpen) | `grpc-status: 14` UNAVAILABLE + `grpc-retry-pushback-ms` (-1 when no time can be promised) | 503 + `Retry-After` (none when no time can be promised) |
//! | [`Rejection::ClientThrottled`](crate::Rejection::ClientThrottled) | `grpc-status: 14` UNAVAILABLE "throttled by client" + `grpc-retry-pushback-ms: -1` | 503 |
//! | [`Rejection::BulkheadFull`](crate::Rejection::BulkheadFull) | `grpc-status: 14` UNAVAILABLE "bulkhead full" + `grpc-retry-pushback-ms: -1` | 503 |
//!
//! Every local response carries its [`Rejection`](crate::Rejection) in its extensions, so a
//! layer further out can tell our own answer from one the dependency gave. A refusal a server
//! layer makes before its handler runs carries [`NotExecuted`](crate::NotExecuted) too (nothing
//! happened: an idempotency layer releases the key); a `Rejection` alone says who answered, not
//! whether the work was done.
//!
//! ```
//! use backstop::{wire::grpc::Code, is_grpc, Rejection};
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

#[cfg(feature = "axum")]
pub(crate) mod axum;
pub(crate) mod body;
pub mod grpc;
pub mod grpc_timeout;
pub(crate) mod hint;
pub(crate) mod reject;

pub use hint::NO_RETRY;
