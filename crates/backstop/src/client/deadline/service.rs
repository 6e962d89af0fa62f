use super::{Named, OutboundConfig, PropagateFuture, future::Meter};
use crate::BoxError;
use crate::deadline::Deadline;
use crate::deadline::head::Head;
use crate::deadline::scope::enter_picked;
use crate::wire::grpc::GRPC_TIMEOUT;
use crate::wire::grpc_timeout;
use http::{Request, Response};
use std::{
    sync::Arc,
    task::{Context, Poll},
};
use tokio::time::Instant;
use tower_service::Service;

/// The service built by [`PropagateDeadlineLayer`](crate::deadline::PropagateDeadlineLayer): sends the
/// remaining time in `grpc-timeout` and bounds the call by it.
#[derive(Debug, Clone)]
pub struct PropagateDeadline<S> {
    inner: S,
    config: OutboundConfig,
    /// The dependency's name and counter, with the `metrics` feature (nothing otherwise: a
    /// clone of the service, made per request by many frameworks, then copies no `Arc`).
    #[cfg(feature = "metrics")]
    name: Arc<Named>,
}

impl<S> PropagateDeadline<S> {
    /// Wraps `inner` with the default configuration of
    /// [`PropagateDeadlineLayer::new`](crate::deadline::PropagateDeadlineLayer::new).
    pub fn new(inner: S) -> Self {
        let layer = crate::deadline::PropagateDeadlineLayer::new();
        Self::from_config(inner, layer.config, layer.name)
    }

    pub(crate) fn from_config(inner: S, config: OutboundConfig, name: Arc<Named>) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = name;
        Self {
            inner,
            config,
            #[cfg(feature = "metrics")]
            name,
        }
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for PropagateDeadline<S>
where
    // Clone: a call refused here gives back the readiness reserved for it (`rt::release`).
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = Response<crate::deadline::DeadlineBody<ResBody>>;
    type Error = BoxError;
    type Future = PropagateFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        // The first layer of a call: what the handler's scope offers goes on the request.
        crate::client::call::Call::begin(&mut req);
        let now = Instant::now();
        let head = Head::read(req.headers());
        let grpc = head.grpc;
        let Some((deadline, remaining)) = self.config.deadline(now, &head, &req) else {
            // No deadline: a `grpc-timeout` the caller put on the request did not parse (a
            // valid one is a deadline). It is not passed on: the stack is the header's one
            // writer, and a server would refuse the call for it.
            if head.malformed {
                req.headers_mut().remove(GRPC_TIMEOUT);
            }
            return PropagateFuture::unbounded(self.inner.call(req), grpc);
        };
        // Three significant digits, rounded down (at most 1 % short): consecutive calls send
        // the same value, so its header value is shared rather than encoded and allocated
        // again, and HPACK can index it. Without the header (another layer writes it, or the
        // server is not to be told), only the duration it would say is needed.
        let to_tell = remaining.saturating_sub(self.config.offset);
        let told = if self.config.send_header {
            grpc_timeout::coarse_header_value(to_tell)
                .map(|(value, told)| (req.headers_mut().insert(GRPC_TIMEOUT, value), told).1)
        } else {
            grpc_timeout::coarse_duration(to_tell)
        };
        let told = match told {
            Some(told) if remaining >= self.config.min_remaining => told,
            _ => {
                crate::rt::release(&mut self.inner);
                return PropagateFuture::expired(grpc, self.meter());
            }
        };
        // What the server was told: once this instant has passed, every failure of the call is
        // the deadline's (a transport timer armed from our header, or the server giving up).
        let wire_deadline = Deadline::after_from(now, told);
        // Layers further in (retries, the attempt bound) read the call's deadline off the
        // request, wherever it is called (behind a `Buffer`, on another task), never from a
        // thread-local this layer sets: in its header when this layer writes one (no
        // allocation), otherwise in an extension.
        if !self.config.send_header {
            // Whatever the caller's header said is no longer what the server may be told.
            if head.timeout.is_some() || head.malformed {
                req.headers_mut().remove(GRPC_TIMEOUT);
            }
            req.extensions_mut().insert(deadline);
        } else if let Some(carried) = req.extensions_mut().get_mut::<Deadline>() {
            // A caller's own (later) extension would tell the layers inside more time than
            // the call has: the picked deadline replaces it, in place.
            *carried = deadline;
        }
        let meter = self.meter();
        // User code inside (a service of its own) sees it as `current()` too.
        let scope = enter_picked(deadline);
        // Built here, so the inner call's future is written into it rather than moved in.
        let future =
            PropagateFuture::bounded(self.inner.call(req), deadline, wire_deadline, grpc, meter);
        drop(scope);
        future
    }
}

impl<S> PropagateDeadline<S> {
    /// What a bounded call's future counts its expiry with (feature `metrics`; otherwise
    /// nothing).
    #[inline(always)]
    fn meter(&self) -> Meter {
        #[cfg(feature = "metrics")]
        return self.name.expired().clone();
        #[cfg(not(feature = "metrics"))]
        Meter
    }
}
