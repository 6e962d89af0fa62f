//! What a retry must have left to be worth starting: the trait the retry layer reads; a fixed
//! `Duration`, the attempt bound's measured latency, or your own implement it (as with
//! [`HedgeDelay`](crate::client::retry::hedge::HedgeDelay)).

use std::{fmt, time::Duration};

/// How much of the deadline a retry needs to have a fair chance of finishing.
///
/// A `Duration` is a fixed reserve; `backstop::client::attempt::AttemptTimeoutLayer::retry_reserve`
/// offers one read from the dependency's measured latency (the client presets use its p50:
/// a retry that the median call could not finish in the time left is not started). Called once
/// per retry the other rules allow, on the retry path only; `None` (the model is not trusted
/// yet) asks for no reserve.
///
/// ```
/// use backstop::client::retry::RetryReserve;
/// use std::time::Duration;
///
/// assert_eq!(Duration::from_millis(40).reserve(), Some(Duration::from_millis(40)));
/// ```
pub trait RetryReserve: fmt::Debug + Send + Sync {
    /// The least time a retry needs, or `None` for no reserve now.
    fn reserve(&self) -> Option<Duration>;

    /// The least time a retry of a request with this method and URI needs: a reserve kept
    /// per route (a keyed attempt layer's) answers here; the default is
    /// [`reserve`](Self::reserve). The retry layer calls this one.
    fn reserve_for(&self, method: &http::Method, uri: &http::Uri) -> Option<Duration> {
        let _ = (method, uri);
        self.reserve()
    }
}

impl RetryReserve for Duration {
    fn reserve(&self) -> Option<Duration> {
        Some(*self)
    }
}
