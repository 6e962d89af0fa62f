//! The lock and atomics of backstop's hand-rolled concurrent structures (the striped ring,
//! the bulkhead's semaphore, the admission and keyed attempt tables): loom's when
//! model-checked (`--cfg loom`), std's otherwise. One shim, so every crate checked under loom
//! swaps the same types.

#[cfg(loom)]
pub use loom::sync::{
    Mutex,
    atomic::{AtomicU64, Ordering},
};
#[cfg(not(loom))]
pub(crate) use std::sync::{
    Mutex,
    atomic::{AtomicU64, Ordering},
};
