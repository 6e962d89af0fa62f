//! Sliding windows of call outcomes, with memory fixed at construction.
//!
//! Both windows are rings of atomic words, so recording an outcome never takes a lock and the
//! memory a breaker uses does not grow with traffic:
//!
//! - [`TimeRing`]: the calls of the last `window`, in `buckets` buckets of `window / buckets`.
//!   Each bucket is one 64-bit word `(epoch tag, calls, failures, slow)` of a
//!   [`backstop::rt::stripe::Ring`](crate::rt::stripe::Ring) (the retry budget's ring too): writing to a bucket whose
//!   tag is stale resets it in the same compare-and-swap. The window slides one bucket at a
//!   time: it covers between `window - window / buckets` and `window` of history. The ring is
//!   striped: each thread writes to its own copy of the buckets (on cache lines of its own),
//!   and readers add the stripes up, so threads recording at once do not fight over one cache
//!   line.
//! - [`CountRing`]: exactly the last `n` calls, one byte each, plus one word holding the
//!   totals, updated with the slot so that rates are read in O(1).

use crate::client::breaker::sync::{AtomicU8, AtomicU64, Ordering};
use crate::rt::stripe::Ring;
use std::fmt;

/// Calls, failures and slow calls seen by a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) calls: u64,
    pub(crate) failures: u64,
    pub(crate) slow: u64,
}

/// A window of either kind.
#[derive(Debug)]
pub(crate) enum Window {
    Time(TimeRing),
    Count(CountRing),
}

impl Window {
    /// Records one call at `now` (microseconds since the breaker started), from the caller's
    /// `stripe`.
    pub(crate) fn record(&self, stripe: usize, now: u64, failure: bool, slow: bool) {
        match self {
            Window::Time(ring) => ring.record(stripe, now, failure, slow),
            Window::Count(ring) => ring.record(failure, slow),
        }
    }

    /// What the window holds at `now`.
    pub(crate) fn counts(&self, now: u64) -> Counts {
        match self {
            Window::Time(ring) => ring.counts(now),
            Window::Count(ring) => ring.counts(),
        }
    }

    /// Forgets every call.
    pub(crate) fn clear(&self) {
        match self {
            Window::Time(ring) => ring.clear(),
            Window::Count(ring) => ring.clear(),
        }
    }

    /// Whether reading the window needs the clock.
    pub(crate) fn needs_clock(&self) -> bool {
        matches!(self, Window::Time(_))
    }

    /// Bytes of shared state the window holds (its words and slots).
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Window::Time(ring) => ring.ring.heap_bytes(),
            Window::Count(ring) => ring.slots.len() * std::mem::size_of::<AtomicU8>(),
        }
    }
}

const FIELD_BITS: u32 = 16;
const FIELD_MAX: u64 = (1 << FIELD_BITS) - 1;
const CALLS_SHIFT: u32 = 32;
const FAILURES_SHIFT: u32 = 16;

/// The time window: a [`Ring`] of buckets whose values are `calls:16 | failures:16 | slow:16`
/// (the ring's tag takes the top 16 bits of each word), one copy per stripe.
///
/// A bucket counts at most 65 535 calls per stripe; further calls in the same bucket are not
/// sampled (the rates stay those of the first 65 535 calls of that bucket, which at the
/// default 1 s buckets means more than 65 000 calls per second on one core through one
/// breaker). The 16-bit tags would repeat every 65 536 buckets (18 hours at 1 s); the ring
/// sweeps buckets too old to count before that can happen, so an idle bucket never comes
/// back.
pub(crate) struct TimeRing {
    bucket_us: u64,
    ring: Ring<{ 3 * FIELD_BITS }>,
}

impl TimeRing {
    pub(crate) fn new(bucket_us: u64, buckets: usize, stripes: usize) -> Self {
        let bucket_us = bucket_us.max(1);
        Self {
            bucket_us,
            ring: Ring::new(buckets, stripes),
        }
    }

    fn record(&self, stripe: usize, now: u64, failure: bool, slow: bool) {
        let add = (1 << CALLS_SHIFT) | (u64::from(failure) << FAILURES_SHIFT) | u64::from(slow);
        // A full bucket declines: this call is not sampled. A late one (its clock read a lap
        // ago) is dropped too.
        self.ring.update(stripe, now / self.bucket_us, |value| {
            ((value >> CALLS_SHIFT) & FIELD_MAX < FIELD_MAX).then_some(value + add)
        });
    }

    fn counts(&self, now: u64) -> Counts {
        let span = self.ring.len() as u64;
        self.ring.fold(
            now / self.bucket_us,
            span,
            false,
            Counts::default(),
            |mut counts, value| {
                counts.calls += (value >> CALLS_SHIFT) & FIELD_MAX;
                counts.failures += (value >> FAILURES_SHIFT) & FIELD_MAX;
                counts.slow += value & FIELD_MAX;
                counts
            },
        )
    }

    fn clear(&self) {
        self.ring.clear();
    }
}

impl fmt::Debug for TimeRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimeRing")
            .field("bucket_us", &self.bucket_us)
            .field("buckets", &self.ring.len())
            .field("stripes", &self.ring.stripes())
            .finish()
    }
}

/// The largest count window: its totals must fit the biased 21-bit fields below.
pub(crate) const MAX_COUNT_WINDOW: u32 = 100_000;

const TOTAL_BITS: u32 = 21;
const TOTAL_MASK: u64 = (1 << TOTAL_BITS) - 1;
/// Each total is stored plus this bias, so that a slot's removal landing before its own
/// addition (two threads a full ring apart) dips below the bias, never below zero into the
/// next field.
const BIAS: u64 = 1 << 19;
const BIASED_ZERO: u64 = BIAS | (BIAS << TOTAL_BITS) | (BIAS << (2 * TOTAL_BITS));

const SLOT_CALL: u8 = 1;
const SLOT_FAILURE: u8 = 2;
const SLOT_SLOW: u8 = 4;

/// The count window: the last `n` calls, one byte each (`call | failure | slow` bits), and
/// their totals in one word (`calls:21 | failures:21 | slow:21`, each biased).
pub(crate) struct CountRing {
    cursor: AtomicU64,
    slots: Box<[AtomicU8]>,
    totals: AtomicU64,
}

impl CountRing {
    pub(crate) fn new(n: usize) -> Self {
        Self {
            cursor: AtomicU64::new(0),
            slots: (0..n).map(|_| AtomicU8::new(0)).collect(),
            totals: AtomicU64::new(BIASED_ZERO),
        }
    }

    /// The totals of one slot, as a word to add.
    fn weight(slot: u8) -> u64 {
        u64::from(slot & SLOT_CALL)
            | (u64::from((slot & SLOT_FAILURE) >> 1) << TOTAL_BITS)
            | (u64::from((slot & SLOT_SLOW) >> 2) << (2 * TOTAL_BITS))
    }

    pub(crate) fn record(&self, failure: bool, slow: bool) {
        let at = self.cursor.fetch_add(1, Ordering::Relaxed) % self.slots.len() as u64;
        let new = SLOT_CALL | (u8::from(failure) * SLOT_FAILURE) | (u8::from(slow) * SLOT_SLOW);
        let old = self.slots[at as usize].swap(new, Ordering::AcqRel);
        if old != new {
            // Wrapping arithmetic on the whole word: each field moves by -1, 0 or +1 and,
            // biased, never crosses into its neighbour.
            let delta = Self::weight(new).wrapping_sub(Self::weight(old));
            self.totals.fetch_add(delta, Ordering::AcqRel);
        }
    }

    pub(crate) fn counts(&self) -> Counts {
        let word = self.totals.load(Ordering::Acquire);
        let field = |shift: u32| ((word >> shift) & TOTAL_MASK).saturating_sub(BIAS);
        Counts {
            calls: field(0),
            failures: field(TOTAL_BITS),
            slow: field(2 * TOTAL_BITS),
        }
    }

    /// The counts summed slot by slot, to check the totals against (loom models).
    #[cfg(loom)]
    pub(crate) fn slot_counts(&self) -> Counts {
        let mut counts = Counts::default();
        for slot in self.slots.iter() {
            let v = slot.load(Ordering::Acquire);
            counts.calls += u64::from(v & SLOT_CALL);
            counts.failures += u64::from((v & SLOT_FAILURE) >> 1);
            counts.slow += u64::from((v & SLOT_SLOW) >> 2);
        }
        counts
    }

    /// Empties every slot. Each slot is swapped out and its own weight taken off the totals,
    /// exactly as `record` does, so a record racing the clear is either wiped with its slot
    /// or kept whole: the totals always come back to the sum of the slots. (Storing zeros
    /// over both let a racing record add its weight to totals whose slot had just been
    /// zeroed: a phantom call counted until the next clear.)
    pub(crate) fn clear(&self) {
        for slot in self.slots.iter() {
            let old = slot.swap(0, Ordering::AcqRel);
            if old != 0 {
                self.totals
                    .fetch_add(0u64.wrapping_sub(Self::weight(old)), Ordering::AcqRel);
            }
        }
    }
}

impl fmt::Debug for CountRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountRing")
            .field("slots", &self.slots.len())
            .field("counts", &self.counts())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000;

    #[test]
    fn time_ring_slides_one_bucket_at_a_time() {
        let ring = TimeRing::new(S, 10, 3); // 10 s in 1 s buckets, 3 stripes
        ring.record(0, 0, true, false);
        ring.record(1, S / 2, false, true);
        ring.record(2, 5 * S, false, false);
        assert_eq!(
            ring.counts(9 * S),
            Counts {
                calls: 3,
                failures: 1,
                slow: 1
            }
        );
        // At 10 s the first bucket (0..1 s) has left the window.
        assert_eq!(ring.counts(10 * S).calls, 1);
        assert_eq!(ring.counts(15 * S).calls, 0);
        // A stale bucket is reset by the next write to it.
        ring.record(4, 20 * S, true, true);
        assert_eq!(
            ring.counts(20 * S),
            Counts {
                calls: 1,
                failures: 1,
                slow: 1
            }
        );
        ring.clear();
        assert_eq!(ring.counts(20 * S), Counts::default());
    }

    #[test]
    fn a_full_bucket_stops_sampling() {
        let ring = TimeRing::new(S, 1, 1);
        for i in 0..FIELD_MAX + 10 {
            ring.record(0, 0, i % 2 == 0, false);
        }
        let counts = ring.counts(0);
        assert_eq!(counts.calls, FIELD_MAX);
        assert_eq!(counts.failures, FIELD_MAX.div_ceil(2));
    }

    #[test]
    fn count_ring_is_the_last_n_calls() {
        // tower-resilience's count window never slides; this one does.
        let ring = CountRing::new(4);
        for _ in 0..1000 {
            ring.record(false, false);
        }
        assert_eq!(ring.counts().failures, 0);
        for _ in 0..4 {
            ring.record(true, false);
        }
        assert_eq!(
            ring.counts(),
            Counts {
                calls: 4,
                failures: 4,
                slow: 0
            }
        );
        ring.clear();
        assert_eq!(ring.counts(), Counts::default());
    }

    /// The bias, operations interleaved by hand: a slot's removal that lands before its own
    /// addition (two threads a full ring apart) dips its field below the bias, where it reads
    /// as zero and leaves the other fields alone; once the addition lands, the totals are the
    /// slot's again.
    #[test]
    fn a_removal_before_its_addition_stays_in_its_field() {
        let ring = CountRing::new(1);
        // Thread A takes the slot and stores a failure, but has not yet added its weight.
        let a = SLOT_CALL | SLOT_FAILURE;
        let at = ring.cursor.fetch_add(1, Ordering::Relaxed) as usize % ring.slots.len();
        assert_eq!(ring.slots[at].swap(a, Ordering::AcqRel), 0);
        // Thread B, a lap later, replaces A's failure with a success: failures dip to -1.
        ring.record(false, false);
        assert_eq!(ring.counts(), Counts::default());
        // A's addition lands.
        ring.totals
            .fetch_add(CountRing::weight(a), Ordering::AcqRel);
        assert_eq!(
            ring.counts(),
            Counts {
                calls: 1,
                failures: 0,
                slow: 0
            }
        );
    }

    /// The `Window` a machine holds passes each call to its ring: a time window's records go
    /// to the bucket of their time (and need the clock), a count window's to its last `n`
    /// calls (no clock); a clear empties either. A count window's memory is its byte per slot.
    #[test]
    fn a_window_passes_calls_to_its_ring() {
        let time = Window::Time(TimeRing::new(S, 10, 2)); // 10 s in 1 s buckets
        assert!(time.needs_clock());
        time.record(0, 0, true, false);
        time.record(1, 3 * S, false, true);
        assert_eq!(
            time.counts(9 * S),
            Counts {
                calls: 2,
                failures: 1,
                slow: 1
            }
        );
        // At 10 s the bucket of 0 s has left; the call of 3 s is still there.
        assert_eq!(time.counts(10 * S).failures, 0);
        assert_eq!(time.counts(10 * S).calls, 1);
        assert!(time.heap_bytes() >= 10 * 2 * std::mem::size_of::<u64>());
        time.clear();
        assert_eq!(time.counts(9 * S), Counts::default());

        let count = Window::Count(CountRing::new(10));
        assert!(!count.needs_clock());
        assert_eq!(count.heap_bytes(), 10);
        count.record(0, 0, true, true);
        count.record(0, 0, false, false);
        assert_eq!(
            count.counts(0),
            Counts {
                calls: 2,
                failures: 1,
                slow: 1
            }
        );
        count.clear();
        assert_eq!(count.counts(0), Counts::default());
    }

    /// The rings debug as their shape and, for a count ring, its totals.
    #[test]
    fn the_rings_debug_as_their_shape() {
        let time = TimeRing::new(S, 10, 3);
        assert_eq!(
            format!("{time:?}"),
            "TimeRing { bucket_us: 1000000, buckets: 10, stripes: 3 }"
        );
        let count = CountRing::new(4);
        count.record(true, false);
        assert_eq!(
            format!("{count:?}"),
            "CountRing { slots: 4, counts: Counts { calls: 1, failures: 1, slow: 0 } }"
        );
    }

    proptest! {
        #[test]
        fn count_ring_matches_a_list(n in 1usize..20, calls in proptest::collection::vec((any::<bool>(), any::<bool>()), 0..200)) {
            let ring = CountRing::new(n);
            for &(failure, slow) in &calls {
                ring.record(failure, slow);
            }
            let last = &calls[calls.len().saturating_sub(n)..];
            let want = Counts {
                calls: last.len() as u64,
                failures: last.iter().filter(|c| c.0).count() as u64,
                slow: last.iter().filter(|c| c.1).count() as u64,
            };
            prop_assert_eq!(ring.counts(), want);
        }

        #[test]
        fn time_ring_matches_a_list(
            buckets in 1usize..12,
            stripes in 1usize..5,
            steps in proptest::collection::vec((0u64..3_000_000, any::<bool>(), any::<bool>(), 0usize..8), 0..200),
        ) {
            let bucket_us = 1_000_000;
            let ring = TimeRing::new(bucket_us, buckets, stripes);
            let mut now = 0;
            let mut seen = Vec::new();
            for &(dt, failure, slow, stripe) in &steps {
                now += dt;
                ring.record(stripe, now, failure, slow);
                seen.push((now / bucket_us, failure, slow));
                let epoch = now / bucket_us;
                let live: Vec<_> = seen.iter().filter(|c| c.0 + buckets as u64 > epoch).collect();
                let want = Counts {
                    calls: live.len() as u64,
                    failures: live.iter().filter(|c| c.1).count() as u64,
                    slow: live.iter().filter(|c| c.2).count() as u64,
                };
                prop_assert_eq!(ring.counts(now), want);
            }
        }
    }
}
