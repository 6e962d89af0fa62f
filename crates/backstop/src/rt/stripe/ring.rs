//! The striped, epoch-tagged ring behind the breaker's time window and the retry budget.
//!
//! Time is cut into *epochs* (a bucket of the window, a slot of the budget); the ring has one
//! slot per epoch of the last `len`, reused every `len` epochs. Each slot is one atomic `u64`
//! packed by [`Word`]: the epoch's tag in the high bits, the caller's value in the low
//! `VALUE_BITS`. Writing to a slot whose tag is stale resets it in the same
//! compare-and-swap, so no write ever takes a lock. The ring is striped: each thread writes
//! to its stripe's copy of the slots (on cache lines of its own) and readers add the copies
//! up.
//!
//! **Tags never alias.** A tag is the epoch modulo `2^(64 - VALUE_BITS)`, read back as the
//! epoch within half that range of the caller's. To keep every slot within that range, the
//! ring *sweeps*: the first call of each new era of `2^(62 - VALUE_BITS)` epochs takes a lock
//! (the only one, once per era: every 4.5 hours for the breaker's 16-bit tags and 1 s
//! buckets, every 34 years for the budget's 32-bit tags and 1 s slots) and empties every slot
//! too old to be in any window. So no slot lives long enough for its tag to come round
//! again, however long the ring sits idle in between: a window that saw traffic once and
//! then only at one phase of the ring never reads the old count back.
//!
//! **Concurrency rule.** Writes and reads are lock-free; a slot update is one
//! compare-and-swap loop on its word, so two threads adding to one slot are never lost, and
//! an add racing the slot's reuse either lands first (then reset by the later epoch) or is
//! refused as [`Update::Late`] (its caller read the clock `len` epochs ago): a value never
//! moves from one epoch to another. A call of a new era sweeps before it reads or writes (it
//! waits for another thread's sweep under the lock, or sees the new era published after the
//! sweep with release/acquire ordering). The one assumption: no thread holds a clock reading
//! for a whole era before using it.

use crate::rt::sync::{AtomicU64, Mutex, Ordering};
use std::fmt;

/// The packing of a slot word: `epoch tag : 64 - VALUE_BITS | value : VALUE_BITS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word<const VALUE_BITS: u32>;

impl<const VALUE_BITS: u32> Word<VALUE_BITS> {
    const CHECK: () = assert!(
        VALUE_BITS >= 1 && VALUE_BITS <= 60,
        "VALUE_BITS in 1..=60: a tag needs at least 4 bits"
    );

    /// Bits of the tag.
    pub(crate) const TAG_BITS: u32 = 64 - VALUE_BITS;

    /// The largest value.
    pub(crate) const VALUE_MAX: u64 = {
        let () = Self::CHECK;
        (1 << VALUE_BITS) - 1
    };

    /// Epochs per era: the ring sweeps once per era.
    pub(crate) const ERA: u64 = 1 << (Self::TAG_BITS - 2);

    /// The value of `word`.
    #[inline(always)]
    pub(crate) const fn value(word: u64) -> u64 {
        word & Self::VALUE_MAX
    }

    /// A word holding `value` (at most [`VALUE_MAX`](Self::VALUE_MAX)) for `epoch`.
    #[inline(always)]
    pub(crate) const fn pack(epoch: u64, value: u64) -> u64 {
        (epoch << VALUE_BITS) | value
    }

    /// Epochs from `word`'s to `epoch`: positive when `word` holds an earlier epoch, negative
    /// when a later one. Exact while the two are within half the tag range of each other.
    #[inline(always)]
    pub(crate) const fn age(word: u64, epoch: u64) -> i64 {
        // epoch - the word's epoch, modulo 2^TAG_BITS, sign-extended from the tag's top bit.
        ((epoch.wrapping_sub(word >> VALUE_BITS) << VALUE_BITS) as i64) >> VALUE_BITS
    }

    /// The epoch of `word`: the one whose tag it holds that is nearest `near`.
    #[inline(always)]
    pub(crate) const fn epoch(word: u64, near: u64) -> u64 {
        near.wrapping_sub(Self::age(word, near) as u64)
    }
}

/// What [`Ring::update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Update {
    /// The slot now holds the new value.
    Written,
    /// The update function declined (a full slot, say); the slot is unchanged.
    Declined,
    /// The slot already holds a later epoch (this caller read the clock `len` epochs ago): it
    /// was left alone, so the later epoch keeps what it counted.
    Late,
}

/// A ring of `len` epoch slots, one copy per stripe, with `VALUE_BITS` of each slot's word for
/// the caller's value. See the [module docs](self).
pub(crate) struct Ring<const VALUE_BITS: u32> {
    len: usize,
    stripes: usize,
    /// Words from one stripe's slots to the next ([`super::stride`]).
    stride: usize,
    /// The first epoch of the next era, when the ring sweeps.
    next_sweep: AtomicU64,
    sweep: Mutex<()>,
    words: Box<[AtomicU64]>,
}

impl<const VALUE_BITS: u32> Ring<VALUE_BITS> {
    /// A ring of `len` slots (fewer than an era) in `stripes` copies.
    ///
    /// # Panics
    ///
    /// When `len` is 0 or not less than an era ([`Word::ERA`]); callers validate their
    /// configuration first.
    pub(crate) fn new(len: usize, stripes: usize) -> Self {
        assert!(
            len > 0 && (len as u64) < Word::<VALUE_BITS>::ERA,
            "a ring of {len} slots: must be in 1..{}",
            Word::<VALUE_BITS>::ERA
        );
        let stripes = stripes.max(1);
        let stride = super::stride(len, stripes);
        Self {
            len,
            stripes,
            stride,
            next_sweep: AtomicU64::new(Word::<VALUE_BITS>::ERA),
            sweep: Mutex::new(()),
            words: (0..stride * stripes).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Slots per stripe.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Stripes.
    pub(crate) fn stripes(&self) -> usize {
        self.stripes
    }

    /// Bytes the slots take.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.words.len() * std::mem::size_of::<AtomicU64>()
    }

    #[inline(always)]
    fn slot(&self, stripe: usize, epoch: u64) -> &AtomicU64 {
        // Callers mostly pass a stripe already in range: a compare, not a division.
        let stripe = if stripe < self.stripes {
            stripe
        } else {
            stripe % self.stripes
        };
        &self.words[stripe * self.stride + (epoch % self.len as u64) as usize]
    }

    /// Sweeps first if `epoch` opens a new era.
    #[inline(always)]
    fn enter(&self, epoch: u64) {
        if epoch >= self.next_sweep.load(Ordering::Acquire) {
            self.sweep_for(epoch);
        }
    }

    #[cold]
    #[inline(never)]
    fn sweep_for(&self, epoch: u64) {
        let _guard = self.sweep.lock().unwrap_or_else(|e| e.into_inner());
        let due = self.next_sweep.load(Ordering::Acquire);
        if epoch < due {
            return; // another thread swept this era while this one waited
        }
        // Every slot was written before `due` and after the previous sweep, at most an era
        // and a ring earlier: read back from just before `due`, its epoch is exact.
        let reference = due - 1;
        let len = self.len as u64;
        for slot in self.words.iter() {
            let _ = slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                let written = Word::<VALUE_BITS>::epoch(word, reference);
                (word != 0 && written.saturating_add(len) <= epoch).then_some(0)
            });
        }
        let era = Word::<VALUE_BITS>::ERA;
        let next = (epoch / era + 1).saturating_mul(era);
        self.next_sweep.store(next, Ordering::Release);
    }

    /// Updates the slot of `epoch` in `stripe`'s copy: `f` gets the value `epoch` has so far
    /// (0 when the slot was empty or held an older epoch, which is then reset) and returns the
    /// new value, or `None` to leave the slot as it is. The new value must be at most
    /// [`Word::VALUE_MAX`] (checked in debug builds; in release a larger one would spill into
    /// the tag). `f` may run more than once, when other threads write the slot at the same
    /// time.
    #[inline(always)]
    pub(crate) fn update(
        &self,
        stripe: usize,
        epoch: u64,
        mut f: impl FnMut(u64) -> Option<u64>,
    ) -> Update {
        self.enter(epoch);
        let mut outcome = Update::Written;
        let _ =
            self.slot(stripe, epoch)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                    let age = Word::<VALUE_BITS>::age(current, epoch);
                    let value = Word::<VALUE_BITS>::value(current);
                    let value = if value == 0 || age > 0 {
                        0 // empty, or an older epoch's: reset
                    } else if age == 0 {
                        value
                    } else {
                        outcome = Update::Late;
                        return None;
                    };
                    match f(value) {
                        Some(new) => {
                            debug_assert!(new <= Word::<VALUE_BITS>::VALUE_MAX, "{new} overflows");
                            outcome = Update::Written;
                            Some(Word::<VALUE_BITS>::pack(epoch, new))
                        }
                        None => {
                            outcome = Update::Declined;
                            None
                        }
                    }
                });
        outcome
    }

    /// Like [`update`](Self::update), but only while the slot still holds `epoch` (a slot that
    /// moved on has already forgotten it): for taking back what `epoch` added.
    pub(crate) fn update_current(&self, stripe: usize, epoch: u64, mut f: impl FnMut(u64) -> u64) {
        self.enter(epoch);
        let _ =
            self.slot(stripe, epoch)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                    (Word::<VALUE_BITS>::age(current, epoch) == 0).then(|| {
                        let new = f(Word::<VALUE_BITS>::value(current));
                        Word::<VALUE_BITS>::pack(epoch, new.min(Word::<VALUE_BITS>::VALUE_MAX))
                    })
                });
    }

    /// Folds `f` over the values, in every stripe, of the epochs `now - span + 1 ..= now`
    /// (`span` at most `len`), and with `later`, of epochs after `now` too (written by a
    /// thread whose clock read was a moment later than this one's). Empty slots (value 0) are
    /// skipped.
    #[inline]
    pub(crate) fn fold<A>(
        &self,
        now: u64,
        span: u64,
        later: bool,
        init: A,
        mut f: impl FnMut(A, u64) -> A,
    ) -> A {
        self.enter(now);
        let mut acc = init;
        for stripe in 0..self.stripes {
            for slot in &self.words[stripe * self.stride..][..self.len] {
                let word = slot.load(Ordering::Acquire);
                let value = Word::<VALUE_BITS>::value(word);
                let age = Word::<VALUE_BITS>::age(word, now);
                if value != 0 && age < span as i64 && (later || age >= 0) {
                    acc = f(acc, value);
                }
            }
        }
        acc
    }

    /// Empties every slot.
    pub(crate) fn clear(&self) {
        for slot in self.words.iter() {
            slot.store(0, Ordering::Release);
        }
    }
}

impl<const VALUE_BITS: u32> fmt::Debug for Ring<VALUE_BITS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("len", &self.len)
            .field("stripes", &self.stripes)
            .field("value_bits", &VALUE_BITS)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn add<const B: u32>(ring: &Ring<B>, stripe: usize, epoch: u64, n: u64) -> Update {
        ring.update(stripe, epoch, |v| Some(v + n))
    }

    fn sum<const B: u32>(ring: &Ring<B>, now: u64, span: u64) -> u64 {
        ring.fold(now, span, false, 0, |a, v| a + v)
    }

    #[test]
    fn a_word_reads_its_epoch_back_near_any_other() {
        type W = Word<48>;
        assert_eq!(W::TAG_BITS, 16);
        assert_eq!(W::ERA, 16_384);
        for epoch in [0u64, 5, 65_535, 65_536, 1 << 40, u64::MAX / 2] {
            let packed = W::pack(epoch, 7);
            assert_eq!(W::value(packed), 7);
            for near in [
                epoch,
                epoch + 1,
                epoch + 32_767,
                epoch.saturating_sub(32_767),
            ] {
                assert_eq!(W::epoch(packed, near), epoch, "epoch {epoch} near {near}");
            }
        }
    }

    #[test]
    fn stale_slots_reset_and_late_writes_are_refused() {
        let ring = Ring::<32>::new(4, 2);
        assert_eq!(add(&ring, 0, 1, 3), Update::Written);
        assert_eq!(add(&ring, 1, 1, 4), Update::Written);
        assert_eq!(sum(&ring, 1, 4), 7);
        // Epoch 5 reuses epoch 1's slot and resets it.
        assert_eq!(add(&ring, 0, 5, 1), Update::Written);
        assert_eq!(sum(&ring, 5, 1), 1);
        // A writer still at epoch 1 is late: epoch 5 keeps its count.
        assert_eq!(add(&ring, 0, 1, 9), Update::Late);
        assert_eq!(sum(&ring, 5, 1), 1);
        assert_eq!(ring.update(0, 5, |_| None), Update::Declined);
        ring.update_current(0, 5, |v| v - 1);
        // Stripe 0's slot has moved on to epoch 5: taking back from epoch 1 does nothing.
        ring.update_current(0, 1, |v| v - 1);
        assert_eq!(sum(&ring, 5, 4), 0);
        assert_eq!(sum(&ring, 1, 1), 4);
        // A reader a moment behind sees a later epoch only when asked to.
        add(&ring, 0, 6, 2);
        assert_eq!(sum(&ring, 5, 1), 0);
        assert_eq!(ring.fold(5, 1, true, 0, |a, v| a + v), 2);
        ring.clear();
        assert_eq!(ring.fold(6, 4, true, 0, |a, v| a + v), 0);
    }

    #[test]
    fn values_stop_where_the_caller_says() {
        let ring = Ring::<4>::new(1, 1);
        for _ in 0..20 {
            ring.update(0, 0, |v| (v < Word::<4>::VALUE_MAX).then_some(v + 1));
        }
        assert_eq!(sum(&ring, 0, 1), 15);
    }

    #[test]
    #[should_panic(expected = "must be in 1..4")]
    fn a_ring_is_shorter_than_an_era() {
        let _ = Ring::<60>::new(4, 1);
    }

    /// The breaker's case: 16-bit tags. A slot untouched for exactly 65 536 epochs held the
    /// current epoch's tag, and its count came back; the sweep empties it first.
    #[test]
    fn a_slot_idle_for_a_whole_tag_range_does_not_come_back() {
        let ring = Ring::<48>::new(2, 1);
        add(&ring, 0, 0, 5); // slot 0
        // Traffic only ever in slot 1, for 2^16 epochs: slot 0 sits idle.
        for epoch in (1..1u64 << 16).step_by(2) {
            add(&ring, 0, epoch, 1);
        }
        let now = 1u64 << 16; // slot 0, the tag of epoch 0
        assert_eq!(sum(&ring, now, 1), 0);
        assert_eq!(add(&ring, 0, now, 1), Update::Written);
        assert_eq!(sum(&ring, now, 1), 1);
        // And after an idle of many tag ranges at once.
        add(&ring, 0, now + 1, 9);
        let far = now + (7u64 << 16) + 1; // the same slot and tag, 7 ranges on
        assert_eq!(sum(&ring, far, 2), 0);
    }

    proptest! {
        #[test]
        fn matches_a_list(
            len in 1usize..6,
            stripes in 1usize..4,
            steps in proptest::collection::vec((0u64..40_000, 0u64..4, 0usize..4), 0..150),
        ) {
            // 6-bit tags: an era of 16 epochs, so the steps cross many eras.
            let small = Ring::<58>::new(len.min(15), stripes);
            let large = Ring::<40>::new(len, stripes);
            let mut now = 0;
            let mut seen: Vec<(u64, u64)> = Vec::new();
            for &(dt, n, stripe) in &steps {
                now += dt % 7;
                if dt % 13 == 0 {
                    now += dt * 50; // a long idle
                }
                add(&small, stripe, now, n);
                add(&large, stripe, now, n);
                seen.push((now, n));
                for span in 1..=len as u64 {
                    let want: u64 = seen.iter().filter(|s| s.0 + span > now).map(|s| s.1).sum();
                    prop_assert_eq!(sum(&large, now, span), want);
                    if span <= small.len() as u64 {
                        prop_assert_eq!(sum(&small, now, span), want);
                    }
                }
            }
        }
    }
}

/// Loom models of the ring: `RUSTFLAGS="--cfg loom" cargo test -p backstop --lib loom`
/// (what `.ci/run` does).
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::{sync::Arc, thread};

    fn sum<const B: u32>(ring: &Ring<B>, now: u64, span: u64) -> u64 {
        ring.fold(now, span, false, 0, |a, v| a + v)
    }

    #[test]
    fn concurrent_adds_to_one_slot_are_never_lost() {
        loom::model(|| {
            let ring = Arc::new(Ring::<32>::new(2, 2));
            let other = ring.clone();
            let t = thread::spawn(move || other.update(0, 5, |v| Some(v + 1)));
            ring.update(0, 5, |v| Some(v + 2));
            ring.update(1, 5, |v| Some(v + 4));
            t.join().unwrap();
            assert_eq!(sum(&ring, 5, 2), 7);
        });
    }

    #[test]
    fn a_reused_slot_never_mixes_epochs() {
        loom::model(|| {
            let ring = Arc::new(Ring::<32>::new(2, 1));
            ring.update(0, 1, |v| Some(v + 4));
            let other = ring.clone();
            // Epoch 3 lands in epoch 1's slot while epoch 1 is still being added to.
            let t = thread::spawn(move || other.update(0, 3, |v| Some(v + 1)));
            ring.update(0, 1, |v| Some(v + 2));
            t.join().unwrap();
            // Either epoch 1's add came first and epoch 3 then reset the slot, or epoch 3 came
            // first and the late epoch-1 add was refused: epoch 3 keeps its count, and a
            // count never moves from one epoch to another.
            assert_eq!((sum(&ring, 1, 1), sum(&ring, 3, 1)), (0, 1));
        });
    }

    /// A sweep racing a write of the new era: the new era's counts are never swept away, and
    /// nothing of the idle slot comes back.
    #[test]
    fn a_sweep_never_erases_the_new_era() {
        loom::model(|| {
            // 4-bit tags: an era of 4 epochs; epoch 16 has epoch 0's tag.
            let ring = Arc::new(Ring::<60>::new(2, 1));
            ring.update(0, 0, |v| Some(v + 8));
            let other = ring.clone();
            // Both threads open a new era (and find the slot of epoch 0 holding its tag).
            let t = thread::spawn(move || other.update(0, 17, |v| Some(v + 1)));
            ring.update(0, 16, |v| Some(v + 2));
            t.join().unwrap();
            assert_eq!(sum(&ring, 16, 1), 2);
            assert_eq!(sum(&ring, 17, 2), 3);
        });
    }
}
