//! Deterministic per-call cost: runs one stack `N` times so `valgrind --tool=callgrind` can count
//! its instructions, which do not vary with machine load the way nanoseconds do.
//!
//! ```text
//! cargo bench -p backstop-benches --bench instructions --no-run
//! for s in bare tower-timeout tower resilience-stack backstop-preset backstop-preset-adaptive backstop-deadline \
//!          backstop-retry backstop-full backstop-breaker backstop-breaker-count \
//!          resilience-breaker resilience-breaker-count; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/deps/instructions-* $s 100000 2>&1 | grep refs
//! done
//! ```
//!
//! (Instructions per call) = (refs(stack, N) − refs(stack, 0)) / N.

use backstop_benches::{
    backstop_breaker, backstop_breaker_count, backstop_deadline, backstop_full, backstop_preset,
    backstop_preset_adaptive, backstop_retry, bare, request, resilience_breaker,
    resilience_breaker_count, resilience_stack, tower_stack, tower_timeout,
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
            "tower-timeout" => drive(tower_timeout(), n).await,
            "backstop-deadline" => drive(backstop_deadline(), n).await,
            "backstop-preset" => drive(backstop_preset(), n).await,
            "backstop-preset-adaptive" => drive(backstop_preset_adaptive(), n).await,
            "resilience-stack" => drive(resilience_stack(), n).await,
            "resilience-breaker" => drive(resilience_breaker(), n).await,
            "backstop-breaker-count" => drive(backstop_breaker_count(), n).await,
            "resilience-breaker-count" => drive(resilience_breaker_count(), n).await,
            other => panic!("unknown stack {other}"),
        }
    });
}
