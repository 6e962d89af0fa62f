use crate::{
    ReplayBody,
    backoff::{BackoffState, Rng},
    body::RetryBody,
    bounds::{Armed, Bounds},
    hedge::HedgesBox,
    layer::Handle,
    metrics::AttemptKind,
    pushback::mark_exhausted,
    stats::GiveUp,
    template::Template,
};
use backstop_core::timer::LazySleep;
use backstop_core::{
    BoxError, Classify, DeadlineExceeded, Outcome, Retryable, ServerHint,
    grpc::GRPC_PREVIOUS_RPC_ATTEMPTS, is_grpc,
};
use http::{HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
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

pub(crate) struct RetryState<S, B, C> {
    pub(crate) shared: Arc<Handle<C>>,
    pub(crate) service: S,
    pub(crate) template: Template,
    pub(crate) body: ReplayBody<B>,
    /// The next attempt's copy of the body, taken over when the retry was decided.
    next: Option<ReplayBody<B>>,
    pub(crate) bounds: Bounds,
    /// Attempts sent so far, the first included.
    pub(crate) attempts: u32,
    /// Why the result returned was not retried, when it was a candidate.
    pub(crate) gave_up: Option<GiveUp>,
    /// This request's overrides of the policy.
    pub(crate) overrides: crate::RetryOverrides,
    /// The backoff since it last started over (a gRPC pushback resets it, per A6).
    backoff: BackoffState,
    rng: Option<Rng>,
    number: u64,
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
        // for the space).
        Hedging { hedges: HedgesBox<F, T> },
        BackingOff { #[pin] sleep: Sleep },
        // The backoff is over: the retry goes out once the service is ready.
        SendingRetry,
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
        State::Hedging { hedges }
    }
}

/// What to do with a finished attempt.
enum Verdict {
    /// Return the result.
    Return,
    /// Return the result, whose outcome is still to come in its trailers: the body records
    /// it in the budget.
    ReturnWatched,
    /// Retry after this wait.
    Retry(Duration),
}

/// A finished attempt, classified once and told to the budget: what retries and hedges both
/// decide from.
pub(crate) enum Heard {
    /// A success; `watched`: its trailers will tell the budget (a gRPC response committed by
    /// its headers), so its body must watch them.
    Success { watched: bool },
    /// Neither success nor failure (a caller error).
    Ignored,
    /// Our own rejection (an open breaker, a spent deadline).
    Rejected,
    /// A failure (throttled or not), with its retry rules.
    Failure(Retryable, Option<ServerHint>),
}

impl<S, B, C> RetryState<S, B, C> {
    /// The retry state of a request whose first attempt is about to go out.
    pub(crate) fn new(
        shared: Arc<Handle<C>>,
        service: S,
        template: Template,
        body: ReplayBody<B>,
        bounds: Bounds,
        overrides: crate::RetryOverrides,
    ) -> Self {
        // Request numbers seed the jitter of a seeded policy (and only then: counting them
        // is a shared write every request would pay for).
        let number = match shared.policy.seed {
            Some(_) => shared.stats.number(),
            None => 0,
        };
        Self {
            shared,
            service,
            template,
            body,
            next: None,
            bounds,
            attempts: 1,
            gave_up: None,
            overrides,
            backoff: BackoffState::default(),
            rng: None,
            number,
        }
    }

    /// Classifies a finished attempt and tells the budget: a success deposits (or, committed
    /// by its headers, is left to its trailers), a failure the policy could retry or a "do not
    /// retry" is recorded (gRPC A6 throttling).
    pub(crate) fn hear<R>(&self, result: Result<&Response<R>, &BoxError>) -> Heard
    where
        C: Classify<Response<R>>,
    {
        let policy = &self.shared.policy;
        let outcome = policy
            .classifier
            .classify(result.map_err(|e| &**e as &(dyn std::error::Error + 'static)));
        match outcome {
            Outcome::Success => {
                let Some(budget) = &policy.budget else {
                    return Heard::Success { watched: false };
                };
                // A gRPC response committed by its headers: the trailers tell success from
                // failure, so the budget hears of it at the end of the body.
                if let Ok(response) = result
                    && policy.classifier.awaits_trailers(response)
                {
                    return Heard::Success { watched: true };
                }
                budget.record_success();
                self.shared.meter_budget();
                Heard::Success { watched: false }
            }
            Outcome::Ignored => Heard::Ignored,
            Outcome::Rejected => Heard::Rejected,
            Outcome::Failure { retryable, hint } | Outcome::Throttled { retryable, hint } => {
                if let Some(budget) = &policy.budget
                    && counts_as_failure(retryable, hint)
                {
                    budget.record_failure();
                    self.shared.meter_budget();
                }
                Heard::Failure(retryable, hint)
            }
        }
    }

    /// The decision order for a finished attempt.
    fn decide<R>(&mut self, result: Result<&Response<R>, &BoxError>) -> Verdict
    where
        C: Classify<Response<R>>,
    {
        let (retryable, hint) = match self.hear(result) {
            Heard::Success { watched: true } => return Verdict::ReturnWatched,
            Heard::Success { watched: false } | Heard::Ignored => return Verdict::Return,
            Heard::Rejected => {
                // Our own rejection (an open breaker, a spent deadline): callers upstream must
                // not retry it either.
                mark_exhausted();
                return Verdict::Return;
            }
            Heard::Failure(retryable, hint) => (retryable, hint),
        };
        match self.grant_retry(retryable, hint) {
            Ok(wait) => {
                self.attempts += 1;
                self.shared.stats.retry();
                self.shared.meter_attempt(AttemptKind::Retry);
                tracing::debug!(
                    dependency = self.shared.name.get(),
                    method = %self.template.method,
                    path = self.template.path(),
                    attempt = self.attempts,
                    failed = %Failed(result),
                    wait_ms = wait.as_millis() as u64,
                    "retrying request"
                );
                Verdict::Retry(wait)
            }
            Err(why) => {
                self.give_up(why, result);
                Verdict::Return
            }
        }
    }

    /// The result is returned without a further attempt, for `why`: told to the response,
    /// the stats, callers upstream (when the retries are spent) and the event log. One place
    /// for retries and hedges.
    pub(crate) fn give_up<R>(&mut self, why: GiveUp, result: Result<&Response<R>, &BoxError>) {
        self.gave_up = Some(why);
        self.shared.stats.give_up(why);
        self.shared.meter_give_up(why);
        if why.exhausts_retries() {
            mark_exhausted();
        }
        tracing::debug!(
            dependency = self.shared.name.get(),
            method = %self.template.method,
            path = self.template.path(),
            attempts = self.attempts,
            failed = %Failed(result),
            reason = why.as_str(),
            "not retrying"
        );
    }

    /// Steps 1 to 8 of the decision order: whether a retry may go, and after which backoff. A
    /// granted retry has taken its budget token and the body over for the next attempt.
    fn grant_retry(
        &mut self,
        retryable: Retryable,
        hint: Option<ServerHint>,
    ) -> Result<Duration, GiveUp> {
        let policy = &self.shared.policy;
        if retryable == Retryable::Never {
            return Err(GiveUp::NotRetryable);
        }
        if self.attempts >= self.overrides.max_attempts.unwrap_or(policy.max_attempts) {
            return Err(GiveUp::Attempts);
        }
        if retryable == Retryable::IfIdempotent
            && !self
                .overrides
                .idempotent
                .unwrap_or_else(|| self.template.idempotent(policy.idempotency))
        {
            return Err(GiveUp::NotIdempotent);
        }
        if hint == Some(ServerHint::DoNotRetry) {
            return Err(GiveUp::Hint);
        }
        if !self.body.is_replayable() {
            return Err(GiveUp::NotReplayable);
        }
        let rng = self.rng.get_or_insert_with(|| {
            Rng::with_seed(policy.seed.map_or_else(
                || fastrand::u64(..),
                |s| backstop_core::mix::splitmix(s, self.number),
            ))
        });
        let wait =
            match hint {
                // gRPC A6: retry in exactly n ms, and the backoff starts over after it.
                Some(ServerHint::Pushback(asked)) => {
                    self.backoff = BackoffState::default();
                    asked.min(policy.max_hint)
                }
                // RFC 9110 `Retry-After`: the least to wait; the backoff may say longer.
                Some(ServerHint::RetryAfter(asked)) => asked
                    .min(policy.max_hint)
                    .max(next_backoff(policy, &mut self.backoff, rng)),
                _ => next_backoff(policy, &mut self.backoff, rng),
            };
        if let Some(send_by) = self.bounds.send_by() {
            let earliest = Instant::now()
                .checked_add(wait)
                .and_then(|t| t.checked_add(policy.min_attempt_time));
            if earliest.is_none_or(|t| t > send_by) {
                return Err(GiveUp::Deadline);
            }
        }
        if let Some(budget) = &policy.budget {
            let granted = budget.try_withdraw();
            self.shared.meter_budget();
            if !granted {
                return Err(GiveUp::Budget);
            }
        }
        // Last, so an attempt whose result is returned keeps its body: the next attempt's
        // copy takes the body over from this attempt's, which may still be sending it.
        let Some(next) = self.body.replay() else {
            if let Some(budget) = &policy.budget {
                budget.refund();
                self.shared.meter_budget();
            }
            return Err(GiveUp::NotReplayable);
        };
        self.next = Some(next);
        Ok(wait)
    }

    fn next_request(&mut self) -> Option<Request<ReplayBody<B>>> {
        let body = self.next.take()?;
        let mut req = self.template.request(body);
        if is_grpc(req.headers()) {
            req.headers_mut().insert(
                GRPC_PREVIOUS_RPC_ATTEMPTS,
                HeaderValue::from(self.attempts - 1),
            );
        }
        Some(req)
    }
}

/// How an attempt failed, for events: the gRPC status, the HTTP status, or the error.
pub(crate) struct Failed<'a, R>(pub(crate) Result<&'a Response<R>, &'a BoxError>);

impl<R> std::fmt::Display for Failed<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Ok(response) => match response.headers().get(backstop_core::grpc::GRPC_STATUS) {
                Some(code) => write!(f, "grpc-status {}", code.to_str().unwrap_or("?")),
                None => write!(f, "status {}", response.status().as_u16()),
            },
            Err(e) => write!(f, "error: {e}"),
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

/// The next backoff delay; `state.retry` counts the retries since the backoff started over.
fn next_backoff<C>(
    policy: &crate::RetryConfig<C>,
    state: &mut BackoffState,
    rng: &mut Rng,
) -> Duration {
    state.retry += 1;
    policy.backoff.next_delay(state, rng)
}

/// Whether a failed attempt takes from a budget that counts failures (gRPC A6 throttling):
/// only a failure the policy could retry, or a server's "do not retry" — not a malformed
/// request or a final status.
pub(crate) fn counts_as_failure(retryable: Retryable, hint: Option<ServerHint>) -> bool {
    retryable != Retryable::Never || hint == Some(ServerHint::DoNotRetry)
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
                StateProj::Hedging { hedges } => {
                    let retry = this.retry.as_mut().expect("a hedged request");
                    let (result, watch) = ready!(retry.poll_hedges(hedges.get(), cx));
                    // The attempts still in flight are cancelled here.
                    this.state.set(State::Done);
                    return Poll::Ready(finish(this.retry.as_ref(), this.meter, result, watch));
                }
                StateProj::Expired => {
                    this.state.set(State::Done);
                    // The attempt counted when it was decided was never sent.
                    if let Some(retry) = this.retry.as_mut() {
                        retry.attempts -= 1;
                    }
                    let result = Err(DeadlineExceeded::new().into());
                    return Poll::Ready(finish(this.retry.as_ref(), this.meter, result, None));
                }
                StateProj::BackingOff { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(State::SendingRetry);
                }
                StateProj::SendingRetry => {
                    let retry = this.retry.as_mut().expect("only retries wait");
                    if let Err(e) = ready!(retry.service.poll_ready(cx)) {
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
