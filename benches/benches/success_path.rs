//! The success path of each stack, next to tower's own in the same run:
//! `cargo bench -p backstop-benches --bench success_path`.
//!
//! Every call succeeds at once (a ready inner service, a current-thread runtime), so what is
//! measured is what each stack adds to a call that needs no retry.

use backstop_benches::{
    backstop_breaker, backstop_breaker_count, backstop_full, backstop_retry, bare, request,
    resilience_breaker, resilience_breaker_count, tower_stack,
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
    c.bench_function(name, |b| {
        b.to_async(rt)
            .iter(|| async { black_box(service.clone().oneshot(request()).await.unwrap()) })
    });
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
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
