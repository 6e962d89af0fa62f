//! The bounded per-route table: one entry per key of the requests (a route, a host), at most
//! `max_keys` of them, for the keyed breakers and the keyed latency models alike.
//!
//! # Bounds
//!
//! A key met when the table is full takes the place of the keys that may go: those that have
//! gone `idle` without a call and are not busy (a breaker still open is busy until its open
//! time ends: evicting it would let its route's calls through at once). When none may go, the
//! caller gets `None` (its layer's own entry, the overflow, takes the call), and the table
//! notes when one could: until then a new key costs no lock and no scan. Nothing is evicted
//! while there is room.
//!
//! # Concurrency rule
//!
//! Calls to a key that exists read an immutable snapshot of the table (`arc-swap`: no lock),
//! and stamp the entry's last use, at most once a millisecond and only forward, by an atomic
//! maximum. Adding a key copies the table under the `grow` mutex, checks again under it that
//! no other call added the key first (two calls racing for a new key share one entry), drops
//! the entries that may go if the table is full, and publishes the copy. The mutex also
//! guards the table's run-time state (`G`: what a layer's run-time setter changed, that an
//! entry added later must start with), so a setter and an add never miss each other. An
//! entry is an `Arc`: one evicted lives on until the last call holding it ends. Loom models
//! in each user (the breakers', the latency models') check an add racing a lookup and an
//! eviction.

use crate::rt::sync::{AtomicU64, Mutex, MutexGuard, Ordering};
use std::{collections::HashMap, ops::Deref, sync::Arc, time::Duration};

/// The published table: `arc-swap` (lock-free loads), or, under loom, a mutex around the
/// `Arc`, so the models check the protocol around it (arc-swap itself is not loom-aware).
#[cfg(not(loom))]
type Swap<T> = arc_swap::ArcSwap<T>;

/// The published table, under loom.
#[cfg(loom)]
struct Swap<T>(Mutex<Arc<T>>);

#[cfg(loom)]
impl<T> Swap<T> {
    fn new(value: Arc<T>) -> Self {
        Self(Mutex::new(value))
    }

    fn load(&self) -> Arc<T> {
        self.0.lock().unwrap().clone()
    }

    fn load_full(&self) -> Arc<T> {
        self.load()
    }

    fn store(&self, value: Arc<T>) {
        *self.0.lock().unwrap() = value;
    }
}

/// How much longer a key must stay in a table, called or not (milliseconds; 0: it may go once
/// idle), as another table keyed the same way says: a table whose keys see only the calls
/// another one lets through asks it before evicting.
pub(crate) type KeyBusy = Arc<dyn Fn(&str) -> u64 + Send + Sync>;

/// A table of one entry per route: what keys a request ([`RouteKey`](crate::RouteKey)), the
/// table, and what says how much longer a key must stay (the client builder's link to its
/// breaker). The attempt bound's latency models and the adaptive limit each keep one, keyed
/// as the breaker is.
pub(crate) struct Keyed<E> {
    pub(crate) key: crate::RouteKey,
    table: Table<E>,
    busy: Option<KeyBusy>,
}

impl<E> std::fmt::Debug for Keyed<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyed")
            .field("key", &self.key)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl<E> Keyed<E> {
    /// At most `max_keys` entries, each going after `idle` without a call unless `busy` says
    /// its key must stay.
    pub(crate) fn new(
        key: crate::RouteKey,
        max_keys: usize,
        idle: Duration,
        busy: Option<KeyBusy>,
    ) -> Self {
        Self {
            key,
            table: Table::new(max_keys, idle, ()),
            busy,
        }
    }

    /// `key`'s entry at `now` (milliseconds on the caller's clock), made by `make` if it has
    /// none; `None` when the table is full of entries that may not go yet.
    #[inline]
    pub(crate) fn entry_at(
        &self,
        key: &str,
        now: u64,
        make: impl FnOnce() -> E,
    ) -> Option<Arc<Slot<E>>> {
        // An entry is busy only while the linked table's key is.
        let busy = |key: &str, _: &E| self.busy.as_ref().map_or(0, |busy| busy(key));
        self.table.entry_at(key, now, |_| make(), busy)
    }

    /// `key`'s entry if it has one now (nothing added, no use stamped).
    pub(crate) fn get(&self, key: &str) -> Option<Arc<Slot<E>>> {
        self.table.get(key)
    }

    /// Every key now, sorted.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.table.keys()
    }

    pub(crate) fn max_keys(&self) -> usize {
        self.table.max_keys()
    }

    pub(crate) fn idle(&self) -> Duration {
        self.table.idle()
    }

    pub(crate) fn busy(&self) -> Option<KeyBusy> {
        self.busy.clone()
    }
}

/// One key's entry, and when a call last used it.
pub(crate) struct Slot<E> {
    value: E,
    /// Milliseconds on the table's clock at the last call (written at most once a
    /// millisecond, and only forward).
    last_used: AtomicU64,
}

impl<E> Deref for Slot<E> {
    type Target = E;

    fn deref(&self) -> &E {
        &self.value
    }
}

type Map<E> = HashMap<Box<str>, Arc<Slot<E>>>;

/// A bounded table of `E` per key, with run-time state `G` under its grow lock.
pub(crate) struct Table<E, G = ()> {
    map: Swap<Map<E>>,
    /// Taken to add a key and by the run-time setters, never by a call to a key that exists.
    grow: Mutex<G>,
    max_keys: usize,
    idle_ms: u64,
    /// While the table is full: the earliest millisecond at which a key may go (the earliest
    /// of the keys' idle and busy ends seen by the last scan; last uses only grow, so none
    /// may go before). Until then a new key gets `None` at once.
    full_until: AtomicU64,
}

impl<E, G> std::fmt::Debug for Table<E, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("keys", &self.map.load().len())
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl<E, G> Table<E, G> {
    /// An empty table of at most `max_keys` entries; an entry may go once `idle` without a
    /// call.
    pub(crate) fn new(max_keys: usize, idle: Duration, run_time: G) -> Self {
        Self {
            map: Swap::new(Arc::new(HashMap::new())),
            grow: Mutex::new(run_time),
            max_keys,
            idle_ms: u64::try_from(idle.as_millis()).unwrap_or(u64::MAX),
            full_until: AtomicU64::new(0),
        }
    }

    pub(crate) fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// How long an entry must go without a call before it may be evicted.
    pub(crate) fn idle(&self) -> Duration {
        Duration::from_millis(self.idle_ms)
    }

    /// `key`'s entry at `now` (milliseconds on the caller's clock, which must only grow),
    /// made by `make` under the grow lock if it has none; `None` when the table is full of
    /// entries that may not go yet. `busy_ms` says how much longer the entry of a key must
    /// stay whatever its last use (0: it may go once idle).
    #[inline]
    pub(crate) fn entry_at(
        &self,
        key: &str,
        now: u64,
        make: impl FnOnce(&G) -> E,
        busy_ms: impl Fn(&str, &E) -> u64,
    ) -> Option<Arc<Slot<E>>> {
        if let Some(slot) = self.map.load().get(key) {
            if slot.last_used.load(Ordering::Relaxed) < now {
                slot.last_used.fetch_max(now, Ordering::Relaxed);
            }
            return Some(slot.clone());
        }
        if now < self.full_until.load(Ordering::Relaxed) {
            return None; // full, and no key may go yet
        }
        self.add(key, now, make, busy_ms)
    }

    #[cold]
    #[inline(never)]
    fn add(
        &self,
        key: &str,
        now: u64,
        make: impl FnOnce(&G) -> E,
        busy_ms: impl Fn(&str, &E) -> u64,
    ) -> Option<Arc<Slot<E>>> {
        let run_time = self.run_time();
        let map = self.map.load_full();
        if let Some(slot) = map.get(key) {
            return Some(slot.clone()); // added by a call that raced this one
        }
        let mut next: Map<E>;
        if map.len() >= self.max_keys {
            // Full: keep the entries that may not go, note when the first of them may.
            let mut earliest = u64::MAX;
            next = HashMap::with_capacity(map.len());
            for (k, slot) in map.iter() {
                let idle_at = slot
                    .last_used
                    .load(Ordering::Relaxed)
                    .saturating_add(self.idle_ms)
                    .saturating_add(1);
                let busy = busy_ms(k, &slot.value);
                if now >= idle_at && busy == 0 {
                    continue; // it goes
                }
                earliest = earliest.min(idle_at.max(now.saturating_add(busy)));
                next.insert(k.clone(), slot.clone());
            }
            if next.len() >= self.max_keys {
                self.full_until.store(earliest, Ordering::Relaxed);
                return None;
            }
        } else {
            next = (*map).clone();
        }
        let slot = Arc::new(Slot {
            value: make(&run_time),
            last_used: AtomicU64::new(now),
        });
        next.insert(key.into(), slot.clone());
        self.map.store(Arc::new(next));
        Some(slot)
    }

    /// `key`'s entry if it has one now (nothing added, no use stamped).
    pub(crate) fn get(&self, key: &str) -> Option<Arc<Slot<E>>> {
        self.map.load().get(key).cloned()
    }

    /// Every entry now, sorted by key.
    pub(crate) fn entries(&self) -> Vec<(String, Arc<Slot<E>>)> {
        let map = self.map.load_full();
        let mut all: Vec<_> = map
            .iter()
            .map(|(key, slot)| (key.to_string(), slot.clone()))
            .collect();
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Every key now, sorted.
    pub(crate) fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.map.load().keys().map(|k| k.to_string()).collect();
        keys.sort_unstable();
        keys
    }

    /// The run-time state, locked: a setter changes it and then every entry, so an entry
    /// added meanwhile starts with the change.
    pub(crate) fn run_time(&self) -> MutexGuard<'_, G> {
        self.grow.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets when the full table may take a key (its entries were reset: a busy one may
    /// go sooner).
    pub(crate) fn forget_full(&self) {
        let _run_time = self.run_time();
        self.full_until.store(0, Ordering::Relaxed);
    }

    #[cfg(all(test, not(loom)))]
    pub(crate) fn full_until(&self) -> u64 {
        self.full_until.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn table(max_keys: usize) -> Table<u32> {
        Table::new(max_keys, Duration::from_millis(100), ())
    }

    fn idle(_: &str, _: &u32) -> u64 {
        0
    }

    #[test]
    fn a_full_table_evicts_only_keys_idle_for_long() {
        let t = table(2);
        let a = t.entry_at("/a", 0, |_| 1, idle).unwrap();
        assert!(t.entry_at("/b", 10, |_| 2, idle).is_some());
        // Full, and nobody idle long enough: none, without the lock until /a may go.
        assert!(t.entry_at("/c", 50, |_| 3, idle).is_none());
        assert_eq!(t.full_until(), 101);
        assert!(t.entry_at("/c", 100, |_| 3, idle).is_none());
        // The same key keeps its entry while it is in the table.
        assert!(Arc::ptr_eq(&t.entry_at("/a", 20, |_| 9, idle).unwrap(), &a));
        // /a was used at 20: /b (10) is the one that may go at 111.
        assert!(t.entry_at("/c", 111, |_| 3, idle).is_some());
        assert_eq!(t.keys(), ["/a", "/c"]);
        assert!(t.get("/b").is_none());
        assert_eq!(**t.get("/c").unwrap(), 3);
    }

    #[test]
    fn a_busy_entry_stays_past_its_idle_time() {
        let t = table(1);
        t.entry_at("/a", 0, |_| 1, idle).unwrap();
        // /a is idle at 101 but busy for 500 ms more: it stays until 601.
        assert!(t.entry_at("/b", 101, |_| 2, |_, _| 500).is_none());
        assert_eq!(t.full_until(), 601);
        t.forget_full();
        assert!(t.entry_at("/b", 601, |_| 2, idle).is_some());
        assert_eq!(t.keys(), ["/b"]);
    }

    #[test]
    fn many_keys_stay_within_the_bound() {
        let t = table(64);
        for i in 0..10_000u64 {
            let _ = t.entry_at(&format!("/route/{i}"), i / 1000, |_| 0, idle);
        }
        assert_eq!(t.keys().len(), 64);
        assert!(t.get("/route/0").is_some() && t.get("/route/64").is_none());
    }

    #[test]
    fn an_entry_starts_with_the_run_time_state() {
        let t: Table<u32, u32> = Table::new(4, Duration::from_secs(1), 7);
        *t.run_time() = 8;
        assert_eq!(**t.entry_at("/a", 0, |g| *g, |_, _| 0).unwrap(), 8);
        let entries = t.entries();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].0, "/a");
    }
}
