//! Across hops: a server whose own retries gave up tells its callers not to retry either.

use crate::wire::grpc;
use crate::wire::grpc::{GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS};
use crate::wire::hint::NO_RETRY;
use http::{HeaderName, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use std::{
    cell::Cell,
    pin::Pin,
    task::{Context, Poll, ready},
};
use tower_layer::Layer;
use tower_service::Service;

/// The mark of the request whose `Pushback` future is being polled on this thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// No `Pushback` future is being polled.
    Outside,
    /// One is, and no retry layer gave up for its request so far.
    Clear,
    /// One is, and a retry layer gave up for its request.
    Exhausted,
}

thread_local! {
    /// Set while a `Pushback` future polls its handler (the previous value put back after,
    /// so scopes nest); the future carries the mark from poll to poll as a `bool`. A thread
    /// local scoped to the poll is what a tokio task-local is, for less: no allocation, two
    /// reads and a write per poll.
    static EXHAUSTED: Cell<Mark> = const { Cell::new(Mark::Outside) };
}

/// Marks the request this task serves as "retries exhausted downstream" (no-op outside a
/// [`PushbackLayer`] scope).
pub(crate) fn mark_exhausted() {
    EXHAUSTED.with(|mark| {
        if mark.get() != Mark::Outside {
            mark.set(Mark::Exhausted);
        }
    });
}

/// Whether a retry layer in this task gave up on a retryable failure while serving the current
/// request (always `false` outside a [`PushbackLayer`]).
pub fn retries_exhausted() -> bool {
    EXHAUSTED.with(|mark| mark.get() == Mark::Exhausted)
}

/// Runs `f` with the request's mark in scope, and returns what it made with the mark after it.
fn in_scope<R>(exhausted: bool, f: impl FnOnce() -> R) -> (R, bool) {
    let inner = if exhausted {
        Mark::Exhausted
    } else {
        Mark::Clear
    };
    // Puts the enclosing scope's mark back, also when `f` panics.
    let _scope = crate::rt::scope::Scope::enter(&EXHAUSTED, inner);
    let made = f();
    (made, retries_exhausted())
}

/// Server side: when a [`RetryLayer`](crate::client::retry::RetryLayer) used by the handler gave up on a
/// retryable failure (attempts, budget, deadline, or a downstream "do not retry"), stamps
/// "do not retry" on the handler's failed response, so callers' retry layers do not retry it
/// again: `grpc-retry-pushback-ms: -1` on a gRPC response (gRPC A6), `backstop-no-retry: 1`
/// ([`NO_RETRY`](crate::wire::hint::NO_RETRY)) on a plain HTTP one, which carries no gRPC
/// header (browsers, curl and proxies ignore the one they do not know).
///
/// Without it, each hop multiplies the attempts: three hops of 3 attempts make 27 on the last
/// one. With it, the failing dependency sees at most `max_attempts` per user request.
///
/// A failed response is a trailers-only gRPC response with a non-zero `grpc-status` (which is
/// how tonic answers an `Err(Status)`), or an HTTP 5xx. The mark is a thread-local set only
/// while the handler's future is being polled: work spawned onto other tasks by the handler
/// does not report into it.
#[derive(Debug, Clone, Copy, Default)]
pub struct PushbackLayer {
    _priv: (),
}

impl PushbackLayer {
    /// The layer.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<S> Layer<S> for PushbackLayer {
    type Service = Pushback<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Pushback { inner }
    }
}

/// The service built by [`PushbackLayer`].
#[derive(Debug, Clone)]
pub struct Pushback<S> {
    inner: S,
}

impl<S> Pushback<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Pushback<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = PushbackFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // A retry layer marks the request when it gives up, which happens while its future is
        // polled, never in `call`: the scope is entered by the future's polls only.
        PushbackFuture {
            future: self.inner.call(req),
            exhausted: false,
        }
    }
}

pin_project! {
    /// The response future of [`Pushback`].
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct PushbackFuture<F> {
        #[pin]
        future: F,
        exhausted: bool,
    }
}

/// Whether the response is a failure, and the header that says "do not retry" in its
/// protocol.
fn failure_header<B>(response: &Response<B>) -> Option<(HeaderName, HeaderValue)> {
    match response.headers().get(GRPC_STATUS) {
        Some(code) => (code.as_bytes() != b"0")
            .then(|| (GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"))),
        // A gRPC response whose status is still to come (in its trailers) is not a failure
        // yet: its HTTP status is 200.
        None if !response.status().is_server_error() => None,
        None if grpc::is_grpc(response.headers()) => {
            Some((GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1")))
        }
        None => Some((NO_RETRY, HeaderValue::from_static("1"))),
    }
}

impl<F, B, E> Future for PushbackFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let future = this.future;
        let (poll, exhausted) = in_scope(*this.exhausted, || future.poll(cx));
        *this.exhausted = exhausted;
        let mut result = ready!(poll);
        if let Ok(response) = &mut result
            && exhausted
            && let Some((name, value)) = failure_header(response)
        {
            response.headers_mut().insert(name, value);
        }
        Poll::Ready(result)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_mark_lives_in_its_scope_only_and_scopes_nest() {
        mark_exhausted();
        assert!(
            !retries_exhausted(),
            "outside any scope, marking does nothing"
        );
        let ((), marked) = in_scope(false, || {
            assert!(!retries_exhausted());
            let ((), inner) = in_scope(false, mark_exhausted);
            assert!(inner, "the inner request was marked");
            assert!(!retries_exhausted(), "the outer one was not");
        });
        assert!(!marked);
        let ((), kept) = in_scope(true, || ());
        assert!(kept, "a mark carried in from an earlier poll stays");
        let caught = std::panic::catch_unwind(|| in_scope(true, || panic!("handler panicked")));
        assert!(caught.is_err());
        assert!(
            !retries_exhausted(),
            "a panic puts the enclosing scope back"
        );
    }
}
