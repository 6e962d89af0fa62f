//! [reqwest](https://docs.rs/reqwest)'s `Client` as a `tower::Service<http::Request<B>>`, so
//! backstop's client stacks (and any tower layer) wrap it like a hyper client.
//!
//! ```no_run
//! use backstop::reqwest::Reqwest;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[allow(dead_code)]
//! # async fn run() -> Result<(), backstop::BoxError> {
//! let inventory = ServiceBuilder::new()
//!     .layer(backstop::client::http().name("inventory").timeout(Duration::from_secs(2)).build()?)
//!     .service(Reqwest::new(reqwest::Client::new()));
//! let request = http::Request::put("http://127.0.0.1:3000/item/1")
//!     .body(Full::new(Bytes::from_static(b"{\"count\": 3}")))?;
//! let response = inventory.oneshot(request).await?;
//! # let _ = response;
//! # Ok(())
//! # }
//! ```
//!
//! # Any request body, `Sync` or not
//!
//! reqwest takes a streaming body only if it is `Sync`, and many are not: axum's and hyper's
//! incoming bodies, or anything boxed as `UnsyncBoxBody`, so an axum handler could not forward
//! its request body through reqwest. [`Reqwest`] accepts any `Send` body: it hands reqwest a
//! [`SyncBody`], which reaches the body only through `&mut` (polling it) and answers reqwest's
//! `&self` questions (is it over, how long is it) from what it saw at the last poll. Nothing is
//! buffered; under backstop's retry layer the body is a `ReplayBody`, replayed byte for byte.
//!
//! # Errors
//!
//! A request reqwest cannot send (a URI it cannot take, say) fails with reqwest's error, as
//! does every transport failure. The response is reqwest's, as an
//! `http::Response<reqwest::Body>`.
//!
//! # Feature flags
//!
//! - `reqwest-middleware` (off by default): [`BackstopMiddleware`], the same stacks as a
//!   `reqwest_middleware::Middleware`, for callers who keep reqwest's request builder
//!   (`ClientBuilder::new(reqwest::Client::new()).with(..)`).

#[cfg(feature = "reqwest-middleware")]
mod middleware;
#[cfg(feature = "reqwest-middleware")]
pub use middleware::BackstopMiddleware;

use crate::BoxError;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::{
    pin::Pin,
    task::{Context, Poll},
};
use sync_wrapper::SyncWrapper;
use tower_service::Service;

/// reqwest's client as a tower service of `http` types; see the [crate docs](crate).
///
/// Always ready (reqwest's pool queues requests itself); clones share the client's pool.
#[derive(Debug, Clone, Default)]
pub struct Reqwest {
    client: reqwest::Client,
}

impl Reqwest {
    /// Wraps `client`.
    pub fn new(client: reqwest::Client) -> Self {
        Self { client }
    }

    /// The client.
    pub fn get_ref(&self) -> &reqwest::Client {
        &self.client
    }
}

impl From<reqwest::Client> for Reqwest {
    fn from(client: reqwest::Client) -> Self {
        Self::new(client)
    }
}

impl<B> Service<http::Request<B>> for Reqwest
where
    B: Body + Send + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<reqwest::Body>;
    type Error = reqwest::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let request = request.map(|body| reqwest::Body::wrap(SyncBody::new(body)));
        let state = match reqwest::Request::try_from(request) {
            Ok(request) => Ok(Box::pin(self.client.execute(request)) as Pending),
            Err(e) => Err(Some(e)),
        };
        ResponseFuture { state }
    }
}

/// reqwest's own future, boxed (its type cannot be named).
type Pending = Pin<Box<dyn Future<Output = Result<reqwest::Response, reqwest::Error>> + Send>>;

// The response future of `Reqwest`: public (it is its `Service::Future`) but unnameable, as
// only this crate names it.
mod future {
    use super::*;

    /// The response future of [`Reqwest`].
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture {
        /// The request in flight, or why it could not be sent.
        pub(super) state: Result<Pending, Option<reqwest::Error>>,
    }

    impl std::fmt::Debug for ResponseFuture {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("ResponseFuture").finish_non_exhaustive()
        }
    }

    impl Future for ResponseFuture {
        type Output = Result<http::Response<reqwest::Body>, reqwest::Error>;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match &mut self.state {
                Ok(future) => future.as_mut().poll(cx).map_ok(http::Response::from),
                Err(e) => Poll::Ready(Err(e
                    .take()
                    .expect("ResponseFuture polled after completion"))),
            }
        }
    }
}
use future::ResponseFuture;

pin_project! {
    /// A request body that is `Sync` whatever it wraps: the body is reached only through
    /// `&mut` (polling it), and `is_end_stream` and `size_hint`, which take `&self`, answer
    /// what the body said after its last poll (and before the first, what it said when
    /// wrapped).
    pub struct SyncBody<B> {
        #[pin]
        inner: SyncWrapper<B>,
        end: bool,
        hint: SizeHint,
    }
}

impl<B: Body> SyncBody<B> {
    /// Wraps `body`.
    pub fn new(body: B) -> Self {
        Self {
            end: body.is_end_stream(),
            hint: body.size_hint(),
            inner: SyncWrapper::new(body),
        }
    }

    /// Unwraps the body.
    pub fn into_inner(self) -> B {
        self.inner.into_inner()
    }
}

impl<B> std::fmt::Debug for SyncBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncBody")
            .field("end", &self.end)
            .field("hint", &self.hint)
            .finish_non_exhaustive()
    }
}

impl<B> Body for SyncBody<B>
where
    B: Body,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let mut inner = this.inner.get_pin_mut();
        let frame = inner.as_mut().poll_frame(cx);
        if frame.is_ready() {
            *this.end = inner.is_end_stream();
            *this.hint = inner.size_hint();
        }
        frame.map(|frame| {
            frame.map(|frame| {
                frame
                    .map(|frame| frame.map_data(Into::into))
                    .map_err(Into::into)
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.end
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}
