use crate::client::call::Call;
use crate::client::retry::bounds::{Armed, Bounds};
use crate::client::retry::future::{ResponseFuture, State};
use crate::client::retry::hedge::Hedges;
use crate::client::retry::metrics::RetryMetrics;
use crate::client::retry::shared::Handles;
use crate::client::retry::state::RetryState;
use crate::client::retry::template::Template;
use crate::client::retry::{ReplayBody, RetryBody};
use crate::deadline::{Deadline, current};
use crate::wire::grpc::GRPC_TIMEOUT;
use crate::wire::grpc_timeout;
use crate::{BoxError, Classify, Outcome, Retryable};
use http::{Request, Response};
use http_body::Body;
use std::task::{Context, Poll};
use tokio::time::Instant;
use tower_service::Service;

/// The service built by [`RetryLayer`](crate::client::retry::RetryLayer).
#[derive(Debug)]
pub struct Retry<S, C> {
    inner: S,
    handles: Handles<C>,
    header: crate::client::retry::bounds::Wire,
}

impl<S: Clone, C> Clone for Retry<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            handles: self.handles.clone(),
            header: self.header,
        }
    }
}

impl<S, C> Retry<S, C> {
    pub(crate) fn from_handles(
        inner: S,
        handles: Handles<C>,
        header: crate::client::retry::bounds::Wire,
    ) -> Self {
        Self {
            inner,
            handles,
            header,
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

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for Retry<S, C>
where
    S: Service<Request<ReplayBody<ReqBody>>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<Response<ResBody>>,
    ReqBody: Body,
{
    type Response = Response<RetryBody<ResBody, C>>;
    type Error = BoxError;
    type Future = ResponseFuture<S, ReqBody, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        // A stack that writes `grpc-timeout` inside (the presets) has a deadline layer outside
        // this one, which began the call (and put the handler's deadline and report address
        // on the request); otherwise this layer is the call's first.
        let first = !matches!(self.header, crate::client::retry::bounds::Wire::Inside(_));
        // Where the call reports giving up (see `client::call`).
        let report = Call::take_gave_up(&mut req, first);
        let handle = self.handles.current();
        handle.ledger.stats.request(handle.stripe());
        handle.meter_attempt(crate::client::retry::metrics::AttemptKind::First);
        handle.meter_route(&mut req);
        let policy = &handle.policy;
        // An empty extension map answers at once: most requests pay one branch for this.
        let overrides = req
            .extensions()
            .get::<crate::client::retry::RetryOverrides>()
            .copied()
            .unwrap_or_default();
        let max_attempts = overrides.max_attempts.unwrap_or(policy.max_attempts);
        let replay_ok = req.body().size_hint().lower() <= policy.max_replay_bytes as u64;
        if max_attempts <= 1 || !replay_ok {
            // Retries are off for this request: no buffering, no copy of the request. One
            // whose body is too long to keep is reported as given up when it fails.
            let unreplayable = (max_attempts > 1).then(|| {
                overrides
                    .idempotent
                    .unwrap_or_else(|| policy.idempotency.allows(req.method(), req.headers()))
            });
            let mut req = req.map(ReplayBody::passthrough);
            // No retry follows it: a bound inside may give it the whole deadline.
            req.extensions_mut().insert(crate::FinalAttempt);
            // The call's first layer bounds its one attempt by the deadline, as it bounds each
            // attempt of a call it may retry; in a preset the deadline layer outside does.
            let end = match first {
                true => Told::of(&req, true).end(),
                false => None,
            };
            if end.is_some_and(|at| Instant::now() >= at) {
                crate::rt::release(&mut self.inner);
                return ResponseFuture::unsent();
            }
            return ResponseFuture::once(self.inner.call(req), handle, unreplayable, report, end);
        }

        let told = Told::of(&req, first);
        let deadline = told.deadline();
        // A layer inside will tell the server the deadline less its offset.
        let wire = match (self.header, deadline) {
            (crate::client::retry::bounds::Wire::Inside(offset), Some(d)) => {
                let inside = d.instant().checked_sub(offset).unwrap_or(d.instant());
                Some(told.wire.map_or(inside, |w| w.min(inside)))
            }
            _ => told.wire,
        };
        let bounds = Bounds {
            deadline,
            wire,
            header: told.carried,
            inside: !first,
        };
        let template = Template::new(&req);
        // gRFC A96's per-call series are for gRPC calls (read only when recorded).
        let grpc = RetryMetrics::ON && crate::is_grpc(req.headers());
        // Whether a retry may follow this request's attempt timeouts: the classifier's rule
        // for `AttemptTimedOut` (asked once per layer) and, where it depends on it, whether the
        // request is idempotent. When none may, every attempt is final for the bound inside,
        // which then gives it the whole deadline instead of keeping a share for a retry.
        let idempotent = overrides
            .idempotent
            .unwrap_or_else(|| template.idempotent(policy.idempotency));
        let timeouts_final = match *handle.timeout_retryable.get_or_init(|| {
            match policy
                .classifier
                .classify(Err(&crate::AttemptTimedOut::new()))
            {
                Outcome::Failure { retryable, .. } | Outcome::Throttled { retryable, .. } => {
                    retryable
                }
                _ => Retryable::Never,
            }
        }) {
            Retryable::Never => true,
            Retryable::IfIdempotent => !idempotent,
            _ => false,
        };
        let (parts, body) = req.into_parts();
        // An empty body (most GETs) needs no buffer at all.
        let body = if body.is_end_stream() {
            ReplayBody::empty()
        } else {
            ReplayBody::new(body, policy.max_replay_bytes)
        };
        let first = body.replay().unwrap_or_else(ReplayBody::empty);
        // The first attempt sends the original request; only retries are rebuilt.
        let mut req = Request::from_parts(parts, first);

        // The ready service makes this call; a clone waits for the retries.
        let clone = self.inner.clone();
        let mut service = std::mem::replace(&mut self.inner, clone);
        let armed = bounds.arm(&mut req, true);
        if timeouts_final {
            req.extensions_mut().insert(crate::FinalAttempt);
        }
        // A hedged request: one the idempotency rule allows, with a delay to hedge after.
        let hedge = match &policy.hedging {
            Some(hedging)
                if armed != Armed::Expired && overrides.hedge != Some(false) && idempotent =>
            {
                hedging.delay.delay_for(req.method(), req.uri())
            }
            _ => None,
        };
        let state = match hedge {
            Some(delay) => {
                let deadline = bounds.deadline.map(|d| d.instant());
                State::hedging(Hedges::boxed(service.call(req), delay, deadline))
            }
            None => State::sent(armed, || service.call(req)),
        };
        let retry = RetryState::new(
            handle.clone(),
            service,
            template,
            body,
            bounds,
            overrides,
            timeouts_final,
        );
        let mut retry = retry;
        retry.grpc = grpc;
        retry.report = report;
        ResponseFuture::retrying(retry, state)
    }
}

/// What a request says of its deadline, read once per call (for a call sent once as for one
/// that may be retried).
struct Told {
    /// The earlier of its `Deadline` extension and, for the call's first layer, the
    /// handler's (which the first layer of a call inherits).
    local: Option<Deadline>,
    /// The instant its `grpc-timeout` names: what the server is told (an outer
    /// `PropagateDeadline`'s header, or the caller's). Read only by the call's first layer: in
    /// a preset's stack (`Inside`, decided when it is built) the deadline layer outside took a
    /// caller's header off the request and carries the deadline in the extension.
    wire: Option<Instant>,
    /// It carried a `grpc-timeout` (a malformed one too, which a local deadline then
    /// replaces): a retry refreshes it, and writes none where it carried none.
    carried: bool,
}

impl Told {
    #[inline(always)]
    fn of<B>(req: &Request<B>, first: bool) -> Self {
        let inherited = if first { current() } else { None };
        let local = match (req.extensions().get::<Deadline>().copied(), inherited) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let header = match first {
            true => req.headers().get(GRPC_TIMEOUT),
            false => None,
        };
        let wire = header
            .and_then(|v| grpc_timeout::decode_header(v).ok())
            .and_then(|t| Instant::now().checked_add(t));
        Self {
            local,
            wire,
            carried: header.is_some(),
        }
    }

    /// The call's deadline: the local one, else the instant the header names.
    fn deadline(&self) -> Option<Deadline> {
        self.local.or(self.wire.map(Deadline::at))
    }

    /// The last instant an attempt can be sent: the earlier of the two.
    fn end(&self) -> Option<Instant> {
        match (self.local.map(|d| d.instant()), self.wire) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
