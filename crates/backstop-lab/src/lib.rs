//! The storm lab: the same faults, five ways of calling the dependency, side by side.
//!
//! `cargo run --release -p backstop-lab` runs `brownout`, `outage` and `overload` against
//! real hyper servers on 127.0.0.1 and prints one screen: a line per scenario and variant and
//! the trade each variant makes ([`summary`]); `--scenario X` runs one and prints its table.
//! Every run writes `lab-report/<scenario>.svg` (the load the dependency sees, the answers
//! users get in time and the latency they see, over time, per variant) and
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
//! queue, and `goodput` counts the answers users got in time. In `capacity-drop` two of the
//! workers go away for the middle third of the fault, and `capacity` is the mean over it.

pub mod backend;
pub mod chart;
pub mod engine;
pub mod metrics;
pub mod report;
pub mod scenario;
pub mod stacks;
pub mod summary;

pub use engine::{Engine, Progress, Run};
pub use report::{HopReport, MeasuredPoint, PhaseReport, Report, VariantReport};
pub use scenario::Scenario;
pub use stacks::{Adaptive, Variant};

use std::sync::Arc;

/// The offered load (user requests per second) and the length (seconds) of a run of
/// `scenario` on `engine` unless told otherwise: 200 requests/s for 12 s on the real engine,
/// 1 000 for 60 s on the sim; `quick`, 50 for 8 s and 200 for 20 s (a quarter healthy, half
/// faulty, a quarter healthy: long enough to show the fault and the recovery). Where the
/// dependency's capacity is finite (400 requests/s) users send 1 000 requests/s whatever the
/// engine (300/s outside the fault): less would not overload it.
pub fn default_load(scenario: Scenario, engine: Engine, quick: bool) -> (u32, u64) {
    let (rps, seconds) = match (engine, quick) {
        (Engine::Real, false) => (200, 12),
        (Engine::Real, true) => (50, 8),
        (Engine::Sim, false) => (1000, 60),
        (Engine::Sim, true) => (200, 20),
    };
    if scenario.overloads() {
        (1000, seconds)
    } else {
        (rps, seconds)
    }
}

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
            .mean_fault_capacity(run.duration, backend::SERVICE_TIME)
            .map(metrics::round3),
        variants: reports,
    };
    (report, series)
}

/// A run of `scenario` in the sim engine with `rps` for `seconds`, the scenario's variants
/// ([`Variant::defaults`]), no progress: what the tests call.
pub fn simulate(scenario: Scenario, seed: u64, rps: u32, seconds: u64) -> Report {
    simulate_variants(scenario, seed, rps, seconds, &Variant::defaults(scenario))
}

/// As [`simulate`], for some variants only.
pub fn simulate_variants(
    scenario: Scenario,
    seed: u64,
    rps: u32,
    seconds: u64,
    variants: &[Variant],
) -> Report {
    simulate_run(&Run::sim(scenario, seed, rps, seconds), variants)
}

/// `run` (on whichever engine it says), for `variants`, no progress.
pub fn simulate_run(run: &Run, variants: &[Variant]) -> Report {
    run_all(run, variants, Arc::new(|| {})).0
}
