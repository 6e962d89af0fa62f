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

#[cfg(feature = "metrics")]
pub mod metrics;
pub mod mix;
pub mod scope;
pub mod stripe;
pub mod sync;
pub mod tick;
pub mod timer;

pub use crate::name::DependencyName;

use http::HeaderValue;

/// Whether a `content-type` value is gRPC's, by the rules of [`is_grpc`](crate::is_grpc) (for the deadline
/// layers, which read every header in one pass; reached through `__private`).
pub fn is_grpc_content_type(value: &HeaderValue) -> bool {
    const TYPE: &[u8] = b"application/grpc";
    let ct = value.as_bytes();
    ct.len() >= TYPE.len()
        && ct[..TYPE.len()].eq_ignore_ascii_case(TYPE)
        // `application/grpc`, `application/grpc+proto`, `application/grpc; charset=…`;
        // not `application/grpc-web` (trailers in the body) nor `application/grpcfoo`.
        && matches!(ct.get(TYPE.len()), None | Some(b'+' | b';' | b' ' | b'\t'))
}

/// The metric label a keyed layer's series carry their key under: `authority` for
/// [`RouteKey::Authority`](crate::RouteKey::Authority), `route` for a path or a custom key (a
/// custom key names a route, as the client series of a service-config stack do), so the
/// breaker's, the attempt bound's and the client series of one route join on one label.
pub fn key_label(key: &crate::RouteKey) -> &'static str {
    match key {
        crate::RouteKey::Authority => "authority",
        _ => "route",
    }
}
