//! Local rejections: failures that backstop decides itself, and the responses that carry them.
//!
//! Server-side layers run inside `axum::Router::layer` and `tonic::transport::Server::layer`,
//! which want the layered service's error to stay the inner one (usually `Infallible`). So a
//! local failure is not an `Err` there: it is a response. A gRPC request (see
//! [`is_grpc`](crate::is_grpc)) gets a *trailers-only* response (HTTP 200 with `grpc-status` and
//! `grpc-message` in the headers and an empty body); any other request gets an HTTP status with
//! a short `text/plain` body.

use crate::ResponseBody;
use crate::wire::grpc::{Code, GRPC_RETRY_PUSHBACK_MS};
use bytes::Bytes;
use http::{
    HeaderValue, Response, StatusCode,
    header::{CONTENT_TYPE, RETRY_AFTER},
};
use std::{fmt, time::Duration};

/// Marks a response given **without running the handler**: nothing happened, so an
/// idempotency layer (`backstop::idempotency::IdempotencyLayer`) releases the request's key
/// and a retry with it runs, instead of replaying this answer.
///
/// A response carries it in its extensions. backstop's server layers that refuse a request
/// before calling their inner service put it there (the deadline layer's refusal on arrival,
/// a malformed `grpc-timeout` or no time left; the admission layer's refusal), whatever the
/// order of the layers; an answer given after the handler started never carries it (the
/// deadline layer's 504 when the deadline passes while the handler runs: the handler may
/// have done its work). A handler may insert it on its own answer to say it did nothing:
///
/// ```
/// use backstop::NotExecuted;
/// use http::{Response, StatusCode};
///
/// let mut busy = Response::new("try again later");
/// *busy.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
/// busy.extensions_mut().insert(NotExecuted);
/// assert!(busy.extensions().get::<NotExecuted>().is_some());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NotExecuted;

/// A failure decided by backstop itself rather than by the dependency.
///
/// Every response built by [`Rejection::into_response`] carries the `Rejection` in its
/// extensions, so outer layers can tell a local answer from a remote one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rejection {
    /// The request's deadline passed (or too little of it was left to start).
    DeadlineExceeded,
    /// The `grpc-timeout` request header (or the configured milliseconds header) is not valid.
    MalformedTimeout,
    /// The call's last attempt ran out of its own bound (the attempt timeout) while the
    /// call's deadline had time left (see [`AttemptTimedOut`](crate::AttemptTimedOut)). gRPC
    /// reports it as DEADLINE_EXCEEDED, as its own clients report a per-attempt timeout, with
    /// its own `grpc-message` ("attempt timed out"), so a caller tells it from an expired
    /// deadline.
    AttemptTimedOut,
    /// A circuit breaker refused the call (see [`BreakerOpen`](crate::BreakerOpen)).
    BreakerOpen {
        /// How long until the breaker lets a call through again, sent as
        /// `grpc-retry-pushback-ms` (milliseconds) or `Retry-After` (seconds, rounded up).
        /// `None` when no time can be promised (probes in flight): gRPC callers are told not
        /// to retry (`grpc-retry-pushback-ms: -1`), HTTP callers get no `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// The client's adaptive throttle refused the call before sending it (see
    /// [`ClientThrottled`](crate::ClientThrottled)): the dependency refused too many recent
    /// calls. Never retried; gRPC callers are told not to retry (`grpc-retry-pushback-ms: -1`).
    ClientThrottled,
    /// The client's bulkhead for the dependency had no permit that could come before the
    /// call's deadline (see [`BulkheadFull`](crate::BulkheadFull)). Never retried; gRPC
    /// callers are told not to retry.
    BulkheadFull,
}

impl Rejection {
    /// Whether the call was refused before it was sent: the dependency never saw it, so its
    /// answer says nothing of the dependency (an open breaker, a full bulkhead or adaptive
    /// limit, the client's throttle). The one rule for every layer that learns from answers:
    /// the throttle counts such a call as accepted, the adaptive limit does not measure it.
    /// A deadline or an attempt's bound may have passed while the call was out: not one.
    pub(crate) fn never_sent(self) -> bool {
        matches!(
            self,
            Rejection::BreakerOpen { .. } | Rejection::BulkheadFull | Rejection::ClientThrottled
        )
    }

    /// The gRPC status code that reports this rejection.
    pub fn grpc_code(self) -> Code {
        match self {
            Rejection::DeadlineExceeded | Rejection::AttemptTimedOut => Code::DeadlineExceeded,
            Rejection::MalformedTimeout => Code::Internal,
            Rejection::BreakerOpen { .. } => Code::Unavailable,
            Rejection::ClientThrottled | Rejection::BulkheadFull => Code::Unavailable,
        }
    }

    /// The HTTP status that reports this rejection to a non-gRPC client.
    pub fn http_status(self) -> StatusCode {
        match self {
            Rejection::DeadlineExceeded | Rejection::AttemptTimedOut => StatusCode::GATEWAY_TIMEOUT,
            Rejection::MalformedTimeout => StatusCode::BAD_REQUEST,
            Rejection::BreakerOpen { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::ClientThrottled | Rejection::BulkheadFull => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The short message sent with the rejection (`grpc-message`, or the text body).
    pub fn message(self) -> &'static str {
        match self {
            Rejection::DeadlineExceeded => "deadline exceeded",
            Rejection::AttemptTimedOut => "attempt timed out",
            Rejection::MalformedTimeout => "malformed grpc-timeout",
            Rejection::BreakerOpen { .. } => "circuit breaker open",
            Rejection::ClientThrottled => "throttled by client",
            Rejection::BulkheadFull => "bulkhead full",
        }
    }

    /// Builds the response that reports this rejection.
    ///
    /// With `grpc = true`: HTTP 200, `content-type: application/grpc`, `grpc-status` and
    /// `grpc-message` headers, empty body. Otherwise: [`http_status`](Self::http_status) with
    /// `content-type: text/plain; charset=utf-8` and the [`message`](Self::message) as body.
    /// [`Rejection::BreakerOpen`] adds `grpc-retry-pushback-ms` (gRPC) or `Retry-After`
    /// (HTTP) with its `retry_after`; [`Rejection::ClientThrottled`] and
    /// [`Rejection::BulkheadFull`] add `grpc-retry-pushback-ms: -1` (gRPC).
    pub fn into_response<B>(self, grpc: bool) -> Response<ResponseBody<B>> {
        let mut response = if grpc {
            let mut response = Response::new(ResponseBody::empty());
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert(
                crate::wire::grpc::GRPC_STATUS,
                self.grpc_code().header_value(),
            );
            headers.insert(
                crate::wire::grpc::GRPC_MESSAGE,
                HeaderValue::from_static(self.message()),
            );
            response
        } else {
            let mut response = Response::new(ResponseBody::full(Bytes::from_static(
                self.message().as_bytes(),
            )));
            *response.status_mut() = self.http_status();
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            response
        };
        if grpc && matches!(self, Rejection::ClientThrottled | Rejection::BulkheadFull) {
            response
                .headers_mut()
                .insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
        }
        if let Rejection::BreakerOpen { retry_after } = self {
            let headers = response.headers_mut();
            match (retry_after, grpc) {
                (Some(wait), true) => {
                    let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                    // A pushback is an int32 (gRPC A6); longer waits saturate.
                    headers.insert(
                        GRPC_RETRY_PUSHBACK_MS,
                        HeaderValue::from(ms.min(i32::MAX as u64)),
                    );
                }
                (Some(wait), false) => {
                    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                    headers.insert(RETRY_AFTER, HeaderValue::from(secs));
                }
                // gRPC A6: a negative pushback means "do not retry".
                (None, true) => {
                    headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
                }
                // HTTP has no "never": no Retry-After.
                (None, false) => {}
            }
        }
        response.extensions_mut().insert(self);
        response
    }
}

impl Rejection {
    /// The local rejection an error stands for: the first of backstop's own errors
    /// ([`DeadlineExceeded`](crate::DeadlineExceeded), [`AttemptTimedOut`](crate::AttemptTimedOut),
    /// [`BreakerOpen`](crate::BreakerOpen), [`ClientThrottled`](crate::ClientThrottled),
    /// [`BulkheadFull`](crate::BulkheadFull)) in `err`'s source chain, `err` itself included;
    /// `None` for an error the dependency or the transport gave.
    ///
    /// ```
    /// use backstop::{BoxError, BreakerOpen, Rejection};
    /// use std::time::Duration;
    ///
    /// let err: BoxError = Box::new(BreakerOpen::new(Some(Duration::from_secs(2))));
    /// assert_eq!(
    ///     Rejection::of(&*err),
    ///     Some(Rejection::BreakerOpen { retry_after: Some(Duration::from_secs(2)) })
    /// );
    /// let err: BoxError = "connection reset".into();
    /// assert_eq!(Rejection::of(&*err), None);
    /// ```
    pub fn of(err: &(dyn std::error::Error + 'static)) -> Option<Rejection> {
        let mut next = Some(err);
        while let Some(err) = next {
            if err.is::<crate::DeadlineExceeded>() {
                return Some(Rejection::DeadlineExceeded);
            }
            if err.is::<crate::AttemptTimedOut>() {
                return Some(Rejection::AttemptTimedOut);
            }
            if let Some(open) = err.downcast_ref::<crate::BreakerOpen>() {
                return Some(Rejection::BreakerOpen {
                    retry_after: open.retry_after(),
                });
            }
            if err.is::<crate::ClientThrottled>() {
                return Some(Rejection::ClientThrottled);
            }
            if err.is::<crate::BulkheadFull>() {
                return Some(Rejection::BulkheadFull);
            }
            next = err.source();
        }
        None
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body_text(response: Response<ResponseBody<String>>) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    /// The one rule the throttle and the adaptive limit share: only a refusal made before the
    /// call went out says nothing of the dependency. Every variant is listed, so a new one
    /// must be decided here.
    #[test]
    fn only_a_refusal_before_sending_is_never_sent() {
        for (rejection, never_sent) in [
            (Rejection::DeadlineExceeded, false),
            (Rejection::MalformedTimeout, false),
            (Rejection::AttemptTimedOut, false),
            (Rejection::BreakerOpen { retry_after: None }, true),
            (Rejection::ClientThrottled, true),
            (Rejection::BulkheadFull, true),
        ] {
            assert_eq!(rejection.never_sent(), never_sent, "{rejection:?}");
        }
    }

    #[tokio::test]
    async fn grpc_rejections_are_trailers_only() {
        for (rejection, code, message) in [
            (Rejection::DeadlineExceeded, "4", "deadline exceeded"),
            (Rejection::MalformedTimeout, "13", "malformed grpc-timeout"),
        ] {
            let response = rejection.into_response::<String>(true);
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers()["content-type"], "application/grpc");
            assert_eq!(response.headers()["grpc-status"], code);
            assert_eq!(response.headers()["grpc-message"], message);
            assert_eq!(response.extensions().get::<Rejection>(), Some(&rejection));
            assert_eq!(body_text(response).await, "");
        }
    }

    #[tokio::test]
    async fn http_rejections_have_a_status_and_a_short_text() {
        for (rejection, status, text) in [
            (Rejection::DeadlineExceeded, 504, "deadline exceeded"),
            (Rejection::MalformedTimeout, 400, "malformed grpc-timeout"),
        ] {
            let response = rejection.into_response::<String>(false);
            assert_eq!(response.status(), status);
            assert!(response.headers().get("grpc-status").is_none());
            assert_eq!(
                response.headers()["content-type"],
                "text/plain; charset=utf-8"
            );
            assert_eq!(response.extensions().get::<Rejection>(), Some(&rejection));
            assert_eq!(body_text(response).await, text);
        }
    }

    #[tokio::test]
    async fn breaker_open_says_when_to_come_back() {
        let open = |ms| Rejection::BreakerOpen {
            retry_after: Some(Duration::from_millis(ms)),
        };
        let grpc = open(2_500).into_response::<String>(true);
        assert_eq!(grpc.status(), StatusCode::OK);
        assert_eq!(grpc.headers()["grpc-status"], "14");
        assert_eq!(grpc.headers()["grpc-message"], "circuit breaker open");
        assert_eq!(grpc.headers()["grpc-retry-pushback-ms"], "2500");
        assert!(grpc.headers().get("retry-after").is_none());
        let huge = open(u64::MAX).into_response::<String>(true);
        assert_eq!(huge.headers()["grpc-retry-pushback-ms"], "2147483647");

        let http = open(2_500).into_response::<String>(false);
        assert_eq!(http.status(), 503);
        assert_eq!(http.headers()["retry-after"], "3");
        assert!(http.headers().get("grpc-retry-pushback-ms").is_none());
        assert_eq!(body_text(http).await, "circuit breaker open");
        let now = open(0).into_response::<String>(false);
        assert_eq!(now.headers()["retry-after"], "0");
        assert_eq!(
            now.extensions().get::<Rejection>(),
            Some(&Rejection::BreakerOpen {
                retry_after: Some(Duration::ZERO)
            })
        );
        // No time to promise (half-open): gRPC callers are told not to retry, HTTP callers
        // get no Retry-After (never "retry now").
        let never = Rejection::BreakerOpen { retry_after: None };
        let grpc = never.into_response::<String>(true);
        assert_eq!(grpc.headers()["grpc-retry-pushback-ms"], "-1");
        let http = never.into_response::<String>(false);
        assert!(http.headers().get("retry-after").is_none());
        assert_eq!(http.status(), 503);
    }

    #[test]
    fn overload_rejections_are_unavailable_and_not_retried() {
        for (rejection, message) in [
            (Rejection::ClientThrottled, "throttled by client"),
            (Rejection::BulkheadFull, "bulkhead full"),
        ] {
            let grpc = rejection.into_response::<String>(true);
            assert_eq!(grpc.headers()["grpc-status"], "14");
            assert_eq!(grpc.headers()["grpc-message"], message);
            assert_eq!(grpc.headers()["grpc-retry-pushback-ms"], "-1");
            let http = rejection.into_response::<String>(false);
            assert_eq!(http.status(), 503);
            assert!(http.headers().get("retry-after").is_none());
            assert_eq!(http.extensions().get::<Rejection>(), Some(&rejection));
        }
    }

    #[test]
    fn display_is_the_message() {
        assert_eq!(Rejection::DeadlineExceeded.to_string(), "deadline exceeded");
        assert_eq!(Rejection::MalformedTimeout.grpc_code(), Code::Internal);
    }
}
