use crate::client::breaker::permit::Permit;
use crate::{Classify, Outcome, ResponseBody, Retryable};
use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll, ready},
};

pin_project! {
    /// The response body of [`Breaker`](crate::client::breaker::Breaker): the inner body, or the local body of
    /// a gRPC UNAVAILABLE answer while the breaker is open.
    ///
    /// When the outcome of a call is in its trailers (a gRPC response whose headers carry no
    /// `grpc-status`), the body holds the call's permit and records the outcome at the end of
    /// the stream: from the trailers, or a failure if the body fails or ends without
    /// trailers. Dropped before the end, the call counts as nothing.
    pub struct BreakerBody<B, C> {
        #[pin]
        inner: ResponseBody<B>,
        watch: Option<Permit<C>>,
    }
}

impl<B, C> BreakerBody<B, C> {
    pub(crate) fn new(body: B) -> Self {
        Self {
            inner: ResponseBody::new(body),
            watch: None,
        }
    }

    pub(crate) fn local(body: ResponseBody<B>) -> Self {
        Self {
            inner: body,
            watch: None,
        }
    }

    /// The inner body, with the permit that waits for its trailers.
    pub(crate) fn watching(body: B, permit: Permit<C>) -> Self {
        Self {
            inner: ResponseBody::new(body),
            watch: Some(permit),
        }
    }

    /// Whether this body was built by the breaker (an UNAVAILABLE answer) rather than by the
    /// inner service.
    pub fn is_local(&self) -> bool {
        self.inner.is_local()
    }
}

impl<B: fmt::Debug, C> fmt::Debug for BreakerBody<B, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerBody")
            .field("inner", &self.inner)
            .field("watching", &self.watch.is_some())
            .finish()
    }
}

impl<B, C> Body for BreakerBody<B, C>
where
    B: Body<Data = Bytes>,
    C: Classify<Response<B>>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        if let Some(permit) = this.watch.take() {
            // The status was due in the trailers: a stream that ends without them is a
            // protocol error (gRPC clients report INTERNAL), never a success.
            let missing = Outcome::failure(Retryable::Never);
            match &frame {
                Some(Ok(f)) => match f.trailers_ref() {
                    Some(trailers) => {
                        let outcome = permit
                            .classifier()
                            .classify_trailers(trailers)
                            .unwrap_or(missing);
                        permit.finish(outcome);
                    }
                    None if this.inner.is_end_stream() => permit.finish(missing),
                    None => *this.watch = Some(permit),
                },
                Some(Err(_)) => permit.finish(Outcome::failure(Retryable::IfIdempotent)),
                None => permit.finish(missing),
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
