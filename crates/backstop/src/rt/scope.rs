//! The guard of the handler's scopes: the deadline scope (`deadline::current`) and the
//! pushback scope (`server::pushback`, whose value owns an `Arc`), one guard for both.
//!
//! **Concurrency rule.** A scope is a value in a `thread_local!` `Cell`, set while a layer
//! calls or polls its inner service and put back when the guard drops (panics included): each
//! thread sees only the scopes it is running, so the value follows the task being polled, and
//! nothing is shared between threads. Scopes nest: a guard restores what it found.

use std::cell::Cell;
use std::thread::LocalKey;

/// Sets a thread-local `Cell` for as long as it lives, then puts back the value it found.
#[must_use = "the scope ends when the guard is dropped"]
#[derive(Debug)]
pub(crate) struct Scope<T: Default + 'static> {
    key: &'static LocalKey<Cell<T>>,
    /// What the cell held when the scope was entered; taken by [`exit`](Self::exit).
    found: T,
    /// Whether `exit` already put `found` back (the drop then leaves the cell alone).
    exited: bool,
}

impl<T: Default + 'static> Scope<T> {
    /// Makes `value` the cell's value until the guard is dropped (or [`exit`](Self::exit)s).
    #[inline]
    pub(crate) fn enter(key: &'static LocalKey<Cell<T>>, value: T) -> Self {
        Self {
            key,
            found: key.replace(value),
            exited: false,
        }
    }

    /// Ends the scope now: puts back what it found, and returns the scope's value as the code
    /// run inside left it.
    #[inline]
    pub(crate) fn exit(mut self) -> T {
        self.exited = true;
        self.key.replace(std::mem::take(&mut self.found))
    }
}

impl<T: Default + Copy + 'static> Scope<T> {
    #[cfg(test)]
    /// The value the cell had when the scope was entered (what it gets back).
    #[inline]
    pub(crate) fn found(&self) -> T {
        self.found
    }
}

impl<T: Default + 'static> Drop for Scope<T> {
    #[inline]
    fn drop(&mut self) {
        if !self.exited {
            self.key.set(std::mem::take(&mut self.found));
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    thread_local! {
        static VALUE: Cell<u32> = const { Cell::new(0) };
    }

    #[test]
    fn scopes_nest_and_put_back_what_they_found() {
        let outer = Scope::enter(&VALUE, 1);
        {
            let inner = Scope::enter(&VALUE, 2);
            assert_eq!((VALUE.get(), inner.found()), (2, 1));
        }
        assert_eq!(VALUE.get(), 1);
        drop(outer);
        assert_eq!(VALUE.get(), 0);
    }

    #[test]
    fn a_panic_inside_a_scope_puts_the_value_back() {
        let caught = std::panic::catch_unwind(|| {
            let _scope = Scope::enter(&VALUE, 7);
            panic!("inside the scope");
        });
        assert!(caught.is_err());
        assert_eq!(VALUE.get(), 0);
    }

    #[test]
    fn exit_puts_back_what_it_found_and_returns_what_was_left() {
        let scope = Scope::enter(&VALUE, 4);
        VALUE.set(5);
        assert_eq!(scope.exit(), 5);
        assert_eq!(VALUE.get(), 0);
    }

    #[test]
    fn each_thread_sees_only_its_own_scopes() {
        let _scope = Scope::enter(&VALUE, 3);
        let other = std::thread::spawn(|| VALUE.get()).join().unwrap();
        assert_eq!((VALUE.get(), other), (3, 0));
    }
}
