//! Scenarios: what goes wrong, when, and how long.

use serde::Serialize;
use std::time::Duration;
use tokio::time::Instant;

/// What goes wrong with the dependency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Healthy → 50 % failures, every response 200 ms slower → healthy.
    Brownout,
    /// Healthy → 100 % failures → healthy: how fast is traffic back, and how hard does it hit?
    Outage,
    /// A → B → C, C fails 100 % for a while: how many attempts reach C per user request?
    Chain,
    /// C's latency jumps to 3 s, above the caller's 1 s deadline: how much work does C keep
    /// doing for callers that already gave up?
    Slow,
    /// The dependency accepts every call and never answers: how soon does the caller stop
    /// waiting on it (the breaker opening on attempt timeouts)?
    Hang,
}

impl Scenario {
    /// The scenario's name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Brownout => "brownout",
            Scenario::Outage => "outage",
            Scenario::Chain => "chain",
            Scenario::Slow => "slow",
            Scenario::Hang => "hang",
        }
    }

    /// The fault during the middle phase.
    pub fn fault(self) -> Fault {
        match self {
            Scenario::Brownout => Fault {
                error_rate: 0.5,
                added_latency: Duration::from_millis(200),
            },
            Scenario::Outage | Scenario::Chain => Fault {
                error_rate: 1.0,
                added_latency: Duration::ZERO,
            },
            Scenario::Slow => Fault {
                error_rate: 0.0,
                added_latency: Duration::from_secs(3),
            },
            // An hour: for the run, never.
            Scenario::Hang => Fault {
                error_rate: 0.0,
                added_latency: Duration::from_secs(3600),
            },
        }
    }

    /// The three phases over `duration`: healthy (first quarter), the fault (half), healthy
    /// again (last quarter).
    pub fn phases(self, duration: Duration) -> Vec<Phase> {
        let quarter = duration / 4;
        let fault_name = match self {
            Scenario::Brownout => "brownout",
            Scenario::Outage | Scenario::Chain => "down",
            Scenario::Slow => "slow",
            Scenario::Hang => "hang",
        };
        vec![
            Phase {
                name: "healthy",
                start: Duration::ZERO,
                end: quarter,
                fault: Fault::NONE,
            },
            Phase {
                name: fault_name,
                start: quarter,
                end: duration - quarter,
                fault: self.fault(),
            },
            Phase {
                name: "recovered",
                start: duration - quarter,
                end: duration,
                fault: Fault::NONE,
            },
        ]
    }
}

/// A fault injected into the dependency's answers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fault {
    /// Share of requests answered 503.
    pub error_rate: f64,
    /// Latency added to every response.
    pub added_latency: Duration,
}

impl Fault {
    /// No fault.
    pub const NONE: Fault = Fault {
        error_rate: 0.0,
        added_latency: Duration::ZERO,
    };
}

/// One phase of a scenario.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    /// Its name in reports.
    pub name: &'static str,
    /// When it starts, from the start of the run.
    pub start: Duration,
    /// When it ends.
    pub end: Duration,
    /// The fault while it lasts.
    pub fault: Fault,
}

/// The phases of one run, anchored at its start.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// When the run started.
    pub start: Instant,
    /// The phases.
    pub phases: Vec<Phase>,
}

impl Schedule {
    /// The index of the phase at `at` (the last one after the end).
    pub fn phase_index(&self, at: Instant) -> usize {
        let t = at.saturating_duration_since(self.start);
        self.phases
            .iter()
            .position(|p| t < p.end)
            .unwrap_or(self.phases.len() - 1)
    }

    /// The fault at `at`.
    pub fn fault_at(&self, at: Instant) -> Fault {
        self.phases[self.phase_index(at)].fault
    }
}
