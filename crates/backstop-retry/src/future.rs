use crate::{
    ReplayBody,
    backoff::{BackoffState, Rng},
    layer::Handle,
    pushback::mark_exhausted,
    service::{Bounds, Template},
    stats::GiveUp,
};
use backstop_core::{
    AttemptTimedOut, BoxError, Classify, DeadlineExceeded, Outcome, Retryable, ServerHint,
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
use tokio::time::{Instant, Sleep, sleep, sleep_until};
use tower_service::Service;

/// The first attempt, as `call` left it.
pub(crate) enum Attempt<F> {
    Sent(F, Option<(Instant, bool)>),
    Expired,
}

pin_project! {
    /// The response future of [`Retry`](crate::Retry).
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, B, C>
    where
        S: Service<Request<ReplayBody<B>>>,
    {
        retry: Option<RetryState<S, B, C>>,
        #[pin]
        state: State<S::Future>,
    }
}

pub(crate) struct RetryState<S, B, C> {
    shared: Arc<Handle<C>>,
    service: S,
    template: Template,
    body: ReplayBody<B>,
    bounds: Bounds,
    attempts: u32,
    backoff: BackoffState,
    rng: Option<Rng>,
    number: u64,
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Calling {
            #[pin]
            future: F,
            // Created the first time the attempt is not ready, so a call answered at once
            // never touches the timer.
            #[pin]
            timer: Option<Sleep>,
            end: Option<(Instant, bool)>,
        },
        Expired,
        Waiting { #[pin] sleep: Sleep },
        Ready,
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
    pub(crate) fn once(future: S::Future) -> Self {
        Self {
            retry: None,
            state: State::Calling {
                future,
                timer: None,
                end: None,
            },
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn retrying(
        shared: Arc<Handle<C>>,
        service: S,
        template: Template,
        body: ReplayBody<B>,
        bounds: Bounds,
        attempt: Attempt<S::Future>,
        number: u64,
    ) -> Self {
        let state = match attempt {
            Attempt::Sent(future, end) => calling(future, end),
            Attempt::Expired => State::Expired,
        };
        Self {
            retry: Some(RetryState {
                shared,
                service,
                template,
                body,
                bounds,
                attempts: 1,
                backoff: BackoffState::default(),
                rng: None,
                number,
            }),
            state,
        }
    }
}

fn calling<F>(future: F, end: Option<(Instant, bool)>) -> State<F> {
    State::Calling {
        future,
        timer: None,
        end,
    }
}

/// splitmix64: turns (seed, request number) into a well-mixed generator seed.
fn mix(seed: u64, n: u64) -> u64 {
    let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl<S, B, C> RetryState<S, B, C> {
    /// The decision order for a finished attempt: `None` to return its result now, or the
    /// wait before the next attempt.
    fn decide<R>(&mut self, result: Result<&Response<R>, &BoxError>) -> Option<Duration>
    where
        C: Classify<Response<R>>,
    {
        let policy = &self.shared.policy;
        let outcome = policy
            .classifier
            .classify(result.map_err(|e| &**e as &(dyn std::error::Error + 'static)));
        let (retryable, hint) = match outcome {
            Outcome::Success => {
                if let Some(budget) = &policy.budget {
                    budget.record_success();
                }
                return None;
            }
            Outcome::Ignored => return None,
            Outcome::Rejected => {
                // Our own rejection (an open breaker, a spent deadline): callers upstream must
                // not retry it either.
                mark_exhausted();
                return None;
            }
            Outcome::Failure { retryable, hint } => (retryable, hint),
        };
        if let Some(budget) = &policy.budget {
            budget.record_failure();
        }
        let wait = self.wait(retryable, hint);
        match wait {
            Ok(wait) => {
                self.attempts += 1;
                self.shared.stats.retry();
                tracing::debug!(
                    attempt = self.attempts,
                    wait_ms = wait.as_millis() as u64,
                    "retrying request"
                );
                Some(wait)
            }
            Err(why) => {
                self.shared.stats.give_up(why);
                if why.exhausts_retries() {
                    mark_exhausted();
                }
                tracing::debug!(
                    reason = why.as_str(),
                    attempts = self.attempts,
                    "not retrying"
                );
                None
            }
        }
    }

    fn wait(&mut self, retryable: Retryable, hint: Option<ServerHint>) -> Result<Duration, GiveUp> {
        let policy = &self.shared.policy;
        if retryable == Retryable::Never {
            return Err(GiveUp::NotRetryable);
        }
        if self.attempts >= policy.max_attempts {
            return Err(GiveUp::Attempts);
        }
        if retryable == Retryable::IfIdempotent
            && !policy
                .idempotency
                .allows(&self.template.method, &self.template.headers)
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
            Rng::with_seed(
                policy
                    .seed
                    .map_or_else(|| fastrand::u64(..), |s| mix(s, self.number)),
            )
        });
        self.backoff.retry = self.attempts;
        let backoff = policy.backoff.next_delay(&mut self.backoff, rng);
        let wait = match hint.and_then(ServerHint::delay) {
            Some(asked) => asked.min(policy.max_hint).max(backoff),
            None => backoff,
        };
        if let Some(deadline) = self.bounds.deadline
            && wait.saturating_add(policy.min_attempt_time) > deadline.remaining()
        {
            return Err(GiveUp::Deadline);
        }
        if let Some(budget) = &policy.budget
            && !budget.try_withdraw()
        {
            return Err(GiveUp::Budget);
        }
        Ok(wait)
    }

    fn next_request(&self) -> Option<Request<ReplayBody<B>>> {
        let body = self.body.replay()?;
        let mut req = self.template.request(body);
        if is_grpc(&self.template.headers) {
            req.headers_mut().insert(
                GRPC_PREVIOUS_RPC_ATTEMPTS,
                HeaderValue::from(self.attempts - 1),
            );
        }
        Some(req)
    }
}

impl<S, B, C, R> Future for ResponseFuture<S, B, C>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<R>>,
    S::Error: Into<BoxError>,
    C: Classify<Response<R>>,
{
    type Output = Result<Response<R>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Calling {
                    future,
                    mut timer,
                    end,
                } => {
                    let result: Result<Response<R>, BoxError> = match future.poll(cx) {
                        Poll::Ready(result) => result.map_err(Into::into),
                        Poll::Pending => {
                            let Some((at, is_deadline)) = *end else {
                                return Poll::Pending;
                            };
                            if timer.is_none() {
                                timer.set(Some(sleep_until(at)));
                            }
                            let timer = timer.as_pin_mut().expect("armed above");
                            ready!(timer.poll(cx));
                            Err(if is_deadline {
                                DeadlineExceeded::new().into()
                            } else {
                                AttemptTimedOut::new().into()
                            })
                        }
                    };
                    let wait = match this.retry.as_mut() {
                        Some(retry) => retry.decide(result.as_ref()),
                        None => None,
                    };
                    match wait {
                        None => {
                            this.state.set(State::Done);
                            return Poll::Ready(result);
                        }
                        Some(wait) => {
                            drop(result);
                            this.state.set(State::Waiting { sleep: sleep(wait) });
                        }
                    }
                }
                StateProj::Expired => {
                    this.state.set(State::Done);
                    return Poll::Ready(Err(DeadlineExceeded::new().into()));
                }
                StateProj::Waiting { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(State::Ready);
                }
                StateProj::Ready => {
                    let retry = this.retry.as_mut().expect("only retries wait");
                    if let Err(e) = ready!(retry.service.poll_ready(cx)) {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(e.into()));
                    }
                    let Some(mut req) = retry.next_request() else {
                        // Checked before waiting; the body cannot have changed since.
                        this.state.set(State::Done);
                        return Poll::Ready(Err("request body no longer replayable".into()));
                    };
                    match retry.bounds.arm(&mut req, false) {
                        Ok(end) => {
                            let future = retry.service.call(req);
                            this.state.set(calling(future, end));
                        }
                        Err(()) => this.state.set(State::Expired),
                    }
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}
