use crate::{
    ReplayBody,
    body::RetryBody,
    bounds::Armed,
    hedge::HedgesBox,
    shared::Handle,
    state::{RetryState, Verdict},
    stats::GiveUp,
};
use backstop_core::timer::LazySleep;
use backstop_core::{BoxError, Classify, DeadlineExceeded};
use http::{Request, Response};
use pin_project_lite::pin_project;
use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};
use tokio::time::{Instant, Sleep, sleep};
use tower_service::Service;

pin_project! {
    /// The response future of [`Retry`](crate::Retry).
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, B, C>
    where
        S: Service<Request<ReplayBody<B>>>,
    {
        retry: Option<RetryState<S, B, C>>,
        // A call that is never retried keeps its layer's handle only to record its outcome
        // (feature `metrics`; otherwise nothing).
        meter: Meter<C>,
        #[pin]
        state: State<S::Future, S::Response>,
    }
}

#[cfg(feature = "metrics")]
type Meter<C> = Option<Arc<Handle<C>>>;
#[cfg(not(feature = "metrics"))]
type Meter<C> = std::marker::PhantomData<fn() -> C>;

pin_project! {
    /// Where a call is: an attempt in flight (alone or with its hedges), the backoff before
    /// a retry, or the retry waiting for the service to be ready.
    #[project = StateProj]
    pub(crate) enum State<F, T> {
        Calling {
            #[pin]
            future: F,
            // Created the first time the attempt is not ready, so a call answered at once
            // never touches the timer.
            #[pin]
            timer: LazySleep,
            // The request's deadline, if any.
            end: Option<Instant>,
        },
        Expired,
        // The attempts of a hedged request (boxed: a request that is not hedged pays nothing
        // for the space), and the deadline's timer, armed the first time the call waits.
        Hedging {
            hedges: HedgesBox<F, T>,
            #[pin]
            timer: LazySleep,
        },
        BackingOff { #[pin] sleep: Sleep },
        // The backoff is over: the retry goes out once the service is ready, unless the
        // deadline comes first (its timer armed the first time the service is not ready).
        SendingRetry {
            #[pin]
            timer: LazySleep,
        },
        Done,
    }
}

impl<S, B, C> std::fmt::Debug for ResponseFuture<S, B, C>
where
    S: Service<Request<ReplayBody<B>>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("retrying", &self.retry.is_some())
            .field("attempts", &self.retry.as_ref().map(|r| r.attempts))
            .finish()
    }
}

impl<S, B, C> ResponseFuture<S, B, C>
where
    S: Service<Request<ReplayBody<B>>>,
{
    pub(crate) fn once(future: S::Future, handle: &Arc<Handle<C>>) -> Self {
        #[cfg(feature = "metrics")]
        let meter = Some(handle.clone());
        #[cfg(not(feature = "metrics"))]
        let meter = {
            let _ = handle;
            std::marker::PhantomData
        };
        Self {
            retry: None,
            meter,
            state: State::Calling {
                future,
                timer: LazySleep::new(),
                end: None,
            },
        }
    }

    /// A call that may be retried, its first attempt in `state`.
    pub(crate) fn retrying(
        retry: RetryState<S, B, C>,
        state: State<S::Future, S::Response>,
    ) -> Self {
        Self {
            meter: Meter::default(),
            retry: Some(retry),
            state,
        }
    }
}

impl<F, T> State<F, T> {
    /// An attempt armed with its bound (`Armed::Expired`: never sent, `send` is not called).
    pub(crate) fn sent(armed: Armed, send: impl FnOnce() -> F) -> Self {
        match armed {
            Armed::Expired => State::Expired,
            _ => State::Calling {
                future: send(),
                timer: LazySleep::new(),
                end: armed.until(),
            },
        }
    }

    /// A first attempt sent with its hedges to come.
    pub(crate) fn hedging(hedges: HedgesBox<F, T>) -> Self {
        State::Hedging {
            hedges,
            timer: LazySleep::new(),
        }
    }
}

/// The call's result as the layer returns it: its body (or its error, a
/// [`RetryError`](crate::RetryError)) tells the caller how many attempts the call took and why
/// it was not retried; the body watches the trailers when the outcome is still to come (for
/// the budget, and for the metrics).
#[inline(always)]
fn finish<S, B, C, R>(
    retry: Option<&RetryState<S, B, C>>,
    meter: &Meter<C>,
    result: Result<Response<R>, BoxError>,
    watch: Option<Arc<Handle<C>>>,
) -> Result<Response<RetryBody<R, C>>, BoxError>
where
    C: Classify<Response<R>>,
{
    let (attempts, gave_up) = retry.map_or((1, None), |r| (r.attempts, r.gave_up));
    #[cfg(feature = "metrics")]
    let (watch, budget) = match retry.map(|r| &r.shared).or(meter.as_ref()) {
        Some(handle) => meter_end(handle, result.as_ref(), watch),
        None => (watch, true),
    };
    #[cfg(not(feature = "metrics"))]
    let (budget, _) = (true, meter);
    // The error is wrapped out of line: the success path keeps its size.
    result
        .map(|response| response.map(|body| RetryBody::new(body, watch, budget, attempts, gave_up)))
        .map_err(|e| wrap(attempts, gave_up, e))
}

#[cold]
#[inline(never)]
fn wrap(attempts: u32, gave_up: Option<GiveUp>, e: BoxError) -> BoxError {
    Box::new(crate::RetryError::new(attempts, gave_up, e))
}

/// Counts the call's outcome, or, when it is still to come in the trailers, leaves it to the
/// body: the watch to give the body, and whether its trailers also go to the budget.
#[cfg(feature = "metrics")]
fn meter_end<C, R>(
    handle: &Arc<Handle<C>>,
    result: Result<&Response<R>, &BoxError>,
    watch: Option<Arc<Handle<C>>>,
) -> (Option<Arc<Handle<C>>>, bool)
where
    C: Classify<Response<R>>,
{
    let classifier = &handle.policy.classifier;
    if let Ok(response) = result
        && classifier.awaits_trailers(response)
    {
        return match watch {
            Some(watch) => (Some(watch), true),
            None => (Some(handle.clone()), false),
        };
    }
    let outcome =
        classifier.classify(result.map_err(|e| &**e as &(dyn std::error::Error + 'static)));
    handle.meter_outcome(outcome);
    (watch, true)
}

impl<S, B, C, R> Future for ResponseFuture<S, B, C>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<R>>,
    S::Error: Into<BoxError>,
    C: Classify<Response<R>>,
{
    type Output = Result<Response<RetryBody<R, C>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Calling { future, timer, end } => {
                    let result: Result<Response<R>, BoxError> = match future.poll(cx) {
                        Poll::Ready(result) => result.map_err(Into::into),
                        Poll::Pending => {
                            let Some(at) = *end else {
                                return Poll::Pending;
                            };
                            // Its own timer, whatever the layers around it arm.
                            ready!(timer.poll_until(cx, at));
                            Err(DeadlineExceeded::new().into())
                        }
                    };
                    let verdict = match this.retry.as_mut() {
                        Some(retry) => retry.decide(result.as_ref()),
                        None => Verdict::Return,
                    };
                    let watch = match verdict {
                        Verdict::Retry(wait) => {
                            drop(result);
                            this.state.set(State::BackingOff { sleep: sleep(wait) });
                            continue;
                        }
                        Verdict::Return => None,
                        Verdict::ReturnWatched => this.retry.as_ref().map(|r| r.shared.clone()),
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(finish(this.retry.as_ref(), this.meter, result, watch));
                }
                StateProj::Hedging { hedges, timer } => {
                    let retry = this.retry.as_mut().expect("a hedged request");
                    let (result, watch) = ready!(retry.poll_hedges(hedges.get(), timer, cx));
                    // The attempts still in flight are cancelled here.
                    this.state.set(State::Done);
                    return Poll::Ready(finish(this.retry.as_ref(), this.meter, result, watch));
                }
                StateProj::Expired => {
                    this.state.set(State::Done);
                    if let Some(retry) = this.retry.as_mut() {
                        retry.unsent();
                    }
                    let result = Err(DeadlineExceeded::new().into());
                    return Poll::Ready(finish(this.retry.as_ref(), this.meter, result, None));
                }
                StateProj::BackingOff { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(State::SendingRetry {
                        timer: LazySleep::new(),
                    });
                }
                StateProj::SendingRetry { timer } => {
                    let retry = this.retry.as_mut().expect("only retries wait");
                    let ready = match retry.service.poll_ready(cx) {
                        Poll::Ready(ready) => ready,
                        Poll::Pending => {
                            let Some(at) = retry.bounds.deadline.map(|d| d.instant()) else {
                                return Poll::Pending;
                            };
                            // Its own timer: the deadline ends the wait for the service.
                            ready!(timer.poll_until(cx, at));
                            this.state.set(State::Expired);
                            continue;
                        }
                    };
                    if let Err(e) = ready {
                        this.state.set(State::Done);
                        let result = Err(e.into());
                        return Poll::Ready(finish(this.retry.as_ref(), this.meter, result, None));
                    }
                    let mut req = retry
                        .next_request()
                        .expect("the body is taken over when the retry is decided");
                    let armed = retry.bounds.arm(&mut req, false);
                    let service = &mut retry.service;
                    this.state.set(State::sent(armed, || service.call(req)));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}
