use crate::client::breaker::BreakerBody;
use crate::client::breaker::future::ResponseFuture;
use crate::client::breaker::permit::Permit;
use crate::client::breaker::shared::Handles;
use crate::{BoxError, Classify, is_grpc};
use http::{Request, Response};
use std::task::{Context, Poll};
use tower_service::Service;

/// The service built by [`BreakerLayer`](crate::client::breaker::BreakerLayer).
#[derive(Debug)]
pub struct Breaker<S, C> {
    inner: S,
    handles: Handles<C>,
}

impl<S: Clone, C> Clone for Breaker<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            handles: self.handles.clone(),
        }
    }
}

impl<S, C> Breaker<S, C> {
    pub(crate) fn from_handles(inner: S, handles: Handles<C>) -> Self {
        Self { inner, handles }
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

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for Breaker<S, C>
where
    // Clone: a call refused while open gives back the readiness reserved for it.
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<Response<ResBody>> + Clone,
{
    type Response = Response<BreakerBody<ResBody, C>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness stays the inner service's: an open breaker refuses in `call`, at once,
        // so a caller is never parked waiting for the breaker to close.
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let mut handle = self.handles.current();
        // A keyed layer: the key's breaker (the layer's own takes calls with no key, and keys
        // past the bound).
        let by_key;
        if let Some(keyed) = &handle.keyed
            && let Some(h) = keyed.handle(req.method(), req.uri())
        {
            by_key = h;
            handle = &by_key;
        }
        match Permit::admit(handle) {
            Ok(permit) => ResponseFuture::running(self.inner.call(req), permit),
            Err(retry_after) => {
                crate::rt::release(&mut self.inner);
                ResponseFuture::open(retry_after, is_grpc(req.headers()))
            }
        }
    }
}
