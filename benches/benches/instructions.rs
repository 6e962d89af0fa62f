//! Deterministic per-call cost: runs one stack `N` times so `valgrind --tool=callgrind` can count
//! its instructions, which do not vary with machine load the way nanoseconds do.
//!
//! ```text
//! cargo bench -p backstop-benches --bench instructions --no-run
//! for s in bare tower backstop-retry backstop-full backstop-breaker backstop-breaker-count \
//!          resilience-breaker resilience-breaker-count; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/deps/instructions-* $s 100000 2>&1 | grep refs
//! done
//! ```
//!
//! (Instructions per call) = (refs(stack, N) − refs(stack, 0)) / N.

use backstop_benches::{
    backstop_breaker, backstop_breaker_count, backstop_full, backstop_retry, bare, request,
    resilience_breaker, resilience_breaker_count, tower_stack,
};
use std::hint::black_box;
use tower::{Service, ServiceExt};

async fn drive<S>(service: S, n: u64)
where
    S: Service<http::Request<String>> + Clone,
    S::Error: std::fmt::Debug,
{
    for _ in 0..n {
        black_box(service.clone().oneshot(request()).await.unwrap());
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "bare".to_owned());
    let n: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        match which.as_str() {
            "bare" => drive(bare(), n).await,
            "tower" => drive(tower_stack(), n).await,
            "backstop-retry" => drive(backstop_retry(), n).await,
            "backstop-full" => drive(backstop_full(), n).await,
            "backstop-breaker" => drive(backstop_breaker(), n).await,
            "resilience-breaker" => drive(resilience_breaker(), n).await,
            "backstop-breaker-count" => drive(backstop_breaker_count(), n).await,
            "resilience-breaker-count" => drive(resilience_breaker_count(), n).await,
            other => panic!("unknown stack {other}"),
        }
    });
}
