//! Run: `cargo run -p example-reqwest-client -- --url http://127.0.0.1:3000/deadline --requests 5`
//!
//! (`cargo run -p example-axum-server -- --addr 127.0.0.1:3000` gives it something to call.)
//! reqwest's `Client` driven as a `tower::Service<http::Request<_>>` through the small
//! [`Reqwest`] adapter below, under `backstop::client::http()`: a deadline sent as
//! `grpc-timeout`, budgeted retries with the request body replayed, and a breaker.

use backstop::BoxError;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};
use tower::{Service, ServiceBuilder, ServiceExt};

/// reqwest as a tower service of `http` types: the request is converted (its body wrapped,
/// not buffered: under the retry layer it is a `backstop::ReplayBody`), and reqwest's
/// response converted back.
#[derive(Debug, Clone)]
struct Reqwest(reqwest::Client);

impl<B> Service<http::Request<B>> for Reqwest
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<reqwest::Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // reqwest's client is always ready: its pool queues requests itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move {
            let request = reqwest::Request::try_from(request.map(reqwest::Body::wrap))?;
            let response = client.execute(request).await?;
            Ok(http::Response::from(response))
        })
    }
}

/// PUTs to a URL through reqwest under backstop's HTTP client stack.
#[derive(Debug, Parser)]
struct Args {
    /// Where to send the requests.
    #[arg(long, default_value = "http://127.0.0.1:3000/deadline")]
    url: String,
    /// How many requests, one after the other.
    #[arg(long, default_value_t = 5)]
    requests: u32,
    /// Each request's deadline, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let deadline = backstop::deadline::PropagateDeadlineLayer::builder()
        .timeout(Duration::from_millis(args.timeout_ms))
        .build()?;
    let backend = backstop::client::http().deadline(deadline);
    let mut client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(Reqwest(reqwest::Client::new()));

    for n in 1..=args.requests {
        // A GET with a body is unusual but valid; the point is that the retry layer would
        // replay it byte for byte without the caller making it `Clone`.
        let request: http::Request<Full<Bytes>> =
            http::Request::get(&args.url).body(Full::new(Bytes::from_static(b"ping")))?;
        let ready = ServiceExt::<http::Request<Full<Bytes>>>::ready(&mut client).await?;
        let response = ready.call(request).await;
        match response {
            Ok(response) => {
                let status = response.status();
                let body = response.into_body().collect().await?.to_bytes();
                println!("{n}: {status} {}", String::from_utf8_lossy(&body).trim());
            }
            Err(err) => println!("{n}: error: {err}"),
        }
    }
    let breaker = backend.breaker_layer().snapshot();
    println!(
        "retries: {}; breaker: {:?}, {} calls",
        backend.retry_layer().stats().retries,
        breaker.state,
        breaker.calls
    );
    Ok(())
}
