//! The response body of the retry layer: the inner body, watched to its end when the outcome
//! is in its trailers.

use crate::client::retry::metrics::ErrorType;
use crate::client::retry::shared::Handle;
use crate::{Classify, Outcome, Retryable};
use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::{
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

pin_project! {
    /// The response body of [`Retry`](crate::client::retry::Retry): the inner body as it is.
    ///
    /// A gRPC response whose headers carry no `grpc-status` is committed (gRPC A6: it is
    /// returned, never retried) but not yet a success: the body then watches for the trailers
    /// and tells the budget at the end of the stream — a success deposits, a failure with a
    /// retryable status withdraws (the A6 throttle). A body that fails, or that ends without
    /// trailers (a protocol error for gRPC), is no success. Dropped before the end, the call
    /// counts as nothing.
    pub struct RetryBody<B, C> {
        #[pin]
        inner: B,
        watch: Option<Arc<Handle<C>>>,
    }
}

impl<B, C> RetryBody<B, C> {
    pub(crate) fn new(inner: B, watch: Option<Arc<Handle<C>>>) -> Self {
        Self { inner, watch }
    }

    /// The inner body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The inner body, mutably.
    pub fn get_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Unwraps the inner body (the outcome is then never recorded).
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: fmt::Debug, C> fmt::Debug for RetryBody<B, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBody")
            .field("inner", &self.inner)
            .field("watching", &self.watch.is_some())
            .finish()
    }
}

/// Tells `outcome` to the metrics and the budget.
pub(crate) fn record<C>(handle: &Handle<C>, outcome: Outcome, error: ErrorType) {
    handle.meter_outcome(outcome, || error);
    let Some(budget) = handle.policy.budget.as_ref() else {
        return;
    };
    match outcome {
        Outcome::Success => budget.record_success(),
        Outcome::Failure { retryable, hint } | Outcome::Throttled { retryable, hint }
            if crate::client::retry::budget::counts_as_failure(retryable, hint) =>
        {
            budget.record_failure();
        }
        _ => {}
    }
    handle.meter_budget();
}

impl<B, C> Body for RetryBody<B, C>
where
    B: Body,
    C: Classify<Response<B>>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        if let Some(handle) = this.watch.take() {
            let missing = Outcome::failure(Retryable::Never);
            match &frame {
                Some(Ok(f)) => match f.trailers_ref() {
                    Some(trailers) => {
                        let outcome = handle.policy.classifier.classify_trailers(trailers);
                        match outcome {
                            Some(outcome) => record(&handle, outcome, ErrorType::Status),
                            None => record(&handle, missing, ErrorType::Transport),
                        }
                    }
                    None if this.inner.is_end_stream() => {
                        record(&handle, missing, ErrorType::Transport);
                    }
                    None => *this.watch = Some(handle),
                },
                Some(Err(_)) => record(
                    &handle,
                    Outcome::failure(Retryable::IfIdempotent),
                    ErrorType::Transport,
                ),
                None => record(&handle, missing, ErrorType::Transport),
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
