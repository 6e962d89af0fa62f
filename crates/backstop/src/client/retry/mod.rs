//! Retries for tower services that cannot turn a blip into an outage: a shared budget,
//! jittered backoff, server hints, idempotency rules, the deadline, and request bodies replayed
//! without being `Clone`.
//!
//! # Example
//!
//! ```
//! use backstop::client::retry::{RetryConfig, ReplayBody};
//! use http::{Request, Response, StatusCode};
//! use std::sync::{atomic::{AtomicUsize, Ordering}, Arc};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), backstop::BoxError> {
//! // A dependency that fails its first call with 503.
//! let calls = Arc::new(AtomicUsize::new(0));
//! let counter = calls.clone();
//! let dependency = service_fn(move |_req: Request<ReplayBody<String>>| {
//!     let n = counter.fetch_add(1, Ordering::SeqCst);
//!     async move {
//!         let status = if n == 0 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
//!         Ok::<_, std::convert::Infallible>(
//!             Response::builder().status(status).body(String::new()).unwrap(),
//!         )
//!     }
//! });
//!
//! let retry = RetryConfig::http().max_attempts(3).seed(7).build()?;
//! let client = ServiceBuilder::new().layer(retry.clone()).service(dependency);
//!
//! let response = client.oneshot(Request::get("/").body(String::new())?).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(calls.load(Ordering::SeqCst), 2);
//! assert_eq!(retry.stats().retries, 1);
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! Each attempt's result is classified once ([`Classify`](crate::Classify); presets
//! [`RetryConfig::http`] and [`RetryConfig::grpc`]). Then, in this order, and only if every
//! step allows it, the request is sent again; otherwise the last result is returned unchanged,
//! at once ([`GiveUp`] names the step, in [`RetryStats`] and in a `tracing` event):
//!
//! 1. the outcome is a [failure](crate::Outcome::Failure) that is not
//!    [`Never`](crate::Retryable::Never) retryable (successes, ignored caller errors and
//!    our own rejections are returned);
//! 2. fewer than `max_attempts` attempts were made (default 3, the first included, at most 10);
//! 3. the failure proves the request was not processed, or the request is idempotent
//!    ([`Idempotency`]: by default GET, HEAD, OPTIONS, TRACE, PUT, DELETE, or an
//!    `Idempotency-Key` header);
//! 4. the server did not say "do not retry" (`grpc-retry-pushback-ms` negative or malformed);
//! 5. the body can be replayed (at most `max_replay_bytes` read, default 64 KiB);
//! 6. the wait, plus 1 ms (fixed), fits before the deadline *on the wire*: the earlier of
//!    the request's deadline (request extension or [`backstop::deadline::current`](crate::deadline::current)) and what
//!    the server was told (an outer `PropagateDeadline`'s `grpc-timeout`, offset included, or
//!    a header the caller set) — a retry that could not be sent with time left is never
//!    scheduled, and the real failure is returned at once. The wait is:
//!    - a valid `grpc-retry-pushback-ms: n`: exactly `n` ms, and the backoff starts over from
//!      its first delay afterwards (gRPC A6: "retry in n ms … reset to initial backoff");
//!    - a `Retry-After`: at least that long (RFC 9110), or the [backoff] if longer;
//!    - otherwise the [backoff].
//!
//!    A wait drawn longer than what is left for a retry (the deadline on the wire less 1 ms
//!    and the reserve below) is shortened to fit, never below the backoff's least delay
//!    ([`RetryConfig::least_retry_wait`]) or what the server asked: the share of the deadline
//!    an attempt bound keeps for a retry is used, not lost to the jitter's draw.
//!
//!    A server hint longer than 30 s (fixed) gives up for [`GiveUp::Hint`] with the server's
//!    answer: the layer never retries sooner than the server asked, and holds no call longer
//!    than that for a hint (gRFC A6 would wait any pushback out; a deadline bounds the wait
//!    anyway). With a
//!    [`reserve`](RetryConfig::reserve) (the client presets: the dependency's measured p50),
//!    the wait plus the reserve must fit there too, or the failure is returned at once,
//!    given up for [`GiveUp::Reserve`] rather than [`GiveUp::Deadline`]: the retry could be
//!    sent, but the dependency's usual call could not finish in what is left, and a retry
//!    that times out is one more failure for the breaker to count. The reserve is read when
//!    the retry is decided, from whatever the stack was built with (a handle to the attempt
//!    layer's latency model, decided when the stack is built), never from per-request state;
//!    a reserve of `None` (a model not trusted yet) asks for nothing;
//! 7. the [budget](Budget) grants a token;
//! 8. the body is taken over for the next attempt (see [`ReplayBody`]): from here on the
//!    attempt that failed can no longer read it, even if its transport is still sending it.
//!    Only a retry that passed every step above takes it over, so an attempt whose result is
//!    returned keeps its body.
//!
//! **What each attempt's `grpc-timeout` says.** What the request carried, kept true: a
//! request that arrived with a `grpc-timeout` (an outer `PropagateDeadline` wrote it, or the
//! caller did) has on each attempt the time really left when the attempt is sent,
//! `min(deadline, what the caller told the server) − now` (an attempt bound inside the
//! breaker, the attempt bound `AttemptTimeout`, shortens it further). The first attempt keeps
//! a header that already says no more (an outer `PropagateDeadline` wrote it a moment ago);
//! every retry gets a new one. A request that arrived without one is sent without one on
//! every attempt, though its deadline still bounds the retries: whether the server is told is
//! the deadline layer's decision
//! ([`send_grpc_timeout`](crate::deadline::PropagateDeadlineLayerBuilder::send_grpc_timeout)),
//! made once, not this layer's. A header set by the caller with no deadline in scope is the
//! deadline. gRPC retries carry `grpc-previous-rpc-attempts`.
//!
//! **No attempt timeout here.** The retry layer bounds attempts only by the deadline. A bound
//! per attempt belongs inside the breaker, so a timed-out attempt is a failure the breaker
//! counts (a timeout out here would cancel the attempt, which the breaker never counts): the
//! client presets measure one, or put `backstop::client::attempt::AttemptTimeoutLayer` under
//! the breaker. Its [`AttemptTimedOut`](crate::AttemptTimedOut) is a retryable failure
//! for idempotent requests. (`RetryConfig::attempt_timeout`, which bounded attempts out here,
//! was removed.)
//!
//! **What the budget hears.** Each logical request that succeeds deposits once; a gRPC call
//! committed by its response headers (no status yet; gRPC A6: never retried) deposits only
//! if its trailers say OK — the response body tells the budget at the end of
//! the stream, and a stream that fails or ends without trailers is no success. A failure is
//! reported to the budget ([`Budget::record_failure`], which the A6 [`GrpcThrottle`]
//! counts) only when it could be retried, or when the server said "do not retry": never for
//! a final status such as INVALID_ARGUMENT or INTERNAL (A6).
//!
//! Each attempt is bounded by the deadline. A gRPC call is committed once
//! response headers without a status arrive (gRPC A6): only trailers-only failures are
//! retried. With `max_attempts(1)`, or a body whose size hint already exceeds
//! `max_replay_bytes`, the request passes through: no buffering and no copy of the request.
//!
//! The inner service receives `Request<ReplayBody<B>>`. hyper-util's client takes it as is
//! (`Client<_, ReplayBody<B>>`); for a tonic `Channel`, map the body back with
//! `tonic::body::Body::new` (`ServiceBuilder::map_request`).
//!
//! **Across hops.** When a retry layer gives up on a retryable failure (attempts, budget,
//! deadline, a downstream "do not retry") or meets our own rejection, it marks the request it
//! serves; a [`PushbackLayer`](crate::server::pushback::PushbackLayer) on that server then stamps `grpc-retry-pushback-ms: -1` on the
//! failed gRPC response (`backstop-no-retry: 1` on a plain HTTP one), so callers do not retry it again: the failing dependency sees at most
//! `max_attempts` attempts per user request, not `max_attempts` to the power of the hops.
//!
//! # Ordering
//!
//! ```text
//! client:  PropagateDeadlineLayer → RetryLayer → BreakerLayer → attempt timeout → transport
//! server:  DeadlineLayer → PushbackLayer → your service
//! ```
//!
//! The deadline goes outside the retries so every attempt shares one deadline; the breaker
//! goes inside so each attempt asks it (an open breaker is a local rejection, never retried).
//!
//! # Feature flags
//!
//! - `h2` (off by default): HTTP/2 `REFUSED_STREAM` and graceful `GOAWAY` count as "not
//!   processed", so they are retried for every method (see
//!   [`classify_error`](crate::classify::classify_error)).

pub mod backoff;
pub(crate) mod body;
pub(crate) mod bounds;
pub(crate) mod budget;
pub(crate) mod config;
pub(crate) mod error;
pub(crate) mod error_type;
pub(crate) mod future;
pub mod hedge;
pub(crate) mod info;
pub(crate) mod layer;
#[cfg(feature = "metrics")]
pub(crate) mod metrics;
#[cfg(not(feature = "metrics"))]
#[path = "metrics_off.rs"]
pub(crate) mod metrics;
pub(crate) mod replay;
pub(crate) mod reserve;
pub(crate) mod service;
pub(crate) mod shared;
pub(crate) mod state;
pub(crate) mod stats;
pub(crate) mod template;

pub use backoff::Backoff;
pub(crate) use body::RetryBody;
pub use budget::{Budget, GrpcThrottle, GrpcThrottleBuilder, RatioBudget, RatioBudgetBuilder};
pub use config::{Idempotency, MAX_ATTEMPTS_LIMIT, RetryConfig, RetryOverrides};
pub(crate) use config::{MAX_HINT, MIN_ATTEMPT_TIME};
pub use error::RetryError;
pub use info::{Attempt, CallInfo};
pub use layer::RetryLayer;
pub use replay::{BodyFailedEarlier, BodySuperseded, ReplayBody};
pub use reserve::RetryReserve;
pub use service::Retry;
pub use stats::{GiveUp, RetryStats};
