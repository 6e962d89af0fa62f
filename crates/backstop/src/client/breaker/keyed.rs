//! One breaker per key inside one layer: per host (`authority`), per path, or per whatever a
//! function of the request's method and URI says (a route template, a gRPC method).
//!
//! A dependency with many routes or hosts rarely fails all at once: with one breaker, a route
//! that is down opens it and calls to the routes that work fail with it. With a breaker per
//! key, the bad route fails fast alone.
//!
//! # Bounds
//!
//! - At most `max_keys` breakers (default 64). A key met when the table is full takes the
//!   place of a key that can be evicted (below); when none can, its calls share the
//!   **overflow breaker**, as do calls the key function gives no key. So memory is
//!   bounded whatever the keys: `max_keys + 1` breakers, each of the size its
//!   [`Snapshot::shared_bytes`](crate::client::breaker::Snapshot::shared_bytes) reports (with the default
//!   10 s window: 1 536 bytes on a 2-core machine, a few KiB at most, as stripes stop at 16
//!   cores; a test holds it under 16 KiB), plus the key's text and a table slot.
//! - A key can be evicted once no call has used it for `idle_keys_after` (default 5 min;
//!   counted in milliseconds, so it has really gone that long without a call), and its
//!   breaker is not open with open time left. An open breaker is kept until its open time
//!   is over, called or not: a fresh breaker in its place would let calls through to a
//!   route its breaker refuses. (A half-open one can go once idle: its open time is over,
//!   and a probe still in flight reports to the breaker it holds.) A
//!   [`reset`](crate::client::breaker::BreakerLayer::reset) closes every key's breaker, which can then go as
//!   soon as it is idle.
//!
//! # Concurrency rule
//!
//! Calls to a key that exists read an immutable snapshot of the table (`arc-swap`: no lock and
//! no shared write, but for the entry's last-use stamp, written at most once a millisecond,
//! only forward, by an atomic maximum). Adding a key copies the table under a mutex, checks
//! again under it that no other call added the key first (so two calls racing for a new key
//! share one breaker), evicts the keys that can be evicted if the table is full, and
//! publishes the copy. When none can, it notes the earliest time one could, and until then
//! new keys go to the overflow breaker without the mutex. A call holds its breaker (an `Arc`)
//! until its outcome is recorded, so an evicted breaker lives on until its last call ends.
//!
//! The layer's run-time setter ([`set_mode`](crate::client::breaker::BreakerLayer::set_mode)) takes the same
//! mutex: it records the mode for the keys to come and applies it to every key in the table,
//! and a key is built with the mode recorded when it is added. So a key added while the
//! setter runs gets the mode either way (a loom model checks it). The name is configuration
//! ([`named`](crate::client::breaker::BreakerLayer::named)): every key's breaker is built with it.

pub use crate::client::breaker::key::{BreakerKey, KeyFn};

use crate::client::breaker::Mode;
use crate::client::breaker::shared::{Entry, Handle, Handles, Keyed, Shared, Table};
use crate::client::breaker::sync::{AtomicU64, Ordering};
use http::{Method, Uri};
use std::sync::Arc;
use tokio::time::Instant;

impl<C: Clone> Keyed<C> {
    /// Milliseconds since the table was built: the clock of last uses (no `u128` arithmetic
    /// on the path of every call).
    fn now_ms(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.start);
        elapsed
            .as_secs()
            .saturating_mul(1000)
            .saturating_add(u64::from(elapsed.subsec_millis()))
    }

    /// The handle of the breaker of a request with this method and URI; `None`: the request
    /// has no key, or the table is full of keys that cannot be evicted (the layer's own
    /// breaker, the overflow breaker, takes it).
    #[inline(never)]
    pub(crate) fn handle(&self, method: &Method, uri: &Uri) -> Option<Arc<Handle<C>>> {
        let key = self.key.of(method, uri)?;
        let entry = self.entry(&key)?;
        Some(entry.handles.current().clone())
    }

    /// `key`'s entry, added if need be; `None` when the table is full of keys that cannot be
    /// evicted.
    fn entry(&self, key: &str) -> Option<Arc<Entry<C>>> {
        self.entry_at(key, self.now_ms())
    }

    /// `key`'s entry at `now` (the table's milliseconds).
    #[inline]
    fn entry_at(&self, key: &str, now: u64) -> Option<Arc<Entry<C>>> {
        if let Some(entry) = self.table.load().get(key) {
            // At most one write a millisecond, and only forward: a call that read the clock
            // before another's stamp never moves the last use back.
            if entry.last_used.load(Ordering::Relaxed) < now {
                entry.last_used.fetch_max(now, Ordering::Relaxed);
            }
            return Some(entry.clone());
        }
        if now < self.full_until.load(Ordering::Relaxed) {
            return None; // full, and no key can be evicted yet
        }
        self.add(key, now)
    }

    /// `key`'s entry at time 0 on the table's clock, for the loom models (which must not
    /// read a clock that moves: the stamp's write depends on it).
    #[cfg(loom)]
    pub(crate) fn entry_for_test(&self, key: &str) -> Option<Arc<Entry<C>>> {
        self.entry_at(key, 0)
    }

    /// `key`'s entry at `now_ms` on the table's clock, for the loom models.
    #[cfg(loom)]
    pub(crate) fn entry_at_for_test(&self, key: &str, now_ms: u64) -> Option<Arc<Entry<C>>> {
        self.entry_at(key, now_ms)
    }

    #[cold]
    #[inline(never)]
    fn add(&self, key: &str, now: u64) -> Option<Arc<Entry<C>>> {
        let run_time = self.grow.lock().unwrap_or_else(|e| e.into_inner());
        let table = self.table.load_full();
        if let Some(entry) = table.get(key) {
            return Some(entry.clone()); // added by a call that raced this one
        }
        let mut next: Table<C>;
        if table.len() >= self.max_keys {
            // Full: keep the keys that cannot be evicted yet, and note when the first of them
            // can be.
            let mut earliest = u64::MAX;
            next = Table::with_capacity(table.len());
            for (k, e) in table.iter() {
                if let Some(at) = self.evictable_at(e, now) {
                    earliest = earliest.min(at);
                    next.insert(k.clone(), e.clone());
                }
            }
            if next.len() >= self.max_keys {
                self.full_until.store(earliest, Ordering::Relaxed);
                return None;
            }
        } else {
            next = (*table).clone();
        }
        // The layer's config (its name with it), in the mode the layer has now: the setter
        // holds the lock while it changes it on every key, so no key misses a change.
        let mut config = self.template.clone();
        config.mode = run_time.mode;
        let shared = Shared::from_config(config, None)
            .expect("the template was validated with the keyed layer");
        shared.keyed_as(crate::route::key_label(&self.key), key);
        let entry = Arc::new(Entry {
            handles: Handles::uncopied(&shared),
            shared,
            last_used: AtomicU64::new(now),
        });
        next.insert(key.into(), entry.clone());
        self.table.store(Arc::new(next));
        Some(entry)
    }
}

impl<C> Keyed<C> {
    /// `None` when `e` can be evicted at `now`: it has gone without a call for
    /// `idle_keys_after`, and its breaker is not open with open time left. Otherwise the
    /// earliest millisecond at which it may be (a lower bound: its last use or its state can
    /// only push it later, but for a reset, which clears the table's hint).
    fn evictable_at(&self, e: &Entry<C>, now: u64) -> Option<u64> {
        // The stamp is the millisecond of the last use, floored: one millisecond more than
        // `idle_keys_after` past it, the key has been idle for at least `idle_keys_after`.
        let idle_at = e
            .last_used
            .load(Ordering::Relaxed)
            .saturating_add(self.idle_ms + 1);
        let open_left_us = e.shared.open_left_us().unwrap_or(0);
        if now >= idle_at && open_left_us == 0 {
            return None;
        }
        Some(idle_at.max(now.saturating_add(open_left_us / 1000)))
    }

    /// Resets the layer's breakers: `overflow` and every key's; a key whose breaker was open
    /// can then make room as soon as it is idle.
    pub(crate) fn reset(&self, overflow: &Shared<C>) {
        // Without the lock: the transitions run the hook, which may call the layer's setters.
        overflow.reset();
        for entry in self.table.load_full().values() {
            entry.shared.reset();
        }
        // Under it: a full table's scan that saw a breaker still open, before the reset, may
        // have stored a later hint; this clear comes after it.
        let _run_time = self.grow.lock().unwrap_or_else(|e| e.into_inner());
        self.full_until.store(0, Ordering::Relaxed);
    }

    /// Sets the mode of the layer's breakers: `overflow`, every key's, and those of the keys
    /// added from now on.
    pub(crate) fn set_mode(&self, mode: Mode, overflow: &Shared<C>) {
        let mut run_time = self.grow.lock().unwrap_or_else(|e| e.into_inner());
        run_time.mode = mode;
        overflow.machine.set_mode(mode);
        for entry in self.table.load_full().values() {
            entry.shared.machine.set_mode(mode);
        }
    }

    /// Every key's breaker now, sorted by key.
    pub(crate) fn entries(&self) -> Vec<(String, Arc<Entry<C>>)> {
        let table = self.table.load_full();
        let mut all: Vec<_> = table
            .iter()
            .map(|(key, entry)| (key.to_string(), entry.clone()))
            .collect();
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// `key`'s breaker, if it has one now.
    pub(crate) fn entry_of(&self, key: &str) -> Option<Arc<Entry<C>>> {
        self.table.load().get(key).cloned()
    }
}
