use pin_project_lite::pin_project;
use std::{
    cell::Cell,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::Instant;

/// About 30 years: what "no limit" saturates to, as tokio itself does for far-future timers.
pub(crate) const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The instant by which a request must be answered.
///
/// A `Deadline` is absolute (a [`tokio::time::Instant`]), so it can be handed from layer to layer
/// and task to task without drifting; what crosses the wire is the time *remaining*, written by
/// [`PropagateDeadline`](crate::PropagateDeadline) in `grpc-timeout`.
///
/// ```
/// use backstop_deadline::Deadline;
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

    /// Runs `future` with this deadline as [`current`](crate::current) — or with the enclosing
    /// one where that is earlier, because an inner scope may shorten a deadline, never extend it.
    pub fn scope<F: Future>(self, future: F) -> Scoped<F> {
        Scoped {
            deadline: Some(self),
            future,
        }
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

// The current deadline lives in a thread-local that is set only while a scope runs: a
// `PropagateDeadline` or `Deadline` layer calling its inner service, a poll of one of their
// futures or of a `Scoped` future. So it follows the task being polled, as a tokio
// `task_local!` would, at the cost of a plain thread-local read (a `task_local!` is a
// `RefCell` behind a lazily initialised key). Nothing is shared between threads: each thread
// sees only the scopes it is running, and a scope puts back what it found when it ends, panics
// included. It is what user code (a handler) reads with [`current()`] and what the outermost
// client layer inherits; backstop's layers never use it to talk to each other: what one layer
// tells another about a request travels on the request (its `Deadline` extension, its
// `grpc-timeout` header), so it survives a `Buffer` or a spawned task between them.
thread_local! {
    static CURRENT: Cell<Option<Deadline>> = const { Cell::new(None) };
}

/// A scope entered by [`enter`]: puts back the value it found when dropped (also when what
/// ran inside panicked). A guard rather than a closure, so the request going in and the
/// result coming out are not moved through one.
pub(crate) type Scope = backstop_core::__private::scope::Scope<Option<Deadline>>;

/// The deadline of the request this task is working for, if any.
///
/// Inside a handler behind [`DeadlineLayer`](crate::DeadlineLayer) this is the request's
/// deadline; inside [`Deadline::scope`] it is that deadline. A task spawned from a handler does
/// not inherit it: wrap the spawned future with
/// [`with_current_deadline`](DeadlineFutureExt::with_current_deadline), or put the deadline in
/// the request's extensions (`req.extensions_mut().insert(deadline)`), which every backstop
/// client layer reads wherever the request goes.
pub fn current() -> Option<Deadline> {
    CURRENT.get()
}

/// Makes `deadline` the current deadline (or keeps the enclosing one where that is earlier)
/// until the guard is dropped.
#[inline]
pub(crate) fn enter(deadline: Deadline) -> Scope {
    let deadline = match CURRENT.get() {
        Some(outer) if outer < deadline => outer,
        _ => deadline,
    };
    Scope::enter(&CURRENT, Some(deadline))
}

/// As [`enter`], for a `deadline` picked no later than the current one (`PropagateDeadline`'s,
/// which starts from it): no second read of it.
#[inline]
pub(crate) fn enter_picked(deadline: Deadline) -> Scope {
    debug_assert!(current().is_none_or(|outer| deadline <= outer));
    Scope::enter(&CURRENT, Some(deadline))
}

pin_project! {
    /// A future that runs with a deadline as [`current()`]; see [`Deadline::scope`] and
    /// [`DeadlineFutureExt::with_current_deadline`].
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct Scoped<F> {
        deadline: Option<Deadline>,
        #[pin]
        future: F,
    }
}

impl<F> Scoped<F> {
    /// The deadline this future runs with (before any enclosing scope shortens it).
    pub fn deadline(&self) -> Option<Deadline> {
        self.deadline
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        match *this.deadline {
            None => this.future.poll(cx),
            Some(own) => {
                // No timer here: a hand-set scope bounds nothing by itself.
                let _scope = enter(own);
                this.future.poll(cx)
            }
        }
    }
}

/// Carries the current deadline into futures that run elsewhere, such as spawned tasks.
pub trait DeadlineFutureExt: Future + Sized {
    /// Captures [`current()`] now, and runs `self` with it as the current deadline wherever it is
    /// polled later.
    ///
    /// ```
    /// use backstop_deadline::{current, Deadline, DeadlineFutureExt};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let deadline = Deadline::after(Duration::from_secs(1));
    /// deadline
    ///     .scope(async move {
    ///         let task = tokio::spawn(async { current() }.with_current_deadline());
    ///         assert_eq!(task.await.unwrap(), Some(deadline));
    ///         // Without it, a spawned task starts with no deadline.
    ///         assert_eq!(tokio::spawn(async { current() }).await.unwrap(), None);
    ///     })
    ///     .await;
    /// # }
    /// ```
    fn with_current_deadline(self) -> Scoped<Self> {
        Scoped {
            deadline: current(),
            future: self,
        }
    }
}

impl<F: Future> DeadlineFutureExt for F {}

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

    #[tokio::test(start_paused = true)]
    async fn scopes_nest_and_only_shorten() {
        assert_eq!(current(), None);
        let outer = Deadline::after(Duration::from_millis(100));
        let longer = Deadline::after(Duration::from_millis(500));
        let shorter = Deadline::after(Duration::from_millis(50));
        outer
            .scope(async move {
                assert_eq!(current(), Some(outer));
                assert_eq!(longer.scope(async { current() }).await, Some(outer));
                assert_eq!(shorter.scope(async { current() }).await, Some(shorter));
                assert_eq!(current(), Some(outer));
            })
            .await;
        assert_eq!(current(), None);
    }

    /// A scope's guard puts back what it found: nested scopes unwind in order, and a panic
    /// inside a scope leaves no deadline behind.
    #[tokio::test(start_paused = true)]
    async fn scope_guards_put_back_what_they_found_even_on_panic() {
        let outer = Deadline::after(Duration::from_millis(100));
        let inner = Deadline::after(Duration::from_millis(50));
        {
            let _outer = enter(outer);
            {
                let _inner = enter_picked(inner);
                assert_eq!(current(), Some(inner));
            }
            assert_eq!(current(), Some(outer));
        }
        assert_eq!(current(), None);
        let panicked = std::panic::catch_unwind(|| {
            let _scope = enter(outer);
            panic!("inside a scope");
        });
        assert!(panicked.is_err());
        assert_eq!(current(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn with_current_deadline_outside_any_scope_is_none() {
        let fut = async { current() }.with_current_deadline();
        assert_eq!(fut.deadline(), None);
        assert_eq!(fut.await, None);
    }
}
