//! What counts a request whose deadline expires on a server: the expiry counters per route,
//! kept by the server's deadline layer and handed to its future and its response body.
//!
//! **Concurrency rule.** [`ServerMeters`] is shared by the clones of one layer: its route
//! slots and counters are the lock-free tables of [`route`](super::route); a [`Meter`] belongs
//! to one request.

#[cfg(feature = "metrics")]
use crate::Rejection;
#[cfg(feature = "metrics")]
use std::sync::Arc;

/// What counts a request whose deadline expires once its handler runs (the handler cancelled,
/// or its response body cut short): the layer's counters and the request's path, whose route
/// is looked up only then, a rare event. `None` on the client side and without a deadline.
#[cfg(feature = "metrics")]
pub(crate) type Meter = Option<(Arc<ServerMeters>, Option<http::uri::PathAndQuery>)>;
/// Without the `metrics` feature, nothing.
#[cfg(not(feature = "metrics"))]
#[derive(Debug, Default)]
pub(crate) struct Meter(());

/// Counts the expiry `meter` was kept for, once.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn count_expired(meter: &mut Meter) {
    #[cfg(feature = "metrics")]
    if let Some((meters, path)) = meter.take() {
        let path = path.as_ref().map_or("/", |p| p.path());
        meters.count(Rejection::DeadlineExceeded, path);
    }
}

/// The server side's expiry counters: one per route slot (see the crate's `route` module).
#[cfg(feature = "metrics")]
#[derive(Debug)]
pub(crate) struct ServerMeters {
    slots: crate::deadline::route::RouteSlots,
    counters: crate::deadline::route::RouteCounters,
}

#[cfg(feature = "metrics")]
impl ServerMeters {
    pub(crate) fn new(routes: usize) -> Self {
        Self {
            slots: crate::deadline::route::RouteSlots::new(routes),
            counters: crate::deadline::route::RouteCounters::new(routes),
        }
    }

    /// Counts a rejection of a request to `path`: a malformed `grpc-timeout` (no route: a
    /// caller's bug, not a route's), or a deadline that expired, under the path's route.
    pub(crate) fn count(&self, rejection: Rejection, path: &str) {
        use crate::metrics as names;
        crate::rt::metrics::describe();
        if rejection == Rejection::MalformedTimeout {
            metrics::counter!(names::DEADLINE_MALFORMED).increment(1);
            return;
        }
        self.counters
            .increment(self.slots.slot(path), path, |route| match route {
                Some(route) => {
                    metrics::counter!(names::DEADLINE_EXPIRED, "side" => "server", "route" => route)
                }
                None => metrics::counter!(names::DEADLINE_EXPIRED, "side" => "server"),
            });
    }
}
