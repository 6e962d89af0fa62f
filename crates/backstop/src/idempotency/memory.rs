//! The embedded store: claims and answers in this process's memory.
//!
//! # Concurrency
//!
//! Keys are spread over 16 shards by a hash; each shard is a `HashMap` behind its own mutex, held
//! only for one operation's map update (no `.await`, no I/O, no allocation beyond the entry)
//! so a lock is the simplest correct tool: every operation on a key is serialised with every
//! other operation on that key, which is exactly the promise of [`Store`]: **for one key, at
//! most one live claim**, whatever the interleaving of claims, completes, releases and lock
//! expiry (a loom model checks it: `RUSTFLAGS="--cfg loom" cargo test -p
//! backstop --lib loom`). Operations on keys of different shards never wait for
//! each other.
//!
//! # Bounds
//!
//! At most `max_entries` records and `max_bytes` of stored answers (split evenly over the
//! 16 shards). An expired record is dropped when its key is next touched, or when its shard is
//! full. When a shard is full of live records, the completed answer closest to expiry goes
//! first (the dedup window of that key ends early); claims in flight are never evicted, and
//! a shard full of them refuses new claims ([`StoreErrorKind::Full`]), which the layer
//! answers with 503. Making room scans the shard (O(entries / shards)), only when it is full.

use crate::ConfigError;
use crate::idempotency::record::{Fingerprint, StoredResponse};
use crate::idempotency::store::{
    Claim, Record, Store, StoreError, StoreErrorKind, StoreFuture, Token,
};
use crate::idempotency::sync::Mutex;
use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    sync::Arc,
    time::Duration,
};

/// Shards, each behind its own lock: 16. A lock is held for one map update (no I/O, no
/// `.await`), so two requests wait on each other only when their keys share a shard and they
/// arrive within that update; 16 is more than the cores a server gives its handlers, so that
/// is rare, and few enough that a shard's share of `max_bytes` (4 MiB of the default 64 MiB)
/// still holds a large answer.
pub(crate) const SHARDS: usize = 16;

/// Milliseconds since the store was made: the store's clock, a parameter of every table
/// operation so tests and the loom model drive time themselves.
pub(crate) type Millis = u64;

#[derive(Debug)]
enum Entry {
    InFlight {
        token: u128,
        fingerprint: Fingerprint,
        until: Millis,
    },
    Done {
        record: Arc<StoredResponse>,
        size: usize,
        until: Millis,
    },
}

impl Entry {
    fn until(&self) -> Millis {
        match self {
            Entry::InFlight { until, .. } | Entry::Done { until, .. } => *until,
        }
    }

    fn size(&self) -> usize {
        match self {
            Entry::InFlight { .. } => 0,
            Entry::Done { size, .. } => *size,
        }
    }
}

/// One shard: its map, the bytes of its answers, and its share of the bounds.
#[derive(Debug)]
pub(crate) struct Shard {
    map: HashMap<Box<str>, Entry>,
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
}

impl Shard {
    pub(crate) fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            map: HashMap::new(),
            bytes: 0,
            max_entries,
            max_bytes,
        }
    }

    /// The record live at `now`, dropping an expired one.
    fn live(&mut self, key: &str, now: Millis) -> Option<&Entry> {
        if self.map.get(key).is_some_and(|e| e.until() <= now)
            && let Some(gone) = self.map.remove(key)
        {
            self.bytes -= gone.size();
        }
        self.map.get(key)
    }

    pub(crate) fn claim(
        &mut self,
        key: &str,
        token: Token,
        now: Millis,
        lock: Millis,
    ) -> Result<Claim, StoreError> {
        match self.live(key, now) {
            Some(Entry::InFlight { fingerprint, .. }) => {
                return Ok(Claim::Held(Record::InFlight(*fingerprint)));
            }
            Some(Entry::Done { record, .. }) => {
                return Ok(Claim::Held(Record::Completed(record.clone())));
            }
            None => {}
        }
        if self.map.len() >= self.max_entries {
            self.make_room(now, 1, 0)?;
        }
        self.map.insert(
            key.into(),
            Entry::InFlight {
                token: token.id(),
                fingerprint: token.fingerprint(),
                until: now.saturating_add(lock),
            },
        );
        Ok(Claim::Acquired(token))
    }

    pub(crate) fn complete(
        &mut self,
        key: &str,
        token: Token,
        record: Arc<StoredResponse>,
        now: Millis,
        ttl: Millis,
    ) -> Result<bool, StoreError> {
        // The claim's own token decides, even past its lock: an expired claim nobody took
        // over is still this request's.
        if !matches!(self.map.get(key), Some(Entry::InFlight { token: t, .. }) if *t == token.id())
        {
            return Ok(false);
        }
        let size = record.size();
        if size > self.max_bytes {
            return Err(StoreError::kind_only(StoreErrorKind::Full));
        }
        if self.bytes + size > self.max_bytes {
            self.make_room(now, 0, size)?;
        }
        self.bytes += size;
        self.map.insert(
            key.into(),
            Entry::Done {
                record,
                size,
                until: now.saturating_add(ttl),
            },
        );
        Ok(true)
    }

    pub(crate) fn release(&mut self, key: &str, token: Token) -> bool {
        if matches!(self.map.get(key), Some(Entry::InFlight { token: t, .. }) if *t == token.id()) {
            self.map.remove(key);
            return true;
        }
        false
    }

    pub(crate) fn get(&mut self, key: &str, now: Millis) -> Option<Record> {
        match self.live(key, now)? {
            Entry::InFlight { fingerprint, .. } => Some(Record::InFlight(*fingerprint)),
            Entry::Done { record, .. } => Some(Record::Completed(record.clone())),
        }
    }

    /// Frees `entries` slots and `bytes` bytes: expired records first, then the completed
    /// answers closest to expiry. Never a claim in flight.
    fn make_room(&mut self, now: Millis, entries: usize, bytes: usize) -> Result<(), StoreError> {
        let before = self.map.len();
        self.map.retain(|_, e| e.until() > now);
        if self.map.len() != before {
            self.bytes = self.map.values().map(Entry::size).sum();
        }
        while self.map.len() + entries > self.max_entries || self.bytes + bytes > self.max_bytes {
            let oldest = self
                .map
                .iter()
                .filter(|(_, e)| matches!(e, Entry::Done { .. }))
                .min_by_key(|(_, e)| e.until())
                .map(|(k, _)| k.clone());
            let Some(key) = oldest else {
                return Err(StoreError::kind_only(StoreErrorKind::Full));
            };
            if let Some(gone) = self.map.remove(&key) {
                self.bytes -= gone.size();
            }
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

/// The embedded store: sharded, bounded maps in this process (the module docs state its
/// concurrency rule and bounds). Clones share one store.
///
/// Right for one server, or for a fleet whose load balancer sends one key to one server;
/// otherwise use the Redis store (feature `redis`), which every server shares.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    start: tokio::time::Instant,
    /// Each shard's byte bound: no record larger fits.
    shard_bytes: usize,
}

/// Bounds of a [`MemoryStore`]: defaults 100 000 records, 64 MiB of answers (over 16 shards,
/// each with a 16th of both).
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder {
    max_entries: usize,
    max_bytes: usize,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store with the default bounds.
    pub fn new() -> Self {
        Self::builder().build().expect("the defaults are valid")
    }

    /// A store to bound.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_entries: 100_000,
            max_bytes: 64 << 20,
        }
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        let n = self.inner.shards.len();
        &self.inner.shards[(self.inner.hasher.hash_one(key) % n as u64) as usize]
    }

    fn now(&self) -> Millis {
        millis(self.inner.start.elapsed())
    }

    /// Records held now, live or expired but not yet dropped.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn millis(d: Duration) -> Millis {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A lock or ttl in whole milliseconds, rounded up: a record lives at least as long as asked
/// (1 ns is 1 ms, not an instant expiry); a duration too long for the clock saturates to
/// "never expires".
fn millis_up(d: Duration) -> Millis {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// A shard's lock. A panic while it was held cannot leave a half-updated entry (each update
/// is one map insert or remove), so a poisoned lock is used as is.
#[cfg(not(loom))]
fn lock(shard: &Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    shard
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A shard's lock, under loom.
#[cfg(loom)]
fn lock(shard: &Mutex<Shard>) -> loom::sync::MutexGuard<'_, Shard> {
    shard.lock().unwrap()
}

impl MemoryStoreBuilder {
    /// Most records held (claims and answers), 100 000 by default, at least 16 (one per
    /// shard).
    #[must_use]
    pub fn max_entries(mut self, n: usize) -> Self {
        self.max_entries = n;
        self
    }

    /// Most bytes of stored answers (bodies, headers and a fixed overhead per record,
    /// [`StoredResponse::size`]), 64 MiB by default. Split evenly over the shards: no record
    /// larger than one shard's share is kept (an answer above it is sent, not stored; its key
    /// records that the request ran).
    #[must_use]
    pub fn max_bytes(mut self, n: usize) -> Self {
        self.max_bytes = n;
        self
    }

    /// The store.
    ///
    /// # Errors
    ///
    /// - `max_entries` below 16 (each shard holds at least one record);
    /// - `max_bytes` below 16 KiB (1 KiB per shard).
    pub fn build(self) -> Result<MemoryStore, ConfigError> {
        if self.max_entries < SHARDS {
            return Err(ConfigError::new(
                "max_entries",
                format!(
                    "must be at least {SHARDS} (one per shard), got {}",
                    self.max_entries
                ),
            ));
        }
        if self.max_bytes < SHARDS * 1024 {
            return Err(ConfigError::new(
                "max_bytes",
                format!(
                    "must be at least 1 KiB per shard ({} bytes), got {}",
                    SHARDS * 1024,
                    self.max_bytes
                ),
            ));
        }
        let entries = self.max_entries.div_ceil(SHARDS);
        let bytes = self.max_bytes.div_ceil(SHARDS);
        let hasher = RandomState::new();
        Ok(MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..SHARDS)
                    .map(|_| Mutex::new(Shard::new(entries, bytes)))
                    .collect(),
                hasher,
                start: tokio::time::Instant::now(),
                shard_bytes: bytes,
            }),
        })
    }
}

impl Store for MemoryStore {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        lock_for: Duration,
    ) -> StoreFuture<'a, Claim> {
        let now = self.now();
        let result = lock(self.shard(key)).claim(key, token, now, millis_up(lock_for));
        Box::pin(std::future::ready(result))
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        response: Arc<StoredResponse>,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        let now = self.now();
        let result = lock(self.shard(key)).complete(key, token, response, now, millis_up(ttl));
        Box::pin(std::future::ready(result))
    }

    fn release<'a>(&'a self, key: &'a str, token: Token) -> StoreFuture<'a, bool> {
        let result = lock(self.shard(key)).release(key, token);
        Box::pin(std::future::ready(Ok(result)))
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        let now = self.now();
        let result = lock(self.shard(key)).get(key, now);
        Box::pin(std::future::ready(Ok(result)))
    }

    /// A shard's share of `max_bytes`: a record lives in one shard.
    fn max_record_bytes(&self) -> Option<usize> {
        Some(self.inner.shard_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::{HeaderMap, Method, StatusCode};

    fn fp(body: &[u8]) -> Fingerprint {
        Fingerprint::of(&Method::POST, "/", None, body)
    }

    fn answer(body: &'static [u8]) -> Arc<StoredResponse> {
        Arc::new(StoredResponse {
            fingerprint: fp(b""),
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from_static(body),
        })
    }

    /// A fresh token, as the layer draws one per claim.
    fn tok(fp: Fingerprint) -> Token {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        Token::new(u128::from(N.fetch_add(1, Ordering::Relaxed)), fp)
    }

    fn acquired(c: Result<Claim, StoreError>) -> Token {
        match c.unwrap() {
            Claim::Acquired(t) => t,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    #[test]
    fn a_claim_holds_until_its_lock_expires() {
        let mut s = Shard::new(10, 10_000);
        let t = acquired(s.claim("k", tok(fp(b"")), 0, 100));
        assert_eq!(
            s.claim("k", tok(fp(b"")), 99, 100).unwrap(),
            Claim::Held(Record::InFlight(fp(b"")))
        );
        let t2 = acquired(s.claim("k", tok(fp(b"")), 100, 100));
        assert_ne!(t, t2);
        // The expired claim's holder can no longer complete or release.
        assert!(!s.complete("k", t, answer(b"x"), 101, 1000).unwrap());
        assert!(!s.release("k", t));
        assert!(s.complete("k", t2, answer(b"x"), 101, 1000).unwrap());
        assert!(matches!(s.get("k", 1100), Some(Record::Completed(_))));
        assert_eq!(s.get("k", 1101), None);
    }

    #[test]
    fn an_expired_claim_nobody_took_over_can_still_complete() {
        let mut s = Shard::new(10, 10_000);
        let t = acquired(s.claim("k", tok(fp(b"")), 0, 100));
        assert!(s.complete("k", t, answer(b"x"), 500, 1000).unwrap());
        assert!(matches!(s.get("k", 600), Some(Record::Completed(_))));
    }

    #[test]
    fn a_release_lets_the_next_request_claim() {
        let mut s = Shard::new(10, 10_000);
        let t = acquired(s.claim("k", tok(fp(b"")), 0, 100));
        assert!(s.release("k", t));
        acquired(s.claim("k", tok(fp(b"")), 1, 100));
    }

    #[test]
    fn a_full_shard_evicts_answers_then_refuses_claims() {
        let mut s = Shard::new(2, 10_000);
        let a = acquired(s.claim("a", tok(fp(b"")), 0, 100));
        assert!(s.complete("a", a, answer(b"x"), 0, 1000).unwrap());
        acquired(s.claim("b", tok(fp(b"")), 0, 100));
        // Full: the answer of `a` makes room, the claim of `b` stays.
        acquired(s.claim("c", tok(fp(b"")), 1, 100));
        assert_eq!(s.get("a", 1), None);
        assert_eq!(s.len(), 2);
        let err = s.claim("d", tok(fp(b"")), 1, 100).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Full);
        // Once the claims expire there is room again.
        acquired(s.claim("d", tok(fp(b"")), 101, 100));
    }

    #[test]
    fn the_byte_bound_evicts_the_oldest_answers() {
        let big = StoredResponse::size(&answer(&[0; 400]));
        let mut s = Shard::new(100, big * 2);
        for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
            let t = acquired(s.claim(k, tok(fp(b"")), i as u64, 100));
            assert!(s.complete(k, t, answer(&[0; 400]), i as u64, 1000).unwrap());
        }
        assert_eq!(s.get("a", 3), None);
        assert!(s.get("b", 3).is_some() && s.get("c", 3).is_some());
        assert!(s.bytes <= big * 2);
        let t = acquired(s.claim("huge", tok(fp(b"")), 3, 100));
        let huge = Arc::new(StoredResponse {
            body: Bytes::from(vec![0; big * 3]),
            ..(*answer(b"")).clone()
        });
        assert_eq!(
            s.complete("huge", t, huge, 3, 1000).unwrap_err().kind(),
            StoreErrorKind::Full
        );
    }

    #[test]
    fn every_rule_names_its_knob() {
        let err = |b: MemoryStoreBuilder| b.build().unwrap_err().knob().to_owned();
        assert_eq!(err(MemoryStore::builder().max_entries(15)), "max_entries");
        assert_eq!(
            err(MemoryStore::builder().max_bytes(16 * 1024 - 1)),
            "max_bytes"
        );
        let least = MemoryStore::builder().max_entries(16).max_bytes(16 * 1024);
        assert!(least.build().is_ok());
    }
}
