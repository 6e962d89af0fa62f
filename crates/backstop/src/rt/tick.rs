//! A value recomputed at most once per tick and cached in one word, for values too costly
//! to compute per call (the throttle's rejection probability, a route's admission need).
//!
//! **Concurrency rule.** The word is `(tick + 1) << 32 | value`: a reader whose tick is not
//! newer than the cached one takes the value with one load; otherwise it computes and
//! publishes with an atomic maximum, so of racing publishers the newest tick wins (an older
//! one never overwrites it), and two publishers of one tick leave one of their values (each
//! computed from that tick's state). Ticks saturate at `u32::MAX - 1`.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

/// One cached `u32` and the tick it was computed at. See the [module docs](self).
#[derive(Debug)]
pub(crate) struct TickCache(AtomicU64);

impl TickCache {
    /// An empty cache: the first [`get`](Self::get) misses.
    pub(crate) fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// The value cached for `tick` or a later one.
    #[inline]
    pub(crate) fn get(&self, tick: u64) -> Option<u32> {
        let word = self.0.load(Ordering::Acquire);
        (word >> 32 > tick.min(u64::from(u32::MAX) - 1)).then_some(word as u32)
    }

    /// Publishes `value` computed at `tick`; returns the value now cached (a newer tick's,
    /// if one won).
    pub(crate) fn publish(&self, tick: u64, value: u32) -> u32 {
        let tag = tick.min(u64::from(u32::MAX) - 1) + 1;
        let word = (tag << 32) | u64::from(value);
        let previous = self.0.fetch_max(word, Ordering::AcqRel);
        if previous > word {
            previous as u32
        } else {
            value
        }
    }
}

impl Default for TickCache {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_value_holds_for_its_tick_and_an_older_one_never_wins() {
        let cache = TickCache::new();
        assert_eq!(cache.get(0), None);
        assert_eq!(cache.publish(0, 7), 7);
        assert_eq!(cache.get(0), Some(7));
        assert_eq!(cache.get(1), None);
        assert_eq!(cache.publish(2, 9), 9);
        assert_eq!(cache.publish(1, 3), 9, "an older tick loses");
        assert_eq!(cache.get(2), Some(9));
        assert_eq!(cache.publish(u64::MAX, 1), 1);
        assert_eq!(cache.get(u64::MAX), Some(1));
    }
}

/// Loom models: `RUSTFLAGS="--cfg loom" cargo test -p backstop --lib loom`.
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::{sync::Arc, thread};

    /// An older tick's publisher racing a newer one's: the newer value stays.
    #[test]
    fn loom_the_newest_tick_wins() {
        loom::model(|| {
            let cache = Arc::new(TickCache::new());
            let old = {
                let c = cache.clone();
                thread::spawn(move || c.publish(1, 10))
            };
            let new = {
                let c = cache.clone();
                thread::spawn(move || c.publish(2, 20))
            };
            let seen_old = old.join().unwrap();
            assert_eq!(new.join().unwrap(), 20);
            assert!(seen_old == 10 || seen_old == 20);
            assert_eq!(cache.get(2), Some(20));
            assert_eq!(cache.get(1), Some(20));
        });
    }

    /// A reader racing a publisher sees nothing or the published value, never a torn one.
    #[test]
    fn loom_a_reader_sees_nothing_or_the_value() {
        loom::model(|| {
            let cache = Arc::new(TickCache::new());
            let writer = {
                let c = cache.clone();
                thread::spawn(move || c.publish(5, 42))
            };
            let seen = cache.get(5);
            assert!(seen.is_none() || seen == Some(42));
            writer.join().unwrap();
            assert_eq!(cache.get(5), Some(42));
        });
    }
}
