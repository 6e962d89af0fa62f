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

mod error;
mod grpc;
mod http;
#[cfg(test)]
mod tests;

pub use error::classify_error;
pub use grpc::{GrpcClassifier, is_trailers_only};
pub use http::HttpClassifier;

use crate::ServerHint;
use ::http::HeaderMap;
use std::{error::Error, time::SystemTime};

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

    /// What a layer that must know the final outcome asks of a response: `Some(outcome)` when
    /// its headers decide it, `None` when the outcome is still to come in the trailers (a
    /// success so far, which [`awaits_trailers`](Self::awaits_trailers)).
    ///
    /// The default asks [`classify`](Self::classify) and, of a success, `awaits_trailers`. A
    /// classifier that reads the same headers for both overrides it to read them once
    /// ([`GrpcClassifier`] does: one lookup of `grpc-status` where the two took two); the
    /// answer must be the same as the default's.
    fn classify_head(&self, response: &Res) -> Option<Outcome> {
        let outcome = self.classify(Ok(response));
        if outcome == Outcome::Success && self.awaits_trailers(response) {
            return None;
        }
        Some(outcome)
    }
}

/// The server's hint in a response's headers, read once per classification.
fn hint_in(headers: &HeaderMap) -> Option<ServerHint> {
    ServerHint::from_headers(headers, SystemTime::now())
}
