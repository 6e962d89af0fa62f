use super::{BulkheadFuture, Refusal, Shared, future::Permit, judge::Judge, semaphore::Enqueued};
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

/// The service built by [`BulkheadLayer`](super::BulkheadLayer). `J` is what judges an answer
/// for an adaptive bulkhead: `()` for a bulkhead built alone (its own rule, in the module
/// docs), the stack's classifier in a client preset.
#[derive(Debug, Clone)]
pub struct Bulkhead<S, J = ()> {
    inner: S,
    shared: Arc<Shared>,
    keyed: Option<Arc<super::keyed::Keyed>>,
    judge: J,
}

impl<S, J> Bulkhead<S, J> {
    pub(crate) fn from_shared(
        inner: S,
        shared: Arc<Shared>,
        keyed: Option<Arc<super::keyed::Keyed>>,
        judge: J,
    ) -> Self {
        Self {
            inner,
            shared,
            keyed,
            judge,
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

impl<S, J, ReqBody, ResBody> Service<Request<ReqBody>> for Bulkhead<S, J>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
    J: Judge<Response<ResBody>> + Clone,
{
    type Response = Response<crate::ResponseBody<ResBody>>;
    type Error = BoxError;
    type Future = BulkheadFuture<S, Request<ReqBody>, J>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness stays the inner service's: the permit is taken in `call`, where the
        // request's deadline bounds the wait (module docs, "Readiness").
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        if !self.shared.on {
            return BulkheadFuture::passed(self.inner.call(req));
        }
        // A keyed layer's call takes its key's permits.
        let keyed = self.keyed.as_ref().map(|keyed| keyed.limit_of(&req));
        let shared = keyed.as_ref().unwrap_or(&self.shared);
        // 1. A free permit. Owned by its guard before `inner.call` runs: a `call` that
        // panics gives it back as it unwinds. An adaptive bulkhead reads the deadline of the
        // calls it measures (the share of it each answer took), a fixed one only of the
        // calls that wait.
        let adaptive = shared.adaptive.as_ref();
        if shared.permits.try_acquire() {
            let permit = Permit::sampled(shared.clone(), &req);
            return BulkheadFuture::called(self.inner.call(req), permit, &self.judge);
        }
        let now = Instant::now();
        if let Some(adaptive) = adaptive {
            // A limit that heard no answer for seconds goes back to the cap: try again.
            if adaptive.relax_if_stale(&shared.permits, now) && shared.permits.try_acquire() {
                let permit = Permit::sampled(shared.clone(), &req);
                return BulkheadFuture::called(self.inner.call(req), permit, &self.judge);
            }
            adaptive.limited();
        }
        let deadline = deadline_of(&req);
        // 2. The wait's end: the deadline less the hold time, at most `max_wait` from now.
        let grpc = is_grpc(req.headers());
        let capped = timer::after(now, shared.max_wait);
        // Every refusal of an adaptive bulkhead is its limit's (its wait bound is no knob of
        // the presets'), but the deadline's own answer.
        let waited_out = match adaptive {
            Some(_) => Refusal::Limit,
            None => Refusal::MaxWait,
        };
        let (until, why) = match deadline {
            Some(d) => {
                let latest = d
                    .checked_sub(Duration::from_micros(shared.hold_us()))
                    .unwrap_or(now);
                if latest < capped {
                    // Without a hold time to end it sooner, the wait ends at the deadline.
                    let why = if latest == d {
                        Refusal::Expired
                    } else if adaptive.is_some() {
                        Refusal::Limit
                    } else {
                        Refusal::Deadline
                    };
                    (latest, why)
                } else {
                    (capped, waited_out)
                }
            }
            None => (capped, waited_out),
        };
        // 3. Fails fast: no time to wait, or the calls already queued take longer (a refusal
        // before the deadline, even where the wait would have run to it).
        // While an adaptive bulkhead's cut is on trial, a call waits as long as its deadline
        // allows: the cut may be undone.
        let trial = adaptive.and_then(|a| a.on_trial());
        if until <= now || (trial.is_none() && timer::after(now, shared.expected_wait()) > until) {
            let why = match why {
                Refusal::Expired if until > now && adaptive.is_some() => Refusal::Limit,
                Refusal::Expired if until > now => Refusal::Deadline,
                why => why,
            };
            shared.refused(why);
            crate::rt::release(&mut self.inner);
            return BulkheadFuture::refused(why, grpc);
        }
        // 4. Queued, unless the queue is full (an adaptive bulkhead's holds at most as many as
        // its limit: a longer queue would only be waited out to the deadline; while a cut is
        // on trial, as many as `max_queue`).
        let max_queue = match (adaptive, trial) {
            (Some(_), Some(before)) => shared.max_queue.min(before),
            (Some(_), None) => shared.max_queue.min(shared.permits.limit()),
            (None, _) => shared.max_queue,
        };
        match shared.permits.enqueue(max_queue) {
            Enqueued::Acquired => {
                let permit = Permit::new(shared.clone(), deadline);
                BulkheadFuture::called(self.inner.call(req), permit, &self.judge)
            }
            Enqueued::Full => {
                // An adaptive bulkhead's queue is as long as its limit: the limit refused it.
                let why = match adaptive {
                    Some(_) if max_queue < shared.max_queue => Refusal::Limit,
                    _ => Refusal::MaxQueue,
                };
                shared.refused(why);
                crate::rt::release(&mut self.inner);
                BulkheadFuture::refused(why, grpc)
            }
            // 5. Waits: the service readied for this call goes with it, a clone stays.
            Enqueued::Queued { waiter } => {
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                let end = (until, why);
                BulkheadFuture::waiting(ready, req, waiter, shared.clone(), end, deadline, grpc)
                    .judged_by(&self.judge, adaptive.is_some())
            }
        }
    }
}

/// The call's deadline: the request's [`Deadline`] extension (an outer deadline layer, the
/// retry layer or the caller put it there), else the handler's [`current`].
pub(super) fn deadline_of<B>(req: &Request<B>) -> Option<Instant> {
    req.extensions()
        .get::<Deadline>()
        .copied()
        .or_else(current)
        .map(|d| d.instant())
}
