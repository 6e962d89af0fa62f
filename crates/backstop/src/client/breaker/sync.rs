//! Atomics, from loom when the crate is model-checked (`--cfg loom`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
