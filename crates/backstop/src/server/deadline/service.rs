use super::{InboundConfig, ResponseFuture, future::Meter};
use crate::Rejection;
use crate::deadline::head::Head;
use http::{Request, Response};
use std::task::{Context, Poll};
use tokio::time::Instant;
use tower_service::Service;

/// The service built by [`DeadlineLayer`](crate::deadline::DeadlineLayer): enforces the caller's deadline
/// on a server and exposes it to the handler.
#[derive(Debug, Clone)]
pub struct DeadlineService<S> {
    inner: S,
    config: InboundConfig,
}

impl<S> DeadlineService<S> {
    pub(crate) fn from_config(inner: S, config: InboundConfig) -> Self {
        Self { inner, config }
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for DeadlineService<S>
where
    // Clone: a request rejected on arrival gives back the readiness reserved for it.
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<crate::deadline::DeadlineBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let head = Head::read(req.headers());
        let grpc = head.grpc;
        match self.config.deadline(Instant::now(), &head, req.headers()) {
            Err(rejection) => {
                #[cfg(feature = "metrics")]
                self.config.expired.count(rejection, req.uri().path());
                if rejection == Rejection::MalformedTimeout {
                    tracing::warn!(
                        method = %req.method(),
                        path = req.uri().path(),
                        "malformed grpc-timeout: rejected"
                    );
                } else {
                    tracing::debug!(
                        method = %req.method(),
                        path = req.uri().path(),
                        rejection = ?rejection,
                        "rejected on arrival: no time left"
                    );
                }
                crate::rt::release(&mut self.inner);
                ResponseFuture::rejected(rejection, grpc)
            }
            Ok(None) => ResponseFuture::running(self.inner.call(req), None, grpc, Meter::default()),
            Ok(Some(deadline)) => {
                req.extensions_mut().insert(deadline);
                #[cfg(feature = "metrics")]
                let meter = Some((
                    self.config.expired.clone(),
                    req.uri().path_and_query().cloned(),
                ));
                #[cfg(not(feature = "metrics"))]
                let meter = Meter::default();
                ResponseFuture::running(self.inner.call(req), Some(deadline), grpc, meter)
            }
        }
    }
}
