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
//!   10 s window: 1 000 bytes on a 2-core machine, a few KiB at most, as stripes stop at 16
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

use crate::{
    BreakerConfig, BreakerLayer,
    shared::Handle,
    sync::{AtomicU64, Ordering, Swap},
};
use http::{Method, Uri};
use std::{borrow::Cow, collections::HashMap, fmt, sync::Arc, time::Duration};
use tokio::time::Instant;

/// A key function: the key of a request from its method and URI (`None`: the overflow
/// breaker).
pub type KeyFn = Arc<dyn for<'a> Fn(&'a Method, &'a Uri) -> Option<Cow<'a, str>> + Send + Sync>;

/// What the breakers of one layer are keyed by ([`BreakerConfig::per_key`]).
#[derive(Clone)]
pub enum BreakerKey {
    /// The request URI's authority (`host:port`): a breaker per host of the dependency.
    /// Requests without one (a path-only URI) share the overflow breaker.
    Authority,
    /// The request's path (no query). Only for a dependency with a fixed set of paths; one
    /// with ids in its paths wants a [`custom`](BreakerKey::custom) key of its routes.
    Path,
    /// A function of the method and URI.
    Custom(KeyFn),
}

impl BreakerKey {
    /// A key from a function of the method and URI, e.g. a route template:
    ///
    /// ```
    /// use backstop_breaker::BreakerKey;
    /// use std::borrow::Cow;
    ///
    /// // `/item/42/stock` → `/item/stock`: one breaker per kind of call, not per item.
    /// let key = BreakerKey::custom(|_method, uri| {
    ///     let route: Vec<&str> = uri
    ///         .path()
    ///         .split('/')
    ///         .filter(|s| !s.is_empty() && !s.bytes().all(|b| b.is_ascii_digit()))
    ///         .collect();
    ///     Some(Cow::Owned(format!("/{}", route.join("/"))))
    /// });
    /// # let _ = key;
    /// ```
    pub fn custom(
        f: impl for<'a> Fn(&'a Method, &'a Uri) -> Option<Cow<'a, str>> + Send + Sync + 'static,
    ) -> Self {
        BreakerKey::Custom(Arc::new(f))
    }

    fn of<'a>(&self, method: &'a Method, uri: &'a Uri) -> Option<Cow<'a, str>> {
        match self {
            BreakerKey::Authority => uri.authority().map(|a| Cow::Borrowed(a.as_str())),
            BreakerKey::Path => Some(Cow::Borrowed(uri.path())),
            BreakerKey::Custom(f) => f(method, uri),
        }
    }
}

impl fmt::Debug for BreakerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BreakerKey::Authority => f.write_str("Authority"),
            BreakerKey::Path => f.write_str("Path"),
            BreakerKey::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// One key's breaker and when a call last used it.
pub(crate) struct Entry<C> {
    layer: BreakerLayer<C>,
    /// Seconds since the table was built, at the last call (written at most once a second).
    last_used: AtomicU64,
}

type Table<C> = HashMap<Box<str>, Arc<Entry<C>>>;

/// The breakers of a keyed layer.
pub(crate) struct Keyed<C> {
    key: BreakerKey,
    /// What each new key's breaker is built from (the layer's config, unkeyed).
    template: BreakerConfig<C>,
    table: Swap<Table<C>>,
    grow: crate::sync::Mutex<()>,
    max_keys: usize,
    idle_s: u64,
    start: Instant,
    /// While the table is full: the earliest second at which a key can have gone idle (the
    /// oldest last use seen, plus `idle_s`; last uses only grow, so none is idle before).
    /// Until then a new key goes to the overflow breaker at once, without the lock or a
    /// scan of the table.
    full_until: AtomicU64,
}

impl<C> fmt::Debug for Keyed<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyed")
            .field("key", &self.key)
            .field("keys", &self.table.load().len())
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl<C: Clone> Keyed<C> {
    pub(crate) fn new(
        key: BreakerKey,
        template: BreakerConfig<C>,
        max_keys: usize,
        idle: Duration,
    ) -> Self {
        Self {
            key,
            template,
            table: Swap::new(Arc::new(HashMap::new())),
            grow: crate::sync::Mutex::new(()),
            max_keys,
            idle_s: idle.as_secs().max(1),
            start: Instant::now(),
            full_until: AtomicU64::new(0),
        }
    }

    fn now_s(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.start)
            .as_secs()
    }

    /// The handle of the breaker of a request with this method and URI, for dependency
    /// `name`; `None`: the request has no key, or the table is full of keys in use (the
    /// layer's own breaker, the overflow breaker, takes it).
    #[inline(never)]
    pub(crate) fn handle(&self, method: &Method, uri: &Uri, name: &str) -> Option<Arc<Handle<C>>> {
        let key = self.key.of(method, uri)?;
        let entry = self.entry(&key, name)?;
        Some(entry.layer.handles.current().clone())
    }

    /// `key`'s entry, added if need be; `None` when the table is full of keys in use.
    fn entry(&self, key: &str, name: &str) -> Option<Arc<Entry<C>>> {
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
        self.add(key, name, now)
    }

    /// `key`'s entry, for the loom models.
    #[cfg(loom)]
    pub(crate) fn entry_for_test(&self, key: &str) -> Option<Arc<Entry<C>>> {
        self.entry(key, "")
    }

    #[cold]
    #[inline(never)]
    fn add(&self, key: &str, name: &str, now: u64) -> Option<Arc<Entry<C>>> {
        let _grow = self.grow.lock().unwrap_or_else(|e| e.into_inner());
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
        let layer = self
            .template
            .clone()
            .build()
            .expect("the template was validated with the keyed layer");
        layer.shared.keyed_as(name, key);
        let entry = Arc::new(Entry {
            layer,
            last_used: AtomicU64::new(now),
        });
        next.insert(key.into(), entry.clone());
        self.table.store(Arc::new(next));
        Some(entry)
    }
}

impl<C> Keyed<C> {
    /// Every key's breaker now.
    pub(crate) fn layers(&self) -> Vec<(String, BreakerLayer<C>)> {
        let table = self.table.load_full();
        let mut all: Vec<_> = table
            .iter()
            .map(|(key, entry)| (key.to_string(), entry.layer.clone()))
            .collect();
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// `key`'s breaker, if it has one now.
    pub(crate) fn layer(&self, key: &str) -> Option<BreakerLayer<C>> {
        self.table.load().get(key).map(|e| e.layer.clone())
    }
}
