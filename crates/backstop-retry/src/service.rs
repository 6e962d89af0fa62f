use crate::{
    ReplayBody,
    future::{Attempt, ResponseFuture},
    layer::Handles,
};
use backstop_core::{BoxError, Classify, grpc::GRPC_TIMEOUT};
use backstop_deadline::{Deadline, current, grpc_timeout};
use http::{Extensions, HeaderMap, Method, Request, Response, Uri, Version};
use http_body::Body;
use std::{
    task::{Context, Poll},
    time::Duration,
};
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

/// What is needed to build the request again for a retry.
#[derive(Debug)]
pub(crate) struct Template {
    pub(crate) method: Method,
    uri: Uri,
    version: Version,
    pub(crate) headers: HeaderMap,
    extensions: Extensions,
}

impl Template {
    fn new<B>(req: &Request<B>) -> Self {
        Self {
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            headers: req.headers().clone(),
            extensions: req.extensions().clone(),
        }
    }

    pub(crate) fn request<B>(&self, body: B) -> Request<B> {
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers.clone();
        *req.extensions_mut() = self.extensions.clone();
        req
    }
}

/// The bounds of one attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// The request's deadline.
    pub(crate) deadline: Option<Deadline>,
    /// What the caller told the server, as an instant (an outer layer's `grpc-timeout`).
    pub(crate) wire: Option<Instant>,
    pub(crate) attempt_timeout: Option<Duration>,
}

impl Bounds {
    /// Writes the attempt's `grpc-timeout` and deadline into `req` and returns when the attempt
    /// must end (and whether that end is the request's deadline rather than the attempt's own
    /// timeout), or `Err` when nothing is left to send.
    ///
    /// On the first attempt, a request that already carries its deadline and `grpc-timeout`
    /// (written by an outer `PropagateDeadline`) and has no attempt timeout is left as it is.
    pub(crate) fn arm<B>(
        &self,
        req: &mut Request<B>,
        first: bool,
    ) -> Result<Option<(Instant, bool)>, ()> {
        if self.deadline.is_none() && self.attempt_timeout.is_none() {
            return Ok(None);
        }
        let now = Instant::now();
        let own = self.attempt_timeout.and_then(|t| now.checked_add(t));
        let end = match (self.deadline.map(|d| d.instant()), own) {
            (Some(d), Some(o)) if o < d => Some((o, false)),
            (Some(d), _) => Some((d, true)),
            (None, Some(o)) => Some((o, false)),
            (None, None) => None,
        };
        let Some((end, is_deadline)) = end else {
            return Ok(None);
        };
        if first && is_deadline && self.wire.is_some() {
            return Ok(Some((end, is_deadline)));
        }
        let wire = self.wire.map_or(end, |w| w.min(end));
        let encoded = grpc_timeout::encode(wire.saturating_duration_since(now)).ok_or(())?;
        req.headers_mut()
            .insert(GRPC_TIMEOUT, encoded.to_header_value());
        req.extensions_mut().insert(Deadline::at(end));
        Ok(Some((end, is_deadline)))
    }
}

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for Retry<S, C>
where
    S: Service<Request<ReplayBody<ReqBody>>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<Response<ResBody>>,
    ReqBody: Body,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = ResponseFuture<S, ReqBody, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let handle = self.handles.current();
        handle.stats.request(handle.stripe());
        let policy = &handle.policy;
        let replay_ok = req.body().size_hint().lower() <= policy.max_replay_bytes as u64;
        if policy.max_attempts <= 1 || !replay_ok {
            // Retries are off for this request: no buffering, no copy of the request.
            let req = req.map(ReplayBody::passthrough);
            return ResponseFuture::once(self.inner.call(req));
        }

        let deadline = match (req.extensions().get::<Deadline>().copied(), current()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // What an outer layer already told the server; only needed when an attempt is bounded.
        // An outer `PropagateDeadline` says what it wrote; otherwise the header is read back.
        let wire = if deadline.is_some() || policy.attempt_timeout.is_some() {
            backstop_deadline::wire_deadline().or_else(|| {
                req.headers()
                    .get(GRPC_TIMEOUT)
                    .and_then(|v| grpc_timeout::decode_header(v).ok())
                    .and_then(|t| Instant::now().checked_add(t))
            })
        } else {
            None
        };
        let bounds = Bounds {
            deadline,
            wire,
            attempt_timeout: policy.attempt_timeout,
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
        let attempt = match bounds.arm(&mut req, true) {
            Ok(end) => Attempt::Sent(service.call(req), end),
            Err(()) => Attempt::Expired,
        };
        // Request numbers seed the jitter of a seeded policy (and only then: counting them
        // is a shared write every request would pay for).
        let number = match policy.seed {
            Some(_) => handle.stats.number(),
            None => 0,
        };
        ResponseFuture::retrying(
            handle.clone(),
            service,
            template,
            body,
            bounds,
            attempt,
            number,
        )
    }
}
