//! [`LazySleep`]: a timer created the first time a future must wait for it.
//!
//! Every backstop future that bounds something by an instant (the retry layer's attempt, the
//! deadline layers' calls and bodies, the attempt timeout) keeps one: a call answered on its
//! first poll never touches tokio's timer wheel.
//!
//! **Each layer owns its timer.** A future that bounds what it polls arms its own timer the
//! first time what it polls is pending, and relies on no timer armed by another layer, inside
//! or around it. That is tower's rule (`tower::timeout`), and the only one that survives what
//! user code does between the layers: a call polled once in a handler and then spawned,
//! dropped or moved into a `FuturesUnordered`, a `Buffer` between layers, a nested executor.
//! A tokio timer keeps the waker of its last poll only, so a timer armed by a future that was
//! moved to another task wakes that task, not the one still waiting for the deadline. (An
//! earlier design let nested layers skip their timers when another layer's covered the same
//! instant; it lost the server's deadline as soon as a handler moved a polled call to another
//! task. See docs/ARCHITECTURE.md, "Timers".)
//!
//! **Concurrency rule.** A `LazySleep` belongs to the one future that owns it; it shares
//! nothing.

use pin_project_lite::pin_project;
use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::{Instant, Sleep, sleep_until};

/// How far on [`after`] puts an instant the clock cannot hold: about 30 years, as tokio's own
/// `sleep(Duration::MAX)` does.
const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `at + duration`, saturated: an instant past the clock's range is a far future (about 30
/// years on), never a panic. Every instant computed from a user's duration (a knob, a
/// header) goes through it; `Instant + Duration` panics on overflow.
#[inline]
pub(crate) fn after(at: Instant, duration: Duration) -> Instant {
    at.checked_add(duration)
        .or_else(|| at.checked_add(FAR))
        .unwrap_or(at)
}

pin_project! {
    /// A timer armed on first use: [`poll_until`](Self::poll_until) creates the tokio
    /// [`Sleep`] the first time it is called, then polls that one.
    #[derive(Debug, Default)]
    pub(crate) struct LazySleep {
        #[pin]
        sleep: Option<Sleep>,
    }
}

impl LazySleep {
    /// A timer not armed yet.
    #[inline]
    pub(crate) const fn new() -> Self {
        Self { sleep: None }
    }

    #[cfg(test)]
    /// Whether the timer has been armed.
    #[inline]
    pub(crate) fn is_armed(&self) -> bool {
        self.sleep.is_some()
    }

    /// Polls the timer, arming it for `at` if it is not armed yet (once armed, it keeps its
    /// first instant: every caller passes the same one). A timer not armed yet whose instant
    /// has already passed answers `Ready` without arming.
    #[inline]
    pub(crate) fn poll_until(self: Pin<&mut Self>, cx: &mut Context<'_>, at: Instant) -> Poll<()> {
        let mut sleep = self.project().sleep;
        if sleep.is_none() {
            if Instant::now() >= at {
                return Poll::Ready(());
            }
            sleep.set(Some(sleep_until(at)));
        }
        sleep.as_pin_mut().expect("armed above").poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_instant_past_the_clocks_range_saturates_to_a_far_future() {
        let now = Instant::now();
        assert_eq!(
            after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert_eq!(after(now, Duration::MAX), now + FAR);
    }

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

    #[tokio::test(start_paused = true)]
    async fn an_instant_already_passed_is_ready_without_a_timer() {
        let mut timer = std::pin::pin!(LazySleep::new());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert_eq!(
            timer.as_mut().poll_until(&mut cx, Instant::now()),
            Poll::Ready(())
        );
        assert!(!timer.is_armed());
    }
}
