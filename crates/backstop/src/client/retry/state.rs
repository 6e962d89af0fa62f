//! What a request's attempts share while it may be retried: its copy, its body, its bounds,
//! its backoff and its count of attempts; and the decision order applied to each finished
//! attempt (retries here, hedges in `hedge/run.rs`, both from the same `Heard`).

use crate::client::retry::ReplayBody;
use crate::client::retry::backoff::{BackoffState, Rng};
use crate::client::retry::bounds::Bounds;
use crate::client::retry::budget::counts_as_failure;
use crate::client::retry::metrics::{AttemptKind, RetryMetrics};
use crate::client::retry::shared::Handle;
use crate::client::retry::stats::GiveUp;
use crate::client::retry::template::Template;
use crate::wire::grpc::GRPC_PREVIOUS_RPC_ATTEMPTS;
use crate::{BoxError, Classify, Outcome, Retryable, ServerHint, is_grpc};
use http::{HeaderValue, Request, Response};
use std::{sync::Arc, time::Duration};
use tokio::time::Instant;

/// A retried request's state, kept by its response future.
pub(crate) struct RetryState<S, B, C> {
    pub(crate) shared: Arc<Handle<C>>,
    pub(crate) service: S,
    pub(crate) template: Template,
    pub(crate) body: ReplayBody<B>,
    /// The next attempt's copy of the body, taken over when the retry was decided.
    pub(crate) next: Option<ReplayBody<B>>,
    pub(crate) bounds: Bounds,
    /// Attempts sent so far, the first included.
    pub(crate) attempts: u32,
    /// Why the result returned was not retried, when it was a candidate.
    pub(crate) gave_up: Option<GiveUp>,
    /// This request's overrides of the policy.
    pub(crate) overrides: crate::client::retry::RetryOverrides,
    /// No retry follows an attempt of this request that timed out (the policy's classifier
    /// makes an attempt timeout retryable only if idempotent, and it is not): every attempt
    /// is final for the attempt bound inside.
    pub(crate) timeouts_final: bool,
    /// The backoff since it last started over (a gRPC pushback resets it, per A6).
    pub(crate) backoff: BackoffState,
    pub(crate) rng: Option<Rng>,
    pub(crate) number: u64,
    /// Hedges sent so far (counted in `attempts` too).
    pub(crate) hedges: u32,
    /// The backoffs waited so far: the time without an attempt in flight (gRFC A96's
    /// `retry_delay`).
    pub(crate) delay: Duration,
    /// Whether the call is gRPC, read only when metrics are recorded (gRFC A96's series).
    pub(crate) grpc: bool,
    /// Where the call reports that it gave up: the server request whose handler made it
    /// (see `client::call`).
    pub(crate) report: Option<Arc<crate::server::pushback::GaveUp>>,
}

/// What to do with a finished attempt.
pub(crate) enum Verdict {
    /// Return the result, heard as it was.
    Return(Heard),
    /// Retry after this wait.
    Retry(Duration),
}

/// A finished attempt, classified once: what retries, hedges, the budget and the metrics all
/// read, so no attempt is classified twice by this layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heard {
    pub(crate) outcome: Outcome,
    /// A success whose trailers are still to come (a gRPC response committed by its
    /// headers): its body must watch them for the budget and the metrics. `false` when neither
    /// listens.
    pub(crate) watched: bool,
}

impl Heard {
    /// An outcome the headers (or the error) decided.
    fn decided(outcome: Outcome) -> Self {
        Self {
            outcome,
            watched: false,
        }
    }
}

/// What `classifier` makes of an error: out of line, the success path keeps its size.
#[cold]
#[inline(never)]
fn classify_error_of<C, R>(classifier: &C, error: &BoxError) -> Outcome
where
    C: Classify<Response<R>>,
{
    classifier.classify(Err(&**error))
}

impl<S, B, C> RetryState<S, B, C> {
    /// The retry state of a request whose first attempt is about to go out.
    pub(crate) fn new(
        shared: Arc<Handle<C>>,
        service: S,
        template: Template,
        body: ReplayBody<B>,
        bounds: Bounds,
        overrides: crate::client::retry::RetryOverrides,
        timeouts_final: bool,
    ) -> Self {
        // Request numbers seed the jitter of a seeded policy (and only then: counting them
        // is a shared write every request would pay for).
        let number = match shared.policy.seed {
            Some(_) => shared.ledger.stats.number(),
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
            timeouts_final,
            backoff: BackoffState::default(),
            rng: None,
            number,
            hedges: 0,
            delay: Duration::ZERO,
            grpc: false,
            report: None,
        }
    }

    /// Tells the server request whose handler made this call (if any) that its retries gave
    /// up, so that server tells its own callers not to retry.
    pub(crate) fn mark_exhausted(&self) {
        if let Some(report) = &self.report {
            report.mark();
        }
    }

    /// Whether the attempt just counted is the last one `max_attempts` allows.
    pub(crate) fn is_last(&self) -> bool {
        let max = self
            .overrides
            .max_attempts
            .unwrap_or(self.shared.policy.max_attempts);
        self.attempts >= max
    }

    /// Classifies a finished attempt and tells the budget: a success deposits (or, committed
    /// by its headers, is left to its trailers), a failure the policy could retry or a "do not
    /// retry" is recorded (gRPC A6 throttling).
    pub(crate) fn hear<R>(&self, result: Result<&Response<R>, &BoxError>) -> Heard
    where
        C: Classify<Response<R>>,
    {
        let policy = &self.shared.policy;
        let outcome = match result {
            // One pass over the headers: the outcome, or `None` when the trailers decide.
            Ok(response) => policy.classifier.classify_head(response),
            Err(e) => Some(classify_error_of(&policy.classifier, e)),
        };
        let Some(outcome) = outcome else {
            // A success so far, committed by its headers: its body tells the budget and the
            // metrics at the end, if either listens.
            return Heard {
                outcome: Outcome::Success,
                watched: policy.budget.is_some() || RetryMetrics::ON,
            };
        };
        if let Some(budget) = &policy.budget {
            match outcome {
                Outcome::Success => budget.record_success(),
                Outcome::Failure { retryable, hint } | Outcome::Throttled { retryable, hint }
                    if counts_as_failure(retryable, hint) =>
                {
                    budget.record_failure();
                }
                _ => return Heard::decided(outcome),
            }
            self.shared.meter_budget();
        }
        Heard::decided(outcome)
    }

    /// The decision order for a finished attempt.
    pub(crate) fn decide<R>(&mut self, result: Result<&Response<R>, &BoxError>) -> Verdict
    where
        C: Classify<Response<R>>,
    {
        let heard = self.hear(result);
        let (retryable, hint) = match heard.outcome {
            Outcome::Success | Outcome::Ignored => return Verdict::Return(heard),
            Outcome::Rejected => {
                // Our own rejection (an open breaker, a spent deadline): callers upstream must
                // not retry it either.
                self.mark_exhausted();
                return Verdict::Return(heard);
            }
            Outcome::Failure { retryable, hint } | Outcome::Throttled { retryable, hint } => {
                (retryable, hint)
            }
        };
        match self.grant_retry(retryable, hint) {
            Ok(wait) => {
                // Counted in the stats and metrics when it is sent (`retry_sent`): a call
                // dropped in its backoff, or whose retry the service or the deadline stops
                // before it goes, sent no retry.
                self.attempts += 1;
                tracing::debug!(
                    dependency = self.shared.ledger.name.get(),
                    method = %self.template.method,
                    path = self.template.path(),
                    attempt = self.attempts,
                    failed = %Failed(result),
                    wait_ms = wait.as_millis() as u64,
                    "retrying request"
                );
                self.delay = self.delay.saturating_add(wait);
                Verdict::Retry(wait)
            }
            Err(why) => {
                self.give_up(why, result);
                Verdict::Return(heard)
            }
        }
    }

    /// The result is returned without a further attempt, for `why`: told to the response,
    /// the stats, callers upstream (when the retries are spent) and the event log. One place
    /// for retries and hedges.
    pub(crate) fn give_up<R>(&mut self, why: GiveUp, result: Result<&Response<R>, &BoxError>) {
        self.gave_up = Some(why);
        self.shared.ledger.stats.give_up(why);
        self.shared.meter_give_up(why);
        if why.exhausts_retries() {
            self.mark_exhausted();
        }
        tracing::debug!(
            dependency = self.shared.ledger.name.get(),
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
        let attempts_left =
            self.attempts < self.overrides.max_attempts.unwrap_or(policy.max_attempts);
        let idempotent = || {
            self.overrides
                .idempotent
                .unwrap_or_else(|| self.template.idempotent(policy.idempotency))
        };
        if let Some(why) = refusal(
            retryable,
            hint,
            attempts_left,
            idempotent,
            self.body.is_replayable(),
        ) {
            return Err(why);
        }
        let rng = self.rng.get_or_insert_with(|| {
            Rng::with_seed(policy.seed.map_or_else(
                || fastrand::u64(..),
                |s| crate::rt::mix::splitmix(s, self.number),
            ))
        });
        // The least the wait may be: what the server asked, else the policy's least delay.
        let mut least = policy.least_retry_wait();
        let mut wait = match hint {
            // gRPC A6: retry in exactly n ms, and the backoff starts over after it.
            Some(ServerHint::Pushback(asked)) => {
                self.backoff = BackoffState::default();
                least = asked;
                asked
            }
            // RFC 9110 `Retry-After`: the least to wait; the backoff may say longer.
            Some(ServerHint::RetryAfter(asked)) => {
                least = asked;
                asked.max(next_backoff(policy, &mut self.backoff, rng))
            }
            _ => next_backoff(policy, &mut self.backoff, rng),
        };
        if let Some(send_by) = self.bounds.send_by() {
            let now = Instant::now();
            // The route's own reserve, when it is kept per route.
            let reserve = policy
                .reserve
                .as_ref()
                .and_then(|r| r.reserve_for(&self.template.method, &self.template.uri()));
            // A backoff drawn longer than the time left for a retry is shortened to fit, never
            // below the least wait: the share of the deadline an attempt bound kept for a retry
            // is not lost to the draw (the jitter still spreads retries within what is left).
            let room = send_by
                .saturating_duration_since(now)
                .saturating_sub(crate::client::retry::MIN_ATTEMPT_TIME)
                .saturating_sub(reserve.unwrap_or_default());
            if wait > room && least <= room {
                wait = room;
            }
            let start = now.checked_add(wait);
            let earliest =
                start.and_then(|t| t.checked_add(crate::client::retry::MIN_ATTEMPT_TIME));
            if earliest.is_none_or(|t| t > send_by) {
                return Err(GiveUp::Deadline);
            }
            // What the dependency's calls usually take must fit too: a retry the median call
            // could not finish would time out and count as one more failure.
            if let Some(reserve) = reserve {
                let finish = start.and_then(|t| t.checked_add(reserve));
                if finish.is_none_or(|t| t > send_by) {
                    return Err(GiveUp::Reserve);
                }
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

    /// The attempt counted when it was decided was never sent (the deadline came first, while
    /// it waited for the service or before it was armed): it no longer counts, and a retry
    /// gives its budget token back.
    pub(crate) fn unsent(&mut self) {
        if self.attempts > 1
            && let Some(budget) = &self.shared.policy.budget
        {
            budget.refund();
            self.shared.meter_budget();
        }
        self.attempts -= 1;
        // Refunded here: the drop below must not refund it again.
        self.next = None;
    }

    /// The retry decided last is being sent: the stats and the attempt metric count it.
    pub(crate) fn retry_sent(&self) {
        self.shared.ledger.stats.retry();
        self.shared.meter_attempt(AttemptKind::Retry);
    }

    pub(crate) fn next_request(&mut self) -> Option<Request<ReplayBody<B>>> {
        let body = self.next.take()?;
        let mut req = self.template.request(body);
        req.extensions_mut()
            .insert(crate::client::retry::Attempt::new(self.attempts, false));
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
            Ok(response) => match response.headers().get(crate::wire::grpc::GRPC_STATUS) {
                Some(code) => write!(f, "grpc-status {}", code.to_str().unwrap_or("?")),
                None => write!(f, "status {}", response.status().as_u16()),
            },
            Err(e) => write!(f, "error: {e}"),
        }
    }
}

/// The next backoff delay; `state.retry` counts the retries since the backoff started over.
fn next_backoff<C>(
    policy: &crate::client::retry::RetryConfig<C>,
    state: &mut BackoffState,
    rng: &mut Rng,
) -> Duration {
    state.retry += 1;
    policy.backoff.next_delay(state, rng)
}

/// Whether a server's hint forbids a retry (and a further hedge): a negative pushback says so,
/// and a wait longer than the layer holds a call for ([`MAX_HINT`](crate::client::retry::MAX_HINT))
/// is not waited out, never retried sooner than the server asked. One rule for the retry
/// path, the path of a call sent once and the hedge judge.
pub(crate) fn refuses_retry(hint: ServerHint) -> bool {
    match hint {
        ServerHint::DoNotRetry => true,
        ServerHint::Pushback(asked) | ServerHint::RetryAfter(asked) => {
            asked > crate::client::retry::MAX_HINT
        }
    }
}

/// Steps 1 to 5 of the decision order, the ones that need no clock, budget or backoff: why a
/// failure is not retried, if any of them refuses. One place for the retry path and for a call
/// sent once because its body could not be kept (which reaches step 5 as not replayable).
pub(crate) fn refusal(
    retryable: Retryable,
    hint: Option<ServerHint>,
    attempts_left: bool,
    idempotent: impl FnOnce() -> bool,
    replayable: bool,
) -> Option<GiveUp> {
    if retryable == Retryable::Never {
        return Some(GiveUp::NotRetryable);
    }
    if !attempts_left {
        return Some(GiveUp::Attempts);
    }
    if retryable == Retryable::IfIdempotent && !idempotent() {
        return Some(GiveUp::NotIdempotent);
    }
    if hint.is_some_and(refuses_retry) {
        return Some(GiveUp::Hint);
    }
    if !replayable {
        return Some(GiveUp::NotReplayable);
    }
    None
}

/// A retry decided (its budget token withdrawn, the body taken over for it) and never sent,
/// because the call was dropped in its backoff or while it waited for the service: the token
/// goes back, as [`Budget::refund`](crate::client::retry::Budget::refund) promises (found by
/// an outside attack: a `select!` that dropped the call mid-backoff cost the budget a token).
impl<S, B, C> Drop for RetryState<S, B, C> {
    fn drop(&mut self) {
        if self.next.is_some()
            && let Some(budget) = &self.shared.policy.budget
        {
            budget.refund();
            self.shared.meter_budget();
        }
    }
}
