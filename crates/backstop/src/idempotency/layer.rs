//! The server layer: only configuration.

use crate::idempotency::config::{IdempotencyConfig, Settings};
use crate::idempotency::service::Idempotency;
use crate::idempotency::store::Store;
use std::{fmt, sync::Arc};
use tower_layer::Layer;

/// De-duplicates keyed requests: the first request with a key runs, its answer is stored and
/// replayed to every later request with the key (the crate docs give the rules). Clones
/// share the store and the settings.
pub struct IdempotencyLayer<St> {
    settings: Arc<Settings<St>>,
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
        }
    }
}

impl<St> fmt::Debug for IdempotencyLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.fmt(f)
    }
}

impl<St: Store> IdempotencyLayer<St> {
    /// A layer over `store` with the default settings (see [`IdempotencyConfig`]).
    pub fn new(store: St) -> Self {
        Self::builder(store)
            .build()
            .expect("the defaults are valid")
    }

    /// The settings to tune, over `store`.
    pub fn builder(store: St) -> IdempotencyConfig<St> {
        IdempotencyConfig::new(store)
    }

    pub(crate) fn from_settings(settings: Arc<Settings<St>>) -> Self {
        Self { settings }
    }
}

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = Idempotency<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::from_parts(inner, self.settings.clone())
    }
}
