//! The stacks the benchmarks compare, built once here so every benchmark measures the same
//! thing: `cargo bench -p backstop-benches`. See `benches/` for the benchmarks themselves.

use backstop::client::breaker::BreakerConfig;
use backstop::client::retry::{ReplayBody, RetryConfig};
use backstop::deadline::PropagateDeadlineLayer;
use http::{Request, Response};
use std::{convert::Infallible, fmt::Debug, future::Ready, sync::Arc, time::Duration};
use tower::{
    Service, ServiceBuilder,
    retry::{
        Policy,
        budget::{Budget, TpsBudget},
    },
    service_fn,
};

/// The request every benchmark sends: a GET with one header and an empty body.
pub fn request() -> Request<String> {
    Request::get("http://svc/x")
        .header("x-request-id", "1")
        .body(String::new())
        .unwrap()
}

/// tower's retry policy as a careful user writes it today: a shared `TpsBudget` (10 s, 10/s,
/// 10 %), at most 2 retries, and the request rebuilt by hand because `http::Request` is not
/// `Clone`.
#[derive(Clone, Debug)]
pub struct TowerPolicy {
    budget: Arc<TpsBudget>,
    retries: usize,
}

impl TowerPolicy {
    /// A policy with a new budget.
    pub fn new() -> Self {
        Self {
            budget: Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.1)),
            retries: 2,
        }
    }
}

impl Default for TowerPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl<B, E> Policy<Request<String>, Response<B>, E> for TowerPolicy {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _req: &mut Request<String>,
        result: &mut Result<Response<B>, E>,
    ) -> Option<Self::Future> {
        match result {
            Ok(r) if !r.status().is_server_error() => {
                self.budget.deposit();
                None
            }
            _ if self.retries > 0 && self.budget.withdraw() => {
                self.retries -= 1;
                Some(std::future::ready(()))
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, req: &Request<String>) -> Option<Request<String>> {
        let mut clone = Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.headers_mut() = req.headers().clone();
        Some(clone)
    }
}

/// A ready service that answers 200 at once.
pub fn bare()
-> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future = impl Send>
+ Clone {
    service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) })
}

/// A dependency behind a retry layer: what the retry layer's inner service must be here.
trait Target:
    Service<
        Request<ReplayBody<String>>,
        Response = Response<String>,
        Error = Infallible,
        Future: Send,
    > + Clone
{
}

impl<S> Target for S where
    S: Service<
            Request<ReplayBody<String>>,
            Response = Response<String>,
            Error = Infallible,
            Future: Send,
        > + Clone
{
}

/// The same as [`bare`], behind a retry layer's replayable body.
fn replay_target() -> impl Target {
    service_fn(|_req: Request<ReplayBody<String>>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    })
}

/// A future that is pending once, waking its task at once, then ready: what a real transport's
/// call does (its first poll waits for the socket), and what makes every layer around it arm
/// its timer. The stacks named `*_pending` answer after it.
#[derive(Debug, Default)]
pub struct PendingOnce(bool);

impl std::future::Future for PendingOnce {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// [`bare`], answering after one pending poll ([`PendingOnce`]).
pub fn bare_pending()
-> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future = impl Send>
+ Clone {
    service_fn(|_req: Request<String>| async {
        PendingOnce::default().await;
        Ok::<_, Infallible>(Response::new(String::new()))
    })
}

/// [`replay_target`], answering after one pending poll ([`PendingOnce`]).
fn replay_target_pending() -> impl Target {
    service_fn(|_req: Request<ReplayBody<String>>| async {
        PendingOnce::default().await;
        Ok::<_, Infallible>(Response::new(String::new()))
    })
}

/// [`tower_timeout`] around [`bare_pending`].
pub fn tower_timeout_pending() -> impl Stack {
    ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .service(bare_pending())
}

/// [`tower_stack`] around [`bare_pending`].
pub fn tower_stack_pending() -> impl Stack {
    ServiceBuilder::new()
        .retry(TowerPolicy::new())
        .timeout(Duration::from_secs(1))
        .service(bare_pending())
}

/// [`backstop_deadline()`] around [`bare_pending`].
pub fn backstop_deadline_pending() -> impl Stack {
    ServiceBuilder::new()
        .layer(one_second_deadline())
        .service(bare_pending())
}

/// [`backstop_full`] around a dependency answering after one pending poll.
pub fn backstop_full_pending() -> impl Stack {
    ServiceBuilder::new()
        .layer(one_second_deadline())
        .layer(RetryConfig::http().build().unwrap())
        .service(replay_target_pending())
}

/// [`backstop_preset`] around a dependency answering after one pending poll.
pub fn backstop_preset_pending() -> impl Stack {
    ServiceBuilder::new()
        .layer(
            preset_1s()
                .attempt(backstop::client::attempt::AttemptBound::Fixed(
                    Duration::from_millis(500),
                ))
                .build()
                .unwrap(),
        )
        .service(replay_target_pending())
}

/// [`backstop_server`] around [`bare_pending`] (measured with [`request_with_timeout`]: a
/// server without a deadline arms no timer).
pub fn backstop_server_pending() -> impl Stack {
    ServiceBuilder::new()
        .layer(backstop::server())
        .service(bare_pending())
}

/// A stack under measurement: a cloneable service of the benches' requests whose errors can be
/// printed (every function below returns one).
pub trait Stack: Service<Request<String>, Error: Debug> + Clone {}

impl<S> Stack for S where S: Service<Request<String>, Error: Debug> + Clone {}

/// tower's `retry` + `TpsBudget` + `timeout` (1 s) around [`bare`].
pub fn tower_stack() -> impl Stack {
    ServiceBuilder::new()
        .retry(TowerPolicy::new())
        .timeout(Duration::from_secs(1))
        .service(bare())
}

/// backstop's `RetryLayer` (HTTP preset, ratio budget) alone.
pub fn backstop_retry() -> impl Stack {
    ServiceBuilder::new()
        .layer(RetryConfig::http().build().unwrap())
        .service(replay_target())
}

/// backstop's `PropagateDeadlineLayer` with a 1 s timeout.
fn one_second_deadline() -> PropagateDeadlineLayer {
    PropagateDeadlineLayer::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// backstop's `PropagateDeadlineLayer` (1 s) around its `RetryLayer`.
pub fn backstop_full() -> impl Stack {
    ServiceBuilder::new()
        .layer(one_second_deadline())
        .layer(RetryConfig::http().build().unwrap())
        .service(replay_target())
}

/// backstop's `BreakerLayer` (HTTP preset: 10 s time window, 50 %, 20 calls minimum) alone.
pub fn backstop_breaker() -> impl Stack {
    ServiceBuilder::new()
        .layer(BreakerConfig::http().build().unwrap())
        .service(bare())
}

/// backstop's `BreakerLayer` with a count window of the last 100 calls.
pub fn backstop_breaker_count() -> impl Stack {
    ServiceBuilder::new()
        .layer(BreakerConfig::http().count_window(100).build().unwrap())
        .service(bare())
}

/// tower-resilience's circuit breaker with the same thresholds (50 %, 20 calls minimum, a
/// 10 s time window, 3 half-open calls, 5 s open). Its time window keeps one record per call
/// of the last 10 s, so its cost grows with the call rate.
pub fn resilience_breaker() -> impl Stack {
    use tower_resilience_circuitbreaker::SlidingWindowType;
    resilience_breaker_with(|b| {
        b.sliding_window_type(SlidingWindowType::TimeBased)
            .sliding_window_duration(Duration::from_secs(10))
    })
}

/// tower-resilience's circuit breaker with a count window of 100 calls.
pub fn resilience_breaker_count() -> impl Stack {
    use tower_resilience_circuitbreaker::SlidingWindowType;
    resilience_breaker_with(|b| {
        b.sliding_window_type(SlidingWindowType::CountBased)
            .sliding_window_size(100)
    })
}

type ResilienceBuilder = tower_resilience_circuitbreaker::CircuitBreakerConfigBuilder<
    tower_resilience_circuitbreaker::DefaultClassifier,
>;

fn resilience_breaker_with(
    window: impl FnOnce(ResilienceBuilder) -> ResilienceBuilder,
) -> impl Service<Request<String>, Response = Response<String>, Error = impl Debug> + Clone {
    use tower_resilience_circuitbreaker::CircuitBreakerLayer;
    let builder = CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .minimum_number_of_calls(20)
        .permitted_calls_in_half_open(3)
        .wait_duration_in_open(Duration::from_secs(5));
    let layer = window(builder).build().unwrap();
    ServiceBuilder::new().layer(layer).service(bare())
}

/// backstop's HTTP client preset (`PropagateDeadline` with a 1 s timeout → retry with the
/// ratio budget → breaker → attempt timeout of 500 ms) around the ready service.
pub fn backstop_preset() -> impl Stack {
    ServiceBuilder::new()
        .layer(
            preset_1s()
                .attempt(backstop::client::attempt::AttemptBound::Fixed(
                    Duration::from_millis(500),
                ))
                .build()
                .unwrap(),
        )
        .service(replay_target())
}

/// The HTTP client preset with `PropagateDeadline`'s 1 s timeout.
fn preset_1s() -> backstop::ClientBuilder<backstop::HttpClassifier> {
    backstop::client::http().timeout(Duration::from_secs(1))
}

/// The HTTP client preset with every default but the deadline's 1 s timeout: attempts bounded
/// by measured latency.
pub fn backstop_preset_adaptive() -> impl Stack {
    ServiceBuilder::new()
        .layer(preset_1s().build().unwrap())
        .service(replay_target())
}

/// An `http::Request` that tower-resilience's retry can clone (it requires `Req: Clone`):
/// cloning rebuilds it, as [`TowerPolicy::clone_request`] does.
#[derive(Debug)]
pub struct Cloneable(pub Request<String>);

impl Clone for Cloneable {
    fn clone(&self) -> Self {
        let req = &self.0;
        let mut clone = Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.headers_mut() = req.headers().clone();
        Self(clone)
    }
}

/// tower-resilience's time-limiter (1 s) + retry (3 attempts) + circuit breaker (count window
/// of 100, 50 %, 20 calls minimum): the nearest thing it has to backstop's client preset.
pub fn resilience_stack() -> impl Stack {
    resilience_around(bare())
}

/// [`resilience_stack`] around [`bare_pending`]: its time limiter arms its timer.
pub fn resilience_stack_pending() -> impl Stack {
    resilience_around(bare_pending())
}

/// [`resilience_stack`]'s layers around `dependency`.
fn resilience_around<S>(dependency: S) -> impl Stack
where
    S: Service<Request<String>, Response = Response<String>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    use tower_resilience_circuitbreaker::{
        CircuitBreakerError, CircuitBreakerLayer, SlidingWindowType,
    };
    use tower_resilience_retry::RetryLayer;
    use tower_resilience_timelimiter::{TimeLimiterError, TimeLimiterLayer};
    type Inner = CircuitBreakerError<TimeLimiterError<Infallible>>;
    let retry = RetryLayer::<Cloneable, Response<String>, Inner>::builder()
        .max_attempts(3)
        .exponential_backoff(Duration::from_millis(10))
        .build();
    let breaker = CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .minimum_number_of_calls(20)
        .sliding_window_type(SlidingWindowType::CountBased)
        .sliding_window_size(100)
        .build()
        .unwrap();
    let limiter = TimeLimiterLayer::builder()
        .timeout_duration(Duration::from_secs(1))
        .cancel_running_future(true)
        .build();
    ServiceBuilder::new()
        .map_request(Cloneable)
        .layer(retry)
        .layer(breaker)
        .layer(limiter)
        .map_request(|c: Cloneable| c.0)
        .service(dependency)
}

/// `tower::timeout` (1 s) alone.
pub fn tower_timeout() -> impl Stack {
    ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .service(bare())
}

/// backstop's `PropagateDeadlineLayer` (1 s) alone.
pub fn backstop_deadline() -> impl Stack {
    ServiceBuilder::new()
        .layer(one_second_deadline())
        .service(bare())
}

/// A breaker forced open: every call is refused (the failure path of an open breaker).
pub fn backstop_open_breaker() -> impl Stack {
    let layer = BreakerConfig::http().build().unwrap();
    layer.set_mode(backstop::client::breaker::Mode::ForcedOpen);
    ServiceBuilder::new().layer(layer).service(bare())
}

/// A dependency behind a retry layer that always answers `status` (503 for the failure paths).
fn answering(status: u16) -> impl Target {
    let status = http::StatusCode::from_u16(status).expect("a valid status");
    service_fn(move |_req: Request<ReplayBody<String>>| async move {
        let mut response = Response::new(String::new());
        *response.status_mut() = status;
        Ok::<_, Infallible>(response)
    })
}

/// backstop's retry layer with an empty budget (no reserve, no deposits) over a dependency
/// that always fails: each call is one attempt and one denied withdrawal.
pub fn backstop_budget_denied() -> impl Stack {
    let budget = backstop::client::retry::RatioBudget::builder()
        .min_per_sec(0)
        .build()
        .unwrap();
    ServiceBuilder::new()
        .layer(
            RetryConfig::http()
                .budget(Arc::new(budget))
                .build()
                .unwrap(),
        )
        .service(answering(503))
}

/// The request a server sees from a caller with a deadline: [`request`] with `grpc-timeout:
/// 1S`.
pub fn request_with_timeout() -> Request<String> {
    Request::get("http://svc/x")
        .header("x-request-id", "1")
        .header(
            backstop::wire::grpc::GRPC_TIMEOUT,
            http::HeaderValue::from_static("1S"),
        )
        .body(String::new())
        .unwrap()
}

/// backstop's server preset (`Deadline → Pushback`) around the ready service.
pub fn backstop_server() -> impl Stack {
    ServiceBuilder::new()
        .layer(backstop::server())
        .service(bare())
}

/// backstop's attempt bound alone (adaptive: the latency model and its cached bound).
pub fn backstop_attempt() -> impl Stack {
    let layer = backstop::client::attempt::AttemptTimeoutLayer::new(
        backstop::client::attempt::AttemptBound::Adaptive(
            backstop::client::attempt::Adaptive::new(),
        ),
    )
    .unwrap();
    ServiceBuilder::new().layer(layer).service(bare())
}

/// backstop's adaptive throttle (HTTP, its defaults) alone: a healthy dependency, so it
/// counts every call and refuses none.
pub fn backstop_throttle() -> impl Stack {
    ServiceBuilder::new()
        .layer(backstop::client::overload::throttle::ThrottleLayer::http())
        .service(bare())
}

/// backstop's bulkhead (64 permits) alone, never full: a permit taken and given back per
/// call.
pub fn backstop_bulkhead() -> impl Stack {
    ServiceBuilder::new()
        .layer(backstop::client::overload::bulkhead::BulkheadLayer::new(64).unwrap())
        .service(bare())
}

/// backstop's deadline-aware admission (its defaults) alone: requests without a deadline
/// are admitted, and each answer is a sample of its route's model.
pub fn backstop_admission() -> impl Stack {
    ServiceBuilder::new()
        .layer(backstop::server::admission::AdmissionLayer::new())
        .service(bare())
}

/// backstop's adaptive limit alone, as the presets make it (a cap of 10 000, learnt from the
/// answers; requests without a deadline).
pub fn backstop_adaptive_limit() -> impl Stack {
    ServiceBuilder::new()
        .layer(
            backstop::client::overload::bulkhead::BulkheadLayer::builder(10_000)
                .max_queue(10_000)
                .adaptive(true)
                .build()
                .unwrap(),
        )
        .service(bare())
}

/// tower-resilience's adaptive concurrency limiter alone, with Gradient2 at its defaults (the
/// algorithm the storm lab found best of its three).
pub fn resilience_adaptive() -> impl Stack {
    use tower_resilience_adaptive::{AdaptiveLimiterLayer, Gradient2};
    ServiceBuilder::new()
        .layer(AdaptiveLimiterLayer::new(
            Gradient2::builder().build().unwrap(),
        ))
        .service(bare())
}

/// tower's `ConcurrencyLimit` (64) alone: the baseline of the bulkhead.
pub fn tower_concurrency_limit() -> impl Stack {
    ServiceBuilder::new().concurrency_limit(64).service(bare())
}

/// tower's `LoadShed` around a `ConcurrencyLimit` (64): tower's way to refuse instead of
/// waiting when full.
pub fn tower_load_shed() -> impl Stack {
    ServiceBuilder::new()
        .load_shed()
        .concurrency_limit(64)
        .service(bare())
}
