//! The `capacity-drop` scenario, the `tower-resilience` variant and the first screen's
//! summary, on the sim engine.

use backstop_lab::{
    Adaptive, Run, Scenario, Variant, backend::SERVICE_TIME, simulate, simulate_run,
    simulate_variants, summary,
};
use std::time::Duration;

/// The report's `capacity` in `capacity-drop` is the mean over the fault: 400 requests/s for
/// two thirds of it, 200 for the middle third.
#[test]
fn capacity_drop_reports_the_fault_mean_capacity() {
    let scenario = Scenario::CapacityDrop;
    let minute = Duration::from_secs(60);
    let mean = scenario
        .mean_fault_capacity(minute, SERVICE_TIME)
        .expect("a capacity");
    assert!((mean - 1000.0 / 3.0).abs() < 1e-6, "{mean}");
    // The drop is the middle third of the fault (15 s to 45 s): 25 s to 35 s.
    assert_eq!(
        scenario.worker_changes(minute),
        vec![(Duration::from_secs(25), 2), (Duration::from_secs(35), 4)]
    );
    let per_second = scenario
        .capacity_per_second(minute, SERVICE_TIME)
        .expect("a capacity");
    assert_eq!(per_second.len(), 60);
    assert_eq!(
        (
            per_second[24],
            per_second[25],
            per_second[34],
            per_second[35]
        ),
        (400.0, 200.0, 200.0, 400.0)
    );
    // `overload` keeps its fixed 400; the scenarios without a capacity have none.
    assert_eq!(
        Scenario::Overload.mean_fault_capacity(minute, SERVICE_TIME),
        Some(400.0)
    );
    assert_eq!(
        Scenario::Brownout.mean_fault_capacity(minute, SERVICE_TIME),
        None
    );

    // In a run, the report says so (rounded to 3 decimals), in a short run too, where the
    // thirds do not fall on whole seconds.
    let report = simulate_variants(scenario, 1, 1000, 60, &[Variant::None]);
    assert_eq!(report.capacity, Some(333.333));
    let short = simulate_variants(scenario, 1, 200, 10, &[Variant::None]);
    assert_eq!(short.capacity, Some(333.333));
}

/// `capacity-drop`, every variant, the same report twice for one seed (the engine's test of
/// every scenario covers it too, at another seed and load).
#[test]
fn capacity_drop_is_deterministic_to_the_byte() {
    let a = simulate(Scenario::CapacityDrop, 5, 1000, 12).to_json();
    let b = simulate(Scenario::CapacityDrop, 5, 1000, 12).to_json();
    assert!(a == b, "capacity-drop differs between two runs of one seed");
    let report = simulate(Scenario::CapacityDrop, 5, 1000, 12);
    let names: Vec<&str> = report.variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names,
        ["none", "naive", "tower", "tower-resilience", "backstop"]
    );
    for v in &report.variants {
        let per_s = v.goodput_per_s.as_ref().expect("capacity-drop reports it");
        assert_eq!(per_s.len(), 12, "{}", v.name);
    }
}

/// The `tower-resilience` variant runs every algorithm, with and without shedding, the same
/// report twice for one seed: its adaptive layer reads `std`'s clock, which the sim's paused
/// clock does not move, and the algorithm is handed tokio's instead.
#[test]
fn tower_resilience_runs_and_is_deterministic_in_the_sim() {
    for adaptive in Adaptive::ALL {
        for shed in [false, true] {
            let mut run = Run::sim(Scenario::Overload, 3, 1000, 12);
            run.adaptive = adaptive;
            run.shed = shed;
            let a = simulate_run(&run, &[Variant::TowerResilience]);
            let b = simulate_run(&run, &[Variant::TowerResilience]);
            assert!(
                a.to_json() == b.to_json(),
                "{adaptive:?}, shed {shed}: two runs differ"
            );
            let v = &a.variants[0];
            assert_eq!(v.name, "tower-resilience");
            assert!(v.offered > 0 && v.downstream_attempts > 0, "{v:?}");
            // Before the overload every call succeeds.
            assert!(v.phases[0].success_rate >= 0.999, "{adaptive:?}: {v:?}");
        }
    }
}

/// [`Adaptive::BEST`], the algorithm the variant runs by default, has the highest goodput of
/// the three in `overload` (sim, seed 1, 1 000 requests/s for 60 s), as the variant's docs
/// say; and refusing at once instead of waiting (`--shed`) keeps goodput near the capacity.
#[test]
fn the_default_algorithm_is_the_best_in_overload() {
    let goodput = |adaptive: Adaptive, shed: bool| {
        let mut run = Run::sim(Scenario::Overload, 1, 1000, 60);
        run.adaptive = adaptive;
        run.shed = shed;
        let report = simulate_run(&run, &[Variant::TowerResilience]);
        report.variants[0].goodput
    };
    let all: Vec<(Adaptive, f64)> = Adaptive::ALL
        .into_iter()
        .map(|a| (a, goodput(a, false)))
        .collect();
    println!("{all:?}");
    let best = all
        .iter()
        .copied()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("three");
    assert_eq!(best.0, Adaptive::BEST, "{all:?}");
    let shed = goodput(Adaptive::BEST, true);
    println!("shedding: {shed}");
    assert!(shed >= 0.9 * 400.0, "{shed}");
}

/// The first screen: brownout, outage and overload, a line per scenario and variant, and a
/// sentence per variant with the run's numbers, within a terminal's width and height.
#[test]
fn the_summary_shows_every_scenario_and_trade_on_one_screen() {
    let reports: Vec<_> = summary::SCENARIOS
        .iter()
        .map(|&scenario| {
            let (rps, seconds) =
                backstop_lab::default_load(scenario, backstop_lab::Engine::Sim, true);
            simulate(scenario, 1, rps, seconds)
        })
        .collect();
    let text = summary::summary(&reports, Adaptive::BEST);
    println!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() <= 50, "{} lines", lines.len());
    for line in &lines {
        assert!(line.chars().count() <= 100, "too wide: {line}");
    }
    for scenario in ["brownout", "outage", "overload"] {
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.starts_with(&format!("{scenario} · ")))
                .count(),
            1,
            "{scenario}"
        );
    }
    // A line per variant run in each scenario: four in brownout and outage, five in overload.
    let rows = |name: &str| {
        lines
            .iter()
            .filter(|l| l.split_whitespace().next() == Some(name))
            .count()
    };
    for (name, runs) in [
        ("none", 3),
        ("naive", 3),
        ("tower", 3),
        ("backstop", 3),
        ("tower-resilience", 1),
    ] {
        assert_eq!(rows(name), runs, "{name}");
    }
    // Then one sentence per variant, naming its trade with the numbers of the runs.
    for name in ["none", "naive", "tower", "tower-resilience", "backstop"] {
        let sentence = lines
            .iter()
            .position(|l| l.starts_with(&format!("- {name} (")))
            .unwrap_or_else(|| panic!("no sentence for {name}"));
        assert!(sentence > 10, "{name}: the sentences come after the table");
    }
    assert!(text.contains("answers/s"), "goodput quoted: {text}");
    assert!(!text.contains(" - "), "a number is missing: {text}");
}

/// Without `--rps`, the scenarios with a finite capacity run at 1 000 requests/s whatever the
/// engine (less would not overload the dependency), the others at the engine's default.
#[test]
fn overload_scenarios_default_to_a_load_that_overloads() {
    use backstop_lab::{Engine, default_load};
    for engine in [Engine::Real, Engine::Sim] {
        for quick in [false, true] {
            for scenario in [
                Scenario::Overload,
                Scenario::OverloadChain,
                Scenario::CapacityDrop,
            ] {
                assert_eq!(default_load(scenario, engine, quick).0, 1000);
            }
        }
    }
    assert_eq!(
        default_load(Scenario::Brownout, Engine::Real, false),
        (200, 12)
    );
    assert_eq!(
        default_load(Scenario::Brownout, Engine::Real, true),
        (50, 8)
    );
    assert_eq!(
        default_load(Scenario::Brownout, Engine::Sim, true),
        (200, 20)
    );
}
