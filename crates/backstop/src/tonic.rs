//! tonic clients as nameable types (feature `tonic`).
//!
//! The retry layer hands its transport a [`ReplayBody`] (so an attempt can be sent again);
//! a tonic `Channel` takes `tonic::body::Body`. [`TonicBodyLayer`] is that conversion as a
//! named layer, so the whole client has a type a struct field or an axum `State` can spell:
//! [`TonicClient<Channel>`](TonicClient) for the [`grpc()`](crate::client::grpc) preset,
//! [`TonicMethodsClient<Channel>`](TonicMethodsClient) for the service-config client.
//! What a call did is in `tonic::Response::extensions()` ([`CallInfo`]) and, for a failed
//! call, in its `Status` ([`status_info`]).
//!
//! ```
//! use backstop::tonic::{TonicBodyLayer, TonicClient};
//! use tonic::transport::{Channel, Endpoint};
//! use tower::ServiceBuilder;
//!
//! /// A client of the stock service, as a struct field.
//! struct Stock {
//!     channel: TonicClient<Channel>,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let channel = Endpoint::from_static("http://127.0.0.1:50051").connect_lazy();
//! let stock = Stock {
//!     channel: ServiceBuilder::new()
//!         .layer(backstop::client::grpc().name("stock").build().expect("a valid stack"))
//!         .layer(TonicBodyLayer)
//!         .service(channel),
//! };
//! // Generated clients take it as is: `StockClient::new(stock.channel.clone())`.
//! let _grpc = tonic::client::Grpc::new(stock.channel);
//! # }
//! ```

use crate::ReplayBody;
use crate::client::retry::CallInfo;
use ::tonic::body::Body;
use http::Request;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// The [`grpc()`](crate::client::grpc) preset around a tonic transport `S` (a `Channel`),
/// with [`TonicBodyLayer`] between them.
pub type TonicClient<S> = crate::GrpcClient<TonicBody<S>>;

/// The service-config client ([`ClientBuilder::service_config`](crate::ClientBuilder::service_config))
/// around a tonic transport `S`, with [`TonicBodyLayer`] between them.
#[cfg(feature = "service-config")]
pub type TonicMethodsClient<S> = crate::methods::MethodsClient<TonicBody<S>>;

/// What a failed call's `tonic::Status` says of it: how many attempts it took and why it was
/// not retried ([`CallInfo::of_metadata`]: the retry layer writes it in the failure's
/// metadata, as a `Status` keeps no extensions). `None` when the status carries none: a call
/// whose one attempt failed with nothing to tell, or a status no retry layer made (a
/// deadline spent before the call was sent).
///
/// ```
/// use backstop::client::retry::{CallInfo, GiveUp};
///
/// let mut status = tonic::Status::unavailable("down");
/// status.metadata_mut().insert("backstop-attempts", "3".parse().unwrap());
/// status.metadata_mut().insert("backstop-gave-up", "attempts".parse().unwrap());
/// let info = backstop::tonic::status_info(&status);
/// assert_eq!(info, Some(CallInfo::new(3, Some(GiveUp::Attempts))));
/// ```
pub fn status_info(status: &::tonic::Status) -> Option<CallInfo> {
    CallInfo::of_metadata(status.metadata().as_ref())
}

/// Hands a tonic transport the body it takes: `Request<ReplayBody<Body>>` in,
/// `Request<Body>` out (`Body::new`, no copy). Put it between a client preset and a tonic
/// `Channel`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TonicBodyLayer;

impl<S> Layer<S> for TonicBodyLayer {
    type Service = TonicBody<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TonicBody { inner }
    }
}

// The service of `TonicBodyLayer`: public (it is in `TonicClient`) but unnameable, as only
// this crate names it.
mod service {
    use super::*;

    /// The service of [`TonicBodyLayer`]: readiness, responses and errors are the transport's.
    #[derive(Debug, Clone)]
    pub struct TonicBody<S> {
        pub(super) inner: S,
    }

    impl<S> TonicBody<S> {
        /// The transport.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The transport, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// Unwraps the transport.
        pub fn into_inner(self) -> S {
            self.inner
        }
    }

    impl<S> Service<Request<ReplayBody<Body>>> for TonicBody<S>
    where
        S: Service<Request<Body>>,
    {
        type Response = S::Response;
        type Error = S::Error;
        type Future = S::Future;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, req: Request<ReplayBody<Body>>) -> S::Future {
            self.inner.call(req.map(Body::new))
        }
    }
}
use service::TonicBody;
