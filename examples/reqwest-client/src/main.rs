//! Run: `cargo run -p example-reqwest-client -- --url http://127.0.0.1:3000/deadline --requests 5`
//!
//! (`cargo run -p example-axum-server -- --addr 127.0.0.1:3000` gives it something to call.)
//! reqwest's `Client` driven as a `tower::Service<http::Request<_>>` through
//! `backstop::reqwest::Reqwest`, under `backstop::client::http().build().unwrap()`: a deadline sent as
//! `grpc-timeout`, budgeted retries with the request body replayed, and a breaker.

use backstop::BoxError;
use backstop::reqwest::Reqwest;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use std::time::Duration;
use tower::{Service, ServiceBuilder, ServiceExt};

/// GETs (with a body) a URL through reqwest under backstop's HTTP client stack.
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
    let backend = backstop::client::http()
        .timeout(Duration::from_millis(args.timeout_ms))
        .build()?;
    let mut client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(Reqwest::new(reqwest::Client::new()));

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
                // The body is bounded by the deadline too: read past it, it fails.
                match response.into_body().collect().await {
                    Ok(body) => {
                        let body = body.to_bytes();
                        println!("{n}: {status} {}", String::from_utf8_lossy(&body).trim());
                    }
                    Err(err) => println!("{n}: {status}, body: error: {}", chain(&*err)),
                }
            }
            Err(err) => println!("{n}: error: {}", chain(&*err)),
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

/// An error and its sources, `: `-separated (backstop's `RetryError` says how many attempts the
/// call took; its source says what the last one ran into).
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        text.push_str(": ");
        text.push_str(&e.to_string());
        next = e.source();
    }
    text
}
