//! Deterministic per-call cost: runs one stack `N` times so `valgrind --tool=callgrind` can count
//! its instructions, which do not vary with machine load the way nanoseconds do.
//!
//! ```text
//! cargo bench -p backstop-benches --bench instructions --no-run
//! python3 .ci/instructions.py          # every stack of benches/instructions.budget, checked
//! python3 .ci/instructions.py --update # the same, and the budget rewritten
//! ```
//!
//! (Instructions per call) = (refs(stack, N) − refs(stack, 0)) / N. The stacks: `bare`,
//! `bare-timeout` (the request with a `grpc-timeout`),
//! `tower-timeout`, `tower`, `resilience-stack`, `resilience-breaker`,
//! `resilience-breaker-count`, `backstop-preset`, `backstop-preset-adaptive`,
//! `backstop-deadline`, `backstop-retry`, `backstop-full`, `backstop-breaker`,
//! `backstop-breaker-count`, `backstop-attempt`, `backstop-server`, `backstop-server-timeout`,
//! the overload layers beside tower's (`backstop-throttle`, `backstop-bulkhead`,
//! `backstop-admission`, `tower-concurrency-limit`, `tower-load-shed`), the adaptive limit
//! beside tower-resilience's (`backstop-adaptive-limit`, `resilience-adaptive`);
//! and, with a dependency that answers after one pending poll as a real transport does (each
//! layer then arms its timer), `pending-bare`, `pending-bare-timeout`, `pending-tower-timeout`,
//! `pending-tower`, `pending-deadline`, `pending-full`, `pending-preset`,
//! `pending-resilience-stack`,
//! `pending-server-timeout`.

use backstop_benches::{
    backstop_adaptive_limit, backstop_admission, backstop_attempt, backstop_breaker,
    backstop_breaker_count, backstop_bulkhead, backstop_deadline, backstop_deadline_pending,
    backstop_full, backstop_full_pending, backstop_preset, backstop_preset_adaptive,
    backstop_preset_pending, backstop_retry, backstop_server, backstop_server_pending,
    backstop_throttle, bare, bare_pending, request, request_with_timeout, resilience_adaptive,
    resilience_breaker, resilience_breaker_count, resilience_stack, resilience_stack_pending,
    tower_concurrency_limit, tower_load_shed, tower_stack, tower_stack_pending, tower_timeout,
    tower_timeout_pending,
};
use std::hint::black_box;
use tower::{Service, ServiceExt};

async fn drive<S>(service: S, n: u64)
where
    S: Service<http::Request<String>> + Clone,
    S::Error: std::fmt::Debug,
{
    drive_with(service, n, request).await;
}

async fn drive_with<S>(service: S, n: u64, request: fn() -> http::Request<String>)
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
            // The floor of the server preset with a deadline: the same request, with its
            // `grpc-timeout`, to the bare service.
            "bare-timeout" => drive_with(bare(), n, request_with_timeout).await,
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
            "backstop-attempt" => drive(backstop_attempt(), n).await,
            "backstop-server" => drive(backstop_server(), n).await,
            "backstop-server-timeout" => {
                drive_with(backstop_server(), n, request_with_timeout).await
            }
            "resilience-breaker-count" => drive(resilience_breaker_count(), n).await,
            "backstop-throttle" => drive(backstop_throttle(), n).await,
            "backstop-bulkhead" => drive(backstop_bulkhead(), n).await,
            "backstop-admission" => drive(backstop_admission(), n).await,
            "tower-concurrency-limit" => drive(tower_concurrency_limit(), n).await,
            "backstop-adaptive-limit" => drive(backstop_adaptive_limit(), n).await,
            "resilience-adaptive" => drive(resilience_adaptive(), n).await,
            "tower-load-shed" => drive(tower_load_shed(), n).await,
            "pending-bare" => drive(bare_pending(), n).await,
            "pending-bare-timeout" => drive_with(bare_pending(), n, request_with_timeout).await,
            "pending-tower-timeout" => drive(tower_timeout_pending(), n).await,
            "pending-tower" => drive(tower_stack_pending(), n).await,
            "pending-deadline" => drive(backstop_deadline_pending(), n).await,
            "pending-full" => drive(backstop_full_pending(), n).await,
            "pending-preset" => drive(backstop_preset_pending(), n).await,
            "pending-resilience-stack" => drive(resilience_stack_pending(), n).await,
            "pending-server-timeout" => {
                drive_with(backstop_server_pending(), n, request_with_timeout).await
            }
            other => panic!("unknown stack {other}"),
        }
    });
}
