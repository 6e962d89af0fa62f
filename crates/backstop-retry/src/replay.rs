//! Request bodies that can be sent again without the caller making them `Clone`.

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use std::{
    fmt,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    task::{Context, Poll},
};

/// A request body that records what it sends so a retry can send it again.
///
/// The first attempt reads the original body; every data frame is copied (as a cheap `Bytes`
/// clone) into a buffer shared with later attempts, up to `max_replay_bytes`. A later attempt
/// first replays the buffer, then goes on reading the original body where the earlier attempt
/// left it — so a first attempt that failed before reading the whole body is no problem.
/// Once more than `max_replay_bytes` have been read, buffering stops and the request can no
/// longer be retried ([`ReplayBody::is_replayable`]).
///
/// When retries are off for a request the body is passed through as is: no buffer, no lock.
/// The lock that guards the shared state is taken only on the retry path, never concurrently
/// in practice (attempts follow one another), and never across an `await`.
pub struct ReplayBody<B> {
    inner: Inner<B>,
}

enum Inner<B> {
    Passthrough(Pin<Box<B>>),
    Shared {
        state: Arc<Mutex<State<B>>>,
        /// The next buffered chunk this copy returns.
        pos: usize,
        trailers_sent: bool,
    },
    Empty,
}

struct State<B> {
    body: Option<Pin<Box<B>>>,
    chunks: Vec<Bytes>,
    buffered: usize,
    max: usize,
    /// Data was read past `max` and not kept: the body cannot be replayed.
    overflowed: bool,
    /// The original body failed: it cannot be replayed.
    failed: bool,
    trailers: Option<HeaderMap>,
    ended: bool,
    hint: SizeHint,
}

impl<B: Body> ReplayBody<B> {
    /// A body that is passed through and never replayed.
    pub fn passthrough(body: B) -> Self {
        Self {
            inner: Inner::Passthrough(Box::pin(body)),
        }
    }

    /// A replayable body, buffering at most `max_replay_bytes`.
    pub fn new(body: B, max_replay_bytes: usize) -> Self {
        let hint = body.size_hint();
        Self {
            inner: Inner::Shared {
                state: Arc::new(Mutex::new(State {
                    body: Some(Box::pin(body)),
                    chunks: Vec::new(),
                    buffered: 0,
                    max: max_replay_bytes,
                    overflowed: false,
                    failed: false,
                    trailers: None,
                    ended: false,
                    hint,
                })),
                pos: 0,
                trailers_sent: false,
            },
        }
    }
}

fn lock<B>(state: &Mutex<State<B>>) -> MutexGuard<'_, State<B>> {
    // A panic while polling the body poisons the lock; the state is still consistent.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<B> ReplayBody<B> {
    /// Another copy that starts from the beginning, for the next attempt; `None` when this body
    /// cannot be replayed (passed through, overflowed, or failed).
    pub fn replay(&self) -> Option<Self> {
        match &self.inner {
            Inner::Shared { state, .. } if lock(state).is_replayable() => Some(Self {
                inner: Inner::Shared {
                    state: state.clone(),
                    pos: 0,
                    trailers_sent: false,
                },
            }),
            Inner::Empty => Some(Self {
                inner: Inner::Empty,
            }),
            _ => None,
        }
    }

    /// Whether a copy of this body could still be sent again.
    pub fn is_replayable(&self) -> bool {
        match &self.inner {
            Inner::Shared { state, .. } => lock(state).is_replayable(),
            Inner::Empty => true,
            Inner::Passthrough(_) => false,
        }
    }

    /// An empty body, always replayable.
    pub fn empty() -> Self {
        Self {
            inner: Inner::Empty,
        }
    }

    /// How many bytes are buffered for replay.
    pub fn buffered(&self) -> usize {
        match &self.inner {
            Inner::Shared { state, .. } => lock(state).buffered,
            _ => 0,
        }
    }
}

impl<B> State<B> {
    fn is_replayable(&self) -> bool {
        !self.overflowed && !self.failed
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let (state, pos, trailers_sent) = match &mut this.inner {
            Inner::Passthrough(body) => return body.as_mut().poll_frame(cx),
            Inner::Empty => return Poll::Ready(None),
            Inner::Shared {
                state,
                pos,
                trailers_sent,
            } => (state, pos, trailers_sent),
        };
        let mut state = lock(state);
        if let Some(chunk) = state.chunks.get(*pos) {
            *pos += 1;
            return Poll::Ready(Some(Ok(Frame::data(chunk.clone()))));
        }
        if state.ended {
            if !*trailers_sent && let Some(trailers) = &state.trailers {
                *trailers_sent = true;
                return Poll::Ready(Some(Ok(Frame::trailers(trailers.clone()))));
            }
            return Poll::Ready(None);
        }
        let Some(body) = state.body.as_mut() else {
            return Poll::Ready(None);
        };
        match body.as_mut().poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                state.ended = true;
                state.body = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                state.failed = true;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(data) => {
                        if !state.overflowed && state.buffered + data.len() <= state.max {
                            state.buffered += data.len();
                            state.chunks.push(data.clone());
                            *pos += 1;
                        } else if !state.overflowed {
                            state.overflowed = true;
                            // Nothing can be replayed any more: free the buffer.
                            state.chunks = Vec::new();
                            *pos = 0;
                        }
                        Frame::data(data)
                    }
                    Err(frame) => match frame.into_trailers() {
                        Ok(trailers) => {
                            state.trailers = Some(trailers.clone());
                            state.ended = true;
                            state.body = None;
                            *trailers_sent = true;
                            Frame::trailers(trailers)
                        }
                        // Unknown frame kinds pass through unrecorded.
                        Err(frame) => frame,
                    },
                };
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Passthrough(body) => body.is_end_stream(),
            Inner::Empty => true,
            Inner::Shared {
                state,
                pos,
                trailers_sent,
            } => {
                let state = lock(state);
                let replayed_all = *pos >= state.chunks.len();
                let done = state.ended || state.body.as_ref().is_some_and(|b| b.is_end_stream());
                replayed_all && done && (state.trailers.is_none() || *trailers_sent)
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Passthrough(body) => body.size_hint(),
            Inner::Empty => SizeHint::with_exact(0),
            Inner::Shared { state, .. } => lock(state).hint,
        }
    }
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Passthrough(_) => f.write_str("ReplayBody::Passthrough"),
            Inner::Empty => f.write_str("ReplayBody::Empty"),
            Inner::Shared { state, pos, .. } => {
                let state = lock(state);
                f.debug_struct("ReplayBody")
                    .field("buffered", &state.buffered)
                    .field("pos", pos)
                    .field("replayable", &state.is_replayable())
                    .finish()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, channel::Channel};
    use proptest::prelude::*;

    async fn all(body: ReplayBody<impl Body<Data = Bytes, Error = impl fmt::Debug>>) -> Vec<u8> {
        body.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn a_whole_body_is_replayed_identically() {
        let body = ReplayBody::new(Full::new(Bytes::from_static(b"hello world")), 1024);
        let again = body.replay().unwrap();
        assert_eq!(all(body).await, b"hello world");
        assert_eq!(all(again).await, b"hello world");
    }

    #[tokio::test]
    async fn a_partly_read_body_is_replayed_then_continued() {
        let (mut tx, rx) = Channel::<Bytes, std::convert::Infallible>::new(4);
        let mut first = ReplayBody::new(rx, 1024);
        tx.send_data(Bytes::from_static(b"ab")).await.unwrap();
        assert_eq!(
            first.frame().await.unwrap().unwrap().into_data().unwrap(),
            "ab"
        );
        // The first attempt fails here; the second replays "ab" and reads the rest.
        let second = first.replay().unwrap();
        drop(first);
        tx.send_data(Bytes::from_static(b"cd")).await.unwrap();
        let mut trailers = HeaderMap::new();
        trailers.insert("x-sum", "1".parse().unwrap());
        tx.send_trailers(trailers).await.unwrap();
        drop(tx);
        let collected = second.collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["x-sum"], "1");
        assert_eq!(&collected.to_bytes()[..], b"abcd");
    }

    #[tokio::test]
    async fn past_the_cap_the_body_is_sent_but_not_replayable() {
        let body = ReplayBody::new(Full::new(Bytes::from(vec![7u8; 100])), 99);
        let probe = body.replay().unwrap();
        assert_eq!(all(body).await, vec![7u8; 100]);
        assert!(!probe.is_replayable());
        assert!(probe.replay().is_none());
    }

    #[tokio::test]
    async fn passthrough_is_never_replayable() {
        let body = ReplayBody::passthrough(Full::new(Bytes::from_static(b"x")));
        assert!(body.replay().is_none());
        assert_eq!(all(body).await, b"x");
        assert!(ReplayBody::<Full<Bytes>>::empty().replay().is_some());
    }

    proptest! {
        #[test]
        fn replays_are_byte_identical(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20),
            max in 0usize..3000,
            read_first in 0usize..20,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let total: Vec<u8> = chunks.concat();
                let (mut tx, rx) = Channel::<Bytes, std::convert::Infallible>::new(32);
                for c in &chunks {
                    tx.send_data(Bytes::from(c.clone())).await.unwrap();
                }
                drop(tx);
                let mut first = ReplayBody::new(rx, max);
                let mut got = Vec::new();
                for _ in 0..read_first {
                    match first.frame().await {
                        Some(Ok(f)) => got.extend_from_slice(&f.into_data().unwrap()),
                        _ => break,
                    }
                }
                match first.replay() {
                    Some(second) => {
                        prop_assert!(got.len() <= max);
                        prop_assert_eq!(all(second).await, total);
                    }
                    None => prop_assert!(got.len() > max),
                }
                Ok(())
            })?;
        }
    }
}
