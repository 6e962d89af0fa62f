//! Helpers shared by the layer tests.
#![allow(dead_code, unreachable_pub)]

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::channel::{Channel, Sender};
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
};
use tower::{Service, service_fn};

/// Sets a flag when dropped: proves a future was cancelled.
#[derive(Debug)]
pub struct DropFlag(pub Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A service whose calls never finish, and which records that each call's future was dropped.
#[derive(Debug, Clone, Default)]
pub struct Hang {
    /// How many calls were made.
    pub calls: Arc<AtomicUsize>,
    /// Whether a call's future was dropped.
    pub dropped: Arc<AtomicBool>,
}

impl<B> Service<Request<B>> for Hang {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<String>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let guard = DropFlag(self.dropped.clone());
        Box::pin(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            unreachable!()
        })
    }
}

/// A streamed body: the sender pushes frames, the body yields them.
pub fn streamed() -> (Sender<Bytes>, Channel<Bytes>) {
    Channel::new(4)
}

/// A gRPC request, with a `grpc-timeout` if given.
pub fn grpc_request(timeout: Option<&str>) -> Request<String> {
    let mut builder = Request::builder().header("content-type", "application/grpc");
    if let Some(t) = timeout {
        builder = builder.header("grpc-timeout", t);
    }
    builder.body(String::new()).unwrap()
}

/// A plain HTTP request, with a `grpc-timeout` if given.
pub fn http_request(timeout: Option<&str>) -> Request<String> {
    let mut builder = Request::builder();
    if let Some(t) = timeout {
        builder = builder.header("grpc-timeout", t);
    }
    builder.body(String::new()).unwrap()
}

/// A gRPC or plain HTTP request, with a `grpc-timeout` if given.
pub fn request(grpc: bool, timeout: Option<&str>) -> Request<String> {
    if grpc {
        grpc_request(timeout)
    } else {
        http_request(timeout)
    }
}

/// A service that answers its first call at once with `body` streamed as the response body
/// (marked as gRPC when `grpc`).
pub fn streaming(
    body: Channel<Bytes>,
    grpc: bool,
) -> impl Service<Request<String>, Response = Response<Channel<Bytes>>, Error = Infallible> {
    let mut body = Some(body);
    service_fn(move |_req: Request<String>| {
        let mut response = Response::new(body.take().expect("one call"));
        if grpc {
            response
                .headers_mut()
                .insert("content-type", "application/grpc".parse().unwrap());
        }
        std::future::ready(Ok::<_, Infallible>(response))
    })
}
