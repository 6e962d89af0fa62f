//! The adaptive limit: how many attempts a dependency takes at once, learnt from its answers.
//!
//! The rule and why are the bulkhead's module docs ("The adaptive limit"), where users
//! look; this file is only its arithmetic.
//!
//! # Concurrency rule
//!
//! The bucket's sums are relaxed atomic counters, added to by every answer. The answer that
//! first sees the bucket's end takes the history's lock with `try_lock` (a racing answer does
//! not wait: it skips) and swaps the sums out; an answer adding between two swaps lands in
//! the next bucket. The limit itself is the semaphore's ([`Semaphore::set_limit`]). So the
//! limit is an estimate, changed at most once per bucket; the semaphore's invariants hold
//! whatever it is (loom models in `semaphore.rs`).

use super::semaphore::Semaphore;
use crate::rt::sync::{AtomicU64, Mutex, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// The length of a bucket.
const BUCKET: Duration = Duration::from_millis(100);
/// The baseline's window, in one-second slots.
const BASELINE_SLOTS: usize = 30;
/// The share of its call's time left an attempt may take before a rise counts, in
/// thousandths.
const SHARE_PERMILLE: u64 = 50;
/// The least answers a bucket measures a latency from (it lasts longer, up to `MAX_BUCKET`,
/// until it has them), and the least answers to attempts sent after a cut that judge it: fewer
/// are noise (a dependency whose own work varies from 100 to 700 ms answers buckets of three
/// calls at means from 150 to 600 ms).
const MIN_ANSWERS: u64 = 10;
/// The longest a bucket waits for `MIN_ANSWERS`; one that ends with fewer only grows the
/// limit.
const MAX_BUCKET: Duration = Duration::from_secs(1);
/// How long a limit that ended no bucket (no answer came) keeps what it learnt: after this a
/// call that finds it reached puts it back to the cap.
const STALE: Duration = Duration::from_secs(5);
/// The longest a cut stays on trial: one not judged by then is undone.
const MAX_TRIAL: Duration = Duration::from_secs(5);
/// A bucket measures every call until it has this many answers, then one call in
/// `SAMPLE_EVERY`: at high rates the limit learns from a sample, and the other calls cost no
/// clock read.
const SAMPLES: u64 = 64;
const SAMPLE_EVERY: u64 = 16;
/// No trial runs (`trial_from`).
const NO_TRIAL: u64 = u64::MAX;

/// The learnt limit's state, beside a bulkhead's permits.
#[derive(Debug)]
pub(crate) struct Adaptive {
    cap: u32,
    epoch: Instant,
    /// When the bucket ends, in µs since `epoch`.
    bucket_end: AtomicU64,
    answers: AtomicU64,
    latency_us: AtomicU64,
    /// Answers whose call had a deadline, and the sum of their shares (thousandths, each at
    /// most 1 000).
    votes: AtomicU64,
    share: AtomicU64,
    /// Calls that found the limit reached.
    limited: AtomicU64,
    /// Calls that took a permit at once while the bucket had its `SAMPLES` (one in
    /// `SAMPLE_EVERY` is measured).
    unmeasured: AtomicU64,
    /// While a cut is on trial: when it was made (µs since `epoch`), and the answers to the
    /// attempts sent since, with their latency; `NO_TRIAL` otherwise.
    trial_from: AtomicU64,
    trial_answers: AtomicU64,
    trial_latency_us: AtomicU64,
    /// The answers to the attempts sent in the bucket before the cut, and their latency: the
    /// latency the queue at the cut gave (the bucket that made the cut measured attempts sent
    /// earlier still, behind a shorter queue).
    before_answers: AtomicU64,
    before_latency_us: AtomicU64,
    /// The limit before the cut on trial: how many may wait for a permit meanwhile.
    trial_limit: AtomicU64,
    history: Mutex<History>,
}

#[derive(Debug)]
struct History {
    /// The mean latency (µs) of each of the last seconds; `u64::MAX`: none.
    slots: [u64; BASELINE_SLOTS],
    /// The second (since `epoch`) being summed, its latency sum (µs) and answers.
    second: u64,
    sum: u64,
    count: u64,
    /// The last baseline (µs; `u64::MAX`: none yet).
    last: u64,
    /// When the bucket started (µs since `epoch`).
    bucket_start: u64,
    /// The cut on trial.
    cut: Option<Cut>,
}

/// A cut on trial: the attempts sent after it must answer a quarter faster than the bucket
/// that made it, or it is undone.
#[derive(Debug, Clone, Copy)]
struct Cut {
    /// When it was made (µs since `epoch`).
    at: u64,
    /// The bucket mean latency (µs) that made it.
    mean: u64,
    /// The limit before it.
    limit: u32,
}

/// What a bucket changed (for the gauges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rolled {
    pub(crate) limit: u32,
    pub(crate) in_flight: u32,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Adaptive {
    /// A limit that starts at `cap` and never exceeds it.
    pub(crate) fn new(cap: u32) -> Self {
        Self {
            cap,
            epoch: Instant::now(),
            bucket_end: AtomicU64::new(micros(BUCKET)),
            answers: AtomicU64::new(0),
            latency_us: AtomicU64::new(0),
            votes: AtomicU64::new(0),
            share: AtomicU64::new(0),
            limited: AtomicU64::new(0),
            unmeasured: AtomicU64::new(0),
            trial_from: AtomicU64::new(NO_TRIAL),
            trial_answers: AtomicU64::new(0),
            trial_latency_us: AtomicU64::new(0),
            before_answers: AtomicU64::new(0),
            before_latency_us: AtomicU64::new(0),
            trial_limit: AtomicU64::new(0),
            history: Mutex::new(History {
                slots: [u64::MAX; BASELINE_SLOTS],
                second: 0,
                sum: 0,
                count: 0,
                last: u64::MAX,
                bucket_start: 0,
                cut: None,
            }),
        }
    }

    /// A call found the limit reached.
    #[inline]
    pub(crate) fn limited(&self) {
        self.limited.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether to measure a call that took its permit at once: every call until the bucket
    /// has `SAMPLES` answers, then one in `SAMPLE_EVERY` (which keeps the buckets rolling).
    #[inline]
    pub(crate) fn measures(&self) -> bool {
        self.answers.load(Ordering::Relaxed) < SAMPLES
            || self
                .unmeasured
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(SAMPLE_EVERY)
    }

    /// While a cut is on trial, the limit before it: as many calls may wait for a permit,
    /// as long as their deadline allows, rather than being refused for the queue's expected
    /// wait (the cut may be undone).
    pub(crate) fn on_trial(&self) -> Option<u32> {
        (self.trial_from.load(Ordering::Relaxed) != NO_TRIAL)
            .then(|| u32::try_from(self.trial_limit.load(Ordering::Relaxed)).unwrap_or(u32::MAX))
    }

    /// A call found the limit reached at `now`: if no bucket has ended for `STALE` (no
    /// answer came for seconds), what the limit learnt is stale, and it goes back to the cap
    /// (a cut on trial is dropped). Returns whether it did. Only on the slow path.
    #[cold]
    pub(crate) fn relax_if_stale(&self, permits: &Semaphore, now: Instant) -> bool {
        let at = micros(now.saturating_duration_since(self.epoch));
        let stale = |end: u64| at >= end.saturating_add(micros(STALE));
        if !stale(self.bucket_end.load(Ordering::Relaxed)) {
            return false;
        }
        let Ok(mut history) = self.history.try_lock() else {
            return false;
        };
        if !stale(self.bucket_end.load(Ordering::Acquire)) || permits.limit() == self.cap {
            return false;
        }
        history.cut = None;
        self.trial_from.store(NO_TRIAL, Ordering::Relaxed);
        // A new bucket from now: what the old one summed is as stale as the limit.
        for sum in [
            &self.answers,
            &self.latency_us,
            &self.votes,
            &self.share,
            &self.limited,
        ] {
            sum.store(0, Ordering::Relaxed);
        }
        history.bucket_start = at;
        self.bucket_end
            .store(at.saturating_add(micros(BUCKET)), Ordering::Release);
        permits.set_limit(self.cap);
        true
    }

    /// An answer came at `now` to an attempt sent at `sent` with `budget` left of its call's
    /// deadline (`None`: the call has none); `timed_out`: the attempt's bound or the deadline
    /// ended it, so it used all its time and says nothing of the dependency's latency. Returns
    /// the limit and the attempts in flight when this answer ended a bucket.
    #[inline]
    pub(crate) fn answered(
        &self,
        permits: &Semaphore,
        sent: Instant,
        now: Instant,
        budget: Option<Duration>,
        timed_out: bool,
    ) -> Option<Rolled> {
        // At most an hour: the sums cannot wrap.
        let latency = micros(now.saturating_duration_since(sent)).min(3_600_000_000);
        if let Some(budget) = budget {
            let share = match timed_out {
                true => 1_000,
                false => (latency.saturating_mul(1_000) / micros(budget).max(1)).min(1_000),
            };
            self.votes.fetch_add(1, Ordering::Relaxed);
            self.share.fetch_add(share, Ordering::Relaxed);
        }
        let at = micros(now.saturating_duration_since(self.epoch));
        if timed_out {
            return self.roll_if_due(permits, at);
        }
        self.answers.fetch_add(1, Ordering::Relaxed);
        self.latency_us.fetch_add(latency, Ordering::Relaxed);
        let trial_from = self.trial_from.load(Ordering::Relaxed);
        if trial_from != NO_TRIAL {
            let sent = micros(sent.saturating_duration_since(self.epoch));
            if sent >= trial_from {
                self.trial_answers.fetch_add(1, Ordering::Relaxed);
                self.trial_latency_us.fetch_add(latency, Ordering::Relaxed);
            } else if sent >= trial_from.saturating_sub(micros(BUCKET)) {
                self.before_answers.fetch_add(1, Ordering::Relaxed);
                self.before_latency_us.fetch_add(latency, Ordering::Relaxed);
            }
        }
        self.roll_if_due(permits, at)
    }

    #[inline]
    fn roll_if_due(&self, permits: &Semaphore, at: u64) -> Option<Rolled> {
        if at < self.bucket_end.load(Ordering::Relaxed) {
            return None;
        }
        self.roll(permits, at)
    }

    #[cold]
    #[inline(never)]
    fn roll(&self, permits: &Semaphore, at: u64) -> Option<Rolled> {
        let Ok(mut history) = self.history.try_lock() else {
            return None;
        };
        if at < self.bucket_end.load(Ordering::Acquire) {
            return None; // Another answer rolled it.
        }
        if self.answers.load(Ordering::Relaxed) < MIN_ANSWERS
            && at < history.bucket_start.saturating_add(micros(MAX_BUCKET))
        {
            return None; // Too few answers yet: the bucket goes on.
        }
        history.bucket_start = at;
        self.bucket_end
            .store(at.saturating_add(micros(BUCKET)), Ordering::Release);
        let answers = self.answers.swap(0, Ordering::Relaxed);
        let latency = self.latency_us.swap(0, Ordering::Relaxed);
        let votes = self.votes.swap(0, Ordering::Relaxed);
        let share = self.share.swap(0, Ordering::Relaxed);
        let limited = self.limited.swap(0, Ordering::Relaxed);
        let measured = answers >= MIN_ANSWERS;
        let mean = latency / answers.max(1);
        let baseline = match measured {
            true => {
                // Only a bucket that looks like the dependency at rest teaches the baseline: no
                // call waited for the limit, no cut on trial, and not twice the baseline
                // already (a queue building before the limit reacted). The baseline rises
                // only when a trial shows the slower latency is not a queue.
                let rest =
                    limited == 0 && history.cut.is_none() && mean <= history.last.saturating_mul(2);
                history.baseline(at / 1_000_000, answers, mean, rest)
            }
            false => u64::MAX,
        };
        let limit = permits.limit();
        // The answering call still holds its permit: it is not in flight any more.
        let in_flight = permits.load().0.saturating_sub(1);
        let next = if let Some(cut) = history.cut {
            let judged = self.trial_answers.load(Ordering::Relaxed);
            let expired = at >= cut.at.saturating_add(micros(MAX_TRIAL));
            if judged < MIN_ANSWERS && !expired {
                // Too few attempts sent since the cut have answered: neither another cut
                // nor growth.
                limit
            } else {
                // A trial that could not be judged in time counts as not lowering the latency.
                let after = match judged {
                    0 => u64::MAX,
                    n => self.trial_latency_us.load(Ordering::Relaxed) / n,
                };
                let before = match self.before_answers.load(Ordering::Relaxed) {
                    0 => cut.mean,
                    n => (self.before_latency_us.load(Ordering::Relaxed) / n).max(cut.mean),
                };
                history.cut = None;
                self.trial_from.store(NO_TRIAL, Ordering::Relaxed);
                if after.saturating_mul(4) > before.saturating_mul(3) {
                    // Not a quarter faster: it was not this limit's queue. The limit comes
                    // back, and the latency now is the dependency's baseline.
                    history.rebase(at / 1_000_000, after.min(mean));
                    limit.max(cut.limit)
                } else {
                    limit
                }
            }
        } else if measured
            && votes > 0
            && share / votes > SHARE_PERMILLE
            && mean > baseline.saturating_mul(2)
        {
            let next = (limit.min(in_flight) / 2).max(1);
            if next < limit {
                history.cut = Some(Cut { at, mean, limit });
                self.trial_limit.store(u64::from(limit), Ordering::Relaxed);
                for sum in [
                    &self.trial_answers,
                    &self.trial_latency_us,
                    &self.before_answers,
                    &self.before_latency_us,
                ] {
                    sum.store(0, Ordering::Relaxed);
                }
                self.trial_from.store(at, Ordering::Relaxed);
            }
            next
        } else if limited > 0 {
            limit.saturating_add((limit / 8).max(1)).min(self.cap)
        } else {
            // A whole bucket without a call finding the limit reached, and no queue: what was
            // learnt binds nothing now, so the limit goes back toward the cap (doubling), and a
            // later burst finds nothing held back until the dependency queues again.
            limit.saturating_mul(2).min(self.cap)
        };
        if next != limit {
            permits.set_limit(next);
        }
        Some(Rolled {
            limit: next,
            in_flight,
        })
    }
}

impl History {
    /// Adds a bucket of `answers` at `mean` (µs) at `second` if it was taken at `rest`, and
    /// returns the baseline: the least one-second mean of the window, of the seconds with at
    /// least `MIN_ANSWERS` answers at rest; the last baseline when the window has none (a
    /// limit reached for 30 s on end keeps the latency it had when it was not).
    fn baseline(&mut self, second: u64, answers: u64, mean: u64, rest: bool) -> u64 {
        if second > self.second {
            self.close_second();
            // The seconds with no answer since the last one: empty.
            let gap = (second - self.second).min(BASELINE_SLOTS as u64);
            for s in 0..gap {
                self.slots[((second - s) % BASELINE_SLOTS as u64) as usize] = u64::MAX;
            }
            self.second = second;
        }
        if rest {
            self.sum = self.sum.saturating_add(mean.saturating_mul(answers));
            self.count += answers;
        }
        let current = match self.count {
            n if n >= MIN_ANSWERS => self.sum / n,
            _ => u64::MAX,
        };
        // The slot of the current second holds only a rebased baseline until it closes.
        let least = self
            .slots
            .iter()
            .copied()
            .min()
            .unwrap_or(u64::MAX)
            .min(current);
        if least != u64::MAX {
            self.last = least;
        }
        self.last
    }

    /// The current second's mean goes into its slot.
    fn close_second(&mut self) {
        if self.count >= MIN_ANSWERS {
            // The least of it and a rebased baseline set in the same second.
            let slot = &mut self.slots[(self.second % BASELINE_SLOTS as u64) as usize];
            *slot = (*slot).min(self.sum / self.count);
        }
        (self.sum, self.count) = (0, 0);
    }

    /// Forgets the window: `mean`, at `second`, is the baseline now.
    fn rebase(&mut self, second: u64, mean: u64) {
        self.slots = [u64::MAX; BASELINE_SLOTS];
        self.second = second;
        (self.sum, self.count) = (0, 0);
        self.slots[(second % BASELINE_SLOTS as u64) as usize] = mean;
        self.last = mean;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const SECOND: Option<Duration> = Some(Duration::from_secs(1));

    /// A limit (cap 1 000) with its permits, and the clock the tests move by hand.
    struct Rig {
        a: Adaptive,
        s: Semaphore,
        now: Instant,
    }

    impl Rig {
        fn new() -> Self {
            Self {
                a: Adaptive::new(1_000),
                s: Semaphore::new(1_000),
                now: Instant::now(),
            }
        }

        /// `n` answers arriving now, each `latency` after it was sent.
        fn answers(&self, n: u32, latency: Duration, budget: Option<Duration>) -> Option<Rolled> {
            let mut rolled = None;
            for _ in 0..n {
                rolled = rolled.or(self.a.answered(
                    &self.s,
                    self.now - latency,
                    self.now,
                    budget,
                    false,
                ));
            }
            rolled
        }

        /// `n` answers arriving now to attempts sent at `sent`, with 1 s left then.
        fn answers_sent(&self, n: u32, sent: Instant) {
            for _ in 0..n {
                self.a.answered(&self.s, sent, self.now, SECOND, false);
            }
        }

        /// A bucket of `n` answers of `latency`, then its end (100 ms later).
        fn bucket(
            &mut self,
            n: u32,
            latency: Duration,
            budget: Option<Duration>,
        ) -> Option<Rolled> {
            self.answers(n - 1, latency, budget);
            self.now += BUCKET;
            self.answers(1, latency, budget)
        }

        /// A healthy second at 10 ms: the baseline.
        fn healthy(&mut self) {
            for _ in 0..10 {
                self.bucket(20, 10 * MS, SECOND);
            }
        }

        /// `n` attempts in flight, and the permit the answering call holds while it is
        /// measured.
        fn hold(&self, n: u32) {
            for _ in 0..=n {
                assert!(self.s.try_acquire());
            }
        }

        fn limit(&self) -> u32 {
            self.s.limit()
        }
    }

    /// After a healthy second, 300 attempts in flight answered at 200 ms of a 1 s deadline:
    /// halved, of those in flight, and on trial.
    fn queueing() -> Rig {
        let mut rig = Rig::new();
        rig.healthy();
        assert_eq!(rig.limit(), 1_000, "nothing held back");
        rig.hold(300);
        // Sent just before the cut: they met the queue as it was.
        rig.answers(10, 200 * MS, SECOND);
        let rolled = rig.bucket(20, 200 * MS, SECOND).unwrap();
        assert_eq!(
            rolled,
            Rolled {
                limit: 150,
                in_flight: 300
            }
        );
        assert!(rig.a.on_trial().is_some());
        rig
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_whose_later_attempts_answer_faster_stands() {
        let mut rig = queueing();
        // On trial: still slow answers (sent before the cut), no second cut, no growth.
        for _ in 0..3 {
            rig.a.limited();
            rig.bucket(20, 400 * MS, SECOND);
            assert_eq!(rig.limit(), 150);
        }
        // Ten attempts sent after the cut answer in 120 ms: faster by more than a quarter.
        rig.answers(10, 120 * MS, SECOND);
        rig.bucket(10, 400 * MS, SECOND);
        assert!(rig.a.on_trial().is_none());
        assert_eq!(rig.limit(), 150, "the cut stands");
        // Still queueing: halved again.
        rig.bucket(20, 150 * MS, SECOND);
        assert_eq!(rig.limit(), 75);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_whose_later_attempts_are_no_faster_is_undone_and_rebased() {
        let mut rig = queueing();
        // Ten attempts sent after the cut answer in 200 ms, as before it.
        rig.now += 300 * MS;
        rig.answers(10, 200 * MS, SECOND);
        rig.bucket(10, 200 * MS, SECOND);
        assert!(rig.a.on_trial().is_none());
        assert_eq!(rig.limit(), 1_000, "undone");
        // 200 ms is the baseline now: no cut until it doubles.
        for _ in 0..20 {
            rig.bucket(20, 390 * MS, SECOND);
        }
        assert_eq!(rig.limit(), 1_000);
        rig.bucket(20, 450 * MS, SECOND);
        assert_eq!(rig.limit(), 150);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trial_not_judged_within_five_seconds_is_undone() {
        let mut rig = queueing();
        let cut = rig.now;
        // Only answers to attempts sent before the cut (a long backlog) for 5 s.
        for _ in 0..49 {
            rig.now += BUCKET;
            rig.answers_sent(10, cut - MS);
        }
        assert!(rig.a.on_trial().is_some());
        rig.now += BUCKET;
        rig.answers_sent(10, cut - MS);
        assert!(rig.a.on_trial().is_none());
        assert_eq!(rig.limit(), 1_000);
    }

    #[tokio::test(start_paused = true)]
    async fn rises_no_caller_feels_and_calls_without_deadlines_never_cut() {
        let mut rig = Rig::new();
        rig.healthy();
        rig.hold(100);
        // 10 ms → 45 ms, of 1 s: under a twentieth of the time left.
        for _ in 0..20 {
            rig.bucket(20, 45 * MS, SECOND);
        }
        assert_eq!(rig.limit(), 1_000);
        // 10 ms → 900 ms with no deadline.
        for _ in 0..20 {
            rig.bucket(20, 900 * MS, None);
        }
        assert_eq!(rig.limit(), 1_000);
        // Timeouts vote (all their time used) but are no latency: 30 ms is thrice the
        // baseline, and with the timeouts the calls feel it.
        for _ in 0..20 {
            rig.a
                .answered(&rig.s, rig.now - 5 * MS, rig.now, SECOND, true);
        }
        rig.bucket(20, 30 * MS, SECOND);
        assert_eq!(rig.limit(), 50);
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_waits_for_ten_answers_up_to_a_second() {
        let mut rig = Rig::new();
        rig.healthy();
        rig.hold(100);
        // Five slow answers in 100 ms: too few to judge, the bucket goes on; ten by 200 ms.
        assert_eq!(rig.bucket(5, 800 * MS, SECOND), None);
        assert_eq!(rig.bucket(5, 800 * MS, SECOND).map(|r| r.limit), Some(50));
        // Fewer than ten in a second: the bucket ends, and only grows the limit.
        let mut rig = Rig::new();
        rig.s.set_limit(8);
        rig.a.limited();
        for _ in 0..4 {
            rig.now += 200 * MS;
            assert_eq!(rig.answers(1, 900 * MS, SECOND), None);
        }
        rig.now += 200 * MS;
        assert_eq!(rig.answers(1, 900 * MS, SECOND).map(|r| r.limit), Some(9));
    }

    #[tokio::test(start_paused = true)]
    async fn a_limit_reached_grows_by_an_eighth_and_one_not_reached_doubles() {
        let mut rig = Rig::new();
        rig.s.set_limit(8);
        rig.a.limited();
        rig.bucket(10, 10 * MS, SECOND);
        assert_eq!(rig.limit(), 9, "at least one");
        rig.a.limited();
        rig.bucket(10, 10 * MS, SECOND);
        assert_eq!(rig.limit(), 10);
        // A bucket in which no call found it reached: it binds nothing, it doubles.
        rig.bucket(10, 10 * MS, SECOND);
        assert_eq!(rig.limit(), 20);
        for _ in 0..10 {
            rig.bucket(10, 10 * MS, SECOND);
        }
        assert_eq!(rig.limit(), 1_000, "the cap");
        for _ in 0..60 {
            rig.a.limited();
            rig.bucket(10, 10 * MS, SECOND);
        }
        assert_eq!(rig.limit(), 1_000, "never past the cap");
    }

    #[tokio::test(start_paused = true)]
    async fn a_limit_that_heard_nothing_for_five_seconds_goes_back_to_the_cap() {
        let mut rig = queueing();
        rig.answers(5, 300 * MS, SECOND);
        assert!(
            !rig.a.relax_if_stale(&rig.s, rig.now + STALE),
            "not stale yet"
        );
        rig.now += STALE + BUCKET;
        assert!(rig.a.relax_if_stale(&rig.s, rig.now));
        assert_eq!((rig.limit(), rig.a.on_trial()), (1_000, None));
        assert!(
            !rig.a.relax_if_stale(&rig.s, rig.now),
            "at the cap: nothing to do"
        );
        // The old bucket's slow answers are forgotten: the next bucket is at rest.
        rig.bucket(20, 10 * MS, SECOND);
        assert_eq!(rig.limit(), 1_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trial_lets_as_many_wait_as_the_limit_before_the_cut() {
        let rig = queueing();
        assert_eq!(rig.a.on_trial(), Some(1_000));
    }

    #[test]
    fn the_baseline_learns_at_rest_only_and_keeps_its_last_value() {
        let mut h = History {
            slots: [u64::MAX; BASELINE_SLOTS],
            second: 0,
            sum: 0,
            count: 0,
            last: u64::MAX,
            bucket_start: 0,
            cut: None,
        };
        assert_eq!(
            h.baseline(0, 5, 10, true),
            u64::MAX,
            "fewer than ten answers"
        );
        assert_eq!(h.baseline(0, 5, 10, true), 10);
        assert_eq!(h.baseline(1, 20, 50, false), 10, "not at rest");
        assert_eq!(h.baseline(29, 20, 15, true), 10);
        assert_eq!(h.baseline(30, 20, 15, true), 15, "second 0 left the window");
        assert_eq!(
            h.baseline(1_000, 0, 0, false),
            15,
            "an empty window keeps the last"
        );
        h.rebase(1_000, 400);
        assert_eq!(h.baseline(1_000, 20, 500, true), 400);
    }

    #[tokio::test(start_paused = true)]
    async fn extreme_values_do_not_overflow() {
        let (a, s) = (Adaptive::new(u32::MAX), Semaphore::new(1));
        let mut now = Instant::now();
        for latency in [Duration::MAX, Duration::ZERO, Duration::from_nanos(1)] {
            for budget in [Some(Duration::ZERO), Some(Duration::MAX), None] {
                for _ in 0..20 {
                    let sent = now.checked_sub(latency).unwrap_or(now);
                    a.answered(&s, sent, now, budget, false);
                    a.answered(&s, sent, now, budget, true);
                }
                now += Duration::from_secs(2);
            }
        }
        assert!(s.limit() >= 1);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! `RUSTFLAGS="--cfg loom" cargo test -p backstop --lib loom` (run by `.ci/run`).
    use super::*;
    use loom::{sync::Arc, thread};

    /// Two answers end the same bucket at once: exactly one of them rolls it (the other
    /// skips: the lock is taken, or the bucket it saw ending has ended), and the answers
    /// the roll did not take wait in the next bucket.
    #[test]
    fn loom_two_answers_ending_one_bucket_roll_it_once() {
        loom::model(|| {
            let permits = Arc::new(Semaphore::new(100));
            let limit = Arc::new(Adaptive::new(100));
            // A full bucket already counted.
            limit.answers.store(MIN_ANSWERS, Ordering::Relaxed);
            limit
                .latency_us
                .store(MIN_ANSWERS * 10_000, Ordering::Relaxed);
            let end = limit.epoch + BUCKET;
            let answer = |permits: Arc<Semaphore>, limit: Arc<Adaptive>| {
                thread::spawn(move || {
                    limit
                        .answered(&permits, end - BUCKET / 10, end, None, false)
                        .is_some()
                })
            };
            let a = answer(permits.clone(), limit.clone());
            let b = answer(permits.clone(), limit.clone());
            let rolls = [a.join().unwrap(), b.join().unwrap()];
            assert_eq!(rolls.iter().filter(|r| **r).count(), 1, "{rolls:?}");
            assert!(limit.answers.load(Ordering::Relaxed) <= 2);
            assert_eq!(permits.limit(), 100);
        });
    }
}
