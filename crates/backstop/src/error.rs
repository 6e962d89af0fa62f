use std::{error::Error, fmt};

/// A type-erased error, as tower and hyper use it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A configuration that cannot work, caught when the layer is built rather than at the first
/// request.
///
/// The message names the knob and the rule it broke, e.g.
/// ``invalid `fraction`: must be in (0, 1], got 1.5``.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    knob: std::borrow::Cow<'static, str>,
    reason: String,
}

impl ConfigError {
    /// A configuration error for `knob`, with the rule it broke.
    pub fn new(knob: impl Into<std::borrow::Cow<'static, str>>, reason: impl Into<String>) -> Self {
        Self {
            knob: knob.into(),
            reason: reason.into(),
        }
    }

    /// The name of the knob at fault, as its builder method spells it (or, for a
    /// configuration read from a document, the path to the field, e.g.
    /// `methodConfig[2].retryPolicy.maxAttempts`).
    pub fn knob(&self) -> &str {
        &self.knob
    }

    /// Why the value was refused.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.knob, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// The request's deadline passed before it was answered, or too little of it was left to start.
///
/// Returned (boxed, as a [`BoxError`]) by `backstop::deadline::PropagateDeadline` for HTTP
/// requests (gRPC requests get a DEADLINE_EXCEEDED response instead). A local rejection:
/// classifiers report it as [`Outcome::Rejected`](crate::Outcome::Rejected). Use
/// [`is_deadline_exceeded`] to find it anywhere in an error's source chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeadlineExceeded(());

impl DeadlineExceeded {
    /// A new `DeadlineExceeded` error.
    pub fn new() -> Self {
        Self(())
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline exceeded")
    }
}

impl Error for DeadlineExceeded {}

/// Whether `err`, or any error in its source chain, is a [`DeadlineExceeded`].
///
/// ```
/// use backstop::{is_deadline_exceeded, DeadlineExceeded};
///
/// let err: backstop::BoxError = Box::new(DeadlineExceeded::new());
/// assert!(is_deadline_exceeded(err.as_ref()));
/// assert!(!is_deadline_exceeded(&std::fmt::Error));
/// ```
pub fn is_deadline_exceeded(err: &(dyn Error + 'static)) -> bool {
    find::<DeadlineExceeded>(err).is_some()
}

/// An attempt took longer than its own bound (the client preset's attempt bound, inside the
/// breaker).
///
/// Unlike [`DeadlineExceeded`], this is a failure of the dependency, not a local rejection:
/// the request may be retried within what is left of its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttemptTimedOut(());

impl AttemptTimedOut {
    /// A new `AttemptTimedOut` error.
    pub fn new() -> Self {
        Self(())
    }
}

impl fmt::Display for AttemptTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("attempt timed out")
    }
}

impl Error for AttemptTimedOut {}

/// A circuit breaker is open: the call was refused without reaching the dependency.
///
/// Returned (boxed, as a [`BoxError`]) by `backstop::client::breaker::Breaker` for HTTP requests while
/// the breaker is open, or while half-open with every probe slot taken. A local rejection:
/// classifiers report it as [`Outcome::Rejected`](crate::Outcome::Rejected), so it is never
/// retried and never counted by another breaker. [`Rejection::BreakerOpen`](crate::Rejection)
/// turns it into the response a server answers with (UNAVAILABLE + `grpc-retry-pushback-ms`,
/// or 503 + `Retry-After`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BreakerOpen {
    retry_after: Option<std::time::Duration>,
}

impl BreakerOpen {
    /// A `BreakerOpen` error; `retry_after` is how long until the breaker lets a call through
    /// again, or `None` when no time can be promised (half-open probes in flight, slow start,
    /// forced open): callers should not retry it.
    pub fn new(retry_after: Option<std::time::Duration>) -> Self {
        Self { retry_after }
    }

    /// How long until the breaker lets a call through again; `None`: do not retry.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.retry_after
    }
}

impl fmt::Display for BreakerOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("circuit breaker open")
    }
}

impl Error for BreakerOpen {}

/// The client's adaptive throttle refused the call without sending it: the dependency has
/// accepted too few of the recent calls (see `backstop::client::overload::throttle`).
///
/// Returned (boxed, as a [`BoxError`]) for HTTP requests; gRPC requests get
/// [`Rejection::ClientThrottled`](crate::Rejection) as a response instead. A local rejection:
/// classifiers report it as [`Outcome::Rejected`](crate::Outcome::Rejected), so it is never
/// retried and never counted by a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientThrottled(());

impl ClientThrottled {
    /// A new `ClientThrottled` error.
    pub fn new() -> Self {
        Self(())
    }
}

impl fmt::Display for ClientThrottled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("throttled by client")
    }
}

impl Error for ClientThrottled {}

/// The client's bulkhead for a dependency refused the call: every permit was taken and none
/// could come before the call's deadline (or the wait was capped), or the queue of waiting
/// calls was full (see `backstop::client::overload::bulkhead`).
///
/// [`knob`](Self::knob) names the bulkhead knob that refused it: `max_concurrency` (no permit
/// could come in time for the call's deadline), `max_wait` (a call without a deadline waited
/// that long), or `max_queue` (that many calls were already waiting).
///
/// Returned (boxed, as a [`BoxError`]) for HTTP requests; gRPC requests get
/// [`Rejection::BulkheadFull`](crate::Rejection) as a response instead. A local rejection:
/// [`Outcome::Rejected`](crate::Outcome::Rejected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BulkheadFull {
    knob: &'static str,
}

impl BulkheadFull {
    /// A `BulkheadFull` error, refused by `knob` (`max_concurrency`, `max_wait` or
    /// `max_queue`).
    pub fn new(knob: &'static str) -> Self {
        Self { knob }
    }

    /// The knob that refused the call.
    pub fn knob(&self) -> &'static str {
        self.knob
    }
}

impl fmt::Display for BulkheadFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bulkhead full ({})", self.knob)
    }
}

impl Error for BulkheadFull {}

/// The first error of type `T` in `err`'s source chain, `err` itself included.
pub fn find<'a, T: Error + 'static>(err: &'a (dyn Error + 'static)) -> Option<&'a T> {
    let mut next = Some(err);
    while let Some(err) = next {
        if let Some(found) = err.downcast_ref::<T>() {
            return Some(found);
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapper(DeadlineExceeded);

    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("call failed")
        }
    }

    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn found_through_the_source_chain() {
        assert!(is_deadline_exceeded(&Wrapper(DeadlineExceeded::new())));
        assert!(find::<AttemptTimedOut>(&Wrapper(DeadlineExceeded::new())).is_none());
        assert_eq!(DeadlineExceeded::new().to_string(), "deadline exceeded");
        assert_eq!(AttemptTimedOut::new().to_string(), "attempt timed out");
        let open = BreakerOpen::new(Some(std::time::Duration::from_secs(3)));
        assert_eq!(open.to_string(), "circuit breaker open");
        assert_eq!(open.retry_after(), Some(std::time::Duration::from_secs(3)));
        assert_eq!(ClientThrottled::new().to_string(), "throttled by client");
        let full = BulkheadFull::new("max_queue");
        assert_eq!(full.to_string(), "bulkhead full (max_queue)");
        assert_eq!(full.knob(), "max_queue");
    }

    #[test]
    fn display_names_the_knob() {
        let err = ConfigError::new("max", "must be greater than zero");
        assert_eq!(err.to_string(), "invalid `max`: must be greater than zero");
        assert_eq!(err.knob(), "max");
        assert_eq!(err.reason(), "must be greater than zero");
    }
}
