//! Run: `cargo run -p example-tonic-server -- --addr 127.0.0.1:50051`
//!
//! Then: `cargo run -p example-tonic-client -- --addr http://127.0.0.1:50051 --timeout-ms 800 --name world`
//! prints `hello world; deadline 79x ms`; `--name sleep:2000` prints the DEADLINE_EXCEEDED status.
//! With `--upstream http://127.0.0.1:50052` this server calls another Greeter for each request,
//! and that one sees what is left of the deadline.

use backstop::deadline::DeadlineLayer;
use clap::Parser;
use example_tonic_server::{Greeter, serve};
use std::{net::SocketAddr, time::Duration};

/// helloworld.Greeter behind backstop's DeadlineLayer.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50051")]
    addr: SocketAddr,
    /// Another Greeter to call for every request (e.g. http://127.0.0.1:50052).
    #[arg(long)]
    upstream: Option<String>,
    /// The longest deadline this server grants, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    max_ms: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let greeter = match &args.upstream {
        Some(url) => Greeter::with_upstream(url)?,
        None => Greeter::new(),
    };
    let layer = DeadlineLayer::builder()
        .max(Duration::from_millis(args.max_ms))
        .build()?;
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    println!("listening on {}", listener.local_addr()?);
    serve(listener, greeter, layer).await?;
    Ok(())
}
