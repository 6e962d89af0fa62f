//! The variants: the client and server stacks each one puts around the same dependency.

use crate::scenario::Scenario;
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
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// No retries, no timeout.
    None,
    /// 5 attempts, a fixed 100 ms apart, no deadline, no budget: a hand-written loop.
    Naive,
    /// tower's `retry` (3 attempts, exponential backoff from 50 ms, a shared `TpsBudget` of
    /// 10 % over 10 s) and `timeout` (500 ms per attempt), and its `Hedge` in `tail`: what a
    /// careful user writes today.
    Tower,
    /// tower-resilience 0.14, the peer a user would pick instead of backstop: its adaptive
    /// concurrency limit (`tower-resilience-adaptive`'s `AdaptiveLimiterLayer`), its retry and
    /// its time limiter, configured as a careful user would, with the `tower` variant's
    /// attempts and timeouts. Outermost first:
    ///
    /// - **retry** (`tower-resilience-retry`): 3 attempts, exponential backoff from 50 ms
    ///   (×2), on every error (attempt timeouts among them) and on 5xx answers
    ///   (`retry_on_response`), idempotent methods only (`max_attempts_fn`: a POST gets 1);
    ///   an AIMD retry budget of 1 token per success and 10 per retry (tower's 10 %, as a
    ///   ratio: the crate's token bucket refills on `std`'s clock, which the sim's paused clock
    ///   does not move), 1 000 tokens (100 retries) banked at the start, as tower's 10
    ///   retries/s over 10 s;
    /// - **time limiter** (`tower-resilience-timelimiter`): 500 ms per attempt, cancelling,
    ///   outside the limit. It times `call` only (its docs say readiness is outside its
    ///   budget) and the adaptive layer waits for a permit in `poll_ready` with no deadline,
    ///   so the wait is moved into the call between them (each attempt clones the limited
    ///   service and calls `oneshot` on it): the 500 ms bound the wait for a permit and the
    ///   answer together;
    /// - **adaptive limit** (`AdaptiveLimiterLayer::new(algorithm)`), with the algorithm's
    ///   defaults: AIMD (limit 10 in 1..=100, +1 per success, ×0.5 per failure or answer
    ///   slower than 100 ms), Vegas (10 in 1..=100, α 3, β 6) or Gradient2 (20 in 1..=200,
    ///   smoothing 0.2, tolerance 1.5, a 600-sample window); `--adaptive` picks one,
    ///   [`Adaptive::BEST`] by default. The layer times calls on `std`'s clock; the lab hands
    ///   the algorithm the same latency on tokio's ([`Adaptive`] says how), so the sim sees
    ///   what the real engine does. An answer is a success to the limit whatever its status
    ///   (it counts errors only).
    ///
    /// **Measured** (`overload`, sim, seed 1, 1 000 requests/s for 60 s; goodput, answers in
    /// time per second of the fault, of 400): Gradient2 10.9, AIMD 10.6, Vegas 10.0; none
    /// gets 22.0. Gradient2 is the best by 0.3, which is noise: every algorithm collapses,
    /// for one reason the limit cannot see. Callers wait for a permit in turn, up to the
    /// 500 ms; the one that gets it has little time left, the time limiter drops it before
    /// the answer, the permit goes to the next waiter, and the dependency (told nothing) still
    /// does the dropped work: its queue fills with work for callers that left (182 s of it)
    /// and, once full, answers 503 at once, which the limit reads as fast successes. Other
    /// settings a user might try, same run: the wait bounded by the user's 1 s alone (the time
    /// limiter timing the call only) 20.5–22.0; the timed-out call left running so the limit
    /// counts the work still queued (`cancel_running_future(false)`) 10.0–10.9, the waiters
    /// still time out in turn; 5xx answers counted as failures by the limit, unchanged.
    /// Refusing at once when the limit is reached instead of waiting (tower's `LoadShed` in
    /// front of it, `--shed`) saves it: Gradient2 406.7, AIMD 384.0, Vegas 375.1.
    ///
    /// Used in the scenarios where the dependency's capacity is finite (`overload`,
    /// `overload-chain`, `capacity-drop`), where its limit is what sets it apart; elsewhere
    /// it is tower's retry and timeout under other names, and the other scenarios' tables
    /// stay as they were.
    #[value(name = "tower-resilience")]
    TowerResilience,
    /// backstop's client preset with its defaults in every scenario (the user's deadline
    /// propagated, adaptive throttling, the adaptive concurrency limit, attempts bounded by
    /// measured latency, ratio budget, breaker; measured hedging in `tail`; no bulkhead: the
    /// user is not told the dependency's capacity) and server preset (deadline,
    /// deadline-aware admission, pushback).
    Backstop,
}

impl Variant {
    /// Every variant, in report order.
    pub const ALL: [Variant; 5] = [
        Variant::None,
        Variant::Naive,
        Variant::Tower,
        Variant::TowerResilience,
        Variant::Backstop,
    ];

    /// The variants a scenario runs unless told otherwise: `tower-resilience` only where the
    /// dependency's capacity is finite ([`Scenario::overloads`]), the four others everywhere.
    pub fn defaults(scenario: Scenario) -> Vec<Variant> {
        Self::ALL
            .into_iter()
            .filter(|&v| v != Variant::TowerResilience || scenario.overloads())
            .collect()
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Variant::None => "none",
            Variant::Naive => "naive",
            Variant::Tower => "tower",
            Variant::TowerResilience => "tower-resilience",
            Variant::Backstop => "backstop",
        }
    }
}

/// The algorithm of the `tower-resilience` variant's adaptive limit (`--adaptive`).
///
/// Each is the crate's, with its builder's defaults, wrapped by the lab: the layer measures
/// each call's latency with `std::time::Instant`, which tokio's paused clock (the sim) does
/// not move, so a thin wrapper below the layer times the call on tokio's clock and the
/// algorithm is handed that latency instead of the layer's (the same number in the real
/// engine, where both clocks run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Adaptive {
    /// Additive increase, multiplicative decrease on a failure or a slow answer.
    Aimd,
    /// TCP Vegas: the queue estimated from the latency over the least latency seen.
    Vegas,
    /// Netflix's Gradient2: the latest latency against a long-term average.
    Gradient2,
}

impl Adaptive {
    /// The algorithm with the highest goodput in `overload` (sim engine, seed 1, 1 000
    /// requests/s for 60 s, the lab's defaults): the one the `tower-resilience` variant runs
    /// unless told otherwise. See the variant's docs and the test that keeps this true.
    pub const BEST: Adaptive = Adaptive::Gradient2;

    /// Every algorithm.
    pub const ALL: [Adaptive; 3] = [Adaptive::Aimd, Adaptive::Vegas, Adaptive::Gradient2];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Adaptive::Aimd => "aimd",
            Adaptive::Vegas => "vegas",
            Adaptive::Gradient2 => "gradient2",
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
    /// The `tower-resilience` variant's algorithm.
    pub adaptive: Adaptive,
    /// Whether the `tower-resilience` variant refuses a call at once when its limit is
    /// reached (tower's `LoadShed` in front of it) instead of waiting for a permit.
    pub shed: bool,
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
        Variant::TowerResilience => tower_resilience(transport, config.adaptive, config.shed),
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

/// The `tower-resilience` variant's client stack around `transport` (see
/// [`Variant::TowerResilience`] for what and why).
fn tower_resilience(transport: Svc, adaptive: Adaptive, shed: bool) -> Svc {
    use tower_resilience_adaptive::{AdaptiveLimiterLayer, Aimd, Gradient2, Vegas};
    use tower_resilience_retry::{RetryBudgetBuilder, RetryLayer};
    use tower_resilience_timelimiter::{TimeLimiterError, TimeLimiterLayer};

    // The dependency, timed on tokio's clock for the algorithm (see `LabClock`).
    let timed = BoxCloneService::new(tower::service_fn(move |req: Request<Body>| {
        // Boxed with its type spelled out, as in the engine: rustc cannot prove its `Send`
        // through the trait objects in `Svc` otherwise.
        let call: BoxFuture<Result<Response<Body>, BoxError>> =
            Box::pin(transport.clone().oneshot(req));
        let sent = tokio::time::Instant::now();
        let timed: BoxFuture<Result<Response<Body>, BoxError>> = Box::pin(async move {
            let result = call.await;
            LAST_LATENCY.with(|last| last.set(Some(sent.elapsed())));
            result
        });
        timed
    }));
    let limited: Svc = match adaptive {
        Adaptive::Aimd => limit(
            timed,
            AdaptiveLimiterLayer::new(LabClock(Aimd::builder().build().expect("valid AIMD"))),
        ),
        Adaptive::Vegas => limit(
            timed,
            AdaptiveLimiterLayer::new(LabClock(Vegas::builder().build().expect("valid Vegas"))),
        ),
        Adaptive::Gradient2 => limit(
            timed,
            AdaptiveLimiterLayer::new(LabClock(
                Gradient2::builder().build().expect("valid Gradient2"),
            )),
        ),
    };
    // `--shed`: refused at once when the limit is reached, instead of waiting for a permit.
    let limited = if shed {
        BoxCloneService::new(
            ServiceBuilder::new()
                .map_err(|e: BoxError| e)
                .load_shed()
                .service(limited),
        )
    } else {
        limited
    };
    // The wait for a permit moved into the call, so the time limiter above bounds it.
    let waiting = tower::service_fn(move |req: Request<Bytes>| {
        let call: BoxFuture<Result<Response<Body>, BoxError>> = Box::pin(
            limited
                .clone()
                .oneshot(req.map(|b| boxed(http_body_util::Full::new(b)))),
        );
        call
    });
    let attempt: BoxCloneService<Request<Bytes>, Response<Body>, BoxError> = BoxCloneService::new(
        ServiceBuilder::new()
            .map_err(|e: TimeLimiterError<BoxError>| -> BoxError {
                match e {
                    TimeLimiterError::Inner(e) => e,
                    timeout => Box::new(timeout),
                }
            })
            .layer(
                TimeLimiterLayer::builder()
                    .timeout_duration(Duration::from_millis(500))
                    .build(),
            )
            .service(waiting),
    );
    let budget = RetryBudgetBuilder::new()
        .aimd()
        .deposit_amount(1)
        .withdraw_amount(10)
        .min_budget(10)
        .max_budget(1_000)
        .build()
        .expect("a valid budget");
    let retry = RetryLayer::<Request<Bytes>, Response<Body>, BoxError>::builder()
        .max_attempts_fn(|req: &Request<Bytes>| if req.method().is_idempotent() { 3 } else { 1 })
        .exponential_backoff(Duration::from_millis(50))
        .retry_on(|_: &BoxError| true)
        .retry_on_response(|r: &Response<Body>| r.status().is_server_error())
        .budget(budget)
        .build();
    let retried = BoxCloneService::new(ServiceBuilder::new().layer(retry).service(attempt));
    // The retry clones requests: the body is read whole first (the lab's are a few bytes).
    BoxCloneService::new(tower::service_fn(move |req: Request<Body>| {
        let retried = retried.clone();
        let call: BoxFuture<Result<Response<Body>, BoxError>> = Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await?.to_bytes();
            retried.oneshot(Request::from_parts(parts, bytes)).await
        });
        call
    }))
}

/// `inner` behind tower-resilience's adaptive limit `layer`, errors boxed.
fn limit<A>(inner: Svc, layer: tower_resilience_adaptive::AdaptiveLimiterLayer<A>) -> Svc
where
    A: tower_resilience_adaptive::ConcurrencyAlgorithm + 'static,
{
    use tower_resilience_adaptive::AdaptiveError;
    BoxCloneService::new(
        ServiceBuilder::new()
            .map_err(|e: AdaptiveError<BoxError>| -> BoxError {
                match e {
                    AdaptiveError::Service(e) => e,
                    limit => Box::new(limit),
                }
            })
            .layer(layer)
            .service(inner),
    )
}

thread_local! {
    /// The latency of the call that just completed on this thread, on tokio's clock, set by
    /// the wrapper below the adaptive layer and read by [`LabClock`] within the same poll.
    static LAST_LATENCY: std::cell::Cell<Option<Duration>> = const { std::cell::Cell::new(None) };
}

/// A tower-resilience algorithm handed each call's latency on tokio's clock.
///
/// The adaptive layer times a call from `call` to its answer with `std::time::Instant`. The
/// lab's wrapper just below the layer times the same span on tokio's clock and leaves it in a
/// thread-local as the answer passes up; the layer records the answer in the same poll, on
/// the same thread, so the latency this hands on is that call's. In the real engine the two
/// clocks agree (up to the few instructions between them); in the sim only tokio's moves.
struct LabClock<A>(A);

impl<A: tower_resilience_adaptive::ConcurrencyAlgorithm>
    tower_resilience_adaptive::ConcurrencyAlgorithm for LabClock<A>
{
    fn record_success(&self, latency: Duration) {
        let latency = LAST_LATENCY.with(|last| last.take()).unwrap_or(latency);
        self.0.record_success(latency);
    }

    fn record_success_with_load(&self, latency: Duration, in_flight: usize) {
        let latency = LAST_LATENCY.with(|last| last.take()).unwrap_or(latency);
        self.0.record_success_with_load(latency, in_flight);
    }

    fn record_failure(&self) {
        LAST_LATENCY.with(|last| last.take());
        self.0.record_failure();
    }

    fn record_dropped(&self) {
        self.0.record_dropped();
    }

    fn limit(&self) -> usize {
        self.0.limit()
    }

    fn min_limit(&self) -> usize {
        self.0.min_limit()
    }

    fn max_limit(&self) -> usize {
        self.0.max_limit()
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
