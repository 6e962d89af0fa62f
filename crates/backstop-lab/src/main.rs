//! The storm lab: `cargo run --release -p backstop-lab -- [--scenario brownout|outage|chain|slow|hang|tail|drift|partial|routes|quiet|post|overload|overload-chain|capacity-drop]
//! [--engine real|sim] [--quick] ...` (see `--help`).

use backstop_lab::{Adaptive, Engine, Report, Run, Scenario, Variant, chart, run_all, summary};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use std::{path::PathBuf, sync::Arc, time::Duration};

/// Runs naive retries, tower's retries, tower-resilience (where the dependency's capacity is
/// finite) and backstop side by side against the same faulty dependency. Without
/// --scenario: brownout, outage and overload, one line per scenario and variant, and the trade
/// each variant makes; with it, that scenario's detailed table. Writes
/// <out>/<scenario>.svg and <out>/<scenario>.json for each scenario run.
#[derive(Debug, Parser)]
#[command(name = "backstop-lab")]
struct Args {
    /// What goes wrong (default: brownout, outage and overload, summed up on one screen).
    #[arg(long, value_enum)]
    scenario: Option<Scenario>,
    /// Real servers on 127.0.0.1, or the deterministic simulation.
    #[arg(long, value_enum, default_value_t = Engine::Real)]
    engine: Engine,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Offered user requests per second (default: 200 real, 1000 sim; quick: 50, 200; 1000
    /// in the scenarios where the dependency's capacity is finite, whatever the engine).
    #[arg(long)]
    rps: Option<u32>,
    /// Seconds per variant (default: 12 real, 60 sim; quick: 8, 20).
    #[arg(long)]
    duration: Option<u64>,
    /// Where the reports go.
    #[arg(long, default_value = "lab-report")]
    out: PathBuf,
    /// A shorter run of the same shape (CI), still long enough to show the fault and the
    /// recovery.
    #[arg(long)]
    quick: bool,
    /// The variants to run, comma-separated (default: none, naive, tower, backstop, and
    /// tower-resilience where the dependency's capacity is finite).
    #[arg(long, value_enum, value_delimiter = ',')]
    variants: Option<Vec<Variant>>,
    /// The algorithm of tower-resilience's adaptive limit.
    #[arg(long, value_enum, default_value_t = Adaptive::BEST)]
    adaptive: Adaptive,
    /// tower-resilience: refuse a call at once when its limit is reached (tower's LoadShed
    /// in front of the limit) instead of waiting for a permit.
    #[arg(long)]
    shed: bool,
}

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("backstop-lab: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let scenarios = match args.scenario {
        Some(scenario) => vec![scenario],
        None => summary::SCENARIOS.to_vec(),
    };
    let mut runs = Vec::new();
    for &scenario in &scenarios {
        let (rps, seconds) = backstop_lab::default_load(scenario, args.engine, args.quick);
        let rps = args.rps.unwrap_or(rps);
        let seconds = args.duration.unwrap_or(seconds);
        // Every user request is a task held until the run ends: keep a run within memory.
        if !(1..=100_000).contains(&rps) {
            return Err(format!("--rps must be between 1 and 100000, got {rps}").into());
        }
        if !(4..=3_600).contains(&seconds) {
            return Err(
                format!("--duration must be between 4 and 3600 seconds, got {seconds}").into(),
            );
        }
        if u64::from(rps) * seconds > 10_000_000 {
            return Err(format!(
                "--rps × --duration must be at most 10 000 000 user requests per variant, got {}",
                u64::from(rps) * seconds
            )
            .into());
        }
        let variants = args
            .variants
            .clone()
            .unwrap_or_else(|| Variant::defaults(scenario));
        let run = Run {
            scenario,
            engine: args.engine,
            seed: args.seed,
            rps,
            duration: Duration::from_secs(seconds),
            patience: scenario.patience(),
            adaptive: args.adaptive,
            shed: args.shed,
        };
        runs.push((run, variants));
    }

    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let total: u64 = runs
        .iter()
        .map(|(run, variants)| u64::from(run.rps) * run.duration.as_secs() * variants.len() as u64)
        .sum();
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} user requests")?
            .progress_chars("=> "),
    );
    let mut reports: Vec<Report> = Vec::new();
    let mut written = Vec::new();
    for (run, variants) in &runs {
        bar.set_message(format!("{} ({})", run.scenario.name(), run.engine.name()));
        let tick = bar.clone();
        let (report, series) = run_all(run, variants, Arc::new(move || tick.inc(1)));
        let json = args.out.join(format!("{}.json", report.scenario));
        std::fs::write(&json, report.to_json())
            .map_err(|e| format!("cannot write {}: {e}", json.display()))?;
        let svg = args.out.join(format!("{}.svg", report.scenario));
        let title = format!("{} ({}, {} req/s)", report.scenario, report.engine, run.rps);
        let phases = run.scenario.phases(run.duration);
        let offered = run.scenario.offered_per_second(run.rps, run.duration);
        let capacity = run
            .scenario
            .capacity_per_second(run.duration, backstop_lab::backend::SERVICE_TIME);
        let frame = chart::Frame {
            title: &title,
            phases: &phases,
            offered: &offered,
            capacity: capacity.as_deref(),
        };
        chart::draw(&svg, &frame, &series)?;
        written.push(svg);
        written.push(json);
        reports.push(report);
    }
    bar.finish_and_clear();

    match &reports[..] {
        [one] if args.scenario.is_some() => print!("{}", one.table()),
        _ => print!("{}", summary::summary(&reports, args.adaptive)),
    }
    let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    println!("wrote {}", names.join(", "));
    Ok(())
}
