use crate::{Retry, RetryPolicy, stats::Stats};
use backstop_core::stripe;
use std::{fmt, ops::Deref, sync::Arc};
use tower_layer::Layer;

/// Retries failed requests within their deadline and a shared budget.
///
/// Built by [`RetryPolicy::build`]; see the [crate docs](crate#semantics). Clones share one
/// budget and one set of [counters](RetryLayer::stats).
#[derive(Debug)]
pub struct RetryLayer<C> {
    pub(crate) shared: Arc<Shared<C>>,
    handles: Handles<C>,
}

impl<C> Clone for RetryLayer<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            handles: self.handles.clone(),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Shared<C> {
    pub(crate) policy: RetryPolicy<C>,
    pub(crate) stats: Stats,
}

/// One handle per stripe, shared by every service of the layer.
pub(crate) type Handles<C> = Arc<[Arc<Handle<C>>]>;

/// What a request holds on to while it may be retried: the layer's shared state, reached
/// through its stripe's handle.
///
/// Each stripe's handle is its own allocation, aligned to a pair of cache lines, so the
/// reference count every request bumps is shared only by the threads of one stripe (see
/// [`backstop_core::stripe`]).
#[repr(align(128))]
pub(crate) struct Handle<C> {
    shared: Arc<Shared<C>>,
    pub(crate) stripe: usize,
}

impl<C> Deref for Handle<C> {
    type Target = Shared<C>;

    fn deref(&self) -> &Shared<C> {
        &self.shared
    }
}

impl<C> fmt::Debug for Handle<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("stripe", &self.stripe)
            .finish_non_exhaustive()
    }
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
        let stripes = stripe::count();
        let shared = Arc::new(Shared {
            policy,
            stats: Stats::new(stripes),
        });
        let handles = (0..stripes)
            .map(|stripe| {
                Arc::new(Handle {
                    shared: shared.clone(),
                    stripe,
                })
            })
            .collect();
        Self { shared, handles }
    }

    /// What the layer (and every service it built) has done so far.
    pub fn stats(&self) -> crate::RetryStats {
        self.shared.stats.snapshot()
    }
}

impl<S, C> Layer<S> for RetryLayer<C> {
    type Service = Retry<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::from_handles(inner, self.handles.clone())
    }
}
