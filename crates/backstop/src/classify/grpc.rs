//! [`GrpcClassifier`]: what a gRPC status means, from the headers or the trailers.

use super::{Classify, Outcome, Retryable, classify_error, hint_in};
use crate::wire::grpc::{Code, GRPC_STATUS};
use crate::{Rejection, is_grpc};
use http::{HeaderMap, Response, StatusCode};
use std::error::Error;

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
/// A non-200 HTTP status without `grpc-status` maps as the gRPC specification says
/// ([`Code::of_http_status`]: 400 → INTERNAL; 401 → UNAUTHENTICATED; 403 →
/// PERMISSION_DENIED; 404 → UNIMPLEMENTED; 429, 502, 503, 504 → UNAVAILABLE; others →
/// UNKNOWN). Errors as [`classify_error`].
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
}

impl GrpcClassifier {
    /// The outcome the headers decide, or `None` for a gRPC stream committed by its headers
    /// (a success so far; the trailers decide): `classify` and `awaits_trailers` in one pass.
    fn head<B>(&self, response: &Response<B>) -> Option<Outcome> {
        if response.extensions().get::<Rejection>().is_some() {
            return Some(Outcome::Rejected);
        }
        if let Some(code) = response.headers().get(GRPC_STATUS).map(Code::from_header) {
            return Some(self.classify_code(code.unwrap_or(Code::Unknown), response.headers()));
        }
        if response.status() != StatusCode::OK {
            let code = Code::of_http_status(response.status());
            return Some(self.classify_code(code, response.headers()));
        }
        if !is_grpc(response.headers()) && !response.headers().is_empty() {
            // A 200 that is not gRPC at all: the peer is not a gRPC server.
            return Some(self.classify_code(Code::Unknown, response.headers()));
        }
        None
    }
}

impl<B> Classify<Response<B>> for GrpcClassifier {
    fn classify(&self, result: Result<&Response<B>, &(dyn Error + 'static)>) -> Outcome {
        match result {
            Ok(response) => self.head(response).unwrap_or(Outcome::Success),
            Err(e) => classify_error(e),
        }
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

    fn classify_head(&self, response: &Response<B>) -> Option<Outcome> {
        self.head(response)
    }
}

/// Whether a response is a gRPC *trailers-only* response: its status is already in the
/// headers, so the call is over when the headers arrive.
pub fn is_trailers_only<B>(response: &Response<B>) -> bool {
    response.headers().contains_key(GRPC_STATUS)
}
