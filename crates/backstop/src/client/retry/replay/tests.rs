//! `ReplayBody`: copies replay the first attempt's bytes exactly, or fail; one owner at a time.

use super::*;
use http_body_util::{BodyExt, Full, channel::Channel};
use proptest::prelude::*;
use std::{
    convert::Infallible,
    sync::atomic::{AtomicUsize, Ordering},
    task::Wake,
};

async fn all(body: ReplayBody<impl Body<Data = Bytes, Error = impl Into<BoxError>>>) -> Vec<u8> {
    body.collect().await.unwrap().to_bytes().to_vec()
}

/// A waker that counts its wakes.
#[derive(Default)]
struct Counter(AtomicUsize);

impl Wake for Counter {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (Arc<Counter>, Waker) {
    let counter = Arc::new(Counter::default());
    (counter.clone(), Waker::from(counter))
}

fn poll<B>(body: &mut ReplayBody<B>, waker: &Waker) -> Poll<Option<Result<Frame<Bytes>, BoxError>>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    Pin::new(body).poll_frame(&mut Context::from_waker(waker))
}

fn data(p: Poll<Option<Result<Frame<Bytes>, BoxError>>>) -> Bytes {
    match p {
        Poll::Ready(Some(Ok(f))) => f.into_data().unwrap(),
        other => panic!(
            "expected data, got {:?}",
            other.map(|o| o.map(|r| r.is_ok()))
        ),
    }
}

fn superseded(p: Poll<Option<Result<Frame<Bytes>, BoxError>>>) -> bool {
    matches!(p, Poll::Ready(Some(Err(e))) if e.is::<BodySuperseded>())
}

#[tokio::test]
async fn a_whole_body_is_replayed_identically() {
    let body = ReplayBody::new(Full::new(Bytes::from_static(b"hello world")), 1024);
    let first = body.replay().unwrap();
    assert_eq!(all(first).await, b"hello world");
    let again = body.replay().unwrap();
    assert_eq!(all(again).await, b"hello world");
}

#[tokio::test]
async fn a_partly_read_body_is_replayed_then_continued() {
    let (mut tx, rx) = Channel::<Bytes, Infallible>::new(4);
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
async fn a_failed_body_says_so_and_cannot_be_replayed() {
    let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(4);
    let body = ReplayBody::new(rx, 1024);
    let mut first = body.replay().unwrap();
    tx.send_data(Bytes::from_static(b"ab")).await.unwrap();
    assert_eq!(
        first.frame().await.unwrap().unwrap().into_data().unwrap(),
        "ab"
    );
    tx.abort(std::io::Error::other("client went away"));
    let error = first.frame().await.unwrap().unwrap_err();
    assert_eq!(error.to_string(), "client went away");
    // The rest is gone: polled again, the copy says why, as a type a caller can match.
    let again = first.frame().await.unwrap().unwrap_err();
    assert!(again.is::<BodyFailedEarlier>(), "{again}");
    assert!(!body.is_replayable());
    assert!(body.replay().is_none());
}

#[tokio::test]
async fn past_the_cap_the_body_is_sent_but_not_replayable() {
    let body = ReplayBody::new(Full::new(Bytes::from(vec![7u8; 100])), 99);
    let first = body.replay().unwrap();
    assert_eq!(all(first).await, vec![7u8; 100]);
    assert!(!body.is_replayable());
    assert!(body.replay().is_none());
}

#[tokio::test]
async fn passthrough_is_never_replayable() {
    let body = ReplayBody::passthrough(Full::new(Bytes::from_static(b"x")));
    assert!(body.replay().is_none());
    assert_eq!(all(body).await, b"x");
    assert!(ReplayBody::<Full<Bytes>>::empty().replay().is_some());
}

/// Defect: the first attempt's copy, still polled by its transport after an early 503,
/// crossed the cap and cleared the buffer while the retry's copy was replaying it, so the
/// retry sent a shorter body. Now the older copy is fenced off the moment the retry's copy
/// exists, and the retry sends exactly the original bytes.
#[tokio::test]
async fn an_older_copy_polled_on_cannot_cut_the_retry_short() {
    let (mut tx, rx) = Channel::<Bytes, Infallible>::new(8);
    let keeper = ReplayBody::new(rx, 10);
    let mut first = keeper.replay().unwrap();
    let (_, waker) = counting();
    tx.send_data(Bytes::from_static(b"aaaa")).await.unwrap();
    tx.send_data(Bytes::from_static(b"bbbb")).await.unwrap();
    assert_eq!(data(poll(&mut first, &waker)), "aaaa");
    assert_eq!(data(poll(&mut first, &waker)), "bbbb");
    // The dependency answers 503 here; the retry layer takes the body over.
    let mut retry = keeper.replay().unwrap();
    assert_eq!(data(poll(&mut retry, &waker)), "aaaa");
    tx.send_data(Bytes::from_static(b"cccc")).await.unwrap();
    tx.send_data(Bytes::from_static(b"dddd")).await.unwrap();
    drop(tx);
    // hyper's connection task polls the first attempt's body again: it is fenced off and
    // reads nothing, so it cannot overflow the buffer the retry is replaying.
    assert!(superseded(poll(&mut first, &waker)));
    assert!(first.is_superseded() && !retry.is_superseded());
    let mut rest = Vec::new();
    while let Poll::Ready(Some(Ok(f))) = poll(&mut retry, &waker) {
        rest.extend_from_slice(&f.into_data().unwrap());
    }
    assert_eq!(rest, b"bbbbccccdddd");
    // The retry crossed the cap: no further copy.
    assert!(keeper.replay().is_none());
}

/// Defect: both copies polled the original body and only the last waker was kept, so the
/// retry's copy was never woken. Now only the owner polls the original body, and a fenced
/// copy that was waiting is woken so its transport ends the stream.
#[tokio::test]
async fn the_owner_is_woken_and_a_fenced_copy_is_woken_once() {
    let (mut tx, rx) = Channel::<Bytes, Infallible>::new(8);
    let keeper = ReplayBody::new(rx, 1024);
    let mut first = keeper.replay().unwrap();
    let (first_wakes, first_waker) = counting();
    let (retry_wakes, retry_waker) = counting();
    assert!(poll(&mut first, &first_waker).is_pending());
    let mut retry = keeper.replay().unwrap();
    assert_eq!(first_wakes.0.load(Ordering::SeqCst), 1, "fenced copy woken");
    assert!(poll(&mut retry, &retry_waker).is_pending());
    // A flow-control wake-up re-polls the first attempt's body: it must not take the
    // original body's waker away from the retry.
    assert!(superseded(poll(&mut first, &first_waker)));
    tx.send_data(Bytes::from_static(b"x")).await.unwrap();
    assert_eq!(
        retry_wakes.0.load(Ordering::SeqCst),
        1,
        "owner woken by data"
    );
    assert_eq!(data(poll(&mut retry, &retry_waker)), "x");
}

#[tokio::test]
async fn three_copies_only_the_newest_reads() {
    let body = ReplayBody::new(Full::new(Bytes::from_static(b"abc")), 16);
    let (_, waker) = counting();
    let mut one = body.replay().unwrap();
    let mut two = body.replay().unwrap();
    let three = body.replay().unwrap();
    assert!(superseded(poll(&mut one, &waker)));
    assert!(superseded(poll(&mut two, &waker)));
    assert!(!two.is_end_stream());
    assert_eq!(all(three).await, b"abc");
}

/// Hedging sends copies side by side: once the whole body is buffered, a newer copy does
/// not fence the older one off, and both send every byte, trailers included.
#[tokio::test]
async fn copies_of_a_complete_body_are_sent_side_by_side() {
    let (mut tx, rx) = Channel::<Bytes, Infallible>::new(8);
    let keeper = ReplayBody::new(rx, 1024);
    let mut first = keeper.replay().unwrap();
    let (_, waker) = counting();
    tx.send_data(Bytes::from_static(b"aaaa")).await.unwrap();
    let mut trailers = HeaderMap::new();
    trailers.insert("x-sum", "1".parse().unwrap());
    tx.send_trailers(trailers.clone()).await.unwrap();
    drop(tx);
    assert_eq!(data(poll(&mut first, &waker)), "aaaa");
    // Not complete until the original body has ended.
    assert!(!keeper.is_complete());
    assert!(matches!(poll(&mut first, &waker), Poll::Ready(Some(Ok(f))) if f.is_trailers()));
    assert!(keeper.is_complete());
    // A fresh copy and the first one, which is past its data but not yet ended.
    let mut hedge = keeper.replay().unwrap();
    assert!(!first.is_superseded() && !hedge.is_superseded());
    assert!(matches!(poll(&mut first, &waker), Poll::Ready(None)));
    let mut third = keeper.replay().unwrap();
    for copy in [&mut hedge, &mut third] {
        assert_eq!(data(poll(copy, &waker)), "aaaa");
        match poll(copy, &waker) {
            Poll::Ready(Some(Ok(f))) => assert_eq!(f.into_trailers().unwrap(), trailers),
            other => panic!("expected trailers, got {other:?}"),
        }
        assert!(matches!(poll(copy, &waker), Poll::Ready(None)));
    }
    assert!(ReplayBody::<Full<Bytes>>::empty().is_complete());
    assert!(!ReplayBody::passthrough(Full::new(Bytes::new())).is_complete());
}

/// A body whose last data frame says it has ended (hyper and h2 then send END_STREAM and
/// never poll it again) is complete at once: a hedge of a one-frame gRPC message over
/// tonic or hyper must not wait for a poll that never comes.
#[test]
fn a_body_that_says_it_has_ended_is_complete_after_its_last_frame() {
    let keeper = ReplayBody::new(Full::new(Bytes::from_static(b"\0\0\0\0\0")), 1024);
    let mut first = keeper.replay().unwrap();
    let (_, waker) = counting();
    assert!(!keeper.is_complete());
    assert_eq!(data(poll(&mut first, &waker)), "\0\0\0\0\0");
    assert!(first.is_end_stream());
    assert!(keeper.is_complete(), "no poll for the end is needed");
    let mut hedge = keeper.replay().unwrap();
    assert!(!first.is_superseded());
    assert_eq!(data(poll(&mut hedge, &waker)), "\0\0\0\0\0");
    assert!(matches!(poll(&mut hedge, &waker), Poll::Ready(None)));
    assert!(matches!(poll(&mut first, &waker), Poll::Ready(None)));
}

/// A hedge waiting for the body is woken by the poll that reads its end (the transport's,
/// on another task), and told at once when the body can never be complete.
#[tokio::test]
async fn a_hedge_waiting_for_the_body_is_woken_when_it_is_complete_or_never_will_be() {
    let (wakes, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    let (mut tx, rx) = Channel::<Bytes, Infallible>::new(4);
    let keeper = ReplayBody::new(rx, 8);
    let mut first = keeper.replay().unwrap();
    let (_, transport) = counting();
    assert!(keeper.poll_complete(&mut cx).is_pending());
    tx.send_data(Bytes::from_static(b"abcd")).await.unwrap();
    assert_eq!(data(poll(&mut first, &transport)), "abcd");
    assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "not complete yet");
    drop(tx);
    assert!(matches!(poll(&mut first, &transport), Poll::Ready(None)));
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    assert_eq!(keeper.poll_complete(&mut cx), Poll::Ready(true));

    // Past the cap: woken, and never complete.
    let (wakes, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    let (mut tx, rx) = Channel::<Bytes, Infallible>::new(4);
    let keeper = ReplayBody::new(rx, 2);
    let mut first = keeper.replay().unwrap();
    assert!(keeper.poll_complete(&mut cx).is_pending());
    tx.send_data(Bytes::from_static(b"abcd")).await.unwrap();
    assert_eq!(data(poll(&mut first, &transport)), "abcd");
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    assert_eq!(keeper.poll_complete(&mut cx), Poll::Ready(false));

    let empty = ReplayBody::<Full<Bytes>>::empty();
    assert_eq!(empty.poll_complete(&mut cx), Poll::Ready(true));
    let passed = ReplayBody::passthrough(Full::new(Bytes::new()));
    assert_eq!(passed.poll_complete(&mut cx), Poll::Ready(false));
}

/// A body that ended past the cap is not complete: its buffer was freed.
#[tokio::test]
async fn a_body_past_the_cap_is_never_complete() {
    let keeper = ReplayBody::new(Full::new(Bytes::from_static(b"0123456789")), 4);
    let first = keeper.replay().unwrap();
    assert_eq!(all(first).await, b"0123456789");
    assert!(!keeper.is_complete() && keeper.replay().is_none());
}

#[tokio::test]
async fn a_failed_body_is_not_replayed() {
    let (mut tx, rx) = Channel::<Bytes, &'static str>::new(4);
    let body = ReplayBody::new(rx, 1024);
    let mut first = body.replay().unwrap();
    tx.send_data(Bytes::from_static(b"ab")).await.unwrap();
    tx.abort("boom");
    let (_, waker) = counting();
    assert_eq!(data(poll(&mut first, &waker)), "ab");
    assert!(matches!(
        poll(&mut first, &waker),
        Poll::Ready(Some(Err(_)))
    ));
    assert!(body.replay().is_none());
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
            let (mut tx, rx) = Channel::<Bytes, Infallible>::new(32);
            for c in &chunks {
                tx.send_data(Bytes::from(c.clone())).await.unwrap();
            }
            drop(tx);
            let keeper = ReplayBody::new(rx, max);
            let mut first = keeper.replay().unwrap();
            let mut got = Vec::new();
            for _ in 0..read_first {
                match first.frame().await {
                    Some(Ok(f)) => got.extend_from_slice(&f.into_data().unwrap()),
                    _ => break,
                }
            }
            match keeper.replay() {
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
