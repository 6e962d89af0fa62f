//! What every clone of a breaker layer and its services share: the state machine, the
//! classifier, the clock, the event and metric emission, and the [`Snapshot`] read from them.
//!
//! **Concurrency rule.** Everything here is read and written through the machine's atomics
//! (see `state.rs`); the one lock-free-once field is the metric handles, registered by the
//! first call to need them (`OnceLock`). Events are emitted by the thread whose
//! compare-and-swap made the transition, so each transition is reported exactly once.

use crate::RouteKey;
use crate::client::breaker::config::{Checked, Hook};
use crate::client::breaker::state::{Admission, Machine, Tally};
use crate::client::breaker::{Mode, State, Transition};
use crate::rt::stripe;
use crate::rt::table::Table;
use std::{fmt, sync::Arc, time::Duration};
use tokio::time::Instant;

/// One handle per stripe to the breaker, shared by every service of the layer (see
/// [`backstop::rt::stripe::Handles`](crate::rt::stripe::Handles)).
pub(crate) type Handles<C> = stripe::Handles<Shared<C>>;
/// What a call holds on to until its outcome is known.
pub(crate) type Handle<C> = stripe::Handle<Shared<C>>;

/// What every clone of a layer and its services share.
pub(crate) struct Shared<C> {
    pub(crate) machine: Machine,
    pub(crate) classifier: C,
    start: Instant,
    pub(crate) slow: Option<Duration>,
    hook: Option<Hook>,
    /// Transitions to open since the breaker was built.
    opens: std::sync::atomic::AtomicU64,
    pub(crate) name: crate::rt::DependencyName,
    /// The key, for a breaker of a keyed layer: its events and metrics carry it.
    /// The key of a keyed layer's breaker, with the label its metric series carry it under.
    key: std::sync::OnceLock<(&'static str, Box<str>)>,
    /// A keyed layer's breakers per key; this breaker then takes the calls with no key
    /// (and keys past the bound). Read by every call: one load of a word already in cache.
    pub(crate) keyed: Option<Arc<Keyed<C>>>,
    #[cfg(feature = "metrics")]
    metrics: std::sync::OnceLock<BreakerMetrics>,
}

/// The breaker's metric handles (feature `metrics`; names in `backstop::metrics`),
/// registered on first use.
#[cfg(feature = "metrics")]
#[derive(Debug)]
struct BreakerMetrics {
    state: metrics::Gauge,
    /// By the state entered: closed, open, half-open.
    transitions: [metrics::Counter; 3],
    rejections: metrics::Counter,
    /// Taken to set the state gauge (at a transition: rare), so the last to set it read the
    /// newest state.
    state_order: std::sync::Mutex<()>,
}

/// The gauge's value of a state: 0 closed, 1 open, 2 half-open.
#[cfg(feature = "metrics")]
fn state_code(state: State) -> f64 {
    match state {
        State::Closed => 0.0,
        State::Open => 1.0,
        State::HalfOpen => 2.0,
    }
}

#[cfg(feature = "metrics")]
impl BreakerMetrics {
    /// The handles of a breaker, with its key's label (`route` or `authority`) for a
    /// breaker of a keyed layer.
    fn new(dependency: &str, key: Option<(&'static str, &str)>) -> Self {
        use crate::metrics as names;
        use metrics::Label;
        crate::rt::metrics::describe();
        let labels = |extra: Option<(&'static str, &'static str)>| {
            let mut labels = vec![Label::new("dependency", dependency.to_owned())];
            if let Some((label, key)) = key {
                labels.push(Label::new(label, key.to_owned()));
            }
            if let Some((k, v)) = extra {
                labels.push(Label::new(k, v));
            }
            labels
        };
        Self {
            state: metrics::gauge!(names::BREAKER_STATE, labels(None)),
            transitions: ["closed", "open", "half_open"]
                .map(|to| metrics::counter!(names::BREAKER_TRANSITIONS, labels(Some(("to", to))))),
            rejections: metrics::counter!(names::BREAKER_REJECTIONS, labels(None)),
            state_order: std::sync::Mutex::new(()),
        }
    }
}

impl<C> fmt::Debug for Shared<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("machine", &self.machine)
            .field("slow", &self.slow)
            .finish_non_exhaustive()
    }
}

impl<C> Shared<C> {
    /// A breaker for a checked configuration (which cannot fail), with the table of a keyed
    /// layer's breakers when it is one.
    pub(crate) fn from_checked(checked: Checked<C>, keyed: Option<Arc<Keyed<C>>>) -> Arc<Self> {
        let Checked {
            config,
            settings,
            window,
        } = checked;
        Arc::new(Self {
            machine: Machine::new(settings, window.build(), config.mode),
            slow: config.slow_duration(),
            classifier: config.classifier,
            start: Instant::now(),
            hook: config.hook,
            opens: std::sync::atomic::AtomicU64::new(0),
            name: config.name,
            key: std::sync::OnceLock::new(),
            keyed,
            #[cfg(feature = "metrics")]
            metrics: std::sync::OnceLock::new(),
        })
    }

    /// Microseconds since the breaker was built: the machine's clock.
    pub(crate) fn now_us(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.start);
        // No u128 arithmetic on the hot path: seconds fit u64 microseconds for 584 000 years.
        elapsed
            .as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(elapsed.subsec_micros()))
    }

    #[cfg(feature = "metrics")]
    fn metrics(&self) -> &BreakerMetrics {
        self.metrics.get_or_init(|| {
            let key = self.key.get().map(|(label, key)| (*label, &**key));
            let metrics = BreakerMetrics::new(self.name.get(), key);
            metrics.state.set(state_code(self.machine.load().state));
            metrics
        })
    }

    /// Closes the breaker and forgets its window, whatever its state, and reports it.
    pub(crate) fn reset(&self) {
        let transition = self.machine.reset(|| self.now_us());
        self.emit(transition);
    }

    /// While open: the microseconds of open time left (zero once it is over, though no call
    /// has moved the breaker to half-open yet; one, as not over, while the thread that opened
    /// it has not stored its open time yet). `None` when not open.
    pub(crate) fn open_left_us(&self) -> Option<u64> {
        let word = self.machine.load();
        (word.state == State::Open).then(|| match self.machine.open_until(word) {
            Some(until) => until.saturating_sub(self.now_us()),
            None => 1,
        })
    }

    /// Makes this the breaker of `key` in a keyed layer.
    pub(crate) fn keyed_as(&self, label: &'static str, key: &str) {
        // A new breaker: not set yet.
        let _ = self.key.set((label, key.into()));
    }

    /// The key of a keyed layer's breaker (`""` otherwise).
    fn key(&self) -> &str {
        self.key.get().map_or("", |(_, k)| k)
    }

    /// Asks to let a call in: the admission, or how long until calls pass again (`None`: no
    /// time can be promised).
    pub(crate) fn admit(&self) -> Result<Admission, Option<Duration>> {
        let admit = self.machine.admit(|| self.now_us());
        self.emit(admit.transition);
        // Registered on the first call, so the state gauge reads 0 from then on.
        #[cfg(feature = "metrics")]
        let metrics = self.metrics();
        #[cfg(feature = "metrics")]
        if admit.admission.is_err() {
            metrics.rejections.increment(1);
        }
        admit.admission.map_err(|us| us.map(Duration::from_micros))
    }

    /// Records how an admitted call ended, into window `stripe`.
    pub(crate) fn complete(&self, admission: Admission, tally: Tally, stripe: usize) {
        let transition = self
            .machine
            .complete(admission, tally, stripe, || self.now_us());
        self.emit(transition);
    }

    /// Reports a transition: a `tracing` event, then the hook.
    pub(crate) fn emit(&self, transition: Option<Transition>) {
        let Some(t) = transition else {
            return;
        };
        if t.to == State::Open {
            self.opens
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        {
            let metrics = self.metrics();
            metrics.transitions[state_code(t.to) as usize].increment(1);
            // The state now, not the one this transition entered: transitions are ordered by
            // the word's compare-and-swap, their reports are not (a probe that closes the
            // breaker on another thread may report before the call that moved it to
            // half-open does, which would leave the gauge at half-open). Read under the lock,
            // the last value set is the newest state.
            let _order = metrics
                .state_order
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            metrics.state.set(state_code(self.machine.load().state));
        }
        match t.to {
            State::Open => tracing::warn!(
                dependency = self.name.get(),
                key = self.key(),
                from = ?t.from,
                reason = ?t.reason,
                generation = t.generation,
                open_for = ?t.open_for,
                "circuit breaker opened"
            ),
            State::HalfOpen => tracing::info!(
                dependency = self.name.get(),
                key = self.key(),
                reason = ?t.reason,
                generation = t.generation,
                "circuit breaker half-open: probing"
            ),
            State::Closed => tracing::info!(
                dependency = self.name.get(),
                key = self.key(),
                from = ?t.from,
                reason = ?t.reason,
                generation = t.generation,
                "circuit breaker closed"
            ),
        }
        if let Some(hook) = &self.hook {
            hook(&t);
        }
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let now = self.now_us();
        let word = self.machine.load();
        let counts = self.machine.window.counts(now);
        let rate = |n: u64| (counts.calls > 0).then(|| n as f64 / counts.calls as f64);
        Snapshot {
            state: word.state,
            mode: word.mode,
            generation: word.generation,
            calls: counts.calls,
            failures: counts.failures,
            slow_calls: counts.slow,
            failure_rate: rate(counts.failures),
            slow_call_rate: rate(counts.slow),
            open_for: self
                .machine
                .open_until(word)
                .map(|us| Duration::from_micros(us.saturating_sub(now))),
            probes_in_flight: match word.state {
                State::HalfOpen => word.taken - word.succeeded,
                _ => 0,
            },
            reopens: self.machine.reopens(),
            opens: self.opens.load(std::sync::atomic::Ordering::Relaxed),
            shared_bytes: std::mem::size_of::<Self>() + self.machine.window.heap_bytes(),
        }
    }
}

/// A breaker's state and window at one instant (see [`BreakerLayer::snapshot`](crate::client::breaker::BreakerLayer::snapshot)).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Snapshot {
    /// The state.
    pub state: State,
    /// The mode.
    pub mode: Mode,
    /// The generation: bumped by every transition.
    pub generation: u32,
    /// Calls in the window (successes and failures; ignored calls and rejections are not
    /// counted). While open or half-open nothing new is recorded (the window still shows
    /// what opened the breaker, until it ages out); it restarts empty when the breaker closes.
    pub calls: u64,
    /// Failures in the window.
    pub failures: u64,
    /// Slow calls in the window.
    pub slow_calls: u64,
    /// `failures / calls`, `None` with no calls.
    pub failure_rate: Option<f64>,
    /// `slow_calls / calls`, `None` with no calls.
    pub slow_call_rate: Option<f64>,
    /// While open: how long until the first probe is let through (a duration, so it can be
    /// exported as is; `Duration::ZERO` once it is due).
    pub open_for: Option<Duration>,
    /// While half-open: probes admitted whose outcome is not known yet.
    pub probes_in_flight: u16,
    /// Consecutive re-opens (failed probes) since the breaker last closed.
    pub reopens: u32,
    /// Times the breaker opened since it was built (a counter, for export).
    pub opens: u64,
    /// Bytes of state shared by every clone of the breaker (fixed at build time: it does not
    /// grow with traffic).
    pub shared_bytes: usize,
}

/// One key's breaker (its entry in the per-route table).
pub(crate) struct Entry<C> {
    pub(crate) shared: Arc<Shared<C>>,
    pub(crate) handles: Handles<C>,
}

/// The breakers of a keyed layer, in the per-route table ([`crate::rt::table`]).
pub(crate) struct Keyed<C> {
    pub(crate) key: RouteKey,
    /// What each new key's breaker is built from (the layer's config, unkeyed, checked).
    pub(crate) template: Checked<C>,
    /// The table, its run-time state what the layer's run-time setters changed, that a key
    /// added later must start with.
    pub(crate) table: Table<Entry<C>, RunTime>,
    pub(crate) start: Instant,
}

/// What the layer's run-time setter ([`set_mode`](crate::client::breaker::BreakerLayer::set_mode)) changed
/// since it was built: the breaker of a key added later starts with it, not with the
/// config's.
#[derive(Debug)]
pub(crate) struct RunTime {
    /// The mode every key's breaker is in.
    pub(crate) mode: Mode,
}

impl<C> fmt::Debug for Keyed<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyed")
            .field("key", &self.key)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl<C> Keyed<C> {
    pub(crate) fn new(
        key: RouteKey,
        template: Checked<C>,
        max_keys: usize,
        idle: Duration,
    ) -> Self {
        Self {
            key,
            table: Table::new(
                max_keys,
                idle,
                RunTime {
                    mode: template.config.mode,
                },
            ),
            template,
            start: Instant::now(),
        }
    }
}
