//! Hedging: when an attempt is slower than usual, send another copy and take whichever answers
//! first — the tail-latency cure of gRPC A6's `hedgingPolicy`, budgeted like retries.
//!
//! Configure it on a [`RetryConfig`](crate::client::retry::RetryConfig) with [`Hedging`]; the client presets
//! take the delay from the dependency's measured latency.
//!
//! # Rules (gRPC A6 hedging, and where backstop differs)
//!
//! - **Which requests.** Those the policy's [`Idempotency`](crate::client::retry::Idempotency) rule allows
//!   (by default GET, HEAD, OPTIONS, TRACE, PUT, DELETE or an `Idempotency-Key`; every gRPC
//!   call is a POST, so a gRPC client opts in with [`Idempotency::All`](crate::client::retry::Idempotency::All)
//!   when all its methods are safe to run twice). Other requests are retried as without
//!   hedging.
//! - **The body.** A copy goes beside an attempt in flight only once the request's body is
//!   complete in the replay buffer (an empty body always is), so it never cuts another
//!   attempt's body short ([`ReplayBody::is_complete`](crate::client::retry::ReplayBody::is_complete)): a
//!   hedge due while the transport is still sending the body (hyper and tonic send it on their
//!   connection task, after the first poll) waits for the body's end, then goes at once. With
//!   no attempt in flight (the last one failed), the next copy takes the body over as a
//!   retry's does, complete or not. A body past `max_replay_bytes` is neither hedged nor
//!   retried.
//! - **When.** The first attempt goes at once; each further one [`HedgeDelay`] after the
//!   previous one, up to `max_attempts` in all (a delay of zero sends them all at once, once
//!   the body is complete). A delay of `None` (a measured delay whose model is not trusted
//!   yet) sends no hedge: the request is retried as without hedging.
//! - **Which answer wins.** The first attempt that *commits*: a success, a response whose
//!   outcome the trailers will tell (gRPC headers without a status), or a failure that is not
//!   retryable (A6's "fatal"). Every other attempt is dropped at that moment — for the breaker
//!   a cancellation, never a failure; for the attempt bound's latency model (the measured delay's
//!   source) a censored sample, at least as long as it ran, so the model's tail, and with it
//!   the delay, is not read short from the winners alone.
//! - **Retryable failures** (A6's "non-fatal codes": the classifier's retryable set) send the
//!   next hedge at once; `grpc-retry-pushback-ms: n` sends it in exactly `n` ms, and a
//!   `Retry-After` after that long, and no hedge goes before a wait the server asked for is
//!   over, whatever the hedging delay says; a wait over 30 s (as for retries) or one that does
//!   not leave 1 ms before the deadline stops hedging at once, and a negative pushback stops
//!   it too. When no attempt is left in flight and no hedge will be
//!   sent, the last failure is returned.
//! - **The budget.** Every hedge takes a token from the same [`Budget`](crate::client::retry::Budget) as
//!   retries, so retries and hedges together stay within its ratio; no token, no hedge. A
//!   success deposits once per request. Failures reach the budget as they do for retries.
//! - **The deadline.** No hedge is sent without 1 ms left on the wire; each
//!   hedge's `grpc-timeout` says the time really left, and gRPC hedges carry
//!   `grpc-previous-rpc-attempts` (the number of attempts sent before it). The deadline ends
//!   the call whatever it waits for — an attempt, the next hedge's time, or a service that is
//!   not ready to take a hedge (its own timer, armed the first time the call waits) — with
//!   the deadline's error.
//!
//! Compared with tower's `Hedge`: that sends one hedge at most, needs `Clone` requests, keeps
//! its histogram behind a `Mutex` (and reads only the last full period of it, so it does not
//! hedge during its first period), lets an error win the race, and is not budgeted.
//! tower-resilience's hedge takes a delay that is fixed or a function of the attempt number
//! (no measured latency) and is not budgeted either: its hedges add load however many requests
//! are slow, where these stop when the retry budget is spent.
//!
//! # Concurrency rule
//!
//! A request's attempts are polled by its one response future; they share nothing but the
//! request body's replay buffer (see [`ReplayBody`](crate::client::retry::ReplayBody)) and the layer's budget
//! and stats, which are lock-free.

mod run;

pub(crate) use run::{Hedges, HedgesBox};

// Where the delay before the next hedge comes from.
mod delay;

pub use delay::HedgeDelay;

use std::sync::Arc;

/// A hedging configuration for [`RetryConfig::hedging`](crate::client::retry::RetryConfig::hedging); the
/// rules are in the [module docs](self).
///
/// ```
/// use backstop::client::retry::{Idempotency, RetryConfig};
/// use backstop::client::retry::hedge::Hedging;
/// use std::time::Duration;
///
/// // Up to three attempts, 40 ms apart, for any request.
/// let layer = RetryConfig::grpc()
///     .hedging(Hedging::new(Duration::from_millis(40)).max_attempts(3))
///     .idempotency(Idempotency::All)
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
pub struct Hedging {
    pub(crate) max_attempts: u32,
    pub(crate) delay: Arc<dyn HedgeDelay>,
}

impl Hedging {
    /// Two attempts at most (the first and one hedge), the second after `delay`.
    pub fn new(delay: impl HedgeDelay + 'static) -> Self {
        Self {
            max_attempts: 2,
            delay: Arc::new(delay),
        }
    }

    /// Attempts in all, the first included: 2 ..= [`MAX_ATTEMPTS_LIMIT`](crate::client::retry::MAX_ATTEMPTS_LIMIT)
    /// (checked by [`RetryConfig::build`](crate::client::retry::RetryConfig::build)). Default 2.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// The delay source.
    pub fn delay(&self) -> &dyn HedgeDelay {
        &*self.delay
    }
}
