//! Helpers for the loopback integration tests: start real servers on `127.0.0.1:0` and call
//! them. Every server runs as a task on the test's runtime and stops with it.

use bytes::{BufMut, Bytes, BytesMut};
use example_proto::helloworld::HelloRequest;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use prost::Message;
use std::net::SocketAddr;
use tokio::net::TcpListener;

/// Binds a listener on a free loopback port.
pub async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    (listener, addr)
}

/// Serves `handle` with hyper on a loopback port, HTTP/1.1 or HTTP/2 only (prior knowledge),
/// until the runtime stops; returns the address. Each request gets `handle(request, state)`.
pub async fn serve_hyper<T, F, Fut, B>(http2: bool, state: T, handle: F) -> SocketAddr
where
    T: Clone + Send + Sync + 'static,
    F: Fn(Request<hyper::body::Incoming>, T) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<http::Response<B>, std::convert::Infallible>>
        + Send
        + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (listener, addr) = listener().await;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (state, handle) = (state.clone(), handle.clone());
            let service = hyper::service::service_fn(move |req| handle(req, state.clone()));
            let io = hyper_util::rt::TokioIo::new(stream);
            tokio::spawn(async move {
                let _ = if http2 {
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await
                } else {
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await
                };
            });
        }
    });
    addr
}

/// Starts an `example-tonic-server` Greeter (optionally calling `upstream`) behind the default
/// `DeadlineLayer`, and returns its `http://` URI.
pub async fn start_greeter(upstream: Option<&str>) -> String {
    let (listener, addr) = listener().await;
    let greeter = match upstream {
        Some(url) => example_tonic_server::Greeter::with_upstream(url).expect("upstream URI"),
        None => example_tonic_server::Greeter::new(),
    };
    tokio::spawn(example_tonic_server::serve(
        listener,
        greeter,
        backstop::deadline::DeadlineLayer::new(),
    ));
    format!("http://{addr}")
}

/// Starts the `example-axum-server` app calling `upstream` (itself when `None`), and returns
/// its `http://` URI with a trailing slash.
pub async fn start_axum(upstream: Option<&str>) -> String {
    let (listener, addr) = listener().await;
    let own = format!("http://{addr}/");
    let upstream = upstream.unwrap_or(&own).parse().expect("upstream URI");
    tokio::spawn(async move {
        // A recorder of its own, not installed: `/metrics` answers, with nothing recorded.
        let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        axum::serve(listener, example_axum_server::app(upstream, metrics))
            .await
            .expect("axum server");
    });
    own
}

/// What a raw gRPC call returned: the status code and message, wherever the server put them
/// (trailers-only headers, or trailers after the body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawStatus {
    /// `grpc-status`.
    pub code: String,
    /// `grpc-message`, if any.
    pub message: Option<String>,
}

fn status_in(map: &HeaderMap) -> Option<RawStatus> {
    let code = map.get("grpc-status")?.to_str().ok()?.to_owned();
    let message = map
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(str::to_owned);
    Some(RawStatus { code, message })
}

/// Calls `Greeter/SayHello` over a bare HTTP/2 client, with no client-side timer of any kind,
/// so the status seen is exactly what the server sent.
pub async fn raw_say_hello(base: &str, name: &str, grpc_timeout: Option<&str>) -> RawStatus {
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let message = HelloRequest {
        name: name.to_owned(),
    }
    .encode_to_vec();
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.len()).expect("small message"));
    frame.put_slice(&message);
    let mut request = Request::post(format!("{base}/helloworld.Greeter/SayHello"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(t) = grpc_timeout {
        request = request.header("grpc-timeout", t);
    }
    let request = request
        .body(Full::new(frame.freeze()))
        .expect("valid request");
    let response = client.request(request).await.expect("HTTP/2 exchange");
    if let Some(status) = status_in(response.headers()) {
        return status;
    }
    let collected = response.into_body().collect().await.expect("body");
    collected
        .trailers()
        .and_then(status_in)
        .expect("a grpc-status in headers or trailers")
}

/// Parses every `deadline N ms` in `text`, in order.
pub fn deadlines_in(text: &str) -> Vec<u64> {
    text.split("deadline ")
        .skip(1)
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect()
}
