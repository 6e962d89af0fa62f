use crate::client::retry::body::RetryBody;
use crate::client::retry::bounds::Armed;
use crate::client::retry::hedge::HedgesBox;
use crate::client::retry::metrics::RetryMetrics;
use crate::client::retry::shared::Handle;
use crate::client::retry::state::{Heard, RetryState, Verdict};
use crate::client::retry::stats::GiveUp;
use crate::client::retry::{CallInfo, ReplayBody};
use crate::rt::timer::LazySleep;
use crate::{BoxError, Classify, DeadlineExceeded, Outcome, Rejection};
use http::{Request, Response};
use pin_project_lite::pin_project;
use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};
use tokio::time::{Instant, Sleep, sleep};
use tower_service::Service;

pin_project! {
    /// The response future of [`Retry`](crate::client::retry::Retry).
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, B, C>
    where
        S: Service<Request<ReplayBody<B>>>,
    {
        retry: Option<RetryState<S, B, C>>,
        // A call that is never retried keeps its layer's handle to tell its outcome to the
        // budget (gRPC A6 counts every call) and the metrics, and why it was not retried.
        once: Once<C>,
        #[pin]
        state: State<S::Future, S::Response>,
    }
}

/// What a call sent once (retries off for it) records when it ends.
struct Once<C> {
    /// The layer's handle, when there is something to tell: a budget, the metrics, or a
    /// reason not to retry.
    handle: Option<Arc<Handle<C>>>,
    /// `Some(idempotent)`: the call could have been retried but its body was too long to
    /// keep, so a failure is given up for the first reason of the decision order that holds
    /// ([`GiveUp::NotReplayable`] when nothing else stops it). `None`: retries are off for it
    /// (`max_attempts` ≤ 1) and nothing is given up.
    unreplayable: Option<bool>,
    /// Where the call reports that it gave up, or met our own rejection (see
    /// `client::call`).
    report: Option<Arc<crate::server::pushback::GaveUp>>,
}

impl<C> Once<C> {
    const NONE: Self = Self {
        handle: None,
        unreplayable: None,
        report: None,
    };
}

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
    /// A call sent once; `unreplayable` as in [`Once`]; `end`: the deadline its attempt is
    /// bounded by, where this layer is the call's first.
    pub(crate) fn once(
        future: S::Future,
        handle: &Arc<Handle<C>>,
        unreplayable: Option<bool>,
        report: Option<Arc<crate::server::pushback::GaveUp>>,
        end: Option<Instant>,
    ) -> Self {
        let tells = RetryMetrics::ON
            || handle.policy.budget.is_some()
            || unreplayable.is_some()
            || report.is_some();
        Self {
            retry: None,
            once: Once {
                handle: tells.then(|| handle.clone()),
                unreplayable,
                report,
            },
            state: State::Calling {
                future,
                timer: LazySleep::new(),
                end,
            },
        }
    }

    /// A call sent once whose deadline passed before it was sent: answered at once, no
    /// attempt taken.
    pub(crate) fn unsent() -> Self {
        Self {
            retry: None,
            once: Once::NONE,
            state: State::Expired,
        }
    }

    /// A call that may be retried, its first attempt in `state`.
    pub(crate) fn retrying(
        retry: RetryState<S, B, C>,
        state: State<S::Future, S::Response>,
    ) -> Self {
        Self {
            once: Once::NONE,
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

/// The call's result as the layer returns it: its [`CallInfo`] extension (or its error, a
/// [`RetryError`](crate::client::retry::RetryError)) tells the caller how many attempts the call took and why
/// it was not retried; the body watches the trailers when the outcome is still to come (for
/// the budget, and for the metrics). `heard`: the result as the retry path heard it when it
/// decided (`None` for a call sent once, or for an error no attempt answered).
#[inline(always)]
fn finish<S, B, C, R>(
    retry: Option<&RetryState<S, B, C>>,
    once: &Once<C>,
    result: Result<Response<R>, BoxError>,
    heard: Option<Heard>,
) -> Result<Response<RetryBody<R, C>>, BoxError>
where
    C: Classify<Response<R>>,
{
    let (attempts, gave_up, watch) = match retry {
        // The budget heard of every attempt when it was decided.
        Some(r) => {
            if RetryMetrics::ON && r.grpc {
                r.shared.meter_call(
                    r.template.path(),
                    // A call whose first attempt was never sent took none: no retries.
                    r.attempts.saturating_sub(1 + r.hedges),
                    r.hedges,
                    r.delay,
                );
            }
            (
                r.attempts,
                r.gave_up,
                meter_end(&r.shared, result.as_ref(), heard),
            )
        }
        None => match &once.handle {
            Some(handle) => {
                let (watch, gave_up, rejected) =
                    once_end(handle, once.unreplayable, result.as_ref());
                // As the retry path: a give-up that spends the retries, or our own rejection,
                // tells callers upstream not to retry either.
                if let Some(report) = &once.report
                    && (rejected || gave_up.is_some_and(GiveUp::exhausts_retries))
                {
                    report.mark();
                }
                (1, gave_up, watch)
            }
            None => (1, None, None),
        },
    };
    // The error is wrapped out of line: the success path keeps its size.
    match result {
        Ok(mut response) => {
            // Nothing to tell of a call whose one attempt answered (the common case keeps its
            // allocation-free path; `CallInfo`'s docs state the rule).
            if attempts != 1
                || gave_up.is_some()
                || response.extensions().get::<Rejection>().is_some()
            {
                tell(&mut response, attempts, gave_up);
            }
            Ok(response.map(|body| RetryBody::new(body, watch)))
        }
        Err(e) => Err(wrap(attempts, gave_up, e)),
    }
}

/// The end of a call sent once: its outcome goes to the budget and the metrics as any
/// call's (or, still to come in the trailers, to its body), and a failure of a call whose
/// body could not be kept (`unreplayable`: `Some(idempotent)`) is a give-up, counted and
/// reported as the retry path would.
#[cold]
#[inline(never)]
fn once_end<C, R>(
    handle: &Arc<Handle<C>>,
    unreplayable: Option<bool>,
    result: Result<&Response<R>, &BoxError>,
) -> (Option<Arc<Handle<C>>>, Option<GiveUp>, bool)
where
    C: Classify<Response<R>>,
{
    let classifier = &handle.policy.classifier;
    let outcome = match result {
        Ok(response) => match classifier.classify_head(response) {
            Some(outcome) => outcome,
            // The body records the outcome, in the budget too.
            None => return (Some(handle.clone()), None, false),
        },
        Err(e) => classifier.classify(Err(&**e)),
    };
    crate::client::retry::body::record(
        handle,
        outcome,
        crate::client::retry::metrics::ErrorType::of(result),
    );
    let gave_up = match (outcome, unreplayable) {
        (
            Outcome::Failure { retryable, hint } | Outcome::Throttled { retryable, hint },
            Some(idempotent),
        ) => {
            // The retry path's decision order, with attempts left and nothing to replay.
            crate::client::retry::state::refusal(retryable, hint, true, || idempotent, false)
        }
        _ => None,
    };
    if let Some(why) = gave_up {
        handle.ledger.stats.give_up(why);
        handle.meter_give_up(why);
        tracing::debug!(
            dependency = handle.ledger.name.get(),
            reason = why.as_str(),
            "not retrying"
        );
    }
    (None, gave_up, outcome == Outcome::Rejected)
}

#[cold]
#[inline(never)]
fn tell<R>(response: &mut Response<R>, attempts: u32, gave_up: Option<GiveUp>) {
    let info = CallInfo::new(attempts, gave_up);
    // A failed gRPC call answered trailers-only becomes a `tonic::Status`, which keeps the
    // headers as its metadata but not the extensions: it is told there too.
    if crate::is_grpc(response.headers()) {
        info.write_failure_headers(response.headers_mut());
    }
    response.extensions_mut().insert(info);
}

#[cold]
#[inline(never)]
fn wrap(attempts: u32, gave_up: Option<GiveUp>, e: BoxError) -> BoxError {
    Box::new(crate::client::retry::RetryError::new(attempts, gave_up, e))
}

/// Counts the call's outcome in the metrics from what the decision heard, or, when it is still
/// to come in the trailers, leaves it to the body (for the budget too): the watch to give the
/// body. A result no decision heard (an error no attempt answered) is classified here.
#[inline(always)]
fn meter_end<C, R>(
    handle: &Arc<Handle<C>>,
    result: Result<&Response<R>, &BoxError>,
    heard: Option<Heard>,
) -> Option<Arc<Handle<C>>>
where
    C: Classify<Response<R>>,
{
    match heard {
        Some(Heard { watched: true, .. }) => Some(handle.clone()),
        Some(Heard { outcome, .. }) => {
            handle.meter_outcome(outcome, || {
                crate::client::retry::metrics::ErrorType::of(result)
            });
            None
        }
        None => {
            if RetryMetrics::ON {
                let outcome = handle
                    .policy
                    .classifier
                    .classify(result.map_err(|e| &**e as &(dyn std::error::Error + 'static)));
                handle.meter_outcome(outcome, || {
                    crate::client::retry::metrics::ErrorType::of(result)
                });
            }
            None
        }
    }
}

impl<S, B, C, R> Future for ResponseFuture<S, B, C>
where
    // Clone: a hedge that is not sent gives back the readiness it reserved.
    S: Service<Request<ReplayBody<B>>, Response = Response<R>> + Clone,
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
                    let heard = match this.retry.as_mut().map(|r| r.decide(result.as_ref())) {
                        Some(Verdict::Retry(wait)) => {
                            drop(result);
                            this.state.set(State::BackingOff { sleep: sleep(wait) });
                            continue;
                        }
                        Some(Verdict::Return(heard)) => Some(heard),
                        None => None,
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(finish(this.retry.as_ref(), this.once, result, heard));
                }
                StateProj::Hedging { hedges, timer } => {
                    let retry = this.retry.as_mut().expect("a hedged request");
                    let (result, heard) = ready!(retry.poll_hedges(hedges.get(), timer, cx));
                    // The attempts still in flight are cancelled here.
                    this.state.set(State::Done);
                    return Poll::Ready(finish(this.retry.as_ref(), this.once, result, heard));
                }
                StateProj::Expired => {
                    this.state.set(State::Done);
                    let Some(retry) = this.retry.as_mut() else {
                        // A call sent once, never sent: no attempt to count.
                        return Poll::Ready(Err(wrap(0, None, DeadlineExceeded::new().into())));
                    };
                    retry.unsent();
                    let result = Err(DeadlineExceeded::new().into());
                    return Poll::Ready(finish(this.retry.as_ref(), this.once, result, None));
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
                        // Never sent: it does not count, and its budget token goes back.
                        retry.unsent();
                        this.state.set(State::Done);
                        let result = Err(e.into());
                        return Poll::Ready(finish(this.retry.as_ref(), this.once, result, None));
                    }
                    let mut req = retry
                        .next_request()
                        .expect("the body is taken over when the retry is decided");
                    let armed = retry.bounds.arm(&mut req, false);
                    if armed != Armed::Expired {
                        retry.retry_sent();
                    }
                    if retry.is_last() || retry.timeouts_final {
                        // No retry follows it (or its timeout): a bound inside may give it the
                        // whole deadline.
                        req.extensions_mut().insert(crate::FinalAttempt);
                    }
                    let service = &mut retry.service;
                    this.state.set(State::sent(armed, || service.call(req)));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}
