//! The gRPC client preset with its policies per method, from a service config:
//! [`ClientBuilder::service_config`](crate::ClientBuilder::service_config).
//!
//! ```text
//! MethodTimeout → PropagateDeadline → Bulkhead → Throttle → Methods (one Retry per methodConfig entry) → Breaker → adaptive limit → attempt bound → transport
//! ```
//!
//! - **The method's `timeout`** becomes the call's deadline (a request extension, the earlier
//!   of it and any deadline the caller already has), so `PropagateDeadline` sends it in
//!   `grpc-timeout` and every attempt shares it.
//! - **Its `retryPolicy` or `hedgingPolicy`** is a retry layer of its own, chosen by the
//!   request's `:path` (a scan of the entries' names, no allocation): the method's entry,
//!   then its service's, then the default; none: one attempt, as gRPC's clients do.
//! - **One budget for the whole client**: the config's `retryThrottling` (gRFC A6: per server
//!   name), or, without one, backstop's ratio budget (a deliberate difference: gRPC's clients
//!   then retry unthrottled; backstop never lets retries storm).
//! - **One breaker and one attempt bound** for the dependency, as in the preset; likewise
//!   one adaptive throttle and one bulkhead (the preset's, on and off by default), outside
//!   every method's retry layer, so they see the channel's calls whatever their method, and
//!   one adaptive limit on attempts, inside them.
//!
//! - **Per method, in the metrics**: each entry's retry layer labels its series with
//!   `route` (the entry's names as paths, `/pkg.Service/Method` or `/pkg.Service/*`, `*` for
//!   the default, `(none)` for calls no entry names; a breaker keyed by path uses the same
//!   label and form), the attempt durations too (the entry's retry layer hands the attempt
//!   layer its handle; a keyed attempt layer labels them with its key instead),
//!   and [`MethodsLayer::retry_layer`] gives its stats.
//!
//! # Concurrency rule
//!
//! The layers share the config (read-only) and the budget (lock-free, see its docs); each
//! method's retry layer keeps its own stats.

use crate::ClientLayer;
use crate::client::retry::{
    Budget, Idempotency, RatioBudget, ReplayBody, Retry, RetryConfig, RetryLayer,
};
use crate::deadline::Deadline;
use crate::service_config::{MethodPolicy, ServiceConfig};
use crate::{BoxError, GrpcClassifier};
use http::Request;
use std::{
    sync::Arc,
    task::{Context, Poll},
};
use tower_layer::Layer;
use tower_service::Service;

/// A gRPC client stack with its policies per method; built by
/// [`ClientBuilder::service_config`](crate::ClientBuilder::service_config).
#[derive(Debug, Clone)]
pub struct MethodsLayer {
    config: Arc<ServiceConfig>,
    client: ClientLayer<GrpcClassifier>,
    /// One retry layer per `methodConfig` entry, then one for calls no entry names.
    retries: Arc<[RetryLayer<GrpcClassifier>]>,
}

impl MethodsLayer {
    pub(crate) fn new(
        client: ClientLayer<GrpcClassifier>,
        config: ServiceConfig,
    ) -> Result<Self, crate::ConfigError> {
        // A config built by hand is held to `from_json`'s rules, and refused by JSON path;
        // one that passes builds below as it is.
        config.validate()?;
        let budget: Arc<dyn Budget> = match &config.retry_throttling {
            Some(throttling) => Arc::new(throttling.throttle()),
            None => Arc::new(RatioBudget::new()),
        };
        let mut retries = Vec::with_capacity(config.methods.len() + 1);
        for entry in &config.methods {
            let policy = match &entry.policy {
                Some(MethodPolicy::Retry(r)) => r.retry_policy().budget(budget.clone()),
                Some(MethodPolicy::Hedging(h)) => RetryConfig::new(
                    GrpcClassifier::new().retryable_codes(h.non_fatal_status_codes.iter().copied()),
                )
                .max_attempts(h.max_attempts)
                .hedging(h.hedging())
                // The service owner chose hedging for these methods (A6: that is the opt-in).
                .idempotency(Idempotency::All)
                .budget(budget.clone()),
                // Never retried, yet heard by the budget: A6's throttle counts every call of
                // the channel, whatever its method.
                None => RetryConfig::grpc().max_attempts(1).budget(budget.clone()),
            };
            // The preset's reserve: no retry the dependency's usual call could not finish.
            let policy = match client.measured_reserve() {
                Some(reserve) => policy.reserve(reserve),
                None => policy,
            };
            // Every method's events and metrics carry the dependency's name and the entry's
            // methods as their route.
            let policy = policy.route(&methods_of(entry));
            retries.push(policy.build()?.named(client.dependency()));
        }
        let unlisted = RetryConfig::grpc()
            .max_attempts(1)
            .budget(budget.clone())
            .route("(none)");
        retries.push(unlisted.build()?.named(client.dependency()));
        Ok(Self {
            config: Arc::new(config),
            client,
            retries: retries.into(),
        })
    }

    /// The retry layer of `methodConfig[i]` (for its [`stats`](RetryLayer::stats)), or, for
    /// `i` = the number of entries, the one of calls no entry names.
    pub fn retry_layer(&self, i: usize) -> Option<&RetryLayer<GrpcClassifier>> {
        self.retries.get(i)
    }

    /// The config.
    pub fn config(&self) -> &ServiceConfig {
        &self.config
    }

    /// The breaker every method shares, for its [`snapshot`](crate::client::breaker::BreakerLayer::snapshot)
    /// and manual modes.
    pub fn breaker_layer(&self) -> &crate::client::breaker::BreakerLayer<GrpcClassifier> {
        self.client.breaker_layer()
    }

    /// The attempt bound every method shares (its latency model and current bound).
    pub fn attempt_layer(&self) -> &crate::client::attempt::AttemptTimeoutLayer {
        self.client.attempt_layer()
    }

    /// The dependency's measured latency: count and quantiles over the model's window.
    pub fn latency(&self) -> crate::latency::LatencySnapshot {
        self.client.latency()
    }

    /// The dependency's name (`""` when unnamed).
    pub fn dependency(&self) -> &str {
        self.client.dependency()
    }
}

/// An entry's names as its retry layer's `route` label, in the form of a request's path (the
/// form a breaker keyed by path labels its series with, so the two join): `/pkg.Service/Method`,
/// `/pkg.Service/*` (every method of it), `*` (the default entry), comma-separated; calls no
/// entry names are `(none)`.
fn methods_of(entry: &crate::service_config::MethodConfig) -> String {
    let names: Vec<String> = entry
        .names
        .iter()
        .map(|n| match (&n.service, &n.method) {
            (Some(s), Some(m)) => format!("/{s}/{m}"),
            (Some(s), None) => format!("/{s}/*"),
            _ => "*".to_owned(),
        })
        .collect();
    names.join(",")
}

/// The service [`MethodsLayer`] builds around a transport `S`: name it in a struct field
/// or axum `State` (for a tonic `Channel`: `backstop::tonic::TonicMethodsClient<Channel>`,
/// feature `tonic`).
pub type MethodsClient<S> = MethodTimeout<
    crate::deadline::PropagateDeadline<
        crate::client::overload::bulkhead::Bulkhead<
            crate::client::overload::throttle::Throttle<
                Methods<
                    crate::client::breaker::Breaker<
                        crate::client::overload::bulkhead::Bulkhead<
                            crate::client::attempt::AttemptTimeout<S>,
                            std::sync::Arc<GrpcClassifier>,
                        >,
                        GrpcClassifier,
                    >,
                >,
                GrpcClassifier,
            >,
        >,
    >,
>;

impl<S: Clone> Layer<S> for MethodsLayer {
    type Service = MethodsClient<S>;

    fn layer(&self, inner: S) -> Self::Service {
        // As in the preset: the attempt bound, innermost, writes each attempt's
        // `grpc-timeout` (unless the deadline layer says none is sent); the deadline and
        // retry layers write none.
        let deadline = self.client.deadline_layer();
        // Room for a retry after the least backoff of any method's policy (gRFC A6's full
        // jitter may retry at once), before the deadline less the offset.
        let least = self
            .retries
            .iter()
            .map(|r| r.config().least_retry_wait())
            .min()
            .unwrap_or_default();
        let attempt = self
            .client
            .attempt_layer()
            .retry_wait(least.saturating_add(deadline.offset()));
        let attempt = if deadline.sends_grpc_timeout() {
            attempt.write_grpc_timeout(deadline.offset())
        } else {
            attempt.clone()
        };
        // As in the preset: the adaptive limit between the breaker and the attempt bound.
        let inner = self.client.limit_around(attempt.layer(inner));
        let inner = self.client.breaker_layer().layer(inner);
        // Each method's retry layer, arranged once for this stack.
        let retries = self
            .retries
            .iter()
            .map(|retry| retry.grpc_timeout_written_inside(deadline.offset()))
            .collect();
        let methods = Methods {
            inner: Some(inner),
            retries,
            config: self.config.clone(),
        };
        // The preset's throttle and bulkhead, outside every method's retry layer: one window
        // and one set of permits for the channel.
        let methods = self
            .client
            .bulkhead_layer()
            .layer(self.client.throttle_layer().layer(methods));
        MethodTimeout {
            inner: deadline.send_grpc_timeout(false).layer(methods),
            config: self.config.clone(),
        }
    }
}

// The services of a `MethodsClient`: public (they are in its type) but unnameable, as only
// this crate names them.
mod services {
    use super::*;

    /// Routes each call to its method's retry policy; see [`MethodsLayer`].
    ///
    /// One inner service for every method: readiness is the transport's own, and a call reserves
    /// capacity (a `ConcurrencyLimit` permit, a `Buffer` slot such as a tonic `Channel`'s) only
    /// on the service it is sent on. The method's retry layer is picked in `call`, and wraps the
    /// ready service for that call alone.
    #[derive(Debug, Clone)]
    pub struct Methods<S> {
        /// `None` only while `call` lends it to the method's retry layer.
        pub(super) inner: Option<S>,
        /// One retry layer per `methodConfig` entry, then one for calls no entry names.
        pub(super) retries: Arc<[RetryLayer<GrpcClassifier>]>,
        pub(super) config: Arc<ServiceConfig>,
    }

    impl<S, B> Service<Request<B>> for Methods<S>
    where
        S: Service<Request<ReplayBody<B>>> + Clone,
        S::Error: Into<BoxError>,
        Retry<S, GrpcClassifier>: Service<Request<B>, Error = BoxError>,
    {
        type Response = <Retry<S, GrpcClassifier> as Service<Request<B>>>::Response;
        type Error = BoxError;
        type Future = <Retry<S, GrpcClassifier> as Service<Request<B>>>::Future;

        /// The inner service's readiness: every method is sent on it.
        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            self.inner
                .as_mut()
                .expect("lent only during call")
                .poll_ready(cx)
                .map_err(Into::into)
        }

        fn call(&mut self, req: Request<B>) -> Self::Future {
            let none = self.retries.len() - 1;
            let i = self.config.method_index(req.uri().path()).unwrap_or(none);
            // The ready service makes this call, under the method's retry layer, which keeps a
            // clone for its retries and gives back another for the next call.
            let ready = self.inner.take().expect("lent only during call");
            let mut route = self.retries[i].layer(ready);
            let future = route.call(req);
            self.inner = Some(route.into_inner());
            future
        }
    }

    /// Gives each call its method's `timeout` as a deadline; see [`MethodsLayer`].
    #[derive(Debug, Clone)]
    pub struct MethodTimeout<S> {
        pub(super) inner: S,
        pub(super) config: Arc<ServiceConfig>,
    }

    impl<S, B> Service<Request<B>> for MethodTimeout<S>
    where
        S: Service<Request<B>>,
    {
        type Response = S::Response;
        type Error = S::Error;
        type Future = S::Future;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, mut req: Request<B>) -> S::Future {
            if let Some(timeout) = self.config.method(req.uri().path()).and_then(|m| m.timeout) {
                let deadline = Deadline::after(timeout);
                let deadline = match req.extensions().get::<Deadline>() {
                    Some(&earlier) => earlier.min(deadline),
                    None => deadline,
                };
                req.extensions_mut().insert(deadline);
            }
            self.inner.call(req)
        }
    }
}
use services::{MethodTimeout, Methods};

impl crate::ClientBuilder<GrpcClassifier> {
    /// The same client with its retry, hedging and timeout policies per method, from gRPC's
    /// service config (see [`MethodsLayer`]): the deadline
    /// propagation, breaker and attempt bound of this preset, one retry layer per
    /// `methodConfig` entry, and one budget for the client (the config's `retryThrottling`,
    /// else the ratio budget). This preset's own retry layer is not used.
    ///
    /// ```
    /// use backstop::service_config::ServiceConfig;
    ///
    /// let config = ServiceConfig::from_json(r#"{ "methodConfig": [
    ///     { "name": [{ "service": "bank.Accounts", "method": "GetBalance" }],
    ///       "retryPolicy": { "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
    ///                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"] } }
    /// ] }"#)?;
    /// let client = backstop::client::grpc().service_config(config)?;
    /// # let _ = client;
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A misconfiguration a setter of this stack kept ([`build`](Self::build)); every config
    /// [`from_json`](crate::service_config::ServiceConfig::from_json) returns builds.
    pub fn service_config(
        self,
        config: crate::service_config::ServiceConfig,
    ) -> Result<MethodsLayer, crate::ConfigError> {
        MethodsLayer::new(self.build()?, config)
    }
}
