//! The success path of each stack, next to tower's own in the same run:
//! `cargo bench -p backstop-benches --bench success_path`.
//!
//! Every call succeeds at once (a ready inner service, a current-thread runtime), so what is
//! measured is what each stack adds to a call that needs no retry.

use backstop_benches::{
    backstop_attempt, backstop_breaker, backstop_breaker_count, backstop_budget_denied,
    backstop_deadline, backstop_full, backstop_open_breaker, backstop_preset,
    backstop_preset_adaptive, backstop_retry, backstop_server, bare, request, request_with_timeout,
    resilience_breaker, resilience_breaker_count, resilience_stack, tower_stack, tower_timeout,
};
use criterion::{Criterion, criterion_group, criterion_main};
use std::{fmt::Debug, hint::black_box};
use tower::{Service, ServiceExt};

fn run<S>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    name: &str,
    service: S,
) where
    S: Service<http::Request<String>> + Clone,
    S::Error: Debug,
{
    run_with(c, rt, name, service, request);
}

/// Like `run`, with requests built by `request`.
fn run_with<S>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    name: &str,
    service: S,
    request: fn() -> http::Request<String>,
) where
    S: Service<http::Request<String>> + Clone,
    S::Error: Debug,
{
    c.bench_function(name, |b| {
        b.to_async(rt)
            .iter(|| async { black_box(service.clone().oneshot(request()).await.unwrap()) })
    });
}

/// Like `run`, for calls that fail (the failure paths).
fn run_failing<S>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    name: &str,
    service: S,
) where
    S: Service<http::Request<String>> + Clone,
{
    c.bench_function(name, |b| {
        b.to_async(rt)
            .iter(|| async { black_box(service.clone().oneshot(request()).await.is_err()) })
    });
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("stacks");
    run(&mut group, &rt, "bare", bare());
    run(&mut group, &rt, "tower timeout", tower_timeout());
    run(
        &mut group,
        &rt,
        "tower retry + TpsBudget + timeout",
        tower_stack(),
    );
    run(
        &mut group,
        &rt,
        "tower-resilience time-limiter + retry + breaker",
        resilience_stack(),
    );
    run(&mut group, &rt, "backstop client preset", backstop_preset());
    run(
        &mut group,
        &rt,
        "backstop client preset, measured bound",
        backstop_preset_adaptive(),
    );
    run(
        &mut group,
        &rt,
        "backstop attempt bound alone",
        backstop_attempt(),
    );
    run(&mut group, &rt, "backstop server preset", backstop_server());
    run_with(
        &mut group,
        &rt,
        "bare, request with grpc-timeout",
        bare(),
        request_with_timeout,
    );
    run_with(
        &mut group,
        &rt,
        "backstop server preset, request with grpc-timeout",
        backstop_server(),
        request_with_timeout,
    );
    run(
        &mut group,
        &rt,
        "backstop deadline alone",
        backstop_deadline(),
    );
    run(&mut group, &rt, "backstop retry alone", backstop_retry());
    run(
        &mut group,
        &rt,
        "backstop breaker alone",
        backstop_breaker(),
    );
    group.finish();

    let mut group = c.benchmark_group("failure_path");
    run_failing(
        &mut group,
        &rt,
        "open breaker refuses",
        backstop_open_breaker(),
    );
    run(
        &mut group,
        &rt,
        "retry denied by the budget",
        backstop_budget_denied(),
    );
    group.finish();

    let mut group = c.benchmark_group("success_path");
    run(&mut group, &rt, "bare", bare());
    run(
        &mut group,
        &rt,
        "tower retry + TpsBudget + timeout",
        tower_stack(),
    );
    run(
        &mut group,
        &rt,
        "backstop deadline + retry + ratio budget",
        backstop_full(),
    );
    run(
        &mut group,
        &rt,
        "backstop retry + ratio budget",
        backstop_retry(),
    );
    group.finish();

    let mut group = c.benchmark_group("breaker");
    run(&mut group, &rt, "bare", bare());
    run(
        &mut group,
        &rt,
        "backstop breaker, time window",
        backstop_breaker(),
    );
    run(
        &mut group,
        &rt,
        "tower-resilience breaker, time window",
        resilience_breaker(),
    );
    run(
        &mut group,
        &rt,
        "backstop breaker, count window",
        backstop_breaker_count(),
    );
    run(
        &mut group,
        &rt,
        "tower-resilience breaker, count window",
        resilience_breaker_count(),
    );
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
