use crate::client::retry::bounds::Wire;
use crate::client::retry::shared::{Handles, Ledger, Shared};
use crate::client::retry::{Retry, RetryConfig};
use crate::rt::DependencyName;
use std::{sync::Arc, time::Duration};
use tower_layer::Layer;

/// Retries failed requests within their deadline and a shared budget.
///
/// Built by [`RetryConfig::build`]; see the [crate docs](crate#semantics). Clones share one
/// budget and one set of [counters](RetryLayer::stats).
#[derive(Debug)]
pub struct RetryLayer<C> {
    pub(crate) shared: Arc<Shared<C>>,
    handles: Handles<C>,
    /// Who writes `grpc-timeout` on the attempts its services arm.
    header: Wire,
}

impl<C> Clone for RetryLayer<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            handles: self.handles.clone(),
            header: self.header,
        }
    }
}

impl<C> RetryLayer<C> {
    /// The layer for a policy; same as [`RetryConfig::build`].
    ///
    /// # Errors
    ///
    /// As [`RetryConfig::build`].
    pub fn new(policy: RetryConfig<C>) -> Result<Self, crate::ConfigError> {
        policy.build()
    }

    /// This layer's policy for the dependency `name`: its events carry the name as
    /// `dependency`, its metrics as the `dependency` label. Naming is configuration, done
    /// before the layer serves: the layer returned counts in stats of its own, with metric
    /// handles of its own and, unless the policy was given a budget
    /// ([`RetryConfig::budget`], shared with whoever holds it), a budget of its own; the
    /// layers cloned before keep theirs.
    ///
    /// ```
    /// use backstop::client::retry::RetryConfig;
    ///
    /// let retry = RetryConfig::http().build()?.named("inventory");
    /// assert_eq!(retry.name(), "inventory");
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn named(&self, name: &str) -> Self
    where
        C: Clone,
    {
        let ledger = Ledger::new(DependencyName::new(name), self.shared.ledger.route.clone());
        let mut policy = self.shared.policy.clone();
        if policy.own_budget {
            policy.budget = Some(Arc::new(crate::client::retry::budget::RatioBudget::new()));
        }
        Self {
            header: self.header,
            ..Self::with_ledger(policy, Arc::new(ledger))
        }
    }

    /// The dependency's name (`""` when unnamed).
    pub fn name(&self) -> &str {
        self.shared.ledger.name.get()
    }

    /// The route this layer serves ([`RetryConfig::route`]), if it serves one.
    pub fn route(&self) -> Option<&str> {
        self.shared.ledger.route.as_deref()
    }

    /// The configuration this layer was built from.
    pub fn config(&self) -> &RetryConfig<C> {
        &self.shared.policy
    }

    pub(crate) fn from_policy(mut policy: RetryConfig<C>) -> Self {
        // Each layer built from a config has a default budget of its own: a config cloned
        // (or a client builder cloned as a template) and built twice makes two budgets, as
        // two dependencies want. A budget given with `RetryConfig::budget` stays shared.
        if policy.own_budget {
            policy.budget = Some(Arc::new(crate::client::retry::budget::RatioBudget::new()));
        }
        let ledger = Ledger::new(DependencyName::default(), policy.route.clone());
        Self::with_ledger(policy, Arc::new(ledger))
    }

    fn with_ledger(policy: RetryConfig<C>, ledger: Arc<Ledger>) -> Self {
        let shared = Arc::new(Shared {
            policy,
            ledger,
            timeout_retryable: std::sync::OnceLock::new(),
        });
        let handles = Handles::new(&shared);
        let header = Wire::Refresh;
        Self {
            shared,
            handles,
            header,
        }
    }

    /// The same layer (sharing its budget, stats and name), for a stack where a layer inside
    /// writes every attempt's `grpc-timeout` as the request's deadline less `offset` (the
    /// attempt bound, under a deadline layer that writes none and has that `offset`: how the
    /// client presets are built). Its services write no header; they put each attempt's
    /// deadline on the request, and send a retry or a hedge only if 1 ms fits
    /// before what the server will be told, the deadline less `offset`, as they do when they
    /// read that off a header. They read no `grpc-timeout` off the request: that deadline
    /// layer, outside, took a caller's header off it.
    #[must_use]
    pub(crate) fn grpc_timeout_written_inside(&self, offset: Duration) -> Self {
        Self {
            header: Wire::Inside(offset),
            ..self.clone()
        }
    }

    /// What the layer (and every service it built) has done so far.
    pub fn stats(&self) -> crate::client::retry::RetryStats {
        self.shared.ledger.stats.snapshot()
    }
}

impl<S, C> Layer<S> for RetryLayer<C> {
    type Service = Retry<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::from_handles(inner, self.handles.clone(), self.header)
    }
}
