//! Client presets: the whole outbound stack as one layer, in the right order.

use crate::timeout::{AttemptTimeout, AttemptTimeoutLayer};
use backstop_breaker::{Breaker, BreakerConfig, BreakerLayer};
use backstop_core::{GrpcClassifier, HttpClassifier};
use backstop_deadline::{PropagateDeadline, PropagateDeadlineLayer};
use backstop_retry::{Retry, RetryLayer, RetryPolicy};
use std::time::Duration;
use tower_layer::Layer;

/// The client stack as one layer:
/// `PropagateDeadline → Retry → Breaker → attempt timeout → your client`.
///
/// Made by [`http()`] or [`grpc()`] with every default, and tuned by replacing a part. Clones
/// share the retry budget and the breaker, so build one per dependency and clone it into
/// every client that calls that dependency.
#[derive(Debug, Clone)]
pub struct ClientLayer<C> {
    deadline: PropagateDeadlineLayer,
    retry: RetryLayer<C>,
    breaker: BreakerLayer<C>,
    attempt_timeout: Option<Duration>,
}

/// The preset for HTTP dependencies: [`PropagateDeadlineLayer::new`], [`RetryPolicy::http`]
/// (3 attempts, decorrelated jitter, the 10 % ratio budget), [`BreakerConfig::http`] (50 %
/// failures over 10 s, 20 calls minimum, 5 s open doubling to 300 s), no attempt timeout.
pub fn http() -> ClientLayer<HttpClassifier> {
    ClientLayer::new(
        RetryPolicy::http().build().expect("the defaults are valid"),
        BreakerConfig::http()
            .build()
            .expect("the defaults are valid"),
    )
}

/// The preset for gRPC dependencies: as [`http()`] with [`RetryPolicy::grpc`] and
/// [`BreakerConfig::grpc`] (status codes from trailers-only responses and trailers).
pub fn grpc() -> ClientLayer<GrpcClassifier> {
    ClientLayer::new(
        RetryPolicy::grpc().build().expect("the defaults are valid"),
        BreakerConfig::grpc()
            .build()
            .expect("the defaults are valid"),
    )
}

impl<C> ClientLayer<C> {
    /// A client stack from its retry and breaker layers (deadline propagation with its
    /// defaults, no attempt timeout).
    pub fn new(retry: RetryLayer<C>, breaker: BreakerLayer<C>) -> Self {
        Self {
            deadline: PropagateDeadlineLayer::new(),
            retry,
            breaker,
            attempt_timeout: None,
        }
    }

    /// Replaces the deadline propagation (e.g. a per-call `timeout` or a `fraction`).
    #[must_use]
    pub fn deadline(mut self, layer: PropagateDeadlineLayer) -> Self {
        self.deadline = layer;
        self
    }

    /// Replaces the retry layer.
    #[must_use]
    pub fn retry(mut self, layer: RetryLayer<C>) -> Self {
        self.retry = layer;
        self
    }

    /// Replaces the breaker.
    #[must_use]
    pub fn breaker(mut self, layer: BreakerLayer<C>) -> Self {
        self.breaker = layer;
        self
    }

    /// Bounds each attempt by `timeout`, inside the breaker: an attempt that times out is a
    /// failure the breaker counts and the retry layer may retry (if the request is
    /// idempotent), within the request's deadline. Off by default.
    #[must_use]
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// The retry layer, for its [`stats`](RetryLayer::stats).
    pub fn retry_layer(&self) -> &RetryLayer<C> {
        &self.retry
    }

    /// The breaker, for its [`snapshot`](BreakerLayer::snapshot) and manual modes.
    pub fn breaker_layer(&self) -> &BreakerLayer<C> {
        &self.breaker
    }
}

impl<S, C> Layer<S> for ClientLayer<C> {
    type Service = PropagateDeadline<Retry<Breaker<AttemptTimeout<S>, C>, C>>;

    fn layer(&self, inner: S) -> Self::Service {
        let inner = AttemptTimeoutLayer::new(self.attempt_timeout).layer(inner);
        let inner = self.breaker.layer(inner);
        let inner = self.retry.layer(inner);
        self.deadline.layer(inner)
    }
}
