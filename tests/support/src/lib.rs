//! Test helpers shared by the backstop crates' tests (a dev-dependency only, never published):
//! the requests and replies the tests send and script, aliases for `tower-test` mocks, and
//! services that hang or record being dropped. Like tower's own `tests/support`, one place, so
//! a test reads as what it checks.

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
    time::Duration,
};
use tower::{Service, service_fn};

/// One millisecond.
pub const MS: Duration = Duration::from_millis(1);
/// One second.
pub const S: Duration = Duration::from_secs(1);

/// A `tower-test` mock service answering `Response<String>` to requests of type `Req`.
pub type Mock<Req = Request<String>> = tower_test::mock::Mock<Req, Response<String>>;
/// The handle of a [`Mock`].
pub type Handle<Req = Request<String>> = tower_test::mock::Handle<Req, Response<String>>;

/// A scripted dependency: a cloneable service answering `Response<String>` to `Req`, never
/// failing, whose futures are `Send` (what the layers under test wrap). Test helpers return
/// `impl Dependency<Req>` instead of spelling the bounds out each time.
pub trait Dependency<Req>:
    Service<Req, Response = Response<String>, Error = Infallible, Future: Send> + Clone + Send + 'static
{
}

impl<S, Req> Dependency<Req> for S where
    S: Service<Req, Response = Response<String>, Error = Infallible, Future: Send>
        + Clone
        + Send
        + 'static
{
}

/// A reply with `status` and an empty body.
pub fn reply(status: u16) -> Response<String> {
    Response::builder()
        .status(status)
        .body(String::new())
        .unwrap()
}

/// A gRPC reply with `grpc-status: code` in its headers (trailers-only) and an empty body.
pub fn grpc_reply(code: u8) -> Response<String> {
    grpc_status(code.into(), None)
}

/// A trailers-only gRPC reply with `code`, and `grpc-retry-pushback-ms` if given.
pub fn grpc_status(code: u16, pushback: Option<&str>) -> Response<String> {
    let mut reply = Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", code.to_string());
    if let Some(p) = pushback {
        reply = reply.header("grpc-retry-pushback-ms", p);
    }
    reply.body(String::new()).unwrap()
}

/// `GET http://svc/x` with `body`.
pub fn get_with(body: &str) -> Request<String> {
    Request::get("http://svc/x").body(body.to_owned()).unwrap()
}

/// `GET http://svc/x`, no body.
pub fn get() -> Request<String> {
    get_with("")
}

/// `POST http://svc/x` with `body`.
pub fn post(body: &str) -> Request<String> {
    Request::post("http://svc/x").body(body.to_owned()).unwrap()
}

/// A gRPC call, `POST http://svc/pkg.Svc/Call`, with `body`.
pub fn grpc_call(body: &str) -> Request<String> {
    Request::post("http://svc/pkg.Svc/Call")
        .header("content-type", "application/grpc")
        .body(body.to_owned())
        .unwrap()
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
