//! The storm lab: the same outage, four ways of calling the dependency, side by side.
//!
//! `cargo run --release -p backstop-lab` runs the `brownout` scenario against real hyper
//! servers on 127.0.0.1 and prints a table; every run writes `lab-report/<scenario>.svg` (the
//! load the dependency sees and the latency users see, over time, per variant) and
//! `lab-report/<scenario>.json` (the schema is [`Report`]).
//!
//! **Scenarios** ([`Scenario`]): each run is healthy for the first quarter, faulty for the
//! middle half, healthy again for the last quarter. **Variants** ([`Variant`]) see identical
//! offered load: user requests arrive on a fixed schedule (open loop: a slow answer does not
//! slow the arrivals), and each user waits at most 1 s. **Engines** ([`Engine`]): `real`
//! (HTTP/2 over loopback, real time) and `sim` (in process, tokio's paused clock, seeded:
//! the same report, byte for byte, for the same seed — what the tests assert on).
//!
//! The dependency ([`backend::Backend`]) answers in 10 ms plus the fault's latency and fails
//! the fault's share of requests. Its work runs to the end even if the caller gave up, unless
//! the request carried a deadline (backstop's server layer reads `grpc-timeout`): that work
//! is the report's `orphaned_work_s`. In `overload` it has a fixed capacity (the report's
//! `capacity`, requests/s): four workers behind one FIFO queue, so latency grows with the
//! queue, and `goodput` counts the answers users got in time.

pub mod backend;
pub mod chart;
pub mod engine;
pub mod metrics;
pub mod report;
pub mod scenario;
pub mod stacks;

pub use engine::{Engine, Progress, Run};
pub use report::{HopReport, MeasuredPoint, PhaseReport, Report, VariantReport};
pub use scenario::Scenario;
pub use stacks::Variant;

use std::{sync::Arc, time::Duration};

/// Runs every variant of `run` in turn; returns the report and the series for the chart.
pub fn run_all(
    run: &Run,
    variants: &[Variant],
    progress: Progress,
) -> (Report, Vec<chart::Series>) {
    let mut reports = Vec::new();
    let mut series = Vec::new();
    for &variant in variants {
        let (report, s) = run.variant(variant, progress.clone());
        reports.push(report);
        series.push(s);
    }
    let report = Report {
        scenario: run.scenario.name().to_owned(),
        engine: run.engine.name().to_owned(),
        seed: run.seed,
        rps: run.rps,
        duration_s: run.duration.as_secs_f64(),
        capacity: run
            .scenario
            .capacity()
            .map(|c| c.per_second(backend::SERVICE_TIME)),
        variants: reports,
    };
    (report, series)
}

/// A run of `scenario` in the sim engine with `rps` for `seconds`, every variant, no
/// progress: what the tests call.
pub fn simulate(scenario: Scenario, seed: u64, rps: u32, seconds: u64) -> Report {
    simulate_variants(scenario, seed, rps, seconds, &Variant::ALL)
}

/// As [`simulate`], for some variants only.
pub fn simulate_variants(
    scenario: Scenario,
    seed: u64,
    rps: u32,
    seconds: u64,
    variants: &[Variant],
) -> Report {
    let run = Run {
        scenario,
        engine: Engine::Sim,
        seed,
        rps,
        duration: Duration::from_secs(seconds),
        patience: scenario.patience(),
    };
    run_all(&run, variants, Arc::new(|| {})).0
}
