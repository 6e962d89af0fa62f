//! The current deadline: [`current()`], the scope a layer or a [`Scoped`] future enters
//! while it polls, and [`DeadlineFutureExt`] to carry it into another task.

use crate::deadline::Deadline;
use pin_project_lite::pin_project;
use std::{
    cell::Cell,
    pin::Pin,
    task::{Context, Poll},
};

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
pub(crate) type Scope = crate::rt::scope::Scope<Option<Deadline>>;

/// The deadline of the request this task is working for, if any.
///
/// Inside a handler behind [`DeadlineLayer`](crate::deadline::DeadlineLayer) this is the request's
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

// `Deadline`'s one method that makes a scope lives with the scope: the value (deadline.rs)
// then knows nothing of scopes, and the two files import in one direction only.
impl Deadline {
    /// Runs `future` with this deadline as [`current`](crate::deadline::current) — or with the enclosing
    /// one where that is earlier, because an inner scope may shorten a deadline, never extend it.
    pub fn scope<F: Future>(self, future: F) -> Scoped<F> {
        Scoped::new(Some(self), future)
    }
}

impl<F> Scoped<F> {
    /// `future`, run with `deadline` as the current one (`None`: with none of its own).
    pub(crate) fn new(deadline: Option<Deadline>, future: F) -> Self {
        Self { deadline, future }
    }

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
    /// use backstop::deadline::{current, Deadline, DeadlineFutureExt};
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
        Scoped::new(current(), self)
    }
}

impl<F: Future> DeadlineFutureExt for F {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
