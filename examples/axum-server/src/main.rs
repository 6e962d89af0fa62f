//! Run: `cargo run -p example-axum-server -- --addr 127.0.0.1:3000`
//!
//! Then:
//! - `curl -H 'grpc-timeout: 800m' http://127.0.0.1:3000/chain` prints
//!   `deadline 798 ms; upstream: deadline 573 ms` (the upstream is this server itself unless
//!   `--upstream` names another): the outbound call inherited 90 % of what was left, and the
//!   attempt, bounded by 80 % of that, told the upstream so.
//! - `curl -i -H 'x-timeout-ms: 200' http://127.0.0.1:3000/sleep/1000` answers 504.
//! - `curl http://127.0.0.1:3000/metrics` prints what the layers recorded, in Prometheus'
//!   text format (`backstop_client_requests{dependency="upstream",outcome="success"} 1`, and
//!   `backstop_deadline_expired{side="server",route="/sleep/1000"} 1` after the 504).

use clap::Parser;
use std::net::SocketAddr;

/// An axum app behind backstop's DeadlineLayer.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    addr: SocketAddr,
    /// The service `/chain` calls (default: this server).
    #[arg(long)]
    upstream: Option<http::Uri>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    let local = listener.local_addr()?;
    let upstream = match args.upstream {
        Some(uri) => uri,
        None => format!("http://{local}/").parse()?,
    };
    // The recorder first: the layers register their metrics with the one installed when
    // they first record.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        // Histograms are drained into their summaries by the upkeep.
        let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    println!("listening on {local}, upstream {upstream}");
    axum::serve(listener, example_axum_server::app(upstream, metrics)).await?;
    Ok(())
}
