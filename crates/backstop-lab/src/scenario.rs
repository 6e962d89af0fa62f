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
    /// 5 % of responses take 1 s more (a bimodal tail, like GC pauses): how much of the tail
    /// do users see, and at what extra load? Both `tower` (its `Hedge`) and `backstop` hedge.
    Tail,
    /// The dependency's latency drifts from 50 ms to 800 ms and back; users wait 3 s: does a
    /// timeout follow the latency, or fail every call above a number picked in advance?
    Drift,
    /// One of the dependency's four routes fails every call; the other three stay healthy:
    /// do the healthy routes stay up while the bad one fails fast? (backstop: a breaker per
    /// path.)
    Partial,
    /// Every user request is a POST with a side effect (a charge); during the fault the
    /// network loses 30 % of the answers after the work was done: are they retried, and
    /// does any charge happen twice? (backstop: keys stamped by the client preset, honoured
    /// by `IdempotencyLayer` on the server.)
    Post,
    /// A burst of calls (the first eighth of the run), silence (three quarters: a minute of
    /// an 80 s run), then a burst to a dependency that hangs; users wait 5 s: is the hang cut
    /// by what was measured before the silence, or by the ceiling of a model that forgot it?
    Quiet,
    /// The dependency serves 400 requests/s (4 workers, 10 ms each) through a FIFO queue of
    /// at most 2 000 (latency grows with the queue; a full queue answers 503 at once). Users
    /// send 300/s, then 1 000/s during the fault, and wait 1 s: how many answers come in
    /// time (goodput), and how much work goes to callers that already left?
    Overload,
    /// `overload` across a chain: users → A → B → C, C the dependency of fixed capacity
    /// (as in `overload`), A and B servers that relay through their own client stacks. Does
    /// admission at B and C refuse, on arrival, the requests that cannot be answered in time,
    /// and how much of C's capacity reaches the users?
    #[serde(rename = "overload-chain")]
    #[value(name = "overload-chain")]
    OverloadChain,
    /// `overload` whose dependency loses half its capacity for a while (a replica dies, a
    /// cache goes cold): 4 workers, then 2 (200 requests/s) for the middle third of the fault,
    /// then 4 again. Users send 300/s, then 1 000/s during the fault, and wait 1 s. Does
    /// goodput follow the capacity down and back up, or does the caller keep the queue full
    /// of work for callers that already left? The report's `capacity` is the mean over the
    /// fault (333.333 requests/s).
    #[serde(rename = "capacity-drop")]
    #[value(name = "capacity-drop")]
    CapacityDrop,
    /// A dependency with four routes: three answer in 10 ms, and one, `/route/0`, takes 2 s
    /// and gets 0.5 % of the calls (a `/report` among fast reads); users wait 5 s: is the
    /// rare route bounded by its own latency, or cut at the bound the fast routes set?
    /// (backstop: a breaker per path, and the latency model keyed as the breaker is.)
    Routes,
}

/// A dependency of fixed capacity: `workers` serve one request at a time each, the others
/// wait in one FIFO queue of at most `queue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Requests served at once.
    pub workers: u32,
    /// Requests that may wait; one more is answered 503 at once.
    pub queue: u32,
}

impl Capacity {
    /// Requests per second it serves, each taking `service_time`.
    pub fn per_second(self, service_time: Duration) -> f64 {
        f64::from(self.workers) / service_time.as_secs_f64()
    }
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
            Scenario::Tail => "tail",
            Scenario::Drift => "drift",
            Scenario::Partial => "partial",
            Scenario::Overload => "overload",
            Scenario::OverloadChain => "overload-chain",
            Scenario::CapacityDrop => "capacity-drop",
            Scenario::Quiet => "quiet",
            Scenario::Post => "post",
            Scenario::Routes => "routes",
        }
    }

    /// The method of every user request: POST in `post`, GET otherwise.
    pub fn method(self) -> http::Method {
        match self {
            Scenario::Post => http::Method::POST,
            _ => http::Method::GET,
        }
    }

    /// The dependency's capacity at the start of a run: fixed in `overload` and
    /// `overload-chain`, 4 workers that become 2 for a while in `capacity-drop` (see
    /// [`worker_changes`](Self::worker_changes)), unbounded (a task per request) otherwise.
    pub fn capacity(self) -> Option<Capacity> {
        match self {
            Scenario::Overload | Scenario::OverloadChain | Scenario::CapacityDrop => {
                Some(Capacity {
                    workers: 4,
                    queue: 2_000,
                })
            }
            _ => None,
        }
    }

    /// Whether the dependency has a fixed capacity that the fault's load exceeds (`overload`,
    /// `overload-chain`, `capacity-drop`).
    pub fn overloads(self) -> bool {
        self.capacity().is_some()
    }

    /// When the dependency's workers change during a run of `duration`, and to how many, in
    /// order: in `capacity-drop`, 2 workers from a third of the way into the fault and 4 again
    /// from two thirds (10 s each in a 60 s run); nothing otherwise.
    pub fn worker_changes(self, duration: Duration) -> Vec<(Duration, u32)> {
        match self {
            Scenario::CapacityDrop => {
                let fault = &self.phases(duration)[1];
                let third = (fault.end - fault.start) / 3;
                vec![(fault.start + third, 2), (fault.start + third * 2, 4)]
            }
            _ => Vec::new(),
        }
    }

    /// The dependency's mean capacity over the fault of a run of `duration`, in requests per
    /// second of `service_time` each (what the report calls `capacity`): the fixed capacity
    /// in `overload` and `overload-chain`, the mean over the drop and the rest of the fault
    /// in `capacity-drop`; `None` where the capacity is unbounded.
    pub fn mean_fault_capacity(self, duration: Duration, service_time: Duration) -> Option<f64> {
        let fault = self.phases(duration)[1];
        self.mean_capacity(duration, fault.start, fault.end, service_time)
    }

    /// The dependency's capacity (requests/s of `service_time` each) in each whole second of
    /// a run of `duration`, averaged over the second (the chart's reference line); `None`
    /// where it is unbounded.
    pub fn capacity_per_second(
        self,
        duration: Duration,
        service_time: Duration,
    ) -> Option<Vec<f64>> {
        (0..duration.as_secs())
            .map(|s| {
                let from = Duration::from_secs(s);
                self.mean_capacity(duration, from, from + Duration::from_secs(1), service_time)
            })
            .collect()
    }

    /// The mean capacity from `from` to `to` of a run of `duration`: the workers integrated
    /// over the span, step by step, each serving a request per `service_time`.
    fn mean_capacity(
        self,
        duration: Duration,
        from: Duration,
        to: Duration,
        service_time: Duration,
    ) -> Option<f64> {
        let capacity = self.capacity()?;
        let per_worker = 1.0 / service_time.as_secs_f64();
        if to <= from {
            return Some(f64::from(capacity.workers) * per_worker);
        }
        let mut workers = capacity.workers;
        let mut at = Duration::ZERO;
        let mut worker_seconds = 0.0;
        let mut steps = self.worker_changes(duration);
        steps.push((duration.max(to), workers));
        for (when, next) in steps {
            let (start, end) = (at.max(from), when.min(to));
            if end > start {
                worker_seconds += f64::from(workers) * (end - start).as_secs_f64();
            }
            at = when;
            workers = next;
        }
        Some(worker_seconds / (to - from).as_secs_f64() * per_worker)
    }

    /// The share of the offered rate users send in phase `phase` (0, 1 or 2): 30 % outside
    /// the fault in the scenarios with a fixed capacity (300 of 1 000 requests/s, below the
    /// dependency's capacity), all of it otherwise.
    pub fn offered_share(self, phase: usize) -> f64 {
        match phase {
            0 | 2 if self.overloads() => 0.3,
            _ => 1.0,
        }
    }

    /// Whether user request number `i`, due in phase `phase`, is sent: the first
    /// `offered_share × 10` of every ten (so the load is evenly spread and the same for every
    /// variant).
    pub fn sends(self, i: u64, phase: usize) -> bool {
        ((i % 10) as f64) < self.offered_share(phase) * 10.0
    }

    /// How many routes the users' requests spread over, round-robin (`/route/0` …): 4 in
    /// `partial`, where route 0 is the one that fails; 1 (`/work`) otherwise.
    pub fn routes(self) -> u64 {
        match self {
            Scenario::Partial | Scenario::Routes => 4,
            _ => 1,
        }
    }

    /// The path of user request number `i`. In `routes`, one request in 200 (0.5 %) goes to
    /// the slow `/route/0`, the others to `/route/1` to `/route/3` in turn.
    pub fn path(self, i: u64) -> String {
        if self == Scenario::Routes {
            return match i % 200 {
                0 => "/route/0".to_owned(),
                n => format!("/route/{}", 1 + n % 3),
            };
        }
        match self.routes() {
            1 => "/work".to_owned(),
            n => format!("/route/{}", i % n),
        }
    }

    /// How long a user waits for an answer (backstop: the deadline it propagates): 3 s in
    /// `drift`, 5 s in `quiet` and `routes`, 1 s otherwise.
    pub fn patience(self) -> Duration {
        match self {
            Scenario::Drift => Duration::from_secs(3),
            Scenario::Quiet | Scenario::Routes => Duration::from_secs(5),
            _ => Duration::from_secs(1),
        }
    }

    /// Whether the variants that can hedge do (`tail` only).
    pub fn hedges(self) -> bool {
        self == Scenario::Tail
    }

    /// The dependency's state outside the fault: healthy, except in `drift`, where its
    /// latency is 50 ms (10 ms of service time, 40 ms added), and in `routes`, where
    /// `/route/0` takes 2 s throughout (the run has no fault over time: the rare slow route
    /// is the dependency as it is).
    pub fn baseline(self) -> Fault {
        match self {
            Scenario::Routes => Fault {
                slow_route: Some((0, Duration::from_millis(1_990))),
                ..Fault::NONE
            },
            Scenario::Drift => Fault {
                added_latency: Duration::from_millis(40),
                ..Fault::NONE
            },
            _ => Fault::NONE,
        }
    }

    /// The fault during the middle phase.
    pub fn fault(self) -> Fault {
        match self {
            Scenario::Brownout => Fault {
                error_rate: 0.5,
                added_latency: Duration::from_millis(200),
                ..Fault::NONE
            },
            Scenario::Outage | Scenario::Chain => Fault {
                error_rate: 1.0,
                ..Fault::NONE
            },
            Scenario::Partial => Fault {
                error_rate: 1.0,
                failing_route: Some(0),
                ..Fault::NONE
            },
            Scenario::Slow => Fault {
                added_latency: Duration::from_secs(3),
                ..Fault::NONE
            },
            // An hour: for the run, never.
            Scenario::Hang | Scenario::Quiet => Fault {
                added_latency: Duration::from_secs(3600),
                ..Fault::NONE
            },
            Scenario::Tail => Fault {
                tail_rate: 0.05,
                tail_latency: Duration::from_secs(1),
                ..Fault::NONE
            },
            // 10 ms of service time + 790 ms.
            Scenario::Drift => Fault {
                added_latency: Duration::from_millis(790),
                ..Fault::NONE
            },
            Scenario::Post => Fault {
                lose_rate: 0.3,
                ..Fault::NONE
            },
            // The fault is the load (and, in `capacity-drop`, the workers the backend loses for
            // a while): the answers themselves stay as they were.
            Scenario::Overload | Scenario::OverloadChain | Scenario::CapacityDrop => Fault::NONE,
            Scenario::Routes => self.baseline(),
        }
    }

    /// The three phases over `duration`: healthy (first quarter), the fault (half), healthy
    /// again (last quarter). In `quiet`: healthy (first eighth), silent (three quarters: no
    /// user sends anything), the hang (last eighth).
    pub fn phases(self, duration: Duration) -> Vec<Phase> {
        if self == Scenario::Quiet {
            let eighth = duration / 8;
            return vec![
                Phase {
                    name: "healthy",
                    start: Duration::ZERO,
                    end: eighth,
                    fault: Fault::NONE,
                },
                Phase {
                    name: "quiet",
                    start: eighth,
                    end: duration - eighth,
                    fault: Fault::NONE,
                },
                Phase {
                    name: "hang",
                    start: duration - eighth,
                    end: duration,
                    fault: self.fault(),
                },
            ];
        }
        let quarter = duration / 4;
        let fault_name = match self {
            Scenario::Brownout => "brownout",
            Scenario::Outage | Scenario::Chain => "down",
            Scenario::Slow => "slow",
            Scenario::Hang => "hang",
            Scenario::Tail => "tail",
            Scenario::Drift => "drift",
            Scenario::Partial => "route down",
            Scenario::Post => "answers lost",
            Scenario::Quiet => unreachable!("quiet has phases of its own"),
            Scenario::Overload | Scenario::OverloadChain | Scenario::CapacityDrop => "overload",
            Scenario::Routes => "rare slow route",
        };
        vec![
            Phase {
                name: "healthy",
                start: Duration::ZERO,
                end: quarter,
                fault: self.baseline(),
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
                fault: self.baseline(),
            },
        ]
    }
}

impl Scenario {
    /// What the handler of hop `hop` (`A` or `B`) of a chain spends on its own before it
    /// calls the next hop, least and most: in `overload-chain`, 10 to 200 ms for A and 100 to
    /// 700 ms for B (work of their own, so a request reaches each hop with uneven time left),
    /// nothing otherwise.
    pub fn hop_work(self, hop: &str) -> (Duration, Duration) {
        match (self, hop) {
            (Scenario::OverloadChain, "A") => {
                (Duration::from_millis(10), Duration::from_millis(200))
            }
            (Scenario::OverloadChain, "B") => {
                (Duration::from_millis(100), Duration::from_millis(700))
            }
            _ => (Duration::ZERO, Duration::ZERO),
        }
    }

    /// How long user request `i` waits, and whether it says so in `grpc-timeout`: in
    /// `overload-chain`, each user waits between a quarter of `patience` and all of it
    /// (uniformly, seeded with `seed`) and sends that deadline, as a gRPC caller with a
    /// deadline of its own does; everywhere else, `patience`, untold.
    pub fn user_patience(self, patience: Duration, i: u64, seed: u64) -> (Duration, bool) {
        match self {
            Scenario::OverloadChain => {
                let draw =
                    fastrand::Rng::with_seed(seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).f64();
                (patience.mul_f64(0.25 + 0.75 * draw), true)
            }
            _ => (patience, false),
        }
    }

    /// Whether users call A, which calls B, which calls the dependency C (`chain`,
    /// `overload-chain`), rather than the dependency directly.
    pub fn chained(self) -> bool {
        matches!(self, Scenario::Chain | Scenario::OverloadChain)
    }

    /// The user requests offered in each whole second of a run at `rps` for `duration`: the
    /// engine's schedule, counted (the chart's reference line).
    pub fn offered_per_second(self, rps: u32, duration: Duration) -> Vec<f64> {
        let phases = self.phases(duration);
        let mut offered = vec![0f64; duration.as_secs() as usize];
        let interval = Duration::from_secs(1) / rps.max(1);
        for i in 0..u64::from(rps) * duration.as_secs() {
            let due = interval * i as u32;
            let phase = phases
                .iter()
                .position(|p| due < p.end)
                .unwrap_or(phases.len() - 1);
            if self.silent(due, duration) || !self.sends(i, phase) {
                continue;
            }
            if let Some(slot) = offered.get_mut(due.as_secs() as usize) {
                *slot += 1.0;
            }
        }
        offered
    }

    /// Whether users send nothing at `t` from the start of a run of `duration` (the silent
    /// phase of `quiet`).
    pub fn silent(self, t: Duration, duration: Duration) -> bool {
        self == Scenario::Quiet && t >= duration / 8 && t < duration - duration / 8
    }
}

/// A fault injected into the dependency's answers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fault {
    /// Share of requests answered 503.
    pub error_rate: f64,
    /// Latency added to every response.
    pub added_latency: Duration,
    /// Share of responses that take `tail_latency` more.
    pub tail_rate: f64,
    /// The extra latency of the tail.
    pub tail_latency: Duration,
    /// The route the fault applies to (`/route/N`); `None`: every request.
    pub failing_route: Option<u64>,
    /// Share of answers the network loses after the dependency did the work (the caller
    /// sees a reset stream).
    pub lose_rate: f64,
    /// A route (`/route/N`) whose every response takes this much more (`routes`).
    pub slow_route: Option<(u64, Duration)>,
}

impl Fault {
    /// No fault.
    pub const NONE: Fault = Fault {
        error_rate: 0.0,
        added_latency: Duration::ZERO,
        tail_rate: 0.0,
        tail_latency: Duration::ZERO,
        failing_route: None,
        lose_rate: 0.0,
        slow_route: None,
    };

    /// Whether the fault applies to a request for `path`.
    pub fn applies_to(&self, path: &str) -> bool {
        match self.failing_route {
            None => true,
            Some(route) => route_of(path) == Some(route),
        }
    }
}

/// The route number of a `/route/N` path.
pub fn route_of(path: &str) -> Option<u64> {
    path.strip_prefix("/route/")?.parse().ok()
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
