//! What every clone of a retry layer and its services share: the configuration, the stats,
//! the dependency's name and the metric handles.
//!
//! **Concurrency rule.** Read-only after the layer is built, but for the stats (striped
//! atomics, see `stats.rs`), the budget (see `budget.rs`) and the metric handles, set once
//! (`OnceLock`) by the first call that records.

use crate::Outcome;
use crate::client::retry::RetryConfig;
use crate::client::retry::metrics::{AttemptKind, RetryMetrics};
use crate::client::retry::stats::{GiveUp, Stats};
use crate::rt::{DependencyName, stripe};
use std::{sync::Arc, time::Duration};

/// The layer's shared state.
#[derive(Debug)]
pub(crate) struct Shared<C> {
    pub(crate) policy: RetryConfig<C>,
    /// What the layer and its clones count and report.
    pub(crate) ledger: Arc<Ledger>,
    /// What the policy's classifier makes of an attempt timeout (`AttemptTimedOut`): asked
    /// once, by the first call.
    pub(crate) timeout_retryable: std::sync::OnceLock<crate::Retryable>,
}

/// What a retry layer and its clones count and report: the counters, the dependency's name,
/// the route and the metric handles that carry them. One per layer built from a config (or
/// [named](crate::client::retry::RetryLayer::named)); shared by its clones.
#[derive(Debug)]
pub(crate) struct Ledger {
    pub(crate) stats: Stats,
    pub(crate) name: DependencyName,
    /// Which of the dependency's routes this layer serves ([`RetryConfig::route`]): its
    /// metrics carry it as `route`.
    pub(crate) route: Option<Box<str>>,
    /// The metric handles, registered by the first call that records (zero-sized without the
    /// `metrics` feature).
    pub(crate) metrics: std::sync::OnceLock<RetryMetrics>,
}

impl Ledger {
    pub(crate) fn new(name: DependencyName, route: Option<Box<str>>) -> Self {
        Self {
            stats: Stats::new(stripe::count()),
            name,
            route,
            metrics: std::sync::OnceLock::new(),
        }
    }
}

/// One handle per stripe to the layer's shared state, shared by every service of the layer
/// (see [`backstop::rt::stripe::Handles`](crate::rt::stripe::Handles)): a request holds its stripe's handle while it may
/// be retried.
pub(crate) type Handles<C> = stripe::Handles<Shared<C>>;
/// What a request holds on to while it may be retried.
pub(crate) type Handle<C> = stripe::Handle<Shared<C>>;

impl<C> Shared<C> {
    #[inline(always)]
    fn metrics(&self) -> &RetryMetrics {
        let ledger = &*self.ledger;
        ledger
            .metrics
            .get_or_init(|| RetryMetrics::new(ledger.name.get(), ledger.route.as_deref()))
    }

    /// A call ended with this outcome.
    #[inline(always)]
    pub(crate) fn meter_outcome(
        &self,
        outcome: Outcome,
        error: impl FnOnce() -> crate::client::retry::metrics::ErrorType,
    ) {
        if RetryMetrics::ON {
            self.metrics().outcome(outcome, error);
        }
    }

    /// A gRPC call that could be retried ended: its retries, hedges and backoff (gRFC A96).
    pub(crate) fn meter_call(&self, method: &str, retries: u32, hedges: u32, delay: Duration) {
        if RetryMetrics::ON {
            self.metrics()
                .call(self.ledger.name.get(), method, retries, hedges, delay);
        }
    }

    /// An attempt was sent.
    #[inline(always)]
    pub(crate) fn meter_attempt(&self, kind: AttemptKind) {
        if RetryMetrics::ON {
            self.metrics().attempt(kind);
        }
    }

    /// A request arrived: its attempts carry the layer's attempt-duration handle, when the
    /// layer has a route.
    #[inline(always)]
    pub(crate) fn meter_route<B>(&self, req: &mut http::Request<B>) {
        if RetryMetrics::ON && self.ledger.route.is_some() {
            self.metrics().route_attempts(req);
        }
    }

    /// A failure was returned without a retry.
    #[inline(always)]
    pub(crate) fn meter_give_up(&self, why: GiveUp) {
        if RetryMetrics::ON {
            self.metrics().give_up(why);
        }
    }

    /// The budget changed: the gauge reads its balance again.
    #[inline(always)]
    pub(crate) fn meter_budget(&self) {
        if RetryMetrics::ON
            && let Some(budget) = &self.policy.budget
        {
            self.metrics().balance(budget.balance());
        }
    }
}
