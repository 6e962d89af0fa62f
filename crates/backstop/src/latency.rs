//! A latency model of one dependency: what its calls took over the last few seconds, as
//! quantiles, so time bounds can follow measured latency instead of a guess.
//!
//! # What it measures, and how well
//!
//! - **Buckets**: log-linear, 16 per power of two from 64 µs to 134 s (336 buckets). A
//!   quantile is read as its bucket's midpoint, within 3.2 % of any sample in that bucket;
//!   samples below 64 µs read as 66 µs, above 134 s as 130 s.
//! - **Window**: three rotating sub-windows of `window / 2` each (default 30 s → 15 s). A
//!   quantile is taken over the sub-window being filled and the two before it that are still
//!   within `window` of it: the last `window` to `1.5 × window` of samples. Older samples are
//!   forgotten, so the model re-measures by itself after an incident.
//! - **Trust**: a quantile is `None` until the window holds `min_samples` (default 100)
//!   samples. After an idle spell the window is empty, but the sub-windows keep their counts
//!   until a rotation reuses them: the attempt bound reads them with their age, so it can
//!   decay its trust instead of starting over.
//! - **Censored samples**: an attempt that ran out of time is recorded at its bound (it took
//!   at least that), so a slowing dependency raises the quantiles instead of letting the
//!   timeout spiral down.
//! - **Memory**: 3 × 336 counters of 4 bytes and 3 tags: 4 056 bytes, fixed.
//!
//! Time is a parameter (microseconds from any fixed origin), so tests and model checkers drive
//! the model directly.
//!
//! # Concurrency rule
//!
//! Recording is one relaxed atomic add on the sample's bucket, plus one load of the
//! sub-window's tag; no lock. The first recorder of a new sub-window swaps its tag in and
//! clears its counters (each with a swap, so the old epoch's counts never survive; a slot's
//! first sub-window has none to clear); a sample recorded into a reused sub-window while it is
//! being cleared may be lost, and a sample that read the old tag just before may land in the new sub-window. Both
//! are bounded by the calls in flight at the instant of a rotation, every 15 s by default: the
//! quantiles are estimates, never bounds that anything relies on for safety. Readers sum the
//! counters without a lock; a read racing records sees some of them.

use crate::ConfigError;
use std::{fmt, time::Duration};

#[cfg(loom)]
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Sub-buckets per power of two.
const SUB_BITS: u32 = 4;
const SUB: u32 = 1 << SUB_BITS;
/// The first power of two with buckets: 2^6 µs = 64 µs.
const MIN_OCTAVE: u32 = 6;
/// Powers of two with buckets: up to 2^27 µs ≈ 134 s (one under loom, to keep the models
/// within its branch limit: the rotation logic does not depend on the bucket count).
const OCTAVES: u32 = if cfg!(loom) { 1 } else { 21 };
/// Buckets per sub-window.
pub(crate) const BUCKETS: usize = (OCTAVES * SUB) as usize;
/// Rotating sub-windows.
const SLOTS: usize = 3;

/// The bucket of a latency in microseconds.
pub(crate) fn bucket(us: u64) -> usize {
    let us = us.clamp(1 << MIN_OCTAVE, (1 << (MIN_OCTAVE + OCTAVES)) - 1);
    let octave = 63 - us.leading_zeros();
    let sub = (us >> (octave - SUB_BITS)) & u64::from(SUB - 1);
    ((octave - MIN_OCTAVE) * SUB) as usize + sub as usize
}

/// The value a bucket reads as: its midpoint, in microseconds.
pub(crate) fn midpoint(bucket: usize) -> u64 {
    let octave = MIN_OCTAVE + bucket as u32 / SUB;
    let sub = u64::from(bucket as u32 % SUB);
    let width = 1u64 << (octave - SUB_BITS);
    ((u64::from(SUB) + sub) << (octave - SUB_BITS)) + width / 2
}

/// The latency model of one dependency; see the [module docs](self) (its example is the
/// unit test `a_p99_of_one_to_a_hundred_ms`).
pub(crate) struct LatencyModel {
    sub_us: u64,
    min_samples: u64,
    /// Each sub-window's epoch plus one (0: never used).
    tags: [AtomicU64; SLOTS],
    counts: Box<[AtomicU32]>,
}

/// Builds a [`LatencyModel`].
#[derive(Debug, Clone)]
pub(crate) struct LatencyModelBuilder {
    window: Duration,
    min_samples: u64,
}

/// What a dependency's latency model holds at one instant (the model: the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LatencySnapshot {
    /// Samples in the window.
    pub count: u64,
    /// The median, once the model is trusted.
    pub p50: Option<Duration>,
    /// The 90th percentile, once trusted.
    pub p90: Option<Duration>,
    /// The 99th percentile, once trusted.
    pub p99: Option<Duration>,
    /// The 99.9th percentile, once trusted.
    pub p999: Option<Duration>,
    /// How far back the samples go (between `window` and `1.5 × window`).
    pub window: Duration,
}

impl LatencyModel {
    /// A model with the defaults: a 30 s window, trusted from 100 samples.
    pub(crate) fn new() -> Self {
        Self::builder().build().expect("the defaults are valid")
    }

    /// A builder for a tuned model.
    pub(crate) fn builder() -> LatencyModelBuilder {
        LatencyModelBuilder {
            window: Duration::from_secs(30),
            min_samples: 100,
        }
    }

    /// An empty model with this one's window and `min_samples` (a keyed attempt layer builds
    /// each key's model from its own this way).
    pub(crate) fn fresh(&self) -> LatencyModel {
        LatencyModel {
            sub_us: self.sub_us,
            min_samples: self.min_samples,
            tags: std::array::from_fn(|_| AtomicU64::new(0)),
            counts: (0..SLOTS * BUCKETS).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Records one call that took `latency`, at `now_us` microseconds from the caller's origin.
    /// A call that ran out of time is recorded at its bound.
    pub(crate) fn record(&self, latency: Duration, now_us: u64) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let epoch = now_us / self.sub_us;
        let slot = (epoch % SLOTS as u64) as usize;
        let tag = &self.tags[slot];
        let current = tag.load(Ordering::Acquire);
        if current != epoch + 1 {
            if current > epoch + 1 {
                return; // a late sample of a sub-window already reused: dropped
            }
            // A slot never used (tag 0) holds no counts: nothing to clear, so the first
            // sub-window loses no sample to a clear racing its other recorders.
            if tag
                .compare_exchange(current, epoch + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
                && current != 0
            {
                for count in self.slot_counts(slot) {
                    count.swap(0, Ordering::Relaxed);
                }
            }
        }
        self.slot_counts(slot)[bucket(us)].fetch_add(1, Ordering::Relaxed);
    }

    fn slot_counts(&self, slot: usize) -> &[AtomicU32] {
        &self.counts[slot * BUCKETS..(slot + 1) * BUCKETS]
    }

    /// The sub-windows still in the window at `now_us`.
    fn live_slots(&self, now_us: u64) -> impl Iterator<Item = usize> + '_ {
        let epoch = now_us / self.sub_us;
        (0..SLOTS).filter(move |&slot| {
            let tag = self.tags[slot].load(Ordering::Acquire);
            tag != 0 && tag - 1 <= epoch && tag - 1 + (SLOTS as u64 - 1) >= epoch
        })
    }

    /// The window's counts, bucket by bucket, and their total.
    fn histogram(&self, now_us: u64) -> ([u32; BUCKETS], u64) {
        let mut sum = [0u32; BUCKETS];
        let mut total = 0u64;
        for slot in self.live_slots(now_us) {
            for (acc, count) in sum.iter_mut().zip(self.slot_counts(slot)) {
                let n = count.load(Ordering::Relaxed);
                *acc = acc.saturating_add(n);
                total += u64::from(n);
            }
        }
        (sum, total)
    }

    /// The `q` quantile (in [0, 1]) of the window at `now_us`; `None` until the window holds
    /// `min_samples` samples.
    pub(crate) fn quantile(&self, q: f64, now_us: u64) -> Option<Duration> {
        let (hist, total) = self.histogram(now_us);
        quantile_of(&hist, total, q, self.min_samples)
    }

    /// The `q` quantile as [`quantile`](Self::quantile) reads it, with how stale it is: zero
    /// while the window holds `min_samples`; otherwise (an idle spell emptied the window) the
    /// quantile of every sub-window that still holds samples, however old (a sub-window keeps
    /// its counts until a rotation reuses it), and how long ago the newest of the ones that
    /// left the window did. `None` only when even those hold fewer than `min_samples` (a model
    /// never trusted). What decays trust instead of discarding it: the attempt bound widens a
    /// stale quantile with its age (see `backstop::client::attempt`).
    pub(crate) fn quantile_aged(&self, q: f64, now_us: u64) -> Option<(Duration, Duration)> {
        let (hist, total) = self.histogram(now_us);
        if let Some(q) = quantile_of(&hist, total, q, self.min_samples) {
            return Some((q, Duration::ZERO));
        }
        let epoch = now_us / self.sub_us;
        let mut hist = [0u32; BUCKETS];
        let mut total = 0u64;
        let mut left = None;
        for slot in 0..SLOTS {
            let tag = self.tags[slot].load(Ordering::Acquire);
            if tag == 0 || tag - 1 > epoch {
                continue;
            }
            if tag - 1 + (SLOTS as u64 - 1) < epoch {
                // Left the window when the epoch `SLOTS` after its own began.
                let at = (tag - 1 + SLOTS as u64).saturating_mul(self.sub_us);
                left = left.max(Some(at));
            }
            for (acc, count) in hist.iter_mut().zip(self.slot_counts(slot)) {
                let n = count.load(Ordering::Relaxed);
                *acc = acc.saturating_add(n);
                total += u64::from(n);
            }
        }
        let q = quantile_of(&hist, total, q, self.min_samples)?;
        let age = Duration::from_micros(now_us.saturating_sub(left?));
        Some((q, age))
    }

    /// The upper edge of the bucket that holds the `q` quantile: no sample of that bucket or
    /// below is later than it, so at most `1 − q` of the window's samples are (up to 6.25 %
    /// above the quantile; `quantile` reads the bucket's midpoint, which may be below the
    /// samples it stands for). What a hedge delay needs: a hedge after it goes for no more
    /// than `1 − q` of calls. `None` until the model is trusted.
    pub(crate) fn quantile_ceiling(&self, q: f64, now_us: u64) -> Option<Duration> {
        let (hist, total) = self.histogram(now_us);
        let bucket = bucket_of(&hist, total, q, self.min_samples)?;
        Some(Duration::from_micros(upper_edge(bucket)))
    }

    /// The window's count and quantiles at `now_us`.
    pub(crate) fn snapshot(&self, now_us: u64) -> LatencySnapshot {
        let (hist, total) = self.histogram(now_us);
        let q = |q| quantile_of(&hist, total, q, self.min_samples);
        LatencySnapshot {
            count: total,
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            p999: q(0.999),
            window: Duration::from_micros(self.sub_us * (SLOTS as u64 - 1)),
        }
    }

    /// Bytes of counters and tags: fixed when the model is built (the module docs' figure,
    /// which a unit test checks).
    #[cfg(test)]
    pub(crate) fn shared_bytes(&self) -> usize {
        std::mem::size_of_val(&self.tags) + self.counts.len() * std::mem::size_of::<AtomicU32>()
    }
}

fn quantile_of(hist: &[u32; BUCKETS], total: u64, q: f64, min: u64) -> Option<Duration> {
    bucket_of(hist, total, q, min).map(|b| Duration::from_micros(midpoint(b)))
}

/// The bucket of the smallest sample with at least `q × total` samples at or below it.
fn bucket_of(hist: &[u32; BUCKETS], total: u64, q: f64, min: u64) -> Option<usize> {
    if total == 0 || total < min {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0u64;
    for (b, &n) in hist.iter().enumerate() {
        seen += u64::from(n);
        if seen >= rank {
            return Some(b);
        }
    }
    Some(BUCKETS - 1)
}

/// The first value past a bucket, in microseconds.
pub(crate) fn upper_edge(bucket: usize) -> u64 {
    let octave = MIN_OCTAVE + bucket as u32 / SUB;
    let sub = u64::from(bucket as u32 % SUB);
    (u64::from(SUB) + sub + 1) << (octave - SUB_BITS)
}

impl Default for LatencyModel {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LatencyModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LatencyModel")
            .field("window", &Duration::from_micros(self.sub_us * 2))
            .field("min_samples", &self.min_samples)
            .finish_non_exhaustive()
    }
}

impl LatencyModelBuilder {
    /// How long samples count (default 30 s; 1 s to 1 hour): quantiles cover the last
    /// `window` to `1.5 × window`.
    #[must_use]
    pub(crate) fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Samples the window must hold before quantiles are given (default 100; at least 1).
    #[must_use]
    pub(crate) fn min_samples(mut self, n: u64) -> Self {
        self.min_samples = n;
        self
    }

    /// Validates the configuration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `window` (outside 1 s to 1 hour) or `min_samples` (zero).
    pub(crate) fn build(self) -> Result<LatencyModel, ConfigError> {
        if self.window < Duration::from_secs(1) || self.window > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "window",
                format!("must be between 1s and 1h, got {:?}", self.window),
            ));
        }
        if self.min_samples == 0 {
            return Err(ConfigError::new("min_samples", "must be at least 1"));
        }
        Ok(LatencyModel {
            sub_us: (self.window.as_micros() / 2) as u64,
            min_samples: self.min_samples,
            tags: std::array::from_fn(|_| AtomicU64::new(0)),
            counts: (0..SLOTS * BUCKETS).map(|_| AtomicU32::new(0)).collect(),
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    /// The model's former doc example: a p99 of samples from 1 ms to 100 ms.
    #[test]
    fn a_p99_of_one_to_a_hundred_ms() {
        let model = super::LatencyModel::new();
        for i in 0..1000u64 {
            // 1 ms to 100 ms, one sample every millisecond of a 1 s run.
            let latency = std::time::Duration::from_micros(1_000 + (i % 100) * 1_000);
            model.record(latency, i * 1_000);
        }
        let p99 = model.quantile(0.99, 1_000_000).unwrap();
        let ms = std::time::Duration::from_millis;
        assert!(p99 >= ms(96) && p99 <= ms(103), "{p99:?}");
        assert_eq!(model.snapshot(1_000_000).count, 1000);
    }

    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000;

    #[test]
    fn buckets_cover_the_range_in_order_with_bounded_error() {
        let mut last = 0;
        for us in (64..(1u64 << 27)).step_by(997) {
            let b = bucket(us);
            assert!(b >= last, "{us}");
            last = b;
            let mid = midpoint(b) as f64;
            let err = (mid - us as f64).abs() / us as f64;
            assert!(err <= 0.032, "{us} µs reads as {mid}: {err}");
        }
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn a_bucket_upper_edge_is_past_every_value_in_it_and_starts_the_next() {
        for us in (64..(1u64 << 27) - 1).step_by(991) {
            let b = bucket(us);
            assert!(upper_edge(b) > us, "{us}");
            assert!(upper_edge(b) as f64 <= us as f64 * 1.0625 + 1.0, "{us}");
            assert_eq!(bucket(upper_edge(b)), (b + 1).min(BUCKETS - 1), "{us}");
        }
    }

    /// 95 % of calls at 10 ms, 5 % at 1 s: p95's midpoint reads just under 10 ms, below
    /// the samples it stands for; its ceiling is past all of them and below the slow ones.
    #[test]
    fn the_quantile_ceiling_is_past_the_samples_of_its_quantile() {
        let m = LatencyModel::new();
        for i in 0..1_000u64 {
            let latency = if i % 20 == 0 { 1_000 * MS } else { 10 * MS };
            m.record(Duration::from_micros(latency), i * MS);
        }
        let mid = m.quantile(0.95, 1_000 * MS).unwrap();
        let ceiling = m.quantile_ceiling(0.95, 1_000 * MS).unwrap();
        assert!(mid < Duration::from_millis(10), "{mid:?}");
        assert!(ceiling > Duration::from_millis(10), "{ceiling:?}");
        assert!(ceiling <= Duration::from_micros(10_625), "{ceiling:?}");
        assert!(LatencyModel::new().quantile_ceiling(0.5, 0).is_none());
    }

    #[test]
    fn it_is_trusted_only_from_min_samples() {
        let m = LatencyModel::builder().min_samples(10).build().unwrap();
        for i in 0..9 {
            m.record(Duration::from_millis(5), i);
        }
        assert_eq!(m.quantile(0.5, 10), None);
        m.record(Duration::from_millis(5), 10);
        let p50 = m.quantile(0.5, 10).unwrap();
        assert!(p50.abs_diff(Duration::from_millis(5)) < Duration::from_micros(160));
    }

    /// After a shift the old samples age out: within 1.5 windows the quantiles follow the new
    /// latency, without a restart.
    #[test]
    fn it_re_measures_after_a_shift() {
        let m = LatencyModel::new(); // 30 s window, 15 s sub-windows
        let mut now = 0;
        while now < 60_000 * MS {
            m.record(Duration::from_millis(50), now);
            now += 10 * MS;
        }
        let p99 = m.quantile(0.99, now).unwrap();
        assert!(p99.abs_diff(Duration::from_millis(50)) < Duration::from_millis(2));
        // Latency moves to 800 ms.
        let shift = now;
        while now < shift + 45_000 * MS {
            m.record(Duration::from_millis(800), now);
            now += 10 * MS;
        }
        let p50 = m.quantile(0.5, now).unwrap();
        assert!(
            p50.abs_diff(Duration::from_millis(800)) < Duration::from_millis(26),
            "{p50:?}"
        );
        // And an idle model forgets everything.
        assert_eq!(m.snapshot(now + 60_000 * MS).count, 0);
    }

    /// Issue 25, 4: an idle spell empties the window, but not the sub-windows: the last
    /// quantile is still there, with its age since it left the window.
    #[test]
    fn an_idle_model_keeps_its_last_quantile_with_its_age() {
        let m = LatencyModel::new(); // 30 s window, 15 s sub-windows
        for i in 0..2_000u64 {
            m.record(Duration::from_millis(20), i * MS);
        }
        let fresh = m.quantile_aged(0.99, 2_000 * MS).unwrap();
        assert_eq!(fresh.1, Duration::ZERO);
        // Samples of sub-window 0 count until 45 s, then the window is empty.
        assert!(m.quantile(0.99, 44_000 * MS).is_some());
        assert_eq!(m.quantile(0.99, 45_000 * MS), None);
        let (q, age) = m.quantile_aged(0.99, 105_000 * MS).unwrap();
        assert_eq!(q, fresh.0);
        assert_eq!(age, Duration::from_secs(60));
        // Traffic again: one sub-window is reused, the others still speak until trusted.
        m.record(Duration::from_millis(20), 106_000 * MS);
        let (_, age) = m.quantile_aged(0.99, 106_000 * MS).unwrap();
        assert_eq!(age, Duration::from_secs(61));
        // A model never trusted has nothing to recall.
        let cold = LatencyModel::new();
        cold.record(Duration::from_millis(20), 0);
        assert_eq!(cold.quantile_aged(0.99, 100_000 * MS), None);
    }

    #[test]
    fn censored_samples_raise_the_quantile() {
        let m = LatencyModel::builder().min_samples(1).build().unwrap();
        for i in 0..98 {
            m.record(Duration::from_millis(10), i);
        }
        // Two attempts ran out of time at a 300 ms bound: recorded at it.
        m.record(Duration::from_millis(300), 98);
        m.record(Duration::from_millis(300), 99);
        let p99 = m.quantile(0.99, 100).unwrap();
        assert!(p99 >= Duration::from_millis(290), "{p99:?}");
    }

    #[test]
    fn memory_is_fixed_and_small() {
        let m = LatencyModel::new();
        assert_eq!(m.shared_bytes(), 4_056);
        for i in 0..100_000u64 {
            m.record(Duration::from_micros(i), i * 10);
        }
        assert_eq!(m.shared_bytes(), 4_056);
    }

    #[test]
    fn configuration_is_validated() {
        for w in [Duration::from_millis(999), Duration::from_secs(3601)] {
            let err = LatencyModel::builder().window(w).build().unwrap_err();
            assert_eq!(err.knob(), "window");
        }
        let err = LatencyModel::builder().min_samples(0).build().unwrap_err();
        assert_eq!(err.knob(), "min_samples");
    }

    #[test]
    fn threads_recording_at_once_lose_nothing_within_a_sub_window() {
        let m = LatencyModel::builder().min_samples(1).build().unwrap();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let m = &m;
                s.spawn(move || {
                    for i in 0..10_000u64 {
                        m.record(Duration::from_micros(100 + (i + t) % 5_000), 1);
                    }
                });
            }
        });
        assert_eq!(m.snapshot(1).count, 40_000);
    }

    proptest! {
        /// Quantiles of random data within 5 % of the exact ones (3.2 % is the bucket bound;
        /// the rest is the rank convention).
        #[test]
        fn quantiles_match_exact_ones(
            samples in proptest::collection::vec(100u64..100_000_000, 200..2000),
            q in prop::sample::select(vec![0.5, 0.9, 0.99, 0.999]),
        ) {
            let m = LatencyModel::builder().min_samples(1).build().unwrap();
            for &us in &samples {
                m.record(Duration::from_micros(us), 0);
            }
            let mut sorted = samples.clone();
            sorted.sort_unstable();
            let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
            let exact = sorted[rank - 1] as f64;
            let got = m.quantile(q, 0).unwrap().as_micros() as f64;
            prop_assert!((got - exact).abs() / exact <= 0.05, "q {q}: {got} against {exact}");
        }
    }
}

/// Loom model of recording across a rotation: `RUSTFLAGS="--cfg loom" cargo test -p
/// backstop --lib loom` (what `.ci/run` does).
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::{sync::Arc, thread};

    /// Two threads record into the next sub-window while it rotates: neither panics, the
    /// window holds at most the two samples, and the tag is the new epoch's.
    #[test]
    fn records_racing_a_rotation() {
        loom::model(|| {
            let m = Arc::new(LatencyModel::builder().min_samples(1).build().unwrap());
            let sub = m.sub_us;
            m.record(Duration::from_millis(1), 0);
            let other = m.clone();
            let t = thread::spawn(move || other.record(Duration::from_millis(2), 3 * sub));
            m.record(Duration::from_millis(3), 3 * sub);
            t.join().unwrap();
            assert_eq!(m.tags[0].load(Ordering::Acquire), 4);
            let count = m.snapshot(3 * sub).count;
            assert!((1..=2).contains(&count), "{count}");
        });
    }

    /// Two threads in one sub-window: both samples counted.
    #[test]
    fn records_in_one_sub_window_are_never_lost() {
        loom::model(|| {
            let m = Arc::new(LatencyModel::builder().min_samples(1).build().unwrap());
            m.record(Duration::from_millis(1), 0);
            let other = m.clone();
            let t = thread::spawn(move || other.record(Duration::from_millis(2), 1));
            m.record(Duration::from_millis(2), 1);
            t.join().unwrap();
            assert_eq!(m.snapshot(1).count, 3);
        });
    }
}
