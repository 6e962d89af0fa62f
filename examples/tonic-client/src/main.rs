//! Run: `cargo run -p example-tonic-client -- --addr http://127.0.0.1:50051 --timeout-ms 800 --name world`
//!
//! Start `example-tonic-server` first. Prints the reply, e.g. `hello world; deadline 798 ms`, or
//! the status: `--name sleep:2000` prints `status: DeadlineExceeded: deadline exceeded`.

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
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let mut client =
        example_tonic_client::client(&args.addr, Duration::from_millis(args.timeout_ms))?;
    match example_tonic_client::say_hello(&mut client, &args.name).await {
        Ok(message) => println!("{message}"),
        Err(status) => println!("status: {:?}: {}", status.code(), status.message()),
    }
    Ok(())
}
