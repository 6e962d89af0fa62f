use super::{AdmissionFuture, Shared};
use crate::deadline::Deadline;
use crate::is_grpc;
use http::{Request, Response};
use std::{
    sync::Arc,
    task::{Context, Poll},
};
use tokio::time::Instant;
use tower_service::Service;

/// The service built by [`AdmissionLayer`](super::AdmissionLayer).
#[derive(Debug, Clone)]
pub struct Admission<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Admission<S> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Admission<S>
where
    // Clone: a refused request gives back the readiness reserved for it (`rt::release`).
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<crate::ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = AdmissionFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let deadline = req.extensions().get::<Deadline>().copied();
        let shared = &self.shared;
        if !shared.measures() && deadline.is_none() {
            return AdmissionFuture::passed(self.inner.call(req));
        }
        let now = Instant::now();
        let route = shared.route(req.uri().path());
        if let Some(deadline) = deadline
            && shared.refuses(route, deadline.remaining_at(now), now)
        {
            refused(shared, route, req.uri().path());
            crate::rt::release(&mut self.inner);
            return AdmissionFuture::refused(is_grpc(req.headers()));
        }
        if !shared.measures() {
            return AdmissionFuture::passed(self.inner.call(req));
        }
        AdmissionFuture::measured(self.inner.call(req), shared.clone(), route, now)
    }
}

#[cold]
#[inline(never)]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn refused(shared: &Shared, route: usize, path: &str) {
    tracing::debug!(
        path,
        "refused on arrival: less time left than the route needs"
    );
    #[cfg(feature = "metrics")]
    shared.count_refusal(route, path);
}
