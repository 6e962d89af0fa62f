//! Every `Duration` knob of every layer, at zero, one nanosecond and `Duration::MAX`: either
//! `build()` refuses the value with a `ConfigError` naming its knob, or the stack works with
//! it, calls and their timers included, without panicking (an instant past the clock's range
//! saturates to a far future). One row per knob: a new knob is a new row.
//!
//! Defect (outside audit): `attempt_timeout(Duration::MAX)` passed `build()` and panicked on
//! the first pending call (`Instant + Duration` overflowed in the attempt future).

use backstop::client::attempt::{Adaptive, AttemptBound};
use backstop::client::breaker::BreakerConfig;
use backstop::client::overload::bulkhead::BulkheadLayer;
use backstop::client::retry::RatioBudget;
use backstop::client::retry::RetryConfig;
use backstop::client::retry::backoff::{constant, decorrelated, decorrelated_v2, exponential};
use backstop::client::retry::hedge::Hedging;
use backstop::client::{ClientBuilder, ClientLayer};
use backstop::deadline::{DeadlineLayer, PropagateDeadlineLayer};
use backstop::idempotency::{IdempotencyConfig, IdempotencyLayer, MemoryStore};
use backstop::{ConfigError, HttpClassifier, ReplayBody, ServerLayer};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};
use tower::{Layer, ServiceExt, service_fn};

type Client = ClientLayer<HttpClassifier>;

const MS: Duration = Duration::from_millis(1);
const HOUR: Duration = Duration::from_secs(3600);
const VALUES: [Duration; 3] = [Duration::ZERO, Duration::from_nanos(1), Duration::MAX];

/// A client knob: its name, and the preset built with the value.
type ClientRow = (&'static str, fn(Duration) -> Result<Client, ConfigError>);
/// A server knob: its name, and the preset built with the value.
type ServerRow = (
    &'static str,
    fn(Duration) -> Result<ServerLayer, ConfigError>,
);

fn http() -> ClientBuilder<HttpClassifier> {
    backstop::client::http()
}

fn adaptive_client(adaptive: Adaptive) -> Result<Client, ConfigError> {
    http().attempt(AttemptBound::Adaptive(adaptive)).build()
}

fn retry(config: RetryConfig<HttpClassifier>) -> Result<Client, ConfigError> {
    http().retry(config.seed(1)).build()
}

fn breaker(config: BreakerConfig<HttpClassifier>) -> Result<Client, ConfigError> {
    http().breaker(config.seed(1)).build()
}

const CLIENT: &[ClientRow] = &[
    ("timeout", |d| http().timeout(d).build()),
    ("attempt_timeout", |d| {
        http()
            .attempt(backstop::client::attempt::AttemptBound::Fixed(d))
            .build()
    }),
    ("timeout", |d| {
        http()
            .deadline(PropagateDeadlineLayer::builder().timeout(d))
            .build()
    }),
    ("offset", |d| {
        http()
            .deadline(PropagateDeadlineLayer::builder().offset(d))
            .build()
    }),
    ("min_remaining", |d| {
        http()
            .deadline(PropagateDeadlineLayer::builder().min_remaining(d))
            .build()
    }),
    ("floor", |d| adaptive_client(Adaptive::new().floor(d))),
    ("ceiling", |d| adaptive_client(Adaptive::new().ceiling(d))),
    ("max_wait", |d| {
        http()
            .bulkhead(BulkheadLayer::builder(1).max_wait(d))
            .build()
    }),
    ("base", |d| {
        retry(RetryConfig::http().backoff(exponential(d, HOUR)))
    }),
    ("cap", |d| {
        retry(RetryConfig::http().backoff(exponential(MS, d)))
    }),
    ("base", |d| {
        retry(RetryConfig::http().backoff(decorrelated(d, HOUR)))
    }),
    ("cap", |d| {
        retry(RetryConfig::http().backoff(decorrelated(MS, d)))
    }),
    ("median", |d| {
        retry(RetryConfig::http().backoff(decorrelated_v2(d, HOUR)))
    }),
    ("cap", |d| {
        retry(RetryConfig::http().backoff(decorrelated_v2(MS, d)))
    }),
    ("delay", |d| retry(RetryConfig::http().backoff(constant(d)))),
    ("ttl", |d| {
        let budget = RatioBudget::builder().ttl(d).build()?;
        retry(RetryConfig::http().budget(Arc::new(budget)))
    }),
    ("delay", |d| {
        retry(RetryConfig::http().hedging(Hedging::new(d)))
    }),
    ("time_window", |d| {
        breaker(backstop::client::http_breaker().time_window(d, 10))
    }),
    ("slow_calls", |d| {
        breaker(backstop::client::http_breaker().slow_calls(d, 0.5))
    }),
    ("open_duration", |d| {
        breaker(backstop::client::http_breaker().open_duration(d, d))
    }),
    ("open_duration", |d| {
        breaker(backstop::client::http_breaker().open_duration(MS, d))
    }),
    ("slow_start", |d| {
        breaker(backstop::client::http_breaker().slow_start(d))
    }),
];

fn deadline(layer: Result<DeadlineLayer, ConfigError>) -> Result<ServerLayer, ConfigError> {
    Ok(backstop::server().deadline(layer?))
}

const SERVER: &[ServerRow] = &[
    ("max", |d| deadline(DeadlineLayer::builder().max(d).build())),
    ("default_timeout", |d| {
        deadline(DeadlineLayer::builder().default_timeout(d).build())
    }),
    ("min_remaining", |d| {
        deadline(DeadlineLayer::builder().min_remaining(d).build())
    }),
];

/// An idempotency knob (servers): its name, and the layer built with the value.
type KeyedRow = (
    &'static str,
    fn(Duration) -> Result<IdempotencyLayer<MemoryStore>, ConfigError>,
);

fn keyed() -> IdempotencyConfig<MemoryStore> {
    IdempotencyLayer::builder(MemoryStore::new())
}

const IDEMPOTENCY: &[KeyedRow] = &[
    ("ttl", |d| keyed().ttl(d).build()),
    ("lock_timeout", |d| keyed().lock_timeout(d).build()),
    // Below `lock_timeout` (MAX itself is refused): the longest wait it accepts.
    ("wait_in_flight", |d| {
        let d = d.min(Duration::MAX - Duration::from_nanos(1));
        keyed()
            .lock_timeout(Duration::MAX)
            .wait_in_flight(d)
            .build()
    }),
];

/// The requests both sides get: no deadline, a short one, the longest `grpc-timeout`.
fn request(i: u32) -> Request<String> {
    let builder = Request::get(format!("http://dep/{}", i % 2));
    let builder = match i % 3 {
        0 => builder,
        1 => builder.header("grpc-timeout", "50m"),
        _ => builder.header("grpc-timeout", "99999999H"),
    };
    builder.body(String::new()).unwrap()
}

/// The test's own bound on a call: none of the knobs' values may hang it past this.
const GUARD: Duration = Duration::from_secs(3600);

/// Calls through `client` to a dependency that fails at once six times (retries, backoffs,
/// budget, throttle, an open breaker), then answers after a long pause or never (attempt
/// bounds, deadlines, a bulkhead's wait), across a day of virtual time (open times, windows,
/// idle keys, slow start).
async fn exercise_client(client: Client) {
    let calls = Arc::new(AtomicU32::new(0));
    let dependency = service_fn(move |_req: Request<ReplayBody<String>>| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            match n {
                0..6 => {}
                _ if n.is_multiple_of(2) => tokio::time::sleep(Duration::from_secs(5)).await,
                _ => std::future::pending().await,
            }
            let status = if n < 6 { 503 } else { 200 };
            let response = Response::builder().status(status).body(String::new());
            Ok::<_, Infallible>(response.unwrap())
        }
    });
    let service = client.layer(dependency);
    for i in 0..24 {
        let call = service.clone().oneshot(request(i));
        let other = service.clone().oneshot(request(i + 1));
        let _ = tokio::time::timeout(GUARD, futures_util::future::join(call, other)).await;
        tokio::time::advance(Duration::from_secs(3600 * (u64::from(i) % 3))).await;
    }
}

/// Calls through `server` to a handler that answers at once or never, with and without
/// deadlines, across a day of virtual time.
async fn exercise_server(server: ServerLayer) {
    let handler = service_fn(|req: Request<String>| async move {
        if req.uri().path() == "/1" {
            std::future::pending::<()>().await;
        }
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let service = server.layer(handler);
    for i in 0..12 {
        let _ = tokio::time::timeout(GUARD, service.clone().oneshot(request(i))).await;
        tokio::time::advance(Duration::from_secs(3600 * (u64::from(i) % 3))).await;
    }
}

/// POSTs with one key through `layer`, two at a time (the second finds the first in flight),
/// to a handler that answers after a second, across a day of virtual time.
async fn exercise_idempotency(layer: IdempotencyLayer<MemoryStore>) {
    let handler = service_fn(|_req: Request<Full<Bytes>>| async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"charged"))))
    });
    let service = layer.layer(handler);
    let post = || {
        Request::post("/charge")
            .header("idempotency-key", "\"k\"")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    for i in 0..6 {
        let first = service.clone().oneshot(post());
        let second = service.clone().oneshot(post());
        let _ = tokio::time::timeout(GUARD, futures_util::future::join(first, second)).await;
        tokio::time::advance(Duration::from_secs(3600 * (i % 3))).await;
    }
}

/// Runs `exercise` on a paused runtime of its own: `Err` with the panic's message if it
/// panicked.
fn run<F: Future<Output = ()>>(exercise: F) -> Result<(), String> {
    let runtime = backstop_test_support::paused_runtime();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(exercise))).map_err(
        |panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default()
        },
    )
}

/// What one knob did with one value: refused naming `knob`, or ran without a panic.
fn check<L>(
    knob: &str,
    value: Duration,
    built: Result<L, ConfigError>,
    exercise: impl FnOnce(L) -> Result<(), String>,
) -> Option<String> {
    match built {
        Err(e) if e.knob() == knob => None,
        Err(e) => Some(format!(
            "{knob} = {value:?}: refused naming `{}`: {e}",
            e.knob()
        )),
        Ok(layer) => exercise(layer)
            .err()
            .map(|panic| format!("{knob} = {value:?}: built, then panicked: {panic}")),
    }
}

#[test]
fn every_duration_knob_is_refused_or_works_at_zero_one_nanosecond_and_max() {
    let mut failures = Vec::new();
    for &(knob, build) in CLIENT {
        for value in VALUES {
            let built = run_build(|| build(value));
            failures.extend(check(knob, value, built, |c| run(exercise_client(c))));
        }
    }
    for &(knob, build) in SERVER {
        for value in VALUES {
            let built = run_build(|| build(value));
            failures.extend(check(knob, value, built, |s| run(exercise_server(s))));
        }
    }
    for &(knob, build) in IDEMPOTENCY {
        for value in VALUES {
            let built = run_build(|| build(value));
            failures.extend(check(knob, value, built, |l| run(exercise_idempotency(l))));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Builds on a paused runtime (a layer may read the clock when it is built).
fn run_build<L>(build: impl FnOnce() -> Result<L, ConfigError>) -> Result<L, ConfigError> {
    let runtime = backstop_test_support::paused_runtime();
    let _guard = runtime.enter();
    build()
}
