//! The bulkhead's permits: a counting semaphore with a FIFO queue of waiters.
//!
//! # Invariant
//!
//! One word holds `in_use` (low 32 bits: permits held, granted ones included) and `waiting`
//! (high 32 bits: calls in the queue). `in_use` rises only below `limit`, and under the
//! queue's lock `waiting` equals the queue's length. The limit is fixed for a bulkhead and
//! learnt for an adaptive one ([`set_limit`](Semaphore::set_limit)): when it falls below
//! `in_use`, no permit is granted until enough are given back; when it rises, the queue is
//! served at once.
//!
//! - **Fast paths, lock-free**: an acquire takes a permit with one compare-and-swap when
//!   `in_use < limit` and nobody waits (no barging past a waiter); a release gives one back
//!   with one compare-and-swap when nobody waits.
//! - **Slow paths, under the queue's lock** (taken only when the permits are all held or a
//!   call waits): `waiting` changes only there, so a fast path seeing `waiting > 0` takes the
//!   lock too. A release with waiters hands its permit to the first waiter (`in_use` unchanged,
//!   `waiting − 1`), marks it granted and wakes it. A waiter dropped before it saw its grant
//!   gives the permit on; one dropped while queued leaves the queue.
//!
//! So no permit is lost (each release either lowers `in_use` or hands the permit on, and a
//! handed permit is used or given on by its waiter's drop), none is created (`in_use` rises
//! only below `limit`), and no waiter sleeps while a permit is free (a permit frees only
//! through a release, which serves the queue first). Checked by the loom models below.
//!
//! Why a lock at all: the queue of waiters with their wakers. It is taken only when the
//! bulkhead is full, when waiting is the cost anyway; the path of a call that finds a permit
//! takes none.

use crate::rt::sync::{AtomicU64, Mutex, Ordering};
use std::{
    collections::VecDeque,
    sync::Arc,
    task::{Context, Poll, Waker},
};

const IN_USE: u64 = u32::MAX as u64;
const ONE_WAITER: u64 = 1 << 32;

fn in_use(word: u64) -> u64 {
    word & IN_USE
}

fn waiting(word: u64) -> u64 {
    word >> 32
}

/// The permits of one bulkhead.
#[derive(Debug)]
pub(crate) struct Semaphore {
    limit: AtomicU64,
    word: AtomicU64,
    queue: Mutex<VecDeque<Arc<Waiter>>>,
}

/// A queued call.
#[derive(Debug)]
pub(crate) struct Waiter {
    state: Mutex<WaiterState>,
}

#[derive(Debug, Default)]
struct WaiterState {
    granted: bool,
    waker: Option<Waker>,
}

/// What [`Semaphore::enqueue`] did.
#[derive(Debug)]
pub(crate) enum Enqueued {
    /// A permit was free after all.
    Acquired,
    /// Queued: wait for [`Semaphore::poll_granted`].
    Queued { waiter: Arc<Waiter> },
    /// `max_queue` calls already wait.
    Full,
}

impl Semaphore {
    pub(crate) fn new(limit: u32) -> Self {
        Self {
            limit: AtomicU64::new(u64::from(limit)),
            word: AtomicU64::new(0),
            queue: Mutex::new(VecDeque::new()),
        }
    }

    /// Takes a permit if one is free and nobody waits for one.
    #[inline]
    pub(crate) fn try_acquire(&self) -> bool {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            if waiting(word) > 0 || in_use(word) >= self.limit.load(Ordering::Relaxed) {
                return false;
            }
            match self.word.compare_exchange_weak(
                word,
                word + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    /// The limit now.
    pub(crate) fn limit(&self) -> u32 {
        self.limit.load(Ordering::Relaxed) as u32
    }

    /// Sets the limit (an adaptive bulkhead's): a lower one takes effect as permits are given
    /// back; a higher one grants the queue's first waiters the permits it frees, at once.
    pub(crate) fn set_limit(&self, limit: u32) {
        let old = self.limit.swap(u64::from(limit), Ordering::AcqRel);
        // Always under the queue's lock when raised: a call queueing now (under the lock, on
        // the old limit) is then either seen here or sees the new limit.
        if u64::from(limit) > old {
            self.serve_queue();
        }
    }

    #[cold]
    #[inline(never)]
    fn serve_queue(&self) {
        let mut wakers = Vec::new();
        {
            let mut queue = self.queue.lock().expect("bulkhead queue");
            // Under the lock, with a waiter queued, no fast path moves the word (they need
            // `waiting == 0`): `in_use` is stable between the check and the grant.
            while in_use(self.word.load(Ordering::Acquire)) < self.limit.load(Ordering::Acquire) {
                let Some(next) = queue.pop_front() else { break };
                // One permit more in use, one waiter fewer.
                self.word.fetch_sub(ONE_WAITER - 1, Ordering::AcqRel);
                let mut state = next.state.lock().expect("bulkhead waiter");
                state.granted = true;
                wakers.extend(state.waker.take());
            }
        }
        for waker in wakers {
            waker.wake();
        }
    }

    /// Permits held and calls waiting, as last seen (an estimate while others race).
    pub(crate) fn load(&self) -> (u32, u32) {
        let word = self.word.load(Ordering::Acquire);
        (in_use(word) as u32, waiting(word) as u32)
    }

    /// Takes a permit if one is free, else queues the call unless `max_queue` wait already.
    pub(crate) fn enqueue(&self, max_queue: u32) -> Enqueued {
        let mut queue = self.queue.lock().expect("bulkhead queue");
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let (next, result) =
                if waiting(word) == 0 && in_use(word) < self.limit.load(Ordering::Relaxed) {
                    (word + 1, None)
                } else if waiting(word) >= u64::from(max_queue) {
                    return Enqueued::Full;
                } else {
                    (word + ONE_WAITER, Some(()))
                };
            match self
                .word
                .compare_exchange(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if result.is_none() => return Enqueued::Acquired,
                Ok(_) => {
                    let waiter = Arc::new(Waiter {
                        state: Mutex::new(WaiterState::default()),
                    });
                    queue.push_back(waiter.clone());
                    return Enqueued::Queued { waiter };
                }
                Err(now) => word = now,
            }
        }
    }

    /// Whether `waiter` has been granted its permit; registers the task to wake otherwise.
    pub(crate) fn poll_granted(&self, waiter: &Waiter, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = waiter.state.lock().expect("bulkhead waiter");
        if state.granted {
            return Poll::Ready(());
        }
        match &mut state.waker {
            Some(waker) => waker.clone_from(cx.waker()),
            None => state.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Gives up waiting: leaves the queue, or, if the permit was granted meanwhile, returns
    /// `true` (the caller now holds it: use it or [`release`](Self::release) it).
    pub(crate) fn cancel(&self, waiter: &Arc<Waiter>) -> bool {
        let mut queue = self.queue.lock().expect("bulkhead queue");
        if waiter.state.lock().expect("bulkhead waiter").granted {
            return true;
        }
        if let Some(at) = queue.iter().position(|w| Arc::ptr_eq(w, waiter)) {
            queue.remove(at);
            self.word.fetch_sub(ONE_WAITER, Ordering::AcqRel);
        }
        false
    }

    /// Gives a permit back: to the first waiter, or to the pool.
    #[inline]
    pub(crate) fn release(&self) {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            if waiting(word) > 0 {
                return self.release_to_queue();
            }
            debug_assert!(in_use(word) > 0, "a release without a permit");
            match self.word.compare_exchange_weak(
                word,
                word - 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(now) => word = now,
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn release_to_queue(&self) {
        let mut queue = self.queue.lock().expect("bulkhead queue");
        // Under the lock `waiting` is stable; `in_use` moves only through fast paths, which
        // need `waiting == 0`.
        let over = in_use(self.word.load(Ordering::Acquire)) > self.limit.load(Ordering::Acquire);
        let next = if over { None } else { queue.pop_front() };
        let Some(next) = next else {
            // The waiters left before the lock was ours, or the limit fell below the permits
            // in use: back to the pool (the queue waits for a permit under the limit).
            self.word.fetch_sub(1, Ordering::AcqRel);
            return;
        };
        // The permit goes to `next`: `in_use` unchanged, one waiter fewer.
        self.word.fetch_sub(ONE_WAITER, Ordering::AcqRel);
        // Granted before the queue's lock is let go (the order `cancel` takes them in): a
        // cancel in between would find the waiter neither queued nor granted, and the permit
        // handed to it would be lost.
        let waker = {
            let mut state = next.state.lock().expect("bulkhead waiter");
            state.granted = true;
            state.waker.take()
        };
        drop(queue);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop() -> Context<'static> {
        Context::from_waker(Waker::noop())
    }

    #[test]
    fn permits_up_to_the_limit_then_a_fifo_queue() {
        let s = Semaphore::new(2);
        assert!(s.try_acquire());
        assert!(s.try_acquire());
        assert!(!s.try_acquire());
        let Enqueued::Queued { waiter: first } = s.enqueue(2) else {
            panic!("queued")
        };
        let Enqueued::Queued { waiter: second } = s.enqueue(2) else {
            panic!("queued")
        };
        assert!(matches!(s.enqueue(2), Enqueued::Full));
        assert_eq!(s.load(), (2, 2));
        assert!(s.poll_granted(&first, &mut noop()).is_pending());
        s.release();
        assert!(s.poll_granted(&first, &mut noop()).is_ready());
        assert!(s.poll_granted(&second, &mut noop()).is_pending());
        assert_eq!(s.load(), (2, 1));
        // No barging: a free permit goes to the queue first.
        assert!(!s.try_acquire());
        assert!(!s.cancel(&second), "not granted: leaves the queue");
        assert_eq!(s.load(), (2, 0));
        s.release();
        s.release();
        assert_eq!(s.load(), (0, 0));
    }

    #[test]
    fn a_waiter_granted_then_cancelled_keeps_the_permit_to_give_on() {
        let s = Semaphore::new(1);
        assert!(s.try_acquire());
        let Enqueued::Queued { waiter } = s.enqueue(8) else {
            panic!("queued")
        };
        s.release();
        assert!(s.cancel(&waiter), "granted meanwhile");
        s.release();
        assert_eq!(s.load(), (0, 0));
        assert!(matches!(s.enqueue(8), Enqueued::Acquired));
    }

    #[test]
    fn a_lowered_limit_waits_for_permits_back_and_a_raised_one_serves_the_queue() {
        let s = Semaphore::new(3);
        for _ in 0..3 {
            assert!(s.try_acquire());
        }
        s.set_limit(1);
        assert_eq!(s.limit(), 1);
        let Enqueued::Queued { waiter } = s.enqueue(8) else {
            panic!("queued")
        };
        // Three held over a limit of one: two releases go back to the pool, not the queue.
        s.release();
        s.release();
        assert!(s.poll_granted(&waiter, &mut noop()).is_pending());
        assert_eq!(s.load(), (1, 1));
        // The third goes to the waiter (one in use, at the limit).
        s.release();
        assert!(s.poll_granted(&waiter, &mut noop()).is_ready());
        assert_eq!(s.load(), (1, 0));
        // A raised limit grants waiters at once, up to the limit.
        let queued: Vec<_> = (0..3)
            .map(|_| match s.enqueue(8) {
                Enqueued::Queued { waiter } => waiter,
                other => panic!("{other:?}"),
            })
            .collect();
        s.set_limit(3);
        let granted = |w: &Arc<Waiter>| s.poll_granted(w, &mut noop()).is_ready();
        assert_eq!(queued.iter().filter(|w| granted(w)).count(), 2);
        assert!(granted(&queued[0]) && granted(&queued[1]), "in FIFO order");
        assert_eq!(s.load(), (3, 1));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! `RUSTFLAGS="--cfg loom" cargo test -p backstop --lib loom` (run by `.ci/run`).
    use super::*;
    use loom::{future::block_on, thread};
    use std::future::poll_fn;

    /// Takes a permit: the fast path, else queued until granted.
    fn acquire(s: &Semaphore) {
        if s.try_acquire() {
            return;
        }
        match s.enqueue(u32::MAX) {
            Enqueued::Acquired => {}
            Enqueued::Full => unreachable!("unbounded queue"),
            Enqueued::Queued { waiter } => block_on(poll_fn(|cx| s.poll_granted(&waiter, cx))),
        }
    }

    #[test]
    fn loom_a_raised_limit_racing_a_queueing_call_grants_it() {
        loom::model(|| {
            let s = Arc::new(Semaphore::new(1));
            assert!(s.try_acquire());
            let raiser = {
                let s = s.clone();
                thread::spawn(move || s.set_limit(2))
            };
            // Queues on the old limit or takes the new one's permit: never sleeps while one
            // is free (the holder never releases here, so only the raise can grant it).
            acquire(&s);
            raiser.join().unwrap();
            assert_eq!(s.load(), (2, 0));
        });
    }

    #[test]
    fn loom_a_lowered_limit_racing_releases_keeps_the_count() {
        loom::model(|| {
            let s = Arc::new(Semaphore::new(2));
            assert!(s.try_acquire());
            assert!(s.try_acquire());
            let Enqueued::Queued { waiter } = s.enqueue(4) else {
                panic!("queued")
            };
            let lower = {
                let s = s.clone();
                thread::spawn(move || s.set_limit(1))
            };
            s.release();
            lower.join().unwrap();
            s.release();
            // Whatever the order, the waiter gets a permit once both are back.
            block_on(poll_fn(|cx| s.poll_granted(&waiter, cx)));
            assert_eq!(s.load(), (1, 0));
            s.release();
            assert_eq!(s.load(), (0, 0));
        });
    }

    #[test]
    fn loom_two_callers_one_permit_never_both_and_none_lost() {
        loom::model(|| {
            let s = Arc::new(Semaphore::new(1));
            let held = Arc::new(loom::sync::atomic::AtomicU64::new(0));
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (s, held) = (s.clone(), held.clone());
                    thread::spawn(move || {
                        acquire(&s);
                        assert_eq!(held.fetch_add(1, Ordering::SeqCst), 0, "one holder");
                        held.fetch_sub(1, Ordering::SeqCst);
                        s.release();
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(s.load(), (0, 0));
        });
    }

    #[test]
    fn loom_a_cancel_racing_a_release_loses_no_permit() {
        loom::model(|| {
            let s = Arc::new(Semaphore::new(1));
            assert!(s.try_acquire());
            let Enqueued::Queued { waiter } = s.enqueue(4) else {
                panic!("queued")
            };
            let releaser = {
                let s = s.clone();
                thread::spawn(move || s.release())
            };
            // The waiter gives up while the holder releases.
            if s.cancel(&waiter) {
                s.release();
            }
            releaser.join().unwrap();
            assert_eq!(s.load(), (0, 0));
            assert!(s.try_acquire(), "the permit is back");
        });
    }

    #[test]
    fn loom_a_fast_acquire_racing_a_release_to_the_queue() {
        loom::model(|| {
            let s = Arc::new(Semaphore::new(1));
            assert!(s.try_acquire());
            let Enqueued::Queued { waiter } = s.enqueue(4) else {
                panic!("queued")
            };
            let other = {
                let s = s.clone();
                thread::spawn(move || {
                    // Never barges past the waiter, whatever the interleaving.
                    let got = s.try_acquire();
                    if got {
                        s.release();
                    }
                    got
                })
            };
            s.release();
            block_on(poll_fn(|cx| s.poll_granted(&waiter, cx)));
            let barged = other.join().unwrap();
            assert!(!barged, "the queued call was first");
            s.release();
            assert_eq!(s.load(), (0, 0));
        });
    }
}
