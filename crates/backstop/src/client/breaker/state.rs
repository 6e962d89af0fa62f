//! The state machine, in atomics: admission, outcomes and transitions without a lock.
//!
//! Everything a call needs to be admitted lives in one 64-bit word (its packing is in
//! `word.rs`: mode, state, generation, probes taken and succeeded).
//!
//! Admission while closed is one load of that word. Every transition is a compare-and-swap on
//! it that bumps the generation, so exactly one thread wins each transition, and an outcome is
//! only counted when the generation it was admitted in is still the current one: a call
//! admitted while closed that finishes during half-open decides nothing.
//!
//! A second word, the timer (`generation tag:16 | microseconds:48`), holds when the current
//! generation's open time ends (open) or its slow start ends (closed). The winner of a
//! transition writes it just after its compare-and-swap; until then readers see another
//! generation's tag and act conservatively (still open; slow start from its beginning).
//!
//! Time is passed in as microseconds since the breaker started, so the machine is a plain
//! value that tests and loom models drive directly.

use crate::client::breaker::sync::{AtomicU32, AtomicU64, Ordering};
use crate::client::breaker::transition::{Mode, Reason, State, Transition};
use crate::client::breaker::window::{Counts, Window};
use crate::client::breaker::word::{Word, timer_instant, timer_word};
use std::time::Duration;

/// The numbers the machine runs on, validated by the builder.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Failure rate that opens, in parts per million (1..=1 000 000).
    pub(crate) failure_ppm: u64,
    /// Slow-call rate that opens, in parts per million; `None`: slow calls never open.
    pub(crate) slow_ppm: Option<u64>,
    pub(crate) minimum_calls: u64,
    pub(crate) consecutive_failures: Option<u32>,
    pub(crate) probes: u16,
    pub(crate) open_base_us: u64,
    pub(crate) open_max_us: u64,
    pub(crate) open_multiplier: f64,
    pub(crate) jitter: bool,
    pub(crate) seed: u64,
    pub(crate) slow_start_us: Option<u64>,
}

/// How a call was let in, carried by its permit to its completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// While closed, in this generation: its outcome goes to the window.
    Closed(u32),
    /// A half-open probe of this generation.
    Probe(u32),
    /// Let through without being counted (disabled, or refused in metrics-only mode).
    Passive,
}

/// What a finished call counts as, for the dependency's window (the retry layer's `Verdict` is
/// another thing: what to do next).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tally {
    /// A success or a failure, and whether it was slow.
    Counted { failure: bool, slow: bool },
    /// Nothing: ignored, our own rejection, or cancelled. A probe's slot is given back.
    Nothing,
}

/// The seed mixed with a generation: the jitter of each open time is a pure function of the
/// two, so a seeded breaker is reproducible and needs no random-number state shared between
/// threads.
fn mix(seed: u64, generation: u32) -> u64 {
    crate::rt::mix::splitmix(seed, u64::from(generation))
}

/// The result of asking to be let in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Admit {
    /// The admission, or how long until a call may pass (microseconds; zero when unknown).
    /// Admitted, or refused with the microseconds until calls pass again (`None`: no time
    /// can be promised — probes in flight, slow start, forced open).
    pub(crate) admission: Result<Admission, Option<u64>>,
    /// The transition this admission made (open → half-open), if any.
    pub(crate) transition: Option<Transition>,
}

impl Admit {
    fn decided(admission: Result<Admission, Option<u64>>) -> Self {
        Self {
            admission,
            transition: None,
        }
    }
}

/// What one state's admission step came to.
enum Step {
    /// Admitted or refused (before metrics-only mode lets refused calls through).
    Decided(Result<Admission, Option<u64>>),
    /// The open time ended and this call moved the breaker to half-open: its first probe.
    Probing(Admit),
    /// Another thread changed the word first: decide again from this one.
    Raced(Word),
}

/// The breaker's shared state.
#[derive(Debug)]
pub(crate) struct Machine {
    word: AtomicU64,
    timer: AtomicU64,
    reopens: AtomicU32,
    consecutive: AtomicU32,
    slow_start_calls: AtomicU64,
    pub(crate) window: Window,
    pub(crate) settings: Settings,
}

impl Machine {
    pub(crate) fn new(settings: Settings, window: Window, mode: Mode) -> Self {
        let word = Word {
            mode,
            state: State::Closed,
            generation: 0,
            taken: 0,
            succeeded: 0,
        };
        Self {
            word: AtomicU64::new(word.encode()),
            // Generation 0, slow start over at time 0: a new breaker is not in slow start.
            timer: AtomicU64::new(timer_word(0, 0)),
            reopens: AtomicU32::new(0),
            consecutive: AtomicU32::new(0),
            slow_start_calls: AtomicU64::new(0),
            window,
            settings,
        }
    }

    pub(crate) fn load(&self) -> Word {
        Word::decode(self.word.load(Ordering::Acquire))
    }

    fn swap(&self, current: Word, new: Word) -> Result<(), Word> {
        self.word
            .compare_exchange(
                current.encode(),
                new.encode(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(drop)
            .map_err(Word::decode)
    }

    /// The timer's instant if it belongs to `generation`.
    fn timer_for(&self, generation: u32) -> Option<u64> {
        timer_instant(self.timer.load(Ordering::Acquire), generation)
    }

    /// Asks to let a call in. `now` is read only when the answer depends on time.
    ///
    /// One step per state, each returning what it decided, or that another thread moved the
    /// word first (then the step of the state it moved to is taken).
    pub(crate) fn admit(&self, now: impl Fn() -> u64) -> Admit {
        let raw = self.word.load(Ordering::Acquire);
        // Most calls: closed, no slow start, the machine deciding: admitted, read off the raw
        // word.
        if self.settings.slow_start_us.is_none()
            && Word::machine_decides(raw)
            && let Some(generation) = Word::closed_generation(raw)
        {
            return Admit::decided(Ok(Admission::Closed(generation)));
        }
        let mut word = Word::decode(raw);
        loop {
            let step = match (word.mode, word.state) {
                (Mode::Disabled, _) => Step::Decided(Ok(Admission::Passive)),
                (Mode::ForcedOpen, _) => Step::Decided(Err(None)),
                (_, State::Closed) => self.admit_closed(word, &now),
                (_, State::Open) => self.admit_open(word, &now),
                (_, State::HalfOpen) => self.admit_half_open(word),
            };
            match step {
                Step::Decided(Err(_)) if word.mode == Mode::MetricsOnly => {
                    return Admit::decided(Ok(Admission::Passive));
                }
                Step::Decided(admission) => return Admit::decided(admission),
                Step::Probing(admit) => return admit,
                Step::Raced(actual) => word = actual,
            }
        }
    }

    /// Closed: every call, or during a slow start, its share of calls.
    #[inline]
    fn admit_closed(&self, word: Word, now: &impl Fn() -> u64) -> Step {
        match self.settings.slow_start_us {
            Some(length) if !self.slow_start_admits(word.generation, length, now) => {
                Step::Decided(Err(None))
            }
            _ => Step::Decided(Ok(Admission::Closed(word.generation))),
        }
    }

    /// Open: refused until the open time ends; then the first caller moves the breaker to
    /// half-open and is its first probe.
    fn admit_open(&self, word: Word, now: &impl Fn() -> u64) -> Step {
        let t = now();
        match self.timer_for(word.generation) {
            // Not stored yet by the thread that opened: still open.
            None => Step::Decided(Err(Some(self.settings.open_base_us))),
            Some(until) if t < until => Step::Decided(Err(Some(until - t))),
            Some(_) => {
                let next = Word {
                    taken: 1,
                    ..word.next(State::HalfOpen)
                };
                match self.swap(word, next) {
                    Ok(()) => Step::Probing(Admit {
                        admission: Ok(Admission::Probe(next.generation)),
                        transition: Some(Transition {
                            from: State::Open,
                            to: State::HalfOpen,
                            reason: Reason::OpenElapsed,
                            generation: next.generation,
                            open_for: None,
                        }),
                    }),
                    Err(actual) => Step::Raced(actual),
                }
            }
        }
    }

    /// Half-open: a probe while probe slots are left, refused otherwise.
    fn admit_half_open(&self, word: Word) -> Step {
        if word.taken >= self.settings.probes {
            return Step::Decided(Err(None));
        }
        let next = Word {
            taken: word.taken + 1,
            ..word
        };
        match self.swap(word, next) {
            Ok(()) => Step::Decided(Ok(Admission::Probe(word.generation))),
            Err(actual) => Step::Raced(actual),
        }
    }

    /// Slow start: while closed and in slow start, admits a share of calls rising linearly from
    /// 10 % to 100 % over the slow start, spread evenly (call `n` passes when `⌊n·share⌋` moves).
    fn slow_start_admits(&self, generation: u32, length: u64, now: &impl Fn() -> u64) -> bool {
        let t = now();
        let left = match self.timer_for(generation) {
            Some(until) if t >= until => return true,
            Some(until) => until - t,
            None => length, // just closed; the closer has not stored the end yet
        };
        let share_ppm = 100_000 + 900_000 * (length - left.min(length)) / length;
        let n = self.slow_start_calls.fetch_add(1, Ordering::Relaxed);
        (n + 1) * share_ppm / 1_000_000 > n * share_ppm / 1_000_000
    }

    /// Records how an admitted call ended, from the caller's window `stripe`; returns the
    /// transition it caused, if any.
    pub(crate) fn complete(
        &self,
        admission: Admission,
        tally: Tally,
        stripe: usize,
        now: impl Fn() -> u64,
    ) -> Option<Transition> {
        match admission {
            Admission::Passive => None,
            Admission::Closed(generation) => self.complete_closed(generation, tally, stripe, now),
            Admission::Probe(generation) => self.complete_probe(generation, tally, now),
        }
    }

    /// A call admitted while closed. The rates are checked only when a failure or a slow call
    /// is recorded: a success never opens the breaker, and the success path stays one load and
    /// one uncontended read-modify-write.
    fn complete_closed(
        &self,
        generation: u32,
        tally: Tally,
        stripe: usize,
        now: impl Fn() -> u64,
    ) -> Option<Transition> {
        let Tally::Counted { failure, slow } = tally else {
            return None;
        };
        let raw = self.word.load(Ordering::Acquire);
        if Word::closed_generation(raw) != Some(generation) || Word::disabled(raw) {
            return None;
        }
        let t = if self.window.needs_clock() { now() } else { 0 };
        self.window.record(stripe, t, failure, slow);
        let mut reason = None;
        if let Some(limit) = self.settings.consecutive_failures {
            if failure {
                let n = self.consecutive.fetch_add(1, Ordering::AcqRel) + 1;
                if n >= limit {
                    reason = Some(Reason::ConsecutiveFailures(n));
                }
            } else if self.consecutive.load(Ordering::Relaxed) != 0 {
                self.consecutive.store(0, Ordering::Release);
            }
        }
        if reason.is_none() && !(failure || slow) {
            return None;
        }
        let reason = reason.or_else(|| self.trips(self.window.counts(t)))?;
        self.open(Word::decode(raw), reason, &now)
    }

    /// Whether the window's counts open the breaker, and why.
    pub(crate) fn trips(&self, counts: Counts) -> Option<Reason> {
        if counts.calls == 0 || counts.calls < self.settings.minimum_calls {
            return None;
        }
        let rate = |n: u64| n as f64 / counts.calls as f64;
        if counts.failures * 1_000_000 >= self.settings.failure_ppm * counts.calls {
            return Some(Reason::FailureRate {
                rate: rate(counts.failures),
                calls: counts.calls,
            });
        }
        match self.settings.slow_ppm {
            Some(ppm) if counts.slow * 1_000_000 >= ppm * counts.calls => {
                Some(Reason::SlowCallRate {
                    rate: rate(counts.slow),
                    calls: counts.calls,
                })
            }
            _ => None,
        }
    }

    fn complete_probe(
        &self,
        generation: u32,
        tally: Tally,
        now: impl Fn() -> u64,
    ) -> Option<Transition> {
        let mut word = self.load();
        loop {
            if word.state != State::HalfOpen || word.generation != generation {
                return None;
            }
            let next = match tally {
                Tally::Nothing => Word {
                    taken: word.taken.saturating_sub(1),
                    ..word
                },
                Tally::Counted { failure, slow } if failure || slow => {
                    return self.open(word, Reason::ProbeFailed, &now);
                }
                Tally::Counted { .. } if word.succeeded + 1 >= self.settings.probes => {
                    return self.close(word, Reason::ProbesSucceeded, &now);
                }
                Tally::Counted { .. } => Word {
                    succeeded: word.succeeded + 1,
                    ..word
                },
            };
            match self.swap(word, next) {
                Ok(()) => return None,
                Err(actual) => word = actual,
            }
        }
    }

    /// How long the breaker stays open after `reopens` consecutive re-opens, entering
    /// `generation`: `base × multiplier^reopens`, capped at `max`, then with equal jitter
    /// (uniform in `[d/2, d]`) when enabled.
    pub(crate) fn open_time(&self, reopens: u32, generation: u32) -> u64 {
        let s = &self.settings;
        let grown = s.open_base_us as f64 * s.open_multiplier.powi(reopens.min(1024) as i32);
        let d = if grown >= s.open_max_us as f64 {
            s.open_max_us
        } else {
            grown as u64
        };
        if !s.jitter {
            return d;
        }
        let unit = (mix(s.seed, generation) >> 11) as f64 / (1u64 << 53) as f64;
        d / 2 + ((d - d / 2) as f64 * unit) as u64
    }

    /// Opens from `word` (closed or half-open, generation as given) unless another thread
    /// moved the breaker on first.
    fn open(&self, mut word: Word, reason: Reason, now: &impl Fn() -> u64) -> Option<Transition> {
        let (from, generation) = (word.state, word.generation);
        loop {
            let next = word.next(State::Open);
            match self.swap(word, next) {
                Ok(()) => {
                    let reopens = match from {
                        State::HalfOpen => self.reopens.load(Ordering::Acquire).saturating_add(1),
                        _ => 0,
                    };
                    self.reopens.store(reopens, Ordering::Release);
                    let open_for = self.open_time(reopens, next.generation);
                    self.timer.store(
                        timer_word(next.generation, now().saturating_add(open_for)),
                        Ordering::Release,
                    );
                    return Some(Transition {
                        from,
                        to: State::Open,
                        reason,
                        generation: next.generation,
                        open_for: Some(Duration::from_micros(open_for)),
                    });
                }
                Err(actual) if actual.state == from && actual.generation == generation => {
                    word = actual;
                }
                Err(_) => return None,
            }
        }
    }

    /// Closes from `word` (half-open, or any state for a reset).
    fn close(&self, mut word: Word, reason: Reason, now: &impl Fn() -> u64) -> Option<Transition> {
        let (from, generation) = (word.state, word.generation);
        loop {
            // Nothing records into the window while half-open, so it is already empty but for
            // calls of older generations; clear it before the new generation can be seen.
            self.window.clear();
            self.consecutive.store(0, Ordering::Release);
            self.slow_start_calls.store(0, Ordering::Release);
            let next = word.next(State::Closed);
            match self.swap(word, next) {
                Ok(()) => {
                    self.reopens.store(0, Ordering::Release);
                    let slow_start_end = match self.settings.slow_start_us {
                        Some(length) => now().saturating_add(length),
                        None => 0,
                    };
                    self.timer.store(
                        timer_word(next.generation, slow_start_end),
                        Ordering::Release,
                    );
                    return Some(Transition {
                        from,
                        to: State::Closed,
                        reason,
                        generation: next.generation,
                        open_for: None,
                    });
                }
                Err(actual)
                    if (reason == Reason::Reset)
                        || (actual.state == from && actual.generation == generation) =>
                {
                    word = actual;
                }
                Err(_) => return None,
            }
        }
    }

    /// Closes the breaker and forgets the window, whatever its state.
    pub(crate) fn reset(&self, now: impl Fn() -> u64) -> Option<Transition> {
        self.close(self.load(), Reason::Reset, &now)
    }

    /// Sets the mode, keeping the state.
    pub(crate) fn set_mode(&self, mode: Mode) {
        let _ = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(
                    Word {
                        mode,
                        ..Word::decode(w)
                    }
                    .encode(),
                )
            });
    }

    /// When the current open time ends, if open and known (microseconds).
    pub(crate) fn open_until(&self, word: Word) -> Option<u64> {
        match word.state {
            State::Open => self.timer_for(word.generation),
            _ => None,
        }
    }

    /// Consecutive re-opens so far (0 after a close).
    pub(crate) fn reopens(&self) -> u32 {
        self.reopens.load(Ordering::Acquire)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::client::breaker::window::CountRing;

    fn settings() -> Settings {
        Settings {
            failure_ppm: 500_000,
            slow_ppm: None,
            minimum_calls: 4,
            consecutive_failures: None,
            probes: 2,
            open_base_us: 5_000_000,
            open_max_us: 300_000_000,
            open_multiplier: 2.0,
            jitter: false,
            seed: 1,
            slow_start_us: None,
        }
    }

    fn machine(s: Settings) -> Machine {
        Machine::new(s, Window::Count(CountRing::new(10)), Mode::Normal)
    }

    const OK: Tally = Tally::Counted {
        failure: false,
        slow: false,
    };
    const FAIL: Tally = Tally::Counted {
        failure: true,
        slow: false,
    };

    #[test]
    fn open_time_doubles_to_the_cap() {
        let m = machine(settings());
        let secs: Vec<u64> = (0..10).map(|k| m.open_time(k, 0) / 1_000_000).collect();
        assert_eq!(secs, [5, 10, 20, 40, 80, 160, 300, 300, 300, 300]);
        assert_eq!(m.open_time(u32::MAX, 0), 300_000_000);
    }

    #[test]
    fn jitter_is_equal_and_seeded() {
        let m = machine(Settings {
            jitter: true,
            ..settings()
        });
        let times: Vec<u64> = (0..1000).map(|g| m.open_time(0, g)).collect();
        assert!(times.iter().all(|&t| (2_500_000..=5_000_000).contains(&t)));
        let low = times.iter().filter(|&&t| t < 3_750_000).count();
        assert!((400..600).contains(&low), "{low} of 1000 in the lower half");
        let again: Vec<u64> = (0..1000).map(|g| m.open_time(0, g)).collect();
        assert_eq!(times, again);
    }

    #[test]
    fn probes_take_and_give_back_slots() {
        let m = machine(settings());
        for _ in 0..4 {
            let a = m.admit(|| 0).admission.unwrap();
            m.complete(a, FAIL, 0, || 0);
        }
        assert_eq!(m.load().state, State::Open);
        assert_eq!(m.admit(|| 1).admission, Err(Some(4_999_999)));
        let first = m.admit(|| 5_000_000);
        assert_eq!(first.transition.unwrap().reason, Reason::OpenElapsed);
        let g = m.load().generation;
        assert_eq!(first.admission, Ok(Admission::Probe(g)));
        assert_eq!(m.admit(|| 5_000_000).admission, Ok(Admission::Probe(g)));
        assert_eq!(
            m.admit(|| 5_000_000).admission,
            Err(None),
            "two probes only"
        );
        m.complete(Admission::Probe(g), Tally::Nothing, 0, || 5_000_000);
        assert_eq!(m.load().taken, 1, "a cancelled probe gives its slot back");
        assert_eq!(m.admit(|| 5_000_000).admission, Ok(Admission::Probe(g)));
        assert!(m.complete(Admission::Probe(g), OK, 0, || 0).is_none());
        let closed = m.complete(Admission::Probe(g), OK, 0, || 0).unwrap();
        assert_eq!(closed.reason, Reason::ProbesSucceeded);
        assert_eq!(m.load().state, State::Closed);
    }
}
