//! What the server layer does: [`IdempotencyConfig`], validated by `build`.

use crate::ConfigError;
use crate::idempotency::IdempotencyLayer;
use crate::idempotency::store::Store;
use http::Method;
use std::{fmt, sync::Arc, time::Duration};

/// Who is calling, read from the request head (an API key, a tenant, a verified user id):
/// the scope of the keys (one caller's key, sent by another, is a different key there) and
/// part of the fingerprint.
pub(crate) type Identity = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// The longest key accepted: 255 bytes (400 above). The draft
/// (draft-ietf-httpapi-idempotency-key-header) sets no limit and recommends a UUID (36
/// characters); 255 holds a UUID, a ULID or a hex digest with room for a client's own
/// prefix, and bounds what a key adds to every record's name in the store.
pub(crate) const MAX_KEY_LEN: usize = 255;
/// The `Retry-After` of the 503 of a failing store and of the 409 of a duplicate in flight:
/// 1 s. RFC 9110 §10.2.3 says it in whole seconds; 1 is the shortest that is not "now" (0
/// would send the retry straight back into the same outage or the same claim), and the
/// caller's own backoff and deadline stretch it as they need: a later hint would hold a
/// caller whose original answers in milliseconds for a second or more.
pub(crate) const RETRY_AFTER_SECS: u64 = 1;
/// The longest a store operation may take before it counts as a store failure: 1 s. A
/// healthy store answers in microseconds (memory) or a round trip (Redis); a store 1 s late
/// is failing, and the request is refused (503) or run without de-duplication
/// (`fail_open`) while its caller, whose deadline is seconds, still waits for it.
/// `RedisStore::connect` times out its connection's commands at the same 1 s.
pub(crate) const STORE_TIMEOUT: Duration = Duration::from_secs(1);

/// The layer's settings, shared by its clones.
pub(crate) struct Settings<St> {
    pub(crate) store: St,
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: bool,
    pub(crate) ttl: Duration,
    pub(crate) lock_timeout: Duration,
    pub(crate) wait_in_flight: Option<Duration>,
    pub(crate) max_body_bytes: usize,
    pub(crate) fail_open: bool,
    pub(crate) identity: Option<Identity>,
}

/// How an [`IdempotencyLayer`] answers keyed requests. Made by
/// [`IdempotencyLayer::builder`]; every knob has a default:
///
/// | knob | default |
/// |---|---|
/// | `methods` | POST, PATCH |
/// | `require_key` | `false` (a request without a key runs as if the layer were not there) |
/// | `ttl` (how long an answer is replayed) | 24 h |
/// | `lock_timeout` (how long a claim holds while its handler runs, or when no one completes it) | 60 s |
/// | `wait_in_flight` (how long a duplicate waits for the original's answer) | none: 409 at once |
/// | `max_body_bytes` (the largest body buffered, either way: a request body above it is 413, an answer above it is sent, not stored) | 1 MiB |
/// | `fail_open` | `false`: store down → 503 with `Retry-After`, the handler does not run |
/// | `identity` | none |
///
/// Fixed, with the reason at each constant: a key is at most **255 bytes** (400 above); a
/// store operation slower than **1 s** is a store failure; the 503 of a failing store and the
/// 409 of a duplicate in flight say `Retry-After: 1`.
pub struct IdempotencyConfig<St> {
    settings: Settings<St>,
}

impl<St> fmt::Debug for IdempotencyConfig<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.fmt(f)
    }
}

impl<St> fmt::Debug for Settings<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyConfig")
            .field("store", &std::any::type_name::<St>())
            .field("methods", &self.methods)
            .field("require_key", &self.require_key)
            .field("ttl", &self.ttl)
            .field("lock_timeout", &self.lock_timeout)
            .field("wait_in_flight", &self.wait_in_flight)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("fail_open", &self.fail_open)
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl<St: Store> IdempotencyConfig<St> {
    pub(crate) fn new(store: St) -> Self {
        Self {
            settings: Settings {
                store,
                methods: vec![Method::POST, Method::PATCH],
                require_key: false,
                ttl: Duration::from_secs(24 * 60 * 60),
                lock_timeout: Duration::from_secs(60),
                wait_in_flight: None,
                max_body_bytes: 1 << 20,
                fail_open: false,
                identity: None,
            },
        }
    }

    /// The methods whose keyed requests are de-duplicated (others pass through untouched).
    #[must_use]
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.settings.methods = methods.into_iter().collect();
        self
    }

    /// Whether a request of those methods without a key is refused (400) rather than run.
    #[must_use]
    pub fn require_key(mut self, require: bool) -> Self {
        self.settings.require_key = require;
        self
    }

    /// How long a completed answer is replayed.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = ttl;
        self
    }

    /// How long a claim holds while its handler runs, and when no one completes it (the
    /// process died, the store failed when the answer came). A request whose deadline is
    /// longer holds its claim until a second after that deadline (at most an hour); a handler
    /// without a deadline still running after the lock timeout may run again beside a
    /// duplicate, so make it longer than such a handler can run.
    #[must_use]
    pub fn lock_timeout(mut self, lock: Duration) -> Self {
        self.settings.lock_timeout = lock;
        self
    }

    /// How long a duplicate of a request in flight waits for its answer (and replays it)
    /// before it is answered 409.
    #[must_use]
    pub fn wait_in_flight(mut self, wait: Duration) -> Self {
        self.settings.wait_in_flight = Some(wait);
        self
    }

    /// The largest body the layer holds in memory, each way (default 1 MiB). A keyed
    /// request's body is buffered to fingerprint it: a longer one is answered 413. An answer
    /// is buffered to store it: a longer one (or one longer than the store's own bound,
    /// [`Store::max_record_bytes`]) is sent through but not stored (a warning is logged), and
    /// the key keeps a record that its request ran: a duplicate is answered 409 (no
    /// `Retry-After`) for `ttl`, and the handler does not run again. Raise it for an API whose
    /// bodies are larger.
    #[must_use]
    pub fn max_body_bytes(mut self, n: usize) -> Self {
        self.settings.max_body_bytes = n;
        self
    }

    /// When the store fails: `false` (default) answers 503 with `Retry-After` and does not
    /// run the handler; `true` runs the handler without de-duplication (a duplicate may run
    /// twice while the store is down).
    #[must_use]
    pub fn fail_open(mut self, open: bool) -> Self {
        self.settings.fail_open = open;
        self
    }

    /// Reads the caller's identity from the request head: part of the fingerprint, and the
    /// scope of the key (each identity, and the requests without one, has its own keys, so
    /// two callers choosing the same key never meet).
    #[must_use]
    pub fn identity(
        mut self,
        identity: impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.settings.identity = Some(Arc::new(identity));
        self
    }

    /// The layer.
    ///
    /// # Errors
    ///
    /// - `methods` empty;
    /// - `ttl` or `lock_timeout` zero;
    /// - `ttl` or `lock_timeout` longer than the store can honour ([`Store::max_expiry`]:
    ///   about 146 million years for Redis; the memory store takes any, `Duration::MAX`
    ///   meaning "never expires");
    /// - `wait_in_flight` not below `lock_timeout`;
    /// - `max_body_bytes` zero.
    pub fn build(self) -> Result<IdempotencyLayer<St>, ConfigError> {
        let s = &self.settings;
        if s.methods.is_empty() {
            return Err(ConfigError::new("methods", "must name at least one method"));
        }
        for (knob, value) in [("ttl", s.ttl), ("lock_timeout", s.lock_timeout)] {
            if value.is_zero() {
                return Err(ConfigError::new(knob, "must be above zero"));
            }
        }
        // What the store can honour: a longer lock or ttl would make every claim or
        // complete fail (Redis's `PX` is a signed count of milliseconds).
        if let Some(most) = s.store.max_expiry() {
            for (knob, value) in [("ttl", s.ttl), ("lock_timeout", s.lock_timeout)] {
                if value > most {
                    return Err(ConfigError::new(
                        knob,
                        format!(
                            "must be at most {most:?} (the store's longest expiry), got {value:?}"
                        ),
                    ));
                }
            }
        }
        if let Some(wait) = s.wait_in_flight
            && wait >= s.lock_timeout
        {
            return Err(ConfigError::new(
                "wait_in_flight",
                format!(
                    "must be below `lock_timeout` ({:?}), got {wait:?}",
                    s.lock_timeout
                ),
            ));
        }
        if s.max_body_bytes == 0 {
            return Err(ConfigError::new("max_body_bytes", "must be above zero"));
        }
        Ok(IdempotencyLayer::from_settings(Arc::new(self.settings)))
    }
}

#[cfg(test)]
mod tests {
    use crate::idempotency::{IdempotencyLayer, MemoryStore};
    use std::time::Duration;

    #[test]
    fn every_rule_names_its_knob() {
        let b = || IdempotencyLayer::builder(MemoryStore::new());
        let knob = |r: Result<IdempotencyLayer<MemoryStore>, crate::ConfigError>| {
            r.unwrap_err().knob().to_owned()
        };
        assert_eq!(knob(b().methods([]).build()), "methods");
        assert_eq!(knob(b().ttl(Duration::ZERO).build()), "ttl");
        assert_eq!(
            knob(b().lock_timeout(Duration::ZERO).build()),
            "lock_timeout"
        );
        assert_eq!(
            knob(b().wait_in_flight(Duration::from_secs(60)).build()),
            "wait_in_flight"
        );
        assert_eq!(knob(b().max_body_bytes(0).build()), "max_body_bytes");
        assert!(b().build().is_ok());
    }
}
