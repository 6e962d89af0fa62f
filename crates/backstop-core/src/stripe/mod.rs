//! Striping: spreading a shared counter over one cache line per core, so threads that count
//! at the same time do not fight over one line.
//!
//! A breaker's window and a retry budget are written by every call. One atomic word written by
//! every thread moves between cores on each write, and two threads then make barely more calls
//! than one. Striped, each thread writes to the copy of its stripe and readers add the copies
//! up: reads (rare: a failure, a snapshot) cost more, writes (every call) scale.
//!
//! [`Ring`] is the striped ring of time slots both of those are built on.

pub mod ring;

pub use ring::{Ring, Update, Word};

use std::{
    cell::Cell,
    fmt,
    ops::Deref,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
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

/// Words from one stripe's copy of a `len`-word array to the next, in a flat array of
/// `stripes` copies: `len` alone when there is one stripe; otherwise `len` rounded up to a
/// cache line (8 words) plus one line of padding, so no two stripes write to one line.
pub fn stride(len: usize, stripes: usize) -> usize {
    if stripes <= 1 {
        len
    } else {
        len.div_ceil(8) * 8 + 8
    }
}

/// One [`Handle`] per stripe to a shared value.
///
/// A layer's service hands each call the calling thread's handle, and the call's future holds
/// it (an `Arc` clone) until it ends: the reference count that every call bumps is then shared
/// only by the threads of one stripe, not by every thread that uses the layer.
pub struct Handles<T> {
    all: Arc<[Arc<Handle<T>>]>,
}

impl<T> Handles<T> {
    /// A handle per stripe ([`count`]) to `shared`.
    pub fn new(shared: &Arc<T>) -> Self {
        Self {
            all: (0..count())
                .map(|stripe| {
                    Arc::new(Handle {
                        shared: shared.clone(),
                        stripe,
                    })
                })
                .collect(),
        }
    }

    /// The calling thread's handle.
    pub fn current(&self) -> &Arc<Handle<T>> {
        &self.all[index() % self.all.len()]
    }

    /// How many stripes (and handles) there are.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Never: there is at least one stripe.
    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }
}

impl<T> Clone for Handles<T> {
    fn clone(&self) -> Self {
        Self {
            all: self.all.clone(),
        }
    }
}

impl<T> fmt::Debug for Handles<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handles")
            .field("stripes", &self.all.len())
            .finish()
    }
}

/// A stripe's handle to a shared value: an allocation of its own, aligned to a pair of cache
/// lines, that dereferences to the value.
#[repr(align(128))]
pub struct Handle<T> {
    shared: Arc<T>,
    stripe: usize,
}

impl<T> Handle<T> {
    /// The stripe this handle belongs to.
    pub fn stripe(&self) -> usize {
        self.stripe
    }
}

impl<T> Deref for Handle<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.shared
    }
}

impl<T> fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("stripe", &self.stripe)
            .finish_non_exhaustive()
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

    #[test]
    fn handles_share_one_value_and_sit_apart() {
        let shared = Arc::new(7u32);
        let handles = Handles::new(&shared);
        assert_eq!(handles.len(), count());
        assert_eq!(***handles.current(), 7);
        assert_eq!(handles.current().stripe(), index() % count());
        assert_eq!(Arc::strong_count(&shared), 1 + count());
        assert_eq!(std::mem::align_of::<Handle<u32>>(), 128);
        assert_eq!(stride(10, 1), 10);
        assert_eq!(stride(10, 2), 24);
        assert_eq!(stride(16, 4), 24);
    }
}
