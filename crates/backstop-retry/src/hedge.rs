//! Hedging: when an attempt is slower than usual, send another copy and take whichever answers
//! first — the tail-latency cure of gRPC A6's `hedgingPolicy`, budgeted like retries.
//!
//! Configure it on a [`RetryConfig`](crate::RetryConfig) with [`Hedging`]; the client preset
//! of the `backstop` facade takes the delay from the dependency's measured latency.
//!
//! # Rules (gRPC A6 hedging, and where backstop differs)
//!
//! - **Which requests.** Those the policy's [`Idempotency`](crate::Idempotency) rule allows
//!   (by default GET, HEAD, OPTIONS, TRACE, PUT, DELETE or an `Idempotency-Key`; every gRPC
//!   call is a POST, so a gRPC client opts in with [`Idempotency::All`](crate::Idempotency::All)
//!   when all its methods are safe to run twice). Other requests are retried as without
//!   hedging. A request is hedged only while its body is complete in the replay buffer (an
//!   empty body always is): a copy then never cuts another attempt's body short
//!   ([`ReplayBody::is_complete`](crate::ReplayBody::is_complete)). A body still streaming, or
//!   past `max_replay_bytes`, is not hedged.
//! - **When.** The first attempt goes at once; each further one [`HedgeDelay`] after the
//!   previous one, up to `max_attempts` in all. A delay of `None` (a measured delay whose
//!   model is not trusted yet) sends no hedge: the request is retried as without hedging.
//! - **Which answer wins.** The first attempt that *commits*: a success, a response whose
//!   outcome the trailers will tell (gRPC headers without a status), or a failure that is not
//!   retryable (A6's "fatal"). Every other attempt is dropped at that moment — for the breaker
//!   and the latency model a cancellation, never a failure.
//! - **Retryable failures** (A6's "non-fatal codes": the classifier's retryable set) send the
//!   next hedge at once; `grpc-retry-pushback-ms: n` sends it in exactly `n` ms; a negative
//!   pushback stops hedging. When no attempt is left in flight and no hedge will be sent, the
//!   last failure is returned.
//! - **The budget.** Every hedge takes a token from the same [`Budget`](crate::Budget) as
//!   retries, so retries and hedges together stay within its ratio; no token, no hedge. A
//!   success deposits once per request. Failures reach the budget as they do for retries.
//! - **The deadline.** No hedge is sent without `min_attempt_time` left on the wire; each
//!   hedge's `grpc-timeout` says the time really left, and gRPC hedges carry
//!   `grpc-previous-rpc-attempts` (the number of attempts sent before it).
//!
//! Compared with tower's `Hedge`: that sends one hedge at most, needs `Clone` requests, keeps
//! its histogram behind a `Mutex` (and reads only the last full period of it, so it does not
//! hedge during its first period), lets an error win the race, and is not budgeted.
//! tower-resilience's hedge takes a delay that is fixed or a function of the attempt number
//! (no measured latency) and is not budgeted either: its hedges add load however many requests
//! are slow, where these stop when the retry budget is spent.
//!
//! # Concurrency rule
//!
//! A request's attempts are polled by its one response future; they share nothing but the
//! request body's replay buffer (see [`ReplayBody`]) and the layer's budget
//! and stats, which are lock-free.

use crate::{
    ReplayBody,
    future::{Heard, RetryState},
    layer::Handle,
    metrics::AttemptKind,
    pushback::mark_exhausted,
    stats::GiveUp,
};
use backstop_core::{
    BoxError, Classify, DeadlineExceeded, ServerHint, grpc::GRPC_PREVIOUS_RPC_ATTEMPTS, is_grpc,
};
use http::{HeaderValue, Request, Response};
use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};
use tokio::time::{Instant, Sleep, sleep_until};
use tower_service::Service;

/// Where the delay before the next hedge comes from.
///
/// A `Duration` is a fixed delay; the `backstop` facade's attempt layer offers one read from
/// the dependency's measured latency. Called once per hedge, on the hedging path only.
pub trait HedgeDelay: fmt::Debug + Send + Sync {
    /// The delay before the next hedge, or `None` to send no hedge now.
    fn delay(&self) -> Option<Duration>;
}

impl HedgeDelay for Duration {
    fn delay(&self) -> Option<Duration> {
        Some(*self)
    }
}

/// A hedging configuration for [`RetryConfig::hedging`](crate::RetryConfig::hedging); the
/// rules are in the [module docs](self).
///
/// ```
/// use backstop_retry::{Idempotency, RetryConfig, hedge::Hedging};
/// use std::time::Duration;
///
/// // Up to three attempts, 40 ms apart, for any request.
/// let layer = RetryConfig::grpc()
///     .hedging(Hedging::new(Duration::from_millis(40)).max_attempts(3))
///     .idempotency(Idempotency::All)
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
pub struct Hedging {
    pub(crate) max_attempts: u32,
    pub(crate) delay: Arc<dyn HedgeDelay>,
}

impl Hedging {
    /// Two attempts at most (the first and one hedge), the second after `delay`.
    pub fn new(delay: impl HedgeDelay + 'static) -> Self {
        Self {
            max_attempts: 2,
            delay: Arc::new(delay),
        }
    }

    /// Attempts in all, the first included: 2 ..= [`MAX_ATTEMPTS_LIMIT`](crate::MAX_ATTEMPTS_LIMIT)
    /// (checked by [`RetryConfig::build`](crate::RetryConfig::build)). Default 2.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// The delay source.
    pub fn delay(&self) -> &dyn HedgeDelay {
        &*self.delay
    }
}

/// The attempts of one hedged request.
pub(crate) struct Hedges<F, T> {
    in_flight: Vec<Pin<Box<F>>>,
    /// When the next hedge is due; `None`: none is scheduled (a retryable failure may still
    /// schedule one, unless hedging `stopped`).
    next: Option<Instant>,
    stopped: bool,
    deadline: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
    /// The last attempt that did not commit, returned when nothing else is left.
    last: Option<Result<T, BoxError>>,
    /// Why no further hedge is sent, for the stats.
    why: Option<GiveUp>,
}

impl<F, T> Hedges<F, T> {
    /// The hedges of a request whose first attempt was just sent. Never inlined, so a request
    /// that is not hedged builds its future in place.
    #[inline(never)]
    pub(crate) fn boxed(first: F, delay: Duration, deadline: Option<Instant>) -> HedgesBox<F, T> {
        HedgesBox(Some(Box::new(Self {
            in_flight: vec![Box::pin(first)],
            next: Instant::now().checked_add(delay),
            stopped: false,
            deadline,
            timer: None,
            last: None,
            why: None,
        })))
    }

    fn stop(&mut self, why: Option<GiveUp>) {
        self.next = None;
        self.stopped = true;
        if self.why.is_none() {
            self.why = why;
        }
    }
}

/// The boxed hedges of a request, dropped out of line: the response future of a request that
/// is not hedged keeps the small drop it had without hedging.
pub(crate) struct HedgesBox<F, T>(Option<Box<Hedges<F, T>>>);

impl<F, T> HedgesBox<F, T> {
    pub(crate) fn get(&mut self) -> &mut Hedges<F, T> {
        self.0.as_mut().expect("dropped only once")
    }
}

impl<F, T> Drop for HedgesBox<F, T> {
    #[inline(never)]
    fn drop(&mut self) {
        drop(self.0.take());
    }
}

/// What a finished attempt means for a hedged request.
enum Judged {
    /// It wins: return it (watching its trailers for the budget when `true`).
    Commit(bool),
    /// A retryable failure: the next hedge goes after this wait (at once by default).
    HedgeAfter(Duration),
    /// No further hedge.
    Stop(Option<GiveUp>),
}

/// The result of a hedged request, and whether its body tells the budget of the outcome.
pub(crate) type Settled<R, C> = (Result<Response<R>, BoxError>, Option<Arc<Handle<C>>>);

impl<S, B, C> RetryState<S, B, C> {
    fn judge<R>(&mut self, result: Result<&Response<R>, &BoxError>) -> Judged
    where
        C: Classify<Response<R>>,
    {
        match self.hear(result) {
            Heard::Success { watched } => Judged::Commit(watched),
            Heard::Ignored => Judged::Commit(false),
            // Our own rejection (an open breaker): no further hedge, but an attempt still in
            // flight may yet answer.
            Heard::Rejected => Judged::Stop(None),
            Heard::Failure(backstop_core::Retryable::Never, _) => {
                self.give_up(GiveUp::NotRetryable, result);
                Judged::Commit(false)
            }
            Heard::Failure(_, Some(ServerHint::DoNotRetry)) => Judged::Stop(Some(GiveUp::Hint)),
            Heard::Failure(_, Some(ServerHint::Pushback(asked))) => {
                Judged::HedgeAfter(asked.min(self.shared.policy.max_hint))
            }
            Heard::Failure(..) => Judged::HedgeAfter(Duration::ZERO),
        }
    }

    /// Sends the next hedge if one is due and every rule allows it. `Pending` only while the
    /// service is not ready.
    fn poll_hedge<R>(
        &mut self,
        hedges: &mut Hedges<S::Future, Response<R>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), BoxError>>
    where
        S: Service<Request<ReplayBody<B>>, Response = Response<R>>,
        S::Error: Into<BoxError>,
    {
        let Some(due) = hedges.next else {
            return Poll::Ready(Ok(()));
        };
        let now = Instant::now();
        if now < due {
            return Poll::Ready(Ok(()));
        }
        let policy = &self.shared.policy;
        let hedging = policy.hedging.as_ref().expect("a hedged request");
        let cap = self
            .overrides
            .max_attempts
            .map_or(hedging.max_attempts, |n| n.min(hedging.max_attempts));
        if self.attempts >= cap {
            hedges.stop(Some(GiveUp::Attempts));
            return Poll::Ready(Ok(()));
        }
        if let Some(send_by) = self.bounds.send_by()
            && now
                .checked_add(policy.min_attempt_time)
                .is_none_or(|t| t > send_by)
        {
            hedges.stop(Some(GiveUp::Deadline));
            return Poll::Ready(Ok(()));
        }
        if !self.body.is_complete() {
            hedges.stop(Some(GiveUp::NotReplayable));
            return Poll::Ready(Ok(()));
        }
        ready!(self.service.poll_ready(cx)).map_err(Into::into)?;
        if let Some(budget) = &policy.budget {
            let granted = budget.try_withdraw();
            self.shared.meter_budget();
            if !granted {
                hedges.stop(Some(GiveUp::Budget));
                return Poll::Ready(Ok(()));
            }
        }
        let body = self.body.replay().expect("a complete body is replayable");
        let mut req = self.template.request(body);
        if is_grpc(req.headers()) {
            req.headers_mut()
                .insert(GRPC_PREVIOUS_RPC_ATTEMPTS, HeaderValue::from(self.attempts));
        }
        if self.bounds.arm(&mut req, false) == crate::bounds::Armed::Expired {
            if let Some(budget) = &policy.budget {
                budget.refund();
                self.shared.meter_budget();
            }
            hedges.stop(Some(GiveUp::Deadline));
            return Poll::Ready(Ok(()));
        }
        self.attempts += 1;
        self.shared.stats.hedge();
        self.shared.meter_attempt(AttemptKind::Hedge);
        tracing::debug!(
            dependency = self.shared.name.get(),
            method = %self.template.method,
            path = self.template.path(),
            attempt = self.attempts,
            "hedging request"
        );
        hedges.in_flight.push(Box::pin(self.service.call(req)));
        // No delay (a model not trusted any more): no hedge on a timer, but a retryable
        // failure still sends the next one.
        hedges.next = hedging.delay.delay().and_then(|d| now.checked_add(d));
        Poll::Ready(Ok(()))
    }

    /// Drives a hedged request until one attempt commits or none is left. Never inlined:
    /// the response future's `poll` stays as small as it was without hedging, so requests
    /// that are not hedged pay nothing for it.
    #[inline(never)]
    pub(crate) fn poll_hedges<R>(
        &mut self,
        hedges: &mut Hedges<S::Future, Response<R>>,
        cx: &mut Context<'_>,
    ) -> Poll<Settled<R, C>>
    where
        S: Service<Request<ReplayBody<B>>, Response = Response<R>>,
        S::Error: Into<BoxError>,
        C: Classify<Response<R>>,
    {
        loop {
            let mut i = 0;
            while i < hedges.in_flight.len() {
                let Poll::Ready(result) = hedges.in_flight[i].as_mut().poll(cx) else {
                    i += 1;
                    continue;
                };
                drop(hedges.in_flight.swap_remove(i));
                let result = result.map_err(Into::into);
                match self.judge(result.as_ref()) {
                    Judged::Commit(watch) => {
                        // The others are dropped with `hedges`: cancellations.
                        let watch = watch.then(|| self.shared.clone());
                        return Poll::Ready((result, watch));
                    }
                    Judged::HedgeAfter(wait) if !hedges.stopped => {
                        hedges.next = Instant::now().checked_add(wait);
                    }
                    Judged::HedgeAfter(_) => {}
                    Judged::Stop(why) => hedges.stop(why),
                }
                hedges.last = Some(result);
            }
            let before = hedges.in_flight.len();
            if let Err(e) = ready!(self.poll_hedge(hedges, cx)) {
                return Poll::Ready((Err(e), None));
            }
            if hedges.in_flight.len() > before {
                continue; // a hedge was just sent: poll it
            }
            if hedges.in_flight.is_empty() && hedges.next.is_none() {
                return Poll::Ready(self.settle(hedges));
            }
            let now = Instant::now();
            if hedges.deadline.is_some_and(|d| d <= now) {
                return Poll::Ready((Err(DeadlineExceeded::new().into()), None));
            }
            let wake = match (hedges.next, hedges.deadline) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => match a.or(b) {
                    Some(t) => t,
                    None => return Poll::Pending,
                },
            };
            match &mut hedges.timer {
                Some(timer) if timer.deadline() == wake => {}
                Some(timer) => timer.as_mut().reset(wake),
                None => hedges.timer = Some(Box::pin(sleep_until(wake))),
            }
            let timer = hedges.timer.as_mut().expect("set above");
            ready!(timer.as_mut().poll(cx));
        }
    }

    /// Nothing in flight and no hedge to come: the last failure is the answer.
    fn settle<R>(&mut self, hedges: &mut Hedges<S::Future, Response<R>>) -> Settled<R, C>
    where
        S: Service<Request<ReplayBody<B>>, Response = Response<R>>,
    {
        let result = hedges
            .last
            .take()
            .expect("an attempt finished before none was left");
        match hedges.why {
            Some(why) => self.give_up(why, result.as_ref()),
            // Our own rejection: callers upstream must not retry it either.
            None => mark_exhausted(),
        }
        (result, None)
    }
}
