//! The attempt service: picks the bound at the call and writes the attempt's `grpc-timeout`
//! where it is this layer's to write.

use super::{
    AttemptBound, AttemptTimeoutFuture,
    shared::{Room, Shared},
};
use crate::BoxError;
use crate::rt::timer::LazySleep;
use crate::rt::{stripe, timer};
use http::Request;
use std::{
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::Instant;
use tower_service::Service;

/// The service of [`AttemptTimeoutLayer`](super::AttemptTimeoutLayer).
#[derive(Debug, Clone)]
pub struct AttemptTimeout<S> {
    pub(super) inner: S,
    pub(super) handles: stripe::Handles<Shared>,
    /// A model per key: the request's key's, when it has one in the table.
    pub(super) keyed: Option<std::sync::Arc<super::keyed::Keyed>>,
    /// `Some(offset)`: this layer writes every attempt's `grpc-timeout` (its outer deadline
    /// layer does not); `None`: it only shortens a header already on the request.
    pub(super) writes: Option<Duration>,
    /// The least a retry waits before it is sent ([`retry_wait`](super::AttemptTimeoutLayer::retry_wait)).
    pub(super) retry_wait: Duration,
}

impl<S, B, RB> Service<Request<B>> for AttemptTimeout<S>
where
    S: Service<Request<B>, Response = http::Response<RB>>,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<RB>;
    type Error = BoxError;
    type Future = AttemptTimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let handle = match &self.keyed {
            None => self.handles.current().clone(),
            Some(keyed) => match keyed.entry(req.method(), req.uri()) {
                Some(entry) => entry.handles.current().clone(),
                None => self.handles.current().clone(),
            },
        };
        let told = pick_bound(&handle, self.writes, self.retry_wait, &mut req);
        // The layers inside (the transport, a layer of yours that writes a header of its
        // own, `SemconvLayer`) read when the attempt ends off its `Deadline`.
        if let Some((_, end)) = told {
            carry_end(&mut req, end);
        }
        #[cfg(feature = "metrics")]
        let routed = req
            .extensions()
            .get::<crate::rt::metrics::AttemptDuration>()
            .cloned();
        #[cfg(not(feature = "metrics"))]
        let routed = super::shared::Routed::default();
        AttemptTimeoutFuture {
            future: self.inner.call(req),
            handle,
            told,
            start: None,
            routed,
            sleep: LazySleep::new(),
        }
    }
}

/// Puts the attempt's `end` on the request as its [`Deadline`](crate::deadline::Deadline) extension
/// when it comes before the deadline the request carries (or it carries none): for the
/// layers inside, the attempt's end is the deadline.
#[inline]
fn carry_end<B>(req: &mut Request<B>, end: Instant) {
    match req.extensions_mut().get_mut::<crate::deadline::Deadline>() {
        Some(carried) if carried.instant() <= end => {}
        Some(carried) => *carried = crate::deadline::Deadline::at(end),
        None => {
            req.extensions_mut()
                .insert(crate::deadline::Deadline::at(end));
        }
    }
}

/// Picks the attempt's bound and when it ends (the attempt's timer ends then too), reading
/// the request once, and writes the attempt's `grpc-timeout` where it is this layer's to
/// write; `None`: no bound.
///
/// - The deadline the request carries, read only where it is needed (to write the header, or
///   to cap an adaptive bound): the earlier of its `Deadline` extension (an outer
///   `PropagateDeadline` that leaves the header to this layer, or the retry layer) and what
///   its `grpc-timeout` says is left. A layer that writes every attempt's header (a
///   preset's) finds none to read: the stack that made it so took a caller's header off the
///   request in its deadline layer, outside, and the retry layer between writes none.
/// - `writes` is `Some(offset)` (the client presets, decided when the stack is built: their
///   deadline layer writes no header): with a deadline on the request, this layer is the one
///   writer of every attempt's header, the shorter of its bound and the deadline less
///   `offset`.
/// - Otherwise, when the request already tells the server how long it has (an outer
///   `PropagateDeadline` or the retry layer wrote it) and the attempt's bound is shorter, the
///   header is rewritten to the bound: the server gives up when this attempt will.
#[inline(always)]
fn pick_bound<B>(
    shared: &Shared,
    writes: Option<Duration>,
    retry_wait: Duration,
    req: &mut Request<B>,
) -> Option<(Duration, Instant)> {
    use crate::wire::grpc::GRPC_TIMEOUT;
    use crate::wire::grpc_timeout;
    if matches!(shared.bound, AttemptBound::None) && writes.is_none() {
        return None;
    }
    // What the request's header says is left; a writer reads none.
    let left = match writes {
        Some(_) => None,
        None => req
            .headers()
            .get(GRPC_TIMEOUT)
            .and_then(|v| grpc_timeout::decode_header(v).ok()),
    };
    let now = Instant::now();
    let deadline = if writes.is_some() || shared.capped_by_deadline() {
        let carried = req
            .extensions()
            .get::<crate::deadline::Deadline>()
            .map(|d| d.instant());
        // The earlier of the two: neither may say more time than the other allows.
        match (carried, left.and_then(|left| now.checked_add(left))) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    } else {
        None
    };
    // The instant the server is to be told, when this layer is the header's writer.
    let owed = writes
        .zip(deadline)
        .map(|(offset, at)| at.checked_sub(offset).unwrap_or(at));
    // The last attempt gets the whole deadline: its share was kept for a retry.
    let bound = shared.bound_at(now, deadline, Room::of(req, retry_wait));
    let picked = bound.map(|bound| (bound, timer::after(now, bound)));
    // What the server is told, where this layer tells it: the bound when it ends first, else
    // (as the writer) what is left until the deadline less the offset.
    let told = match (owed, bound) {
        (Some(at), Some(bound)) if now.checked_add(bound).is_some_and(|end| end < at) => bound,
        (Some(at), _) => at.saturating_duration_since(now),
        (None, Some(bound)) if left.is_some_and(|left| bound < left) => bound,
        // What is told is already no longer than the bound.
        (None, _) => return picked,
    };
    // A bound changes at most every 100 ms (a fixed one never): the header value is shared
    // with the last calls that sent the same one. It says the bound rounded down to three
    // significant digits (at most 1 % less): the server gives up no later than this attempt.
    match grpc_timeout::coarse_header_value(told) {
        Some((value, _)) => {
            req.headers_mut().insert(GRPC_TIMEOUT, value);
        }
        // Nothing left to tell (the deadline layer refuses to send with nothing left, so only
        // a clock that went past it in between, or an offset longer than what is left, gets
        // here): the header says the least it can.
        None if owed.is_some() => {
            let least = http::HeaderValue::from_static("1n");
            req.headers_mut().insert(GRPC_TIMEOUT, least);
        }
        None => {}
    }
    picked
}
