use crate::DeadlineExceeded;
use crate::deadline::Deadline;
use crate::rt::timer::LazySleep;
use crate::wire::grpc;
use crate::{BoxError, Rejection, ResponseBody};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::{
    collections::VecDeque,
    pin::Pin,
    task::{Context, Poll, ready},
};
use tokio::time::Instant;

/// How many frames past its deadline a body without an exact size may have ready to its end
/// and still be delivered whole: a unary answer (a message, then trailers) fits; a stream
/// whose frames are always ready does not, and is cut.
const LATE_FRAMES: usize = 4;

type Polled = Result<Frame<Bytes>, BoxError>;

pin_project! {
    /// A response body bounded by the request's deadline, by the rule of the
    /// [`deadline`](crate::deadline#response-bodies) module's docs.
    #[derive(Debug)]
    pub struct DeadlineBody<B> {
        #[pin]
        body: ResponseBody<B>,
        deadline: Option<Deadline>,
        // Boxed (a `LazySleep` is not `Unpin`): the body stays `Unpin` whenever the inner body
        // is, as hyper and tonic bodies are used. Allocated only the first time the body is
        // not ready.
        sleep: Option<Pin<Box<LazySleep>>>,
        // The rest of an unsized body found complete past its deadline, delivered from here.
        rest: Option<VecDeque<Polled>>,
        grpc: bool,
        expired: bool,
        // The server side's expiry counter (nothing on the client side).
        meter: crate::deadline::meter::Meter,
    }
}

impl<B> DeadlineBody<B> {
    pub(crate) fn new(body: ResponseBody<B>, deadline: Option<Deadline>, grpc: bool) -> Self {
        Self {
            body,
            deadline,
            sleep: None,
            rest: None,
            grpc,
            expired: false,
            meter: Default::default(),
        }
    }

    /// Counts in `meter` a deadline that cuts this body short (the server side).
    pub(crate) fn metered(mut self, meter: crate::deadline::meter::Meter) -> Self {
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
        crate::Code::DeadlineExceeded.header_value(),
    );
    trailers.insert(
        grpc::GRPC_MESSAGE,
        HeaderValue::from_static("deadline exceeded"),
    );
    trailers
}

/// Reads `body` past its deadline: `Some` with what to deliver when it is complete, `None`
/// when it is still streaming and must be cut.
fn read_late<B>(
    mut body: Pin<&mut ResponseBody<B>>,
    cx: &mut Context<'_>,
    rest: &mut Option<VecDeque<Polled>>,
) -> Option<Option<Polled>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let frame = |f: Result<Frame<Bytes>, B::Error>| f.map_err(Into::into);
    // Sized: bounded, so its ready frames cannot run on forever.
    if body.size_hint().exact().is_some() {
        return match body.poll_frame(cx) {
            Poll::Ready(polled) => Some(polled.map(frame)),
            Poll::Pending => None,
        };
    }
    // Unsized: whole only if its end is ready within a few frames.
    let mut frames = VecDeque::new();
    while frames.len() < LATE_FRAMES {
        match body.as_mut().poll_frame(cx) {
            Poll::Pending => return None,
            Poll::Ready(None) => break,
            Poll::Ready(Some(Err(e))) => {
                // Its own failure ends it: passed on as it came.
                frames.push_back(Err(e.into()));
                break;
            }
            Poll::Ready(Some(Ok(f))) => {
                // Trailers end a body (http-body), whatever `is_end_stream` says.
                let last = f.is_trailers();
                frames.push_back(Ok(f));
                if last || body.is_end_stream() {
                    break;
                }
            }
        }
    }
    let ended = |frames: &VecDeque<Polled>| {
        frames
            .back()
            .is_some_and(|f| f.as_ref().is_err() || f.as_ref().is_ok_and(Frame::is_trailers))
    };
    if frames.len() == LATE_FRAMES && !ended(&frames) && !body.is_end_stream() {
        // Its end may be ready without saying so (`is_end_stream` defaults to false): one
        // more poll tells, and anything but the end means it is still streaming.
        match body.as_mut().poll_frame(cx) {
            Poll::Ready(None) => {}
            _ => return None,
        }
    }
    let first = frames.pop_front();
    *rest = Some(frames);
    Some(first)
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
        if let Some(rest) = this.rest {
            return Poll::Ready(rest.pop_front());
        }
        // The clock first: a body whose frames are always ready (a stream held back only by
        // its reader) would otherwise never reach its timer, and run past the deadline. Past
        // it, not at it: a response answered at its deadline's instant (the handler is polled
        // before the timer) is read at that instant too.
        let late = this
            .deadline
            .is_some_and(|deadline| deadline.instant() < Instant::now());
        if late {
            if let Some(frame) = read_late(this.body, cx, this.rest) {
                return Poll::Ready(frame);
            }
        } else {
            if let Poll::Ready(frame) = this.body.poll_frame(cx) {
                return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
            }
            let Some(deadline) = *this.deadline else {
                return Poll::Pending;
            };
            let sleep = this.sleep.get_or_insert_with(|| Box::pin(LazySleep::new()));
            // Fired: the body was still waiting at its deadline.
            ready!(sleep.as_mut().poll_until(cx, deadline.instant()));
        }
        *this.expired = true;
        crate::deadline::meter::count_expired(this.meter);
        if *this.grpc {
            Poll::Ready(Some(Ok(Frame::trailers(deadline_trailers()))))
        } else {
            Poll::Ready(Some(Err(DeadlineExceeded::new().into())))
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.rest {
            Some(rest) => rest.is_empty(),
            None => self.expired || self.body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.rest {
            Some(rest) => {
                let data = rest.iter().filter_map(|f| f.as_ref().ok()?.data_ref());
                SizeHint::with_exact(data.map(|d| d.len() as u64).sum())
            }
            None if self.expired => SizeHint::with_exact(0),
            None => self.body.size_hint(),
        }
    }
}

/// The response of a local rejection (the deadline layers' own answer), with its body.
pub(crate) fn local<B>(rejection: Rejection, grpc: bool) -> Response<DeadlineBody<B>> {
    rejection
        .into_response(grpc)
        .map(|body| DeadlineBody::new(body, None, grpc))
}
