use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::{
    pin::Pin,
    task::{Context, Poll},
};

pin_project! {
    /// The body of a response that is either the inner service's or a local one built by
    /// backstop (see [`Rejection::into_response`](crate::Rejection::into_response)).
    ///
    /// Wrapping rather than boxing keeps the inner body's type, its errors and its size hint.
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Local { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// Wraps the inner service's body.
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// A local body that ends at once.
    pub(crate) fn empty() -> Self {
        Self {
            kind: Kind::Local { data: None },
        }
    }

    /// A local body of one chunk.
    pub(crate) fn full(data: Bytes) -> Self {
        let data = if data.is_empty() { None } else { Some(data) };
        Self {
            kind: Kind::Local { data },
        }
    }

    /// Whether this body was built locally rather than by the inner service.
    pub fn is_local(&self) -> bool {
        matches!(self.kind, Kind::Local { .. })
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Local { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Local { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Local { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl<B> ResponseBody<B> {
    /// The inner body; `None` for a local rejection's body.
    pub fn get_ref(&self) -> Option<&B> {
        match &self.kind {
            Kind::Inner { body } => Some(body),
            Kind::Local { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[tokio::test]
    async fn inner_body_passes_through() {
        let body = ResponseBody::new(Full::new(Bytes::from_static(b"hello")));
        assert!(!body.is_local());
        assert_eq!(body.size_hint().exact(), Some(5));
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"hello");
    }

    #[tokio::test]
    async fn local_bodies_end_after_their_data() {
        let body = ResponseBody::<Full<Bytes>>::full(Bytes::from_static(b"no"));
        assert!(body.is_local());
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(2));
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"no");

        let empty = ResponseBody::<Full<Bytes>>::empty();
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
        assert!(empty.collect().await.unwrap().to_bytes().is_empty());
        assert!(ResponseBody::<Full<Bytes>>::full(Bytes::new()).is_end_stream());
    }
}
