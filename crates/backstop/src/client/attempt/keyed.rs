//! A latency model per key ([`AttemptTimeoutLayer::per_key`](super::AttemptTimeoutLayer::per_key)):
//! the per-route table ([`crate::rt::table`]) of per-key [`Shared`]s, each built from the
//! layer's own.
//!
//! # Bounds
//!
//! At most `max_keys` models (default 64, as the breaker's keyed table), each about 4 KiB
//! (the model's histograms), plus the key's text and a table slot. A key met when the table
//! is full takes the place of the keys that have gone [`KEY_IDLE`] without a call; when
//! none has, its calls use the layer's own model (the overflow), as do calls the key
//! function gives no key. Nothing is evicted while there is room: a rare route keeps its
//! samples, however old, and its bound decays from them (see the [module docs](super)).
//! After [`KEY_IDLE`] a model's aged bound is the ceiling and its hedge delay and reserve are
//! `None`, as a fresh model's: evicting it changes no bound.
//!
//! # Concurrency rule
//!
//! The table's ([`crate::rt::table`]): lookups of a key that exists take no lock; adding a
//! key takes the table's grow mutex. An attempt holds its model (an `Arc`) until it ends, so
//! an evicted model lives on until its last attempt has recorded. The delay slots' quantiles
//! are a mutex taken only when a measured delay is made (at build time). A loom model checks
//! an add and an eviction racing a lookup.

use super::shared::Shared;
use crate::RouteKey;
use crate::rt::stripe::Handles;
use crate::rt::sync::Mutex;
use crate::rt::table::{self, KeyBusy, Slot};
use http::{Method, Uri};
use std::{sync::Arc, time::Duration};
use tokio::time::Instant;

/// How long a key's model must have gone without a call before a new key may take its place
/// in a full table: 20 doublings of its aged bound ([`STALE_DOUBLING`](super::config::STALE_DOUBLING),
/// which reach the ceiling) after its samples left a window of up to 10 minutes.
pub(crate) const KEY_IDLE: Duration = Duration::from_secs(30 * 60);

/// How many distinct quantiles of measured delays (hedge delays, retry reserves) are cached
/// per key; a delay of a further quantile reads the key's model each time.
pub(super) const DELAY_SLOTS: usize = 4;

/// One key's model and its cached delays.
pub(super) struct Entry {
    pub(super) shared: Arc<Shared>,
    pub(super) handles: Handles<Shared>,
    /// A measured delay's cached word per quantile slot (see `MeasuredDelay`; a cache, std's
    /// atomics even under loom).
    pub(super) delays: [std::sync::atomic::AtomicU64; DELAY_SLOTS],
}

/// The models of a keyed layer.
#[derive(Debug)]
pub(super) struct Keyed {
    /// The models by key; a key's must stay as long as the client builder's breaker, keyed
    /// the same way, says (an open breaker lets no call reach its route's model, which must
    /// not go for that).
    pub(super) routes: table::Keyed<Entry>,
    /// The layer's own model: each key's is built from it (same bound, window, origin and
    /// name), and it takes the overflow.
    base: Arc<Shared>,
    /// The quantiles (as bits) given a delay slot, in order.
    quantiles: Mutex<Vec<u64>>,
}

impl Keyed {
    /// The models of `routes`, each built from `base`, which takes the overflow.
    pub(super) fn new(routes: table::Keyed<Entry>, base: Arc<Shared>) -> Self {
        Self {
            routes,
            base,
            quantiles: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn key(&self) -> &RouteKey {
        &self.routes.key
    }

    pub(super) fn max_keys(&self) -> usize {
        self.routes.max_keys()
    }

    pub(super) fn idle(&self) -> Duration {
        self.routes.idle()
    }

    pub(super) fn busy(&self) -> Option<KeyBusy> {
        self.routes.busy()
    }

    fn now_ms(&self) -> u64 {
        self.base.now_us(Instant::now()) / 1_000
    }

    /// The entry of a request with this method and URI, added if need be; `None`: it has no
    /// key, or the table is full of keys that may not be evicted yet (the layer's own model
    /// takes it).
    #[inline(never)]
    pub(super) fn entry(&self, method: &Method, uri: &Uri) -> Option<Arc<Slot<Entry>>> {
        let key = self.key().of(method, uri)?;
        self.entry_at(&key, self.now_ms())
    }

    /// `key`'s entry at `now` (milliseconds since the layer's origin).
    pub(super) fn entry_at(&self, key: &str, now: u64) -> Option<Arc<Slot<Entry>>> {
        let make = || {
            let shared = Arc::new(self.base.for_key(crate::route::key_label(self.key()), key));
            Entry {
                handles: Handles::uncopied(&shared),
                shared,
                delays: std::array::from_fn(|_| std::sync::atomic::AtomicU64::new(0)),
            }
        };
        // A model is busy only while its route's breaker is (the builder's link): otherwise
        // it may go once idle.
        self.routes.entry_at(key, now, make)
    }

    /// `key`'s entry if it has one now (nothing added, no use stamped).
    pub(super) fn get(&self, key: &str) -> Option<Arc<Slot<Entry>>> {
        self.routes.get(key)
    }

    /// Every key now, sorted.
    pub(super) fn keys(&self) -> Vec<String> {
        self.routes.keys()
    }

    /// The delay slot of `quantile`, shared by every measured delay of that quantile; `None`
    /// once [`DELAY_SLOTS`] quantiles have one.
    pub(super) fn delay_slot(&self, quantile: f64) -> Option<usize> {
        let bits = quantile.to_bits();
        let mut all = self.quantiles.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = all.iter().position(|&q| q == bits) {
            return Some(i);
        }
        (all.len() < DELAY_SLOTS).then(|| {
            all.push(bits);
            all.len() - 1
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::client::attempt::{Adaptive, AttemptBound, AttemptTimeoutLayer};

    fn keyed(max_keys: usize) -> Arc<Keyed> {
        let layer = AttemptTimeoutLayer::new(AttemptBound::Adaptive(Adaptive::new()))
            .unwrap()
            .per_key(RouteKey::Path, max_keys)
            .unwrap();
        layer.keyed.clone().unwrap()
    }

    #[test]
    fn a_full_table_evicts_only_a_key_idle_for_long() {
        let k = keyed(2);
        let idle = KEY_IDLE.as_millis() as u64;
        let a = k.entry_at("/a", 0).unwrap();
        assert!(k.entry_at("/b", 10).is_some());
        // Full, and nobody idle long enough: the overflow, without the lock until /a may go.
        assert!(k.entry_at("/c", 1_000).is_none());
        assert!(k.entry_at("/c", idle).is_none());
        // The same key keeps its model while it is in the table.
        assert!(Arc::ptr_eq(&k.entry_at("/a", 20).unwrap(), &a));
        // /a was used at 20: /b (10) is the one idle longest.
        assert!(k.entry_at("/c", idle + 11).is_some());
        assert_eq!(k.keys(), ["/a", "/c"]);
        assert!(k.get("/b").is_none());
    }

    #[test]
    fn many_keys_stay_within_the_bound() {
        let k = keyed(64);
        for i in 0..10_000u64 {
            let _ = k.entry_at(&format!("/route/{i}"), i);
        }
        assert_eq!(k.keys().len(), 64);
        // The first 64 kept their models; the rest went to the overflow.
        assert!(k.get("/route/0").is_some() && k.get("/route/64").is_none());
    }

    #[test]
    fn quantiles_get_slots_until_there_are_none() {
        let k = keyed(4);
        assert_eq!(k.delay_slot(0.95), Some(0));
        assert_eq!(k.delay_slot(0.5), Some(1));
        assert_eq!(k.delay_slot(0.95), Some(0));
        assert_eq!(k.delay_slot(0.9), Some(2));
        assert_eq!(k.delay_slot(0.8), Some(3));
        assert_eq!(k.delay_slot(0.7), None);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::client::attempt::{Adaptive, AttemptBound, AttemptTimeoutLayer};

    /// A lookup of a key in the table races the add of a new key that evicts an idle one:
    /// each call gets a model (or the overflow, never a torn table), the table never holds
    /// more than `max_keys`, and two calls for one key share its model.
    #[test]
    fn an_add_and_an_eviction_racing_a_lookup() {
        loom::model(|| {
            let layer = AttemptTimeoutLayer::new(AttemptBound::Adaptive(Adaptive::new()))
                .unwrap()
                .per_key_idle(RouteKey::Path, 1, Duration::from_millis(5), None)
                .unwrap();
            let k = layer.keyed.clone().unwrap();
            let a = k.entry_at("/a", 0).unwrap();
            let k2 = k.clone();
            let t = loom::thread::spawn(move || k2.entry_at("/b", 10));
            let mine = k.entry_at("/a", 1);
            let theirs = t.join().unwrap();
            // /a, used at 0 or 1, was idle long enough at 10 to make room for /b.
            let b = theirs.expect("/a was idle long enough to make room");
            assert_eq!(k.keys(), ["/b"]);
            assert!(Arc::ptr_eq(&k.get("/b").unwrap(), &b));
            // The lookup found /a's model before the eviction, or the overflow after it
            // (the table full of /b, too recent to go): never a model the table lost.
            assert!(mine.is_none_or(|m| Arc::ptr_eq(&m, &a)));
        });
    }
}
