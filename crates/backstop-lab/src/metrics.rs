//! What a run records, and the report computed from it.

use crate::{
    report::{PhaseReport, VariantReport},
    scenario::Phase,
};
use std::{sync::Mutex, time::Duration};
use tokio::time::Instant;

/// A run's numbers per second, by the second a user request was sent (attempts: by the
/// second they reached the dependency).
#[derive(Debug, Clone, Default)]
pub struct PerSecond {
    /// Attempts reaching the dependency.
    pub attempts: Vec<f64>,
    /// p99 latency of the user requests (ms), failures included.
    pub p99_ms: Vec<f64>,
    /// User requests answered with a 2xx in time.
    pub goodput: Vec<f64>,
    /// User requests sent.
    pub sent: Vec<f64>,
}

/// Everything one variant's run records.
#[derive(Debug)]
pub struct Recorder {
    start: Instant,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Arrival of each attempt at the dependency, in microseconds since the start.
    attempts_us: Vec<u64>,
    /// Each user request: arrival (µs), latency (µs), success.
    users: Vec<(u64, u64, bool)>,
    /// In `partial`: the route of each attempt and each user request (same order as above).
    attempt_routes: Vec<Option<u64>>,
    user_routes: Vec<Option<u64>>,
    orphaned: Duration,
    work_in_flight: u64,
    /// In `post`: side effects done per user request (by its number).
    effects: std::collections::HashMap<u64, u32>,
}

impl Recorder {
    /// A recorder for a run starting at `start`.
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            inner: Mutex::default(),
        }
    }

    /// When the run started.
    pub fn start(&self) -> Instant {
        self.start
    }

    fn since(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_micros() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("recorder")
    }

    /// The dependency did the side effect of user request `user` (`post`).
    pub fn effect(&self, user: u64) {
        *self.lock().effects.entry(user).or_default() += 1;
    }

    /// An attempt reached the dependency (for `/route/N`: `route`).
    pub fn attempt(&self, at: Instant, route: Option<u64>) {
        let t = self.since(at);
        let mut inner = self.lock();
        inner.attempts_us.push(t);
        inner.attempt_routes.push(route);
    }

    /// A user request (for `/route/N`: `route`) that arrived at `at` ended after `latency`.
    pub fn user(&self, at: Instant, latency: Duration, success: bool, route: Option<u64>) {
        let t = self.since(at);
        let mut inner = self.lock();
        inner.users.push((t, latency.as_micros() as u64, success));
        inner.user_routes.push(route);
    }

    /// The dependency started a piece of work.
    pub fn work_started(&self) {
        self.lock().work_in_flight += 1;
    }

    /// The dependency finished a piece of work.
    pub fn work_ended(&self) {
        self.lock().work_in_flight -= 1;
    }

    /// Work done after its caller gave up.
    pub fn orphaned(&self, work: Duration) {
        self.lock().orphaned += work;
    }

    /// Work the dependency is still doing.
    pub fn work_in_flight(&self) -> u64 {
        self.lock().work_in_flight
    }

    /// Per-second series for charts, over `seconds` whole seconds: downstream attempts, and,
    /// of the user requests sent in each second, how many, their p99 latency (ms, failures
    /// included), and the ones answered with a 2xx in time (goodput).
    pub fn series(&self, seconds: usize) -> PerSecond {
        let inner = self.lock();
        let mut attempts = vec![0f64; seconds];
        for &t in &inner.attempts_us {
            if let Some(slot) = attempts.get_mut((t / 1_000_000) as usize) {
                *slot += 1.0;
            }
        }
        let mut per_second: Vec<Vec<u64>> = vec![Vec::new(); seconds];
        let mut goodput = vec![0f64; seconds];
        for &(t, latency, success) in &inner.users {
            let second = (t / 1_000_000) as usize;
            if let Some(slot) = per_second.get_mut(second) {
                slot.push(latency);
            }
            if let (Some(slot), true) = (goodput.get_mut(second), success) {
                *slot += 1.0;
            }
        }
        let sent = per_second.iter().map(|s| s.len() as f64).collect();
        let p99_ms = per_second
            .into_iter()
            .map(|mut l| quantile(&mut l, 0.99) as f64 / 1000.0)
            .collect();
        PerSecond {
            attempts,
            p99_ms,
            goodput,
            sent,
        }
    }

    /// The report of this run.
    pub fn report(
        &self,
        name: &str,
        phases: &[Phase],
        breaker: Option<(u64, Option<f64>)>,
    ) -> VariantReport {
        let (healthy_success_rate, failing_route_load) = self.routes(&phases[1]);
        let slow_route_success_rate = self.slow_route(&phases[1]);
        let inner = self.lock();
        let us = |d: Duration| d.as_micros() as u64;
        let offered = inner.users.len() as u64;
        let attempts = inner.attempts_us.len() as u64;
        let successes = inner.users.iter().filter(|u| u.2).count() as u64;
        let mut latencies: Vec<u64> = inner.users.iter().map(|u| u.1).collect();
        let ms = |v: u64| round3(v as f64 / 1000.0);

        let phase_reports = phases
            .iter()
            .map(|p| {
                let within = |t: u64| t >= us(p.start) && t < us(p.end);
                let users: Vec<_> = inner.users.iter().filter(|u| within(u.0)).collect();
                let offered = users.len() as u64;
                let attempts = inner.attempts_us.iter().filter(|&&t| within(t)).count() as u64;
                PhaseReport {
                    name: p.name.to_owned(),
                    offered,
                    downstream_attempts: attempts,
                    amplification: ratio(attempts, offered),
                    success_rate: ratio(users.iter().filter(|u| u.2).count() as u64, offered),
                }
            })
            .collect();

        // Recovery: from the end of the fault, the first second whose user requests succeed
        // at 99 % or more; and the busiest second the dependency sees from then on.
        let recovery_start = us(phases.last().expect("phases").start);
        let end = us(phases.last().expect("phases").end);
        let mut recovery_s = None;
        let mut peak = 0u64;
        let mut second = recovery_start;
        while second + 1_000_000 <= end {
            let within = |t: u64| t >= second && t < second + 1_000_000;
            let users: Vec<_> = inner.users.iter().filter(|u| within(u.0)).collect();
            let ok = users.iter().filter(|u| u.2).count();
            if recovery_s.is_none() && !users.is_empty() && ok * 100 >= users.len() * 99 {
                recovery_s = Some(round3((second - recovery_start) as f64 / 1e6));
            }
            peak = peak.max(inner.attempts_us.iter().filter(|&&t| within(t)).count() as u64);
            second += 1_000_000;
        }

        // The busiest second of the fault, relative to the load offered in it: what a budget
        // banked before the fault lets through at its onset.
        let fault = &phases[1];
        let mut second = us(fault.start);
        let mut fault_peak = 0.0f64;
        while second + 1_000_000 <= us(fault.end) {
            let within = |t: u64| t >= second && t < second + 1_000_000;
            let offered = inner.users.iter().filter(|u| within(u.0)).count() as u64;
            let sent = inner.attempts_us.iter().filter(|&&t| within(t)).count() as u64;
            fault_peak = fault_peak.max(ratio(sent, offered));
            second += 1_000_000;
        }

        // Goodput: the fault phase's answers in time, per second of it.
        let good = inner
            .users
            .iter()
            .filter(|u| u.2 && u.0 >= us(fault.start) && u.0 < us(fault.end))
            .count();
        let goodput = round3(good as f64 / (fault.end - fault.start).as_secs_f64());

        VariantReport {
            name: name.to_owned(),
            offered,
            downstream_attempts: attempts,
            amplification: ratio(attempts, offered),
            peak_fault_amplification: round3(fault_peak),
            success_rate: ratio(successes, offered),
            goodput,
            goodput_per_s: None,
            p50_ms: ms(quantile(&mut latencies, 0.5)),
            p99_ms: ms(quantile(&mut latencies, 0.99)),
            p999_ms: ms(quantile(&mut latencies, 0.999)),
            max_ms: ms(latencies.iter().copied().max().unwrap_or(0)),
            peak_downstream_rps: peak as f64,
            recovery_s,
            orphaned_work_s: Some(round3(inner.orphaned.as_secs_f64())),
            duplicate_effects: (!inner.effects.is_empty()).then(|| {
                let extra = inner
                    .effects
                    .values()
                    .map(|&n| u64::from(n.saturating_sub(1)));
                extra.sum()
            }),
            breaker_opens: breaker.map(|(opens, _)| opens),
            first_open_s: breaker.and_then(|(_, first)| first.map(round3)),
            measured_latency: None,
            hops: None,
            healthy_success_rate,
            failing_route_load,
            slow_route_success_rate,
            phases: phase_reports,
        }
    }

    /// With a slow route (`routes`): the success of the user requests to it over the whole
    /// run. `None` in the other scenarios.
    fn slow_route(&self, fault: &Phase) -> Option<f64> {
        let (slow, _) = fault.fault.slow_route?;
        let inner = self.lock();
        let to_it: Vec<bool> = inner
            .users
            .iter()
            .zip(&inner.user_routes)
            .filter(|(_, route)| **route == Some(slow))
            .map(|(u, _)| u.2)
            .collect();
        let ok = to_it.iter().filter(|s| **s).count() as u64;
        Some(ratio(ok, to_it.len() as u64))
    }

    /// With a failing route (`partial`): the success of the user requests to the other
    /// routes over the whole run, and the attempts the failing route received during the
    /// fault per user request to it. `None` in the other scenarios.
    fn routes(&self, fault: &Phase) -> (Option<f64>, Option<f64>) {
        let Some(failing) = fault.fault.failing_route else {
            return (None, None);
        };
        let inner = self.lock();
        let us = |d: Duration| d.as_micros() as u64;
        let during = |t: u64| t >= us(fault.start) && t < us(fault.end);
        let users = inner.users.iter().zip(&inner.user_routes);
        let healthy: Vec<bool> = users
            .clone()
            .filter(|(_, route)| **route != Some(failing))
            .map(|(u, _)| u.2)
            .collect();
        let ok = healthy.iter().filter(|s| **s).count() as u64;
        let asked = users
            .filter(|(u, route)| **route == Some(failing) && during(u.0))
            .count() as u64;
        let sent = inner
            .attempts_us
            .iter()
            .zip(&inner.attempt_routes)
            .filter(|(t, route)| **route == Some(failing) && during(**t))
            .count() as u64;
        (
            Some(ratio(ok, healthy.len() as u64)),
            Some(ratio(sent, asked)),
        )
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        round3(a as f64 / b as f64)
    }
}

/// Rounds to 3 decimals, so reports read well and compare byte for byte.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The `q` quantile (nearest rank) of `values`, 0 when empty.
fn quantile(values: &mut [u64], q: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}
