//! Deadlines for tower services: set once at the edge, carried in `grpc-timeout`, visible to
//! handlers, and propagated to every outbound call as the *remaining* time.
//!
//! A timeout says "this call may take 2 s". A deadline says "this *request* must be answered by
//! 12:00:02.000", and every call made on its behalf, on every hop, gets what is left of it and
//! never more. When it passes, the work is dropped, not left running for nobody.
//!
//! - [`DeadlineLayer`] (servers) reads the caller's `grpc-timeout`, enforces it, and hands the
//!   [`Deadline`] to the handler (request extensions and [`current()`]).
//! - [`PropagateDeadlineLayer`] (clients) finds the current deadline, writes what remains of it
//!   in `grpc-timeout`, and bounds the call by it.
//! - [`AttemptTimeoutLayer`](crate::client::attempt::AttemptTimeoutLayer) (clients, inside a retry layer and a breaker) gives each
//!   attempt a deadline of its own: a fixed bound, or one derived from the dependency's
//!   measured latency (p99 × 3 by default), never past the request's deadline; it feeds the
//!   latency model and the measured hedge delay ([`HedgeDelay`](crate::client::retry::hedge::HedgeDelay)).
//!
//! # Example
//!
//! A server whose handler calls another service: the outbound call inherits the deadline
//! without anything being passed by hand.
//!
//! ```
//! use backstop::BoxError;
//! use backstop::deadline::{current, Deadline, DeadlineLayer, PropagateDeadlineLayer};
//! use http::{Request, Response};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! // The dependency: answers with the grpc-timeout it was given.
//! let dependency = service_fn(|req: Request<String>| async move {
//!     let timeout = req.headers()["grpc-timeout"].clone();
//!     Ok::<_, BoxError>(Response::builder().header("seen", timeout).body(String::new())?)
//! });
//! // Our client to it: each call may use half of what is left.
//! let client = ServiceBuilder::new()
//!     .layer(PropagateDeadlineLayer::builder().fraction(0.5).build()?)
//!     .service(dependency);
//!
//! // Our server: the handler sees the deadline, and its call inherits it.
//! let server = ServiceBuilder::new()
//!     .layer(DeadlineLayer::new())
//!     .service(service_fn(move |req: Request<String>| {
//!         let client = client.clone();
//!         async move {
//!             let deadline: Deadline = *req.extensions().get().unwrap();
//!             assert_eq!(current(), Some(deadline));
//!             let answer = client.oneshot(Request::new(String::new())).await?;
//!             let seen = answer.headers()["seen"].clone();
//!             Ok::<_, BoxError>(Response::builder().header("seen", seen).body(String::new())?)
//!         }
//!     }));
//!
//! let request = Request::builder().header("grpc-timeout", "800m").body(String::new())?;
//! let response = server.oneshot(request).await?;
//! // 800 ms less the 1 ms lead is 799 ms; half of it goes to the dependency: 399.5 ms, sent
//! // rounded down to three significant digits.
//! assert_eq!(response.headers()["seen"], "399m");
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! **Wire format.** See [`grpc_timeout`](crate::wire::grpc_timeout): 1–8 digits and a unit, decoded strictly, never
//! zero. `PropagateDeadline` sends what is left rounded down to three significant digits, in
//! the coarsest unit that holds them ([`grpc_timeout::encode_coarse`](crate::wire::grpc_timeout::encode_coarse): `999m`, `1230m`, at
//! most 1 % short and never late), so calls in a row send the same value: its header value
//! is shared instead of allocated, and HPACK can index it.
//!
//! ## Inbound: `DeadlineLayer`
//!
//! For each request:
//! 1. The requested timeout is the shortest `grpc-timeout` value (and the
//!    [milliseconds header](DeadlineLayerBuilder::millis_header), if configured). A malformed
//!    value is answered at once with gRPC INTERNAL "malformed grpc-timeout" or HTTP 400, as
//!    gRPC's own servers answer it (a caller whose bound cannot be read is not run unbounded).
//! 2. A requested timeout is reduced by a fixed **lead of 1 ms** (see "Under tonic"); with
//!    none, the [`default_timeout`](DeadlineLayerBuilder::default_timeout) applies; with neither,
//!    the request has no deadline and passes through untouched. The result is clamped to
//!    [`max`](DeadlineLayerBuilder::max).
//! 3. A timeout of zero, or shorter than
//!    [`min_remaining`](DeadlineLayerBuilder::min_remaining), is answered at once with
//!    DEADLINE_EXCEEDED (4) or HTTP 504; the service is not called.
//! 4. Otherwise the [`Deadline`] is put in the request's extensions, the service is called, and
//!    its future is polled inside a scope (a thread-local set for the length of each poll of
//!    the handler's future, and put back after), so [`current()`] returns the deadline in the
//!    handler and in everything it awaits on its task.
//! 5. If the deadline passes first, the handler's future is **dropped** (its work is cancelled)
//!    and the answer is DEADLINE_EXCEEDED (4) as a trailers-only gRPC response, or 504 with a
//!    short text body. A response body is bounded too, by the rule of [response bodies](#response-bodies): the
//!    caller gets one whole answer, never a torn one, so a body complete when the handler
//!    answered is delivered whole even if read just after the deadline, and only a body
//!    still streaming past it is cut (a gRPC body with trailers `grpc-status: 4`, any other
//!    with an error).
//!
//! The answers of 1 and 3, given before the service is called, carry
//! [`NotExecuted`](crate::NotExecuted) in their extensions (nothing happened: an
//! idempotency layer outside releases the request's key); the answer of 5 does not (the
//! handler may have done its work before it was cut: its key keeps that answer).
//!
//! Local answers are responses, not errors: the service's error type passes through unchanged,
//! so the layer fits `axum::Router::layer` and `tonic::transport::Server::builder().layer`
//! without `HandleErrorLayer`.
//!
//! **Under tonic.** tonic's server also reads `grpc-timeout` and answers CANCELLED (1) when its
//! own timer fires. Its timer is armed just before this layer sees the request; the 1 ms lead
//! makes this layer's deadline earlier than tonic's, and tonic polls the service before its
//! timer, so the client sees DEADLINE_EXCEEDED every time. Do not also set tonic's
//! `Server::timeout` shorter than your deadlines: use [`max`](DeadlineLayerBuilder::max).
//!
//! ## Outbound: `PropagateDeadlineLayer`
//!
//! For each request:
//! 1. The effective deadline is the earliest of: [`current()`], a [`Deadline`] in the request's
//!    extensions, a `grpc-timeout` header already on the request (such as tonic's
//!    `Request::set_timeout`), `now +` [`fraction`](PropagateDeadlineLayerBuilder::fraction)
//!    `×` what remains of those, and `now +` [`timeout`](PropagateDeadlineLayerBuilder::timeout).
//!    With none of them the request passes through untouched.
//! 2. If less than [`min_remaining`](PropagateDeadlineLayerBuilder::min_remaining) is left, or
//!    nothing is left once the [`offset`](PropagateDeadlineLayerBuilder::offset) is taken off,
//!    the call fails at once without being sent.
//! 3. Otherwise `grpc-timeout` is set to the remaining time minus the offset (unless built
//!    with [`send_grpc_timeout(false)`](PropagateDeadlineLayerBuilder::send_grpc_timeout), which
//!    puts the [`Deadline`] in the request's extensions instead, for a layer inside that
//!    writes the header), the inner service is called and its future polled with the call's
//!    deadline as [`current()`] (for user code inside), and the call is bounded by the
//!    deadline with a timer of its own: its future, and then its response body. Layers
//!    further in (retries, an attempt bound) read the deadline off the request, never from
//!    [`current()`], so it holds behind a `Buffer` or on another task.
//! 4. A call that fails after the time written in `grpc-timeout` has passed failed because of
//!    the deadline (a transport timer armed from that header, such as tonic's channel, fires
//!    there), and is reported as such.
//!
//! A local failure is reported the way the caller can read it: for a gRPC request, as a
//! trailers-only DEADLINE_EXCEEDED response (so a tonic client gets
//! `Status::deadline_exceeded`, as grpc-go and grpc-java clients do locally) carrying
//! [`Rejection::DeadlineExceeded`](crate::Rejection) in its extensions; for any other
//! request, as the error [`DeadlineExceeded`](crate::DeadlineExceeded) (find it with [`is_deadline_exceeded`](crate::is_deadline_exceeded)). The
//! same holds for the local failures of the layers inside, with a deadline or without one: a
//! gRPC call whose error carries one of backstop's own
//! ([`Rejection::of`](crate::Rejection::of): an attempt out of its bound, an open
//! breaker, a refusal) gets the trailers-only response of that rejection, never the `Err`
//! tonic would report as UNKNOWN.
//!
//! ## Tasks
//!
//! [`current()`] reads a thread-local that is set only while a scoped future (the handler's)
//! is being polled, so it follows that future's task, not a thread. A task spawned from a
//! handler starts without it: wrap its future
//! in [`with_current_deadline`](DeadlineFutureExt::with_current_deadline), or in
//! [`Deadline::scope`] to give it a deadline of its own. Scopes only ever shorten: an inner
//! scope with a later deadline keeps the outer one. A client whose `call` runs on another
//! task (a `Buffer` around it) takes the deadline on the request instead:
//! `req.extensions_mut().insert(deadline)`.
//!
//! A call made in the handler keeps its deadline wherever its future goes afterwards: picked
//! in `call`, bounded by a timer the call's own future arms. A handler that polls a call and
//! then spawns it, drops it, or races it in `select!` cannot make the server answer late.
//!
//! # Ordering
//!
//! On a server, `DeadlineLayer` goes outermost (first in `ServiceBuilder`), so the deadline
//! covers everything inside: retries' pushback, concurrency limits, the handler. On a client,
//! `PropagateDeadlineLayer` goes outermost, around retries, the circuit breaker and any
//! per-attempt timeout, so that all attempts together fit in the one deadline:
//!
//! ```text
//! server:  DeadlineLayer → (PushbackLayer) → your service
//! client:  PropagateDeadlineLayer → (RetryLayer → BreakerLayer → attempt timeout) → transport
//! ```
//!
//! # Feature flags
//!
//! - `metrics` (off by default): attempt durations, expired deadlines, malformed
//!   `grpc-timeout`s, admission and bulkhead refusals, recorded through the `metrics` facade
//!   (names and labels in `backstop::metrics`).
//!
//! # Response bodies
//!
//! **The rule: a caller gets one whole answer, the handler's or the deadline's, never a
//! torn one.** Once the head is out, an HTTP body cut short is a torn message (hyper's
//! `IncompleteMessage`), so the deadline cuts only a body that would have to *wait* for
//! it: while the deadline holds, frames pass through untouched; past it (a handler
//! answering at its deadline is read a few µs later), a body that is complete is still
//! delivered whole, and only one still streaming is cut. Complete means: it has ended; or
//! it declares its exact size (axum's `String`, `Json`, `Bytes`, `Full`, a
//! `Content-Length` body) and its frames are ready when read; or, without a size, its
//! frames up to its end (at most four: a gRPC unary answer's message and trailers) are
//! ready at once. A body that is not ready past its deadline, or that is unsized and
//! still yielding frames (a stream always ready, held back only by its reader), is cut
//! there: the clock is read at each frame. A cut gRPC body ends with trailers
//! `grpc-status: 4` (DEADLINE_EXCEEDED), a whole gRPC answer; any other body ends with a
//! [`DeadlineExceeded`](crate::DeadlineExceeded) error, which makes hyper reset the stream (the only way HTTP can
//! say that a streamed body is incomplete). The timer is only created the first time the
//! body is not ready, so a body that is complete at once (a unary response) costs no
//! timer and no allocation; the body is `Unpin` whenever the inner body is.
//!
//! **On the client** ([`PropagateDeadline`]'s responses) the
//! same rule reads differently, because a client cannot know whether the rest of a body
//! is on its socket: hyper yields a body chunk by chunk, each read waiting for its
//! connection task. The deadline bounds the whole call, reading the body included (as
//! reqwest's `timeout` does): read past it, the frames that are ready are delivered (an
//! answer held in memory is whole), and a body that has to wait for the network ends
//! with [`DeadlineExceeded`](crate::DeadlineExceeded), never a short body that looks complete. Read or collect the
//! body within the deadline.

pub(crate) mod body;
pub(crate) mod head;
pub(crate) mod meter;
pub(crate) mod route;
pub(crate) mod scope;
pub(crate) mod value;

pub use crate::client::deadline::{
    PropagateDeadline, PropagateDeadlineLayer, PropagateDeadlineLayerBuilder,
};
pub use crate::deadline::value::Deadline;
pub use crate::server::deadline::{DeadlineLayer, DeadlineLayerBuilder, DeadlineService};
pub use crate::wire::grpc_timeout::MalformedTimeout;
pub(crate) use body::DeadlineBody;
pub use scope::{DeadlineFutureExt, current};
