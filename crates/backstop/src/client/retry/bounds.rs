//! The time bounds of a request's attempts: its deadline, what its caller told the server,
//! and each attempt's `grpc-timeout`.

use crate::deadline::Deadline;
use crate::wire::grpc::GRPC_TIMEOUT;
use crate::wire::grpc_timeout;
use http::Request;
use tokio::time::Instant;

/// How an attempt was armed with its time bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Armed {
    /// No deadline: the attempt runs until it answers.
    Unbounded,
    /// The attempt must end by this instant (its header says the time left until it).
    Until(Instant),
    /// Nothing is left to send: the attempt must not go out.
    Expired,
}

impl Armed {
    /// When the attempt must end (`None`: no bound, or not to be sent).
    pub(crate) fn until(self) -> Option<Instant> {
        match self {
            Armed::Until(at) => Some(at),
            Armed::Unbounded | Armed::Expired => None,
        }
    }
}

/// Who writes each attempt's `grpc-timeout`, decided when the layer is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    /// This layer, for a request that carried the header (an outer `PropagateDeadline`'s, or
    /// the caller's): each retry and hedge says the time really left. A request sent without
    /// one is retried without one, so every attempt tells the server the same thing (the
    /// header, or nothing). How a retry layer alone is built.
    Refresh,
    /// A layer inside, as the deadline less this offset
    /// (`RetryLayer::grpc_timeout_written_inside`, how the presets build theirs).
    Inside(std::time::Duration),
}

/// The time bounds of a request's attempts.
///
/// What each attempt's `grpc-timeout` says, whoever wrote the original header: the time
/// really left when the attempt is sent, `min(deadline, wire) − now`, where `wire` is what the
/// caller told the server (an outer `PropagateDeadline`'s header, keeping its offset, or a
/// header the caller set). A retry is scheduled only if it can be sent with at least
/// 1 ms left on the wire. (An attempt bound inside the breaker, the
/// `AttemptTimeout`, shortens an attempt's header further.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// The request's deadline: the earlier of its extension and the task's current deadline,
    /// or, with neither, the instant its `grpc-timeout` header names.
    pub(crate) deadline: Option<Deadline>,
    /// What the caller told the server, as an instant (the request's `grpc-timeout`).
    pub(crate) wire: Option<Instant>,
    /// Whether attempts get a `grpc-timeout` from this layer ([`Wire::Refresh`], and the
    /// request carried one).
    pub(crate) header: bool,
    /// A deadline layer of the same stack, outside, began the call: it refused a call whose
    /// deadline had passed, and put the deadline on the request (the presets).
    pub(crate) inside: bool,
}

impl Bounds {
    /// The last instant at which an attempt can be sent with any time left on the wire.
    pub(crate) fn send_by(&self) -> Option<Instant> {
        match (self.deadline.map(|d| d.instant()), self.wire) {
            (Some(d), Some(w)) => Some(d.min(w)),
            (d, w) => d.or(w),
        }
    }

    /// Writes the attempt's `grpc-timeout` and deadline into `req` and returns when the attempt
    /// must end.
    ///
    /// On the first attempt, a header that already says no more than what is left (an outer
    /// `PropagateDeadline` wrote it a moment ago, or the caller did) is left as it is.
    pub(crate) fn arm<B>(&self, req: &mut Request<B>, first: bool) -> Armed {
        let Some(deadline) = self.deadline else {
            return Armed::Unbounded;
        };
        let at = deadline.instant();
        if !self.header {
            // The deadline alone goes on the request; a layer inside tells the server, or
            // nobody does (the request carried no header).
            if first && self.inside && req.extensions().get::<Deadline>() == Some(&deadline) {
                return Armed::Until(at);
            }
            // Nothing left to tell the server (what the layer inside will say): not sent.
            if Instant::now() >= self.send_by().unwrap_or(at) {
                return Armed::Expired;
            }
            req.extensions_mut().insert(deadline);
            return Armed::Until(at);
        }
        let now = Instant::now();
        // A header that says no time is left (`0n`, or a deadline already passed): not sent.
        if now >= self.send_by().unwrap_or(at) {
            return Armed::Expired;
        }
        if first && self.wire.is_some_and(|w| w <= at) {
            return Armed::Until(at);
        }
        let on_wire = self.wire.map_or(at, |w| w.min(at));
        let Some(encoded) = grpc_timeout::encode(on_wire.saturating_duration_since(now)) else {
            return Armed::Expired;
        };
        req.headers_mut()
            .insert(GRPC_TIMEOUT, encoded.to_header_value());
        req.extensions_mut().insert(deadline);
        Armed::Until(at)
    }
}
