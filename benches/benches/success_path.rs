//! The success path of each stack, next to tower's own in the same run:
//! `cargo bench -p backstop-benches --bench success_path`.
//!
//! Every call succeeds at once (a ready inner service, a current-thread runtime), so what is
//! measured is what each stack adds to a call that needs no retry.

use backstop_benches::Stack;
use backstop_benches::{
    backstop_attempt, backstop_breaker, backstop_breaker_count, backstop_budget_denied,
    backstop_deadline, backstop_full, backstop_open_breaker, backstop_preset,
    backstop_preset_adaptive, backstop_retry, backstop_server, bare, request, request_with_timeout,
    resilience_breaker, resilience_breaker_count, resilience_stack, tower_stack, tower_timeout,
};
use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use http::Request;
use std::hint::black_box;
use tokio::runtime::Runtime;
use tower::ServiceExt;

/// A benchmark group whose stacks all run on one runtime.
struct Group<'c, 'r> {
    group: BenchmarkGroup<'c, WallTime>,
    rt: &'r Runtime,
}

impl<'c, 'r> Group<'c, 'r> {
    fn new(c: &'c mut Criterion, rt: &'r Runtime, name: &str) -> Self {
        Self {
            group: c.benchmark_group(name),
            rt,
        }
    }

    /// Calls to `service` that succeed, with the benches' plain request.
    fn stack(&mut self, name: &str, service: impl Stack) {
        self.stack_with(name, service, request);
    }

    /// Like `stack`, with requests built by `request`.
    fn stack_with(&mut self, name: &str, service: impl Stack, request: fn() -> Request<String>) {
        self.group.bench_function(name, |b| {
            b.to_async(self.rt)
                .iter(|| async { black_box(service.clone().oneshot(request()).await.unwrap()) })
        });
    }

    /// Calls to `service` that fail (the failure paths).
    fn failing(&mut self, name: &str, service: impl Stack) {
        self.group.bench_function(name, |b| {
            b.to_async(self.rt)
                .iter(|| async { black_box(service.clone().oneshot(request()).await.is_err()) })
        });
    }

    fn finish(self) {
        self.group.finish();
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut g = Group::new(c, &rt, "stacks");
    g.stack("bare", bare());
    g.stack("tower timeout", tower_timeout());
    g.stack("tower retry + TpsBudget + timeout", tower_stack());
    g.stack(
        "tower-resilience time-limiter + retry + breaker",
        resilience_stack(),
    );
    g.stack("backstop client preset", backstop_preset());
    g.stack(
        "backstop client preset, measured bound",
        backstop_preset_adaptive(),
    );
    g.stack("backstop attempt bound alone", backstop_attempt());
    g.stack("backstop server preset", backstop_server());
    g.stack_with(
        "bare, request with grpc-timeout",
        bare(),
        request_with_timeout,
    );
    g.stack_with(
        "backstop server preset, request with grpc-timeout",
        backstop_server(),
        request_with_timeout,
    );
    g.stack("backstop deadline alone", backstop_deadline());
    g.stack("backstop retry alone", backstop_retry());
    g.stack("backstop breaker alone", backstop_breaker());
    g.finish();

    let mut g = Group::new(c, &rt, "failure_path");
    g.failing("open breaker refuses", backstop_open_breaker());
    g.stack("retry denied by the budget", backstop_budget_denied());
    g.finish();

    let mut g = Group::new(c, &rt, "success_path");
    g.stack("bare", bare());
    g.stack("tower retry + TpsBudget + timeout", tower_stack());
    g.stack("backstop deadline + retry + ratio budget", backstop_full());
    g.stack("backstop retry + ratio budget", backstop_retry());
    g.finish();

    let mut g = Group::new(c, &rt, "breaker");
    g.stack("bare", bare());
    g.stack("backstop breaker, time window", backstop_breaker());
    g.stack(
        "tower-resilience breaker, time window",
        resilience_breaker(),
    );
    g.stack("backstop breaker, count window", backstop_breaker_count());
    g.stack(
        "tower-resilience breaker, count window",
        resilience_breaker_count(),
    );
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
