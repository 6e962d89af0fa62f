//! Overload on the client: refuse calls the dependency cannot take, before they are sent.
//!
//! - [`throttle`]: the adaptive throttle (on in the presets): refuses a share of first
//!   attempts while the dependency accepts fewer than it is sent.
//! - [`bulkhead`]: a fixed cap on calls in flight (off unless given a limit), which refuses at
//!   once a call that could not get a permit before its deadline.
//!
//! Both sit outside the retry layer: they bound calls, not attempts, and their refusals are
//! never sent and never retried.

pub mod bulkhead;
pub mod throttle;
