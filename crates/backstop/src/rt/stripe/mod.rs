//! Striping: spreading a shared counter over one cache line per core, so threads that count
//! at the same time do not fight over one line.
//!
//! A breaker's window and a retry budget are written by every call. One atomic word written by
//! every thread moves between cores on each write, and two threads then make barely more calls
//! than one. Striped, each thread writes to the copy of its stripe and readers add the copies
//! up: reads (rare: a failure, a snapshot) cost more, writes (every call) scale.
//!
//! [`Ring`] is the striped ring of time slots both of those are built on.

pub(crate) mod ring;

pub(crate) use ring::{Ring, Update, Word};

use std::{
    cell::Cell,
    fmt,
    ops::Deref,
    sync::{
        Arc, OnceLock, Weak,
        atomic::{AtomicUsize, Ordering},
    },
};

/// How many stripes a shared structure should have: one per available core, at most 16 (read
/// once per process).
pub(crate) fn count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(16)))
}

/// The calling thread's stripe, below [`count`]: threads are numbered round-robin on first
/// use, and the number is kept per thread (a thread-local read, no division, on every call).
#[inline(always)]
pub(crate) fn index() -> usize {
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE.with(|cell| {
        let stripe = cell.get();
        if stripe != usize::MAX {
            return stripe;
        }
        let stripe = first_index();
        cell.set(stripe);
        stripe
    })
}

#[cold]
fn first_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed) % count()
}

/// A value alone on its cache lines (128 bytes: a line and its adjacent-line prefetch pair).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// Words from one stripe's copy of a `len`-word array to the next, in a flat array of
/// `stripes` copies: `len` alone when there is one stripe; otherwise `len` rounded up to a
/// cache line (8 words) plus one line of padding, so no two stripes write to one line.
pub(crate) fn stride(len: usize, stripes: usize) -> usize {
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
///
/// Copying a service must not bump a count every thread shares either: a retry layer clones
/// its inner service on every call, and frameworks clone services per connection or per
/// request. So every stripe has its own copy of the set of handles, with its own reference
/// count, and a copy of `Handles` points to the set of the stripe it was made on: cloning on a
/// thread bumps that thread's set's count. Each set holds every handle, so a call finds its
/// own stripe's handle whichever set it goes through. Sets reach one another through weak
/// references; each also keeps the next-numbered set alive, so whoever holds the first set
/// (the layer, and every copy made on the first stripe) keeps every set alive. A copy made on
/// a stripe whose set is gone (the layer dropped, no copy of a lower stripe left) stays with
/// its own set: always correct, only less spread out.
///
/// **Concurrency rule.** Handles and sets are immutable once built; threads share nothing
/// through them but reference counts, each mostly touched by the threads of one stripe.
pub(crate) struct Handles<T> {
    set: Arc<Set<T>>,
}

/// One stripe's copy of every handle, alone on its cache lines.
#[repr(align(128))]
struct Set<T> {
    stripe: usize,
    handles: Box<[Arc<Handle<T>>]>,
    /// Keeps the next stripe's set alive (so the first set keeps them all).
    _next: Option<Arc<Set<T>>>,
    /// Every stripe's set, weakly (set once, before the handles are handed out).
    sets: OnceLock<Box<[Weak<Set<T>>]>>,
}

impl<T> Handles<T> {
    /// A handle per stripe ([`count`]) to `shared`, through the first stripe's set (the one
    /// that keeps every set alive): what a layer holds.
    pub(crate) fn new(shared: &Arc<T>) -> Self {
        Self::with_sets(shared, count())
    }

    /// Handles that are looked up but never copied per call (a keyed layer's breaker of one
    /// key): one set, so they take a stripe's set less memory per stripe. A copy still works;
    /// it shares that one set's count.
    pub(crate) fn uncopied(shared: &Arc<T>) -> Self {
        Self::with_sets(shared, 1)
    }

    fn with_sets(shared: &Arc<T>, sets: usize) -> Self {
        let handles: Box<[Arc<Handle<T>>]> = (0..count())
            .map(|stripe| {
                Arc::new(Handle {
                    shared: shared.clone(),
                    stripe,
                })
            })
            .collect();
        let mut next = None;
        let mut all = Vec::with_capacity(sets);
        for stripe in (0..sets).rev() {
            let set = Arc::new(Set {
                stripe,
                handles: handles.clone(),
                _next: next.take(),
                sets: OnceLock::new(),
            });
            next = Some(set.clone());
            all.push(set);
        }
        all.reverse();
        let weak: Box<[Weak<Set<T>>]> = all.iter().map(Arc::downgrade).collect();
        for set in &all {
            let _ = set.sets.set(weak.clone());
        }
        Self {
            set: all.swap_remove(0),
        }
    }

    /// The calling thread's handle.
    #[inline]
    pub(crate) fn current(&self) -> &Arc<Handle<T>> {
        let handles = &self.set.handles;
        // Every set has `count()` handles, and `index()` is below it.
        &handles[index().min(handles.len() - 1)]
    }

    /// How many stripes (and handles) there are.
    pub(crate) fn len(&self) -> usize {
        self.set.handles.len()
    }

    /// Bytes the handles and the stripes' sets take (the shared value itself not counted):
    /// each stripe's handle and set on cache lines of their own, with their reference counts,
    /// and each set's list of every handle and every set.
    pub(crate) fn heap_bytes(&self) -> usize {
        let n = self.len();
        let sets = self.set.sets.get().map_or(1, |s| s.len());
        // An `Arc`'s counts sit in front of its value, padded to the value's alignment.
        let handle = std::mem::size_of::<Handle<T>>() + std::mem::align_of::<Handle<T>>();
        let set = std::mem::size_of::<Set<T>>() + std::mem::align_of::<Set<T>>();
        let lists =
            n * std::mem::size_of::<Arc<Handle<T>>>() + sets * std::mem::size_of::<Weak<Set<T>>>();
        n * handle + sets * (set + lists)
    }
}

impl<T> Clone for Handles<T> {
    /// A copy through the calling thread's stripe's set (this one's if that set is gone).
    #[inline]
    fn clone(&self) -> Self {
        let stripe = index();
        if stripe == self.set.stripe {
            return Self {
                set: self.set.clone(),
            };
        }
        let theirs = self.set.sets.get().and_then(|sets| sets.get(stripe));
        Self {
            set: theirs
                .and_then(Weak::upgrade)
                .unwrap_or_else(|| self.set.clone()),
        }
    }
}

impl<T> fmt::Debug for Handles<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handles")
            .field("stripes", &self.len())
            .field("set", &self.set.stripe)
            .finish()
    }
}

/// A stripe's handle to a shared value: an allocation of its own, aligned to a pair of cache
/// lines, that dereferences to the value.
#[repr(align(128))]
pub(crate) struct Handle<T> {
    shared: Arc<T>,
    stripe: usize,
}

impl<T> Handle<T> {
    /// The stripe this handle belongs to.
    pub(crate) fn stripe(&self) -> usize {
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

    /// Threads are numbered round-robin, so new threads spread over the stripes. Other tests'
    /// threads take numbers too while this runs (`cargo test` runs tests on parallel
    /// threads), so two threads in a row may share a stripe: sixteen in a row cannot all.
    #[test]
    fn a_thread_keeps_its_stripe_and_threads_differ() {
        let mine = index();
        assert_eq!(index(), mine);
        let theirs: std::collections::HashSet<usize> = (0..16)
            .map(|_| std::thread::spawn(index).join().unwrap())
            .collect();
        assert!(theirs.iter().all(|&stripe| stripe < count()));
        assert!(count() == 1 || theirs.len() > 1, "{theirs:?}");
        assert!((1..=16).contains(&count()));
        assert_eq!(std::mem::align_of::<Padded<u8>>(), 128);
    }

    #[test]
    fn handles_share_one_value_and_sit_apart() {
        let shared = Arc::new(7u32);
        let layer = Handles::new(&shared);
        assert_eq!(layer.len(), count());
        assert_eq!(***layer.current(), 7);
        assert_eq!(layer.current().stripe(), index());
        assert_eq!(Arc::strong_count(&shared), 1 + count());
        assert_eq!(std::mem::size_of::<Handles<u32>>(), 8);
        // A copy goes through the set of the stripe it is made on, and finds its own stripe's
        // handle through any set; the first set keeps every set alive.
        let service = layer.clone();
        let (mine, theirs, through) = std::thread::spawn(move || {
            let copy = service.clone();
            (index(), copy.set.stripe, copy.current().stripe())
        })
        .join()
        .unwrap();
        assert_eq!((theirs, through), (mine, mine));
        drop(layer);
        assert_eq!(Arc::strong_count(&shared), 1, "every set and handle freed");
        assert_eq!(std::mem::align_of::<Handle<u32>>(), 128);
        assert_eq!(stride(10, 1), 10);
        assert_eq!(stride(10, 2), 24);
        assert_eq!(stride(16, 4), 24);
    }
}
