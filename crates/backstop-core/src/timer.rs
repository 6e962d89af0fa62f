//! [`LazySleep`]: a timer created the first time a future must wait for it.
//!
//! Every backstop future that bounds something by an instant (the retry layer's attempt, the
//! deadline layers' calls and bodies, the attempt timeout) keeps one: a call answered on its
//! first poll, the common case, never touches tokio's timer wheel.

use pin_project_lite::pin_project;
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};
use tokio::time::{Instant, Sleep, sleep_until};

pin_project! {
    /// A timer armed on first use: [`poll_until`](Self::poll_until) creates the tokio
    /// [`Sleep`] the first time it is called, then polls that one.
    #[derive(Debug, Default)]
    pub struct LazySleep {
        #[pin]
        sleep: Option<Sleep>,
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
        let mut sleep = self.project().sleep;
        if sleep.is_none() {
            sleep.set(Some(sleep_until(at)));
        }
        sleep.as_pin_mut().expect("armed above").poll(cx)
    }

    /// Arms the timer for `at`, unless it is armed already.
    #[inline]
    pub fn arm(self: Pin<&mut Self>, at: Instant) {
        let mut sleep = self.project().sleep;
        if sleep.is_none() {
            sleep.set(Some(sleep_until(at)));
        }
    }

    /// Polls the timer if it is armed; `Pending` forever otherwise.
    #[inline]
    pub fn poll_armed(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.project().sleep.as_pin_mut() {
            Some(sleep) => sleep.poll(cx),
            None => Poll::Pending,
        }
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
        let mut unarmed = std::pin::pin!(LazySleep::new());
        let polled = std::future::poll_fn(|cx| Poll::Ready(unarmed.as_mut().poll_armed(cx))).await;
        assert!(polled.is_pending());
    }
}
