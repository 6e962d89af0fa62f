//! Without the `metrics` feature, recording is nothing at all: the handles are zero-sized and
//! every hook is skipped at compile time (`RetryMetrics::ON` is false).

use crate::Outcome;
use crate::client::retry::stats::GiveUp;

/// Which attempt was sent.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AttemptKind {
    First,
    Retry,
    Hedge,
}

pub(crate) use crate::client::retry::error_type::ErrorType;

/// No handles.
#[derive(Debug)]
pub(crate) struct RetryMetrics;

impl RetryMetrics {
    /// Whether metrics are recorded (the feature is off).
    pub(crate) const ON: bool = false;

    pub(crate) fn new(_: &str, _: Option<&str>) -> Self {
        Self
    }

    pub(crate) fn outcome(&self, _: Outcome, _: impl FnOnce() -> ErrorType) {}

    pub(crate) fn attempt(&self, _: AttemptKind) {}

    pub(crate) fn give_up(&self, _: GiveUp) {}

    pub(crate) fn balance(&self, _: f64) {}

    pub(crate) fn route_attempts<B>(&self, _: &mut http::Request<B>) {}

    pub(crate) fn call(&self, _: &str, _: &str, _: u32, _: u32, _: std::time::Duration) {}
}
