//! The client half: one fresh `Idempotency-Key` per logical call.
//!
//! # Concurrency
//!
//! Clones of a layer share its generator. The OS generator (the default) has no state here;
//! a seeded generator (tests) is one `fastrand::Rng` behind a mutex held for one draw, so
//! a seed gives the same keys in the same order of calls.

use crate::idempotency::key::{IDEMPOTENCY_KEY, format_key};
use http::{Method, Request};
use std::{
    fmt,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};
use tower_layer::Layer;
use tower_service::Service;

/// Where keys come from: the OS's generator (unguessable), or a seeded one for tests.
#[derive(Clone)]
pub struct KeyGenerator(Source);

#[derive(Clone)]
enum Source {
    Os,
    Seeded(Arc<Mutex<fastrand::Rng>>),
}

impl fmt::Debug for KeyGenerator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Source::Os => "KeyGenerator::Os",
            Source::Seeded(_) => "KeyGenerator::Seeded",
        })
    }
}

impl KeyGenerator {
    /// 128 bits from the operating system's generator per key.
    pub fn os() -> Self {
        Self(Source::Os)
    }

    /// 128 bits from a generator seeded with `seed` (tests: keys are guessable).
    pub fn seeded(seed: u64) -> Self {
        Self(Source::Seeded(Arc::new(Mutex::new(
            fastrand::Rng::with_seed(seed),
        ))))
    }

    /// The next key's 128 bits.
    pub fn next_bits(&self) -> u128 {
        match &self.0 {
            Source::Os => {
                let mut bytes = [0; 16];
                // The OS generator fails only where there is none; a key from the process's
                // own generator is still unique, if guessable.
                if getrandom::fill(&mut bytes).is_err() {
                    return fastrand::u128(..);
                }
                u128::from_le_bytes(bytes)
            }
            Source::Seeded(rng) => rng
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .u128(..),
        }
    }
}

/// Stamps `Idempotency-Key: "<32 hex digits>"` on each request of its methods (POST and
/// PATCH by default) that has no key, and leaves a key the caller set alone.
///
/// Put it outside the retry layer: each logical call gets one key, and every attempt and
/// hedge of it carries that key, so a server behind
/// [`IdempotencyLayer`](crate::idempotency::IdempotencyLayer) runs it once. A keyed request is one the
/// retry layer retries and hedges: stamp keys only for a server that de-duplicates.
///
/// ```
/// use backstop::idempotency::{IdempotencyKeyLayer, KeyGenerator};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let svc = ServiceBuilder::new()
///     .layer(IdempotencyKeyLayer::new().generator(KeyGenerator::seeded(1)))
///     .service(service_fn(|req: http::Request<()>| async move {
///         Ok::<_, std::convert::Infallible>(req.headers().get("idempotency-key").cloned())
///     }));
/// let key = svc.oneshot(http::Request::post("/orders").body(()).unwrap()).await.unwrap();
/// assert_eq!(key.unwrap().len(), 34);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct IdempotencyKeyLayer {
    methods: Arc<[Method]>,
    generator: KeyGenerator,
}

impl Default for IdempotencyKeyLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyKeyLayer {
    /// Keys on POST and PATCH, from the OS generator.
    pub fn new() -> Self {
        Self {
            methods: Arc::new([Method::POST, Method::PATCH]),
            generator: KeyGenerator::os(),
        }
    }

    /// A layer that stamps nothing (a stack that may turn keys on later keeps its type).
    pub fn off() -> Self {
        Self::new().methods([])
    }

    /// The methods that get keys.
    #[must_use]
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Where keys come from.
    #[must_use]
    pub fn generator(mut self, generator: KeyGenerator) -> Self {
        self.generator = generator;
        self
    }

    /// Whether the layer stamps any method.
    pub fn is_on(&self) -> bool {
        !self.methods.is_empty()
    }
}

impl<S> Layer<S> for IdempotencyKeyLayer {
    type Service = IdempotencyKey<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyKey {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of an [`IdempotencyKeyLayer`].
#[derive(Debug, Clone)]
pub struct IdempotencyKey<S> {
    inner: S,
    layer: IdempotencyKeyLayer,
}

impl<S> IdempotencyKey<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<Request<B>> for IdempotencyKey<S>
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
        if self.layer.methods.contains(req.method()) && !req.headers().contains_key(IDEMPOTENCY_KEY)
        {
            let key = format_key(self.layer.generator.next_bits());
            req.headers_mut().insert(IDEMPOTENCY_KEY, key);
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{ServiceExt, service_fn};

    async fn key_of(layer: &IdempotencyKeyLayer, req: Request<()>) -> Option<String> {
        let svc = layer.layer(service_fn(|req: Request<()>| async move {
            Ok::<_, std::convert::Infallible>(
                req.headers()
                    .get(IDEMPOTENCY_KEY)
                    .map(|v| v.to_str().unwrap().to_owned()),
            )
        }));
        svc.oneshot(req).await.unwrap()
    }

    #[tokio::test]
    async fn posts_and_patches_get_a_fresh_key_each() {
        let layer = IdempotencyKeyLayer::new().generator(KeyGenerator::seeded(3));
        let a = key_of(&layer, Request::post("/").body(()).unwrap())
            .await
            .unwrap();
        let b = key_of(&layer, Request::patch("/").body(()).unwrap())
            .await
            .unwrap();
        assert_ne!(a, b);
        assert!(
            a.starts_with('"') && a.ends_with('"') && a.len() == 34,
            "{a}"
        );
        let parsed =
            crate::idempotency::parse_key(&http::HeaderValue::from_str(&a).unwrap(), 255).unwrap();
        assert_eq!(parsed.len(), 32);
        // The same seed, the same keys.
        let again = IdempotencyKeyLayer::new().generator(KeyGenerator::seeded(3));
        assert_eq!(
            key_of(&again, Request::post("/").body(()).unwrap())
                .await
                .unwrap(),
            a
        );
    }

    #[tokio::test]
    async fn other_methods_and_keyed_requests_are_left_alone() {
        let layer = IdempotencyKeyLayer::new();
        assert_eq!(
            key_of(&layer, Request::get("/").body(()).unwrap()).await,
            None
        );
        assert_eq!(
            key_of(&layer, Request::put("/").body(()).unwrap()).await,
            None
        );
        let mine = Request::post("/")
            .header("idempotency-key", "mine")
            .body(())
            .unwrap();
        assert_eq!(key_of(&layer, mine).await.as_deref(), Some("mine"));
        assert_eq!(
            key_of(
                &IdempotencyKeyLayer::off(),
                Request::post("/").body(()).unwrap()
            )
            .await,
            None
        );
    }

    #[test]
    fn os_keys_differ() {
        let g = KeyGenerator::os();
        assert_ne!(g.next_bits(), g.next_bits());
    }
}
