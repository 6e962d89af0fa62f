//! The store trait: where claims and answers live.
//!
//! # Concurrency
//!
//! A store is shared by every request of every clone of the layer (and, for a store such as
//! Redis, by every server of a fleet). Its one promise: **for one key, at most one claim is
//! live at a time**. [`claim`](Store::claim) is a conditional write: it succeeds only when the
//! key has no record, or only a claim whose lock expired; [`complete`](Store::complete) and
//! [`release`](Store::release) act only when the key still holds the claim of the token they
//! are given (so a handler that outlived its lock cannot overwrite the claim that replaced
//! it), each atomically.

use crate::idempotency::record::{Fingerprint, StoredResponse};
use std::{fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

/// The future a [`Store`] operation returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Who holds a claim: a random id and the fingerprint of the request that claimed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    id: u128,
    fingerprint: Fingerprint,
}

impl Token {
    /// A token: `id` must be unique among the key's claims (the layer draws 128 random bits
    /// for each claim).
    pub fn new(id: u128, fingerprint: Fingerprint) -> Self {
        Self { id, fingerprint }
    }

    /// The claim's id.
    pub fn id(&self) -> u128 {
        self.id
    }

    /// The fingerprint of the request that holds the claim.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }
}

/// What a store holds for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Record {
    /// A request with this fingerprint claimed the key and has not answered yet (its lock has
    /// not expired).
    InFlight(Fingerprint),
    /// The key's request answered; its answer, to replay.
    Completed(Arc<StoredResponse>),
}

/// What [`Store::claim`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// The key is now this request's (the token it was claimed with): run the handler, then
    /// complete or release with the token.
    Acquired(Token),
    /// The key already has a record.
    Held(Record),
}

/// A store operation failed (the store is down, slow or full): the layer fails closed (503)
/// unless configured to fail open.
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// Why a store operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached or answered an error.
    Unavailable,
    /// The store did not answer within the layer's 1 s.
    Timeout,
    /// The store is full of claims in flight (the memory store's bounds): nothing can be
    /// evicted without losing a claim.
    Full,
    /// The store holds something for the key that is not a record of this crate.
    Corrupt,
}

impl StoreError {
    /// An error of this kind, with its cause.
    pub fn new(
        kind: StoreErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            kind,
            source: Some(source.into()),
        }
    }

    /// An error of this kind, without a cause.
    pub fn kind_only(kind: StoreErrorKind) -> Self {
        Self { kind, source: None }
    }

    /// Why it failed.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            StoreErrorKind::Unavailable => "idempotency store unavailable",
            StoreErrorKind::Timeout => "idempotency store timed out",
            StoreErrorKind::Full => "idempotency store full of claims in flight",
            StoreErrorKind::Corrupt => "idempotency store holds an unreadable record",
        })?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as _)
    }
}

/// Where claims and answers live: [`MemoryStore`](crate::idempotency::MemoryStore) (one process) or
/// `RedisStore` (feature `redis`, a fleet). Implement it for another database with the same
/// promises (the module docs): a conditional claim, and complete and release that check the
/// token, each atomic.
pub trait Store: Send + Sync + 'static {
    /// Claims `key` for `token` (the layer's: a random id and the request's fingerprint) for
    /// `lock` (after which the claim is gone and another request may claim the key), or says
    /// what the key already holds. The caller chooses the token, so it can release a claim
    /// whose answer it never saw (a claim that timed out may still land).
    fn claim<'a>(&'a self, key: &'a str, token: Token, lock: Duration) -> StoreFuture<'a, Claim>;

    /// Replaces the claim of `token` with `response`, kept for `ttl`. `Ok(false)` when the key
    /// no longer holds that claim (it expired and another request claimed the key).
    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        response: Arc<StoredResponse>,
        ttl: Duration,
    ) -> StoreFuture<'a, bool>;

    /// Removes the claim of `token`, so the next request with the key runs. `Ok(false)` when
    /// the key no longer holds that claim.
    fn release<'a>(&'a self, key: &'a str, token: Token) -> StoreFuture<'a, bool>;

    /// What the key holds now.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>>;

    /// The largest record (in [`StoredResponse::size`] bytes) the store can keep, if it has
    /// such a bound; `None` (the default) when any record fits. An answer whose record would
    /// be larger is not offered to the store: the layer keeps, in its place, the small record
    /// that the request ran (duplicates get 409), as it does when `complete` fails.
    fn max_record_bytes(&self) -> Option<usize> {
        None
    }

    /// The longest lock or `ttl` the store can honour, if it has such a bound; `None` (the
    /// default) when any `Duration` works (saturating at "forever"). The layer's `build`
    /// refuses a longer `lock_timeout` or `ttl`, naming the knob, so no `claim` or `complete`
    /// fails on it later. Sub-millisecond durations are rounded up by the stores here.
    fn max_expiry(&self) -> Option<Duration> {
        None
    }
}

impl<T: Store + ?Sized> Store for Arc<T> {
    fn claim<'a>(&'a self, key: &'a str, token: Token, lock: Duration) -> StoreFuture<'a, Claim> {
        (**self).claim(key, token, lock)
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        response: Arc<StoredResponse>,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        (**self).complete(key, token, response, ttl)
    }

    fn release<'a>(&'a self, key: &'a str, token: Token) -> StoreFuture<'a, bool> {
        (**self).release(key, token)
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        (**self).get(key)
    }

    fn max_record_bytes(&self) -> Option<usize> {
        (**self).max_record_bytes()
    }

    fn max_expiry(&self) -> Option<Duration> {
        (**self).max_expiry()
    }
}
