//! What kind of failure a call ended with, for the `error_type` label of
//! `backstop.client.requests{outcome="failure"}` (OpenTelemetry's `error.type` idea, kept to
//! three values).

use crate::{AttemptTimedOut, BoxError, DeadlineExceeded, Rejection};
use http::Response;

/// A failure's kind, in the order of `backstop::metrics::ERROR_TYPES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorType {
    /// The dependency answered a failing status (HTTP, or gRPC in the head or the trailers).
    Status = 0,
    /// An attempt's bound or the deadline ended it (an error, or the local
    /// DEADLINE_EXCEEDED answer the attempt bound gives gRPC callers).
    Timeout = 1,
    /// No status: a connection or protocol error, a body that broke off or ended without one.
    Transport = 2,
}

impl ErrorType {
    /// The kind of the call's final result, when it is a failure.
    pub(crate) fn of<R>(result: Result<&Response<R>, &BoxError>) -> Self {
        match result {
            Ok(response) => match response.extensions().get::<Rejection>() {
                Some(Rejection::AttemptTimedOut | Rejection::DeadlineExceeded) => Self::Timeout,
                _ => Self::Status,
            },
            Err(e) => {
                let e: &(dyn std::error::Error + 'static) = &**e;
                if crate::find::<AttemptTimedOut>(e).is_some()
                    || crate::find::<DeadlineExceeded>(e).is_some()
                {
                    Self::Timeout
                } else {
                    Self::Transport
                }
            }
        }
    }
}
