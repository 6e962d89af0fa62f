//! The error of a call the retry layer returns: the last attempt's error, with what the call
//! did.

use crate::BoxError;
use crate::client::retry::{CallInfo, GiveUp};
use std::{error::Error, fmt};

/// The error a [`Retry`](crate::client::retry::Retry) call ends with: the last attempt's error (its
/// [`source`](Error::source), and [`into_inner`](Self::into_inner)), with how many attempts the
/// call took and, when the failure was one the layer could have retried, why it did not.
///
/// Its `Display` says only that (`2 attempts, not retried: budget`), as the error conventions
/// ask: the last error is the source, so a reporter that prints the chain prints both. Tests
/// for an error in the chain (`backstop::find`, `backstop::is_breaker_open`,
/// `is_deadline_exceeded`, `is_attempt_timed_out`) see through it; so do backstop's
/// classifiers and tonic's `Status::from_error`.
///
/// ```
/// use backstop::client::retry::{GiveUp, RetryError};
///
/// let err = RetryError::new(3, Some(GiveUp::Attempts), "connection reset".into());
/// assert_eq!(err.to_string(), "3 attempts, not retried: attempts");
/// assert_eq!(err.source_ref().to_string(), "connection reset");
/// let err: backstop::BoxError = Box::new(err);
/// let info = backstop::find::<RetryError>(&*err).unwrap();
/// assert_eq!((info.attempts(), info.gave_up()), (3, Some(GiveUp::Attempts)));
/// ```
#[derive(Debug)]
pub struct RetryError {
    info: CallInfo,
    source: BoxError,
}

impl RetryError {
    /// The error of a call that took `attempts` and gave up for `gave_up`, ending with
    /// `source`.
    pub fn new(attempts: u32, gave_up: Option<GiveUp>, source: BoxError) -> Self {
        Self {
            info: CallInfo::new(attempts, gave_up),
            source,
        }
    }

    /// What the call did, as a response's [`CallInfo`] extension says it for a response.
    pub fn info(&self) -> CallInfo {
        self.info
    }

    /// Attempts the call sent, the first included (hedges count); 0 when its deadline had
    /// passed before any was sent.
    pub fn attempts(&self) -> u32 {
        self.info.attempts()
    }

    /// Why no further attempt was made, when the last error was one the layer could have
    /// retried; `None` for an error that was never a candidate (e.g. an open breaker, which
    /// its callers must not retry either).
    pub fn gave_up(&self) -> Option<GiveUp> {
        self.info.gave_up()
    }

    /// The last attempt's error.
    pub fn source_ref(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.source
    }

    /// The last attempt's error, unwrapped.
    pub fn into_inner(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for RetryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attempts = self.info.attempts();
        let plural = if attempts == 1 { "" } else { "s" };
        write!(f, "{attempts} attempt{plural}")?;
        match self.info.gave_up() {
            Some(why) => write!(f, ", not retried: {why}"),
            None => Ok(()),
        }
    }
}

impl Error for RetryError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}
