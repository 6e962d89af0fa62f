//! The attempt future: its own timer, and the attempt's time recorded in the model.

use super::shared::{Routed, Shared};
use crate::rt::timer::LazySleep;
use crate::rt::{stripe, timer};
use crate::{AttemptTimedOut, BoxError};
use pin_project_lite::pin_project;
use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};
use tokio::time::Instant;

pin_project! {
    /// The response future of [`AttemptTimeout`](super::AttemptTimeout).
    ///
    /// The attempt's bound is picked at the call and ends from there (the layers inside were
    /// told when); its time, as a sample, starts when it first waits (a future does nothing
    /// before), and the timer is only touched then: an attempt that is ready on its first
    /// poll records nothing and never touches the timer wheel.
    #[must_use = "futures do nothing unless polled"]
    pub struct AttemptTimeoutFuture<F> {
        #[pin]
        pub(super) future: F,
        pub(super) handle: Arc<stripe::Handle<Shared>>,
        // The bound and its end, picked at the call and told to the layers inside (in
        // `grpc-timeout`, or the request's `Deadline`); `None`: no bound.
        pub(super) told: Option<(Duration, Instant)>,
        // When the attempt first waited, its bound, and when that ends; taken when it ends, so
        // one still here when the future is dropped was cancelled.
        pub(super) start: Option<(Instant, Option<Duration>, Option<Instant>)>,
        // Where its duration is recorded, when not the layer's own series (a routed retry
        // layer's, for a layer without a key).
        pub(super) routed: Routed,
        #[pin]
        pub(super) sleep: LazySleep,
    }

    impl<F> PinnedDrop for AttemptTimeoutFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // Dropped while it waited (a hedge that lost, a caller that gave up): censored, it
            // took at least as long as it ran. Left out, the model would see only the winners
            // of hedged calls, read the tail too short and hedge too early.
            if let Some((start, ..)) = this.start.take() {
                let shared: &Shared = this.handle;
                let now = Instant::now();
                shared
                    .model
                    .record(now.saturating_duration_since(start), shared.now_us(now));
            }
        }
    }
}

impl<F> std::fmt::Debug for AttemptTimeoutFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptTimeoutFuture")
            .field("started", &self.start.map(|(at, ..)| at))
            .field("bound", &self.start.and_then(|(_, b, _)| b))
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for AttemptTimeoutFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<http::Response<B>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let shared: &Shared = this.handle;
        if let Poll::Ready(result) = this.future.poll(cx) {
            // Ended: nothing is left for the drop to record.
            let Some((start, ..)) = this.start.take() else {
                return Poll::Ready(result.map_err(Into::into));
            };
            let now = Instant::now();
            shared.meter_duration(now.saturating_duration_since(start), this.routed);
            // A failure once the bound the server and the layers inside were told (in the
            // header, from which tonic arms a timer, or the request's `Deadline`) has run out
            // is this attempt's timeout, whichever side's timer fired first: a transport
            // error, or the server's own DEADLINE_EXCEEDED.
            // So the same situation is always the same failure, retried (or not) and counted
            // for the same reason.
            let expired = match &result {
                Ok(response) => is_deadline_exceeded(response),
                Err(_) => true,
            };
            if !expired || this.told.is_none_or(|(_, end)| now < end) {
                if result.is_ok() {
                    shared
                        .model
                        .record(now.saturating_duration_since(start), shared.now_us(now));
                }
                return Poll::Ready(result.map_err(Into::into));
            }
            if let Some((bound, _)) = *this.told {
                shared.model.record(bound, shared.now_us(now));
            }
            return Poll::Ready(Err(Box::new(AttemptTimedOut::new())));
        }
        let (start, bound, end) = match *this.start {
            Some(started) => started,
            None => {
                let now = Instant::now();
                let (bound, end) = match *this.told {
                    Some((bound, end)) => (Some(bound), Some(end)),
                    None => (None, None),
                };
                *this.start = Some((now, bound, end));
                (now, bound, end)
            }
        };
        let Some(end) = end else {
            return Poll::Pending;
        };
        // Its own timer, whatever the layers around it arm.
        ready!(this.sleep.as_mut().poll_until(cx, end));
        *this.start = None;
        let bound = bound.expect("a timer only with a bound");
        // Censored: it took at least its bound.
        shared
            .model
            .record(bound, shared.now_us(timer::after(start, bound)));
        shared.meter_duration(bound, this.routed);
        Poll::Ready(Err(Box::new(AttemptTimedOut::new())))
    }
}

/// A trailers-only gRPC DEADLINE_EXCEEDED (`grpc-status: 4` in the response headers).
fn is_deadline_exceeded<B>(response: &http::Response<B>) -> bool {
    response
        .headers()
        .get(crate::wire::grpc::GRPC_STATUS)
        .is_some_and(|code| code.as_bytes() == b"4")
}
