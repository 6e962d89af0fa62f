use super::{AdaptiveThrottle, Throttle, service::Shared};
use crate::rt::DependencyName;
use crate::{GrpcClassifier, HttpClassifier};
use std::sync::Arc;
use tower_layer::Layer;

/// Refuses first attempts locally while the dependency accepts too few of them (see the
/// [module docs](super)).
///
/// Clones share one [`AdaptiveThrottle`]; so do layers built [`with`](Self::with) the same
/// one.
///
/// ```
/// use backstop::client::overload::throttle::ThrottleLayer;
/// use tower::ServiceBuilder;
///
/// let throttle = ThrottleLayer::http();
/// let client = ServiceBuilder::new()
///     .layer(throttle.clone())
///     .service(tower::service_fn(|_req: http::Request<String>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
///     }));
/// # let _ = client;
/// assert_eq!(throttle.throttle().rejections(), 0);
/// ```
#[derive(Debug)]
pub struct ThrottleLayer<C> {
    shared: Arc<Shared<C>>,
}

impl<C> Clone for ThrottleLayer<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl ThrottleLayer<HttpClassifier> {
    /// The default throttle for HTTP dependencies.
    pub fn http() -> Self {
        Self::own(Some(HttpClassifier::new()))
    }
}

impl ThrottleLayer<GrpcClassifier> {
    /// The default throttle for gRPC dependencies.
    pub fn grpc() -> Self {
        Self::own(Some(GrpcClassifier::new()))
    }
}

impl<C> ThrottleLayer<C> {
    /// A layer counting into `throttle`, classifying with `classifier`.
    pub fn with(throttle: Arc<AdaptiveThrottle>, classifier: C) -> Self {
        Self::from_parts(throttle, false, Some(classifier), DependencyName::default())
    }

    /// A layer with a throttle of its own, of the defaults.
    fn own(classifier: Option<C>) -> Self {
        let throttle = Arc::new(AdaptiveThrottle::new());
        Self::from_parts(throttle, true, classifier, DependencyName::default())
    }

    /// A layer that refuses nothing and counts nothing: every call passes to the inner
    /// service (its response body wrapped, so the stack's type stays the same). For a stack
    /// whose type has a throttle in it, such as the client presets, to turn it off.
    ///
    /// ```
    /// use backstop::HttpClassifier;
    /// use backstop::client::overload::throttle::ThrottleLayer;
    ///
    /// let off = ThrottleLayer::<HttpClassifier>::off();
    /// assert!(!off.is_on());
    /// assert!(ThrottleLayer::http().is_on());
    /// ```
    pub fn off() -> Self {
        Self::own(None)
    }

    fn from_parts(
        throttle: Arc<AdaptiveThrottle>,
        own_throttle: bool,
        classifier: Option<C>,
        name: DependencyName,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                throttle,
                own_throttle,
                classifier,
                name,
                #[cfg(feature = "metrics")]
                metrics: Default::default(),
            }),
        }
    }

    /// Whether the layer throttles (`false` for [`off`](Self::off)).
    pub fn is_on(&self) -> bool {
        self.shared.classifier.is_some()
    }

    /// The shared state: its probability, window and refusals.
    pub fn throttle(&self) -> &Arc<AdaptiveThrottle> {
        &self.shared.throttle
    }

    /// This layer's configuration for the dependency `name`: its events and metrics carry
    /// the name as `dependency`. Naming is configuration, done before the layer serves: the
    /// layer returned has a name and metric handles of its own, and a throttle of its own
    /// (of the defaults) when this layer made its own ([`http`](ThrottleLayer::http),
    /// [`grpc`](ThrottleLayer::grpc)); a throttle given [`with`](Self::with) is shared, as
    /// given. The layers cloned before keep theirs.
    ///
    /// ```
    /// use backstop::client::overload::throttle::ThrottleLayer;
    ///
    /// let throttle = ThrottleLayer::http().named("inventory");
    /// assert_eq!(throttle.name(), "inventory");
    /// ```
    #[must_use]
    pub fn named(&self, name: &str) -> Self
    where
        C: Clone,
    {
        let shared = &self.shared;
        let throttle = if shared.own_throttle {
            Arc::new(AdaptiveThrottle::new())
        } else {
            shared.throttle.clone()
        };
        Self::from_parts(
            throttle,
            shared.own_throttle,
            shared.classifier.clone(),
            DependencyName::new(name),
        )
    }

    /// The dependency's name (`""` when unnamed).
    pub fn name(&self) -> &str {
        self.shared.name.get()
    }
}

impl<S, C> Layer<S> for ThrottleLayer<C> {
    type Service = Throttle<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle::from_shared(inner, self.shared.clone())
    }
}
