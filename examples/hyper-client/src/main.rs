//! Run: `cargo run -p example-hyper-client -- --url http://127.0.0.1:3000/deadline --requests 5`
//!
//! (`cargo run -p example-axum-server -- --addr 127.0.0.1:3000` gives it something to call.)
//! Sends GETs through hyper-util's client under `backstop::client::http().build().unwrap()`: each with a
//! deadline (`--timeout-ms`, sent as `grpc-timeout`), retried within it and a 10 % budget, and
//! refused at once while the breaker is open. Prints each status, then the retry stats and
//! the breaker's state.

use backstop::ReplayBody;
use backstop::client::attempt::AttemptBound;
use bytes::Bytes;
use clap::Parser;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use std::time::Duration;
use tower::{Service, ServiceBuilder, ServiceExt};

/// GETs a URL through backstop's HTTP client stack.
#[derive(Debug, Parser)]
struct Args {
    /// What to GET.
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
async fn main() -> Result<(), backstop::BoxError> {
    let args = Args::parse();
    let backend = backstop::client::http()
        .timeout(Duration::from_millis(args.timeout_ms))
        .attempt(AttemptBound::Fixed(Duration::from_millis(
            args.timeout_ms / 2,
        )))
        .build()?;
    // hyper-util's client takes the retry layer's replayable body as it is.
    let transport = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Empty<Bytes>>>();
    let mut client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(transport);

    for n in 1..=args.requests {
        let request = Request::get(&args.url).body(Empty::<Bytes>::new())?;
        match client.ready().await?.call(request).await {
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
    let stats = backend.retry_layer().stats();
    let breaker = backend.breaker_layer().snapshot();
    println!(
        "retries: {}; breaker: {:?}, {} calls, {} failures",
        stats.retries, breaker.state, breaker.calls, breaker.failures
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
