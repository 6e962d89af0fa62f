use super::judge::{Answer, Judge};
use super::{Refusal, Shared, semaphore::Waiter};
use crate::BulkheadFull;
use crate::rt::timer::LazySleep;
use crate::{BoxError, Rejection, ResponseBody};
use http::Response;
use pin_project_lite::pin_project;
use std::{
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};
use tokio::time::Instant;
use tower_service::Service;

pin_project! {
    /// The response future of [`Bulkhead`](super::Bulkhead): waiting for a permit, or the
    /// inner call holding one. Dropping it gives the permit back, or leaves the queue.
    #[must_use = "futures do nothing unless polled"]
    pub struct BulkheadFuture<S, R, J>
    where
        S: Service<R>,
    {
        #[pin]
        kind: Kind<S, R>,
        // What an answer says of the dependency (the stack's classifier, or the bulkhead's
        // own rule): kept only by an adaptive bulkhead's measured calls, the calls that ask.
        judge: Option<J>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, R>
    where
        S: Service<R>,
    {
        Called {
            #[pin]
            future: S::Future,
            // Given back as soon as the response (or error) arrives; `None` after.
            permit: Option<Permit>,
        },
        // Boxed: the state of the slow path (the service, the request and a timer) would
        // otherwise make every call's future as large, and moved as often.
        Waiting {
            waiting: Pin<Box<Waiting<S, R>>>,
        },
        Refused {
            why: Refusal,
            grpc: bool,
        },
        // The call of an off layer: no permit.
        Passed {
            #[pin]
            future: S::Future,
        },
    }
}

pin_project! {
    /// A call waiting for its permit.
    struct Waiting<S, R> {
        // The service readied for this call, and the call, until the permit comes.
        service: Option<S>,
        req: Option<R>,
        waiter: WaitGuard,
        #[pin]
        sleep: LazySleep,
        until: Instant,
        why: Refusal,
        grpc: bool,
    }
}

/// A held permit: given back when dropped (the call answered, failed or was dropped).
#[derive(Debug)]
pub(crate) struct Permit {
    shared: Arc<Shared>,
    /// When it was taken, if the call is measured (every call of a fixed bulkhead; a sample of
    /// an adaptive one's, see `Adaptive::measures`).
    since: Option<Instant>,
    /// The call's deadline (an adaptive bulkhead's: the share of it an answer took).
    deadline: Option<Instant>,
}

impl Permit {
    /// The guard of a permit just taken: built before the call it covers, so nothing between
    /// taking the permit and the call's end (a `call` that panics included) can keep it.
    pub(crate) fn new(shared: Arc<Shared>, deadline: Option<Instant>) -> Self {
        Self {
            shared,
            since: Some(Instant::now()),
            deadline,
        }
    }

    /// The guard of a permit a call took at once: a fixed bulkhead's measured (its hold
    /// time), an adaptive one's if its limit wants this call's sample (the deadline then read
    /// off the request), else not.
    #[inline]
    pub(crate) fn sampled<B>(shared: Arc<Shared>, req: &http::Request<B>) -> Self {
        let (since, deadline) = match &shared.adaptive {
            None => (Some(Instant::now()), None),
            Some(adaptive) if adaptive.measures() => {
                (Some(Instant::now()), super::service::deadline_of(req))
            }
            Some(_) => (None, None),
        };
        Self {
            shared,
            since,
            deadline,
        }
    }

    /// Whether this permit's answer teaches an adaptive bulkhead (it is measured).
    fn teaches(&self) -> bool {
        self.since.is_some() && self.shared.adaptive.is_some()
    }

    /// The call answered: its hold time is a sample of the mean, unless the answer is a local
    /// refusal made further in (a throttle, an open breaker), which held nothing of the
    /// dependency's: counted, such instant answers would drag the mean down and the bulkhead
    /// would wait where it should refuse at once. An adaptive bulkhead learns from the
    /// dependency's answers that did not fail (its judge says which); an answer that is a
    /// timeout (the attempt's bound or a deadline ended it, here or at a server further on)
    /// says the call used all its time, not how long the dependency takes.
    /// The permit is given back here.
    fn answered(self, answer: Answer) {
        let Some(since) = self.since else {
            return; // Not measured.
        };
        if answer == Answer::Local {
            return;
        }
        let now = Instant::now();
        self.shared
            .record_hold(now.saturating_duration_since(since));
        if answer == Answer::Failed {
            return;
        }
        let budget = self.deadline.map(|d| d.saturating_duration_since(since));
        self.shared
            .learn(since, now, budget, answer == Answer::TimedOut);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.shared.permits.release();
    }
}

/// A queued call's place: leaves the queue when dropped (or gives on a permit granted at that
/// instant), unless it was [`take`](Self::take)n.
#[derive(Debug)]
pub(crate) struct WaitGuard {
    shared: Arc<Shared>,
    waiter: Option<Arc<Waiter>>,
    deadline: Option<Instant>,
}

impl WaitGuard {
    /// Gives up waiting; `Some(permit)` if one was granted meanwhile.
    fn cancel(&mut self) -> Option<Permit> {
        let waiter = self.waiter.take()?;
        self.shared
            .permits
            .cancel(&waiter)
            .then(|| Permit::new(self.shared.clone(), self.deadline))
    }

    /// The permit, granted.
    fn take(&mut self) -> Permit {
        self.waiter = None;
        Permit::new(self.shared.clone(), self.deadline)
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        // A permit granted to a dropped call is given on when the `Permit` drops.
        drop(self.cancel());
    }
}

impl<S: Service<R>, R, J> BulkheadFuture<S, R, J> {
    /// A call holding `permit`; `judge` is kept when the permit's answer teaches an adaptive
    /// bulkhead.
    pub(crate) fn called(future: S::Future, permit: Permit, judge: &J) -> Self
    where
        J: Clone,
    {
        let judge = permit.teaches().then(|| judge.clone());
        Self {
            kind: Kind::Called {
                future,
                permit: Some(permit),
            },
            judge,
        }
    }

    pub(crate) fn waiting(
        service: S,
        req: R,
        waiter: Arc<Waiter>,
        shared: Arc<Shared>,
        (until, why): (Instant, Refusal),
        deadline: Option<Instant>,
        grpc: bool,
    ) -> Self {
        Self {
            kind: Kind::Waiting {
                waiting: Box::pin(Waiting {
                    service: Some(service),
                    req: Some(req),
                    waiter: WaitGuard {
                        shared,
                        waiter: Some(waiter),
                        deadline,
                    },
                    sleep: LazySleep::new(),
                    until,
                    why,
                    grpc,
                }),
            },
            judge: None,
        }
    }

    /// A waiting call's judge: a permit that comes after a wait is measured, so an adaptive
    /// bulkhead's keeps it.
    pub(crate) fn judged_by(mut self, judge: &J, adaptive: bool) -> Self
    where
        J: Clone,
    {
        self.judge = adaptive.then(|| judge.clone());
        self
    }

    pub(crate) fn passed(future: S::Future) -> Self {
        Self {
            kind: Kind::Passed { future },
            judge: None,
        }
    }

    pub(crate) fn refused(why: Refusal, grpc: bool) -> Self {
        Self {
            kind: Kind::Refused { why, grpc },
            judge: None,
        }
    }
}

impl<S: Service<R>, R, J> fmt::Debug for BulkheadFuture<S, R, J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Called { .. } => f.write_str("BulkheadFuture::Called"),
            Kind::Passed { .. } => f.write_str("BulkheadFuture::Passed"),
            Kind::Waiting { waiting } => f
                .debug_struct("BulkheadFuture::Waiting")
                .field("until", &waiting.until)
                .finish_non_exhaustive(),
            Kind::Refused { why, grpc } => f
                .debug_struct("BulkheadFuture::Refused")
                .field("knob", &why.knob())
                .field("grpc", grpc)
                .finish(),
        }
    }
}

impl<S, R, B, J> Future for BulkheadFuture<S, R, J>
where
    S: Service<R, Response = Response<B>>,
    S::Error: Into<BoxError>,
    J: Judge<Response<B>>,
{
    type Output = Result<Response<ResponseBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (mut kind, judge) = (this.kind, this.judge);
        loop {
            let (service, req, permit) = match kind.as_mut().project() {
                KindProj::Called { future, permit } => {
                    let result = ready!(future.poll(cx)).map_err(Into::into);
                    if let Some(permit) = permit.take().filter(|p| p.since.is_some()) {
                        let answer = match (&result, judge.as_ref()) {
                            // A fixed bulkhead asks only whether the answer was local.
                            (Ok(response), None) => Answer::local_or_dependency(response),
                            (Ok(response), Some(judge)) => judge.response(response),
                            (Err(err), None) => Answer::of(Rejection::of(&**err).as_ref()),
                            (Err(err), Some(judge)) => judge.error(&**err),
                        };
                        permit.answered(answer);
                    }
                    return Poll::Ready(result.map(|r| r.map(ResponseBody::new)));
                }
                KindProj::Passed { future } => {
                    return Poll::Ready(match ready!(future.poll(cx)) {
                        Ok(response) => Ok(response.map(ResponseBody::new)),
                        Err(err) => Err(err.into()),
                    });
                }
                KindProj::Refused { why, grpc } => return Poll::Ready(refusal(*why, *grpc)),
                KindProj::Waiting { waiting } => {
                    let this = waiting.as_mut().project();
                    let (service, req, waiter, sleep, until, why, grpc) = (
                        this.service,
                        this.req,
                        this.waiter,
                        this.sleep,
                        this.until,
                        this.why,
                        this.grpc,
                    );
                    let granted = waiter
                        .waiter
                        .as_ref()
                        .is_some_and(|w| waiter.shared.permits.poll_granted(w, cx).is_ready());
                    let permit = if granted {
                        waiter.take()
                    } else {
                        ready!(sleep.poll_until(cx, *until));
                        // The wait is over: refused, unless granted at this very instant.
                        match waiter.cancel() {
                            Some(permit) => permit,
                            None => {
                                waiter.shared.refused(*why);
                                let (why, grpc) = (*why, *grpc);
                                kind.set(Kind::Refused { why, grpc });
                                continue;
                            }
                        }
                    };
                    let service = service.take().expect("polled after the call");
                    let req = req.take().expect("polled after the call");
                    (service, req, permit)
                }
            };
            let mut service = service;
            let future = service.call(req);
            kind.set(Kind::Called {
                future,
                permit: Some(permit),
            });
        }
    }
}

/// The answer of a refused call: nothing was sent.
#[cold]
#[inline(never)]
fn refusal<B>(why: Refusal, grpc: bool) -> Result<Response<ResponseBody<B>>, BoxError> {
    if why == Refusal::Expired {
        // The deadline has passed: the call's answer is the deadline's, whatever layer saw
        // it first.
        return if grpc {
            Ok(Rejection::DeadlineExceeded.into_response(true))
        } else {
            Err(Box::new(crate::DeadlineExceeded::new()))
        };
    }
    if grpc {
        Ok(Rejection::BulkheadFull.into_response(true))
    } else {
        Err(Box::new(BulkheadFull::new(why.knob())))
    }
}
