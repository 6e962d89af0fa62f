//! Two threads hammering one shared breaker (and one shared retry budget) against one thread:
//! `cargo bench -p backstop-benches --bench contention`.
//!
//! Each thread runs its own current-thread runtime, takes one clone of the same stack and makes
//! `N` successful calls through it (`ready` then `call`: what is shared is the breaker's or the
//! budget's state, not a reference count bumped by cloning the service for every call); the
//! report is calls per second for 1 and 2 threads and their ratio (2.0 would be perfect
//! scaling; the target is at least 1.7), next to the bare service's ratio, which is the
//! machine's own ceiling. Also prints the bytes of shared state per breaker.
// Wall-clock time is what this benchmark measures; the one-clock rule is for library code.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use backstop_benches::{
    backstop_breaker, backstop_preset, backstop_preset_adaptive, backstop_retry, bare, request,
};
use std::{hint::black_box, thread, time::Instant};
use tower::{Service, ServiceExt};

const N: u64 = 2_000_000;

fn calls_per_sec<S>(service: S, threads: usize) -> f64
where
    S: Service<http::Request<String>> + Clone + Send + 'static,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let mut service = service.clone();
            thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    for _ in 0..N {
                        let ready = service.ready().await.unwrap();
                        black_box(ready.call(request()).await.unwrap());
                    }
                });
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    (N * threads as u64) as f64 / start.elapsed().as_secs_f64()
}

fn report<S>(name: &str, service: S)
where
    S: Service<http::Request<String>> + Clone + Send + 'static,
    S::Error: std::fmt::Debug,
{
    // Warm up, then take the best of three of each, interleaved.
    calls_per_sec(service.clone(), 1);
    let (mut one, mut two) = (0f64, 0f64);
    for _ in 0..3 {
        one = one.max(calls_per_sec(service.clone(), 1));
        two = two.max(calls_per_sec(service.clone(), 2));
    }
    println!(
        "{name:<32} 1 thread {:>6.2} M calls/s   2 threads {:>6.2} M calls/s   ratio {:.2}",
        one / 1e6,
        two / 1e6,
        two / one
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs nothing.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    // The bare service is the machine's own ceiling (allocator, request building).
    report("bare (nothing shared)", bare());
    report("backstop breaker (shared)", backstop_breaker());
    report("backstop retry + budget (shared)", backstop_retry());
    report(
        "backstop client preset (shared)",
        backstop_preset_adaptive(),
    );
    report("  preset, fixed bound", backstop_preset());
    report("  deadline alone", backstop_benches::backstop_deadline());
    report(
        "  attempt bound alone",
        backstop_benches::backstop_attempt(),
    );
    let layer = backstop::client::breaker::BreakerConfig::http()
        .build()
        .unwrap();
    println!(
        "breaker shared state: {} bytes",
        layer.snapshot().shared_bytes
    );
    resident_growth();
}

/// Resident memory (KiB) of this process, from /proc (Linux).
fn resident_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4
}

/// Resident growth across 1 M calls through the full client preset, after a warm-up of
/// 100 000: what the breaker's window and the budget keep must not grow with traffic.
fn resident_growth() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut service = backstop_preset();
    rt.block_on(async {
        for _ in 0..100_000 {
            black_box(service.ready().await.unwrap().call(request()).await.unwrap());
        }
        let before = resident_kib();
        for _ in 0..1_000_000 {
            black_box(service.ready().await.unwrap().call(request()).await.unwrap());
        }
        let after = resident_kib();
        println!(
            "resident memory over 1 M calls of the client preset: {before} KiB -> {after} KiB ({:+} KiB)",
            after as i64 - before as i64
        );
    });
}
