//! An adaptive limit per key: the client builder keys the presets' limit as their breaker
//! ([`BreakerConfig::per_key`](crate::client::breaker::BreakerConfig::per_key)), so each route
//! learns its own concurrency, as it has its own breaker and latency model: a slow route's
//! queue does not halve the attempts of the fast ones.
//!
//! # Bounds
//!
//! The per-route table's ([`crate::rt::table`]): at most the breaker's `max_keys` limits (each a
//! few hundred bytes), kept as long as the breaker's keys; a key met when the table is full
//! of keys that may not go yet, and a call its key function gives no key, share the layer's
//! own limit (the overflow).
//!
//! # Concurrency rule
//!
//! The table's: lookups of a key that exists take no lock; adding a key takes the table's
//! grow mutex. A call's permit holds its key's limit (an `Arc`), so an evicted limit lives on
//! until its last permit is given back.

use super::Shared;
use crate::RouteKey;
use crate::rt::table::{KeyBusy, Slot, Table};
use http::Request;
use std::{sync::Arc, time::Duration};
use tokio::time::Instant;

/// The limits of a keyed layer.
pub(crate) struct Keyed {
    pub(super) key: RouteKey,
    /// The layer's own limit: each key's is made like it, and it takes the overflow.
    base: Arc<Shared>,
    table: Table<Arc<Shared>>,
    busy: Option<KeyBusy>,
    epoch: Instant,
}

impl std::fmt::Debug for Keyed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyed")
            .field("key", &self.key)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl Keyed {
    pub(super) fn new(
        key: RouteKey,
        base: Arc<Shared>,
        max_keys: usize,
        idle: Duration,
        busy: Option<KeyBusy>,
    ) -> Self {
        Self {
            key,
            base,
            table: Table::new(max_keys, idle, ()),
            busy,
            epoch: Instant::now(),
        }
    }

    /// The limit of `req`'s key, added if need be; the layer's own when it has no key or the
    /// table is full.
    #[inline]
    pub(super) fn limit_of<B>(&self, req: &Request<B>) -> Arc<Shared> {
        let Some(key) = self.key.of(req.method(), req.uri()) else {
            return self.base.clone();
        };
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        match self.entry_at(&key, now) {
            Some(slot) => Arc::clone(&**slot),
            None => self.base.clone(),
        }
    }

    fn entry_at(&self, key: &str, now: u64) -> Option<Arc<Slot<Arc<Shared>>>> {
        let make = |_: &()| Arc::new(self.base.for_key(crate::route::key_label(&self.key), key));
        // A limit is busy only while its route's breaker is (the builder's link).
        let busy = |key: &str, _: &Arc<Shared>| self.busy.as_ref().map_or(0, |busy| busy(key));
        self.table.entry_at(key, now, make, busy)
    }

    /// `key`'s limit if it has one now.
    pub(super) fn get(&self, key: &str) -> Option<Arc<Shared>> {
        self.table.get(key).map(|slot| Arc::clone(&**slot))
    }

    /// Every key now, sorted.
    pub(super) fn keys(&self) -> Vec<String> {
        self.table.keys()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::client::overload::bulkhead::BulkheadLayer;

    fn request(path: &str) -> Request<()> {
        Request::get(path).body(()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn each_key_its_own_limit_and_the_overflow_the_layers() {
        let layer = BulkheadLayer::builder(50)
            .adaptive(true)
            .build()
            .unwrap()
            .per_key_idle(RouteKey::Path, 2, Duration::from_secs(60), None);
        let keyed = layer.keyed.clone().unwrap();
        let a = keyed.limit_of(&request("/a"));
        assert!(
            Arc::ptr_eq(&a, &keyed.limit_of(&request("/a"))),
            "one limit per key"
        );
        let b = keyed.limit_of(&request("/b"));
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(
            (a.permits.limit(), b.max_concurrency),
            (50, 50),
            "made like the layer's"
        );
        assert_eq!(b.route, Some(("route", "/b".into())));
        // Full, and no key idle for a minute: the layer's own limit.
        assert!(Arc::ptr_eq(&keyed.limit_of(&request("/c")), &layer.shared));
        assert_eq!(layer.keys(), ["/a", "/b"]);
        a.permits.set_limit(7);
        assert_eq!(layer.key_limit("/a"), Some(7));
        assert_eq!(layer.key_limit("/c"), None);
        // A minute later /a and /b may go.
        tokio::time::advance(Duration::from_secs(61)).await;
        let c = keyed.limit_of(&request("/c"));
        assert!(!Arc::ptr_eq(&c, &layer.shared));
        assert!(layer.keys().contains(&"/c".to_owned()));
    }
}
