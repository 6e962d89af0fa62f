//! A circuit breaker for tower: fail fast while a dependency is down, probe it carefully,
//! and recover without a stampede.
//!
//! # Example
//!
//! ```
//! use backstop::client::breaker::{BreakerConfig, State};
//! use http::{Request, Response, StatusCode};
//! use std::time::Duration;
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), backstop::BoxError> {
//! // A dependency that is down: every call is a 503.
//! let down = service_fn(|_req: Request<String>| async {
//!     let response = Response::builder().status(StatusCode::SERVICE_UNAVAILABLE);
//!     Ok::<_, std::convert::Infallible>(response.body(String::new()).unwrap())
//! });
//!
//! let breaker = BreakerConfig::http()
//!     .minimum_calls(5)
//!     .open_duration(Duration::from_secs(5), Duration::from_secs(60))
//!     .build()?;
//! let mut client = ServiceBuilder::new().layer(breaker.clone()).service(down);
//!
//! for _ in 0..5 {
//!     let response = client.ready().await?.call(Request::new(String::new())).await?;
//!     assert_eq!(response.status(), 503);
//! }
//! // Five failures out of five calls: open. The next call fails at once, locally.
//! assert_eq!(breaker.snapshot().state, State::Open);
//! let err = client.ready().await?.call(Request::new(String::new())).await.unwrap_err();
//! assert_eq!(err.to_string(), "circuit breaker open");
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! **Closed** (the start): every call passes. Each call's result is classified once by a
//! [`Classify`](crate::Classify) ([`BreakerConfig::http`], [`BreakerConfig::grpc`]):
//! a [success](crate::Outcome::Success) or a
//! [failure](crate::Outcome::Failure) is recorded in the window; a caller error
//! ([`Ignored`](crate::Outcome::Ignored): 4xx, INVALID_ARGUMENT…) and our own
//! rejections ([`Rejected`](crate::Outcome::Rejected): a deadline already spent,
//! another breaker open) are not. The breaker **opens** when a failure (or a slow call) is
//! recorded and the window then holds at least `minimum_calls` (default 20) calls with
//! - failures / calls ≥ `failure_rate` (default 0.5), or
//! - slow calls / calls ≥ the `slow_calls` rate, a call being slow when it took at least the
//!   `slow_calls` duration (off by default), or
//! - optionally, `consecutive_failures` failures in a row.
//!
//! A success never opens the breaker, so the success path is one atomic load and one
//! read-modify-write on a cache line of the calling thread's own. The rates are exact over the
//! window (no moving average): by default a time window of the last 10 s in 10 buckets of
//! 1 s, or a [count window](BreakerConfig::count_window) of exactly the last N calls. Memory is
//! fixed when the breaker is built (one word per bucket and per core, at most 16 copies; one
//! byte per call of a count window) and never grows with traffic.
//!
//! **Open**: every call fails at once, without reaching the dependency, with
//! [`BreakerOpen`](crate::BreakerOpen) whose `retry_after` says when the open time
//! ends. A gRPC request (`content-type: application/grpc`, see [`is_grpc`](crate::is_grpc)) gets a trailers-only
//! `UNAVAILABLE` response with `grpc-retry-pushback-ms` instead, because a gRPC client such
//! as tonic turns an error from its transport into UNKNOWN; the response carries
//! [`Rejection::BreakerOpen`](crate::Rejection) so a retry layer above knows it is
//! local and never retries it. The open time is 5 s the first time and doubles at each
//! consecutive re-open, up to 300 s, each with equal jitter (uniform in `[d/2, d]`) so a fleet
//! of clients does not probe in step.
//!
//! **Half-open**: once the open time has passed, the next call is let through as a probe,
//! and so on up to `probes` (default 3) probes at once; other calls are refused as while
//! open, with no `retry_after`: no time can be promised while the probes decide, so gRPC
//! callers get `grpc-retry-pushback-ms: -1` ("do not retry", never "retry now") and HTTP
//! callers no `Retry-After`. The same holds for calls refused by slow start and by
//! [`Mode::ForcedOpen`]. When every probe succeeds the breaker **closes** with an
//! empty window (optionally with a [slow start](BreakerConfig::slow_start)); the first probe
//! that fails, or is slow, **re-opens** it for longer. A probe that ends as ignored, or is
//! cancelled, gives its slot back.
//!
//! **Generations.** Each transition starts a new generation; a call only counts in the
//! generation that admitted it. A slow call admitted while closed that ends during half-open
//! decides nothing, and neither does a probe that ends after the breaker re-opened.
//! One race is bounded rather than excluded, to keep the success path free of extra
//! read-modify-writes: a call that passed the generation check and is writing its outcome
//! at the very instant of a close (a reset, or the last probe) may land in the new window.
//! That is at most one record per call in flight at that instant, and it ages out like any
//! other; the window's totals stay exactly the sum of its slots (a loom model checks both).
//!
//! **Outcomes in trailers.** For a gRPC response whose headers carry no `grpc-status`, the
//! outcome is in the trailers: the response body holds the call's permit and records the
//! outcome at the end of the stream. A body dropped before its end counts as nothing.
//!
//! **Cancellation.** Every admitted call holds a permit; dropping the response future (or
//! the body, as above) before the outcome is known records nothing and frees a probe slot —
//! except, with slow-call detection on, for a call that had already run for the slow-call
//! duration: it was slow, whoever gave up on it, so it counts as a slow call (a dependency
//! that hangs until every caller's deadline cancels it must still open the breaker).
//!
//! **No locks.** Admission while closed is one atomic load; recording a success is one atomic
//! read-modify-write on the time window's stripe of the calling thread (each thread records
//! into its own copy of the buckets, on its own cache lines; readers add the copies up);
//! transitions are compare-and-swaps on one word (see the `state` module's source). The count
//! window is exact over the last N calls and so shares one cursor between threads: prefer the
//! time window on hot, many-core paths. A loom model checks admission and probe slots under concurrency and
//! cancellation (`RUSTFLAGS="--cfg loom" cargo test -p backstop --lib loom`).
//!
//! **Modes** ([`Mode`], at build time or with [`BreakerLayer::set_mode`]): `Normal`;
//! `ForcedOpen` refuses everything; `Disabled` passes everything and records nothing;
//! `MetricsOnly` records and moves between states but never refuses a call.
//! [`BreakerLayer::reset`] closes it by hand.
//!
//! **Without tower.** [`BreakerLayer::try_acquire`] admits one call made some other way (a
//! database or cache driver, a hand-written loop) into the same breaker, and its
//! [`CallPermit`] records the outcome you give it, or a cancellation when dropped.
//!
//! **Observing it.** [`BreakerLayer::snapshot`] (state, rates, counts, open-until);
//! [`BreakerConfig::on_state_change`] runs a hook on every [`Transition`]; every transition
//! is also a `tracing` event with its [`Reason`] (`warn` when opening, `info` otherwise).
//!
//! # Ordering
//!
//! ```text
//! client:  PropagateDeadlineLayer → RetryLayer → BreakerLayer → attempt timeout → transport
//! ```
//!
//! Inside the retry layer, so that every attempt asks the breaker and an open breaker stops
//! retries at once (a local rejection is never retried); outside any per-attempt timeout, so
//! that a timed-out attempt counts as a failure. One breaker per dependency: share a layer
//! (its clones share the breaker) across the clients that call the same service.
//!
//! # Feature flags
//!
//! - `metrics` (off by default): the breaker's state gauge and its transition and rejection
//!   counters through the `metrics` facade (names and labels in `backstop::metrics`).
//!
//! The breaker works on `http::Request` / `http::Response` with any body.
//!
//! # A breaker per key
//!
//! One breaker per key inside one layer: per host (`authority`), per path, or per whatever a
//! function of the request's method and URI says (a route template, a gRPC method).
//!
//! A dependency with many routes or hosts rarely fails all at once: with one breaker, a route
//! that is down opens it and calls to the routes that work fail with it. With a breaker per
//! key, the bad route fails fast alone.
//!
//! # Bounds
//!
//! - At most `max_keys` breakers (default 64). A key met when the table is full takes the
//!   place of a key that can be evicted (below); when none can, its calls share the
//!   **overflow breaker**, as do calls the key function gives no key. So memory is
//!   bounded whatever the keys: `max_keys + 1` breakers, each of the size its
//!   [`Snapshot::shared_bytes`](crate::client::breaker::Snapshot::shared_bytes) reports (with the default
//!   10 s window: 1 536 bytes on a 2-core machine, a few KiB at most, as stripes stop at 16
//!   cores; a test holds it under 16 KiB), plus the key's text and a table slot.
//! - A key can be evicted once no call has used it for **5 minutes** (fixed; the constant's
//!   comment says why; counted in milliseconds, so it has really gone that long without a call), and its
//!   breaker is not open with open time left. An open breaker is kept until its open time
//!   is over, called or not: a fresh breaker in its place would let calls through to a
//!   route its breaker refuses. (A half-open one can go once idle: its open time is over,
//!   and a probe still in flight reports to the breaker it holds.) A
//!   [`reset`](crate::client::breaker::BreakerLayer::reset) closes every key's breaker, which can then go as
//!   soon as it is idle.
//!
//! # Concurrency rule
//!
//! The crate's per-route table: calls to a key that exists take no lock (an `arc-swap` snapshot);
//! adding a key takes the table's grow mutex, as does the layer's run-time setter
//! ([`set_mode`](crate::client::breaker::BreakerLayer::set_mode)): it records the mode for the keys to
//! come and applies it to every key in the table, and a key is built with the mode recorded
//! when it is added, so a key added while the setter runs gets the mode either way (a loom
//! model checks it). A call holds its breaker (an `Arc`) until its outcome is recorded, so an
//! evicted breaker lives on until its last call ends. The name is configuration
//! ([`named`](crate::client::breaker::BreakerLayer::named)): every key's breaker is built with it.
//!
//! A key is a [`RouteKey`](crate::RouteKey): per host, per path, or per route:
//!
//! ```
//! use backstop::RouteKey;
//! use std::borrow::Cow;
//!
//! // `/item/42/stock` → `/item/stock`: one breaker per kind of call, not per item.
//! let key = RouteKey::custom(|_method, uri| {
//!     let route: Vec<&str> = uri
//!         .path()
//!         .split('/')
//!         .filter(|s| !s.is_empty() && !s.bytes().all(|b| b.is_ascii_digit()))
//!         .collect();
//!     Some(Cow::Owned(format!("/{}", route.join("/"))))
//! });
//! # let _ = key;
//! ```

pub(crate) mod body;
pub(crate) mod config;
pub(crate) mod future;
pub(crate) mod keyed;
pub(crate) mod layer;
pub(crate) mod permit;
pub(crate) mod service;
pub(crate) mod shared;
pub(crate) mod state;
pub(crate) mod sync;
pub(crate) mod transition;
pub(crate) mod window;
pub(crate) mod word;

#[cfg(all(test, loom))]
pub(crate) mod loom_tests;

pub(crate) use body::BreakerBody;
pub use config::BreakerConfig;
pub use layer::BreakerLayer;
pub use permit::CallPermit;
pub use service::Breaker;
pub use shared::Snapshot;
pub use transition::{Mode, Reason, State, Transition};
