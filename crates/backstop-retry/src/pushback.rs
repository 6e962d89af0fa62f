//! Across hops: a server whose own retries gave up tells its callers not to retry either.

use backstop_core::grpc::{GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS};
use http::{HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, ready},
};
use tower_layer::Layer;
use tower_service::Service;

tokio::task_local! {
    static EXHAUSTED: Arc<AtomicBool>;
}

/// Marks the request this task serves as "retries exhausted downstream" (no-op outside a
/// [`PushbackLayer`] scope).
pub(crate) fn mark_exhausted() {
    let _ = EXHAUSTED.try_with(|flag| flag.store(true, Ordering::Relaxed));
}

/// Whether a retry layer in this task gave up on a retryable failure while serving the current
/// request (always `false` outside a [`PushbackLayer`]).
pub fn retries_exhausted() -> bool {
    EXHAUSTED
        .try_with(|flag| flag.load(Ordering::Relaxed))
        .unwrap_or(false)
}

/// Server side: when a [`RetryLayer`](crate::RetryLayer) used by the handler gave up on a
/// retryable failure (attempts, budget, deadline, or a downstream "do not retry"), stamps
/// `grpc-retry-pushback-ms: -1` on the handler's failed response, so callers' retry layers do
/// not retry it again.
///
/// Without it, each hop multiplies the attempts: three hops of 3 attempts make 27 on the last
/// one. With it, the failing dependency sees at most `max_attempts` per user request.
///
/// A failed response is a trailers-only gRPC response with a non-zero `grpc-status` (which is
/// how tonic answers an `Err(Status)`), or an HTTP 5xx. The mark is task-local: work spawned
/// onto other tasks by the handler does not report into it.
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
        let flag = Arc::new(AtomicBool::new(false));
        let future = EXHAUSTED.sync_scope(flag.clone(), || self.inner.call(req));
        PushbackFuture { future, flag }
    }
}

pin_project! {
    /// The response future of [`Pushback`].
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct PushbackFuture<F> {
        #[pin]
        future: F,
        flag: Arc<AtomicBool>,
    }
}

fn is_failure<B>(response: &Response<B>) -> bool {
    match response.headers().get(GRPC_STATUS) {
        Some(code) => code.as_bytes() != b"0",
        None => response.status().is_server_error(),
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
        let mut result = ready!(EXHAUSTED.sync_scope(this.flag.clone(), || future.poll(cx)));
        if let Ok(response) = &mut result
            && this.flag.load(Ordering::Relaxed)
            && is_failure(response)
        {
            response
                .headers_mut()
                .insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
        }
        Poll::Ready(result)
    }
}
