//! The retry layer's metric handles (feature `metrics`; names and labels in
//! `backstop_core::metrics`).
//!
//! # Concurrency rule
//!
//! Registered once per layer, on the first call that records (a `OnceLock` in the layer's
//! shared state), then shared by every clone.

use crate::{layer::Shared, stats::GiveUp};
use backstop_core::{Outcome, metrics as names};
use metrics::{Counter, Gauge};

/// Which attempt was sent.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AttemptKind {
    First = 0,
    Retry = 1,
    Hedge = 2,
}

#[derive(Debug)]
pub(crate) struct RetryMetrics {
    requests: [Counter; 5],
    attempts: [Counter; 3],
    give_ups: [Counter; GiveUp::COUNT],
    balance: Gauge,
}

impl RetryMetrics {
    /// The handles, with a `method` label when the layer serves some of the dependency's
    /// methods (a service config entry).
    fn new(dependency: &str, method: Option<&str>) -> Self {
        use metrics::Label;
        names::describe();
        let labels = |key: &'static str, value: &'static str| {
            let mut labels = vec![Label::new("dependency", dependency.to_owned())];
            if let Some(method) = method {
                labels.push(Label::new("method", method.to_owned()));
            }
            labels.push(Label::new(key, value));
            labels
        };
        Self {
            requests: names::OUTCOMES
                .map(|o| metrics::counter!(names::CLIENT_REQUESTS, labels("outcome", o))),
            attempts: ["first", "retry", "hedge"]
                .map(|k| metrics::counter!(names::CLIENT_ATTEMPTS, labels("kind", k))),
            give_ups: GiveUp::ALL.map(|why| {
                metrics::counter!(names::RETRY_GIVE_UPS, labels("reason", why.as_str()))
            }),
            // One budget per dependency, whatever the method.
            balance: metrics::gauge!(
                names::RETRY_BUDGET_BALANCE,
                "dependency" => dependency.to_owned()
            ),
        }
    }
}

impl<C> Shared<C> {
    fn metrics(&self) -> &RetryMetrics {
        self.metrics
            .get_or_init(|| RetryMetrics::new(self.name.get(), self.methods.get().map(|m| &**m)))
    }

    /// A call ended with this outcome.
    pub(crate) fn meter_outcome(&self, outcome: Outcome) {
        self.metrics().requests[names::outcome_index(outcome)].increment(1);
    }

    /// An attempt was sent.
    pub(crate) fn meter_attempt(&self, kind: AttemptKind) {
        self.metrics().attempts[kind as usize].increment(1);
    }

    /// A failure was returned without a retry.
    pub(crate) fn meter_give_up(&self, why: GiveUp) {
        self.metrics().give_ups[why as usize].increment(1);
    }

    /// The budget changed: the gauge reads its balance again.
    pub(crate) fn meter_budget(&self) {
        if let Some(budget) = &self.policy.budget {
            self.metrics().balance.set(budget.balance());
        }
    }
}
