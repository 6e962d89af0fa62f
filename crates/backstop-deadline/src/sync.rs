//! The locks and atomics of the bulkhead, the admission table and the keyed attempt table:
//! loom's when the crate is model-checked (`--cfg loom`), std's otherwise.

#[cfg(loom)]
pub(crate) use loom::sync::{
    Mutex,
    atomic::{AtomicU64, Ordering},
};
#[cfg(not(loom))]
pub(crate) use std::sync::{
    Mutex,
    atomic::{AtomicU64, Ordering},
};
