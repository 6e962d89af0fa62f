//! gRPC status codes, header names, and detection of gRPC traffic.

use http::{HeaderMap, HeaderName, HeaderValue, header::CONTENT_TYPE};
use std::fmt;

/// `grpc-status`: the status code of a gRPC call, in trailers or a trailers-only response.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`: the human-readable status message (percent-encoded on the wire).
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-timeout`: the time the caller is still willing to wait, e.g. `250m`.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
/// `grpc-retry-pushback-ms`: how long the server asks the client to wait before a retry;
/// negative means "do not retry".
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
/// `grpc-previous-rpc-attempts`: how many attempts preceded this one (gRPC A6).
pub const GRPC_PREVIOUS_RPC_ATTEMPTS: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");

/// A gRPC status code, as defined by the gRPC specification (`doc/statuscodes.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Code {
    /// 0: not an error.
    Ok = 0,
    /// 1: the operation was cancelled, typically by the caller.
    Cancelled = 1,
    /// 2: unknown error.
    Unknown = 2,
    /// 3: the client sent an invalid argument.
    InvalidArgument = 3,
    /// 4: the deadline expired before the operation could complete.
    DeadlineExceeded = 4,
    /// 5: a requested entity was not found.
    NotFound = 5,
    /// 6: the entity the client tried to create already exists.
    AlreadyExists = 6,
    /// 7: the caller may not execute the operation.
    PermissionDenied = 7,
    /// 8: a resource (quota, memory, …) has been exhausted.
    ResourceExhausted = 8,
    /// 9: the system is not in a state required for the operation.
    FailedPrecondition = 9,
    /// 10: the operation was aborted (concurrency conflict).
    Aborted = 10,
    /// 11: the operation was attempted past the valid range.
    OutOfRange = 11,
    /// 12: the operation is not implemented or not supported.
    Unimplemented = 12,
    /// 13: an internal invariant was broken.
    Internal = 13,
    /// 14: the service is currently unavailable; usually transient.
    Unavailable = 14,
    /// 15: unrecoverable data loss or corruption.
    DataLoss = 15,
    /// 16: the request lacks valid authentication credentials.
    Unauthenticated = 16,
}

impl Code {
    /// The code for a numeric value; values outside 0–16 are [`Code::Unknown`], as the
    /// specification requires of a receiver.
    pub fn from_i32(value: i32) -> Code {
        match value {
            0 => Code::Ok,
            1 => Code::Cancelled,
            2 => Code::Unknown,
            3 => Code::InvalidArgument,
            4 => Code::DeadlineExceeded,
            5 => Code::NotFound,
            6 => Code::AlreadyExists,
            7 => Code::PermissionDenied,
            8 => Code::ResourceExhausted,
            9 => Code::FailedPrecondition,
            10 => Code::Aborted,
            11 => Code::OutOfRange,
            12 => Code::Unimplemented,
            13 => Code::Internal,
            14 => Code::Unavailable,
            15 => Code::DataLoss,
            16 => Code::Unauthenticated,
            _ => Code::Unknown,
        }
    }

    /// Parses a `grpc-status` header value: one to three ASCII digits, nothing else.
    ///
    /// Returns `None` for a value that is not a number; a number outside 0–16 is
    /// [`Code::Unknown`].
    pub fn from_header(value: &HeaderValue) -> Option<Code> {
        let bytes = value.as_bytes();
        if bytes.is_empty() || bytes.len() > 3 || !bytes.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n = bytes
            .iter()
            .fold(0i32, |n, &b| n * 10 + i32::from(b - b'0'));
        Some(Code::from_i32(n))
    }

    /// The numeric value.
    pub fn as_i32(self) -> i32 {
        self as i32
    }

    /// The code named `name` as the gRPC specification spells it (`"UNAVAILABLE"`), or
    /// `None`.
    pub fn from_name(name: &str) -> Option<Code> {
        (0..=16)
            .map(Code::from_i32)
            .find(|code| code.name() == name)
    }

    /// The canonical name, e.g. `DEADLINE_EXCEEDED`.
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "CANCELLED",
            Code::Unknown => "UNKNOWN",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// The status of a gRPC call answered with an HTTP status and no `grpc-status` (a proxy's
    /// error page), as gRPC's `http-grpc-status-mapping.md` says: 400 → INTERNAL, 401 →
    /// UNAUTHENTICATED, 403 → PERMISSION_DENIED, 404 → UNIMPLEMENTED, 429, 502, 503 and 504 →
    /// UNAVAILABLE, any other → UNKNOWN.
    ///
    /// ```
    /// use backstop::Code;
    /// use http::StatusCode;
    ///
    /// assert_eq!(Code::of_http_status(StatusCode::SERVICE_UNAVAILABLE), Code::Unavailable);
    /// assert_eq!(Code::of_http_status(StatusCode::BAD_REQUEST), Code::Internal);
    /// assert_eq!(Code::of_http_status(StatusCode::IM_A_TEAPOT), Code::Unknown);
    /// ```
    pub fn of_http_status(status: http::StatusCode) -> Code {
        match status.as_u16() {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }

    /// The value as it is written in a `grpc-status` header.
    pub fn header_value(self) -> HeaderValue {
        const DIGITS: [&str; 17] = [
            "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
            "16",
        ];
        HeaderValue::from_static(DIGITS[self as usize])
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a message with these headers is gRPC over HTTP/2: its `content-type` is
/// `application/grpc`, alone or followed by `+format` (`application/grpc+proto`) or
/// parameters (`; charset=…`), ASCII case-insensitive. gRPC-Web (`application/grpc-web…`)
/// is not: it carries its status in the body, so it is classified as plain HTTP.
///
/// ```
/// use http::{header::CONTENT_TYPE, HeaderMap, HeaderValue};
///
/// let mut headers = HeaderMap::new();
/// assert!(!backstop::is_grpc(&headers));
/// headers.insert(CONTENT_TYPE, HeaderValue::from_static("Application/GRPC"));
/// assert!(backstop::is_grpc(&headers));
/// headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
/// assert!(!backstop::is_grpc(&headers));
/// ```
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(is_grpc_content_type)
}

/// Whether a `content-type` value is gRPC's, by the rules of [`is_grpc`](crate::is_grpc).
pub(crate) fn is_grpc_content_type(value: &HeaderValue) -> bool {
    const TYPE: &[u8] = b"application/grpc";
    let ct = value.as_bytes();
    ct.len() >= TYPE.len()
        && ct[..TYPE.len()].eq_ignore_ascii_case(TYPE)
        // `application/grpc`, `application/grpc+proto`, `application/grpc; charset=…`;
        // not `application/grpc-web` (trailers in the body) nor `application/grpcfoo`.
        && matches!(ct.get(TYPE.len()), None | Some(b'+' | b';' | b' ' | b'\t'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_its_number_and_header() {
        for n in 0..=16 {
            let code = Code::from_i32(n);
            assert_eq!(code.as_i32(), n);
            assert_eq!(Code::from_header(&code.header_value()), Some(code));
            assert_eq!(code.header_value().to_str().unwrap(), n.to_string());
        }
    }

    #[test]
    fn out_of_range_numbers_are_unknown() {
        assert_eq!(Code::from_i32(-1), Code::Unknown);
        assert_eq!(Code::from_i32(17), Code::Unknown);
        assert_eq!(
            Code::from_header(&HeaderValue::from_static("999")),
            Some(Code::Unknown)
        );
    }

    #[test]
    fn non_numeric_status_headers_are_refused() {
        for bad in ["", "1a", "-1", " 4", "4 ", "1000", "+4"] {
            assert_eq!(
                Code::from_header(&HeaderValue::from_str(bad).unwrap()),
                None,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn names_follow_the_specification() {
        assert_eq!(Code::DeadlineExceeded.to_string(), "DEADLINE_EXCEEDED");
        assert_eq!(Code::Unavailable.name(), "UNAVAILABLE");
        assert_eq!(Code::Internal.as_i32(), 13);
    }

    #[test]
    fn grpc_detection_by_content_type() {
        let mut headers = HeaderMap::new();
        for (ct, expected) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("application/grpc-web", false),
            ("application/grpc-web+proto", false),
            ("application/grpcx", false),
            ("application/grpc+json", true),
            ("application/grpc ; charset=utf-8", true),
            ("APPLICATION/GRPC;charset=utf-8", true),
            ("application/grp", false),
            ("application/json", false),
            ("text/plain", false),
        ] {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
            assert_eq!(is_grpc(&headers), expected, "{ct}");
        }
    }
}
