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

    /// Adds an [`AttemptTimeoutLayer`](crate::timeout::AttemptTimeoutLayer): each call
    /// bounded by its attempt bound (fixed, or from the measured latency).
    #[cfg(feature = "deadline")]
    fn attempt_timeout(
        self,
        layer: crate::timeout::AttemptTimeoutLayer,
    ) -> ServiceBuilder<tower::layer::util::Stack<crate::timeout::AttemptTimeoutLayer, L>>;

    /// Adds a [`PushbackLayer`](crate::retry::PushbackLayer) (server side): tells callers not
    /// to retry when this service's own retries gave up.
    #[cfg(feature = "retry")]
    fn pushback(self) -> ServiceBuilder<Stack<backstop_retry::PushbackLayer, L>>;
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

    #[cfg(feature = "deadline")]
    fn attempt_timeout(
        self,
        layer: crate::timeout::AttemptTimeoutLayer,
    ) -> ServiceBuilder<tower::layer::util::Stack<crate::timeout::AttemptTimeoutLayer, L>> {
        self.layer(layer)
    }

    #[cfg(feature = "retry")]
    fn pushback(self) -> ServiceBuilder<Stack<backstop_retry::PushbackLayer, L>> {
        self.layer(backstop_retry::PushbackLayer::new())
    }
}

#[cfg(all(test, feature = "retry"))]
mod tests {
    use super::ServiceBuilderExt;
    use crate::timeout::{AttemptBound, AttemptTimeoutLayer};
    use http::{Request, Response};
    use std::{convert::Infallible, time::Duration};
    use tower::{ServiceBuilder, ServiceExt, service_fn};

    /// The layers the presets use, by name, stack as `.layer(..)` would.
    #[tokio::test(start_paused = true)]
    async fn every_preset_layer_has_a_name() {
        let bound =
            AttemptTimeoutLayer::new(AttemptBound::Fixed(Duration::from_millis(5))).unwrap();
        let svc = ServiceBuilder::new()
            .pushback()
            .attempt_timeout(bound)
            .service(service_fn(|_req: Request<String>| async {
                std::future::pending::<()>().await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }));
        let err = svc.oneshot(Request::new(String::new())).await.unwrap_err();
        assert!(crate::is_attempt_timed_out(&*err), "{err}");
    }
}
