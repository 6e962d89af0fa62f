//! The Redis store: one record of keys for a fleet of servers.
//!
//! # Concurrency
//!
//! Redis runs each command and each Lua script alone, so the store's promise (one live claim
//! per key; complete and release only by the claim's holder) holds across every server that
//! shares the Redis: a claim is `SET key claim NX PX lock` (in a script that returns the
//! record already there in the same step), and complete and release are scripts that
//! compare the key's value with the holder's claim before they write, so nothing is ever
//! half-stored. Lock expiry is Redis's own `PX`. Each claim's value carries 128 random bits
//! from the OS, unique across the fleet.
//!
//! # Failures
//!
//! A Redis that is down, restarted or slow is a [`StoreError`] (the layer waits at most 1 s
//! for each command): the layer fails closed (503) and the handler does not run. The
//! connection reconnects by itself. A Redis restarted **without persistence** has lost its
//! claims and answers: a retry of a request answered before the restart runs again. Run
//! Redis with `appendonly yes` where that matters.

use crate::idempotency::record::{Fingerprint, StoredResponse};
use crate::idempotency::store::{
    Claim, Record, Store, StoreError, StoreErrorKind, StoreFuture, Token,
};
use redis::{Script, Value, aio::ConnectionManager};
use std::{fmt, sync::Arc, time::Duration};

/// The largest value Redis takes by default (`proto-max-bulk-len`: 512 MiB).
const MAX_VALUE_BYTES: usize = 512 << 20;

/// The longest `PX` sent: Redis refuses one whose sum with its clock overflows an `i64` of
/// milliseconds; half of `i64::MAX` leaves its clock room for 146 million years.
const MAX_EXPIRY: Duration = Duration::from_millis(i64::MAX as u64 / 2);

/// Claims a free key, or returns what it holds.
const CLAIM: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return redis.call('GET', KEYS[1])";

/// Replaces the caller's claim with its answer.
const COMPLETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0";

/// Removes the caller's claim.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0";

/// The Redis store (feature `redis`): claims and answers in one Redis shared by a fleet (the
/// module docs give the rules). Clones share one reconnecting connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: Arc<str>,
    scripts: Arc<[Script; 3]>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, e)
}

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://127.0.0.1:6379/0`), with keys under the
    /// prefix `backstop:idempotency:`. Connecting and each command time out after 1 s; a lost
    /// connection is made again on the next command.
    ///
    /// # Errors
    ///
    /// When the URL is not a Redis URL or the Redis cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(unavailable)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(1)))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(unavailable)?;
        Ok(Self::from_connection(conn))
    }

    /// A store over a connection made elsewhere.
    pub fn from_connection(conn: ConnectionManager) -> Self {
        Self {
            conn,
            prefix: "backstop:idempotency:".into(),
            scripts: Arc::new([
                Script::new(CLAIM),
                Script::new(COMPLETE),
                Script::new(RELEASE),
            ]),
        }
    }

    /// Keys live under `prefix` (one prefix per service sharing a Redis).
    #[must_use]
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.into();
        self
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}

/// The value of a claim: `P`, the claim's id, the fingerprint.
fn claim_value(token: Token) -> Vec<u8> {
    let mut v = Vec::with_capacity(49);
    v.push(b'P');
    v.extend_from_slice(&token.id().to_be_bytes());
    v.extend_from_slice(token.fingerprint().as_bytes());
    v
}

fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
    match bytes.first() {
        Some(b'P') if bytes.len() == 49 => {
            let mut fp = [0; 32];
            fp.copy_from_slice(&bytes[17..]);
            Ok(Record::InFlight(Fingerprint::from_bytes(fp)))
        }
        Some(b'C') => StoredResponse::decode(bytes)
            .map(|r| Record::Completed(Arc::new(r)))
            .ok_or_else(|| StoreError::kind_only(StoreErrorKind::Corrupt)),
        _ => Err(StoreError::kind_only(StoreErrorKind::Corrupt)),
    }
}

/// `d` in whole milliseconds, rounded up (a lock or ttl is at least what was asked), at most
/// [`MAX_EXPIRY`] (the layer's `build` refuses longer ones).
fn millis(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms.max(1))
        .unwrap_or(u64::MAX)
        .min(MAX_EXPIRY.as_millis() as u64)
}

impl Store for RedisStore {
    fn claim<'a>(&'a self, key: &'a str, token: Token, lock: Duration) -> StoreFuture<'a, Claim> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let value: Value = self.scripts[0]
                .key(self.key(key))
                .arg(claim_value(token))
                .arg(millis(lock))
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable)?;
            match value {
                Value::Int(1) => Ok(Claim::Acquired(token)),
                Value::BulkString(bytes) => decode(&bytes).map(Claim::Held),
                _ => Err(StoreError::kind_only(StoreErrorKind::Corrupt)),
            }
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        response: Arc<StoredResponse>,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let done: i64 = self.scripts[1]
                .key(self.key(key))
                .arg(claim_value(token))
                .arg(response.encode())
                .arg(millis(ttl))
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable)?;
            Ok(done == 1)
        })
    }

    fn release<'a>(&'a self, key: &'a str, token: Token) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let done: i64 = self.scripts[2]
                .key(self.key(key))
                .arg(claim_value(token))
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable)?;
            Ok(done == 1)
        })
    }

    /// Redis's largest string (`proto-max-bulk-len`, 512 MiB by default); a record's
    /// encoding is never longer than its [`StoredResponse::size`].
    fn max_record_bytes(&self) -> Option<usize> {
        Some(MAX_VALUE_BYTES)
    }

    /// Half of what `PX` holds (a signed 64-bit count of milliseconds, to which Redis adds
    /// its clock): about 146 million years.
    fn max_expiry(&self) -> Option<Duration> {
        Some(MAX_EXPIRY)
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let value: Option<Vec<u8>> = redis::cmd("GET")
                .arg(self.key(key))
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            value.map(|v| decode(&v)).transpose()
        })
    }
}
