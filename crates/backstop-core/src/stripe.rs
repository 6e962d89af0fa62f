//! Striping: spreading a shared counter over one cache line per core, so threads that count
//! at the same time do not fight over one line.
//!
//! A breaker's window and a retry budget are written by every call. One atomic word written by
//! every thread moves between cores on each write, and two threads then make barely more calls
//! than one. Striped, each thread writes to the copy of its stripe and readers add the copies
//! up: reads (rare: a failure, a snapshot) cost more, writes (every call) scale.

use std::{
    cell::Cell,
    sync::atomic::{AtomicUsize, Ordering},
};

/// How many stripes a shared structure should have: one per available core, at most 16.
pub fn count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(16))
}

/// The calling thread's stripe number: threads are numbered round-robin on first use. Take
/// it modulo the structure's stripe count.
pub fn index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<Option<usize>> = const { Cell::new(None) };
    }
    STRIPE.with(|cell| {
        cell.get().unwrap_or_else(|| {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            cell.set(Some(n));
            n
        })
    })
}

/// A value alone on its cache lines (128 bytes: a line and its adjacent-line prefetch pair).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_stripe_and_threads_differ() {
        let mine = index();
        assert_eq!(index(), mine);
        let theirs = std::thread::spawn(index).join().unwrap();
        assert_ne!(theirs, mine);
        assert!((1..=16).contains(&count()));
        assert_eq!(std::mem::align_of::<Padded<u8>>(), 128);
    }
}
