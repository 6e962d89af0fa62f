use super::{AdaptiveThrottle, ThrottleFuture};
use crate::{BoxError, Classify, is_grpc};
use http::{Request, Response};
use std::{
    sync::Arc,
    task::{Context, Poll},
};
use tower_service::Service;

/// What a throttle layer's clones share.
#[derive(Debug)]
pub(crate) struct Shared<C> {
    pub(crate) throttle: Arc<AdaptiveThrottle>,
    /// The layer made `throttle` (of the defaults) rather than being given it: a layer named
    /// from it gets a new one.
    pub(crate) own_throttle: bool,
    /// `None`: the layer is off (every call passes, nothing is counted).
    pub(crate) classifier: Option<C>,
    pub(crate) name: crate::rt::DependencyName,
    #[cfg(feature = "metrics")]
    pub(crate) metrics: std::sync::OnceLock<(metrics::Counter, metrics::Gauge)>,
}

impl<C> Shared<C> {
    /// A call was refused.
    #[inline(never)]
    #[cold]
    pub(crate) fn refused(&self) {
        tracing::debug!(dependency = self.name.get(), "throttled: not sent");
        #[cfg(feature = "metrics")]
        {
            use crate::metrics as names;
            let (counter, _) = self.metrics.get_or_init(|| {
                crate::rt::metrics::describe();
                let dependency = self.name.get().to_owned();
                let gauge = metrics::gauge!(names::THROTTLE_PROBABILITY, "dependency" => dependency.clone());
                // From the first refusal on, the throttle sets it at each recompute.
                gauge.set(self.throttle.probability());
                self.throttle.report_to(&gauge);
                (
                    metrics::counter!(names::THROTTLE_REJECTIONS, "dependency" => dependency),
                    gauge,
                )
            });
            counter.increment(1);
        }
    }
}

/// The service built by [`ThrottleLayer`](super::ThrottleLayer).
#[derive(Debug)]
pub struct Throttle<S, C> {
    inner: S,
    shared: Arc<Shared<C>>,
}

impl<S: Clone, C> Clone for Throttle<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, C> Throttle<S, C> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<C>>) -> Self {
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

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for Throttle<S, C>
where
    // Clone: a refused call gives back the readiness reserved for it (`rt::release`).
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<Response<ResBody>>,
{
    type Response = Response<crate::ResponseBody<ResBody>>;
    type Error = BoxError;
    type Future = ThrottleFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness stays the inner service's: a refusal is decided in `call`, at once.
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        if self.shared.classifier.is_none() {
            return ThrottleFuture::passed(self.inner.call(req));
        }
        let Some(sent) = self.shared.throttle.admit() else {
            self.shared.refused();
            crate::rt::release(&mut self.inner);
            return ThrottleFuture::refused(is_grpc(req.headers()));
        };
        // The deadline the deadline layer outside put on the request (else the current one):
        // what tells a call that ran out of time from one its caller let go of.
        let deadline = req
            .extensions()
            .get::<crate::deadline::Deadline>()
            .copied()
            .or_else(crate::deadline::current)
            .map(|d| d.instant());
        ThrottleFuture::running(self.inner.call(req), self.shared.clone(), sent, deadline)
    }
}
