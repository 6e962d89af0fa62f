//! The layer's own answers: problem details (RFC 9457, `application/problem+json`).

use crate::idempotency::body::IdempotencyBody;
use crate::idempotency::record::{Fingerprint, StoredResponse};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body::Body;

/// Why the layer answered without running the handler (or beside it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Problem {
    Missing,
    BadKey(crate::idempotency::KeyError),
    BodyTooLarge(usize),
    BodyUnreadable,
    /// The key's claim is in flight; come back in this many seconds (`Retry-After`).
    InFlight(u64),
    Mismatch,
    StoreDown(u64),
    /// The key's request ran, but left no answer to keep (too large, trailers, a body that
    /// failed, a handler error or panic, a request dropped while its handler ran): stored in
    /// place of the answer, so the handler never runs again for the key. No `Retry-After`:
    /// coming back later does not help.
    Unreplayable,
}

impl Problem {
    fn status(self) -> StatusCode {
        match self {
            Problem::Missing | Problem::BadKey(_) | Problem::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Problem::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::InFlight(_) | Problem::Unreplayable => StatusCode::CONFLICT,
            Problem::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::StoreDown(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn title(self) -> &'static str {
        match self {
            Problem::Missing => "Idempotency-Key is missing",
            Problem::BadKey(_) => "Idempotency-Key is invalid",
            Problem::BodyTooLarge(_) => "Request body too large to fingerprint",
            Problem::BodyUnreadable => "Request body could not be read",
            Problem::InFlight(_) => "A request with this Idempotency-Key is being processed",
            Problem::Mismatch => "Idempotency-Key is already used",
            Problem::StoreDown(_) => "Idempotency store unavailable",
            Problem::Unreplayable => "The request with this Idempotency-Key was processed",
        }
    }

    fn detail(self) -> String {
        match self {
            Problem::Missing => "This operation requires an Idempotency-Key header.".into(),
            Problem::BadKey(e) => format!("{e}."),
            Problem::BodyTooLarge(n) => {
                format!("A request with an Idempotency-Key may have at most {n} bytes of body.")
            }
            Problem::BodyUnreadable => "The request body ended with an error.".into(),
            Problem::InFlight(_) => {
                "The first request with this key has not finished; retry later.".into()
            }
            Problem::Mismatch => {
                "This key was used by a different request (method, path or body).".into()
            }
            Problem::StoreDown(_) => {
                "The request was not processed: its key could not be recorded. Retry later.".into()
            }
            Problem::Unreplayable => {
                "It ran, but left no answer to replay (too large to keep, trailers, a failed body, a handler error, or cancelled while it ran); the request is not run again.".into()
            }
        }
    }

    pub(crate) fn into_response<B: Body>(self) -> Response<IdempotencyBody<B>> {
        let (status, headers, body) = self.into_parts();
        let mut response = Response::new(IdempotencyBody::full(body));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        if self != Problem::Unreplayable {
            // Answered without running the handler: an idempotency layer further out (over
            // another store) releases its claim too.
            response.extensions_mut().insert(crate::NotExecuted);
        }
        response
    }

    /// The answer as a record to store in place of the handler's (for
    /// [`Problem::Unreplayable`]).
    pub(crate) fn into_record(self, fingerprint: Fingerprint) -> StoredResponse {
        let (status, headers, body) = self.into_parts();
        StoredResponse {
            fingerprint,
            status,
            headers,
            body,
        }
    }

    fn into_parts(self) -> (StatusCode, HeaderMap, Bytes) {
        let status = self.status();
        let body = format!(
            "{{\"type\":\"about:blank\",\"title\":\"{}\",\"status\":{},\"detail\":\"{}\"}}",
            self.title(),
            status.as_u16(),
            // Our own text: no character to escape but the quote.
            self.detail().replace('"', "\\\"")
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Problem::StoreDown(secs) | Problem::InFlight(secs) = self {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        (status, headers, Bytes::from(body))
    }
}
