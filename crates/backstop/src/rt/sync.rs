//! The lock and atomics of backstop's hand-rolled concurrent structures (the striped ring,
//! the bulkhead's semaphore, the admission models, the per-route table): loom's when
//! model-checked (`--cfg loom`), std's otherwise. One shim, so every crate checked under loom
//! swaps the same types.

#[cfg(loom)]
pub(crate) use loom::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicU64, Ordering},
};
#[cfg(not(loom))]
pub(crate) use std::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicU64, Ordering},
};
