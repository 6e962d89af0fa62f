//! What a retry layer tells the layers inside it about an attempt, on the request.

/// A request extension: no retry or hedge will follow this attempt if it runs out of time,
/// so a layer bounding it may give it all that is left of the deadline.
///
/// The retry layer puts it on a call it sends once (`max_attempts(1)`, or a body too long to
/// keep), on its last attempt and its last hedge by count, and on every attempt of a request
/// whose attempt timeouts its policy does not retry (the classifier makes an attempt timeout
/// retryable only if idempotent, and the request is not: every gRPC call by default). An
/// adaptive attempt bound (`backstop_deadline::attempt`) then takes the whole deadline
/// instead of its share, the share having been kept only to leave room for a retry. A caller
/// may put it on a request itself.
///
/// ```
/// use backstop_core::FinalAttempt;
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(FinalAttempt);
/// assert!(FinalAttempt::is_on(&req));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FinalAttempt;

impl FinalAttempt {
    /// Whether `req` carries the mark.
    pub fn is_on<B>(req: &http::Request<B>) -> bool {
        req.extensions().get::<FinalAttempt>().is_some()
    }
}
