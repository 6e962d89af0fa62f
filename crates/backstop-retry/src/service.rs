use crate::{
    ReplayBody, RetryBody,
    future::{Attempt, ResponseFuture},
    hedge::Hedges,
    layer::Handles,
    template::Template,
};
use backstop_core::{BoxError, Classify, grpc::GRPC_TIMEOUT};
use backstop_deadline::{Deadline, current, grpc_timeout};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Body;
use std::task::{Context, Poll};
use tokio::time::Instant;
use tower_service::Service;

/// The service built by [`RetryLayer`](crate::RetryLayer).
#[derive(Debug)]
pub struct Retry<S, C> {
    inner: S,
    handles: Handles<C>,
}

impl<S: Clone, C> Clone for Retry<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            handles: self.handles.clone(),
        }
    }
}

impl<S, C> Retry<S, C> {
    pub(crate) fn from_handles(inner: S, handles: Handles<C>) -> Self {
        Self { inner, handles }
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

/// The request's own `grpc-timeout`. The names of a small map are scanned first (comparing
/// names is cheaper than hashing a custom one, and most requests carry a handful of headers,
/// without this one); a large map, or a hit, is looked up.
fn caller_timeout(headers: &HeaderMap) -> Option<&HeaderValue> {
    if headers.keys_len() <= 8 && !headers.keys().any(|name| *name == GRPC_TIMEOUT) {
        return None;
    }
    headers.get(GRPC_TIMEOUT)
}

/// The time bounds of a request's attempts.
///
/// What each attempt's `grpc-timeout` says, whoever wrote the original header: the time
/// really left when the attempt is sent, `min(deadline, wire) − now`, where `wire` is what the
/// caller told the server (an outer `PropagateDeadline`'s header, keeping its offset, or a
/// header the caller set). A retry is scheduled only if it can be sent with at least
/// `min_attempt_time` left on the wire. (An attempt bound inside the breaker, the facade's
/// `AttemptTimeout`, shortens an attempt's header further.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// The request's deadline: the earlier of its extension and the task's current deadline,
    /// or, with neither, the instant its `grpc-timeout` header names.
    pub(crate) deadline: Option<Deadline>,
    /// What the caller told the server, as an instant (the request's `grpc-timeout`).
    pub(crate) wire: Option<Instant>,
}

impl Bounds {
    /// The last instant at which an attempt can be sent with any time left on the wire.
    pub(crate) fn send_by(&self) -> Option<Instant> {
        match (self.deadline.map(|d| d.instant()), self.wire) {
            (Some(d), Some(w)) => Some(d.min(w)),
            (d, w) => d.or(w),
        }
    }

    /// Writes the attempt's `grpc-timeout` and deadline into `req` and returns when the attempt
    /// must end (the deadline; `None`: no bound), or `Err` when nothing is left to send.
    ///
    /// On the first attempt, a header that already says no more than what is left (an outer
    /// `PropagateDeadline` wrote it a moment ago, or the caller did) is left as it is.
    pub(crate) fn arm<B>(&self, req: &mut Request<B>, first: bool) -> Result<Option<Instant>, ()> {
        let Some(deadline) = self.deadline else {
            return Ok(None);
        };
        let at = deadline.instant();
        if first && self.wire.is_some_and(|w| w <= at) {
            return Ok(Some(at));
        }
        let now = Instant::now();
        let on_wire = self.wire.map_or(at, |w| w.min(at));
        let encoded = grpc_timeout::encode(on_wire.saturating_duration_since(now)).ok_or(())?;
        req.headers_mut()
            .insert(GRPC_TIMEOUT, encoded.to_header_value());
        req.extensions_mut().insert(Deadline::at(at));
        Ok(Some(at))
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

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let handle = self.handles.current();
        handle.stats.request(handle.stripe());
        handle.meter_attempt(crate::metrics::AttemptKind::First);
        let policy = &handle.policy;
        // An empty extension map answers at once: most requests pay one branch for this.
        let overrides = req
            .extensions()
            .get::<crate::RetryOverrides>()
            .copied()
            .unwrap_or_default();
        let max_attempts = overrides.max_attempts.unwrap_or(policy.max_attempts);
        let replay_ok = req.body().size_hint().lower() <= policy.max_replay_bytes as u64;
        if max_attempts <= 1 || !replay_ok {
            // Retries are off for this request: no buffering, no copy of the request.
            let req = req.map(ReplayBody::passthrough);
            return ResponseFuture::once(self.inner.call(req), handle);
        }

        let local = match (req.extensions().get::<Deadline>().copied(), current()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // What the server is told: an outer `PropagateDeadline` says what it wrote; otherwise
        // a header the caller set is read. Without a local deadline, it is the deadline.
        let wire = backstop_deadline::wire_deadline().or_else(|| {
            caller_timeout(req.headers())
                .and_then(|v| grpc_timeout::decode_header(v).ok())
                .and_then(|t| Instant::now().checked_add(t))
        });
        let bounds = Bounds {
            deadline: local.or(wire.map(Deadline::at)),
            wire,
        };
        let template = Template::new(&req);
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
        let end = bounds.arm(&mut req, true);
        // Request numbers seed the jitter of a seeded policy (and only then: counting them
        // is a shared write every request would pay for).
        let number = match policy.seed {
            Some(_) => handle.stats.number(),
            None => 0,
        };
        // A hedged request: one the idempotency rule allows, with a delay to hedge after.
        let hedge = match &policy.hedging {
            Some(hedging)
                if end.is_ok()
                    && overrides.hedge != Some(false)
                    && overrides
                        .idempotent
                        .unwrap_or_else(|| template.idempotent(policy.idempotency)) =>
            {
                hedging.delay.delay()
            }
            _ => None,
        };
        let attempt = match (end, hedge) {
            (Ok(_), Some(delay)) => {
                let deadline = bounds.deadline.map(|d| d.instant());
                Attempt::Hedged(Hedges::boxed(service.call(req), delay, deadline))
            }
            (Ok(end), _) => Attempt::Sent(service.call(req), end),
            (Err(()), _) => Attempt::Expired,
        };
        ResponseFuture::retrying(
            handle.clone(),
            service,
            template,
            body,
            bounds,
            attempt,
            number,
            overrides,
        )
    }
}
