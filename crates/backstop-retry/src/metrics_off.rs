//! Without the `metrics` feature, recording is nothing at all (the calls compile away).

use crate::{layer::Shared, stats::GiveUp};
use backstop_core::Outcome;

/// Which attempt was sent.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AttemptKind {
    First,
    Retry,
    Hedge,
}

impl<C> Shared<C> {
    #[inline(always)]
    pub(crate) fn meter_outcome(&self, _: Outcome) {}

    #[inline(always)]
    pub(crate) fn meter_attempt(&self, _: AttemptKind) {}

    #[inline(always)]
    pub(crate) fn meter_give_up(&self, _: GiveUp) {}

    #[inline(always)]
    pub(crate) fn meter_budget(&self) {}
}
