//! [`LazySleep`]: a timer created the first time a future must wait for it.
//!
//! Every backstop future that bounds something by an instant (the retry layer's attempt, the
//! deadline layers' calls and bodies, the attempt timeout) keeps one: a call answered on its
//! first poll never touches tokio's timer wheel. And one bounded by an instant its enclosing
//! deadline layer already wakes the task for does not arm it at all
//! ([`poll_until_or_covered`](LazySleep::poll_until_or_covered)): a timer costs about 600
//! instructions to register and clear, and nested layers bounded by the same deadline would
//! otherwise each register one per call. A [`Watch`] is the other direction: what a deadline
//! layer learns of the timers armed inside it, so that it need not arm its own.
//!
//! **Concurrency rule.** What a watch hears lives in a thread-local, set only while one poll
//! runs (a guard puts back what it found, panics included) and never shared between threads;
//! a timer reports only to the watch of the poll that polled it with that poll's waker.

use pin_project_lite::pin_project;
use std::{
    cell::Cell,
    future::Future,
    pin::Pin,
    task::{Context, Poll, RawWakerVTable, Waker},
};
use tokio::time::{Instant, Sleep, sleep_until};

pin_project! {
    /// A timer armed on first use: [`poll_until`](Self::poll_until) creates the tokio
    /// [`Sleep`] the first time it is called, then polls that one.
    #[derive(Debug, Default)]
    pub struct LazySleep {
        #[pin]
        sleep: Option<Armed>,
    }
}

pin_project! {
    /// An armed timer: the tokio [`Sleep`], which tells the enclosing [`Watch`] when it goes
    /// away (a `Drop` here rather than on [`LazySleep`], so that a timer never armed costs
    /// nothing more to drop than its `None`).
    #[derive(Debug)]
    struct Armed {
        #[pin]
        sleep: Sleep,
    }

    impl PinnedDrop for Armed {
        fn drop(this: Pin<&mut Self>) {
            // It may be one the enclosing `Watch` heard of.
            let _ = this;
            retract();
        }
    }
}

impl LazySleep {
    /// A timer not armed yet.
    #[inline]
    pub const fn new() -> Self {
        Self { sleep: None }
    }

    /// Whether the timer has been armed.
    #[inline]
    pub fn is_armed(&self) -> bool {
        self.sleep.is_some()
    }

    /// Polls the timer, arming it for `at` if it is not armed yet (once armed, it keeps its
    /// first instant: every caller passes the same one).
    #[inline]
    pub fn poll_until(self: Pin<&mut Self>, cx: &mut Context<'_>, at: Instant) -> Poll<()> {
        self.poll_until_or_covered(cx, at, false)
    }

    /// As [`poll_until`](Self::poll_until), unless `covered`: the task is known to be woken
    /// by `at` or earlier without this timer (an enclosing deadline layer's future polls this
    /// one and wakes its task by then; see `backstop_deadline::woken_by`). A timer not armed
    /// yet is then not armed: the clock is compared with `at` instead, `Ready` once it has
    /// passed. An armed timer is polled as before, covered or not, and while it is pending it
    /// is reported to the enclosing [`Watch`], if any.
    ///
    /// ```
    /// use backstop_core::timer::LazySleep;
    /// use std::{pin::pin, task::{Context, Poll, Waker}, time::Duration};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let mut timer = pin!(LazySleep::new());
    /// let mut cx = Context::from_waker(Waker::noop());
    /// let at = Instant::now() + Duration::from_millis(10);
    /// assert!(timer.as_mut().poll_until_or_covered(&mut cx, at, true).is_pending());
    /// assert!(!timer.is_armed());
    /// tokio::time::advance(Duration::from_millis(10)).await;
    /// assert_eq!(timer.as_mut().poll_until_or_covered(&mut cx, at, true), Poll::Ready(()));
    /// assert!(!timer.is_armed());
    /// # }
    /// ```
    #[inline]
    pub fn poll_until_or_covered(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        at: Instant,
        covered: bool,
    ) -> Poll<()> {
        let mut sleep = self.project().sleep;
        if sleep.is_none() {
            if covered {
                return due(at);
            }
            sleep.set(Some(Armed {
                sleep: sleep_until(at),
            }));
        }
        let sleep = sleep.as_pin_mut().expect("armed above").project().sleep;
        let polled = sleep.deadline();
        match sleep.poll(cx) {
            Poll::Ready(()) => Poll::Ready(()),
            Poll::Pending => {
                report(polled, cx.waker());
                Poll::Pending
            }
        }
    }
}

/// What a bound by `at` answers in place of its timer when another wakes the task by then
/// (see [`LazySleep::poll_until_or_covered`]): `Ready` once the clock has reached `at`.
#[inline]
pub fn due(at: Instant) -> Poll<()> {
    if Instant::now() >= at {
        Poll::Ready(())
    } else {
        Poll::Pending
    }
}

/// Which waker a future was polled with, without keeping it: two are the same when they
/// wake the same task the same way (what [`Waker::will_wake`] compares). A deadline layer's
/// promise to wake its task holds only for futures polled with its own waker: one polled by a
/// nested executor (a `block_on` inside a poll) or with a waker of its own
/// (`FuturesUnordered`) arms its own timer.
#[derive(Debug, Clone, Copy)]
pub struct WakerId {
    data: *const (),
    // A reference (never null): an `Option<WakerId>` is no larger than a `WakerId`.
    vtable: &'static RawWakerVTable,
}

impl WakerId {
    /// The identity of `waker`.
    #[inline]
    pub fn of(waker: &Waker) -> Self {
        Self {
            data: waker.data(),
            vtable: waker.vtable(),
        }
    }
}

impl PartialEq for WakerId {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        // The vtables' addresses, as `Waker::will_wake` compares them.
        self.data == other.data && std::ptr::eq(self.vtable, other.vtable)
    }
}

impl Eq for WakerId {}

/// What the innermost [`Watch`] has heard.
#[derive(Debug, Clone, Copy)]
struct Heard {
    /// The waker of the poll it watches: only timers polled with it count.
    waker: Option<WakerId>,
    /// The earliest armed timer polled pending with that waker.
    earliest: Option<Instant>,
    /// An armed timer was dropped (whichever waker it was polled with): it may be one heard
    /// of, here or in an enclosing watch. Rare (an attempt that ended while its call goes on,
    /// a `select!` branch that lost), so not told apart further.
    dropped: bool,
}

impl Heard {
    const NOTHING: Self = Self {
        waker: None,
        earliest: None,
        dropped: false,
    };

    /// The earliest timer heard of, unless an armed timer was dropped meanwhile.
    #[inline]
    fn earliest(&self) -> Option<Instant> {
        self.earliest.filter(|_| !self.dropped)
    }
}

#[inline]
fn min_opt(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

thread_local! {
    /// What the innermost [`Watch`] has heard since it started; see there.
    static HEARD: Cell<Heard> = const { Cell::new(Heard::NOTHING) };
}

/// Tells the enclosing [`Watch`] that a timer armed for `at` was polled with `waker` and is
/// pending: the task `waker` wakes will be woken by `at`.
#[inline]
fn report(at: Instant, waker: &Waker) {
    let mut heard = HEARD.get();
    if heard.waker == Some(WakerId::of(waker)) && heard.earliest.is_none_or(|e| at < e) {
        heard.earliest = Some(at);
        HEARD.set(heard);
    }
}

/// An armed timer is dropped: it may be one a [`Watch`] heard of.
#[inline]
fn retract() {
    let mut heard = HEARD.get();
    if !heard.dropped {
        heard.dropped = true;
        HEARD.set(heard);
    }
}

/// What a future bounded by an instant learns while it polls the futures inside it: the
/// earliest armed [`LazySleep`] they polled that is still pending and still there, i.e. a time
/// by which the task will be woken anyway. A deadline layer's future that hears of one no later
/// than its own deadline need not arm its own timer for that poll (it compares the clock with
/// its deadline instead, at every poll); one that hears of none arms its own. Either way, after
/// each poll that returns `Pending` the task has a timer registered for no later than the
/// deadline. An armed timer dropped during the watch (an attempt that ended, a branch of a
/// `select!` that lost) makes it hear nothing it can rely on: the enclosing future then arms
/// its own.
///
/// Only timers polled with the watched poll's own waker count (what `select!` and `join!` pass
/// down): one polled by a nested executor or with a waker of its own (`FuturesUnordered`)
/// may wake another task, or this one only through a path this watch cannot see.
///
/// A guard: started before the inner poll, read after it, and when dropped (panics included) it
/// passes what it heard on to the watch enclosing it, whose bound is then covered too. The
/// value is a thread-local set only during one poll, never shared between threads.
///
/// ```
/// use backstop_core::timer::{LazySleep, Watch};
/// use std::{pin::pin, task::{Context, Waker}, time::Duration};
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let mut cx = Context::from_waker(Waker::noop());
/// let at = Instant::now() + Duration::from_millis(10);
/// let mut timer = pin!(LazySleep::new());
/// let watch = Watch::start(Waker::noop());
/// assert!(timer.as_mut().poll_until(&mut cx, at).is_pending());
/// assert_eq!(watch.earliest(), Some(at));
/// # }
/// ```
#[derive(Debug)]
#[must_use = "the watch ends when the guard is dropped"]
pub struct Watch {
    enclosing: Heard,
}

impl Watch {
    /// Starts hearing of the armed timers polled from now on on this thread with `waker`
    /// (the waker of the poll being watched).
    #[inline]
    pub fn start(waker: &Waker) -> Self {
        Self {
            enclosing: HEARD.replace(Heard {
                waker: Some(WakerId::of(waker)),
                ..Heard::NOTHING
            }),
        }
    }

    /// The earliest armed timer polled pending with the watched waker since
    /// [`start`](Self::start) and not dropped since (`None` also when one that may be it was
    /// dropped).
    #[inline]
    pub fn earliest(&self) -> Option<Instant> {
        HEARD.get().earliest()
    }
}

impl Drop for Watch {
    #[inline]
    fn drop(&mut self) {
        let inside = HEARD.get();
        let mut enclosing = self.enclosing;
        // Timers heard of here wake the enclosing watch's task only if polled with its waker;
        // a drop is passed on whatever the waker.
        if inside.waker == enclosing.waker {
            enclosing.earliest = min_opt(enclosing.earliest, inside.earliest);
        }
        enclosing.dropped |= inside.dropped;
        HEARD.set(enclosing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn it_is_armed_on_the_first_poll_and_keeps_its_instant() {
        let mut timer = std::pin::pin!(LazySleep::new());
        assert!(!timer.is_armed());
        let start = Instant::now();
        let first = std::future::poll_fn(|cx| {
            let polled = timer
                .as_mut()
                .poll_until(cx, start + Duration::from_millis(10));
            Poll::Ready(polled)
        })
        .await;
        assert!(first.is_pending() && timer.is_armed());
        // A later instant does not move it.
        std::future::poll_fn(|cx| {
            timer
                .as_mut()
                .poll_until(cx, start + Duration::from_secs(9))
        })
        .await;
        assert_eq!(start.elapsed(), Duration::from_millis(10));
    }

    /// Watches nest: each hears the timers polled inside it, and passes the earliest on to the
    /// one enclosing it when it ends; a fired timer, or one covered and not armed, reports
    /// nothing; a panic inside a watch leaves the enclosing one intact.
    #[tokio::test(start_paused = true)]
    async fn watches_hear_the_earliest_pending_timer_and_pass_it_out() {
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let now = Instant::now();
        let (early, late) = (
            now + Duration::from_millis(5),
            now + Duration::from_millis(9),
        );
        let mut a = std::pin::pin!(LazySleep::new());
        let mut b = std::pin::pin!(LazySleep::new());
        let mut covered = std::pin::pin!(LazySleep::new());
        let outer = Watch::start(waker);
        {
            let inner = Watch::start(waker);
            assert!(a.as_mut().poll_until(&mut cx, late).is_pending());
            assert!(
                covered
                    .as_mut()
                    .poll_until_or_covered(&mut cx, now, true)
                    .is_ready()
            );
            assert_eq!(inner.earliest(), Some(late));
            assert!(b.as_mut().poll_until(&mut cx, early).is_pending());
            assert_eq!(inner.earliest(), Some(early));
        }
        assert_eq!(outer.earliest(), Some(early));
        drop(outer);
        // A new watch hears nothing of what came before it.
        assert_eq!(Watch::start(waker).earliest(), None);

        // A dropped armed timer (even a later one than the earliest heard of): nothing can be
        // relied on, in this watch and the ones enclosing it.
        let now = Instant::now();
        let (early, late) = (
            now + Duration::from_millis(5),
            now + Duration::from_millis(9),
        );
        let mut b = std::pin::pin!(LazySleep::new());
        let mut c = std::pin::pin!(LazySleep::new());
        let outer = Watch::start(waker);
        {
            let inner = Watch::start(waker);
            {
                assert!(b.as_mut().poll_until(&mut cx, early).is_pending());
                assert_eq!(inner.earliest(), Some(early));
                let mut gone = Box::pin(LazySleep::new());
                assert!(gone.as_mut().poll_until(&mut cx, late).is_pending());
                drop(gone);
                assert_eq!(inner.earliest(), None);
            }
            assert!(c.as_mut().poll_until(&mut cx, early).is_pending());
            assert_eq!(inner.earliest(), None);
        }
        assert_eq!(outer.earliest(), None);
        drop(outer);

        let outer = Watch::start(waker);
        assert!(a.as_mut().poll_until(&mut cx, late).is_pending());
        let panicked = std::panic::catch_unwind(|| {
            let _inner = Watch::start(waker);
            panic!("inside a watch");
        });
        assert!(panicked.is_err());
        assert_eq!(outer.earliest(), Some(late));
        tokio::time::advance(Duration::from_millis(9)).await;
        let fired = Watch::start(waker);
        assert!(a.as_mut().poll_until(&mut cx, late).is_ready());
        assert_eq!(fired.earliest(), None);
    }

    /// A waker that only counts its wakes.
    struct Counting(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Counting {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Only timers polled with the watched waker count; one polled with another waker (a
    /// nested executor's) is not heard, here or outside, but its drop still is.
    #[tokio::test(start_paused = true)]
    async fn a_watch_hears_only_timers_polled_with_its_waker() {
        let ours = Waker::noop();
        let theirs = Waker::from(std::sync::Arc::new(Counting(0.into())));
        assert_ne!(WakerId::of(ours), WakerId::of(&theirs));
        assert_eq!(WakerId::of(&theirs), WakerId::of(&theirs.clone()));
        let at = Instant::now() + Duration::from_millis(5);
        let mut foreign = std::pin::pin!(LazySleep::new());
        let watch = Watch::start(ours);
        {
            let _nested = Watch::start(&theirs);
            let mut cx = Context::from_waker(&theirs);
            assert!(foreign.as_mut().poll_until(&mut cx, at).is_pending());
        }
        let mut cx = Context::from_waker(&theirs);
        assert!(foreign.as_mut().poll_until(&mut cx, at).is_pending());
        assert_eq!(watch.earliest(), None);
        drop(watch);

        // A timer the outer watch heard of, dropped inside a nested watch of another waker.
        let mut cx = Context::from_waker(ours);
        let watch = Watch::start(ours);
        let mut heard = Box::pin(LazySleep::new());
        assert!(heard.as_mut().poll_until(&mut cx, at).is_pending());
        assert_eq!(watch.earliest(), Some(at));
        {
            let _nested = Watch::start(&theirs);
            drop(heard);
        }
        assert_eq!(watch.earliest(), None);
    }
}
