//! The storm lab: `cargo run --release -p backstop-lab -- [--scenario brownout|outage|chain|slow|hang|tail|drift|partial|routes|quiet|post|overload|overload-chain]
//! [--engine real|sim] [--quick] ...` (see `--help`).

use backstop_lab::{Engine, Run, Scenario, Variant, chart, run_all};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use std::{path::PathBuf, sync::Arc, time::Duration};

/// Runs naive retries, tower's retries and backstop side by side against the same faulty
/// dependency, prints a table, and writes <out>/<scenario>.svg and <out>/<scenario>.json.
#[derive(Debug, Parser)]
#[command(name = "backstop-lab")]
struct Args {
    /// What goes wrong.
    #[arg(long, value_enum, default_value_t = Scenario::Brownout)]
    scenario: Scenario,
    /// Real servers on 127.0.0.1, or the deterministic simulation.
    #[arg(long, value_enum, default_value_t = Engine::Real)]
    engine: Engine,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Offered user requests per second (default: 200 real, 1000 sim; quick: 50, 200).
    #[arg(long)]
    rps: Option<u32>,
    /// Seconds per variant (default: 12 real, 60 sim; quick: 4, 12).
    #[arg(long)]
    duration: Option<u64>,
    /// Where the reports go.
    #[arg(long, default_value = "lab-report")]
    out: PathBuf,
    /// A short run of the same shape (CI).
    #[arg(long)]
    quick: bool,
    /// The variants to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "none,naive,tower,backstop"
    )]
    variants: Vec<Variant>,
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
    let (rps, seconds) = match (args.engine, args.quick) {
        (Engine::Real, false) => (200, 12),
        (Engine::Real, true) => (50, 4),
        (Engine::Sim, false) => (1000, 60),
        (Engine::Sim, true) => (200, 12),
    };
    let rps = args.rps.unwrap_or(rps);
    let seconds = args.duration.unwrap_or(seconds);
    // Every user request is a task held until the run ends: keep a run within memory.
    if !(1..=100_000).contains(&rps) {
        return Err(format!("--rps must be between 1 and 100000, got {rps}").into());
    }
    if !(4..=3_600).contains(&seconds) {
        return Err(format!("--duration must be between 4 and 3600 seconds, got {seconds}").into());
    }
    if u64::from(rps) * seconds > 10_000_000 {
        return Err(format!(
            "--rps × --duration must be at most 10 000 000 user requests per variant, got {}",
            u64::from(rps) * seconds
        )
        .into());
    }
    let run = Run {
        scenario: args.scenario,
        engine: args.engine,
        seed: args.seed,
        rps,
        duration: Duration::from_secs(seconds),
        patience: args.scenario.patience(),
    };

    let total = u64::from(rps) * seconds * args.variants.len() as u64;
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} user requests")?
            .progress_chars("=> "),
    );
    bar.set_message(format!("{} ({})", run.scenario.name(), run.engine.name()));
    let tick = bar.clone();
    let (report, series) = run_all(&run, &args.variants, Arc::new(move || tick.inc(1)));
    bar.finish_and_clear();

    print!("{}", report.table());
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let json = args.out.join(format!("{}.json", report.scenario));
    std::fs::write(&json, report.to_json())
        .map_err(|e| format!("cannot write {}: {e}", json.display()))?;
    let svg = args.out.join(format!("{}.svg", report.scenario));
    let title = format!("{} ({}, {} req/s)", report.scenario, report.engine, rps);
    chart::draw(
        &svg,
        &title,
        &run.scenario.phases(run.duration),
        f64::from(rps),
        &series,
    )?;
    println!("wrote {} and {}", svg.display(), json.display());
    Ok(())
}
