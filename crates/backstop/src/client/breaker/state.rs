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
            // Clearing before the swap is safe: from half-open, one probe only gets here per
            // generation (closing needs `probes` successes and at most `probes` probes are
            // taken, so two probes cannot both see the quota one short), and a reset forgets
            // the window by definition, whatever it raced.
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

    const SLOW: Tally = Tally::Counted {
        failure: false,
        slow: true,
    };

    /// Four failed calls admitted while closed, at `now`: the fourth opens (4 of 4 ≥ 50 %).
    fn trip(m: &Machine, now: u64) -> Transition {
        for _ in 0..3 {
            let a = m.admit(|| now).admission.unwrap();
            assert_eq!(m.complete(a, FAIL, 0, || now), None);
        }
        let a = m.admit(|| now).admission.unwrap();
        m.complete(a, FAIL, 0, || now)
            .expect("the fourth failure opens")
    }

    fn counts(calls: u64, failures: u64, slow: u64) -> Counts {
        Counts {
            calls,
            failures,
            slow,
        }
    }

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

    /// The rates compare in parts per million, at the threshold inclusive: `failures × 10⁶ ≥
    /// failure_ppm × calls`, then `slow × 10⁶ ≥ slow_ppm × calls`, each only from
    /// `minimum_calls` calls on; the reason carries `n / calls`.
    #[test]
    fn the_rates_open_at_their_thresholds_exactly() {
        let m = machine(Settings {
            slow_ppm: Some(250_000),
            ..settings()
        });
        // 3 calls, under the minimum of 4: nothing opens, even at 100 %.
        assert_eq!(m.trips(counts(3, 3, 3)), None);
        // No calls at all, even with no minimum: 0 × 10⁶ ≥ ppm × 0 would hold, but no rate.
        let no_minimum = machine(Settings {
            minimum_calls: 0,
            ..settings()
        });
        assert_eq!(no_minimum.trips(counts(0, 0, 0)), None);
        // 2 of 4: 2·10⁶ ≥ 500 000·4 = 2·10⁶ opens (at the threshold), rate 2/4.
        let failing = |rate, calls| Some(Reason::FailureRate { rate, calls });
        assert_eq!(m.trips(counts(4, 2, 0)), failing(0.5, 4));
        // 1 of 4: 10⁶ < 2·10⁶.
        assert_eq!(m.trips(counts(4, 1, 0)), None);
        // 3 of 5: rate 3/5.
        assert_eq!(m.trips(counts(5, 3, 0)), failing(0.6, 5));
        // Slow, threshold 25 %: 1 of 4: 10⁶ ≥ 250 000·4 = 10⁶ opens, rate 1/4; 1 of 5: 10⁶ <
        // 1.25·10⁶ does not; 2 of 5: rate 2/5.
        let slow = |rate, calls| Some(Reason::SlowCallRate { rate, calls });
        assert_eq!(m.trips(counts(4, 0, 1)), slow(0.25, 4));
        assert_eq!(m.trips(counts(5, 0, 1)), None);
        assert_eq!(m.trips(counts(5, 0, 2)), slow(0.4, 5));
        // Both over: the failure rate is named.
        assert_eq!(m.trips(counts(4, 2, 4)), failing(0.5, 4));
        // Without a slow-call threshold, slow calls alone never open.
        assert_eq!(machine(settings()).trips(counts(4, 0, 4)), None);
    }

    /// A slow success counts toward the slow-call rate and can open; a plain success never
    /// opens, even one that brings the window to the failure rate.
    #[test]
    fn slow_successes_open_and_plain_successes_never_do() {
        let m = machine(Settings {
            slow_ppm: Some(500_000),
            ..settings()
        });
        for _ in 0..3 {
            let a = m.admit(|| 0).admission.unwrap();
            assert_eq!(m.complete(a, SLOW, 0, || 0), None);
        }
        let a = m.admit(|| 0).admission.unwrap();
        let opened = m.complete(a, SLOW, 0, || 0).unwrap();
        assert_eq!(
            opened.reason,
            Reason::SlowCallRate {
                rate: 1.0,
                calls: 4
            }
        );

        let m = machine(settings());
        for tally in [FAIL, OK, FAIL, OK] {
            let a = m.admit(|| 0).admission.unwrap();
            assert_eq!(m.complete(a, tally, 0, || 0), None);
        }
        // 2 failures of 4 calls: at the rate, but the last call succeeded.
        assert_eq!(m.window.counts(0), counts(4, 2, 0));
        assert_eq!(m.load().state, State::Closed);
        // The next failure opens: 3 of 5.
        let a = m.admit(|| 0).admission.unwrap();
        let opened = m.complete(a, FAIL, 0, || 0).unwrap();
        assert_eq!(
            opened.reason,
            Reason::FailureRate {
                rate: 0.6,
                calls: 5
            }
        );
    }

    /// `consecutive_failures`: a success ends the run, and the run's `limit`-th failure
    /// opens, naming the count.
    #[test]
    fn consecutive_failures_open_on_the_limit_and_a_success_resets_them() {
        let m = machine(Settings {
            consecutive_failures: Some(3),
            minimum_calls: 100, // the rates never open here (the window holds 10 calls)
            ..settings()
        });
        for tally in [FAIL, FAIL, OK, FAIL, FAIL] {
            let a = m.admit(|| 0).admission.unwrap();
            assert_eq!(m.complete(a, tally, 0, || 0), None);
        }
        let a = m.admit(|| 0).admission.unwrap();
        let opened = m.complete(a, FAIL, 0, || 0).unwrap();
        assert_eq!(opened.reason, Reason::ConsecutiveFailures(3));
    }

    /// The generation guard of closed calls, operations interleaved by hand: a call admitted
    /// while closed in generation 0 that ends while open, or after the breaker closed again
    /// (generation 3), is neither counted nor able to open the current generation.
    #[test]
    fn a_closed_call_of_an_older_generation_decides_nothing() {
        let m = machine(settings());
        let stale = m.admit(|| 0).admission.unwrap();
        assert_eq!(stale, Admission::Closed(0));
        assert_eq!(trip(&m, 0).generation, 1);
        // Ends while open: the window keeps its 4 calls.
        assert_eq!(m.complete(stale, FAIL, 0, || 1), None);
        assert_eq!(m.window.counts(0), counts(4, 4, 0));
        // Half-open (generation 2), two probes succeed: closed, generation 3, window empty.
        let probes = [m.admit(|| 5_000_000), m.admit(|| 5_000_000)];
        let probes = probes.map(|p| p.admission.unwrap());
        assert_eq!(m.complete(probes[0], OK, 0, || 5_000_000), None);
        let closed = m.complete(probes[1], OK, 0, || 5_000_000).unwrap();
        assert_eq!((closed.to, closed.generation), (State::Closed, 3));
        // Generation 0's failures, four of them, would be 100 % of the window: not counted.
        for _ in 0..4 {
            assert_eq!(m.complete(stale, FAIL, 0, || 5_000_001), None);
        }
        assert_eq!(m.window.counts(0), Counts::default());
        assert_eq!((m.load().state, m.load().generation), (State::Closed, 3));
        // Generation 3's own call is counted.
        let current = m.admit(|| 5_000_001).admission.unwrap();
        assert_eq!(current, Admission::Closed(3));
        assert_eq!(m.complete(current, FAIL, 0, || 5_000_001), None);
        assert_eq!(m.window.counts(0), counts(1, 1, 0));
    }

    /// Disabled: every call passes uncounted, including one admitted just before the switch;
    /// forced open refuses without a time; metrics-only moves the state but refuses nothing.
    #[test]
    fn the_modes_decide_admission_and_counting() {
        let m = machine(settings());
        let before = m.admit(|| 0).admission.unwrap();
        m.set_mode(Mode::Disabled);
        assert_eq!(m.admit(|| 0).admission, Ok(Admission::Passive));
        for _ in 0..4 {
            assert_eq!(m.complete(before, FAIL, 0, || 0), None);
        }
        assert_eq!(m.window.counts(0), Counts::default());
        m.set_mode(Mode::ForcedOpen);
        assert_eq!(m.admit(|| 0).admission, Err(None));

        let m = machine(settings());
        m.set_mode(Mode::MetricsOnly);
        trip(&m, 0);
        assert_eq!(m.load().state, State::Open);
        assert_eq!(m.admit(|| 1).admission, Ok(Admission::Passive));
    }

    /// The generation guard of probes: a probe of half-open generation 2 that ends in
    /// half-open generation 4 neither counts as a success, nor reopens, nor gives back a
    /// slot. A slow probe fails like a failed one.
    #[test]
    fn a_probe_of_an_older_generation_decides_nothing() {
        let m = machine(settings());
        trip(&m, 0);
        let old = m.admit(|| 5_000_000).admission.unwrap();
        assert_eq!(old, Admission::Probe(2));
        let reopened = m.complete(old, FAIL, 0, || 5_000_000).unwrap();
        assert_eq!(reopened.reason, Reason::ProbeFailed);
        // The second open in a row: 5 s × 2 = 10 s, so half-open again at 15 s.
        assert_eq!(reopened.open_for, Some(Duration::from_secs(10)));
        let new = m.admit(|| 15_000_000).admission.unwrap();
        assert_eq!(new, Admission::Probe(4));
        for tally in [OK, OK, FAIL, SLOW, Tally::Nothing] {
            assert_eq!(m.complete(old, tally, 0, || 15_000_000), None);
        }
        let w = m.load();
        assert_eq!(
            (w.state, w.generation, w.taken, w.succeeded),
            (State::HalfOpen, 4, 1, 0)
        );
        let failed = m.complete(new, SLOW, 0, || 15_000_000).unwrap();
        assert_eq!((failed.reason, failed.generation), (Reason::ProbeFailed, 5));
    }

    /// Open times along a run of re-opens: 5 s from closed, then 10 s and 20 s from half-open;
    /// a close forgets the run (5 s again). The open time ends at `now + open_for`: refused a
    /// microsecond before with one microsecond to wait, let in at it.
    #[test]
    fn open_times_grow_with_reopens_and_a_close_forgets_them() {
        let m = machine(settings());
        let mut now = 1_000;
        let first = trip(&m, now);
        assert_eq!(first.open_for, Some(Duration::from_secs(5)));
        assert_eq!(m.reopens(), 0);
        for (reopens, secs) in [(1, 10), (2, 20)] {
            let until = m.open_until(m.load()).unwrap();
            assert_eq!(m.admit(|| until - 1).admission, Err(Some(1)));
            now = until;
            let probe = m.admit(|| now).admission.unwrap();
            let t = m.complete(probe, FAIL, 0, || now).unwrap();
            assert_eq!(t.open_for, Some(Duration::from_secs(secs)));
            assert_eq!(m.reopens(), reopens);
            assert_eq!(m.open_until(m.load()), Some(now + secs * 1_000_000));
        }
        let closed = m.reset(|| now).unwrap();
        assert_eq!((closed.from, closed.reason), (State::Open, Reason::Reset));
        assert_eq!(m.reopens(), 0);
        assert_eq!(trip(&m, now).open_for, Some(Duration::from_secs(5)));
    }

    /// The compare-and-swap guards of `open` and `close`, operations interleaved by hand: a
    /// snapshot that differs from the word only in its probe counts (same state, same
    /// generation) is retried and wins; a snapshot of another generation in the same state
    /// never opens or closes the current one; a reset closes whatever the word has become.
    #[test]
    fn transitions_retry_within_their_generation_only() {
        let m = machine(settings());
        let closed0 = m.load();
        trip(&m, 0);
        let at = |t: u64| move || t;
        m.admit(at(5_000_000));
        let half2 = m.load();
        assert_eq!(
            (half2.state, half2.generation, half2.taken),
            (State::HalfOpen, 2, 1)
        );
        m.admit(at(5_000_000)); // a second probe: the snapshot is now stale in `taken`
        let t = m.open(half2, Reason::ProbeFailed, &at(5_000_000)).unwrap();
        assert_eq!(
            (t.from, t.to, t.generation),
            (State::HalfOpen, State::Open, 3)
        );
        assert_eq!(t.open_for, Some(Duration::from_secs(10)));
        m.admit(at(15_000_000));
        let half4 = m.load();
        m.admit(at(15_000_000));
        let t = m
            .close(half4, Reason::ProbesSucceeded, &at(15_000_000))
            .unwrap();
        assert_eq!(
            (t.from, t.to, t.generation),
            (State::HalfOpen, State::Closed, 5)
        );
        // Closed, generation 5: generation 0's closed snapshot opens nothing.
        let reason = Reason::FailureRate {
            rate: 1.0,
            calls: 4,
        };
        assert_eq!(m.open(closed0, reason, &at(15_000_000)), None);
        assert_eq!((m.load().state, m.load().generation), (State::Closed, 5));
        // Half-open, generation 7: generation 2's and 4's half-open snapshots close nothing,
        // and generation 2's opens nothing.
        trip(&m, 15_000_000);
        m.admit(at(20_000_000));
        assert_eq!((m.load().state, m.load().generation), (State::HalfOpen, 7));
        for stale in [half2, half4] {
            assert_eq!(
                m.close(stale, Reason::ProbesSucceeded, &at(20_000_000)),
                None
            );
        }
        assert_eq!(m.open(half2, Reason::ProbeFailed, &at(20_000_000)), None);
        assert_eq!((m.load().state, m.load().generation), (State::HalfOpen, 7));
        // A reset from any snapshot closes the current word.
        let t = m.close(half2, Reason::Reset, &at(20_000_000)).unwrap();
        assert_eq!(
            (t.from, t.to, t.generation),
            (State::HalfOpen, State::Closed, 8)
        );
    }

    /// Until the thread that opened stores its timer, the timer holds another generation's tag:
    /// the breaker stays open (the base open time to wait) however late it is, and a closed
    /// generation's slow start counts from its beginning (10 %).
    #[test]
    fn a_timer_of_another_generation_is_not_read() {
        let m = machine(Settings {
            slow_start_us: Some(10_000_000),
            ..settings()
        });
        let opened = m.load().next(State::Open);
        m.word.store(opened.encode(), Ordering::Release);
        assert_eq!(m.open_until(m.load()), None);
        assert_eq!(m.admit(|| 1 << 40).admission, Err(Some(5_000_000)));
        let closed = m.load().next(State::Closed);
        m.word.store(closed.encode(), Ordering::Release);
        let passed = (0..20).filter(|_| m.admit(|| 1 << 40).admission.is_ok());
        assert_eq!(passed.count(), 2, "10 % of 20");
    }

    /// Slow start: the share admitted is 10 % + 90 % × (time elapsed / length), in parts per
    /// million, and call `n` passes when `⌊(n + 1)·share⌋ > ⌊n·share⌋`.
    #[test]
    fn slow_start_admits_a_share_rising_from_a_tenth() {
        let m = machine(Settings {
            slow_start_us: Some(10_000_000),
            ..settings()
        });
        // A new breaker is not in slow start.
        assert!((0..10).all(|_| m.admit(|| 0).admission.is_ok()));
        m.reset(|| 0); // closed at 0: slow start until 10 s, the call count from 0
        // At 0 s, 10 %: of calls 0..20, n = 9 and n = 19 pass; the others wait, no time promised.
        let first: Vec<_> = (0..20).map(|_| m.admit(|| 0).admission).collect();
        for (n, a) in first.iter().enumerate() {
            match n {
                9 | 19 => assert_eq!(*a, Ok(Admission::Closed(1)), "call {n}"),
                _ => assert_eq!(*a, Err(None), "call {n}"),
            }
        }
        let passed = |t: u64, calls| {
            (0..calls)
                .filter(|_| m.admit(|| t).admission.is_ok())
                .count()
        };
        // At 5 s: 100 000 + 900 000 × 5/10 = 550 000 ppm; calls 20..40: ⌊40·0.55⌋ − ⌊20·0.55⌋ =
        // 22 − 11 = 11.
        assert_eq!(passed(5_000_000, 20), 11);
        // At 7.5 s: 775 000 ppm; calls 40..60: ⌊60·0.775⌋ − ⌊40·0.775⌋ = 46 − 31 = 15.
        assert_eq!(passed(7_500_000, 20), 15);
        // At 10 s it is over, and after it too.
        assert_eq!(passed(10_000_000, 20), 20);
        assert_eq!(passed(11_000_000, 20), 20);
    }
}
