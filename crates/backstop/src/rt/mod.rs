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
