//! What a retry layer tells the layers inside it about an attempt, on the request.

/// A request extension: no retry or hedge will follow this attempt if it runs out of time,
/// so a layer bounding it may give it all that is left of the deadline.
///
/// The retry layer puts it on a call it sends once (`max_attempts(1)`, or a body too long to
/// keep), on its last attempt and its last hedge by count, and on every attempt of a request
/// whose attempt timeouts its policy does not retry (the classifier makes an attempt timeout
/// retryable only if idempotent, and the request is not: every gRPC call by default). An
/// adaptive attempt bound (`backstop::client::attempt`) then takes the whole deadline
/// instead of its share, the share having been kept only to leave room for a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct FinalAttempt;

impl FinalAttempt {
    /// Whether `req` carries the mark.
    pub(crate) fn is_on<B>(req: &http::Request<B>) -> bool {
        req.extensions().get::<FinalAttempt>().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::FinalAttempt;

    #[test]
    fn the_mark_is_seen_on_the_request_that_carries_it() {
        let mut req = http::Request::new(());
        assert!(!FinalAttempt::is_on(&req));
        req.extensions_mut().insert(FinalAttempt);
        assert!(FinalAttempt::is_on(&req));
    }
}
