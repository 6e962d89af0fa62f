//! `ServiceBuilder` methods for each backstop layer.

use tower::ServiceBuilder;
use tower::layer::util::Stack;

mod sealed {
    pub trait Sealed {}
    impl<L> Sealed for tower::ServiceBuilder<L> {}
}

/// Declares each `ServiceBuilderExt` method once: its docs and the layer it
/// stacks; the trait and its one impl are generated from the same rows, so they cannot drift.
macro_rules! builder_methods {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident $(<$g:ident>)? (layer: $layer:ty);
    )*) => {
        /// Adds backstop's layers to a [`ServiceBuilder`], by name. Sealed: implemented for
        /// `ServiceBuilder` only.
        ///
        /// `.layer(X)` works just as well; these read better in a long stack. Every layer the
        /// presets stack has a method here. The retry method is `retries`, not `retry`: tower's
        /// own `ServiceBuilder::retry` (feature `retry`) is an inherent method and would shadow
        /// a trait method of that name.
        pub trait ServiceBuilderExt<L>: sealed::Sealed {
            $(
                $(#[doc = $doc])*
                fn $name $(<$g>)? (self, layer: $layer) -> ServiceBuilder<Stack<$layer, L>>;
            )*

            /// Adds a [`PushbackLayer`](crate::server::pushback::PushbackLayer) (server side): tells
            /// callers not to retry when this service's own retries gave up.
            fn pushback(self) -> ServiceBuilder<Stack<crate::server::pushback::PushbackLayer, L>>;
        }

        impl<L> ServiceBuilderExt<L> for ServiceBuilder<L> {
            $(
                fn $name $(<$g>)? (self, layer: $layer) -> ServiceBuilder<Stack<$layer, L>> {
                    self.layer(layer)
                }
            )*

            fn pushback(self) -> ServiceBuilder<Stack<crate::server::pushback::PushbackLayer, L>> {
                self.layer(crate::server::pushback::PushbackLayer::new())
            }
        }
    };
}

builder_methods! {
    /// Adds a [`DeadlineLayer`](crate::deadline::DeadlineLayer) (server side).
    fn deadline(layer: crate::deadline::DeadlineLayer);

    /// Adds an [`AdmissionLayer`](crate::server::admission::AdmissionLayer) (server side):
    /// refuses at once a request whose deadline cannot fit its route's measured need.
    fn admission(layer: crate::server::admission::AdmissionLayer);

    /// Adds a [`PropagateDeadlineLayer`](crate::deadline::PropagateDeadlineLayer) (client side).
    fn propagate_deadline(layer: crate::deadline::PropagateDeadlineLayer);

    /// Adds a [`BulkheadLayer`](crate::client::overload::bulkhead::BulkheadLayer) (client side): a
    /// concurrency limit whose wait is bounded by the call's deadline.
    fn bulkhead(layer: crate::client::overload::bulkhead::BulkheadLayer);

    /// Adds a [`ThrottleLayer`](crate::client::overload::throttle::ThrottleLayer) (client side): adaptive
    /// throttling of first attempts.
    fn throttle<C>(layer: crate::client::overload::throttle::ThrottleLayer<C>);

    /// Adds an [`IdempotencyKeyLayer`](crate::idempotency::IdempotencyKeyLayer) (client side):
    /// one key per call on methods that are not idempotent; goes outside the retry layer.
    fn idempotency_keys(layer: crate::idempotency::IdempotencyKeyLayer);

    /// Adds an [`IdempotencyLayer`](crate::idempotency::IdempotencyLayer) (server side):
    /// a keyed request runs once, its duplicates are answered from the store.
    fn idempotency<St>(layer: crate::idempotency::IdempotencyLayer<St>);

    /// Adds a [`RetryLayer`](crate::client::retry::RetryLayer).
    fn retries<C>(layer: crate::client::retry::RetryLayer<C>);

    /// Adds a [`BreakerLayer`](crate::client::breaker::BreakerLayer).
    fn breaker<C>(layer: crate::client::breaker::BreakerLayer<C>);

    /// Adds an [`AttemptTimeoutLayer`](crate::client::attempt::AttemptTimeoutLayer): each call
    /// bounded by its attempt bound (fixed, or from the measured latency).
    fn attempt_timeout(layer: crate::client::attempt::AttemptTimeoutLayer);
}

#[cfg(test)]
mod tests {
    use super::ServiceBuilderExt;
    use crate::client::attempt::{AttemptBound, AttemptTimeoutLayer};
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

    /// The client's overload and key layers, by name: a POST goes through the key stamper,
    /// the throttle and the bulkhead and reaches the service with a key.
    #[tokio::test(start_paused = true)]
    async fn the_overload_and_key_layers_have_names() {
        use crate::client::overload::bulkhead::BulkheadLayer;
        use crate::client::overload::throttle::ThrottleLayer;
        use crate::idempotency::{IDEMPOTENCY_KEY, IdempotencyKeyLayer};
        use std::sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        };

        let keyed = Arc::new(AtomicBool::new(false));
        let seen = keyed.clone();
        let svc = ServiceBuilder::new()
            .idempotency_keys(IdempotencyKeyLayer::new())
            .throttle(ThrottleLayer::http())
            .bulkhead(BulkheadLayer::new(1).unwrap())
            .service(service_fn(move |req: Request<String>| {
                seen.store(
                    req.headers().contains_key(IDEMPOTENCY_KEY),
                    Ordering::SeqCst,
                );
                async { Ok::<_, Infallible>(Response::new(String::new())) }
            }));
        let post = Request::post("/charge").body(String::new()).unwrap();
        let response = svc.oneshot(post).await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(keyed.load(Ordering::SeqCst), "the POST carried a key");
    }

    /// The server's admission and idempotency layers, by name: a keyed POST runs once and its
    /// duplicate is answered from the store.
    #[tokio::test(start_paused = true)]
    async fn the_server_layers_have_names() {
        use crate::idempotency::{IDEMPOTENT_REPLAYED, IdempotencyLayer, MemoryStore};
        use crate::server::admission::AdmissionLayer;
        use bytes::Bytes;
        use http_body_util::Full;
        use std::sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        };

        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let svc = ServiceBuilder::new()
            .admission(AdmissionLayer::new())
            .idempotency(IdempotencyLayer::new(MemoryStore::new()))
            .service(service_fn(move |_req: Request<Full<Bytes>>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("done")))) }
            }));
        let post = || {
            Request::post("/charge")
                .header("idempotency-key", "\"k-1\"")
                .body(Full::default())
                .unwrap()
        };
        let first = svc.clone().oneshot(post()).await.unwrap();
        let again = svc.oneshot(post()).await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the duplicate did not run");
        assert!(first.headers().get(IDEMPOTENT_REPLAYED).is_none());
        assert_eq!(again.headers()[IDEMPOTENT_REPLAYED], "true");
    }
}
