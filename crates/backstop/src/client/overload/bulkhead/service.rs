use super::{BulkheadFuture, Refusal, Shared, future::Permit, semaphore::Enqueued};
use crate::deadline::{Deadline, current};
use crate::rt::timer;
use crate::{BoxError, is_grpc};
use http::{Request, Response};
use std::{
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::Instant;
use tower_service::Service;

/// The service built by [`BulkheadLayer`](super::BulkheadLayer).
#[derive(Debug, Clone)]
pub struct Bulkhead<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Bulkhead<S> {
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Bulkhead<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = Response<crate::ResponseBody<ResBody>>;
    type Error = BoxError;
    type Future = BulkheadFuture<S, Request<ReqBody>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness stays the inner service's: the permit is taken in `call`, where the
        // request's deadline bounds the wait (module docs, "Readiness").
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        if !shared.on {
            return BulkheadFuture::passed(self.inner.call(req));
        }
        // 1. A free permit. Owned by its guard before `inner.call` runs: a `call` that
        // panics gives it back as it unwinds.
        if shared.permits.try_acquire() {
            let permit = Permit::new(shared.clone());
            return BulkheadFuture::called(self.inner.call(req), permit);
        }
        // 2. The wait's end: the deadline less the hold time, at most `max_wait` from now.
        let now = Instant::now();
        let grpc = is_grpc(req.headers());
        let deadline = req
            .extensions()
            .get::<Deadline>()
            .copied()
            .or_else(current)
            .map(|d| d.instant());
        let capped = timer::after(now, shared.max_wait);
        let (until, why) = match deadline {
            Some(d) => {
                let latest = d
                    .checked_sub(Duration::from_micros(shared.hold_us()))
                    .unwrap_or(now);
                if latest < capped {
                    // Without a hold time to end it sooner, the wait ends at the deadline.
                    let why = if latest == d {
                        Refusal::Expired
                    } else {
                        Refusal::Deadline
                    };
                    (latest, why)
                } else {
                    (capped, Refusal::MaxWait)
                }
            }
            None => (capped, Refusal::MaxWait),
        };
        // 3. Fails fast: no time to wait, or the calls already queued take longer (a refusal
        // before the deadline, even where the wait would have run to it).
        if until <= now || timer::after(now, shared.expected_wait()) > until {
            let why = match why {
                Refusal::Expired if until > now => Refusal::Deadline,
                why => why,
            };
            shared.refused(why);
            return BulkheadFuture::refused(why, grpc);
        }
        // 4. Queued, unless the queue is full.
        match shared.permits.enqueue(shared.max_queue) {
            Enqueued::Acquired => {
                let permit = Permit::new(shared.clone());
                BulkheadFuture::called(self.inner.call(req), permit)
            }
            Enqueued::Full => {
                shared.refused(Refusal::MaxQueue);
                BulkheadFuture::refused(Refusal::MaxQueue, grpc)
            }
            // 5. Waits: the service readied for this call goes with it, a clone stays.
            Enqueued::Queued { waiter } => {
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                BulkheadFuture::waiting(ready, req, waiter, shared.clone(), until, why, grpc)
            }
        }
    }
}
