//! The report: JSON (a stable schema) and the table printed at the end of a run.

use serde::Serialize;
use std::fmt::Write as _;

/// A whole run: one scenario, every variant. Serialized as the `<scenario>.json` report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The scenario's name (`brownout`, `outage`, `chain`, `slow`, `hang`, `tail`, `drift`,
    /// `partial`, `routes`, `overload`, `overload-chain`, `capacity-drop`, `post`, `quiet`).
    pub scenario: String,
    /// `real` or `sim`.
    pub engine: String,
    /// The seed of every random choice.
    pub seed: u64,
    /// Offered user requests per second.
    pub rps: u32,
    /// Length of the run, in seconds.
    pub duration_s: f64,
    /// What the dependency can serve, in requests per second, on average over the fault:
    /// 400 in `overload` and `overload-chain`; in `capacity-drop`, where it serves 200 for
    /// the middle third of the fault and 400 for the rest, the mean of the fault's three
    /// thirds (333.333). `null` where its capacity is unbounded.
    pub capacity: Option<f64>,
    /// One entry per variant, in the order run.
    pub variants: Vec<VariantReport>,
}

/// One variant's results. Fields a scenario cannot measure are `null`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VariantReport {
    /// `none`, `naive`, `tower`, `tower-resilience` or `backstop`.
    pub name: String,
    /// User requests sent.
    pub offered: u64,
    /// Attempts that reached the dependency (in `chain`: C).
    pub downstream_attempts: u64,
    /// `downstream_attempts / offered`.
    pub amplification: f64,
    /// The busiest second of the fault: attempts over the user requests offered in it (what
    /// a budget banked before the fault lets through at its onset).
    pub peak_fault_amplification: f64,
    /// Share of user requests answered with a 2xx before the user gave up.
    pub success_rate: f64,
    /// User requests of the fault phase answered with a 2xx before the user gave up, per
    /// second of the fault.
    pub goodput: f64,
    /// In the scenarios with a fixed capacity (`overload`, `overload-chain`,
    /// `capacity-drop`): the user requests sent in each second of the run that were answered
    /// with a 2xx in time, one number per second (how goodput followed the load and, in
    /// `capacity-drop`, the capacity); `null` elsewhere.
    pub goodput_per_s: Option<Vec<f64>>,
    /// Median user latency (ms).
    pub p50_ms: f64,
    /// 99th percentile user latency (ms).
    pub p99_ms: f64,
    /// 99.9th percentile user latency (ms).
    pub p999_ms: f64,
    /// Slowest user request (ms).
    pub max_ms: f64,
    /// The busiest second the dependency saw after the fault ended (attempts per second).
    pub peak_downstream_rps: f64,
    /// Seconds from the end of the fault to the first second in which 99 % of user requests
    /// succeeded; `null` if that never happened.
    pub recovery_s: Option<f64>,
    /// Request-seconds of work the dependency did after its caller had given up.
    pub orphaned_work_s: Option<f64>,
    /// In `post`: side effects beyond one per user request (a charge made twice); `null`
    /// in the scenarios without side effects.
    pub duplicate_effects: Option<u64>,
    /// Times a breaker opened (`null` for variants without one).
    pub breaker_opens: Option<u64>,
    /// Seconds from the start of the run to the first time a breaker opened (`null` for
    /// variants without a breaker, or when it never opened).
    pub first_open_s: Option<f64>,
    /// In `partial`: the share of user requests to the routes that stayed up answered with a
    /// 2xx, over the whole run (`null` in other scenarios).
    pub healthy_success_rate: Option<f64>,
    /// In `partial`: attempts the failing route received during the fault, per user request
    /// to it (below 1: most of them failed fast, without reaching it; `null` elsewhere).
    pub failing_route_load: Option<f64>,
    /// In `routes`: the share of user requests to the rare slow route answered with a 2xx,
    /// over the whole run (`null` in other scenarios).
    pub slow_route_success_rate: Option<f64>,
    /// The same numbers per phase.
    pub phases: Vec<PhaseReport>,
    /// What backstop's client measured of the dependency's latency, once a second (`null`
    /// for variants that measure nothing).
    pub measured_latency: Option<Vec<MeasuredPoint>>,
    /// In `chain` and `overload-chain`: what each server (A, B, then the dependency C) was
    /// sent and refused on arrival, without running its handler (`null` elsewhere).
    pub hops: Option<Vec<HopReport>>,
}

/// One server of a chain.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HopReport {
    /// `A`, `B` or `C` (the dependency).
    pub hop: String,
    /// Requests that reached it.
    pub arrived: u64,
    /// Of those, the requests its server stack answered without calling its handler
    /// (backstop's: admission, a remaining deadline below the route's measured need; the
    /// deadline layer refuses on arrival only a deadline already spent, which backstop's
    /// clients never send).
    pub refused_on_arrival: u64,
}

/// The dependency's latency as a client's latency model read it at one instant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MeasuredPoint {
    /// Seconds from the start of the run.
    pub t_s: f64,
    /// The model's median (ms), once it is trusted.
    pub p50_ms: Option<f64>,
    /// The model's 99th percentile (ms), once it is trusted.
    pub p99_ms: Option<f64>,
}

/// One phase of one variant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseReport {
    /// `healthy`, the fault's name, or `recovered`.
    pub name: String,
    /// User requests sent during the phase.
    pub offered: u64,
    /// Attempts that reached the dependency during the phase.
    pub downstream_attempts: u64,
    /// `downstream_attempts / offered`.
    pub amplification: f64,
    /// Share of the phase's user requests that succeeded.
    pub success_rate: f64,
}

impl Report {
    /// The mean of `per_s` (one number per second of the run) over each third of the fault
    /// (the middle half of the run), a second counted in the third its middle falls in.
    pub fn fault_thirds(&self, per_s: &[f64]) -> [f64; 3] {
        let (start, end) = (self.duration_s / 4.0, self.duration_s * 3.0 / 4.0);
        let third = (end - start) / 3.0;
        let mut sums = [0.0; 3];
        let mut counts = [0u32; 3];
        for (t, value) in per_s.iter().enumerate() {
            let middle = t as f64 + 0.5;
            if middle < start || middle >= end {
                continue;
            }
            let k = (((middle - start) / third) as usize).min(2);
            sums[k] += value;
            counts[k] += 1;
        }
        let mut means = [0.0; 3];
        for k in 0..3 {
            if counts[k] > 0 {
                means[k] = sums[k] / f64::from(counts[k]);
            }
        }
        means
    }

    /// In `capacity-drop`: how many seconds after the drop (and after the return) goodput
    /// first comes within 10 % of the capacity and stays there to the end of that third
    /// (`None`: never). Whole seconds of `per_s`, from the first second wholly after the
    /// change.
    pub fn follows(&self, per_s: &[f64]) -> (Option<f64>, Option<f64>) {
        let (start, third) = (self.duration_s / 4.0, self.duration_s / 6.0);
        let settle = |from: f64, to: f64, capacity: f64| {
            let (from, to) = (from.ceil() as usize, (to.floor() as usize).min(per_s.len()));
            (from..to)
                .find(|&t| {
                    per_s[t..to]
                        .iter()
                        .all(|g| (g - capacity).abs() <= 0.1 * capacity)
                })
                .map(|t| (t - from) as f64)
        };
        (
            settle(start + third, start + 2.0 * third, 200.0),
            settle(start + 2.0 * third, start + 3.0 * third, 400.0),
        )
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }

    /// The table printed at the end of a run.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let fault = self.variants.first().and_then(|v| v.phases.get(1));
        let fault_name = fault.map_or("fault", |p| p.name.as_str());
        let _ = writeln!(
            out,
            "scenario {} · engine {} · {} req/s for {} s · seed {}",
            self.scenario, self.engine, self.rps, self.duration_s, self.seed
        );
        if let Some(capacity) = self.capacity {
            let _ = writeln!(out, "dependency capacity {capacity} req/s");
        }
        let _ = writeln!(
            out,
            "{:<16} {:>8} {:>9} {:>7} {:>8} {:>9} {:>9} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9} {:>6}",
            "variant",
            "offered",
            "attempts",
            "ampl.",
            "success",
            "goodput/s",
            &format!("{fault_name} ampl."),
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "peak/s",
            "recov s",
            "orphan s",
            "opens"
        );
        for v in &self.variants {
            let opt = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.1}"));
            let fault_ampl = v.phases.get(1).map_or(0.0, |p| p.amplification);
            let _ = writeln!(
                out,
                "{:<16} {:>8} {:>9} {:>7.3} {:>7.1}% {:>9.1} {:>9.3} {:>8.1} {:>8.1} {:>9.1} {:>8.0} {:>8} {:>9} {:>6}",
                v.name,
                v.offered,
                v.downstream_attempts,
                v.amplification,
                v.success_rate * 100.0,
                v.goodput,
                fault_ampl,
                v.p50_ms,
                v.p99_ms,
                v.p999_ms,
                v.peak_downstream_rps,
                opt(v.recovery_s),
                opt(v.orphaned_work_s),
                v.breaker_opens.map_or("-".to_owned(), |n| n.to_string()),
            );
        }
        if self.variants.iter().any(|v| v.duplicate_effects.is_some()) {
            let counts: Vec<String> = self
                .variants
                .iter()
                .map(|v| {
                    let n = v
                        .duplicate_effects
                        .map_or("-".to_owned(), |n| n.to_string());
                    format!("{} {n}", v.name)
                })
                .collect();
            let _ = writeln!(out, "duplicate effects: {}", counts.join(" · "));
        }
        if self.scenario == "capacity-drop" {
            let _ = writeln!(
                out,
                "goodput/s in each third of the fault (capacity 400 · 200 · 400 req/s):"
            );
            for v in &self.variants {
                if let Some(per_s) = &v.goodput_per_s {
                    let thirds = self.fault_thirds(per_s);
                    let thirds: Vec<String> = thirds.iter().map(|g| format!("{g:.1}")).collect();
                    let follows =
                        |s: Option<f64>| s.map_or("never".to_owned(), |s| format!("{s} s"));
                    let (down, up) = self.follows(per_s);
                    let _ = writeln!(
                        out,
                        "  {:<16} {}   within 10 % of the capacity {} after the drop, {} after the return",
                        v.name,
                        thirds.join(" · "),
                        follows(down),
                        follows(up)
                    );
                }
            }
        }
        for v in &self.variants {
            if let Some(hops) = &v.hops {
                let hops: Vec<String> = hops
                    .iter()
                    .map(|h| format!("{} {} ({} refused)", h.hop, h.arrived, h.refused_on_arrival))
                    .collect();
                let _ = writeln!(out, "{} hops: {}", v.name, hops.join(" · "));
            }
        }
        out
    }
}
