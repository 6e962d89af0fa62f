//! The breaker's public vocabulary: its states, modes, and the transitions between them with
//! their reasons. The machine that moves between them is in `state.rs`.

use std::time::Duration;

/// Where a breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Calls flow; outcomes are counted in the window.
    Closed,
    /// Calls are refused at once with [`BreakerOpen`](crate::BreakerOpen) until the
    /// open time ends.
    Open,
    /// A fixed number of probe calls is let through; they decide between closed and open.
    HalfOpen,
}

/// How a breaker acts on its state (set at build time or at run time with
/// [`BreakerLayer::set_mode`](crate::client::breaker::BreakerLayer::set_mode)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Mode {
    /// The state machine decides (the default).
    #[default]
    Normal,
    /// Every call is refused, whatever the state.
    ForcedOpen,
    /// Every call passes and nothing is recorded.
    Disabled,
    /// Outcomes are recorded and the state moves as in `Normal`, but no call is ever refused:
    /// watch what the breaker would do before letting it act.
    MetricsOnly,
}

/// Why a breaker changed state.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Reason {
    /// The failure rate over the window reached `failure_rate`.
    FailureRate {
        /// The failure rate, in [0, 1].
        rate: f64,
        /// The calls in the window.
        calls: u64,
    },
    /// The slow-call rate over the window reached `slow_rate`.
    SlowCallRate {
        /// The slow-call rate, in [0, 1].
        rate: f64,
        /// The calls in the window.
        calls: u64,
    },
    /// `consecutive_failures` failures in a row.
    ConsecutiveFailures(u32),
    /// The open time ended: the first probe was admitted.
    OpenElapsed,
    /// Every probe succeeded.
    ProbesSucceeded,
    /// A probe failed (or was slow).
    ProbeFailed,
    /// [`BreakerLayer::reset`](crate::client::breaker::BreakerLayer::reset) was called.
    Reset,
}

/// A change of state, as given to the `on_state_change` hook and logged with `tracing`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Transition {
    /// The state left.
    pub from: State,
    /// The state entered.
    pub to: State,
    /// Why.
    pub reason: Reason,
    /// The generation entered (every transition starts a new one).
    pub generation: u32,
    /// For a transition to [`State::Open`]: how long it stays open.
    pub open_for: Option<Duration>,
}
