use std::{error::Error, fmt};

/// The request's deadline passed before it was answered, or too little of it was left to start.
///
/// Returned (boxed, as a [`BoxError`](backstop_core::BoxError)) by
/// [`PropagateDeadline`](crate::PropagateDeadline) for HTTP requests; gRPC requests get a
/// DEADLINE_EXCEEDED response instead (see the [crate docs](crate#semantics)). Use
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
/// use backstop_deadline::{is_deadline_exceeded, DeadlineExceeded};
///
/// let err: backstop_core::BoxError = Box::new(DeadlineExceeded::new());
/// assert!(is_deadline_exceeded(err.as_ref()));
/// assert!(!is_deadline_exceeded(&std::fmt::Error));
/// ```
pub fn is_deadline_exceeded(err: &(dyn Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(err) = next {
        if err.is::<DeadlineExceeded>() {
            return true;
        }
        next = err.source();
    }
    false
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
        assert_eq!(DeadlineExceeded::new().to_string(), "deadline exceeded");
    }
}
