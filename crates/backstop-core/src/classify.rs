//! Classification: what a result means, decided once for the retry layer and the breaker.
//!
//! A [`Classify`] maps the result of a call — the response headers (gRPC trailers come later,
//! through [`Classify::classify_trailers`]) or the error — to an [`Outcome`]:
//!
//! | outcome | breaker | retry |
//! |---|---|---|
//! | [`Outcome::Success`] | counts a success | returns it |
//! | [`Outcome::Failure`] | counts a failure | may retry, per [`Retryable`] and the hint |
//! | [`Outcome::Throttled`] (HTTP 429, gRPC RESOURCE_EXHAUSTED) | ignores it (configurable) | as a failure |
//! | [`Outcome::Rejected`] (our own: deadline spent, breaker open) | ignores it | never retries |
//! | [`Outcome::Ignored`] (caller errors, cancellations) | ignores it | never retries |
//!
//! Errors are seen as `&(dyn Error + 'static)`, so one classifier serves any service whose
//! error converts into a [`BoxError`](crate::BoxError). Transport errors are recognised
//! through their source chain (see [`classify_error`]).

use crate::{
    AttemptTimedOut, BreakerOpen, BulkheadFull, ClientThrottled, DeadlineExceeded, Rejection,
    ServerHint,
    grpc::{Code, GRPC_STATUS},
    is_grpc,
};
use http::{HeaderMap, Response, StatusCode};
use std::{error::Error, io, time::SystemTime};

/// Whether a failed request may be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Retryable {
    /// Never: the failure is final (e.g. HTTP 500, gRPC INTERNAL).
    Never,
    /// Only if the request is idempotent: the server may have processed it.
    IfIdempotent,
    /// Always: the request provably was not processed (connection refused, HTTP/2
    /// REFUSED_STREAM, 429, or a code the service owner declared safe such as UNAVAILABLE).
    Always,
}

/// What the result of a call means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The dependency did its job.
    Success,
    /// The dependency failed.
    Failure {
        /// Whether a retry is safe.
        retryable: Retryable,
        /// What the server asked for, if anything.
        hint: Option<ServerHint>,
    },
    /// The dependency refused the call because of load: HTTP 429, gRPC RESOURCE_EXHAUSTED. A
    /// failure of this call, which the retry layer treats as [`Outcome::Failure`] (the same
    /// [`Retryable`] rules, the hint honoured), but not a sign that the dependency is down:
    /// the circuit breaker does not count it by default, so a rate limit is honoured through
    /// its hint instead of closing the dependency off.
    Throttled {
        /// Whether a retry is safe.
        retryable: Retryable,
        /// What the server asked for, if anything.
        hint: Option<ServerHint>,
    },
    /// We refused the call ourselves (a deadline already spent, an open breaker).
    Rejected,
    /// Neither success nor failure of the dependency: a caller error or a cancellation.
    Ignored,
}

impl Outcome {
    /// A failure with no hint.
    pub fn failure(retryable: Retryable) -> Self {
        Outcome::Failure {
            retryable,
            hint: None,
        }
    }

    /// Whether this is a failure of the dependency ([`Outcome::Failure`] or
    /// [`Outcome::Throttled`]).
    pub fn is_failure(&self) -> bool {
        matches!(self, Outcome::Failure { .. } | Outcome::Throttled { .. })
    }

    /// The retry rules of a failure, throttled or not: `None` for every other outcome.
    pub fn failure_parts(&self) -> Option<(Retryable, Option<ServerHint>)> {
        match *self {
            Outcome::Failure { retryable, hint } | Outcome::Throttled { retryable, hint } => {
                Some((retryable, hint))
            }
            _ => None,
        }
    }
}

/// Maps the result of a call to an [`Outcome`].
pub trait Classify<Res> {
    /// Classifies a response (its headers) or an error.
    fn classify(&self, result: Result<&Res, &(dyn Error + 'static)>) -> Outcome;

    /// Classifies trailers that arrive at the end of a streamed body, for protocols that put
    /// the final status there (gRPC). `None`: the trailers change nothing.
    fn classify_trailers(&self, trailers: &HeaderMap) -> Option<Outcome> {
        let _ = trailers;
        None
    }

    /// Whether the final outcome of this response may still arrive in trailers, so a layer
    /// that must know it (the circuit breaker, the retry budget) waits for the end of the
    /// body. Default `false`: the headers decide. [`GrpcClassifier`] says `true` for a gRPC
    /// response whose headers carry no `grpc-status`.
    ///
    /// When it says `true`, a body that then fails, or that ends without trailers, is a
    /// failure (for gRPC a stream without a status is a protocol error, which gRPC clients
    /// report as INTERNAL), never a success.
    fn awaits_trailers(&self, response: &Res) -> bool {
        let _ = response;
        false
    }
}

/// Classifies an error by its source chain:
///
/// - our own [`DeadlineExceeded`], [`BreakerOpen`], [`ClientThrottled`] and [`BulkheadFull`]
///   → [`Outcome::Rejected`];
/// - [`AttemptTimedOut`] → failure, [`Retryable::IfIdempotent`];
/// - `std::io` `ConnectionRefused` / `AddrNotAvailable` (nothing was sent) → failure,
///   [`Retryable::Always`];
/// - with the `h2` feature: HTTP/2 `REFUSED_STREAM` (RFC 9113 §8.7: the server did not
///   process the stream) and a graceful `GOAWAY` (`NO_ERROR`: h2 fails only the streams above
///   the server's last processed id) → failure, [`Retryable::Always`];
/// - any other error (reset, broken pipe, end of stream, timeouts, unknown) → failure,
///   [`Retryable::IfIdempotent`]: the request may have been processed.
pub fn classify_error(err: &(dyn Error + 'static)) -> Outcome {
    let mut next = Some(err);
    while let Some(err) = next {
        if err.is::<DeadlineExceeded>()
            || err.is::<BreakerOpen>()
            || err.is::<ClientThrottled>()
            || err.is::<BulkheadFull>()
        {
            return Outcome::Rejected;
        }
        if err.is::<AttemptTimedOut>() {
            return Outcome::failure(Retryable::IfIdempotent);
        }
        #[cfg(feature = "h2")]
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            let not_processed = h2.reason() == Some(h2::Reason::REFUSED_STREAM)
                || (h2.is_go_away() && h2.is_remote() && h2.reason() == Some(h2::Reason::NO_ERROR));
            return Outcome::failure(if not_processed {
                Retryable::Always
            } else {
                Retryable::IfIdempotent
            });
        }
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return match io.kind() {
                io::ErrorKind::ConnectionRefused | io::ErrorKind::AddrNotAvailable => {
                    Outcome::failure(Retryable::Always)
                }
                _ => Outcome::failure(Retryable::IfIdempotent),
            };
        }
        next = err.source();
    }
    Outcome::failure(Retryable::IfIdempotent)
}

fn hint_in(headers: &HeaderMap) -> Option<ServerHint> {
    ServerHint::from_headers(headers, SystemTime::now())
}

/// The classifier for plain HTTP.
///
/// Defaults: 1xx–3xx success; 429 a throttled failure ([`Outcome::Throttled`]) that is [`Retryable::Always`] with its
/// `Retry-After`; 502, 503 and 504 failures [`Retryable::IfIdempotent`] (with any hint); other
/// 5xx failures that are never retried; 409 with `Retry-After` a throttled failure that is
/// [`Retryable::Always`] (a server de-duplicating idempotency keys refused a duplicate of a
/// call still in flight, before running it: come back later); other 4xx ignored (the
/// caller's fault). Errors as
/// [`classify_error`]. A response carrying a [`Rejection`] is [`Outcome::Rejected`].
#[derive(Debug, Clone)]
pub struct HttpClassifier {
    retry_if_idempotent: Vec<StatusCode>,
    retry_always: Vec<StatusCode>,
    /// Below this status (and below 400), nothing is listed: a success without a lookup.
    plain_below: u16,
}

impl Default for HttpClassifier {
    fn default() -> Self {
        Self {
            retry_if_idempotent: vec![
                StatusCode::BAD_GATEWAY,
                StatusCode::SERVICE_UNAVAILABLE,
                StatusCode::GATEWAY_TIMEOUT,
            ],
            retry_always: vec![StatusCode::TOO_MANY_REQUESTS],
            plain_below: 400,
        }
    }
}

impl HttpClassifier {
    /// The default classifier.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the statuses that are failures retryable if the request is idempotent
    /// (default 502, 503, 504). Any 4xx listed here counts as a failure, not as ignored.
    #[must_use]
    pub fn retry_if_idempotent(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.retry_if_idempotent = statuses.into_iter().collect();
        self.plain_below = self.lowest_listed();
        self
    }

    /// Replaces the statuses that are failures always retryable (default 429).
    #[must_use]
    pub fn retry_always(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.retry_always = statuses.into_iter().collect();
        self.plain_below = self.lowest_listed();
        self
    }

    /// The lowest listed status, at most 400: every status below it is a plain success.
    fn lowest_listed(&self) -> u16 {
        self.retry_always
            .iter()
            .chain(&self.retry_if_idempotent)
            .map(StatusCode::as_u16)
            .fold(400, u16::min)
    }

    /// Classifies a status and its headers.
    pub fn classify_status(&self, status: StatusCode, headers: &HeaderMap) -> Outcome {
        // Most responses: a success no list names.
        if status.as_u16() < self.plain_below {
            return Outcome::Success;
        }
        let retryable = if self.retry_always.contains(&status) {
            Retryable::Always
        } else if self.retry_if_idempotent.contains(&status) {
            Retryable::IfIdempotent
        } else if status.is_server_error() {
            Retryable::Never
        } else if status == StatusCode::CONFLICT && headers.contains_key(http::header::RETRY_AFTER)
        {
            // "Come back later", not "you are wrong": a server that de-duplicates keys
            // answers a duplicate of a call still in flight so (backstop's
            // `IdempotencyLayer` does). The duplicate was refused before it ran, so it may be
            // sent again; like a 429 it is no sign the dependency is failing.
            return Outcome::Throttled {
                retryable: Retryable::Always,
                hint: hint_in(headers),
            };
        } else if status.is_client_error() {
            return Outcome::Ignored;
        } else {
            return Outcome::Success;
        };
        let hint = hint_in(headers);
        if status == StatusCode::TOO_MANY_REQUESTS {
            return Outcome::Throttled { retryable, hint };
        }
        Outcome::Failure { retryable, hint }
    }
}

impl<B> Classify<Response<B>> for HttpClassifier {
    fn classify(&self, result: Result<&Response<B>, &(dyn Error + 'static)>) -> Outcome {
        match result {
            Ok(r) if r.extensions().get::<Rejection>().is_some() => Outcome::Rejected,
            Ok(r) => self.classify_status(r.status(), r.headers()),
            Err(e) => classify_error(e),
        }
    }
}

/// The classifier for gRPC.
///
/// The status comes from `grpc-status` in a trailers-only response, or from the trailers
/// ([`Classify::classify_trailers`]); a response whose headers carry no status is a success
/// so far. Defaults (gRPC A6 leaves retryable codes to the service owner):
/// - OK → success;
/// - the retryable codes ([`GrpcClassifier::retryable_codes`], default UNAVAILABLE alone) →
///   failure, [`Retryable::Always`], with any `grpc-retry-pushback-ms`;
/// - CANCELLED, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
///   FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE, UNIMPLEMENTED, UNAUTHENTICATED → ignored;
/// - DEADLINE_EXCEEDED, UNKNOWN, INTERNAL, DATA_LOSS → failure, never retried;
/// - RESOURCE_EXHAUSTED → throttled ([`Outcome::Throttled`]: not a breaker failure by
///   default), never retried unless listed among the retryable codes.
///
/// As gRPC A6 says, the status code alone decides whether a failure may be retried; a pushback
/// only says when (or, negative, never): a RESOURCE_EXHAUSTED carrying a pushback is not
/// retried unless RESOURCE_EXHAUSTED is among the retryable codes.
///
/// A non-200 HTTP status without `grpc-status` maps as the gRPC specification says (429, 502,
/// 503, 504 → UNAVAILABLE; 401 → UNAUTHENTICATED; 403 → PERMISSION_DENIED; 404 →
/// UNIMPLEMENTED; others → UNKNOWN). Errors as [`classify_error`].
#[derive(Debug, Clone)]
pub struct GrpcClassifier {
    retryable: Vec<Code>,
}

impl Default for GrpcClassifier {
    fn default() -> Self {
        Self {
            retryable: vec![Code::Unavailable],
        }
    }
}

impl GrpcClassifier {
    /// The default classifier.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the codes that are failures always retryable (default UNAVAILABLE): the set
    /// A6 calls `retryableStatusCodes`. Every other failing code is never retried.
    #[must_use]
    pub fn retryable_codes(mut self, codes: impl IntoIterator<Item = Code>) -> Self {
        self.retryable = codes.into_iter().collect();
        self
    }

    /// Classifies a status code, with the headers or trailers that carried it.
    pub fn classify_code(&self, code: Code, headers: &HeaderMap) -> Outcome {
        if code == Code::Ok {
            return Outcome::Success;
        }
        let hint = hint_in(headers);
        if self.retryable.contains(&code) {
            let retryable = Retryable::Always;
            if code == Code::ResourceExhausted {
                return Outcome::Throttled { retryable, hint };
            }
            return Outcome::Failure { retryable, hint };
        }
        match code {
            Code::Cancelled
            | Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::Aborted
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::Unauthenticated => Outcome::Ignored,
            Code::ResourceExhausted => Outcome::Throttled {
                retryable: Retryable::Never,
                hint,
            },
            _ => Outcome::Failure {
                retryable: Retryable::Never,
                hint,
            },
        }
    }

    fn code_for_http(status: StatusCode) -> Code {
        match status.as_u16() {
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }
}

impl<B> Classify<Response<B>> for GrpcClassifier {
    fn classify(&self, result: Result<&Response<B>, &(dyn Error + 'static)>) -> Outcome {
        let response = match result {
            Ok(r) => r,
            Err(e) => return classify_error(e),
        };
        if response.extensions().get::<Rejection>().is_some() {
            return Outcome::Rejected;
        }
        if let Some(code) = response.headers().get(GRPC_STATUS).map(Code::from_header) {
            return self.classify_code(code.unwrap_or(Code::Unknown), response.headers());
        }
        if response.status() != StatusCode::OK {
            let code = Self::code_for_http(response.status());
            return self.classify_code(code, response.headers());
        }
        if !is_grpc(response.headers()) && !response.headers().is_empty() {
            // A 200 that is not gRPC at all: the peer is not a gRPC server.
            return self.classify_code(Code::Unknown, response.headers());
        }
        Outcome::Success
    }

    fn classify_trailers(&self, trailers: &HeaderMap) -> Option<Outcome> {
        let code = trailers.get(GRPC_STATUS)?;
        Some(self.classify_code(Code::from_header(code).unwrap_or(Code::Unknown), trailers))
    }

    fn awaits_trailers(&self, response: &Response<B>) -> bool {
        response.status() == StatusCode::OK
            && !is_trailers_only(response)
            && response.extensions().get::<Rejection>().is_none()
    }
}

/// Whether a response is a gRPC *trailers-only* response: its status is already in the
/// headers, so the call is over when the headers arrive.
pub fn is_trailers_only<B>(response: &Response<B>) -> bool {
    response.headers().contains_key(GRPC_STATUS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn response(status: u16, headers: &[(&'static str, &'static str)]) -> Response<()> {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        for (k, v) in headers {
            r.headers_mut().insert(*k, HeaderValue::from_static(v));
        }
        r
    }

    fn http(r: &Response<()>) -> Outcome {
        HttpClassifier::new().classify(Ok(r))
    }

    fn grpc(r: &Response<()>) -> Outcome {
        GrpcClassifier::new().classify(Ok(r))
    }

    #[test]
    fn http_defaults() {
        use Retryable::*;
        assert_eq!(http(&response(200, &[])), Outcome::Success);
        assert_eq!(http(&response(304, &[])), Outcome::Success);
        assert_eq!(http(&response(404, &[])), Outcome::Ignored);
        assert_eq!(http(&response(400, &[])), Outcome::Ignored);
        assert_eq!(http(&response(500, &[])), Outcome::failure(Never));
        assert_eq!(http(&response(501, &[])), Outcome::failure(Never));
        for s in [502, 503, 504] {
            assert_eq!(
                http(&response(s, &[])),
                Outcome::failure(IfIdempotent),
                "{s}"
            );
        }
        assert_eq!(
            http(&response(429, &[("retry-after", "7")])),
            Outcome::Throttled {
                retryable: Always,
                hint: Some(ServerHint::RetryAfter(std::time::Duration::from_secs(7)))
            }
        );
        assert_eq!(
            http(&response(503, &[("grpc-retry-pushback-ms", "-1")])),
            Outcome::Failure {
                retryable: IfIdempotent,
                hint: Some(ServerHint::DoNotRetry)
            }
        );
    }

    #[test]
    fn http_sets_are_configurable() {
        let c = HttpClassifier::new()
            .retry_if_idempotent([
                StatusCode::INTERNAL_SERVER_ERROR,
                StatusCode::REQUEST_TIMEOUT,
            ])
            .retry_always([]);
        assert_eq!(
            c.classify(Ok(&response(500, &[]))),
            Outcome::failure(Retryable::IfIdempotent)
        );
        assert_eq!(
            c.classify(Ok(&response(408, &[]))),
            Outcome::failure(Retryable::IfIdempotent)
        );
        assert_eq!(c.classify(Ok(&response(429, &[]))), Outcome::Ignored);
        assert_eq!(
            c.classify(Ok(&response(503, &[]))),
            Outcome::failure(Retryable::Never)
        );
    }

    /// A listed status below 400 is a failure, whatever the success shortcut does for the
    /// statuses no list names.
    #[test]
    fn a_listed_success_status_is_a_failure() {
        let c = HttpClassifier::new().retry_always([StatusCode::ACCEPTED]);
        assert_eq!(
            c.classify(Ok(&response(202, &[]))),
            Outcome::failure(Retryable::Always)
        );
        for status in [200, 201, 204, 302] {
            assert_eq!(
                c.classify(Ok(&response(status, &[]))),
                Outcome::Success,
                "{status}"
            );
        }
        let c = c.retry_always([]);
        assert_eq!(c.classify(Ok(&response(202, &[]))), Outcome::Success);
    }

    #[test]
    fn local_rejections_are_rejected() {
        let r = Rejection::DeadlineExceeded
            .into_response::<()>(true)
            .map(|_| ());
        assert_eq!(grpc(&r), Outcome::Rejected);
        let r = Rejection::DeadlineExceeded
            .into_response::<()>(false)
            .map(|_| ());
        assert_eq!(http(&r), Outcome::Rejected);
        let open = BreakerOpen::new(None);
        assert_eq!(classify_error(&open), Outcome::Rejected);
        assert_eq!(classify_error(&ClientThrottled::new()), Outcome::Rejected);
        assert_eq!(
            classify_error(&BulkheadFull::new("max_wait")),
            Outcome::Rejected
        );
        let err = DeadlineExceeded::new();
        assert_eq!(
            HttpClassifier::new().classify(Err::<&Response<()>, _>(&err)),
            Outcome::Rejected
        );
    }

    #[test]
    fn grpc_trailers_only_codes() {
        use Retryable::*;
        let ct = ("content-type", "application/grpc");
        assert_eq!(
            grpc(&response(200, &[ct, ("grpc-status", "0")])),
            Outcome::Success
        );
        assert_eq!(
            grpc(&response(200, &[ct, ("grpc-status", "14")])),
            Outcome::failure(Always)
        );
        assert_eq!(
            grpc(&response(
                200,
                &[ct, ("grpc-status", "14"), ("grpc-retry-pushback-ms", "-1")]
            )),
            Outcome::Failure {
                retryable: Always,
                hint: Some(ServerHint::DoNotRetry)
            }
        );
        assert_eq!(
            grpc(&response(200, &[ct, ("grpc-status", "8")])),
            Outcome::Throttled {
                retryable: Never,
                hint: None
            }
        );
        // A6: the code decides, the pushback only says when.
        let pushback = Some(ServerHint::Pushback(std::time::Duration::from_millis(100)));
        let exhausted = response(
            200,
            &[ct, ("grpc-status", "8"), ("grpc-retry-pushback-ms", "100")],
        );
        assert_eq!(
            grpc(&exhausted),
            Outcome::Throttled {
                retryable: Never,
                hint: pushback
            }
        );
        let only_unavailable = GrpcClassifier::new().retryable_codes([Code::Unavailable]);
        assert_eq!(
            only_unavailable.classify(Ok(&exhausted)),
            Outcome::Throttled {
                retryable: Never,
                hint: pushback
            }
        );
        let with_exhausted = GrpcClassifier::new().retryable_codes([Code::ResourceExhausted]);
        assert_eq!(
            with_exhausted.classify(Ok(&exhausted)),
            Outcome::Throttled {
                retryable: Always,
                hint: pushback
            }
        );
        assert_eq!(
            with_exhausted.classify(Ok(&response(200, &[ct, ("grpc-status", "14")]))),
            Outcome::failure(Never),
            "the set is replaced, not extended"
        );
        for code in ["4", "2", "13", "15", "99", "x"] {
            assert_eq!(
                grpc(&response(200, &[ct, ("grpc-status", code)])),
                Outcome::failure(Never),
                "{code}"
            );
        }
        for code in ["1", "3", "5", "6", "7", "9", "10", "11", "12", "16"] {
            assert_eq!(
                grpc(&response(200, &[ct, ("grpc-status", code)])),
                Outcome::Ignored,
                "{code}"
            );
        }
    }

    #[test]
    fn grpc_status_from_trailers_and_http() {
        let c = GrpcClassifier::new();
        let c: &dyn Classify<Response<()>> = &c;
        let ct = ("content-type", "application/grpc");
        // Headers without a status: success so far; the trailers decide.
        assert_eq!(grpc(&response(200, &[ct])), Outcome::Success);
        let mut trailers = HeaderMap::new();
        assert_eq!(c.classify_trailers(&trailers), None);
        trailers.insert(GRPC_STATUS, HeaderValue::from_static("14"));
        assert_eq!(
            c.classify_trailers(&trailers),
            Some(Outcome::failure(Retryable::Always))
        );
        assert_eq!(
            grpc(&response(503, &[])),
            Outcome::failure(Retryable::Always)
        );
        assert_eq!(grpc(&response(404, &[])), Outcome::Ignored);
        assert_eq!(
            grpc(&response(500, &[])),
            Outcome::failure(Retryable::Never)
        );
        assert_eq!(
            grpc(&response(200, &[("content-type", "text/html")])),
            Outcome::failure(Retryable::Never)
        );
        let custom = GrpcClassifier::new().retryable_codes([Code::Unavailable, Code::Aborted]);
        assert_eq!(
            custom.classify_code(Code::Aborted, &HeaderMap::new()),
            Outcome::failure(Retryable::Always)
        );
        assert!(is_trailers_only(&response(200, &[("grpc-status", "0")])));
        assert!(c.awaits_trailers(&response(200, &[ct])));
        assert!(!c.awaits_trailers(&response(200, &[ct, ("grpc-status", "0")])));
        assert!(!c.awaits_trailers(&response(503, &[])));
        let h: &dyn Classify<Response<()>> = &HttpClassifier::new();
        assert!(!h.awaits_trailers(&response(200, &[ct])));
        assert!(!is_trailers_only(&response(200, &[ct])));
    }

    #[derive(Debug)]
    struct Wrap(io::Error);

    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("client error")
        }
    }

    impl Error for Wrap {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn transport_errors_through_the_source_chain() {
        use Retryable::*;
        let cases = [
            (io::ErrorKind::ConnectionRefused, Always),
            (io::ErrorKind::AddrNotAvailable, Always),
            (io::ErrorKind::ConnectionReset, IfIdempotent),
            (io::ErrorKind::BrokenPipe, IfIdempotent),
            (io::ErrorKind::UnexpectedEof, IfIdempotent),
            (io::ErrorKind::TimedOut, IfIdempotent),
        ];
        for (kind, want) in cases {
            let err = Wrap(io::Error::from(kind));
            assert_eq!(classify_error(&err), Outcome::failure(want), "{kind:?}");
        }
        assert_eq!(
            classify_error(&AttemptTimedOut::new()),
            Outcome::failure(IfIdempotent)
        );
        assert_eq!(
            classify_error(&std::fmt::Error),
            Outcome::failure(IfIdempotent)
        );
        assert!(Outcome::failure(Never).is_failure());
        assert!(!Outcome::Rejected.is_failure());
    }
}
