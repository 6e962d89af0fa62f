//! What the server layer does: [`IdempotencyConfig`], validated by `build`.

use crate::ConfigError;
use crate::idempotency::IdempotencyLayer;
use crate::idempotency::store::Store;
use http::Method;
use std::{fmt, sync::Arc, time::Duration};

/// Who is calling, read from the request head (an API key, a tenant, a verified user id):
/// the scope of the keys (one caller's key, sent by another, is a different key there) and
/// part of the fingerprint.
pub type Identity = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// The layer's settings, shared by its clones.
pub(crate) struct Settings<St> {
    pub(crate) store: St,
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: bool,
    pub(crate) ttl: Duration,
    pub(crate) lock_timeout: Duration,
    pub(crate) wait_in_flight: Option<Duration>,
    pub(crate) max_key_len: usize,
    pub(crate) max_body_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) store_timeout: Duration,
    pub(crate) fail_open: bool,
    pub(crate) retry_after: Duration,
    pub(crate) identity: Option<Identity>,
    /// Draws each claim's token.
    pub(crate) ids: crate::idempotency::KeyGenerator,
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
/// | `max_key_len` | 255 bytes |
/// | `max_body_bytes` (request body buffered to fingerprint it; 413 above) | 1 MiB |
/// | `max_response_bytes` (answers above are not stored) | 1 MiB |
/// | `store_timeout` (each store operation) | 1 s |
/// | `fail_open` | `false`: store down → 503 with `Retry-After`, the handler does not run |
/// | `retry_after` (sent with that 503, and with the 409 of a duplicate in flight) | 1 s |
/// | `identity` | none |
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
            .field("max_key_len", &self.max_key_len)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("store_timeout", &self.store_timeout)
            .field("fail_open", &self.fail_open)
            .field("retry_after", &self.retry_after)
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
                max_key_len: 255,
                max_body_bytes: 1 << 20,
                max_response_bytes: 1 << 20,
                store_timeout: Duration::from_secs(1),
                fail_open: false,
                retry_after: Duration::from_secs(1),
                identity: None,
                ids: crate::idempotency::KeyGenerator::os(),
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

    /// The longest key accepted (400 above).
    #[must_use]
    pub fn max_key_len(mut self, n: usize) -> Self {
        self.settings.max_key_len = n;
        self
    }

    /// The longest request body buffered to fingerprint a keyed request (413 above).
    #[must_use]
    pub fn max_body_bytes(mut self, n: usize) -> Self {
        self.settings.max_body_bytes = n;
        self
    }

    /// The longest answer stored (the store's own bound, [`Store::max_record_bytes`], may
    /// be lower): a longer one is sent through but not stored (a warning is logged), and the key keeps a record that its request ran: a duplicate is answered
    /// 409 (no `Retry-After`) for `ttl`, and the handler does not run again.
    #[must_use]
    pub fn max_response_bytes(mut self, n: usize) -> Self {
        self.settings.max_response_bytes = n;
        self
    }

    /// The longest a store operation may take before it counts as a store failure.
    #[must_use]
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.settings.store_timeout = timeout;
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

    /// The `Retry-After` of the 503 sent when the store fails (whole seconds, rounded up).
    #[must_use]
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.settings.retry_after = after;
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
    /// - `ttl`, `lock_timeout` or `store_timeout` zero;
    /// - `ttl` or `lock_timeout` longer than the store can honour ([`Store::max_expiry`]:
    ///   about 146 million years for Redis; the memory store takes any, `Duration::MAX`
    ///   meaning "never expires");
    /// - `wait_in_flight` not below `lock_timeout`;
    /// - `max_key_len` outside `1..=8192`;
    /// - `max_body_bytes` or `max_response_bytes` zero;
    /// - `retry_after` zero or above 1 h.
    pub fn build(self) -> Result<IdempotencyLayer<St>, ConfigError> {
        let s = &self.settings;
        if s.methods.is_empty() {
            return Err(ConfigError::new("methods", "must name at least one method"));
        }
        for (knob, value) in [
            ("ttl", s.ttl),
            ("lock_timeout", s.lock_timeout),
            ("store_timeout", s.store_timeout),
        ] {
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
        if !(1..=8192).contains(&s.max_key_len) {
            return Err(ConfigError::new(
                "max_key_len",
                format!("must be in 1..=8192, got {}", s.max_key_len),
            ));
        }
        for (knob, value) in [
            ("max_body_bytes", s.max_body_bytes),
            ("max_response_bytes", s.max_response_bytes),
        ] {
            if value == 0 {
                return Err(ConfigError::new(knob, "must be above zero"));
            }
        }
        if s.retry_after.is_zero() || s.retry_after > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "retry_after",
                format!("must be in (0, 1 h], got {:?}", s.retry_after),
            ));
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
            knob(b().store_timeout(Duration::ZERO).build()),
            "store_timeout"
        );
        assert_eq!(
            knob(b().wait_in_flight(Duration::from_secs(60)).build()),
            "wait_in_flight"
        );
        assert_eq!(knob(b().max_key_len(0).build()), "max_key_len");
        assert_eq!(knob(b().max_body_bytes(0).build()), "max_body_bytes");
        assert_eq!(
            knob(b().max_response_bytes(0).build()),
            "max_response_bytes"
        );
        assert_eq!(knob(b().retry_after(Duration::ZERO).build()), "retry_after");
        assert!(b().build().is_ok());
    }
}
