//! The client half: one fresh `Idempotency-Key` per logical call.
//!
//! # Concurrency
//!
//! Clones of a layer share nothing: each key is 128 bits drawn from the OS's generator, which
//! keeps no state here.

use crate::idempotency::key::{IDEMPOTENCY_KEY, format_key};
use http::{Method, Request};
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// 128 random bits from the operating system's generator: a key no one can guess, unique
/// across a fleet (also each claim's token on the server). The OS generator fails only where
/// there is none; bits from the process's own generator are still unique, if guessable.
pub(crate) fn random_bits() -> u128 {
    let mut bytes = [0; 16];
    if getrandom::fill(&mut bytes).is_err() {
        return fastrand::u128(..);
    }
    u128::from_le_bytes(bytes)
}

/// Whether a request of `method` gets a key: POST and PATCH, the methods RFC 9110 (§9.2.2)
/// does not define as idempotent. The others are idempotent by definition, so the retry
/// layer retries them without a key, and a server needs none to run them twice safely.
fn keyed(method: &Method) -> bool {
    method == Method::POST || method == Method::PATCH
}

/// Stamps `Idempotency-Key: "<32 hex digits>"` (128 random bits from the OS) on each POST and
/// PATCH that has no key, and leaves a key the caller set, and every other method, alone.
///
/// Put it outside the retry layer: each logical call gets one key, and every attempt and
/// hedge of it carries that key, so a server behind
/// [`IdempotencyLayer`](crate::idempotency::IdempotencyLayer) runs it once. A keyed request is one the
/// retry layer retries and hedges: stamp keys only for a server that de-duplicates.
///
/// ```
/// use backstop::idempotency::IdempotencyKeyLayer;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let svc = ServiceBuilder::new()
///     .layer(IdempotencyKeyLayer::new())
///     .service(service_fn(|req: http::Request<()>| async move {
///         Ok::<_, std::convert::Infallible>(req.headers().get("idempotency-key").cloned())
///     }));
/// let key = svc.oneshot(http::Request::post("/orders").body(()).unwrap()).await.unwrap();
/// assert_eq!(key.unwrap().len(), 34);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct IdempotencyKeyLayer {
    on: bool,
}

impl Default for IdempotencyKeyLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyKeyLayer {
    /// Keys on POST and PATCH, 128 random bits from the OS each.
    pub fn new() -> Self {
        Self { on: true }
    }

    /// A layer that stamps nothing (a stack that may turn keys on later keeps its type).
    pub fn off() -> Self {
        Self { on: false }
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
        if self.layer.on && keyed(req.method()) && !req.headers().contains_key(IDEMPOTENCY_KEY) {
            let key = format_key(random_bits());
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
        let layer = IdempotencyKeyLayer::new();
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
            crate::idempotency::key::parse_key(&http::HeaderValue::from_str(&a).unwrap(), 255)
                .unwrap();
        assert_eq!(parsed.len(), 32);
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
        assert_ne!(random_bits(), random_bits());
    }
}
