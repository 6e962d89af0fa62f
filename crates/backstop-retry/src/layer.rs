use crate::bounds::Wire;
use crate::{
    Retry, RetryConfig,
    shared::{Handles, Ledger, Shared},
    stats::Stats,
};
use backstop_core::__private::stripe;
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
    pub fn new(policy: RetryConfig<C>) -> Result<Self, backstop_core::ConfigError> {
        policy.build()
    }

    /// Names the dependency: every event this layer emits carries it as `dependency`
    /// (unnamed: `""`).
    ///
    /// # Errors
    ///
    /// When the layer already has another name.
    pub fn set_name(&self, name: &str) -> Result<(), backstop_core::ConfigError> {
        self.shared.ledger.name.set(name)
    }

    /// The dependency's name (`""` when unnamed).
    pub fn name(&self) -> &str {
        self.shared.ledger.name.get()
    }

    /// Says which of the dependency's methods this layer serves (e.g. the names of a gRPC
    /// service config entry): with the `metrics` feature its series carry it as a `route` label
    /// (set once, before the first call; later calls are ignored).
    ///
    /// For the facade's service-config client, which builds one layer per config entry; not
    /// part of the API users build stacks with (hidden, no semver promise).
    #[doc(hidden)]
    pub fn set_methods(&self, methods: &str) {
        let _ = self.shared.ledger.methods.set(methods.into());
    }

    /// Which methods this layer serves, if said.
    pub fn methods(&self) -> Option<&str> {
        self.shared.ledger.methods.get().map(|m| &**m)
    }

    /// The configuration this layer was built from.
    pub fn config(&self) -> &RetryConfig<C> {
        &self.shared.policy
    }

    /// The same layer's counters, name and metrics, with another policy (checked as
    /// [`RetryConfig::build`] checks it): what this layer and its clones count and report
    /// goes on across the change, and the layers cloned before it keep the old policy. Give
    /// it a config derived from [`config`](Self::config) to change one knob:
    ///
    /// ```
    /// use backstop_retry::RetryConfig;
    ///
    /// let retry = RetryConfig::http().build()?;
    /// retry.set_name("search")?;
    /// let fewer = retry.with_config(retry.config().clone().max_attempts(2))?;
    /// assert_eq!(fewer.name(), "search");
    /// assert!(retry.with_config(RetryConfig::http().max_attempts(11)).is_err());
    /// # Ok::<(), backstop_core::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RetryConfig::build`].
    pub fn with_config(&self, policy: RetryConfig<C>) -> Result<Self, backstop_core::ConfigError> {
        policy.validate()?;
        Ok(Self::with_ledger(policy, self.shared.ledger.clone()))
    }

    pub(crate) fn from_policy(policy: RetryConfig<C>) -> Self {
        let ledger = Arc::new(Ledger {
            stats: Stats::new(stripe::count()),
            name: backstop_core::__private::DependencyName::default(),
            methods: std::sync::OnceLock::new(),
            metrics: std::sync::OnceLock::new(),
        });
        Self::with_ledger(policy, ledger)
    }

    fn with_ledger(policy: RetryConfig<C>, ledger: Arc<Ledger>) -> Self {
        let shared = Arc::new(Shared {
            policy,
            ledger,
            timeout_retryable: std::sync::OnceLock::new(),
        });
        let handles = Handles::new(&shared);
        let header = if shared.policy.send_grpc_timeout {
            Wire::Write
        } else {
            Wire::Silent
        };
        Self {
            shared,
            handles,
            header,
        }
    }

    /// The same layer (sharing its budget, stats and name), its services writing
    /// `grpc-timeout` or not; see [`RetryConfig::send_grpc_timeout`], which sets the default.
    #[must_use]
    pub fn send_grpc_timeout(&self, send: bool) -> Self {
        Self {
            header: if send { Wire::Write } else { Wire::Silent },
            ..self.clone()
        }
    }

    /// The same layer (sharing its budget, stats and name), for a stack where a layer inside
    /// writes every attempt's `grpc-timeout` as the request's deadline less `offset` (the
    /// facade's `AttemptTimeoutLayer::write_grpc_timeout(offset)`, under a
    /// `PropagateDeadlineLayer` built with `send_grpc_timeout(false)` and that `offset`; the
    /// client presets are built so). Its services write no header; they put each attempt's
    /// deadline on the request, and send a retry or a hedge only if `min_attempt_time` fits
    /// before what the server will be told, the deadline less `offset`, as they do when they
    /// read that off a header.
    #[must_use]
    pub fn grpc_timeout_written_inside(&self, offset: Duration) -> Self {
        Self {
            header: Wire::Inside(offset),
            ..self.clone()
        }
    }

    /// What the layer (and every service it built) has done so far.
    pub fn stats(&self) -> crate::RetryStats {
        self.shared.ledger.stats.snapshot()
    }
}

impl<S, C> Layer<S> for RetryLayer<C> {
    type Service = Retry<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::from_handles(inner, self.handles.clone(), self.header)
    }
}
