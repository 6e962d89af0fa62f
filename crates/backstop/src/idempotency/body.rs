//! The response body of the layer: a whole body it holds (a replay, a problem, an answer it
//! buffered to store), or the handler's own body, after what was already read of it.

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use std::{
    pin::Pin,
    task::{Context, Poll},
};

pin_project_lite::pin_project! {
    /// The body of every response of [`Idempotency`](crate::idempotency::Idempotency): `prefix` (bytes the
    /// layer holds), then the handler's body if it was not read to the end, then an error or
    /// trailers met while reading it.
    pub struct IdempotencyBody<B>
    where
        B: Body,
    {
        prefix: Option<Bytes>,
        #[pin]
        inner: Option<B>,
        error: Option<B::Error>,
        trailers: Option<HeaderMap>,
    }
}

impl<B: Body> std::fmt::Debug for IdempotencyBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyBody")
            .field("prefix", &self.prefix.as_ref().map(Bytes::len))
            .field("streaming", &self.inner.is_some())
            .finish()
    }
}

impl<B: Body> IdempotencyBody<B> {
    /// A body of exactly `bytes`.
    pub(crate) fn full(bytes: Bytes) -> Self {
        Self::parts(bytes, None, None, None)
    }

    /// The handler's body untouched.
    pub(crate) fn inner(inner: B) -> Self {
        Self::parts(Bytes::new(), Some(inner), None, None)
    }

    pub(crate) fn parts(
        prefix: Bytes,
        inner: Option<B>,
        error: Option<B::Error>,
        trailers: Option<HeaderMap>,
    ) -> Self {
        Self {
            prefix: (!prefix.is_empty()).then_some(prefix),
            inner,
            error,
            trailers,
        }
    }
}

impl<B: Body> Body for IdempotencyBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        if let Some(prefix) = this.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        if let Some(inner) = this.inner.as_mut().as_pin_mut() {
            match std::task::ready!(inner.poll_frame(cx)) {
                Some(Ok(frame)) => {
                    return Poll::Ready(Some(Ok(
                        frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))
                    )));
                }
                Some(Err(e)) => {
                    this.inner.set(None);
                    return Poll::Ready(Some(Err(e)));
                }
                None => this.inner.set(None),
            }
        }
        if let Some(e) = this.error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none()
            && self.inner.as_ref().is_none_or(Body::is_end_stream)
            && self.error.is_none()
            && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let prefix = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let mut hint = self
            .inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), B::size_hint);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + prefix);
        }
        hint.set_lower(hint.lower() + prefix);
        hint
    }
}
