//! The first screen: the scenarios where the choice of caller matters, one line per scenario
//! and variant, and the trade each variant makes, in words and with the run's numbers.

use crate::{Adaptive, Report, Scenario, VariantReport};
use std::fmt::Write as _;

/// The scenarios a run without `--scenario` sums up: a brownout (spare capacity: retries
/// buy success), an outage (nothing to buy: retries are pure load) and an overload (no spare
/// capacity: retries and waiting sink the dependency).
pub const SCENARIOS: [Scenario; 3] = [Scenario::Brownout, Scenario::Outage, Scenario::Overload];

/// What goes wrong in `scenario`, in a few words.
fn fault(report: &Report) -> String {
    let fault_s = report.duration_s / 2.0;
    match report.scenario.as_str() {
        "brownout" => format!("half the answers fail, all 200 ms slower, for {fault_s} s"),
        "outage" => format!("every answer fails for {fault_s} s"),
        "overload" | "overload-chain" | "capacity-drop" => format!(
            "{} req/s offered for {fault_s} s to a dependency serving {}/s",
            report.rps,
            report
                .capacity
                .map_or("?".to_owned(), |c| format!("{c:.0}"))
        ),
        other => format!("{other} for {fault_s} s"),
    }
}

/// The summary of `reports` (each a scenario, its variants), `adaptive` the algorithm the
/// `tower-resilience` variant ran.
pub fn summary(reports: &[Report], adaptive: Adaptive) -> String {
    let mut out = String::new();
    let engine = reports.first().map_or("?", |r| r.engine.as_str());
    let seed = reports.first().map_or(0, |r| r.seed);
    let _ = writeln!(
        out,
        "backstop-lab · engine {engine} · seed {seed} · the same faults, each way of calling the dependency"
    );
    let _ = writeln!(
        out,
        "success, load (attempts per user request) and goodput (answers in time per second) are the fault's;"
    );
    let _ = writeln!(
        out,
        "p99 over the whole run, refusals included; wasted: seconds of work for callers that had left"
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<10} {:<17} {:>8} {:>6} {:>10} {:>7} {:>7} {:>9}",
        "scenario", "variant", "success", "load", "goodput/s", "p99 ms", "wasted", "recovery"
    );
    for report in reports {
        let _ = writeln!(
            out,
            "{} · {} · {} req/s for {} s",
            report.scenario,
            fault(report),
            report.rps,
            report.duration_s
        );
        for v in &report.variants {
            let fault = v.phases.get(1);
            let goodput = match report.capacity {
                Some(c) if c > 0.0 => format!("{:.0} ({:.0}%)", v.goodput, v.goodput / c * 100.0),
                _ => format!("{:.0}", v.goodput),
            };
            let _ = writeln!(
                out,
                "{:<10} {:<17} {:>7.1}% {:>5.2}× {:>10} {:>7.0} {:>6.0}s {:>9}",
                "",
                v.name,
                fault.map_or(0.0, |p| p.success_rate) * 100.0,
                fault.map_or(0.0, |p| p.amplification),
                goodput,
                v.p99_ms,
                v.orphaned_work_s.unwrap_or(0.0),
                v.recovery_s
                    .map_or("never".to_owned(), |s| format!("{s:.0} s")),
            );
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "The trade each makes:");
    // In the lab's order, each variant that ran somewhere.
    let names: Vec<&str> = crate::Variant::ALL
        .iter()
        .map(|v| v.name())
        .filter(|name| {
            reports
                .iter()
                .any(|r| r.variants.iter().any(|v| v.name == *name))
        })
        .collect();
    let numbers = Numbers { reports };
    for name in names {
        out.push_str(&wrap(&trade(name, &numbers, adaptive), 98));
    }
    let _ = writeln!(
        out,
        "(--scenario NAME for one scenario's whole table, e.g. capacity-drop or overload-chain)"
    );
    out
}

/// `sentence` as a list item: "- " then lines of at most `width` characters, continued
/// under its first word.
fn wrap(sentence: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::from("-");
    for word in sentence.split_whitespace() {
        if line.chars().count() + 1 + word.chars().count() > width && line.trim() != "-" {
            out.push_str(&line);
            out.push('\n');
            line = String::from(" ");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// The numbers the sentences quote, `-` where the run did not measure them.
struct Numbers<'a> {
    reports: &'a [Report],
}

impl Numbers<'_> {
    fn variant(&self, scenario: &str, name: &str) -> Option<(&Report, &VariantReport)> {
        let report = self.reports.iter().find(|r| r.scenario == scenario)?;
        Some((report, report.variants.iter().find(|v| v.name == name)?))
    }

    /// Success during the fault of `scenario`.
    fn success(&self, scenario: &str, name: &str) -> String {
        self.variant(scenario, name)
            .and_then(|(_, v)| v.phases.get(1))
            .map_or("-".to_owned(), |p| {
                format!("{:.1}%", p.success_rate * 100.0)
            })
    }

    /// Whether `name` had the highest success during the fault of `scenario`.
    fn most_success(&self, scenario: &str, name: &str) -> bool {
        let Some(report) = self.reports.iter().find(|r| r.scenario == scenario) else {
            return false;
        };
        let success = |v: &VariantReport| v.phases.get(1).map_or(0.0, |p| p.success_rate);
        let best = report.variants.iter().map(success).fold(0.0, f64::max);
        report
            .variants
            .iter()
            .any(|v| v.name == name && success(v) >= best)
    }

    /// Attempts per user request during the fault of `scenario`.
    fn load(&self, scenario: &str, name: &str) -> String {
        self.variant(scenario, name)
            .and_then(|(_, v)| v.phases.get(1))
            .map_or("-".to_owned(), |p| format!("{:.2}×", p.amplification))
    }

    /// Goodput in `overload`, with the share of the capacity.
    fn goodput(&self, name: &str) -> String {
        self.variant("overload", name)
            .map_or("-".to_owned(), |(report, v)| match report.capacity {
                Some(c) if c > 0.0 => {
                    format!(
                        "{:.0} of {c:.0} answers/s ({:.0}%)",
                        v.goodput,
                        v.goodput / c * 100.0
                    )
                }
                _ => format!("{:.0} answers/s", v.goodput),
            })
    }

    /// Work wasted in `overload`.
    fn wasted(&self, name: &str) -> String {
        self.variant("overload", name)
            .and_then(|(_, v)| v.orphaned_work_s)
            .map_or("-".to_owned(), |s| format!("{s:.0} s"))
    }
}

/// The sentence for variant `name`: what it does, what that buys and what it costs, with the
/// run's numbers.
fn trade(name: &str, n: &Numbers<'_>, adaptive: Adaptive) -> String {
    match name {
        "none" => format!(
            "none (one attempt, no timeout): adds no load and saves nothing: {} success in the \
             brownout; when the dependency is full its queue outgrows everyone's patience and it \
             works for callers that left ({} wasted), {} in time.",
            n.success("brownout", name),
            n.wasted(name),
            n.goodput(name),
        ),
        "naive" => format!(
            "naive (5 attempts, no budget): {} success while the dependency has room for the \
             retries ({} in the brownout, at {} the load); {} the load while it is down, and \
             when it is full the retries only add to the queue: {} in time.",
            if n.most_success("brownout", name) {
                "the most"
            } else {
                "buys"
            },
            n.success("brownout", name),
            n.load("brownout", name),
            n.load("outage", name),
            n.goodput(name),
        ),
        "tower" => format!(
            "tower (3 attempts, a 10% budget, 500 ms per attempt): the budget keeps the load near \
             1× ({} in the brownout for {} success, {} while down), but nothing tells the \
             dependency when the caller gives up and nothing limits what waits in its queue: {} \
             in time when it is full, {} of work wasted.",
            n.load("brownout", name),
            n.success("brownout", name),
            n.load("outage", name),
            n.goodput(name),
            n.wasted(name),
        ),
        "tower-resilience" => format!(
            "tower-resilience ({} adaptive limit, 3 attempts, a 10% budget, 500 ms per attempt, \
             the wait for a permit included): learns a concurrency limit from latency, but its \
             callers queue for a permit until their 500 ms are nearly spent, so what it lets \
             through leaves before the answer while the dependency, told nothing, still works \
             on it: {} in time when it is full, {} of work wasted (--shed: refused at once \
             instead of waiting).",
            adaptive.name(),
            n.goodput(name),
            n.wasted(name),
        ),
        "backstop" => format!(
            "backstop (the presets' defaults: a deadline sent with each call, a 10% budget, a \
             breaker, adaptive throttling, an adaptive concurrency limit): gives up some \
             brownout success to stay within its budget ({} at {} against naive's {}), cuts an \
             outage to probes ({} the load), and when the dependency is full keeps its capacity \
             as goodput: {} in time, {} of work wasted.",
            n.success("brownout", name),
            n.load("brownout", name),
            n.success("brownout", "naive"),
            n.load("outage", name),
            n.goodput(name),
            n.wasted(name),
        ),
        other => format!("{other}."),
    }
}
