//! The variants: the client and server stacks each one puts around the same dependency.

use backstop::client::attempt::AttemptTimeoutLayer;
use backstop::client::breaker::State;
use backstop::client::overload::bulkhead::BulkheadLayer;
use backstop::client::retry::RetryConfig;
use backstop::{BoxError, ReplayBody};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, combinators::BoxBody};
use serde::Serialize;
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::time::{Sleep, sleep};

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;
use tower::{
    ServiceBuilder, ServiceExt,
    retry::{
        Policy,
        budget::{Budget, TpsBudget},
    },
    util::BoxCloneService,
};

/// Every body in the lab.
pub type Body = BoxBody<Bytes, BoxError>;

/// Every service in the lab: a client stack, a transport, a server stack, a handler.
pub type Svc = BoxCloneService<Request<Body>, Response<Body>, BoxError>;

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// Any body, boxed.
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}

/// A bodiless response with `status`.
pub fn status(code: u16) -> Response<Body> {
    let mut response = Response::new(empty());
    *response.status_mut() = http::StatusCode::from_u16(code).expect("a valid status");
    response
}

/// How callers protect themselves (or do not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// No retries, no timeout.
    None,
    /// 5 attempts, a fixed 100 ms apart, no deadline, no budget: a hand-written loop.
    Naive,
    /// tower's `retry` (3 attempts, exponential backoff from 50 ms, a shared `TpsBudget` of
    /// 10 % over 10 s) and `timeout` (500 ms per attempt), and its `Hedge` in `tail`: what a
    /// careful user writes today.
    Tower,
    /// backstop's client preset with its defaults in every scenario (the user's deadline
    /// propagated, adaptive throttling, the adaptive concurrency limit, attempts bounded by
    /// measured latency, ratio budget, breaker; measured hedging in `tail`; no bulkhead: the
    /// user is not told the dependency's capacity) and server preset (deadline,
    /// deadline-aware admission, pushback).
    Backstop,
}

impl Variant {
    /// Every variant, in report order.
    pub const ALL: [Variant; 4] = [
        Variant::None,
        Variant::Naive,
        Variant::Tower,
        Variant::Backstop,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Variant::None => "none",
            Variant::Naive => "naive",
            Variant::Tower => "tower",
            Variant::Backstop => "backstop",
        }
    }
}

/// What a client stack is tuned with.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Seed for backoff and breaker jitter.
    pub seed: u64,
    /// The user's deadline for a whole request (backstop: the propagated deadline).
    pub deadline: Duration,
    /// Counts transitions to open of every backstop breaker in the run.
    pub opens: Arc<AtomicU64>,
    /// When a backstop breaker first opened, in microseconds from `start` (`u64::MAX`: never).
    pub first_open: Arc<AtomicU64>,
    /// The start of the run.
    pub start: tokio::time::Instant,
    /// Whether the variants that can hedge do (tower: its `Hedge` at p95; backstop: the
    /// preset's measured hedging, 2 attempts).
    pub hedge: bool,
    /// Whether backstop keeps a breaker per path (`partial`: the dependency's routes fail
    /// apart).
    pub per_route: bool,
    /// backstop's bulkhead (`max_concurrency`), for a dependency whose capacity the user
    /// knows; `None` (every scenario: the lab shows what a user gets untuned): the preset's
    /// default, off.
    pub bulkhead: Option<u32>,
    /// The attempt layer of the first backstop client built, so the run can sample what it
    /// measured.
    pub latency: Arc<std::sync::OnceLock<AttemptTimeoutLayer>>,
    /// Whether the dependency de-duplicates `Idempotency-Key`s (`post`: backstop's client
    /// stamps keys: random, so no run depends on which).
    pub keys: bool,
}

fn is_failure(result: &Result<Response<Body>, BoxError>) -> bool {
    match result {
        Ok(response) => response.status().is_server_error(),
        Err(_) => true,
    }
}

fn clone_get(req: &Request<Body>) -> Request<Body> {
    let mut clone = Request::new(empty());
    *clone.method_mut() = req.method().clone();
    *clone.uri_mut() = req.uri().clone();
    *clone.headers_mut() = req.headers().clone();
    clone
}

/// The naive loop: 5 attempts, 100 ms apart, whatever happens.
#[derive(Debug, Clone)]
struct NaivePolicy {
    retries_left: u32,
}

impl Policy<Request<Body>, Response<Body>, BoxError> for NaivePolicy {
    type Future = Sleep;

    fn retry(
        &mut self,
        _req: &mut Request<Body>,
        result: &mut Result<Response<Body>, BoxError>,
    ) -> Option<Sleep> {
        if !is_failure(result) || self.retries_left == 0 {
            return None;
        }
        self.retries_left -= 1;
        Some(sleep(Duration::from_millis(100)))
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        Some(clone_get(req))
    }
}

/// tower's retry as a careful user writes it: a shared budget, exponential backoff, 3
/// attempts.
#[derive(Debug, Clone)]
struct TowerPolicy {
    budget: Arc<TpsBudget>,
    retries_left: u32,
    backoff: Duration,
}

impl Policy<Request<Body>, Response<Body>, BoxError> for TowerPolicy {
    type Future = Sleep;

    fn retry(
        &mut self,
        req: &mut Request<Body>,
        result: &mut Result<Response<Body>, BoxError>,
    ) -> Option<Sleep> {
        if !is_failure(result) {
            self.budget.deposit();
            return None;
        }
        // A careful user retries only what is safe to run twice (RFC 9110's idempotent
        // methods): a POST that failed may have been done.
        if !req.method().is_idempotent() {
            return None;
        }
        if self.retries_left == 0 || !self.budget.withdraw() {
            return None;
        }
        self.retries_left -= 1;
        let wait = self.backoff;
        self.backoff *= 2;
        Some(sleep(wait))
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        Some(clone_get(req))
    }
}

/// tower's `Hedge` policy: every lab request is a bodiless GET, safe to send twice.
#[derive(Debug, Clone)]
struct HedgeGets;

impl tower::hedge::Policy<Request<Body>> for HedgeGets {
    fn clone_request(&self, req: &Request<Body>) -> Option<Request<Body>> {
        Some(clone_get(req))
    }

    fn can_retry(&self, _req: &Request<Body>) -> bool {
        true
    }
}

/// The client stack of `variant` around `transport`. One per hop: its budget and breaker are
/// shared by every request through it.
pub fn client(variant: Variant, transport: Svc, config: &ClientConfig) -> Svc {
    match variant {
        Variant::None => transport,
        Variant::Naive => BoxCloneService::new(
            ServiceBuilder::new()
                .retry(NaivePolicy { retries_left: 4 })
                .service(transport),
        ),
        Variant::Tower => {
            let attempt = ServiceBuilder::new()
                .timeout(Duration::from_millis(500))
                .service(transport);
            // With hedging: a hedge after the p95 (as backstop's) of tower's rotating
            // histogram (10 s periods: it reads the last full period, so it hedges from the
            // end of the first one on, with 100 calls in it), between the retries and the
            // attempt timeout. tower's `Hedge` is not
            // `Clone` (its histogram is shared behind a `Mutex`), so it goes behind a
            // `Buffer`, as tower's docs advise for such services.
            let attempt = if config.hedge {
                let hedge = tower::hedge::Hedge::new(
                    attempt,
                    HedgeGets,
                    100,
                    0.95,
                    Duration::from_secs(10),
                );
                BoxCloneService::new(tower::buffer::Buffer::new(hedge, 4096))
            } else {
                BoxCloneService::new(attempt)
            };
            BoxCloneService::new(
                ServiceBuilder::new()
                    .retry(TowerPolicy {
                        budget: Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.1)),
                        retries_left: 2,
                        backoff: Duration::from_millis(50),
                    })
                    .service(attempt),
            )
        }
        Variant::Backstop => {
            let opens = config.opens.clone();
            let (first_open, start) = (config.first_open.clone(), config.start);
            // The preset's breaker (its open time too: 1 s doubling to 3 s), seeded and
            // counted.
            let mut breaker = backstop::client::http_breaker();
            if config.per_route {
                breaker = breaker.per_key(backstop::RouteKey::Path);
            }
            let breaker = breaker.seed(config.seed).on_state_change(move |t| {
                if t.to == State::Open {
                    opens.fetch_add(1, Ordering::Relaxed);
                    let at = start.elapsed().as_micros() as u64;
                    first_open.fetch_min(at, Ordering::Relaxed);
                }
            });
            let retry = RetryConfig::http().seed(config.seed);
            // A dependency that de-duplicates keys (`post`) answers a retried call from its
            // store, without doing the work again: its callers can afford as many attempts as
            // the naive loop's 5, and a budget that lets half of the successes' worth through
            // (a lost answer per three calls needs 0.43 retries a call).
            let retry = if config.keys {
                let budget = backstop::client::retry::RatioBudget::builder()
                    .ratio(0.5)
                    .build()
                    .expect("valid budget");
                retry.max_attempts(5).budget(Arc::new(budget))
            } else {
                retry
            };
            // The preset's throttle, its refusals drawn from the run's seed.
            let throttle =
                backstop::client::overload::throttle::AdaptiveThrottle::builder().seed(config.seed);
            let mut preset = backstop::client::http()
                .timeout(config.deadline)
                .retry(retry)
                .breaker(breaker)
                .throttle(Some(throttle));
            if config.hedge {
                preset = preset.hedging(0.95, 3);
            }
            if config.keys {
                preset = preset.idempotency_keys(true);
            }
            if let Some(limit) = config.bulkhead {
                preset = preset.bulkhead(BulkheadLayer::builder(limit));
            }
            let preset = preset.build().expect("a valid client stack");
            let _ = config.latency.set(preset.attempt_layer().clone());
            BoxCloneService::new(
                ServiceBuilder::new()
                    .map_response(|r: Response<_>| r.map(boxed))
                    .layer(preset)
                    .map_request(|r: Request<ReplayBody<Body>>| r.map(boxed))
                    .service(transport),
            )
        }
    }
}

/// The server stack of `variant` around `handler`: backstop's server preset for backstop,
/// nothing for the others. With `dedup` (`post`), backstop's also runs the handler behind
/// `IdempotencyLayer` (the embedded store): a keyed POST is done once, its answer replayed.
pub fn server(variant: Variant, handler: Svc, dedup: bool) -> Svc {
    match variant {
        Variant::Backstop if dedup => {
            use backstop::idempotency::{IdempotencyLayer, MemoryStore};
            use http_body_util::Full;
            let once: BoxCloneService<Request<Full<Bytes>>, Response<Body>, BoxError> =
                BoxCloneService::new(
                    ServiceBuilder::new()
                        .map_response(|r: Response<_>| r.map(boxed))
                        .layer(IdempotencyLayer::new(MemoryStore::new()))
                        .map_request(|r: Request<Full<Bytes>>| r.map(boxed))
                        .service(handler),
                );
            // The layer reads a keyed request's body whole and rebuilds it from bytes: the
            // lab's boxed body is collected first (the lab's POSTs carry a few bytes).
            let collected = tower::service_fn(move |req: Request<Body>| {
                let once = once.clone();
                let call: BoxFuture<Result<Response<Body>, BoxError>> = Box::pin(async move {
                    let (parts, body) = req.into_parts();
                    let bytes = body.collect().await?.to_bytes();
                    let request = Request::from_parts(parts, Full::new(bytes));
                    once.oneshot(request).await
                });
                call
            });
            BoxCloneService::new(
                ServiceBuilder::new()
                    .map_response(|r: Response<_>| r.map(boxed))
                    .layer(backstop::server())
                    .service(BoxCloneService::new(collected))
                    .map_err(|never: BoxError| never),
            )
        }
        Variant::Backstop => BoxCloneService::new(
            ServiceBuilder::new()
                .map_response(|r: Response<_>| r.map(boxed))
                .layer(backstop::server())
                .service(handler)
                .map_err(|never: BoxError| never),
        ),
        _ => handler,
    }
}
