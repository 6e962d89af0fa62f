//! The server preset: the inbound stack as one layer.

use backstop_deadline::{DeadlineLayer, DeadlineService};
use backstop_retry::{Pushback, PushbackLayer};
use tower_layer::Layer;

/// The server stack as one layer: `Deadline → Pushback → your service`.
///
/// [`DeadlineLayer`] reads the caller's `grpc-timeout`, exposes the deadline to handlers and
/// cancels them when it passes; [`PushbackLayer`] tells callers not to retry when this
/// service's own retries gave up. Keeps `Error = S::Error`, so it fits
/// `tonic::transport::Server::layer` and `axum::Router::layer` as is.
#[derive(Debug, Clone)]
pub struct ServerLayer {
    deadline: DeadlineLayer,
}

/// The preset: [`DeadlineLayer::new`] (no default timeout, no cap) and [`PushbackLayer`].
pub fn server() -> ServerLayer {
    ServerLayer {
        deadline: DeadlineLayer::new(),
    }
}

impl ServerLayer {
    /// Replaces the deadline layer (a `max`, a `default_timeout`, a milliseconds header…).
    #[must_use]
    pub fn deadline(mut self, layer: DeadlineLayer) -> Self {
        self.deadline = layer;
        self
    }
}

impl<S> Layer<S> for ServerLayer {
    type Service = DeadlineService<Pushback<S>>;

    fn layer(&self, inner: S) -> Self::Service {
        self.deadline.layer(PushbackLayer::new().layer(inner))
    }
}
