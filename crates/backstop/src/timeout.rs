//! The per-attempt timeout that sits inside the breaker, so a timed-out attempt is a failure
//! the breaker counts (a timeout outside it would cancel the call, which counts as nothing).

use backstop_core::{AttemptTimedOut, BoxError};
use pin_project_lite::pin_project;
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};
use tokio::time::{Sleep, sleep};
use tower_layer::Layer;
use tower_service::Service;

/// Bounds each call by `timeout` (none: unbounded), failing it with
/// [`AttemptTimedOut`](backstop_core::AttemptTimedOut).
#[derive(Debug, Clone, Copy)]
pub struct AttemptTimeoutLayer {
    timeout: Option<Duration>,
}

impl AttemptTimeoutLayer {
    /// A layer bounding each call by `timeout`; `None` passes calls through unbounded.
    pub fn new(timeout: Option<Duration>) -> Self {
        Self { timeout }
    }
}

impl<S> Layer<S> for AttemptTimeoutLayer {
    type Service = AttemptTimeout<S>;

    fn layer(&self, inner: S) -> AttemptTimeout<S> {
        AttemptTimeout {
            inner,
            timeout: self.timeout,
        }
    }
}

/// The service of [`AttemptTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct AttemptTimeout<S> {
    inner: S,
    timeout: Option<Duration>,
}

impl<S, R> Service<R> for AttemptTimeout<S>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = AttemptTimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: R) -> Self::Future {
        AttemptTimeoutFuture {
            future: self.inner.call(req),
            timeout: self.timeout,
            sleep: None,
        }
    }
}

pin_project! {
    /// The response future of [`AttemptTimeout`].
    ///
    /// The attempt's time starts when it is first polled (a future does nothing before), and
    /// the timer is only created if the attempt is not answered at once: an attempt that is
    /// ready on its first poll never touches the timer wheel.
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct AttemptTimeoutFuture<F> {
        #[pin]
        future: F,
        timeout: Option<Duration>,
        #[pin]
        sleep: Option<Sleep>,
    }
}

impl<F, T, E> Future for AttemptTimeoutFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(result) = this.future.poll(cx) {
            return Poll::Ready(result.map_err(Into::into));
        }
        if this.sleep.is_none() {
            let Some(timeout) = this.timeout.take() else {
                return Poll::Pending;
            };
            this.sleep.set(Some(sleep(timeout)));
        }
        let sleep = this.sleep.as_pin_mut().expect("armed above");
        ready!(sleep.poll(cx));
        Poll::Ready(Err(Box::new(AttemptTimedOut::new())))
    }
}
