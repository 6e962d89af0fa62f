//! The memory store's lock, from loom when the crate is model-checked (`--cfg loom`).

#[cfg(loom)]
pub(crate) use loom::sync::Mutex;
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;
