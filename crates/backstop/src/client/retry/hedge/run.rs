//! The attempts of a hedged request: sent a delay apart, the first to commit wins.

use crate::client::retry::ReplayBody;
use crate::client::retry::metrics::AttemptKind;
use crate::client::retry::state::{Heard, RetryState};
use crate::client::retry::stats::GiveUp;
use crate::rt::timer::LazySleep;
use crate::wire::grpc::GRPC_PREVIOUS_RPC_ATTEMPTS;
use crate::{BoxError, Classify, DeadlineExceeded, Outcome, Retryable, ServerHint, is_grpc};
use http::{HeaderValue, Request, Response};
use std::{
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};
use tokio::time::{Instant, Sleep, sleep_until};
use tower_service::Service;

/// The attempts of one hedged request.
pub(crate) struct Hedges<F, T> {
    in_flight: Vec<Pin<Box<F>>>,
    /// When the next hedge is due; `None`: none is scheduled (a retryable failure may still
    /// schedule one, unless hedging `stopped`).
    next: Option<Instant>,
    /// No hedge before this instant: the end of the last wait a server asked for.
    hold: Option<Instant>,
    stopped: bool,
    deadline: Option<Instant>,
    /// The next hedge's timer (the deadline's is the response future's).
    timer: Option<Pin<Box<Sleep>>>,
    /// The last attempt that did not commit, as it was heard, returned when nothing else is
    /// left.
    last: Option<(Result<T, BoxError>, Heard)>,
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
            hold: None,
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
    /// It wins: return it.
    Commit,
    /// A retryable failure: the next hedge goes after this wait (at once, unless the server
    /// asked for one), and none before it.
    HedgeAfter(Duration),
    /// No further hedge.
    Stop(Option<GiveUp>),
}

/// What [`RetryState::poll_hedge`] did.
enum Hedge {
    /// A hedge was sent.
    Sent,
    /// None is due, or none will be sent.
    NotDue,
    /// One is due, and waits for the service to be ready or the body to be complete, either
    /// of which wakes the task.
    Waiting,
}

/// The result of a hedged request, and how it was heard (`None`: no attempt answered it).
pub(crate) type Settled<R> = (Result<Response<R>, BoxError>, Option<Heard>);

impl<S, B, C> RetryState<S, B, C> {
    fn judge<R>(&mut self, result: Result<&Response<R>, &BoxError>) -> (Judged, Heard)
    where
        C: Classify<Response<R>>,
    {
        let heard = self.hear(result);
        let judged = match heard.outcome {
            Outcome::Success | Outcome::Ignored => Judged::Commit,
            // Our own rejection (an open breaker): no further hedge, but an attempt still in
            // flight may yet answer.
            Outcome::Rejected => Judged::Stop(None),
            Outcome::Failure { retryable, hint } | Outcome::Throttled { retryable, hint } => {
                match (retryable, hint) {
                    (Retryable::Never, _) => {
                        self.give_up(GiveUp::NotRetryable, result);
                        Judged::Commit
                    }
                    // A negative pushback, or a wait longer than the layer waits for: no
                    // further hedge (the retry path's rule, `refuses_retry`).
                    (_, Some(hint)) if crate::client::retry::state::refuses_retry(hint) => {
                        Judged::Stop(Some(GiveUp::Hint))
                    }
                    // A pushback says exactly when, a `Retry-After` the least wait (RFC 9110):
                    // the failure's shortcut (at once) makes both the same.
                    (_, Some(ServerHint::Pushback(asked) | ServerHint::RetryAfter(asked))) => {
                        Judged::HedgeAfter(asked)
                    }
                    _ => Judged::HedgeAfter(Duration::ZERO),
                }
            }
        };
        (judged, heard)
    }

    /// Sends the next hedge if one is due and every rule allows it.
    fn poll_hedge<R>(
        &mut self,
        hedges: &mut Hedges<S::Future, Response<R>>,
        cx: &mut Context<'_>,
    ) -> Result<Hedge, BoxError>
    where
        S: Service<Request<ReplayBody<B>>, Response = Response<R>> + Clone,
        S::Error: Into<BoxError>,
    {
        let Some(due) = hedges.next else {
            return Ok(Hedge::NotDue);
        };
        let now = Instant::now();
        if now < due {
            return Ok(Hedge::NotDue);
        }
        let policy = &self.shared.policy;
        let hedging = policy.hedging.as_ref().expect("a hedged request");
        let cap = self
            .overrides
            .max_attempts
            .map_or(hedging.max_attempts, |n| n.min(hedging.max_attempts));
        if self.attempts >= cap {
            hedges.stop(Some(GiveUp::Attempts));
            return Ok(Hedge::NotDue);
        }
        if let Some(send_by) = self.bounds.send_by()
            && now
                .checked_add(crate::client::retry::MIN_ATTEMPT_TIME)
                .is_none_or(|t| t > send_by)
        {
            hedges.stop(Some(GiveUp::Deadline));
            return Ok(Hedge::NotDue);
        }
        // A copy sent beside an attempt in flight needs the whole body in the buffer (made
        // before, it would take the body over from the attempt still sending it): a hedge due
        // while the transport sends the body waits for its end. With none in flight, a copy
        // takes the body over, as a retry's does.
        let whole = match hedges.in_flight.is_empty() {
            true => Poll::Ready(self.body.is_replayable()),
            false => self.body.poll_complete(cx),
        };
        match whole {
            Poll::Ready(true) => {}
            Poll::Ready(false) => {
                hedges.stop(Some(GiveUp::NotReplayable));
                return Ok(Hedge::NotDue);
            }
            Poll::Pending => return Ok(Hedge::Waiting),
        }
        match self.service.poll_ready(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => {
                let e: BoxError = e.into();
                if hedges.in_flight.is_empty() {
                    // Nothing else can answer: the call ends with it, as a retry's would.
                    return Err(e);
                }
                // An attempt in flight may still answer: a service that cannot take another
                // (a closed `Buffer`, a `Reconnect` that failed) only ends the hedging.
                tracing::debug!(
                    dependency = self.shared.ledger.name.get(),
                    method = %self.template.method,
                    path = self.template.path(),
                    error = %e,
                    "hedge not sent: the service failed its readiness"
                );
                hedges.stop(None);
                return Ok(Hedge::NotDue);
            }
            Poll::Pending => return Ok(Hedge::Waiting),
        }
        if let Some(budget) = &policy.budget {
            let granted = budget.try_withdraw();
            self.shared.meter_budget();
            if !granted {
                // Not sent: what `poll_ready` reserved for it goes back, so an attempt still in
                // flight does not keep a second slot until it ends.
                crate::rt::release(&mut self.service);
                hedges.stop(Some(GiveUp::Budget));
                return Ok(Hedge::NotDue);
            }
        }
        // `None` only when the body crossed its cap a moment ago (the attempt that failed may
        // still be sending it, on another thread).
        let Some(body) = self.body.replay() else {
            if let Some(budget) = &policy.budget {
                budget.refund();
                self.shared.meter_budget();
            }
            crate::rt::release(&mut self.service);
            hedges.stop(Some(GiveUp::NotReplayable));
            return Ok(Hedge::NotDue);
        };
        let mut req = self.template.request(body);
        req.extensions_mut()
            .insert(crate::client::retry::Attempt::new(self.attempts + 1, true));
        if self.attempts + 1 >= cap || self.timeouts_final {
            // No attempt follows the last hedge by count: a bound inside may give it the
            // whole deadline.
            req.extensions_mut().insert(crate::FinalAttempt);
        }
        if is_grpc(req.headers()) {
            req.headers_mut()
                .insert(GRPC_PREVIOUS_RPC_ATTEMPTS, HeaderValue::from(self.attempts));
        }
        if self.bounds.arm(&mut req, false) == crate::client::retry::bounds::Armed::Expired {
            if let Some(budget) = &policy.budget {
                budget.refund();
                self.shared.meter_budget();
            }
            crate::rt::release(&mut self.service);
            hedges.stop(Some(GiveUp::Deadline));
            return Ok(Hedge::NotDue);
        }
        self.attempts += 1;
        self.hedges += 1;
        self.shared.ledger.stats.hedge();
        self.shared.meter_attempt(AttemptKind::Hedge);
        tracing::debug!(
            dependency = self.shared.ledger.name.get(),
            method = %self.template.method,
            path = self.template.path(),
            attempt = self.attempts,
            "hedging request"
        );
        // The route's own delay, when it is kept per route (read before the request goes).
        let delay = hedging.delay.delay_for(req.method(), req.uri());
        hedges.in_flight.push(Box::pin(self.service.call(req)));
        // No delay (a model not trusted any more): no hedge on a timer, but a retryable
        // failure still sends the next one.
        hedges.next = delay
            .and_then(|d| now.checked_add(d))
            .map(|at| hedges.hold.map_or(at, |hold| at.max(hold)));
        Ok(Hedge::Sent)
    }

    /// Schedules the next hedge after a retryable failure: at once (A6), or when the wait the
    /// server asked for is over (a pushback's exactly, a `Retry-After`'s at least), and from
    /// then on no hedge goes before the end of that wait. A wait that does not leave
    /// 1 ms before the deadline on the wire ends hedging at once, as it gives a
    /// retry up.
    fn hedge_after<F, T>(&self, hedges: &mut Hedges<F, T>, wait: Duration) {
        if hedges.stopped {
            return;
        }
        let send_by = self.bounds.send_by();
        let Some(at) = Instant::now().checked_add(wait) else {
            // A wait past the end of time: past any deadline, or asked never to come back.
            let why = send_by.map_or(GiveUp::Hint, |_| GiveUp::Deadline);
            hedges.stop(Some(why));
            return;
        };
        if !wait.is_zero() {
            hedges.hold = hedges.hold.max(Some(at));
        }
        let at = hedges.hold.map_or(at, |hold| at.max(hold));
        if let Some(send_by) = send_by
            && at
                .checked_add(crate::client::retry::MIN_ATTEMPT_TIME)
                .is_none_or(|t| t > send_by)
        {
            hedges.stop(Some(GiveUp::Deadline));
            return;
        }
        hedges.next = Some(at);
    }

    /// Drives a hedged request until one attempt commits or none is left, or its deadline
    /// (`deadline_timer` is its timer: whatever it waits for, a hedge's time, the service's
    /// readiness or an attempt, the deadline ends the wait). Never inlined: the response
    /// future's `poll` stays as small as it was without hedging, so requests that are not
    /// hedged pay nothing for it.
    #[inline(never)]
    pub(crate) fn poll_hedges<R>(
        &mut self,
        hedges: &mut Hedges<S::Future, Response<R>>,
        mut deadline_timer: Pin<&mut LazySleep>,
        cx: &mut Context<'_>,
    ) -> Poll<Settled<R>>
    where
        S: Service<Request<ReplayBody<B>>, Response = Response<R>> + Clone,
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
                let (judged, heard) = self.judge(result.as_ref());
                match judged {
                    // The others are dropped with `hedges`: cancellations.
                    Judged::Commit => return Poll::Ready((result, Some(heard))),
                    Judged::HedgeAfter(wait) => self.hedge_after(hedges, wait),
                    Judged::Stop(why) => hedges.stop(why),
                }
                hedges.last = Some((result, heard));
            }
            match self.poll_hedge(hedges, cx) {
                Err(e) => return Poll::Ready((Err(e), None)),
                Ok(Hedge::Sent) => continue, // poll it
                Ok(Hedge::NotDue | Hedge::Waiting) => {}
            }
            if hedges.in_flight.is_empty() && hedges.next.is_none() {
                return Poll::Ready(self.settle(hedges));
            }
            let now = Instant::now();
            if hedges.deadline.is_some_and(|d| d <= now) {
                return Poll::Ready((Err(DeadlineExceeded::new().into()), None));
            }
            // The next hedge's timer, when it is still to come (one due already waits for the
            // service or the body, which wake the task).
            if let Some(next) = hedges.next.filter(|&next| next > now) {
                match &mut hedges.timer {
                    Some(timer) if timer.deadline() == next => {}
                    Some(timer) => timer.as_mut().reset(next),
                    None => hedges.timer = Some(Box::pin(sleep_until(next))),
                }
                let timer = hedges.timer.as_mut().expect("set above");
                if timer.as_mut().poll(cx).is_ready() {
                    continue;
                }
            }
            // The deadline's own timer, whatever else the task waits for.
            let Some(deadline) = hedges.deadline else {
                return Poll::Pending;
            };
            ready!(deadline_timer.as_mut().poll_until(cx, deadline));
        }
    }

    /// Nothing in flight and no hedge to come: the last failure is the answer.
    fn settle<R>(&mut self, hedges: &mut Hedges<S::Future, Response<R>>) -> Settled<R>
    where
        S: Service<Request<ReplayBody<B>>, Response = Response<R>>,
    {
        let (result, heard) = hedges
            .last
            .take()
            .expect("an attempt finished before none was left");
        match hedges.why {
            Some(why) => self.give_up(why, result.as_ref()),
            // Our own rejection: callers upstream must not retry it either.
            None => self.mark_exhausted(),
        }
        (result, Some(heard))
    }
}
