//! Where a hedge's delay comes from: the trait the retry layer's hedging reads; a fixed
//! `Duration`, the attempt bound's measured delay, or your own implement it.

use std::{fmt, time::Duration};

/// Where the delay before the next hedge comes from.
///
/// A `Duration` is a fixed delay; `backstop::client::attempt::AttemptTimeoutLayer::hedge_delay`
/// offers one read from the dependency's measured latency. Called once per hedge, on the
/// hedging path only.
///
/// ```
/// use backstop::client::retry::hedge::HedgeDelay;
/// use std::time::Duration;
///
/// /// No hedge at night, 50 ms by day (the hour supplied by the application).
/// #[derive(Debug)]
/// struct DayOnly(fn() -> u32);
///
/// impl HedgeDelay for DayOnly {
///     fn delay(&self) -> Option<Duration> {
///         (8..20).contains(&(self.0)()).then(|| Duration::from_millis(50))
///     }
/// }
///
/// assert_eq!(DayOnly(|| 12).delay(), Some(Duration::from_millis(50)));
/// assert_eq!(DayOnly(|| 2).delay(), None);
/// assert_eq!(Duration::from_millis(40).delay(), Some(Duration::from_millis(40)));
/// ```
pub trait HedgeDelay: fmt::Debug + Send + Sync {
    /// The delay before the next hedge, or `None` to send no hedge now.
    fn delay(&self) -> Option<Duration>;

    /// The delay before the next hedge of a request with this method and URI: a delay kept
    /// per route (a keyed attempt layer's, from the route's own model) answers here; the
    /// default is [`delay`](Self::delay). The retry layer's hedging calls this one.
    fn delay_for(&self, method: &http::Method, uri: &http::Uri) -> Option<Duration> {
        let _ = (method, uri);
        self.delay()
    }
}

impl HedgeDelay for Duration {
    fn delay(&self) -> Option<Duration> {
        Some(*self)
    }
}
