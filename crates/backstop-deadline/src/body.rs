use crate::Deadline;
use backstop_core::__private::timer::LazySleep;
use backstop_core::DeadlineExceeded;
use backstop_core::{BoxError, Rejection, ResponseBody, grpc};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::{
    pin::Pin,
    task::{Context, Poll, ready},
};
use tokio::time::Instant;

pin_project! {
    /// A response body bounded by the request's deadline.
    ///
    /// While the deadline holds, frames pass through untouched (the clock is read at each
    /// frame, so a body that is always ready is cut too). When it passes in the middle of
    /// a streamed body, a gRPC body ends with trailers `grpc-status: 4` (DEADLINE_EXCEEDED), so a
    /// gRPC client sees the right status; any other body ends with a [`DeadlineExceeded`] error,
    /// which makes hyper reset the stream. The timer is only created the first time the body
    /// is not ready, so a body that is complete at once (a unary response) costs no timer and
    /// no allocation; the body is `Unpin` whenever the inner body is.
    #[derive(Debug)]
    pub struct DeadlineBody<B> {
        #[pin]
        body: ResponseBody<B>,
        deadline: Option<Deadline>,
        // Boxed (a `LazySleep` is not `Unpin`): the body stays `Unpin` whenever the inner body
        // is, as hyper and tonic bodies are used. Allocated only the first time the body is
        // not ready.
        sleep: Option<Pin<Box<LazySleep>>>,
        grpc: bool,
        expired: bool,
        // The server side's expiry counter (nothing on the client side).
        meter: crate::inbound::Meter,
    }
}

impl<B> DeadlineBody<B> {
    pub(crate) fn new(body: ResponseBody<B>, deadline: Option<Deadline>, grpc: bool) -> Self {
        Self {
            body,
            deadline,
            sleep: None,
            grpc,
            expired: false,
            meter: Default::default(),
        }
    }

    /// Counts in `meter` a deadline that cuts this body short (the server side).
    pub(crate) fn metered(mut self, meter: crate::inbound::Meter) -> Self {
        self.meter = meter;
        self
    }

    /// Whether the deadline cut this body short.
    pub fn is_expired(&self) -> bool {
        self.expired
    }

    /// The inner body; `None` when this layer answered on its own (a local rejection).
    pub fn get_ref(&self) -> Option<&B> {
        self.body.get_ref()
    }
}

fn deadline_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(2);
    trailers.insert(
        grpc::GRPC_STATUS,
        backstop_core::Code::DeadlineExceeded.header_value(),
    );
    trailers.insert(
        grpc::GRPC_MESSAGE,
        HeaderValue::from_static("deadline exceeded"),
    );
    trailers
}

impl<B> Body for DeadlineBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if *this.expired {
            return Poll::Ready(None);
        }
        // The clock first: a body whose frames are always ready (a stream held back only by
        // its reader) would otherwise never reach its timer, and run past the deadline. Past
        // it, not at it: a response answered at its deadline's instant (the handler is polled
        // before the timer) is read at that instant too.
        let due = this
            .deadline
            .is_some_and(|deadline| deadline.instant() < Instant::now());
        if !due {
            if let Poll::Ready(frame) = this.body.poll_frame(cx) {
                return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
            }
            let Some(deadline) = *this.deadline else {
                return Poll::Pending;
            };
            let sleep = this.sleep.get_or_insert_with(|| Box::pin(LazySleep::new()));
            ready!(sleep.as_mut().poll_until(cx, deadline.instant()));
        }
        *this.expired = true;
        crate::inbound::count_expired(this.meter);
        if *this.grpc {
            Poll::Ready(Some(Ok(Frame::trailers(deadline_trailers()))))
        } else {
            Poll::Ready(Some(Err(DeadlineExceeded::new().into())))
        }
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.expired {
            SizeHint::with_exact(0)
        } else {
            self.body.size_hint()
        }
    }
}

/// The response of a local rejection (the deadline layers' own answer), with its body.
pub(crate) fn local<B>(rejection: Rejection, grpc: bool) -> Response<DeadlineBody<B>> {
    rejection
        .into_response(grpc)
        .map(|body| DeadlineBody::new(body, None, grpc))
}
