//! What a call did, told to its caller: on the response as an extension, on the error inside
//! [`RetryError`](crate::RetryError).

use crate::GiveUp;
use backstop_core::Rejection;

/// What one call through a [`Retry`](crate::Retry) did: how many attempts it sent and, when it
/// ended on a failure the layer did not retry, why.
///
/// A response carries one as an **extension**, so it survives any layer or body wrapping
/// around the retry layer and reaches a tonic generated client's
/// `tonic::Response::extensions()`; an error carries it inside its
/// [`RetryError`](crate::RetryError) ([`RetryError::info`](crate::RetryError::info)).
///
/// The layer puts it on every response with something to tell: a call that took more than
/// one attempt, one it gave up on ([`gave_up`](Self::gave_up) is `Some`), and a local
/// rejection (an open breaker's answer, which carries a
/// [`Rejection`](backstop_core::Rejection)). A response of a retry layer without one is the
/// answer of the call's one and only attempt, as if it carried `CallInfo::new(1, None)`:
/// the common case keeps its path free of the extension map's allocation (about 800
/// instructions a call).
///
/// ```
/// use backstop_retry::{CallInfo, GiveUp, RetryError};
///
/// # let response = {
/// #     let mut r = http::Response::new(());
/// #     r.extensions_mut().insert(CallInfo::new(2, None));
/// #     r
/// # };
/// // A response of a retry layer (or of any stack with one in it):
/// assert_eq!(CallInfo::of(&response).attempts(), 2);
/// // The answer of a call's only attempt carries none:
/// assert_eq!(CallInfo::of(&http::Response::new(())), CallInfo::new(1, None));
///
/// // An error of one: the same, found anywhere in the source chain.
/// let err: backstop_core::BoxError =
///     Box::new(RetryError::new(3, Some(GiveUp::Budget), "reset".into()));
/// let info = backstop_core::find::<RetryError>(&*err).map(RetryError::info);
/// assert_eq!(info, Some(CallInfo::new(3, Some(GiveUp::Budget))));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallInfo {
    attempts: u32,
    gave_up: Option<GiveUp>,
}

impl CallInfo {
    /// The record of a call that sent `attempts` and gave up for `gave_up` (for tests of
    /// code that reads it; the layer makes its own).
    pub const fn new(attempts: u32, gave_up: Option<GiveUp>) -> Self {
        Self { attempts, gave_up }
    }

    /// What `response`, returned by a stack with a retry layer in it, says of its call: its
    /// extension, or, without one, the call's one attempt (`CallInfo::new(1, None)`), or no
    /// attempt at all (`CallInfo::new(0, None)`) for a local rejection made outside the retry
    /// layer (a deadline spent before the call reached it).
    pub fn of<B>(response: &http::Response<B>) -> Self {
        let extensions = response.extensions();
        match extensions.get::<Self>() {
            Some(info) => *info,
            None if extensions.get::<Rejection>().is_some() => Self::new(0, None),
            None => Self::new(1, None),
        }
    }

    /// Attempts the call sent, the first included (hedges count as attempts); 0 when its
    /// deadline had passed before any was sent.
    pub const fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Why no further attempt was made, when the call ended on a failure the layer could
    /// have retried or whose retry it refused ([`GiveUp`], the reason its stats and metrics
    /// count); `None` for a success, and for an answer that was never a candidate (a client
    /// error, an open breaker).
    pub const fn gave_up(&self) -> Option<GiveUp> {
        self.gave_up
    }
}
