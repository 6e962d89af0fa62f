//! [`RatioBudget`]: retries worth a fraction of recent successes, plus a reserve; see the
//! [module docs](super) for why and for its concurrency rule.

use super::Budget;
use crate::ConfigError;
use crate::rt::stripe::{Ring, Update, Word};
#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// Slots per `ttl` in the ratio budget's ring.
const SLOTS: u64 = 10;

/// Bits of a count: 4 billion per slot and stripe, so a count saturates only past 400 million
/// successes a second on one core (at the default 1 s slots; 500 000 a second at the longest
/// `ttl`, a day, whose slots are 2.4 hours). A saturated deposit is not counted: the budget
/// then errs towards fewer retries.
const COUNT_BITS: u32 = 32;

/// The budget's counts of one kind (deposits or withdrawals): a [`Ring`] of time slots whose
/// values are plain counts. Its 32-bit tags and sweeps keep old counts from ever coming back,
/// however long it sits idle (see [`backstop::rt::stripe::Ring`](crate::rt::stripe::Ring)).
///
/// Deposits (one per successful request) are striped; withdrawals (one per retry) are not.
#[derive(Debug)]
struct Counts(Ring<COUNT_BITS>);

impl Counts {
    fn new(len: usize, stripes: usize) -> Self {
        Self(Ring::new(len, stripes))
    }

    /// Adds `n` to the slot of `epoch`; `false` when `n` was not (wholly) counted: the count
    /// saturated, or the slot already holds a later epoch (this caller read the clock a whole
    /// ring ago and is late: it must not erase the later epoch's count).
    #[inline]
    fn add(&self, stripe: usize, epoch: u64, n: u64) -> bool {
        let max = Word::<COUNT_BITS>::VALUE_MAX;
        let mut counted = true;
        let update = self.0.update(stripe, epoch, |count| {
            let sum = count.saturating_add(n);
            counted = sum <= max;
            Some(sum.min(max))
        });
        counted && update == Update::Written
    }

    /// Takes `n` back from the slot of `epoch`, if that slot still holds `epoch`'s count.
    fn sub(&self, stripe: usize, epoch: u64, n: u64) {
        self.0
            .update_current(stripe, epoch, |count| count.saturating_sub(n));
    }

    /// The sum over every stripe of the slots of epochs `now - span + 1 ..= now`, and with
    /// `later`, of epochs after `now` too (a withdrawal must see those).
    fn sum(&self, now: u64, span: u64, later: bool) -> u64 {
        self.0.fold(now, span, later, 0u64, u64::saturating_add)
    }
}

/// The ratio budget: retries are capped at `ratio` of recent successful requests, plus a
/// reserve.
///
/// - Each logical request that succeeds deposits `ratio` of a token (default 0.1).
/// - Each retry withdraws one token.
/// - Deposits expire after `ttl` (default 10 s), counted in 10 slots of `ttl / 10`.
/// - A reserve of `min_per_sec` retries a second (default 10) is always there, so a client
///   with little traffic can still retry. It is a rate, not a bank: beyond what earnings
///   cover, at most `min_per_sec` retries go in any second of the budget's clock (its slots,
///   `ttl / 10`, rounded up to a whole second), and `min_per_sec × ttl` over the window
///   (withdrawals count one slot longer than deposits, so a client that keeps failing
///   retries `min_per_sec × 10 / 11` times a second on average).
/// - Earnings are spent no faster than 2 × their average rate over the window in any one
///   second (and at least one token a second): at a fault's onset the window's earnings do
///   not all go at once.
///
/// So over any window of `ttl`, retries ≤ `ratio ×` successes of the last `ttl` (plus one
/// slot) `+ min_per_sec × ttl`, however many threads withdraw at once: during a total outage
/// successes stop and retries fall to the reserve. Correct for any ratio in (0, 1] (a ratio of 0.6 allows 60 % more load, not 100 %).
///
/// ```
/// use backstop::client::retry::{Budget, RatioBudget};
/// use std::time::Duration;
///
/// // No reserve, to show the ratio alone.
/// let budget = RatioBudget::builder()
///     .ratio(0.2)
///     .ttl(Duration::from_secs(10))
///     .min_per_sec(0)
///     .build()
///     .unwrap();
/// assert!(!budget.try_withdraw());
/// for _ in 0..50 {
///     budget.record_success();
/// }
/// // 50 × 0.2 = 10 tokens in the window, 1 a second on average: one second spends at most 2.
/// assert!((budget.balance() - 2.0).abs() < 1e-9);
/// assert!(budget.try_withdraw() && budget.try_withdraw() && !budget.try_withdraw());
/// ```
#[derive(Debug)]
pub struct RatioBudget {
    start: Instant,
    slot_nanos: u64,
    ratio: f64,
    reserve: f64,
    /// The reserve of the most recent second (in whole slots): what the reserve may give in
    /// it, beyond what earnings still cover.
    reserve_recent: f64,
    /// Slots making up that second.
    recent_slots: u64,
    /// The most of the window's earnings one second may spend: [`MAX_BURST`] × that second's
    /// share of the window.
    burst_share: f64,
    deposits: Counts,
    withdrawals: Counts,
    /// Every withdrawal passes through this word after writing its slot, so of two racing
    /// withdrawals the later one sees the earlier one's slot, whichever slots they wrote.
    fence: AtomicU64,
}

/// The most retries paid from earnings in any one second, as a multiple of the window's
/// average per second (fixed: a knob once). At the onset of a fault the earnings of the whole
/// window would otherwise go at once (up to `ratio × ttl` seconds of extra load in one second:
/// double the load at the defaults); at 2 and the default ratio no second carries more than
/// 20 % extra load plus the reserve, and a long fault is not slowed (it spends no faster than
/// it earns). The lab's brownout bound (≤ 1.25× the offered load in any second) rests on it.
const MAX_BURST: f64 = 2.0;

/// Builds a [`RatioBudget`].
#[derive(Debug, Clone)]
pub struct RatioBudgetBuilder {
    ratio: f64,
    ttl: Duration,
    min_per_sec: u32,
    max_burst: f64,
}

impl RatioBudget {
    /// A budget with the defaults: ratio 0.1, ttl 10 s, 10 retries per second in reserve.
    pub fn new() -> Self {
        Self::builder().build().expect("the defaults are valid")
    }

    /// A builder for a tuned budget.
    pub fn builder() -> RatioBudgetBuilder {
        RatioBudgetBuilder {
            ratio: 0.1,
            ttl: Duration::from_secs(10),
            min_per_sec: 10,
            max_burst: MAX_BURST,
        }
    }

    fn epoch(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.start);
        // u64 nanoseconds cover 584 years of uptime; u128 division would cost more than the
        // rest of the deposit.
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        nanos / self.slot_nanos
    }
}

impl Default for RatioBudget {
    fn default() -> Self {
        Self::new()
    }
}

impl RatioBudgetBuilder {
    /// Tokens deposited per successful request, in (0, 1] (default 0.1).
    #[must_use]
    pub fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = ratio;
        self
    }

    /// How long a deposit counts (default 10 s; at least 10 ms).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Retries per second always available (default 10; 0 for none).
    #[must_use]
    pub fn min_per_sec(mut self, min_per_sec: u32) -> Self {
        self.min_per_sec = min_per_sec;
        self
    }

    /// The most retries paid from earnings in any one second, as a multiple of the window's
    /// average per second ([`MAX_BURST`] for users, at least 1; the crate's tests set others).
    #[must_use]
    #[cfg(test)]
    pub(crate) fn max_burst(mut self, max_burst: f64) -> Self {
        self.max_burst = max_burst;
        self
    }

    /// Validates the configuration.
    ///
    /// # Errors
    ///
    /// When `ratio` is not in (0, 1], or `ttl` is shorter than 10 ms or longer than a day.
    pub fn build(self) -> Result<RatioBudget, ConfigError> {
        if self.max_burst.is_nan() || self.max_burst < 1.0 {
            return Err(ConfigError::new(
                "max_burst",
                format!("must be at least 1, got {}", self.max_burst),
            ));
        }
        if !(self.ratio > 0.0 && self.ratio <= 1.0) {
            return Err(ConfigError::new(
                "ratio",
                format!("must be in (0, 1], got {}", self.ratio),
            ));
        }
        if self.ttl < Duration::from_millis(10) || self.ttl > Duration::from_secs(86_400) {
            return Err(ConfigError::new(
                "ttl",
                format!("must be between 10ms and 1 day, got {:?}", self.ttl),
            ));
        }
        let slot_nanos = (self.ttl / SLOTS as u32).as_nanos() as u64;
        let recent_slots = 1_000_000_000u64.div_ceil(slot_nanos).clamp(1, SLOTS);
        Ok(RatioBudget {
            start: Instant::now(),
            slot_nanos,
            ratio: self.ratio,
            reserve: f64::from(self.min_per_sec) * self.ttl.as_secs_f64(),
            reserve_recent: f64::from(self.min_per_sec) * (recent_slots * slot_nanos) as f64 / 1e9,
            recent_slots,
            burst_share: self.max_burst * recent_slots as f64 / SLOTS as f64,
            deposits: Counts::new(SLOTS as usize, crate::rt::stripe::count()),
            withdrawals: Counts::new(SLOTS as usize + 1, 1),
            fence: AtomicU64::new(0),
        })
    }
}

impl RatioBudget {
    /// The retries available at `epoch`: the lesser of what the window allows (earnings plus
    /// the whole reserve, less every withdrawal) and what the last second allows (what the
    /// earnings still cover, at most [`MAX_BURST`] × a second's share of them, plus one second
    /// of reserve, less that second's withdrawals). So the reserve is a rate (a client with
    /// nothing earned retries at most `min_per_sec` times a second, never the whole window's
    /// reserve at once), and the earnings of a healthy window are not spent in one second.
    fn balance_at(&self, epoch: u64) -> f64 {
        let earned = self.ratio * self.deposits.sum(epoch, SLOTS, false) as f64;
        let spent = self.withdrawals.sum(epoch, SLOTS + 1, true) as f64;
        let window = earned + self.reserve - spent;
        let recent = self.withdrawals.sum(epoch, self.recent_slots, true) as f64;
        // At least one token a second, so a client with little traffic can spend what it
        // earned even when its burst share is a fraction.
        let from_earnings = (earned - (spent - recent))
            .max(0.0)
            .min((self.burst_share * earned).max(1.0));
        let second = from_earnings + self.reserve_recent - recent;
        window.min(second)
    }

    /// Reserve, verify, refund: the withdrawal is written first and the balance then read
    /// with it counted, so of several threads racing for the last token at most one keeps it.
    /// Each withdrawal then passes through `fence` (one read-modify-write on one word), so
    /// the later of two racing withdrawals sees the earlier one's slot even when the two
    /// wrote different slots (a slot boundary between them), and a withdrawal also counts
    /// slots of epochs later than its own clock read. A thread that finds the balance
    /// overdrawn takes its withdrawal back. Racing threads may all refuse (a spurious
    /// refusal, never an over-grant).
    fn try_withdraw_at(&self, epoch: u64) -> bool {
        // A spent budget is refused without a write.
        if self.balance_at(epoch) < 1.0 {
            return false;
        }
        if !self.withdrawals.add(0, epoch, 1) {
            return false; // a withdrawal that cannot be counted is not granted
        }
        self.fence.fetch_add(1, Ordering::AcqRel);
        if self.balance_at(epoch) < 0.0 {
            self.withdrawals.sub(0, epoch, 1);
            return false;
        }
        true
    }
}

impl Budget for RatioBudget {
    fn record_success(&self) {
        self.deposits
            .add(crate::rt::stripe::index(), self.epoch(), 1);
    }

    fn try_withdraw(&self) -> bool {
        self.try_withdraw_at(self.epoch())
    }

    fn refund(&self) {
        self.withdrawals.sub(0, self.epoch(), 1);
    }

    fn balance(&self) -> f64 {
        self.balance_at(self.epoch()).max(0.0)
    }
}

/// A budget of earnings only: `ratio` of the successes of the last `ttl`, no reserve (tests).
#[cfg(test)]
fn earning(ratio: f64, ttl: Duration) -> RatioBudget {
    RatioBudget::builder()
        .ratio(ratio)
        .ttl(ttl)
        .min_per_sec(0)
        .build()
        .unwrap()
}

/// A budget of a reserve only, `per_sec` retries a second, over a 1 s window (tests).
#[cfg(test)]
fn reserve_only(per_sec: u32) -> RatioBudget {
    RatioBudget::builder()
        .ttl(Duration::from_secs(1))
        .min_per_sec(per_sec)
        .build()
        .unwrap()
}

/// Loom models of the budget (the ring's own are in `backstop::rt::stripe`): `RUSTFLAGS="--cfg loom" cargo test -p backstop
/// --lib loom` (what `.ci/run` does).
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::{sync::Arc, thread};

    fn one_token() -> RatioBudget {
        // A reserve of exactly one retry, no deposits.
        reserve_only(1)
    }

    /// Two threads race for the last token: at most one gets it, and the withdrawal ring then
    /// holds exactly the withdrawals granted (a refused one was taken back).
    #[test]
    fn two_threads_never_both_take_the_last_token() {
        loom::model(|| {
            let budget = Arc::new(one_token());
            let other = budget.clone();
            let t = thread::spawn(move || other.try_withdraw_at(3));
            let mine = budget.try_withdraw_at(3);
            let theirs = t.join().unwrap();
            assert!(!(mine && theirs), "both took the last token");
            let granted = u64::from(mine) + u64::from(theirs);
            assert_eq!(budget.withdrawals.sum(3, SLOTS + 1, true), granted);
        });
    }

    /// Withdrawals in two different slots (a slot boundary between the two threads) are still
    /// seen by each other: the bound holds across slots, not only within one.
    #[test]
    fn the_last_token_is_not_taken_twice_across_a_slot_boundary() {
        loom::model(|| {
            let budget = Arc::new(one_token());
            let other = budget.clone();
            let t = thread::spawn(move || other.try_withdraw_at(3));
            let mine = budget.try_withdraw_at(4);
            assert!(!(mine && t.join().unwrap()));
        });
    }

    /// A deposit racing a withdrawal: the withdrawal is granted only against tokens that
    /// exist, and a deposit is never lost.
    #[test]
    fn a_deposit_racing_a_withdrawal() {
        loom::model(|| {
            let budget = Arc::new(earning(1.0, Duration::from_secs(1)));
            let other = budget.clone();
            let t = thread::spawn(move || other.deposits.add(0, 2, 1));
            let granted = budget.try_withdraw_at(2);
            t.join().unwrap();
            assert_eq!(budget.deposits.sum(2, SLOTS, false), 1);
            let expected = if granted { 0.0 } else { 1.0 };
            assert!((budget.balance_at(2) - expected).abs() < 1e-9);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tokio::time::advance;

    /// Withdraws until refused, at most `limit` times: a budget that never refuses (a broken
    /// count or balance) fails the test's count instead of looping for ever.
    fn drain(b: &RatioBudget, limit: usize) -> usize {
        (0..limit).take_while(|_| b.try_withdraw()).count()
    }

    #[tokio::test(start_paused = true)]
    async fn deposits_expire_after_the_ttl() {
        let b = earning(0.5, Duration::from_secs(1));
        for _ in 0..4 {
            b.record_success();
        }
        assert!((b.balance() - 2.0).abs() < 1e-9);
        advance(Duration::from_millis(900)).await;
        assert!((b.balance() - 2.0).abs() < 1e-9);
        advance(Duration::from_millis(100)).await;
        assert_eq!(b.balance(), 0.0);
        assert!(!b.try_withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn the_reserve_is_always_there() {
        let b = reserve_only(3);
        for _ in 0..3 {
            assert!(b.try_withdraw());
        }
        assert!(!b.try_withdraw());
        // The withdrawals expire one slot later than deposits would.
        advance(Duration::from_millis(1100)).await;
        assert!(b.try_withdraw());
    }

    /// Defect: the reserve was `min_per_sec × ttl` at once, so a cold client sent 107 retries
    /// in 0.56 s. It is a rate: at most 10 in any second of the budget's clock, 10 a second
    /// while the window fills, and at least 10 × 10 / 11 a second after.
    #[tokio::test(start_paused = true)]
    async fn the_reserve_is_a_rate_not_a_bank() {
        let b = RatioBudget::new(); // 10 s, 10 per second
        let mut total = 0;
        for second in 0..33 {
            let mut granted = 0;
            while b.try_withdraw() {
                granted += 1;
                assert!(
                    granted <= 10,
                    "second {second}: more than the reserve's rate"
                );
            }
            if second < 10 {
                assert_eq!(granted, 10, "second {second}");
            }
            total += granted;
            advance(Duration::from_secs(1)).await;
        }
        assert!((300..=330).contains(&total), "{total} retries in 33 s");
    }

    /// What was earned can still be spent at once: the rate limits the reserve only.
    #[tokio::test(start_paused = true)]
    async fn earnings_are_not_rate_limited() {
        let b = RatioBudget::builder().min_per_sec(1).build().unwrap();
        for _ in 0..100 {
            b.record_success();
        }
        // 10 earned, of which one second may spend 2 × its share (2 of 10), + 1 of this
        // second's reserve.
        assert_eq!(drain(&b, 1_000), 3);
    }

    /// At a fault's onset, a healthy window's earnings are spent at most `max_burst` × their
    /// average rate a second, never all at once.
    #[tokio::test(start_paused = true)]
    async fn earnings_are_spent_at_most_twice_as_fast_as_they_came() {
        let b = RatioBudget::builder().min_per_sec(0).build().unwrap();
        // 10 s at 100 successes a second: 100 tokens earned, 10 a second on average.
        for _ in 0..10 {
            for _ in 0..100 {
                b.record_success();
            }
            advance(Duration::from_secs(1)).await;
        }
        advance(Duration::from_millis(1)).await;
        let mut per_second = Vec::new();
        for _ in 0..6 {
            per_second.push(drain(&b, 1_000));
            advance(Duration::from_secs(1)).await;
        }
        // The first slot's deposits have just expired: 90 tokens, 9 a second on average, so
        // 18 in the first second, and as the rest expire with no new earnings, 2 × what is left
        // of the average, until the window's bound ends it.
        assert_eq!(per_second, [18, 16, 14, 12, 0, 0]);
        let rejected = RatioBudget::builder().max_burst(0.5).build().unwrap_err();
        assert_eq!(rejected.knob(), "max_burst");
    }

    /// Defect: 24-bit slot tags aliased after 2^24 slots, so an idle budget resurrected old
    /// deposits (and forgot withdrawals). Laps now have every bit the clock can reach.
    #[tokio::test(start_paused = true)]
    async fn no_idle_period_brings_old_tokens_back() {
        let b = earning(1.0, Duration::from_millis(10));
        for _ in 0..50 {
            b.record_success();
        }
        assert!((b.balance() - 50.0).abs() < 1e-9);
        // Where 24-bit tags came round again (2^24 slots of 1 ms), and far beyond.
        for idle in [1u64 << 24, (1 << 24) * 10, 1 << 40] {
            advance(Duration::from_millis(idle)).await;
            assert_eq!(b.balance(), 0.0, "after {idle} idle slots");
            assert!(!b.try_withdraw());
        }
    }

    #[test]
    fn a_count_never_comes_back_after_a_whole_tag_range() {
        let ring = Counts::new(SLOTS as usize + 1, 1);
        assert!(ring.add(0, 0, 1));
        // Exactly one tag range later, in the same slot: the tag is the same, the count gone.
        let again = (SLOTS + 1) << (64 - COUNT_BITS);
        assert_eq!(ring.sum(again, SLOTS + 1, true), 0);
        assert!(ring.add(0, again, 2));
        assert_eq!(ring.sum(again, 1, false), 2);
        // A write a ring late is refused, not added to the new count.
        assert!(!ring.add(0, again - (SLOTS + 1), 1));
        // A saturated count says so.
        assert!(!ring.add(0, again, Word::<COUNT_BITS>::VALUE_MAX));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refund_gives_the_token_back() {
        let b = reserve_only(1);
        assert!(b.try_withdraw());
        assert!(!b.try_withdraw());
        b.refund();
        assert!(b.try_withdraw());
    }

    /// Real threads hammering one budget: retries granted never exceed the tokens there were.
    #[test]
    fn threads_racing_never_overdraw() {
        for _ in 0..20 {
            let b = std::sync::Arc::new(earning(0.5, Duration::from_secs(10)));
            for _ in 0..20 {
                b.record_success();
            }
            let granted: usize = std::thread::scope(|s| {
                let handles: Vec<_> = (0..4)
                    .map(|_| s.spawn(|| (0..50).filter(|_| b.try_withdraw()).count()))
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).sum()
            });
            assert!(granted <= 10, "{granted} retries from 10 tokens");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_ratio_of_0_6_allows_60_percent_not_100() {
        // A burst as large as the window (10 seconds' share): the window's bound alone.
        let b = RatioBudget::builder()
            .ratio(0.6)
            .min_per_sec(0)
            .max_burst(10.0)
            .build()
            .unwrap();
        for _ in 0..100 {
            b.record_success();
        }
        let granted = (0..200).filter(|_| b.try_withdraw()).count();
        assert_eq!(granted, 60);
    }

    #[test]
    fn configuration_is_validated() {
        for r in [0.0, -1.0, 1.1, f64::NAN] {
            assert_eq!(
                RatioBudget::builder().ratio(r).build().unwrap_err().knob(),
                "ratio"
            );
        }
        assert_eq!(
            RatioBudget::builder()
                .ttl(Duration::from_millis(1))
                .build()
                .unwrap_err()
                .knob(),
            "ttl"
        );
        assert!(RatioBudget::builder().ratio(1.0).build().is_ok());
    }

    /// The limits are inclusive: a `max_burst` of exactly 1 and a `ttl` of exactly 10 ms or one
    /// day are valid; a nanosecond past either end of the `ttl`, or a burst just under 1, is
    /// named.
    #[test]
    fn the_limits_themselves_are_valid() {
        let day = Duration::from_secs(86_400);
        let ns = Duration::from_nanos(1);
        assert!(RatioBudget::builder().max_burst(1.0).build().is_ok());
        assert!(RatioBudget::builder().ttl(day).build().is_ok());
        assert!(
            RatioBudget::builder()
                .ttl(Duration::from_millis(10))
                .build()
                .is_ok()
        );
        let knob = |b: RatioBudgetBuilder| b.build().unwrap_err().knob().to_owned();
        assert_eq!(knob(RatioBudget::builder().max_burst(0.999)), "max_burst");
        assert_eq!(knob(RatioBudget::builder().ttl(day + ns)), "ttl");
        assert_eq!(
            knob(RatioBudget::builder().ttl(Duration::from_millis(10) - ns)),
            "ttl"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Success,
        Retry,
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => Just(Op::Success),
            5 => Just(Op::Retry),
            1 => (1u64..700).prop_map(Op::Advance),
        ]
    }

    proptest! {
        /// Over any window of `ttl`, granted retries ≤ ratio × successes in the window and the
        /// ttl before it, + the reserve.
        #[test]
        fn retries_never_exceed_ratio_times_successes_plus_reserve(
            ops in proptest::collection::vec(op(), 1..400),
            ratio in 0.01f64..=1.0,
            min_per_sec in 0u32..3,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let ttl = Duration::from_secs(1);
                let b = RatioBudget::builder().ratio(ratio).ttl(ttl).min_per_sec(min_per_sec).build().unwrap();
                let start = Instant::now();
                let mut successes = Vec::new();
                let mut retries = Vec::new();
                for op in ops {
                    let now = Instant::now() - start;
                    match op {
                        Op::Success => { b.record_success(); successes.push(now); }
                        Op::Retry => if b.try_withdraw() { retries.push(now); },
                        Op::Advance(ms) => advance(Duration::from_millis(ms)).await,
                    }
                }
                let reserve = f64::from(min_per_sec) * ttl.as_secs_f64();
                for &end in &retries {
                    let in_window = retries.iter().filter(|&&t| t + ttl > end && t <= end).count() as f64;
                    let earned = successes.iter().filter(|&&t| t + 2 * ttl > end && t <= end).count() as f64;
                    prop_assert!(
                        in_window <= ratio * earned + reserve + 1e-9,
                        "{in_window} retries in the window ending {end:?}, {earned} successes"
                    );
                }
                Ok(())
            })?;
        }
    }
}
