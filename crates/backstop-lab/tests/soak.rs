//! A bounded soak: every scenario under several seeds (1000 requests/s for 60 s of virtual
//! time each, 240 000 virtual requests per scenario, about a million in all), asserting
//! docs/ARCHITECTURE.md's bounds for backstop under every seed tried. The seeds are fixed, drawn once
//! from a generator, so a failure names a seed that reproduces it.

use backstop_lab::{Scenario, Variant, VariantReport, simulate_variants};

const SEEDS: [u64; 4] = [0x9E37_79B9, 0x85EB_CA6B, 0xC2B2_AE35, 0x27D4_EB2F];

fn backstop(scenario: Scenario, seed: u64) -> VariantReport {
    let report = simulate_variants(scenario, seed, 1000, 60, &[Variant::Backstop]);
    report.variants.into_iter().next().expect("one variant")
}

#[test]
fn brownout_bounds_hold_for_every_seed() {
    for seed in SEEDS {
        let v = backstop(Scenario::Brownout, seed);
        assert!(v.phases[1].amplification <= 1.12, "seed {seed:#x}: {v:?}");
    }
}

#[test]
fn outage_bounds_hold_for_every_seed() {
    for seed in SEEDS {
        let v = backstop(Scenario::Outage, seed);
        let down = &v.phases[1];
        assert!(
            down.downstream_attempts as f64 <= 0.1 * down.offered as f64,
            "seed {seed:#x}: {v:?}"
        );
        assert!(
            v.peak_downstream_rps <= 1.2 * 1000.0,
            "seed {seed:#x}: {v:?}"
        );
        assert!(v.recovery_s.is_some(), "seed {seed:#x}: {v:?}");
    }
}

#[test]
fn chain_bounds_hold_for_every_seed() {
    for seed in SEEDS {
        let v = backstop(Scenario::Chain, seed);
        assert!(v.amplification <= 1.5, "seed {seed:#x}: {v:?}");
    }
}

#[test]
fn slow_bounds_hold_for_every_seed() {
    for seed in SEEDS {
        let report = simulate_variants(
            Scenario::Slow,
            seed,
            1000,
            60,
            &[Variant::Naive, Variant::Backstop],
        );
        let (naive, ours) = (&report.variants[0], &report.variants[1]);
        let (theirs, mine) = (
            naive.orphaned_work_s.unwrap(),
            ours.orphaned_work_s.unwrap(),
        );
        assert!(
            mine <= 0.2 * theirs,
            "seed {seed:#x}: {mine} against {theirs}"
        );
    }
}

#[test]
fn post_bounds_hold_for_every_seed() {
    for seed in SEEDS {
        let report = simulate_variants(
            Scenario::Post,
            seed,
            1000,
            60,
            &[Variant::Naive, Variant::Backstop],
        );
        let [naive, backstop] = &report.variants[..] else {
            panic!("two variants")
        };
        assert_eq!(
            backstop.duplicate_effects,
            Some(0),
            "seed {seed:#x}: {backstop:?}"
        );
        assert!(naive.duplicate_effects.unwrap() > 0, "seed {seed:#x}");
        assert!(
            backstop.success_rate >= naive.success_rate,
            "seed {seed:#x}: {} < {}",
            backstop.success_rate,
            naive.success_rate
        );
    }
}

#[test]
fn routes_bounds_hold_for_every_seed() {
    for seed in SEEDS {
        let v = backstop(Scenario::Routes, seed);
        let rare = v.slow_route_success_rate.expect("routes reports it");
        assert!(rare >= 0.99, "seed {seed:#x}: {rare}");
    }
}

#[test]
fn quiet_bounds_hold_for_every_seed() {
    for seed in SEEDS {
        let report = simulate_variants(Scenario::Quiet, seed, 1000, 80, &[Variant::Backstop]);
        let v = &report.variants[0];
        let opened = v.first_open_s.expect("the breaker opened") - 70.0;
        assert!((0.0..=0.5).contains(&opened), "seed {seed:#x}: {opened} s");
    }
}

#[test]
fn overload_bounds_hold_for_every_seed() {
    for seed in SEEDS {
        let report = simulate_variants(
            Scenario::Overload,
            seed,
            1000,
            60,
            &[Variant::None, Variant::Backstop],
        );
        let capacity = report.capacity.expect("overload has a capacity");
        let (none, ours) = (&report.variants[0], &report.variants[1]);
        assert_capacity_bounds(ours, none, capacity, seed);
        assert!(ours.recovery_s.is_some(), "seed {seed:#x}: {ours:?}");
    }
}

#[test]
fn overload_chain_bounds_hold_for_every_seed() {
    for seed in SEEDS {
        let report = simulate_variants(
            Scenario::OverloadChain,
            seed,
            1000,
            60,
            &[Variant::None, Variant::Backstop],
        );
        let capacity = report.capacity.expect("overload-chain has a capacity");
        let (none, ours) = (&report.variants[0], &report.variants[1]);
        assert_capacity_bounds(ours, none, capacity, seed);
        // Each hop's admission refuses on arrival what cannot fit its measured need.
        let hops = ours.hops.as_ref().expect("a chain reports its hops");
        for (hop, least) in [(0, 5_000), (1, 100), (2, 20)] {
            assert!(
                hops[hop].refused_on_arrival > least,
                "seed {seed:#x}: {hops:?}"
            );
        }
    }
}

#[test]
fn capacity_drop_bounds_hold_for_every_seed() {
    for seed in SEEDS {
        let report = simulate_variants(
            Scenario::CapacityDrop,
            seed,
            1000,
            60,
            &[Variant::None, Variant::Backstop],
        );
        let capacity = report.capacity.expect("capacity-drop has a capacity");
        let (none, ours) = (&report.variants[0], &report.variants[1]);
        assert_capacity_bounds(ours, none, capacity, seed);
        let thirds = report.fault_thirds(ours.goodput_per_s.as_ref().expect("per second"));
        for (got, of) in thirds.iter().zip([400.0, 200.0, 400.0]) {
            assert!(*got >= 0.9 * of, "seed {seed:#x}: {thirds:?}");
        }
    }
}

/// What backstop keeps of a dependency of fixed `capacity` offered more, against `none`, in
/// `overload` and `overload-chain`: goodput near capacity and twice none's, at most a tenth of
/// none's wasted work, no retry storm after the fault.
fn assert_capacity_bounds(ours: &VariantReport, none: &VariantReport, capacity: f64, seed: u64) {
    assert!(ours.goodput >= 0.9 * capacity, "seed {seed:#x}: {ours:?}");
    assert!(
        ours.goodput >= 2.0 * none.goodput,
        "seed {seed:#x}: {ours:?}"
    );
    assert!(
        ours.orphaned_work_s.unwrap() <= 0.1 * none.orphaned_work_s.unwrap(),
        "seed {seed:#x}: {ours:?}"
    );
    assert!(
        ours.peak_downstream_rps <= 1.2 * 300.0,
        "seed {seed:#x}: {ours:?}"
    );
}
