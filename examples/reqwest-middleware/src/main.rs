//! Run: `cargo run -p example-reqwest-middleware -- --base http://127.0.0.1:3000 --requests 3`
//!
//! (`cargo run -p example-axum-server -- --addr 127.0.0.1:3000` gives it something to call.)
//! reqwest's own client and request builder, with backstop's HTTP client preset as one
//! `reqwest_middleware::Middleware`: the request's `.timeout()` is the call's deadline (sent
//! as `grpc-timeout`, the whole call's, retries included), budgeted retries replay the body,
//! a breaker guards the dependency, and the response says how many attempts it took.

use backstop::reqwest::BackstopMiddleware;
use clap::Parser;
use std::time::Duration;

/// Calls the example axum server through reqwest-middleware with backstop's stack.
#[derive(Debug, Parser)]
struct Args {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:3000")]
    base: String,
    /// How many GETs of `/deadline`, one after the other.
    #[arg(long, default_value_t = 3)]
    requests: u32,
    /// Each request's timeout (its deadline), in milliseconds.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let backend = backstop::client::http()
        .name("example-server")
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(BackstopMiddleware::new(backend.clone()))
        .build();
    let timeout = Duration::from_millis(args.timeout_ms);

    for n in 1..=args.requests {
        let response = client
            .get(format!("{}/deadline", args.base))
            .timeout(timeout)
            .send()
            .await?;
        let status = response.status();
        let attempts = attempts(&response);
        let body = response.text().await?;
        println!("{n}: {status} {} ({attempts} attempt(s))", body.trim());
    }

    // A handler slower than the deadline: the call ends at the deadline, with backstop's error
    // or the server's 504 (it is told the time each attempt has, and may answer first).
    match client
        .get(format!("{}/sleep/3000", args.base))
        .timeout(Duration::from_millis(300))
        .send()
        .await
    {
        Ok(response) => println!("slow: {}", response.status()),
        Err(reqwest_middleware::Error::Middleware(err)) => {
            let chain: Vec<String> = err.chain().map(ToString::to_string).collect();
            println!("slow: {}", chain.join(": "));
        }
        Err(err) => println!("slow: reqwest error: {err}"),
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

/// Attempts the call took: the retry layer's `CallInfo` on the response (absent: one).
fn attempts(response: &reqwest::Response) -> u32 {
    response
        .extensions()
        .get::<backstop::client::retry::CallInfo>()
        .map_or(1, |info| info.attempts())
}
