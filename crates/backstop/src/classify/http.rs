//! [`HttpClassifier`]: what an HTTP response means.

use super::{Classify, Outcome, Retryable, classify_error, hint_in};
use crate::Rejection;
use http::{HeaderMap, Response, StatusCode};
use std::error::Error;

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

    // HTTP has no trailers that decide: the headers always do.
    #[inline]
    fn classify_head(&self, r: &Response<B>) -> Option<Outcome> {
        Some(self.classify(Ok(r)))
    }
}
