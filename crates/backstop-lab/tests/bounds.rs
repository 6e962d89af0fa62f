//! The bounds of docs/ARCHITECTURE.md ("The bounds the lab asserts"), asserted on the sim engine (1000 requests/s for 60 s of
//! virtual time, seeded), with naive retries shown to break them, so each check can fail.

use backstop_lab::{Report, Scenario, VariantReport, simulate};

fn run(scenario: Scenario) -> Report {
    let report = simulate(scenario, 1, 1000, 60);
    println!("{}", report.table());
    report
}

fn variant<'a>(report: &'a Report, name: &str) -> &'a VariantReport {
    report
        .variants
        .iter()
        .find(|v| v.name == name)
        .expect("every variant runs")
}

/// The fault phase (the middle one).
fn fault(v: &VariantReport) -> &backstop_lab::PhaseReport {
    &v.phases[1]
}

#[test]
fn brownout_costs_at_most_twelve_percent_more_load() {
    let report = run(Scenario::Brownout);
    let (backstop, tower, naive) = (
        variant(&report, "backstop"),
        variant(&report, "tower"),
        variant(&report, "naive"),
    );
    assert!(
        fault(backstop).amplification <= 1.12,
        "{}",
        fault(backstop).amplification
    );
    assert!(
        fault(naive).amplification > 1.12,
        "naive must break the bound"
    );
    // Success per attempt spent: backstop turns its load into successes at least as well as
    // tower. (tower's `TpsBudget::new(_, _, 0.1)` grants 1 retry per 9 deposits, not 10:
    // `(1.0 / 0.1) as isize` is 9. So it buys its extra 0.2 points of success with 11 %
    // retries where backstop keeps to the 10 % it was given.)
    let per_attempt = |v: &VariantReport| fault(v).success_rate / fault(v).amplification;
    assert!(per_attempt(backstop) >= per_attempt(tower));
    assert!(fault(backstop).success_rate >= fault(tower).success_rate - 0.01);
    assert_eq!(backstop.breaker_opens, Some(0), "half failing is not down");
}

#[test]
fn an_outage_costs_probes_and_recovery_does_not_stampede() {
    let report = run(Scenario::Outage);
    let (backstop, naive) = (variant(&report, "backstop"), variant(&report, "naive"));
    let down = fault(backstop);
    assert!(
        down.downstream_attempts as f64 <= 0.1 * down.offered as f64,
        "{} attempts for {} offered while down",
        down.downstream_attempts,
        down.offered
    );
    assert!(fault(naive).downstream_attempts as f64 > 0.1 * fault(naive).offered as f64);
    let offered_rps = f64::from(report.rps);
    assert!(backstop.peak_downstream_rps <= 1.2 * offered_rps);
    assert!(
        naive.peak_downstream_rps > 1.2 * offered_rps,
        "naive's retry backlog"
    );
    assert!(
        backstop.recovery_s.is_some(),
        "traffic is back before the run ends"
    );
    assert!(backstop.breaker_opens.unwrap() >= 1);
}

#[test]
fn a_chain_costs_c_at_most_one_and_a_half_attempts_per_request() {
    let report = run(Scenario::Chain);
    let (backstop, naive) = (variant(&report, "backstop"), variant(&report, "naive"));
    assert!(
        fault(backstop).amplification <= 1.5,
        "{}",
        fault(backstop).amplification
    );
    assert!(fault(naive).amplification > 1.5);
    assert!(backstop.amplification <= 1.5);
}

#[test]
fn slow_leaves_little_orphaned_work() {
    let report = run(Scenario::Slow);
    let (backstop, naive) = (variant(&report, "backstop"), variant(&report, "naive"));
    let (ours, theirs) = (
        backstop.orphaned_work_s.unwrap(),
        naive.orphaned_work_s.unwrap(),
    );
    assert!(theirs > 0.0);
    assert!(
        ours <= 0.2 * theirs,
        "{ours} s orphaned against naive's {theirs} s"
    );
}

#[test]
fn the_sim_is_deterministic_to_the_byte() {
    let a = simulate(Scenario::Chain, 7, 300, 12).to_json();
    let b = simulate(Scenario::Chain, 7, 300, 12).to_json();
    assert_eq!(a, b);
    let c = simulate(Scenario::Chain, 8, 300, 12).to_json();
    assert_ne!(a, c, "the seed matters");
}

/// Every scenario, not only `chain`: the same report twice for one seed. Was a defect, fixed:
/// `overload-chain` and `quiet` differed between runs (the dependency's queue raced a freed
/// worker against a deadline at the same instant in an unbiased `select!`, and the preset's
/// throttle drew its refusals from the OS, not the seed).
#[test]
fn every_scenario_is_deterministic_to_the_byte() {
    use clap::ValueEnum;
    for &scenario in Scenario::value_variants() {
        let a = simulate(scenario, 3, 300, 12).to_json();
        let b = simulate(scenario, 3, 300, 12).to_json();
        assert!(a == b, "{scenario:?} differs between two runs of one seed");
    }
}

/// A dependency that accepts calls and never answers (from 15 s to 45 s): with the preset's
/// default attempt bound, the breaker opens within 2 s of the hang and the dependency then
/// sees probes only; without a breaker every call waits out its caller's patience.
#[test]
fn a_hang_opens_the_default_breaker_within_two_seconds() {
    let report = run(Scenario::Hang);
    let backstop = variant(&report, "backstop");
    let hang_start = 15.0;
    let opened = backstop.first_open_s.expect("the breaker opened");
    println!("opened {:.3} s after the hang", opened - hang_start);
    // Issue 25, 3: the floor follows the 10 ms dependency's p99 (× 20, at least 250 ms), so
    // the hang is cut at 250 ms where the 1 s floor (under the 800 ms share of the 1 s
    // deadline) cut it at 800 ms: open 0.268 s after the hang, was 0.818 s.
    assert!(
        opened - hang_start <= 0.5,
        "opened {:.3} s after the hang",
        opened - hang_start
    );
    assert!(
        opened >= hang_start && opened - hang_start <= 2.0,
        "opened {:.3} s after the hang",
        opened - hang_start
    );
    assert!(
        fault(backstop).amplification <= 0.1,
        "{}",
        fault(backstop).amplification
    );
    for name in ["none", "naive", "tower"] {
        let v = variant(&report, name);
        assert_eq!(v.first_open_s, None);
        assert!(fault(v).amplification >= 1.0, "{name} keeps calling");
    }
}

/// `tail`: 5 % of responses take 1 s more. Measured hedging cuts the users' p99 to under a
/// third of what they see without it, at no more than 10 % more load; tower's `Hedge` (same
/// quantile, 10 s histogram periods) does as well on p99 but hedges once and then leans on its
/// 500 ms attempt timeout, so its p99.9 is a timed-out attempt plus a retry; backstop's third
/// attempt keeps p99.9 at two round trips.
#[test]
fn tail_hedging_cuts_p99_at_ten_percent_more_load() {
    let report = run(Scenario::Tail);
    let (backstop, tower, none) = (
        variant(&report, "backstop"),
        variant(&report, "tower"),
        variant(&report, "none"),
    );
    assert!(
        backstop.p99_ms <= 0.3 * none.p99_ms,
        "{} vs {}",
        backstop.p99_ms,
        none.p99_ms
    );
    assert!(
        fault(backstop).amplification <= 1.10,
        "{}",
        fault(backstop).amplification
    );
    // Within one bucket of the latency model (its p95 is read as the bucket's upper edge,
    // 2.4 % above 10 ms here) of tower's p99.
    assert!(
        backstop.p99_ms <= tower.p99_ms * 1.1,
        "{} vs {}",
        backstop.p99_ms,
        tower.p99_ms
    );
    assert!(
        backstop.p999_ms < tower.p999_ms,
        "{} vs {}",
        backstop.p999_ms,
        tower.p999_ms
    );
    assert!(fault(backstop).success_rate >= 0.999);
}

/// `drift`: latency goes from 50 ms to 800 ms and back, users wait 3 s. tower's fixed 500 ms
/// attempt timeout fails nearly every call of the drift; backstop's measured bound lets them
/// through, and the model's p99 follows the dependency's latency within 10 % from the second
/// after the drift starts to its end.
#[test]
fn drift_is_followed_by_the_measured_bound() {
    let report = run(Scenario::Drift);
    let (backstop, tower) = (variant(&report, "backstop"), variant(&report, "tower"));
    assert!(
        fault(backstop).success_rate >= 0.99,
        "{}",
        fault(backstop).success_rate
    );
    assert!(
        fault(tower).success_rate < 0.5,
        "a fixed 500 ms timeout must break the bound"
    );
    let points = backstop
        .measured_latency
        .as_ref()
        .expect("backstop measures");
    // The drift phase is 15 s to 45 s; the dependency answers in 800 ms.
    for p in points.iter().filter(|p| p.t_s >= 16.0 && p.t_s <= 45.0) {
        let p99 = p.p99_ms.expect("trusted");
        assert!((p99 - 800.0).abs() <= 80.0, "{p99} ms at {} s", p.t_s);
    }
    // Before it, the healthy 50 ms.
    for p in points.iter().filter(|p| p.t_s >= 2.0 && p.t_s <= 15.0) {
        let p99 = p.p99_ms.expect("trusted");
        assert!((p99 - 50.0).abs() <= 5.0, "{p99} ms at {} s", p.t_s);
    }
    assert!(variant(&report, "none").measured_latency.is_none());
}

/// A brownout's first seconds at 200 requests/s: the earnings a healthy window banked are not
/// spent at once. No second of the fault carries more than 1.25× the offered load with
/// backstop's budget (its burst limit, 2× the earning rate); tower's `TpsBudget` spends its bank in the first
/// seconds.
#[test]
fn a_brownout_onset_stays_within_a_quarter_more_load_in_any_second() {
    let report = backstop_lab::simulate(Scenario::Brownout, 1, 200, 60);
    println!("{}", report.table());
    let (backstop, tower) = (variant(&report, "backstop"), variant(&report, "tower"));
    assert!(
        backstop.peak_fault_amplification <= 1.25,
        "{}",
        backstop.peak_fault_amplification
    );
    assert!(
        tower.peak_fault_amplification > 1.25,
        "tower must break the bound"
    );
}

#[test]
fn one_route_down_fails_fast_alone() {
    let report = run(Scenario::Partial);
    let (backstop, naive) = (variant(&report, "backstop"), variant(&report, "naive"));
    let healthy = backstop.healthy_success_rate.expect("partial reports it");
    assert!(healthy >= 0.999, "healthy routes: {healthy}");
    let load = backstop.failing_route_load.expect("partial reports it");
    assert!(
        load <= 0.1,
        "the failing route got {load} attempts per call"
    );
    assert!(
        naive.failing_route_load.unwrap() > 1.0,
        "naive retries must break the bound"
    );
    assert!(
        backstop.breaker_opens.unwrap() >= 1,
        "the route's breaker opened"
    );
    // Other scenarios have no routes.
    let brownout = run(Scenario::Brownout);
    assert_eq!(variant(&brownout, "backstop").healthy_success_rate, None);
}

/// `post`: the network loses 30 % of the answers after the charge was made. The naive loop
/// retries and charges twice; tower's careful policy does not retry a POST and loses the
/// successes; backstop's keyed retries are answered from the server's store: no charge made
/// twice, and as many successes as the naive loop.
#[test]
fn keyed_posts_are_retried_and_done_once() {
    let report = run(Scenario::Post);
    let (backstop, tower, naive) = (
        variant(&report, "backstop"),
        variant(&report, "tower"),
        variant(&report, "naive"),
    );
    assert_eq!(backstop.duplicate_effects, Some(0));
    assert!(
        naive.duplicate_effects.unwrap() > 0,
        "naive must charge twice"
    );
    assert_eq!(tower.duplicate_effects, Some(0));
    assert!(backstop.success_rate >= naive.success_rate, "{backstop:?}");
    assert!(
        fault(tower).success_rate < 0.75,
        "tower loses the lost answers: {}",
        fault(tower).success_rate
    );
    // Every charge was made once: the dependency did one piece of work per user request.
    assert_eq!(backstop.downstream_attempts, backstop.offered);
}

/// `quiet` (issue 25, 4): 10 s of calls to a 10 ms dependency, a minute of silence, then
/// the dependency hangs; users wait 5 s. The model's window emptied during the silence, but
/// the bound decays from what it measured instead of going back to the ceiling (10 s, capped
/// at 80 % of the deadline: 4 s): the hang is cut at about 270 ms and the breaker opens
/// within half a second of it (it opened 4.0 s after it when the model forgot).
#[test]
fn after_a_quiet_minute_a_hang_is_cut_by_the_measured_bound() {
    let report = simulate(Scenario::Quiet, 1, 1000, 80);
    println!("{}", report.table());
    let backstop = variant(&report, "backstop");
    let hang_start = 70.0;
    let opened = backstop.first_open_s.expect("the breaker opened");
    println!("opened {:.3} s after the hang", opened - hang_start);
    assert!(
        opened >= hang_start && opened - hang_start <= 0.5,
        "opened {:.3} s after the hang",
        opened - hang_start
    );
    assert_eq!(backstop.phases[1].offered, 0, "the quiet phase is silent");
    assert!(backstop.phases[0].success_rate >= 0.999);
    for name in ["none", "naive", "tower"] {
        assert_eq!(variant(&report, name).first_open_s, None);
    }
}

/// A dependency of fixed capacity (400 requests/s through a bounded FIFO queue) offered
/// 1 000 requests/s for the fault's 30 s, users waiting 1 s. Without protection the queue
/// grows past what anyone waits for: the dependency stays busy, answering callers that left.
/// backstop (the presets' defaults, never told the capacity: the adaptive limit learns it)
/// keeps the queue short: nearly every answer the dependency can give arrives in time, no
/// work is wasted, and recovery brings no retry storm.
#[test]
fn overload_keeps_goodput_near_capacity_and_wastes_no_work() {
    let report = run(Scenario::Overload);
    let capacity = report.capacity.expect("overload has a capacity");
    assert_eq!(capacity, 400.0);
    let (backstop, none) = (variant(&report, "backstop"), variant(&report, "none"));
    assert_overload_bounds(backstop, none, capacity, "seed 1");
    // Unprotected, the dependency serves callers that left: goodput collapses.
    assert!(none.goodput < 0.25 * capacity, "{}", none.goodput);
    assert!(none.orphaned_work_s.unwrap() > 0.0);
}

/// The bounds of `overload` for backstop against `none` (the soak asserts them per seed).
fn assert_overload_bounds(
    backstop: &VariantReport,
    none: &VariantReport,
    capacity: f64,
    seed: &str,
) {
    assert_capacity_bounds(backstop, none, capacity, seed);
    assert!(backstop.recovery_s.is_some(), "{seed}: never recovered");
}

/// What backstop keeps of a dependency of fixed `capacity` offered more, against `none`, in
/// `overload` and `overload-chain`: goodput near capacity and twice none's, at most a tenth of
/// none's wasted work, no retry storm after the fault.
fn assert_capacity_bounds(
    backstop: &VariantReport,
    none: &VariantReport,
    capacity: f64,
    seed: &str,
) {
    assert!(
        backstop.goodput >= 0.9 * capacity,
        "{seed}: goodput {} of {capacity}",
        backstop.goodput
    );
    assert!(
        backstop.goodput >= 2.0 * none.goodput,
        "{seed}: goodput {} against none's {}",
        backstop.goodput,
        none.goodput
    );
    let (ours, theirs) = (
        backstop.orphaned_work_s.unwrap(),
        none.orphaned_work_s.unwrap(),
    );
    assert!(
        ours <= 0.1 * theirs,
        "{seed}: {ours} s wasted against none's {theirs} s"
    );
    // After the fault users send 300 requests/s again: no second sees a storm of retries.
    assert!(
        backstop.peak_downstream_rps <= 1.2 * 300.0,
        "{seed}: {} attempts/s after the fault",
        backstop.peak_downstream_rps
    );
}

#[test]
fn overload_chain_keeps_goodput_near_capacity_through_two_hops() {
    let report = run(Scenario::OverloadChain);
    let capacity = report.capacity.expect("overload-chain has a capacity");
    assert_eq!(capacity, 400.0);
    let (backstop, none) = (variant(&report, "backstop"), variant(&report, "none"));
    assert_overload_chain_bounds(backstop, none, capacity, "seed 1");
    assert!(none.goodput < 0.25 * capacity, "{}", none.goodput);
    // Every server counts what reached it: A sees each user request once.
    for v in &report.variants {
        let hops = v.hops.as_ref().expect("a chain reports its hops");
        let names: Vec<&str> = hops.iter().map(|h| h.hop.as_str()).collect();
        assert_eq!(names, ["A", "B", "C"]);
        assert_eq!(hops[0].arrived, v.offered, "{}", v.name);
        // C's handler (the dependency) works on what C's admission let through.
        assert_eq!(
            hops[2].arrived - hops[2].refused_on_arrival,
            v.downstream_attempts,
            "{}",
            v.name
        );
    }
    // Only backstop's servers admit by deadline.
    let refused = |v: &VariantReport, hop: usize| v.hops.as_ref().unwrap()[hop].refused_on_arrival;
    for v in &report.variants {
        if v.name != "backstop" {
            assert!((0..3).all(|hop| refused(v, hop) == 0), "{}", v.name);
        }
    }
}

/// The bounds of `overload-chain` for backstop against `none` (the soak asserts them per
/// seed), each hop's admission refusing on arrival among them.
fn assert_overload_chain_bounds(
    backstop: &VariantReport,
    none: &VariantReport,
    capacity: f64,
    seed: &str,
) {
    assert_capacity_bounds(backstop, none, capacity, seed);
    // Each hop's admission refuses on arrival what cannot fit its measured need.
    let hops = backstop.hops.as_ref().expect("a chain reports its hops");
    for (hop, least) in [(0, 5_000), (1, 100), (2, 20)] {
        assert!(hops[hop].refused_on_arrival > least, "{seed}: {hops:?}");
    }
}

/// `routes` (issue 25, 5): `/route/0` takes 2 s and gets 0.5 % of the calls, the other
/// three routes 10 ms; users wait 5 s. backstop keys its breaker per path and, with it, the
/// latency model: the rare route is bounded by its own latency (the ceiling capped by the
/// deadline's share until its model is trusted, then its own p99 × 3) and at least 99 % of
/// its calls succeed, as do the fast routes'. tower's fixed 500 ms timeout cuts all of them.
#[test]
fn a_rare_slow_route_is_bounded_by_its_own_latency() {
    let report = run(Scenario::Routes);
    let (backstop, tower, none) = (
        variant(&report, "backstop"),
        variant(&report, "tower"),
        variant(&report, "none"),
    );
    let rare = backstop.slow_route_success_rate.expect("routes reports it");
    assert!(rare >= 0.99, "the rare route's success: {rare}");
    assert!(backstop.success_rate >= 0.999, "{}", backstop.success_rate);
    // With one model the rare route's attempts were cut at the fast routes' 250 ms floor:
    // 0.3 % of its calls succeeded and its breaker opened 16 times.
    assert_eq!(backstop.breaker_opens, Some(0));
    assert_eq!(
        none.slow_route_success_rate,
        Some(1.0),
        "it answers in time"
    );
    assert!(
        tower.slow_route_success_rate.unwrap() < 0.99,
        "a bound that does not follow the route must break it"
    );
    // Other scenarios have no slow route.
    let partial = run(Scenario::Partial);
    assert_eq!(variant(&partial, "backstop").slow_route_success_rate, None);
}

/// `capacity-drop`: the dependency serves 400 requests/s, 200 for the middle third of the
/// fault, 400 again for the last; the report's `capacity` is the mean over the fault. backstop
/// (the presets' defaults: the adaptive limit) follows the drop and the recovery: its
/// goodput is at least 90 % of the capacity in each third of the fault, the 85 % of
/// the mean over the whole fault, and it wastes no work.
#[test]
fn capacity_drop_goodput_follows_the_capacity_down_and_back() {
    let report = run(Scenario::CapacityDrop);
    let capacity = report.capacity.expect("capacity-drop has a capacity");
    assert_eq!(
        capacity, 333.333,
        "the mean of 400, 200 and 400 over the fault's thirds"
    );
    let (backstop, none) = (variant(&report, "backstop"), variant(&report, "none"));
    assert_capacity_drop_bounds(&report, backstop, none, "seed 1");
    assert!(none.goodput < 0.25 * capacity, "{}", none.goodput);
}

/// The bounds of `capacity-drop` for backstop against `none` (the soak asserts them per
/// seed).
fn assert_capacity_drop_bounds(
    report: &Report,
    backstop: &VariantReport,
    none: &VariantReport,
    seed: &str,
) {
    let capacity = report.capacity.expect("a capacity");
    assert_capacity_bounds(backstop, none, capacity, seed);
    assert!(
        backstop.goodput >= 0.85 * capacity,
        "{seed}: {}",
        backstop.goodput
    );
    let per_s = backstop.goodput_per_s.as_ref().expect("goodput per second");
    let thirds = report.fault_thirds(per_s);
    for (got, of) in thirds.iter().zip([400.0, 200.0, 400.0]) {
        assert!(
            *got >= 0.9 * of,
            "{seed}: goodput {thirds:?} for 400 · 200 · 400"
        );
    }
    // The limit follows: within 2 s of the drop every second's goodput is within 10 % of
    // the 200 the dependency can serve, to the end of that third; within 5 s of the return,
    // of the 400.
    let (down, up) = report.follows(per_s);
    assert!(
        down.is_some_and(|s| s <= 2.0),
        "{seed}: {down:?} after the drop: {per_s:?}"
    );
    assert!(
        up.is_some_and(|s| s <= 5.0),
        "{seed}: {up:?} after the return: {per_s:?}"
    );
}

/// The `tower-resilience` variant (its adaptive limit, retry and time limiter) in `overload`:
/// its callers wait for a permit, in turn, up to the 500 ms the time limiter gives an
/// attempt, so those who get one have little time left and leave before the answer, whose
/// work the dependency still does: its goodput collapses as none's does. backstop's (the
/// presets' defaults) is at least its own, the bound.
#[test]
fn overload_backstop_keeps_at_least_tower_resilience_goodput() {
    let report = run(Scenario::Overload);
    let (backstop, peer) = (
        variant(&report, "backstop"),
        variant(&report, "tower-resilience"),
    );
    assert!(
        backstop.goodput >= peer.goodput,
        "{} against {}",
        backstop.goodput,
        peer.goodput
    );
    assert!(peer.goodput_per_s.is_some());
    // Only the scenarios with a finite capacity run it.
    let brownout = run(Scenario::Brownout);
    assert!(
        brownout
            .variants
            .iter()
            .all(|v| v.name != "tower-resilience")
    );
    assert_eq!(variant(&brownout, "backstop").goodput_per_s, None);
}
