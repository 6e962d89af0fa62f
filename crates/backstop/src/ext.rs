//! `ServiceBuilder` methods for each backstop layer.

use tower::ServiceBuilder;
#[cfg(any(feature = "deadline", feature = "breaker"))]
use tower::layer::util::Stack;

mod sealed {
    pub trait Sealed {}
    impl<L> Sealed for tower::ServiceBuilder<L> {}
}

/// Adds backstop's layers to a [`ServiceBuilder`], by name. Sealed: implemented for
/// `ServiceBuilder` only.
///
/// `.layer(X)` works just as well; these read better in a long stack. The retry method is
/// `retries`, not `retry`: tower's own `ServiceBuilder::retry` (feature `retry`) is an
/// inherent method and would shadow a trait method of that name.
pub trait ServiceBuilderExt<L>: sealed::Sealed {
    /// Adds a [`DeadlineLayer`](crate::deadline::DeadlineLayer) (server side).
    #[cfg(feature = "deadline")]
    fn deadline(
        self,
        layer: backstop_deadline::DeadlineLayer,
    ) -> ServiceBuilder<Stack<backstop_deadline::DeadlineLayer, L>>;

    /// Adds a [`PropagateDeadlineLayer`](crate::deadline::PropagateDeadlineLayer) (client side).
    #[cfg(feature = "deadline")]
    fn propagate_deadline(
        self,
        layer: backstop_deadline::PropagateDeadlineLayer,
    ) -> ServiceBuilder<Stack<backstop_deadline::PropagateDeadlineLayer, L>>;

    /// Adds a [`RetryLayer`](crate::retry::RetryLayer).
    #[cfg(feature = "retry")]
    fn retries<C>(
        self,
        layer: backstop_retry::RetryLayer<C>,
    ) -> ServiceBuilder<Stack<backstop_retry::RetryLayer<C>, L>>;

    /// Adds a [`BreakerLayer`](crate::breaker::BreakerLayer).
    #[cfg(feature = "breaker")]
    fn breaker<C>(
        self,
        layer: backstop_breaker::BreakerLayer<C>,
    ) -> ServiceBuilder<Stack<backstop_breaker::BreakerLayer<C>, L>>;
}

impl<L> ServiceBuilderExt<L> for ServiceBuilder<L> {
    #[cfg(feature = "deadline")]
    fn deadline(
        self,
        layer: backstop_deadline::DeadlineLayer,
    ) -> ServiceBuilder<Stack<backstop_deadline::DeadlineLayer, L>> {
        self.layer(layer)
    }

    #[cfg(feature = "deadline")]
    fn propagate_deadline(
        self,
        layer: backstop_deadline::PropagateDeadlineLayer,
    ) -> ServiceBuilder<Stack<backstop_deadline::PropagateDeadlineLayer, L>> {
        self.layer(layer)
    }

    #[cfg(feature = "retry")]
    fn retries<C>(
        self,
        layer: backstop_retry::RetryLayer<C>,
    ) -> ServiceBuilder<Stack<backstop_retry::RetryLayer<C>, L>> {
        self.layer(layer)
    }

    #[cfg(feature = "breaker")]
    fn breaker<C>(
        self,
        layer: backstop_breaker::BreakerLayer<C>,
    ) -> ServiceBuilder<Stack<backstop_breaker::BreakerLayer<C>, L>> {
        self.layer(layer)
    }
}
