use crate::{
    Deadline,
    deadline::{current, scale, with_wire},
    future::{PropagateFuture, ResponseFuture},
    grpc_timeout::{self, MalformedTimeout},
    layer::{InboundConfig, Named, OutboundConfig},
};
use backstop_core::{
    BoxError, Rejection,
    grpc::{GRPC_TIMEOUT, is_grpc_content_type},
    is_grpc,
};
use http::{HeaderMap, HeaderValue, Request, Response, header::CONTENT_TYPE};
use std::{
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::Instant;
use tower_service::Service;

/// The service built by [`DeadlineLayer`](crate::DeadlineLayer): enforces the caller's deadline
/// on a server and exposes it to the handler.
#[derive(Debug, Clone)]
pub struct DeadlineService<S> {
    inner: S,
    config: InboundConfig,
}

impl<S> DeadlineService<S> {
    /// Wraps `inner` with the default configuration of [`DeadlineLayer::new`](crate::DeadlineLayer::new).
    pub fn new(inner: S) -> Self {
        Self::from_config(inner, crate::DeadlineLayer::new().config)
    }

    pub(crate) fn from_config(inner: S, config: InboundConfig) -> Self {
        Self { inner, config }
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

/// The shorter of two optional durations.
fn min_opt(a: Option<Duration>, b: Duration) -> Duration {
    a.map_or(b, |a| a.min(b))
}

/// A timeout in decimal milliseconds: 1–19 ASCII digits.
fn parse_millis(value: &HeaderValue) -> Result<Duration, MalformedTimeout> {
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > 19 || !bytes.iter().all(u8::is_ascii_digit) {
        return Err(MalformedTimeout::new());
    }
    let n = bytes.iter().fold(0u64, |n, &b| {
        n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    });
    Ok(Duration::from_millis(n))
}

/// What the deadline layers read from a request's headers.
#[derive(Debug, Default)]
struct Head {
    /// A gRPC request (its first `content-type`).
    grpc: bool,
    /// The shortest valid `grpc-timeout`.
    timeout: Option<Duration>,
    /// A `grpc-timeout` value did not parse.
    malformed: bool,
}

impl Head {
    /// One pass over a small header map (most requests carry a handful of headers): comparing
    /// names is cheaper than hashing them for two lookups. A large map is looked up.
    fn read(headers: &HeaderMap) -> Self {
        let mut head = Head::default();
        if headers.keys_len() > 8 {
            head.grpc = is_grpc(headers);
            for value in headers.get_all(GRPC_TIMEOUT) {
                head.timeout_value(value);
            }
            return head;
        }
        let mut typed = false;
        for (name, value) in headers {
            if *name == CONTENT_TYPE {
                if !typed {
                    head.grpc = is_grpc_content_type(value);
                    typed = true;
                }
            } else if *name == GRPC_TIMEOUT {
                head.timeout_value(value);
            }
        }
        head
    }

    fn timeout_value(&mut self, value: &HeaderValue) {
        match grpc_timeout::decode_header(value) {
            Ok(t) => self.timeout = Some(min_opt(self.timeout, t)),
            Err(_) => self.malformed = true,
        }
    }
}

impl InboundConfig {
    /// The timeout the request asks for: the shortest of every `grpc-timeout` value and the
    /// milliseconds header. `Err` when one is malformed and malformed input is rejected.
    fn requested(&self, head: &Head, headers: &HeaderMap) -> Result<Option<Duration>, Rejection> {
        let mut timeout = head.timeout;
        let mut malformed = head.malformed;
        if let Some(name) = &self.millis_header {
            for value in headers.get_all(name) {
                match parse_millis(value) {
                    Ok(t) => timeout = Some(min_opt(timeout, t)),
                    Err(_) => malformed = true,
                }
            }
        }
        if malformed && self.reject_malformed {
            return Err(Rejection::MalformedTimeout);
        }
        Ok(timeout)
    }

    /// The request's deadline as this server grants it, or the rejection to answer at once.
    fn deadline(
        &self,
        now: Instant,
        head: &Head,
        headers: &HeaderMap,
    ) -> Result<Option<Deadline>, Rejection> {
        let timeout = match self.requested(head, headers)? {
            Some(t) => Some(t.saturating_sub(self.lead)),
            None => self.default,
        };
        let Some(timeout) = timeout.map(|t| self.max.map_or(t, |max| t.min(max))) else {
            return Ok(None);
        };
        if timeout.is_zero() || timeout < self.min_remaining {
            return Err(Rejection::DeadlineExceeded);
        }
        Ok(Some(Deadline::after_from(now, timeout)))
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for DeadlineService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<crate::DeadlineBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let head = Head::read(req.headers());
        let grpc = head.grpc;
        match self.config.deadline(Instant::now(), &head, req.headers()) {
            Err(rejection) => {
                #[cfg(feature = "metrics")]
                crate::future::meter_server(rejection);
                if rejection == Rejection::MalformedTimeout {
                    tracing::warn!(
                        method = %req.method(),
                        path = req.uri().path(),
                        "malformed grpc-timeout: rejected"
                    );
                } else {
                    tracing::debug!(
                        method = %req.method(),
                        path = req.uri().path(),
                        rejection = ?rejection,
                        "rejected on arrival: no time left"
                    );
                }
                ResponseFuture::rejected(rejection, grpc)
            }
            Ok(None) => ResponseFuture::running(self.inner.call(req), None, grpc),
            Ok(Some(deadline)) => {
                req.extensions_mut().insert(deadline);
                ResponseFuture::running(self.inner.call(req), Some(deadline), grpc)
            }
        }
    }
}

/// The service built by [`PropagateDeadlineLayer`](crate::PropagateDeadlineLayer): sends the
/// remaining time in `grpc-timeout` and bounds the call by it.
#[derive(Debug, Clone)]
pub struct PropagateDeadline<S> {
    inner: S,
    config: OutboundConfig,
    /// The dependency's name and counter, with the `metrics` feature (nothing otherwise: a
    /// clone of the service, made per request by many frameworks, then copies no `Arc`).
    #[cfg(feature = "metrics")]
    name: Arc<Named>,
}

impl<S> PropagateDeadline<S> {
    /// Wraps `inner` with the default configuration of
    /// [`PropagateDeadlineLayer::new`](crate::PropagateDeadlineLayer::new).
    pub fn new(inner: S) -> Self {
        let layer = crate::PropagateDeadlineLayer::new();
        Self::from_config(inner, layer.config, layer.name)
    }

    pub(crate) fn from_config(inner: S, config: OutboundConfig, name: Arc<Named>) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = name;
        Self {
            inner,
            config,
            #[cfg(feature = "metrics")]
            name,
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

fn min_deadline(a: Option<Deadline>, b: Deadline) -> Deadline {
    a.map_or(b, |a| a.min(b))
}

impl OutboundConfig {
    /// The call's effective deadline: the earliest of the task-local deadline, the request's
    /// extension, a `grpc-timeout` the caller already set, `now + fraction × remaining` and
    /// `now + timeout`.
    fn deadline<B>(&self, now: Instant, head: &Head, req: &Request<B>) -> Option<Deadline> {
        let mut inherited = current();
        if let Some(&d) = req.extensions().get::<Deadline>() {
            inherited = Some(min_deadline(inherited, d));
        }
        if let Some(t) = head.timeout {
            inherited = Some(min_deadline(inherited, Deadline::after_from(now, t)));
        }
        let mut deadline = inherited;
        if let (Some(fraction), Some(d)) = (self.fraction, inherited) {
            let share = scale(d.remaining_at(now), fraction);
            deadline = Some(d.min(Deadline::after_from(now, share)));
        }
        if let Some(timeout) = self.timeout {
            deadline = Some(min_deadline(deadline, Deadline::after_from(now, timeout)));
        }
        deadline
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for PropagateDeadline<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<crate::DeadlineBody<ResBody>>;
    type Error = BoxError;
    type Future = PropagateFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let now = Instant::now();
        let head = Head::read(req.headers());
        let grpc = head.grpc;
        let Some(deadline) = self.config.deadline(now, &head, &req) else {
            return PropagateFuture::unbounded(self.inner.call(req));
        };
        let remaining = deadline.remaining_at(now);
        // Three significant digits, rounded down (at most 1 % short): consecutive calls send
        // the same value, so its header value is shared rather than encoded and allocated
        // again, and HPACK can index it.
        let told = grpc_timeout::coarse_header_value(remaining.saturating_sub(self.config.offset));
        let (value, told) = match told {
            Some(told) if remaining >= self.config.min_remaining => told,
            _ => return PropagateFuture::expired(grpc, self.meter()),
        };
        req.headers_mut().insert(GRPC_TIMEOUT, value);
        // What the server was told: once this instant has passed, every failure of the call is
        // the deadline's (a transport timer armed from our header, or the server giving up).
        let wire_deadline = Deadline::after_from(now, told);
        // Layers further in (retries, breakers) see the call's deadline as `current()`, in
        // `call` and in every poll of their future: cheaper than a request extension, which
        // would cost two allocations here and more in every copy of the request.
        let future = with_wire(deadline, Some(wire_deadline.instant()), || {
            self.inner.call(req)
        });
        PropagateFuture::bounded(future, deadline, wire_deadline, grpc, self.meter())
    }
}

impl<S> PropagateDeadline<S> {
    /// What a bounded call's future counts its expiry with (feature `metrics`; otherwise
    /// nothing).
    #[inline(always)]
    fn meter(&self) -> crate::future::Meter {
        #[cfg(feature = "metrics")]
        return self.name.expired().clone();
        #[cfg(not(feature = "metrics"))]
        crate::future::Meter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_header_grammar() {
        let ok = |s: &'static str| parse_millis(&HeaderValue::from_static(s));
        assert_eq!(ok("0"), Ok(Duration::ZERO));
        assert_eq!(ok("250"), Ok(Duration::from_millis(250)));
        assert_eq!(ok("0000250"), Ok(Duration::from_millis(250)));
        assert_eq!(
            ok("9999999999999999999"),
            Ok(Duration::from_millis(9_999_999_999_999_999_999))
        );
        for bad in ["", "-1", "1.5", "1s", " 1", "99999999999999999999"] {
            assert!(ok(bad).is_err(), "{bad:?}");
        }
    }
}
