//! A tower stack as a `reqwest_middleware::Middleware` (feature `reqwest-middleware`): the
//! rules are [`BackstopMiddleware`]'s docs.

use crate::BoxError;
use crate::reqwest::SyncBody;
use bytes::Bytes;
use http::Extensions;
use http_body::Body;
use reqwest::ResponseBuilderExt;
use reqwest_middleware::{Middleware, Next};
use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};
use tower_layer::Layer;
use tower_service::Service;

/// A future the chain's lifetime bounds (reqwest-middleware's `Next` borrows the client).
type BoxFuture<'n, T> = Pin<Box<dyn Future<Output = T> + Send + 'n>>;

/// A tower layer run as a [`Middleware`] (feature `reqwest-middleware`).
///
/// [`BackstopMiddleware`] runs any tower layer — backstop's client presets first of all —
/// inside a [`reqwest_middleware::ClientWithMiddleware`], so callers keep reqwest's own
/// builder (`.json()`, `.query()`, `.timeout()`, `resp.json()`) and get the stack. The layer
/// wraps a service that runs the rest of the middleware chain (and reqwest's client below it)
/// once per attempt.
///
/// ## What maps to what
///
/// - **Deadline.** A per-request [`timeout`](reqwest_middleware::RequestBuilder::timeout)
///   becomes the call's [`Deadline`](crate::deadline::Deadline) (the whole call, retries
///   included, as reqwest means it) and is taken off the request, so reqwest arms no timer of
///   its own per attempt: the stack owns the timing. A `Deadline` set with
///   [`with_extension`](reqwest_middleware::RequestBuilder::with_extension), or a handler's
///   inherited deadline under backstop's server layer, counts too; the earliest wins. A
///   client-wide `ClientBuilder::timeout` stays reqwest's, per attempt.
/// - **Extensions.** The middleware chain's extensions are visible to the stack (a `Deadline`
///   or `RetryOverrides` there reaches backstop's layers), and each attempt passes a copy of
///   them down the chain: what a middleware below writes there is not seen above.
/// - **Bodies.** A request body reqwest knows the length of is replayed byte for byte by the
///   retry layer; a stream is sent once. The response's body is the stack's (bounded by the
///   deadline), and [`Response::url`](reqwest::Response::url) is the one reqwest reported.
/// - **Errors.** When the last attempt failed in reqwest, the error is
///   [`Error::Reqwest`](reqwest_middleware::Error::Reqwest) with reqwest's own error, so
///   `is_connect()`, `is_timeout()` and `status()` answer as without the middleware. The
///   stack's own refusals (the deadline passed, the breaker is open, the attempt bound) are
///   [`Error::Middleware`](reqwest_middleware::Error::Middleware) holding backstop's error;
///   `backstop::find::<backstop::DeadlineExceeded>(&*err)` and the like tell which.
///   A response says what the call did in its `CallInfo` extension (`backstop::client::call_info`
///   reads it through [`Response::extensions`](reqwest::Response::extensions)).
///
/// Only a checked stack goes in: `BackstopMiddleware::new(backstop::client::http())` without
/// `.build()?` does not compile, so a misconfigured preset is an error where the client is
/// built, never a panic at its first request:
///
/// ```compile_fail
/// let _ = backstop::reqwest::BackstopMiddleware::new(backstop::client::http().max_attempts(20));
/// let _client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(backstop::reqwest::BackstopMiddleware::new(backstop::client::http().max_attempts(20)))
///     .build();
/// ```
///
/// ## Order
///
/// Middlewares added before this one run once per call; those after it run once per attempt.
/// Put authentication that must be fresh on every attempt after it, tracing of the whole call
/// before it.
///
/// ```no_run
/// use backstop::reqwest::BackstopMiddleware;
/// use std::time::Duration;
///
/// # #[allow(dead_code)]
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(BackstopMiddleware::new(backstop::client::http().name("inventory").build()?))
///     .build();
/// let response = client
///     .put("http://127.0.0.1:3000/item/1")
///     .header("idempotency-key", "\"9c1b6b1e\"")
///     .body("{\"count\": 3}")
///     .timeout(Duration::from_secs(2))
///     .send()
///     .await?;
/// // What the call did rides on the response (no `CallInfo`: one attempt, nothing to say).
/// let attempts = response
///     .extensions()
///     .get::<backstop::client::retry::CallInfo>()
///     .map_or(1, |info| info.attempts());
/// println!("{} after {attempts} attempt(s)", response.status());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct BackstopMiddleware<L> {
    layer: L,
}

impl<L> BackstopMiddleware<L> {
    /// Runs `layer` around the rest of the middleware chain, for every request. A backstop
    /// preset goes in as `ClientBuilder::build` returns it (a checked `ClientLayer`): an
    /// unchecked `ClientBuilder` is not a layer, so a misconfiguration is
    /// an error where the client is built, never a panic at its first request.
    pub fn new(layer: L) -> Self {
        Self { layer }
    }

    /// The layer, to read its stats (a preset's `retry_layer().stats()`, say).
    pub fn get_ref(&self) -> &L {
        &self.layer
    }
}

impl<L: fmt::Debug> fmt::Debug for BackstopMiddleware<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackstopMiddleware")
            .field("layer", &self.layer)
            .finish()
    }
}

/// The rest of the middleware chain as a tower service: what the layer of a
/// [`BackstopMiddleware`] wraps. Each call is one attempt, with a copy of the chain's
/// extensions.
#[derive(Clone)]
pub struct NextService<'n> {
    next: Next<'n>,
    extensions: Extensions,
}

impl fmt::Debug for NextService<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NextService").finish_non_exhaustive()
    }
}

impl<'n, B> Service<http::Request<B>> for NextService<'n>
where
    B: Body + Send + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<reqwest::Body>;
    type Error = BoxError;
    type Future = BoxFuture<'n, Result<http::Response<reqwest::Body>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let next = self.next.clone();
        let mut extensions = self.extensions.clone();
        // A middleware below reads the attempt's deadline, not the one the call was given.
        if let Some(deadline) = request.extensions().get::<crate::deadline::Deadline>() {
            extensions.insert(*deadline);
        }
        let request = request.map(|body| reqwest::Body::wrap(SyncBody::new(body)));
        Box::pin(async move {
            let request = reqwest::Request::try_from(request)?;
            match next.run(request, &mut extensions).await {
                Ok(response) => Ok(into_http(response)),
                Err(reqwest_middleware::Error::Reqwest(e)) => Err(e.into()),
                Err(reqwest_middleware::Error::Middleware(e)) => Err(e.into()),
            }
        })
    }
}

/// reqwest's response as an `http` one that keeps its URL (reqwest's own conversion drops it).
fn into_http(response: reqwest::Response) -> http::Response<reqwest::Body> {
    let url = response.url().clone();
    let mut response = http::Response::from(response);
    if let Ok(carrier) = http::Response::builder().url(url).body(()) {
        response
            .extensions_mut()
            .extend(carrier.into_parts().0.extensions);
    }
    response
}

#[async_trait::async_trait]
impl<L, RB> Middleware for BackstopMiddleware<L>
where
    L: for<'n> Layer<NextService<'n>> + Send + Sync + 'static,
    for<'n> <L as Layer<NextService<'n>>>::Service: Service<
            http::Request<reqwest::Body>,
            Response = http::Response<RB>,
            Error = BoxError,
            Future: Send,
        > + Send,
    RB: Body + Send + 'static,
    RB::Data: Into<Bytes>,
    RB::Error: Into<BoxError>,
{
    async fn handle(
        &self,
        mut request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        // reqwest's per-request timeout is the whole call's: the stack's deadline, not a
        // timer reqwest would arm again on every attempt.
        let timeout = request.timeout_mut().take();
        let mut request = match http::Request::<reqwest::Body>::try_from(request) {
            Ok(request) => request,
            Err(e) => return Err(e.into()),
        };
        // The chain's extensions first, then the deadline: the earliest of a `Deadline` the
        // chain or the request carries and the request's timeout (extending after would let
        // a later `Deadline` in the chain replace an earlier timeout).
        request.extensions_mut().extend(extensions.clone());
        if let Some(timeout) = timeout {
            let deadline = crate::deadline::Deadline::after(timeout);
            let earliest = match request.extensions().get::<crate::deadline::Deadline>() {
                Some(set) => (*set).min(deadline),
                None => deadline,
            };
            request.extensions_mut().insert(earliest);
        }
        let mut service = self.layer.layer(NextService {
            next,
            extensions: extensions.clone(),
        });
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .map_err(into_middleware_error)?;
        match service.call(request).await {
            Ok(response) => Ok(reqwest::Response::from(
                response.map(|body| reqwest::Body::wrap(SyncBody::new(body))),
            )),
            Err(e) => Err(into_middleware_error(e)),
        }
    }
}

/// The stack's error for reqwest-middleware's caller: reqwest's own when the last attempt
/// failed in reqwest (under backstop's `RetryError`, which says how many attempts it took),
/// backstop's error otherwise, as its own type, so `anyhow::Error::downcast_ref` and
/// `chain()` find it (anyhow's `from_boxed` would hide it behind a wrapper).
fn into_middleware_error(e: BoxError) -> reqwest_middleware::Error {
    use crate::{AttemptTimedOut, BreakerOpen, DeadlineExceeded};
    let e = match e.downcast::<crate::client::retry::RetryError>() {
        Ok(retry) if retry.source_ref().is::<reqwest::Error>() => retry.into_inner(),
        Ok(retry) => return reqwest_middleware::Error::Middleware(anyhow::Error::new(*retry)),
        Err(e) => e,
    };
    let e = match e.downcast::<reqwest::Error>() {
        Ok(e) => return reqwest_middleware::Error::Reqwest(*e),
        Err(e) => e,
    };
    let any = match e.downcast::<DeadlineExceeded>() {
        Ok(e) => anyhow::Error::new(*e),
        Err(e) => match e.downcast::<BreakerOpen>() {
            Ok(e) => anyhow::Error::new(*e),
            Err(e) => match e.downcast::<AttemptTimedOut>() {
                Ok(e) => anyhow::Error::new(*e),
                Err(e) => anyhow::Error::new(LayerError(e)),
            },
        },
    };
    reqwest_middleware::Error::Middleware(any)
}

/// An error of a layer backstop does not know, kept in the chain as its source.
#[derive(Debug)]
struct LayerError(BoxError);

impl fmt::Display for LayerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the middleware's tower stack failed")
    }
}

impl std::error::Error for LayerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}
