//! [`Deadline`]: the instant by which a request must be answered (the value; where the
//! current one lives is [`scope`](crate::deadline::scope)'s business).

use std::time::Duration;
use tokio::time::Instant;

/// About 30 years: what "no limit" saturates to, as tokio itself does for far-future timers.
pub(crate) const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The instant by which a request must be answered.
///
/// A `Deadline` is absolute (a [`tokio::time::Instant`]), so it can be handed from layer to layer
/// and task to task without drifting; what crosses the wire is the time *remaining*, written by
/// [`PropagateDeadline`](crate::deadline::PropagateDeadline) in `grpc-timeout`.
///
/// ```
/// use backstop::deadline::Deadline;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let deadline = Deadline::after(Duration::from_millis(800));
/// assert_eq!(deadline.remaining(), Duration::from_millis(800));
///
/// // The database gets min(200 ms, 40 % of what is left): 200 ms here.
/// let db = deadline.slice(0.4, Duration::from_millis(200));
/// assert_eq!(db.remaining(), Duration::from_millis(200));
///
/// tokio::time::advance(Duration::from_millis(800)).await;
/// assert!(deadline.is_expired());
/// assert_eq!(deadline.remaining(), Duration::ZERO);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline {
    at: Instant,
}

impl Deadline {
    /// A deadline at `instant`.
    pub fn at(instant: Instant) -> Self {
        Self { at: instant }
    }

    /// A deadline `timeout` from now. A timeout too large for the clock saturates to about
    /// 30 years from now instead of panicking.
    pub fn after(timeout: Duration) -> Self {
        Self::after_from(Instant::now(), timeout)
    }

    pub(crate) fn after_from(now: Instant, timeout: Duration) -> Self {
        let timeout = timeout.min(FAR_FUTURE);
        let at = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(86_400));
        Self { at }
    }

    /// The instant of the deadline.
    pub fn instant(&self) -> Instant {
        self.at
    }

    /// The time left until the deadline, zero once it has passed.
    pub fn remaining(&self) -> Duration {
        self.remaining_at(Instant::now())
    }

    pub(crate) fn remaining_at(&self, now: Instant) -> Duration {
        self.at.saturating_duration_since(now)
    }

    /// Whether the deadline has passed (a deadline at exactly now has passed).
    pub fn is_expired(&self) -> bool {
        self.at <= Instant::now()
    }

    /// The earlier of two deadlines.
    #[must_use]
    pub fn min(self, other: Deadline) -> Deadline {
        if other.at < self.at { other } else { self }
    }

    /// A child deadline: `min(cap, fraction × remaining)` from now, so a call made with it can
    /// never outlive its parent ("the DB gets min(200 ms, 40 % of what is left)").
    ///
    /// `fraction` is clamped to `[0, 1]` (NaN counts as 0), so the slice is never later than
    /// `self`.
    #[must_use]
    pub fn slice(&self, fraction: f64, cap: Duration) -> Deadline {
        let now = Instant::now();
        let part = scale(self.remaining_at(now), fraction);
        Deadline::after_from(now, part.min(cap)).min(*self)
    }
}

/// `d × fraction`, with the fraction clamped to [0, 1] and NaN as 0.
pub(crate) fn scale(d: Duration, fraction: f64) -> Duration {
    if fraction.is_nan() || fraction <= 0.0 {
        Duration::ZERO
    } else if fraction >= 1.0 {
        d
    } else {
        d.mul_f64(fraction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    #[tokio::test(start_paused = true)]
    async fn remaining_counts_down_and_saturates() {
        let d = Deadline::after(Duration::from_millis(100));
        assert!(!d.is_expired());
        advance(Duration::from_millis(60)).await;
        assert_eq!(d.remaining(), Duration::from_millis(40));
        advance(Duration::from_millis(40)).await;
        assert!(d.is_expired());
        advance(Duration::from_millis(40)).await;
        assert_eq!(d.remaining(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn huge_timeouts_do_not_panic() {
        let d = Deadline::after(Duration::MAX);
        assert!(d.remaining() >= Duration::from_secs(86_400 * 365));
        let d = Deadline::after(Duration::from_secs(99_999_999 * 3600));
        assert!(!d.is_expired());
    }

    #[tokio::test(start_paused = true)]
    async fn min_picks_the_earlier() {
        let a = Deadline::after(Duration::from_millis(10));
        let b = Deadline::after(Duration::from_millis(20));
        assert_eq!(a.min(b), a);
        assert_eq!(b.min(a), a);
        assert!(a < b);
    }

    #[tokio::test(start_paused = true)]
    async fn slice_takes_a_fraction_or_the_cap_and_never_more() {
        let d = Deadline::after(Duration::from_millis(1000));
        assert_eq!(
            d.slice(0.4, Duration::from_secs(10)).remaining(),
            Duration::from_millis(400)
        );
        assert_eq!(
            d.slice(0.4, Duration::from_millis(100)).remaining(),
            Duration::from_millis(100)
        );
        assert_eq!(d.slice(7.0, Duration::MAX), d);
        assert_eq!(d.slice(f64::NAN, Duration::MAX).remaining(), Duration::ZERO);
        assert_eq!(d.slice(-1.0, Duration::MAX).remaining(), Duration::ZERO);
        advance(Duration::from_millis(500)).await;
        assert_eq!(
            d.slice(0.5, Duration::MAX).remaining(),
            Duration::from_millis(250)
        );
    }
}
