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
//!   place of a key idle for `idle_keys_after` (default 5 min); when none is idle, its calls
//!   share the **overflow breaker**, as do calls the key function gives no key. So memory is
//!   bounded whatever the keys: `max_keys + 1` breakers, each of the size its
//!   [`Snapshot::shared_bytes`](crate::Snapshot::shared_bytes) reports (with the default
//!   10 s window: 1 536 bytes on a 2-core machine, a few KiB at most, as stripes stop at 16
//!   cores; a test holds it under 16 KiB), plus the key's text and a table slot.
//! - An idle key is one no call has used for `idle_keys_after`; a breaker that is open keeps
//!   being called (and refusing), so it is not idle, and eviction never forgets a dependency
//!   that is still down while it is asked for.
//!
//! # Concurrency rule
//!
//! Calls to a key that exists read an immutable snapshot of the table (`arc-swap`: no lock and
//! no shared write, but for the entry's last-use stamp, written at most once a second). Adding
//! a key copies the table under a mutex, checks again under it that no other call added the
//! key first (so two calls racing for a new key share one breaker), evicts idle keys if the
//! table is full, and publishes the copy. A call holds its breaker (an `Arc`) until its
//! outcome is recorded, so an evicted breaker lives on until its last call ends.
//!
//! The layer's run-time setters ([`set_mode`](crate::BreakerLayer::set_mode),
//! [`set_name`](crate::BreakerLayer::set_name)) take the same mutex: they record the setting
//! for the keys to come and apply it to every key in the table, and a key is built with the
//! setting recorded when it is added. So a key added while a setter runs gets the setting
//! either way (a loom model checks it).

pub use crate::key::{BreakerKey, KeyFn};

use crate::{
    Mode,
    shared::{Entry, Handle, Handles, Keyed, Shared, Table},
    sync::{AtomicU64, Ordering},
};
use backstop_core::ConfigError;
use http::{Method, Uri};
use std::sync::Arc;
use tokio::time::Instant;

impl<C: Clone> Keyed<C> {
    fn now_s(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.start)
            .as_secs()
    }

    /// The handle of the breaker of a request with this method and URI; `None`: the request
    /// has no key, or the table is full of keys in use (the layer's own breaker, the overflow
    /// breaker, takes it).
    #[inline(never)]
    pub(crate) fn handle(&self, method: &Method, uri: &Uri) -> Option<Arc<Handle<C>>> {
        let key = self.key.of(method, uri)?;
        let entry = self.entry(&key)?;
        Some(entry.handles.current().clone())
    }

    /// `key`'s entry, added if need be; `None` when the table is full of keys in use.
    fn entry(&self, key: &str) -> Option<Arc<Entry<C>>> {
        let now = self.now_s();
        if let Some(entry) = self.table.load().get(key) {
            if entry.last_used.load(Ordering::Relaxed) != now {
                entry.last_used.store(now, Ordering::Relaxed);
            }
            return Some(entry.clone());
        }
        if now < self.full_until.load(Ordering::Relaxed) {
            return None; // full, and no key can be idle yet
        }
        self.add(key, now)
    }

    /// `key`'s entry, for the loom models.
    #[cfg(loom)]
    pub(crate) fn entry_for_test(&self, key: &str) -> Option<Arc<Entry<C>>> {
        self.entry(key)
    }

    #[cold]
    #[inline(never)]
    fn add(&self, key: &str, now: u64) -> Option<Arc<Entry<C>>> {
        let run_time = self.grow.lock().unwrap_or_else(|e| e.into_inner());
        let table = self.table.load_full();
        if let Some(entry) = table.get(key) {
            return Some(entry.clone()); // added by a call that raced this one
        }
        let idle =
            |e: &Entry<C>| now.saturating_sub(e.last_used.load(Ordering::Relaxed)) >= self.idle_s;
        if table.len() >= self.max_keys && !table.values().any(|e| idle(e)) {
            let oldest = table
                .values()
                .map(|e| e.last_used.load(Ordering::Relaxed))
                .min()
                .unwrap_or(now);
            self.full_until
                .store(oldest.saturating_add(self.idle_s), Ordering::Relaxed);
            return None;
        }
        let mut next: Table<C> = (*table).clone();
        if next.len() >= self.max_keys {
            next.retain(|_, e| !idle(e));
        }
        // The layer's config, in the mode and with the name the layer has now: a setter holds
        // the lock while it changes them on every key, so no key misses a change.
        let mut config = self.template.clone();
        config.mode = run_time.mode;
        let shared = Shared::from_config(config, None)
            .expect("the template was validated with the keyed layer");
        shared.keyed_as(run_time.name.as_deref(), key);
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

    /// Names the layer's breakers: `overflow`, every key's, and those of the keys added from
    /// now on.
    pub(crate) fn set_name(&self, name: &str, overflow: &Shared<C>) -> Result<(), ConfigError> {
        let mut run_time = self.grow.lock().unwrap_or_else(|e| e.into_inner());
        overflow.name.set(name)?;
        run_time.name = Some(name.into());
        for entry in self.table.load_full().values() {
            entry.shared.name.set(name)?;
        }
        Ok(())
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
