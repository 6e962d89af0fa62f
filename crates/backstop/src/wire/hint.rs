//! Server hints: every "wait before retrying" signal a server can send, parsed in one place.
//!
//! - `Retry-After` (RFC 9110 §10.2.3): delta-seconds (`120`) or an HTTP-date
//!   (`Wed, 21 Oct 2015 07:28:00 GMT`). A date in the past means "now".
//! - `grpc-retry-pushback-ms` (gRPC A6): a non-negative int32 of milliseconds; a negative or
//!   malformed value means "do not retry".
//! - [`NO_RETRY`] (`backstop-no-retry`), backstop's own, on plain HTTP responses: "my own
//!   retries of this request already gave up; do not retry it again". HTTP has no standard
//!   way to say "never" (`Retry-After` only says "not before"), and a gRPC header on an HTTP
//!   response would puzzle browsers, curl and proxies, so backstop's hops say it in a header
//!   of their own that everything else ignores.
//!
//! Parsing never panics and never overflows: absurd delays are kept as they are (saturating),
//! and the retry layer clamps them to 30 s and by the remaining deadline, so a hostile
//! hint can never make a client sleep past its deadline.

use crate::wire::grpc::GRPC_RETRY_PUSHBACK_MS;
use http::{HeaderMap, HeaderName, HeaderValue, header::RETRY_AFTER};
use std::time::{Duration, SystemTime};

/// `backstop-no-retry`: on a plain HTTP response, "do not retry this request" (any value;
/// `PushbackLayer` sends `1`), read as [`ServerHint::DoNotRetry`]. The plain-HTTP
/// counterpart of `grpc-retry-pushback-ms: -1`.
pub const NO_RETRY: HeaderName = HeaderName::from_static("backstop-no-retry");

/// What a server asked of a client that might retry.
///
/// The two kinds of delay mean different things, as their specifications say: `Retry-After`
/// is the least a client should wait (RFC 9110 §10.2.3), so the retry layer waits at least
/// that, or its backoff if longer; a gRPC pushback is when to retry (gRPC A6: "retry in n
/// ms"), so the retry layer waits exactly that and starts its backoff over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerHint {
    /// `Retry-After`: wait at least this long before the next attempt.
    RetryAfter(Duration),
    /// `grpc-retry-pushback-ms` with a valid value: retry after exactly this long.
    Pushback(Duration),
    /// Do not retry this request at all (a negative or malformed pushback).
    DoNotRetry,
}

impl ServerHint {
    /// The hint in `headers` (response headers or gRPC trailers), if any.
    ///
    /// `grpc-retry-pushback-ms` wins over `Retry-After` when both are present, and
    /// [`NO_RETRY`] over both. `now` is the wall-clock time used to turn an HTTP-date into a
    /// delay.
    pub fn from_headers(headers: &HeaderMap, now: SystemTime) -> Option<ServerHint> {
        if headers.is_empty() {
            return None;
        }
        if headers.contains_key(NO_RETRY) {
            return Some(ServerHint::DoNotRetry);
        }
        if let Some(v) = headers.get(GRPC_RETRY_PUSHBACK_MS) {
            return Some(Self::from_pushback(v));
        }
        let v = headers.get(RETRY_AFTER)?;
        Self::from_retry_after(v, now).map(ServerHint::RetryAfter)
    }

    /// Parses `grpc-retry-pushback-ms`: 1–10 ASCII digits forming a value in the int32 range
    /// are a [`ServerHint::Pushback`] in milliseconds; anything else (negative, too large, not
    /// a number) means [`ServerHint::DoNotRetry`].
    pub fn from_pushback(value: &HeaderValue) -> ServerHint {
        let bytes = value.as_bytes();
        if bytes.is_empty() || bytes.len() > 10 || !bytes.iter().all(u8::is_ascii_digit) {
            return ServerHint::DoNotRetry;
        }
        let n = bytes
            .iter()
            .fold(0u64, |n, &b| n * 10 + u64::from(b - b'0'));
        if n > i32::MAX as u64 {
            return ServerHint::DoNotRetry;
        }
        ServerHint::Pushback(Duration::from_millis(n))
    }

    /// Parses `Retry-After`: delta-seconds (saturating on absurd values) or an HTTP-date
    /// relative to `now` (zero when in the past). `None` when it is neither.
    pub fn from_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
        let bytes = value.as_bytes();
        if !bytes.is_empty() && bytes.iter().all(u8::is_ascii_digit) {
            let secs = bytes.iter().fold(0u64, |n, &b| {
                n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
            });
            return Some(Duration::from_secs(secs));
        }
        let date = httpdate::parse_http_date(value.to_str().ok()?.trim()).ok()?;
        Some(date.duration_since(now).unwrap_or(Duration::ZERO))
    }

    /// The delay asked for, if the hint allows a retry at all.
    pub fn delay(self) -> Option<Duration> {
        match self {
            ServerHint::RetryAfter(d) | ServerHint::Pushback(d) => Some(d),
            ServerHint::DoNotRetry => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn backstops_no_retry_header_wins_over_both_others() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, hv("5"));
        headers.insert(GRPC_RETRY_PUSHBACK_MS, hv("100"));
        let now = SystemTime::now();
        assert_eq!(
            ServerHint::from_headers(&headers, now),
            Some(ServerHint::Pushback(Duration::from_millis(100)))
        );
        headers.insert(NO_RETRY, hv("1"));
        assert_eq!(
            ServerHint::from_headers(&headers, now),
            Some(ServerHint::DoNotRetry)
        );
        assert_eq!(ServerHint::from_headers(&HeaderMap::new(), now), None);
    }

    #[test]
    fn pushback_values() {
        assert_eq!(
            ServerHint::from_pushback(&hv("250")),
            ServerHint::Pushback(Duration::from_millis(250))
        );
        assert_eq!(
            ServerHint::from_pushback(&hv("0")),
            ServerHint::Pushback(Duration::ZERO)
        );
        assert_eq!(
            ServerHint::from_pushback(&hv("2147483647")),
            ServerHint::Pushback(Duration::from_millis(2_147_483_647))
        );
        for never in [
            "-1",
            "-250",
            "2147483648",
            "99999999999",
            "",
            "1.5",
            "abc",
            " 1",
        ] {
            assert_eq!(
                ServerHint::from_pushback(&hv(never)),
                ServerHint::DoNotRetry,
                "{never:?}"
            );
        }
    }

    #[test]
    fn retry_after_delta_seconds() {
        let now = SystemTime::UNIX_EPOCH;
        assert_eq!(
            ServerHint::from_retry_after(&hv("120"), now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            ServerHint::from_retry_after(&hv("99999999999"), now),
            Some(Duration::from_secs(99_999_999_999))
        );
        assert_eq!(
            ServerHint::from_retry_after(&hv("999999999999999999999999999"), now),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(ServerHint::from_retry_after(&hv("-5"), now), None);
        assert_eq!(ServerHint::from_retry_after(&hv("soon"), now), None);
        assert_eq!(ServerHint::from_retry_after(&hv(""), now), None);
    }

    #[test]
    fn retry_after_http_date() {
        let date = "Wed, 21 Oct 2015 07:28:00 GMT";
        let at = httpdate::parse_http_date(date).unwrap();
        let before = at - Duration::from_secs(90);
        assert_eq!(
            ServerHint::from_retry_after(&hv(date), before),
            Some(Duration::from_secs(90))
        );
        // In the past: retry now.
        let after = at + Duration::from_secs(5);
        assert_eq!(
            ServerHint::from_retry_after(&hv(date), after),
            Some(Duration::ZERO)
        );
        assert_eq!(
            ServerHint::from_retry_after(&hv("Wed, 99 Oct 2015 07:28:00 GMT"), before),
            None
        );
    }

    #[test]
    fn pushback_wins_over_retry_after() {
        let mut headers = HeaderMap::new();
        assert_eq!(
            ServerHint::from_headers(&headers, SystemTime::UNIX_EPOCH),
            None
        );
        headers.insert(RETRY_AFTER, hv("3"));
        assert_eq!(
            ServerHint::from_headers(&headers, SystemTime::UNIX_EPOCH),
            Some(ServerHint::RetryAfter(Duration::from_secs(3)))
        );
        headers.insert(GRPC_RETRY_PUSHBACK_MS, hv("-1"));
        assert_eq!(
            ServerHint::from_headers(&headers, SystemTime::UNIX_EPOCH),
            Some(ServerHint::DoNotRetry)
        );
        assert_eq!(ServerHint::DoNotRetry.delay(), None);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                let _ = ServerHint::from_pushback(&v);
                let _ = ServerHint::from_retry_after(&v, SystemTime::UNIX_EPOCH);
            }
        }
    }
}
