//! Run: `cargo run -p example-tonic-client -- --addr http://127.0.0.1:50051 --timeout-ms 800 --name world`
//!
//! Start `example-tonic-server` first. Prints the reply, e.g. `hello world; deadline 798 ms`, or
//! the status: `--name sleep:2000` prints `status: DeadlineExceeded: deadline exceeded`.
//!
//! With a gRPC service config (gRFC A6), backstop's whole gRPC stack takes each method's policy
//! from it (here a 300 ms timeout and retries of UNAVAILABLE for SayHello):
//! `cargo run -p example-tonic-client -- --addr http://127.0.0.1:50051 --name sleep:2000
//! --service-config '{"methodConfig": [{"name": [{"service": "helloworld.Greeter"}],
//! "timeout": "0.3s", "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.05s",
//! "maxBackoff": "0.2s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}'`
//! prints `status: DeadlineExceeded: deadline exceeded` after 300 ms.

use clap::Parser;
use std::time::Duration;

/// Calls helloworld.Greeter/SayHello with a deadline.
#[derive(Debug, Parser)]
struct Args {
    /// The server's URI.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// The call's deadline, in milliseconds from now.
    #[arg(long, default_value_t = 800)]
    timeout_ms: u64,
    /// The name to greet; `sleep:MS` makes the server sleep first.
    #[arg(long, default_value = "world")]
    name: String,
    /// A gRPC service config (JSON): the client is then backstop's gRPC stack with the
    /// config's policy per method (and `--timeout-ms` is not used: the config's `timeout` is).
    #[arg(long)]
    service_config: Option<String>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let answer = match &args.service_config {
        Some(json) => {
            let mut client = example_tonic_client::configured_client(&args.addr, json)?;
            example_tonic_client::say_hello(&mut client, &args.name).await
        }
        None => {
            let mut client =
                example_tonic_client::client(&args.addr, Duration::from_millis(args.timeout_ms))?;
            example_tonic_client::say_hello(&mut client, &args.name).await
        }
    };
    match answer {
        Ok(message) => println!("{message}"),
        Err(status) => println!("status: {:?}: {}", status.code(), status.message()),
    }
    Ok(())
}
