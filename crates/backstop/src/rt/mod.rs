//! The runtime plumbing the rooms share (crate-private): timers, striping, seeded mixing.
//!
//! - [`mix`]: the seeded mixing function of every seeded layer.
//! - [`scope`]: the guard of the handler's deadline scope (`deadline::current`).
//! - [`stripe`]: per-core striping of counters that every call writes (the breaker's window,
//!   the retry budget's deposits).
//! - [`sync`]: the lock and atomics of the hand-rolled concurrent structures, loom's under
//!   `cfg(loom)`.
//! - [`tick`]: [`TickCache`](tick::TickCache), a value recomputed at most once per tick
//!   (the throttle's probability, the admission need).
//! - [`timer`]: [`LazySleep`](timer::LazySleep), the timer a future arms only when it must
//!   wait.
//! - [`DependencyName`]: the name each client layer carries into its events.
//! - [`release`]: what a layer that refuses a request does with the readiness its caller
//!   reserved for it.
//! - `metrics` (feature `metrics`): the helpers every layer calls when it registers and
//!   records its handles.

pub(crate) mod attempt;
#[cfg(feature = "metrics")]
pub(crate) mod metrics;
pub(crate) mod mix;
pub(crate) mod name;
pub(crate) mod scope;
pub(crate) mod stripe;
pub(crate) mod sync;
pub(crate) mod table;
pub(crate) mod tick;
pub(crate) mod timer;

pub(crate) use crate::rt::name::DependencyName;

/// Gives back what the caller's `poll_ready` reserved in `inner` for a request a layer then
/// refuses without calling it (a `ConcurrencyLimit` permit, a `Buffer` slot, a connection of a
/// pool): the readied service is dropped for a fresh clone, which is not ready. Kept, it
/// would hold that capacity until this clone of the stack is next called or dropped, and a
/// clone kept in a struct field and called rarely would stall every other caller of a limit
/// of one. Every layer that refuses in `call` does this (its `S: Clone` is for it), as tower's
/// contract asks: a readied service is called, or let go.
#[cold]
pub(crate) fn release<S: Clone>(inner: &mut S) {
    let fresh = inner.clone();
    drop(std::mem::replace(inner, fresh));
}
