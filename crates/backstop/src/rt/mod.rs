//! Plumbing shared by backstop's own crates: **not part of the public API**.
//!
//! Everything in here exists so that `backstop-deadline`, `backstop-retry`, `backstop-breaker`
//! and the `backstop` facade can share code. It is for backstop's own crates only: it carries
//! **no semver promise** and may change or disappear in any release, patch releases included.
//! Do not use it from outside backstop; the public API lives at the crate root.
//!
//! - [`mix`]: the seeded mixing function of every seeded layer.
//! - [`scope`]: the guard of every thread-local scope (the current deadline, the pushback
//!   mark).
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
pub(crate) mod hedge;
#[cfg(feature = "metrics")]
pub(crate) mod metrics;
pub(crate) mod mix;
pub(crate) mod name;
pub(crate) mod reserve;
pub(crate) mod scope;
pub(crate) mod stripe;
pub(crate) mod sync;
pub(crate) mod tick;
pub(crate) mod timer;

pub(crate) use crate::rt::name::DependencyName;
