//! Atomics, from loom when the crate is model-checked (`--cfg loom`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

/// The keyed table's lock (taken only to add a key).
#[cfg(loom)]
pub(crate) use loom::sync::Mutex;
/// The keyed table's lock (taken only to add a key).
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;

/// The keyed table's published snapshot: `arc-swap` (lock-free loads), or, under loom, a
/// mutex around the `Arc`, so the model checks the protocol around it (arc-swap itself is
/// not loom-aware).
#[cfg(not(loom))]
pub(crate) type Swap<T> = arc_swap::ArcSwap<T>;

/// The keyed table's published snapshot, under loom.
#[cfg(loom)]
pub(crate) struct Swap<T>(loom::sync::Mutex<std::sync::Arc<T>>);

#[cfg(loom)]
impl<T> Swap<T> {
    pub(crate) fn new(value: std::sync::Arc<T>) -> Self {
        Self(loom::sync::Mutex::new(value))
    }

    pub(crate) fn load(&self) -> std::sync::Arc<T> {
        self.0.lock().unwrap().clone()
    }

    pub(crate) fn load_full(&self) -> std::sync::Arc<T> {
        self.load()
    }

    pub(crate) fn store(&self, value: std::sync::Arc<T>) {
        *self.0.lock().unwrap() = value;
    }
}
