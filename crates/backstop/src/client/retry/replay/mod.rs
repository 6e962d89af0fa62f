//! Request bodies that can be sent again without the caller making them `Clone`.
//!
//! The ownership rule that holds when copies overlap, and the concurrency rule of the shared
//! state, are in [`ReplayBody`]'s docs.

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use std::{
    error::Error,
    fmt,
    pin::Pin,
    task::{Context, Poll, Waker},
};

#[cfg(loom)]
use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(loom))]
use std::sync::{Arc, Mutex, MutexGuard};

type BoxError = Box<dyn Error + Send + Sync>;

/// The error of a [`ReplayBody`] copy polled after a newer copy took the original body over
/// (a retry started while the transport was still sending this attempt's body).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BodySuperseded;

impl fmt::Display for BodySuperseded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request body taken over by a newer attempt")
    }
}

impl Error for BodySuperseded {}

/// The error of a [`ReplayBody`] copy whose original body failed while an earlier copy was
/// reading it: the rest of the body cannot be read again, so this copy cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BodyFailedEarlier;

impl fmt::Display for BodyFailedEarlier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request body failed in an earlier attempt")
    }
}

impl Error for BodyFailedEarlier {}

/// A request body that records what it sends so a retry can send it again.
///
/// The first copy to be polled reads the original body; every data frame is kept (as a cheap
/// `Bytes` clone) in a buffer shared with later copies, up to `max_replay_bytes`. A later copy
/// first replays the buffer, then goes on reading the original body where the earlier copy
/// left it — so a first attempt that failed before reading the whole body is no problem. Once
/// more than `max_replay_bytes` have been read, buffering stops and no copy can be made any
/// more ([`ReplayBody::is_replayable`]). Only the newest copy may read (below).
///
/// When retries are off for a request the body is passed through as is: no buffer, no lock.
/// Errors of the original body are passed on boxed; a fenced-off copy fails with
/// [`BodySuperseded`].
///
/// # Ownership: one reader of the original body at a time (the concurrency rule)
///
/// Attempts do not follow one another neatly on a real transport: after an early `503`,
/// hyper's connection task may go on polling the first attempt's body while the retry's body is
/// already being sent. So the copies of one [`ReplayBody`] follow one rule, enforced under the
/// lock of their shared state:
///
/// - **The newest copy owns the original body.** [`ReplayBody::replay`] makes a copy and hands
///   it the ownership at once, before it is ever polled.
/// - **An older copy is fenced off.** Polled after a newer copy exists, it fails with
///   [`BodySuperseded`] and never reads the original body again, so it can neither consume
///   bytes that the newer copy has not replayed yet, nor overflow and clear the buffer under
///   it, nor steal the original body's waker. A transport sending the older copy aborts that
///   stream (an error, never a shorter body that looks complete).
/// - **Every waiting copy is woken.** A copy waiting on the original body when it is fenced
///   off is woken, so its transport learns at once that the stream is over.
/// - **Once the whole body is buffered, no one is fenced off.** When the original body has
///   ended within `max_replay_bytes`, nobody reads it, appends to the buffer or clears it any
///   more: every copy, older or newer, replays the same frozen buffer to its end. This is what
///   lets hedged attempts send one body side by side ([`ReplayBody::is_complete`]); a hedge due
///   before that moment waits for it, woken by the poll that reads the body's end (or crosses
///   `max_replay_bytes`, or fails: then no copy will come), after the lock is let go.
/// - **A copy sends exactly the original bytes, or fails.** It replays the buffered chunks in
///   order, then reads on from where the original body was left. The buffer is only appended
///   to by the owner and only cleared when the owner crosses `max_replay_bytes`, and from then
///   on no new copy can be made ([`ReplayBody::replay`] returns `None`).
///
/// The retry layer takes the ownership for the next attempt at the moment it decides to retry
/// (not after the backoff), and only then: an attempt whose result is returned to the caller
/// keeps its body, so the response it is reading is never cut short.
///
/// The state is behind one `Mutex`, taken for a few instructions per frame and never across
/// an `await`; a body passed through (retries off) or empty takes no lock at all.
pub struct ReplayBody<B> {
    inner: Inner<B>,
}

enum Inner<B> {
    Passthrough(Pin<Box<B>>),
    Shared {
        state: Arc<Mutex<State<B>>>,
        /// This copy's number; it may read the original body while it is `State::owner`.
        id: u64,
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
    /// The copy that may read the original body: the newest one.
    owner: u64,
    /// The number the next copy gets.
    next_id: u64,
    /// The owner's waker while it waits on the original body, to wake it when it is fenced off.
    waiting: Option<Waker>,
    /// The waker of a hedged request waiting for the body to be complete, woken when it is or
    /// can no longer be (see [`ReplayBody::poll_complete`]).
    completion: Option<Waker>,
}

impl<B: Body> ReplayBody<B> {
    /// A body that is passed through and never replayed.
    pub fn passthrough(body: B) -> Self {
        Self {
            inner: Inner::Passthrough(Box::pin(body)),
        }
    }

    /// A replayable body, buffering at most `max_replay_bytes`. This value is the first copy
    /// (and, until [`replay`](Self::replay) is called, the owner of the original body).
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
                    owner: 0,
                    next_id: 1,
                    waiting: None,
                    completion: None,
                })),
                id: 0,
                pos: 0,
                trailers_sent: false,
            },
        }
    }
}

fn lock<B>(state: &Mutex<State<B>>) -> MutexGuard<'_, State<B>> {
    // A panic while polling the body poisons the lock; the state is still consistent (every
    // update is a single assignment after the inner poll returned).
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<B> ReplayBody<B> {
    /// A new copy that starts from the beginning, for the next attempt, and that takes the
    /// original body over from every older copy at once (they fail with [`BodySuperseded`]
    /// from now on; one waiting on the original body is woken). `None` when this body cannot
    /// be replayed (passed through, overflowed, or failed); the older copies then keep going.
    pub fn replay(&self) -> Option<Self> {
        match &self.inner {
            Inner::Shared { state, .. } => {
                let mut guard = lock(state);
                if !guard.is_replayable() {
                    return None;
                }
                let id = guard.next_id;
                guard.next_id += 1;
                guard.owner = id;
                let fenced = guard.waiting.take();
                drop(guard);
                if let Some(waker) = fenced {
                    waker.wake();
                }
                Some(Self {
                    inner: Inner::Shared {
                        state: state.clone(),
                        id,
                        pos: 0,
                        trailers_sent: false,
                    },
                })
            }
            Inner::Empty => Some(Self::empty()),
            Inner::Passthrough(_) => None,
        }
    }

    /// Whether a copy of this body could still be made.
    pub fn is_replayable(&self) -> bool {
        match &self.inner {
            Inner::Shared { state, .. } => lock(state).is_replayable(),
            Inner::Empty => true,
            Inner::Passthrough(_) => false,
        }
    }

    /// Whether the whole body has been read and kept, so copies can be sent side by side
    /// (hedging): a copy made now never fences an older one off, since none of them reads the
    /// original body any more. Always true of an empty body; never of one passed through.
    pub fn is_complete(&self) -> bool {
        match &self.inner {
            Inner::Shared { state, .. } => lock(state).is_complete(),
            Inner::Empty => true,
            Inner::Passthrough(_) => false,
        }
    }

    /// [`is_complete`](Self::is_complete), waiting for it: `Ready(true)` once the whole body
    /// is in the buffer, `Ready(false)` when it never will be (passed through, past
    /// `max_replay_bytes`, or failed), and `Pending` until then, `cx` woken when the copy being
    /// sent reads the body's end or it can no longer be complete. For a hedge due while the
    /// transport is still sending the body (hyper and tonic send it on their connection task).
    pub(crate) fn poll_complete(&self, cx: &mut Context<'_>) -> Poll<bool> {
        match &self.inner {
            Inner::Shared { state, .. } => {
                let mut state = lock(state);
                if state.is_complete() {
                    return Poll::Ready(true);
                }
                if state.is_settled() {
                    return Poll::Ready(false);
                }
                match &state.completion {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => state.completion = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            Inner::Empty => Poll::Ready(true),
            Inner::Passthrough(_) => Poll::Ready(false),
        }
    }

    /// Whether a newer copy has taken the original body over from this one before it was
    /// complete, so polling this copy fails with [`BodySuperseded`].
    pub fn is_superseded(&self) -> bool {
        match &self.inner {
            Inner::Shared { state, id, .. } => {
                let state = lock(state);
                state.owner != *id && !state.is_complete()
            }
            _ => false,
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

    /// The whole body is in the buffer: from now on nobody reads the original body, appends
    /// to the buffer or clears it, so every copy can replay it side by side.
    fn is_complete(&self) -> bool {
        self.ended && self.is_replayable()
    }

    /// Whether the body is as complete as it will ever be: ended, or no longer replayable.
    fn is_settled(&self) -> bool {
        self.ended || !self.is_replayable()
    }
}

impl<B> Body for ReplayBody<B>
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
        let this = self.get_mut();
        let (state, id, pos, trailers_sent) = match &mut this.inner {
            Inner::Passthrough(body) => {
                return body.as_mut().poll_frame(cx).map_err(Into::into);
            }
            Inner::Empty => return Poll::Ready(None),
            Inner::Shared {
                state,
                id,
                pos,
                trailers_sent,
            } => (state, *id, pos, trailers_sent),
        };
        let mut state = lock(state);
        let polled = poll_shared(&mut state, cx, id, pos, trailers_sent);
        // The poll that settled the body wakes a hedge waiting for it, once the lock is let go.
        let completion = if state.is_settled() {
            state.completion.take()
        } else {
            None
        };
        drop(state);
        if let Some(waker) = completion {
            waker.wake();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Passthrough(body) => body.is_end_stream(),
            Inner::Empty => true,
            Inner::Shared {
                state,
                id,
                pos,
                trailers_sent,
            } => {
                let state = lock(state);
                if state.owner != *id && !state.is_complete() {
                    return false;
                }
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

/// One poll of a shared copy, under the lock of the copies' state.
fn poll_shared<B>(
    state: &mut State<B>,
    cx: &mut Context<'_>,
    id: u64,
    pos: &mut usize,
    trailers_sent: &mut bool,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    if state.owner != id && !state.is_complete() {
        return Poll::Ready(Some(Err(BodySuperseded.into())));
    }
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
    if state.failed {
        // The original body failed while an older copy read it; this copy cannot go on.
        return Poll::Ready(Some(Err(BodyFailedEarlier.into())));
    }
    let Some(body) = state.body.as_mut() else {
        return Poll::Ready(None);
    };
    let polled = body.as_mut().poll_frame(cx);
    match polled {
        Poll::Pending => {
            match &state.waiting {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => state.waiting = Some(cx.waker().clone()),
            }
            Poll::Pending
        }
        Poll::Ready(None) => {
            state.ended = true;
            state.body = None;
            state.waiting = None;
            Poll::Ready(None)
        }
        Poll::Ready(Some(Err(e))) => {
            state.failed = true;
            state.body = None;
            state.chunks = Vec::new();
            state.waiting = None;
            Poll::Ready(Some(Err(e.into())))
        }
        Poll::Ready(Some(Ok(frame))) => {
            state.waiting = None;
            let frame = match frame.into_data() {
                Ok(data) => {
                    if !state.overflowed && state.buffered + data.len() <= state.max {
                        state.buffered += data.len();
                        state.chunks.push(data.clone());
                        *pos += 1;
                    } else if !state.overflowed {
                        state.overflowed = true;
                        // No copy can be made any more: free the buffer. This copy is the
                        // owner and has sent every chunk, so it loses nothing.
                        state.chunks = Vec::new();
                        *pos = 0;
                    }
                    // A body that says it has ended is never polled again by hyper or
                    // h2 (they send END_STREAM with this frame): it is complete now.
                    if state.body.as_ref().is_some_and(|b| b.is_end_stream()) {
                        state.ended = true;
                        state.body = None;
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

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Passthrough(_) => f.write_str("ReplayBody::Passthrough"),
            Inner::Empty => f.write_str("ReplayBody::Empty"),
            Inner::Shared { state, id, pos, .. } => {
                let state = lock(state);
                f.debug_struct("ReplayBody")
                    .field("buffered", &state.buffered)
                    .field("pos", pos)
                    .field("owner", &(state.owner == *id))
                    .field("replayable", &state.is_replayable())
                    .finish()
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

/// Loom models of copies polled from different threads: `RUSTFLAGS="--cfg loom" cargo test
/// -p backstop --lib loom` (what `.ci/run` does).
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::thread;
    use std::collections::VecDeque;

    /// A body of ready chunks; no waker is needed.
    struct Chunks(VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    const ORIGINAL: &[u8] = b"aaaabbbbcccc";

    fn chunks() -> Chunks {
        Chunks(ORIGINAL.chunks(4).map(Bytes::copy_from_slice).collect())
    }

    /// Polls a copy to its end: the bytes it produced, and whether it ended cleanly.
    fn drain(mut body: ReplayBody<Chunks>) -> (Vec<u8>, bool) {
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        loop {
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(f))) => out.extend_from_slice(&f.into_data().unwrap()),
                Poll::Ready(Some(Err(e))) => {
                    assert!(e.is::<BodySuperseded>(), "{e}");
                    return (out, false);
                }
                Poll::Ready(None) => return (out, true),
                Poll::Pending => unreachable!("ready chunks"),
            }
        }
    }

    /// The first attempt's copy is polled on by its transport while the retry takes the body
    /// over and sends it: in every interleaving the retry sends exactly the original bytes (or
    /// no retry copy could be made because the first crossed the cap), and the first copy sent
    /// a prefix of them.
    #[test]
    fn a_retry_sends_the_original_bytes_whatever_the_older_copy_does() {
        for max in [8, 64] {
            loom::model(move || {
                let keeper = Arc::new(ReplayBody::new(chunks(), max));
                let first = keeper.replay().unwrap();
                let t = thread::spawn(move || drain(first));
                let retry = keeper.replay();
                let (sent, _) = t.join().unwrap();
                assert!(ORIGINAL.starts_with(&sent), "first sent {sent:?}");
                if let Some(retry) = retry {
                    let (bytes, clean) = drain(retry);
                    assert!(clean);
                    assert_eq!(bytes, ORIGINAL);
                }
            });
        }
    }

    /// Hedging: a copy is made only once the body is complete, while the first copy is still
    /// being sent on another thread. In every interleaving both send exactly the original
    /// bytes and end cleanly: a copy of a complete body fences no one off.
    #[test]
    fn a_hedge_of_a_complete_body_never_cuts_the_first_short() {
        loom::model(|| {
            let keeper = Arc::new(ReplayBody::new(chunks(), 64));
            let first = keeper.replay().unwrap();
            let t = thread::spawn(move || drain(first));
            let hedge = keeper.is_complete().then(|| keeper.replay().unwrap());
            if let Some(hedge) = hedge {
                assert_eq!(drain(hedge), (ORIGINAL.to_vec(), true));
            }
            assert_eq!(t.join().unwrap(), (ORIGINAL.to_vec(), true));
        });
    }

    /// Three copies on three threads, each made while the others run: only complete, exact
    /// bodies end cleanly; every other copy fails with `BodySuperseded` after a prefix.
    #[test]
    fn three_copies_racing_never_mix_bytes() {
        let mut builder = loom::model::Builder::new();
        // Three threads over a dozen lock operations: bounded preemptions keep the run short.
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let keeper = Arc::new(ReplayBody::new(chunks(), 64));
            let first = keeper.replay().unwrap();
            let k = keeper.clone();
            let t1 = thread::spawn(move || drain(first));
            let t2 = thread::spawn(move || k.replay().map(drain));
            let third = keeper.replay().map(drain);
            let results = [Some(t1.join().unwrap()), t2.join().unwrap(), third];
            for (bytes, clean) in results.into_iter().flatten() {
                assert!(ORIGINAL.starts_with(&bytes));
                if clean {
                    assert_eq!(bytes, ORIGINAL);
                }
            }
        });
    }
}
