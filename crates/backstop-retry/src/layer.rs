use crate::{Retry, RetryPolicy, stats::Stats};
use std::sync::Arc;
use tower_layer::Layer;

/// Retries failed requests within their deadline and a shared budget.
///
/// Built by [`RetryPolicy::build`]; see the [crate docs](crate#semantics). Clones share one
/// budget and one set of [counters](RetryLayer::stats).
#[derive(Debug, Clone)]
pub struct RetryLayer<C> {
    pub(crate) shared: Arc<Shared<C>>,
}

#[derive(Debug)]
pub(crate) struct Shared<C> {
    pub(crate) policy: RetryPolicy<C>,
    pub(crate) stats: Stats,
}

impl<C> RetryLayer<C> {
    /// The layer for a policy; same as [`RetryPolicy::build`].
    ///
    /// # Errors
    ///
    /// As [`RetryPolicy::build`].
    pub fn new(policy: RetryPolicy<C>) -> Result<Self, backstop_core::ConfigError> {
        policy.build()
    }

    pub(crate) fn from_policy(policy: RetryPolicy<C>) -> Self {
        Self {
            shared: Arc::new(Shared {
                policy,
                stats: Stats::default(),
            }),
        }
    }

    /// What the layer (and every service it built) has done so far.
    pub fn stats(&self) -> crate::RetryStats {
        self.shared.stats.snapshot()
    }
}

impl<S, C> Layer<S> for RetryLayer<C> {
    type Service = Retry<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::from_shared(inner, self.shared.clone())
    }
}
