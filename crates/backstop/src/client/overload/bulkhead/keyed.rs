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
use crate::rt::table;
use http::Request;
use std::sync::Arc;
use tokio::time::Instant;

/// The limits of a keyed layer.
#[derive(Debug)]
pub(crate) struct Keyed {
    /// The limits by key; a key's stays as long as the client builder's breaker, keyed the
    /// same way, says.
    pub(super) routes: table::Keyed<Arc<Shared>>,
    /// The layer's own limit: each key's is made like it, and it takes the overflow.
    base: Arc<Shared>,
    epoch: Instant,
}

impl Keyed {
    /// The limits of `routes`, each made like `base`, which takes the overflow.
    pub(super) fn new(routes: table::Keyed<Arc<Shared>>, base: Arc<Shared>) -> Self {
        Self {
            routes,
            base,
            epoch: Instant::now(),
        }
    }

    /// The limit of `req`'s key, added if need be; the layer's own when it has no key or the
    /// table is full.
    #[inline]
    pub(super) fn limit_of<B>(&self, req: &Request<B>) -> Arc<Shared> {
        let key = &self.routes.key;
        let Some(route) = key.of(req.method(), req.uri()) else {
            return self.base.clone();
        };
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let make = || Arc::new(self.base.for_key(crate::route::key_label(key), &route));
        match self.routes.entry_at(&route, now, make) {
            Some(slot) => Arc::clone(&**slot),
            None => self.base.clone(),
        }
    }

    /// `key`'s limit if it has one now.
    pub(super) fn get(&self, key: &str) -> Option<Arc<Shared>> {
        self.routes.get(key).map(|slot| Arc::clone(&**slot))
    }

    /// Every key now, sorted.
    pub(super) fn keys(&self) -> Vec<String> {
        self.routes.keys()
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
            .per_key_idle(
                crate::RouteKey::Path,
                2,
                std::time::Duration::from_secs(60),
                None,
            );
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
        tokio::time::advance(std::time::Duration::from_secs(61)).await;
        let c = keyed.limit_of(&request("/c"));
        assert!(!Arc::ptr_eq(&c, &layer.shared));
        assert!(layer.keys().contains(&"/c".to_owned()));
    }
}
