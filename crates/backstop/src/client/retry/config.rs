use crate::client::retry::RetryReserve;
use crate::client::retry::backoff;
use crate::client::retry::backoff::Backoff;
use crate::client::retry::budget::{Budget, RatioBudget};
use crate::{ConfigError, GrpcClassifier, HttpClassifier};
use http::{HeaderMap, HeaderName, Method};

/// `Idempotency-Key`: marks a request the server de-duplicates, so it is safe to retry.
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
use std::{sync::Arc, time::Duration};

/// The most attempts a policy may allow (the first one included).
pub const MAX_ATTEMPTS_LIMIT: u32 = 10;

/// Per-request overrides of the retry policy, as a request extension: retries off, the
/// request's idempotency decided by the caller, a different number of attempts, or no
/// hedging, for this request only.
///
/// ```
/// use backstop::client::retry::RetryOverrides;
///
/// let mut req = http::Request::post("http://svc/orders").body(()).unwrap();
/// // This POST carries its own idempotency token: safe to send twice, at most twice.
/// req.extensions_mut()
///     .insert(RetryOverrides::new().idempotent(true).max_attempts(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryOverrides {
    pub(crate) max_attempts: Option<u32>,
    pub(crate) idempotent: Option<bool>,
    pub(crate) hedge: Option<bool>,
}

impl RetryOverrides {
    /// No override.
    pub fn new() -> Self {
        Self::default()
    }

    /// One attempt: this request is never retried nor hedged.
    pub fn no_retries() -> Self {
        Self::new().max_attempts(1)
    }

    /// Attempts for this request, the first included (at most the policy's limit of 10; 0 or
    /// 1: a single attempt).
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n.clamp(1, crate::client::retry::MAX_ATTEMPTS_LIMIT));
        self
    }

    /// Whether this request may be sent twice, whatever its method (`false`: only failures
    /// that prove it was not processed are retried, and it is not hedged).
    #[must_use]
    pub fn idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = Some(idempotent);
        self
    }

    /// Whether this request may be hedged (when the policy hedges).
    #[must_use]
    pub fn hedge(mut self, hedge: bool) -> Self {
        self.hedge = Some(hedge);
        self
    }
}

/// Which requests may be retried after a failure that *may* have been processed
/// ([`Retryable::IfIdempotent`](crate::Retryable::IfIdempotent)).
///
/// Failures that prove the request was not processed ([`Retryable::Always`](
/// crate::Retryable::Always): connection refused, 429, a declared-safe gRPC code) are
/// retried for every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Idempotency {
    /// GET, HEAD, OPTIONS, TRACE, PUT and DELETE (RFC 9110 §9.2.2), and any HTTP request
    /// carrying an `Idempotency-Key` header. A gRPC call (a POST) is not made idempotent by
    /// an `idempotency-key` in its metadata: no standard server de-duplicates gRPC calls by
    /// it (backstop's `IdempotencyLayer` passes gRPC through), so a retry would run twice.
    #[default]
    Standard,
    /// Every request: the service owner knows all its methods are idempotent.
    All,
    /// No request.
    None,
}

impl Idempotency {
    /// Whether a request with this method and headers is idempotent under the rule.
    pub fn allows(self, method: &Method, headers: &HeaderMap) -> bool {
        self.allows_with(method, || {
            headers.contains_key(IDEMPOTENCY_KEY) && !crate::is_grpc(headers)
        })
    }

    /// As [`allows`](Self::allows), asking `has_key` whether the request carries an
    /// `Idempotency-Key` only when the method alone does not decide.
    pub(crate) fn allows_with(self, method: &Method, has_key: impl FnOnce() -> bool) -> bool {
        match self {
            Idempotency::All => true,
            Idempotency::None => false,
            Idempotency::Standard => {
                matches!(
                    *method,
                    Method::GET
                        | Method::HEAD
                        | Method::OPTIONS
                        | Method::TRACE
                        | Method::PUT
                        | Method::DELETE
                ) || has_key()
            }
        }
    }
}

/// The least time a retry or a hedge must have left of its deadline, once its wait is over,
/// to be sent (fixed: a knob once, which no user had a reason to set). Under a millisecond no
/// dependency answers, and the attempt would only add load; a longer floor is a
/// [`reserve`](RetryConfig::reserve) (a `Duration` is a fixed one), which the presets measure.
pub(crate) const MIN_ATTEMPT_TIME: Duration = Duration::from_millis(1);

/// The longest wait for a server's `Retry-After` or `grpc-retry-pushback-ms` the layer holds a
/// call for (fixed: a knob once). A server asking for longer gets no retry (the call gives up
/// for [`GiveUp::Hint`](crate::client::retry::GiveUp::Hint) and returns the server's answer):
/// a retry sooner than the server asked would break RFC 9110's "ought to wait" and gRFC A6's
/// "retry after the given delay", and a caller without a deadline must not be parked for
/// hours; 30 s is past any overload a retry could still help with. Within it, the deadline
/// decides: a wait that cannot fit before it gives up for the deadline.
pub(crate) const MAX_HINT: Duration = Duration::from_secs(30);

/// What a [`RetryLayer`](crate::client::retry::RetryLayer) does: presets [`RetryConfig::http`] and [`RetryConfig::grpc`], tuned
/// with the knob methods and validated by [`build`](RetryConfig::build).
///
/// Defaults of both presets: 3 attempts (the first included), [`backoff::decorrelated`]
/// from 25 ms to 1 s, a [`RatioBudget`] with its defaults (10 %, 10 s, 10/s reserve), no
/// per-attempt timeout, `max_replay_bytes` 64 KiB, [`Idempotency::Standard`]. Fixed: a
/// retry or a hedge is sent only with at least 1 ms of the deadline left once its wait is over
/// (a longer floor is a [`reserve`](Self::reserve)), and a server's `Retry-After` or pushback
/// is honoured up to 30 s (and never past the deadline).
#[derive(Debug, Clone)]
pub struct RetryConfig<C> {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Arc<dyn Backoff>,
    pub(crate) budget: Option<Arc<dyn Budget>>,
    pub(crate) classifier: C,
    pub(crate) max_replay_bytes: usize,
    pub(crate) idempotency: Idempotency,
    pub(crate) seed: Option<u64>,
    pub(crate) hedging: Option<crate::client::retry::hedge::Hedging>,
    pub(crate) reserve: Option<Arc<dyn RetryReserve>>,
    pub(crate) route: Option<Box<str>>,
    /// The budget is the default one this config made (not given with `budget` or turned off):
    /// a layer [named](crate::client::retry::RetryLayer::named) from it gets a new one.
    pub(crate) own_budget: bool,
}

impl RetryConfig<HttpClassifier> {
    /// The preset for HTTP clients: [`HttpClassifier`] and the defaults above.
    pub fn http() -> Self {
        Self::new(HttpClassifier::new())
    }
}

impl RetryConfig<GrpcClassifier> {
    /// The preset for gRPC clients: [`GrpcClassifier`] (UNAVAILABLE retried, trailers-only
    /// failures only) and the defaults above.
    pub fn grpc() -> Self {
        Self::new(GrpcClassifier::new())
    }
}

impl<C> RetryConfig<C> {
    /// The defaults above with a classifier of your own (as `BreakerConfig::new(classifier)`).
    pub fn new(classifier: C) -> Self {
        Self {
            max_attempts: 3,
            backoff: Arc::new(backoff::decorrelated(
                Duration::from_millis(25),
                Duration::from_secs(1),
            )),
            budget: Some(Arc::new(RatioBudget::new())),
            classifier,
            max_replay_bytes: 64 * 1024,
            idempotency: Idempotency::Standard,
            seed: None,
            hedging: None,
            reserve: None,
            route: None,
            own_budget: true,
        }
    }

    /// Attempts per request, the first one included (default 3, at most 10; 1 turns retries
    /// off: no buffering, no request copy).
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// The backoff strategy (default decorrelated jitter, 25 ms to 1 s).
    #[must_use]
    pub fn backoff(mut self, backoff: impl Backoff + 'static) -> Self {
        self.backoff = Arc::new(backoff);
        self
    }

    /// The least a first retry waits after an attempt failed with no server hint: the
    /// backoff's [`least_first_delay`](Backoff::least_first_delay) (a server's pushback may ask
    /// for less). The client presets tell it to the attempt bound inside.
    pub fn least_retry_wait(&self) -> Duration {
        self.backoff.least_first_delay()
    }

    /// The retry budget, shared with whoever else holds the `Arc`, layers
    /// [named](crate::client::retry::RetryLayer::named) from this one included (default: a new
    /// [`RatioBudget`], shared by all clones of this layer; a named layer gets a new one).
    #[must_use]
    pub fn budget(mut self, budget: Arc<dyn Budget>) -> Self {
        self.budget = Some(budget);
        self.own_budget = false;
        self
    }

    /// No budget: only `max_attempts` bounds retries. Storms are back; see the
    /// [`Budget` docs](crate::client::retry::Budget).
    #[must_use]
    pub fn no_budget(mut self) -> Self {
        self.budget = None;
        self.own_budget = false;
        self
    }

    /// Replaces the classifier.
    #[must_use]
    pub fn classifier<D>(self, classifier: D) -> RetryConfig<D> {
        RetryConfig {
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            budget: self.budget,
            classifier,
            max_replay_bytes: self.max_replay_bytes,
            idempotency: self.idempotency,
            seed: self.seed,
            hedging: self.hedging,
            reserve: self.reserve,
            route: self.route,
            own_budget: self.own_budget,
        }
    }

    /// A retry is only started if, once the wait is over, at least what `reserve` says is
    /// left of the deadline: the time the dependency's calls usually take, so a retry that
    /// could not finish is not sent only to time out (default: none, only the
    /// fixed 1 ms; a `Duration` is a fixed reserve). The client presets pass the
    /// dependency's measured p50 (`AttemptTimeoutLayer::retry_reserve(0.5)`): with a median of 1 s and 260 ms left, the failure is returned at
    /// once, given up for [`GiveUp::Reserve`](crate::client::retry::GiveUp::Reserve). A reserve of `None`
    /// (a latency model not yet trusted) asks for nothing.
    #[must_use]
    pub fn reserve(mut self, reserve: impl RetryReserve + 'static) -> Self {
        self.reserve = Some(Arc::new(reserve));
        self
    }

    /// The most request-body bytes kept for replay (default 64 KiB); a longer body is sent once.
    /// `0` keeps nothing: only requests without a body are retried (or hedged).
    #[must_use]
    pub fn max_replay_bytes(mut self, bytes: usize) -> Self {
        self.max_replay_bytes = bytes;
        self
    }

    /// Which requests count as idempotent (default [`Idempotency::Standard`]).
    #[must_use]
    pub fn idempotency(mut self, idempotency: Idempotency) -> Self {
        self.idempotency = idempotency;
        self
    }

    /// Seeds the per-request random generators from `seed` (request `n` gets a generator
    /// derived from `seed` and `n`), so backoff sequences are exact in tests. Default: random.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Hedges the requests the idempotency rule allows: further copies are sent while the
    /// first is in flight, and the first answer that commits wins (rules in
    /// [`hedge`](crate::client::retry::hedge)). Requests that are not hedged are retried by this policy as
    /// before. Default: no hedging.
    #[must_use]
    pub fn hedging(mut self, hedging: crate::client::retry::hedge::Hedging) -> Self {
        self.hedging = Some(hedging);
        self
    }

    /// Which of the dependency's routes this layer serves, when routes have retry layers of
    /// their own (a gRPC service config builds one per entry, with the entry's methods as
    /// paths, `/pkg.Service/Method`): its metrics carry it as `route`, as a keyed breaker's
    /// and attempt layer's series do, so they join. Default: none (one layer for the whole
    /// dependency, no `route` label).
    #[must_use]
    pub fn route(mut self, route: &str) -> Self {
        self.route = Some(route.into());
        self
    }

    /// Checks every knob (what [`build`](Self::build) does first; its docs list the rules).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        self.backoff.validate()?;
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS_LIMIT {
            return Err(ConfigError::new(
                "max_attempts",
                format!(
                    "must be in 1..={MAX_ATTEMPTS_LIMIT} (the first attempt included), got {}",
                    self.max_attempts
                ),
            ));
        }
        if let Some(hedging) = &self.hedging
            && !(2..=MAX_ATTEMPTS_LIMIT).contains(&hedging.max_attempts)
        {
            return Err(ConfigError::new(
                "hedging.max_attempts",
                format!(
                    "must be in 2..={MAX_ATTEMPTS_LIMIT} (the first attempt included), got {}",
                    hedging.max_attempts
                ),
            ));
        }
        Ok(())
    }
}

impl<C> RetryConfig<C> {
    /// Validates the configuration and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the knob when a knob of the backoff is out of its range
    /// ([`Backoff::validate`](crate::client::retry::backoff::Backoff::validate)), `max_attempts` is 0 or
    /// more than 10, or `hedging.max_attempts` is not in 2..=10.
    pub fn build(self) -> Result<crate::client::retry::RetryLayer<C>, ConfigError> {
        self.validate()?;
        Ok(crate::client::retry::RetryLayer::from_policy(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_rules() {
        let none = HeaderMap::new();
        let mut keyed = HeaderMap::new();
        keyed.insert("idempotency-key", "k1".parse().unwrap());
        for m in [
            Method::GET,
            Method::HEAD,
            Method::PUT,
            Method::DELETE,
            Method::OPTIONS,
        ] {
            assert!(Idempotency::Standard.allows(&m, &none), "{m}");
        }
        assert!(!Idempotency::Standard.allows(&Method::POST, &none));
        assert!(!Idempotency::Standard.allows(&Method::PATCH, &none));
        assert!(Idempotency::Standard.allows(&Method::POST, &keyed));
        assert!(Idempotency::All.allows(&Method::POST, &none));
        assert!(!Idempotency::None.allows(&Method::GET, &keyed));
    }

    #[test]
    fn configuration_is_validated() {
        for n in [0, 11] {
            let err = RetryConfig::http().max_attempts(n).build().unwrap_err();
            assert_eq!(err.knob(), "max_attempts");
        }
        assert!(RetryConfig::grpc().max_attempts(10).build().is_ok());
        // Every backoff knob out of range is named.
        use crate::client::retry::backoff::{decorrelated, decorrelated_v2, exponential};
        let max = Duration::MAX;
        let ms = Duration::from_millis(1);
        // Every backoff knob out of range is named, when the layer is built (the backoff's
        // constructors and setters never fail).
        let build = |b: &dyn Fn(RetryConfig<_>) -> RetryConfig<_>| {
            b(RetryConfig::http()).build().unwrap_err()
        };
        for err in [
            build(&|p| p.backoff(decorrelated(ms, max))),
            build(&|p| p.backoff(exponential(ms, max))),
            build(&|p| p.backoff(decorrelated_v2(ms, Duration::from_secs(3601)))),
        ] {
            assert_eq!(err.knob(), "cap", "{err}");
        }
        let err = build(&|p| p.backoff(decorrelated(Duration::ZERO, ms)));
        assert_eq!(err.knob(), "base");
        // A base past an hour is the base's fault, not the cap's.
        let err = build(&|p| p.backoff(decorrelated(max, max)));
        assert_eq!(err.knob(), "base");
        let err = build(&|p| p.backoff(exponential(ms, ms).multiplier(0.0)));
        assert_eq!(err.knob(), "multiplier");
        let err = build(&|p| {
            p.backoff(crate::client::retry::backoff::constant(
                Duration::from_secs(3601),
            ))
        });
        assert_eq!(err.knob(), "delay");
    }

    /// `max_replay_bytes(0)` keeps nothing: a request with a body goes once, one without a
    /// body is still retried.
    #[tokio::test(start_paused = true)]
    async fn zero_replay_bytes_retries_only_bodiless_requests() {
        use http::{Request, Response};
        use std::sync::atomic::{AtomicU32, Ordering};
        use tower::{Layer, ServiceExt, service_fn};
        for (body, attempts) in [("", 3), ("payload", 1)] {
            let calls = Arc::new(AtomicU32::new(0));
            let seen = calls.clone();
            let failing = service_fn(
                move |_req: Request<crate::client::retry::ReplayBody<String>>| {
                    seen.fetch_add(1, Ordering::SeqCst);
                    async {
                        Ok::<_, std::convert::Infallible>(
                            Response::builder().status(503).body(String::new()).unwrap(),
                        )
                    }
                },
            );
            let layer = RetryConfig::http()
                .max_replay_bytes(0)
                .no_budget()
                .build()
                .unwrap();
            let req = Request::put("http://svc/x").body(body.to_owned()).unwrap();
            let response = layer.layer(failing).oneshot(req).await.unwrap();
            assert_eq!(response.status(), 503);
            assert_eq!(calls.load(Ordering::SeqCst), attempts, "body {body:?}");
        }
    }
}
