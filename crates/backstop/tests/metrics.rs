//! Each documented metric moves when its event happens (feature `metrics`), read through a
//! recording recorder: the facade's names and labels are what an exporter would publish.
#![cfg(feature = "metrics")]

use backstop::ReplayBody;
use backstop::prelude::*;
use backstop_test_support::{Recorded, grpc_reply as grpc_status, recorded, reply as status};
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

/// The HTTP preset named `inventory`, the dependency most tests here call.
fn inventory() -> backstop::ClientBuilder<HttpClassifier> {
    backstop::client::http().name("inventory")
}

/// The value of `name` with exactly these labels (in any order).
fn value<'a>(
    recorded: &'a Recorded,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'a DebugValue> {
    recorded
        .iter()
        .find(|(key, _)| {
            let key = key.key();
            let mut got: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
            let mut want = labels.to_vec();
            got.sort_unstable();
            want.sort_unstable();
            key.name() == name && got == want
        })
        .map(|(_, value)| value)
}

fn counter(recorded: &Recorded, name: &str, labels: &[(&str, &str)]) -> u64 {
    match value(recorded, name, labels) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{name} {labels:?}: {other:?}"),
    }
}

fn gauge(recorded: &Recorded, name: &str, labels: &[(&str, &str)]) -> f64 {
    match value(recorded, name, labels) {
        Some(DebugValue::Gauge(v)) => v.into_inner(),
        other => panic!("{name} {labels:?}: {other:?}"),
    }
}

const INVENTORY: (&str, &str) = ("dependency", "inventory");

/// `backstop.client.attempts` of the `inventory` stack of this `kind` (`first`, `retry`,
/// `hedge`).
fn attempts(recorded: &Recorded, kind: &str) -> u64 {
    inventory_count(recorded, "backstop.client.attempts", ("kind", kind))
}

/// The counter `name` of the `inventory` stack with this one label besides its `dependency`.
fn inventory_count(recorded: &Recorded, name: &str, label: (&str, &str)) -> u64 {
    counter(recorded, name, &[INVENTORY, label])
}

/// `backstop.client.requests` of the `inventory` stack with this outcome (a failure's, summed
/// over its `error_type`s).
fn outcome(recorded: &Recorded, outcome: &str) -> u64 {
    let requests = "backstop.client.requests";
    if outcome != "failure" {
        return counter(recorded, requests, &[INVENTORY, ("outcome", outcome)]);
    }
    // The `error_type` labels the metrics module's docs list.
    ["status", "timeout", "transport"]
        .iter()
        .map(|e| failures(recorded, e))
        .sum()
}

/// `backstop.client.requests{outcome="failure"}` of the `inventory` stack with this
/// `error_type` (0 when the series was never registered).
fn failures(recorded: &Recorded, error_type: &str) -> u64 {
    let labels = [
        INVENTORY,
        ("outcome", "failure"),
        ("error_type", error_type),
    ];
    match value(recorded, "backstop.client.requests", &labels) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        other => panic!("{labels:?}: {other:?}"),
    }
}

/// The HTTP preset named `inventory`, one attempt a call, with `breaker`.
fn single_attempt(
    breaker: BreakerConfig<HttpClassifier>,
) -> backstop::ClientBuilder<HttpClassifier> {
    inventory().max_attempts(1).breaker(breaker)
}

/// GETs `paths` through the HTTP preset named `inventory`, one attempt each, with `breaker`,
/// from a dependency that answers 503 twice, then 200.
async fn call_through(breaker: BreakerConfig<HttpClassifier>, paths: &[&str]) {
    let mut client = ServiceBuilder::new()
        .layer(single_attempt(breaker).build().unwrap())
        .service(scripted(&[503, 503]));
    for path in paths {
        let req = Request::get(*path).body(String::new()).unwrap();
        let _ = client.ready().await.unwrap().call(req).await;
    }
}

fn get_item() -> Request<String> {
    Request::get("/item/1").body(String::new()).unwrap()
}

/// A gRPC call to `path` carrying `body`.
fn grpc_post<B>(path: &str, body: B) -> Request<B> {
    Request::post(path)
        .header("content-type", "application/grpc")
        .body(body)
        .unwrap()
}

/// A gRPC response (`content-type: application/grpc`) with `body`.
fn grpc_response<B>(body: B) -> Response<B> {
    Response::builder()
        .header("content-type", "application/grpc")
        .body(body)
        .unwrap()
}

/// One empty gRPC message, as a body.
fn empty_message() -> Full<Bytes> {
    Full::new(Bytes::from_static(b"\0\0\0\0\0"))
}

/// Sends one gRPC call to `/bank.Billing/Charge` through `client` and reads its answer whole.
async fn charge<S, B>(client: &S)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
{
    let response = client
        .clone()
        .oneshot(grpc_post("/bank.Billing/Charge", empty_message()))
        .await
        .unwrap();
    let _ = response.into_body().collect().await;
}

/// A service config for `pkg.Billing/GetBalance` alone: up to `max_attempts` on UNAVAILABLE.
#[cfg(feature = "service-config")]
fn billing_config(max_attempts: u32) -> backstop::service_config::ServiceConfig {
    let json = format!(
        r#"{{
        "methodConfig": [{{
            "name": [{{"service": "pkg.Billing", "method": "GetBalance"}}],
            "retryPolicy": {{
                "maxAttempts": {max_attempts}, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
                "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
            }}
        }}]
    }}"#
    );
    backstop::service_config::ServiceConfig::from_json(&json).unwrap()
}

/// Through the gRPC preset named `billing` with [`billing_config`]`(3)`: a call to
/// `GetBalance`, answered UNAVAILABLE and then OK on its retry, then one to `Charge`, OK; each
/// answer after `latency`.
#[cfg(feature = "service-config")]
async fn get_balance_then_charge(latency: Duration) {
    let layer = backstop::client::grpc()
        .name("billing")
        .service_config(billing_config(3))
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let transport = service_fn(move |_req: Request<ReplayBody<String>>| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            Ok::<_, Infallible>(grpc_status(if n == 0 { 14 } else { 0 }))
        }
    });
    let mut client = ServiceBuilder::new().layer(layer).service(transport);
    for path in ["/pkg.Billing/GetBalance", "/pkg.Billing/Charge"] {
        let req = grpc_post(path, String::new());
        client.ready().await.unwrap().call(req).await.unwrap();
    }
}

/// Answers the statuses in `script`, then 200.
fn scripted(
    script: &'static [u16],
) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    let calls = Arc::new(AtomicUsize::new(0));
    service_fn(move |_req: Request<ReplayBody<String>>| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, Infallible>(status(script.get(n).copied().unwrap_or(200))) }
    })
}

#[test]
fn a_retried_call_counts_its_attempts_its_outcome_and_the_budget() {
    let metrics = recorded(|| async {
        let client = ServiceBuilder::new()
            .layer(inventory().build().unwrap())
            .service(scripted(&[503]));
        let response = client.oneshot(get_item()).await.unwrap();
        assert_eq!(response.status(), 200);
    });
    assert_eq!(outcome(&metrics, "success"), 1);
    assert_eq!(outcome(&metrics, "failure"), 0);
    assert_eq!(attempts(&metrics, "first"), 1);
    assert_eq!(attempts(&metrics, "retry"), 1);
    assert_eq!(attempts(&metrics, "hedge"), 0);
    // The ratio budget's reserve, less the retry, plus a tenth for the success.
    let balance = gauge(&metrics, "backstop.retry.budget.balance", &[INVENTORY]);
    assert!(balance > 0.0, "balance {balance}");
}

#[test]
fn a_failure_that_is_not_retried_counts_why() {
    let metrics = recorded(|| async {
        let client = ServiceBuilder::new()
            .layer(inventory().build().unwrap())
            .service(scripted(&[503]));
        let response = client
            .oneshot(Request::post("/orders").body("{}".to_owned()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), 503);
    });
    let give_ups = "backstop.retry.give_ups";
    assert_eq!(
        inventory_count(&metrics, give_ups, ("reason", "not_idempotent")),
        1
    );
    assert_eq!(inventory_count(&metrics, give_ups, ("reason", "budget")), 0);
    assert_eq!(outcome(&metrics, "failure"), 1);
}

/// A failure says what kind it was: a failing status (in the head or the trailers), an
/// attempt or deadline that ran out, or a transport error with no status at all.
#[test]
fn a_failure_is_counted_under_its_error_type() {
    let metrics = recorded(|| async {
        let grpc_client = |transport| {
            ServiceBuilder::new()
                .layer(
                    backstop::client::grpc()
                        .name("inventory")
                        .max_attempts(1)
                        .attempt(backstop::client::attempt::AttemptBound::Fixed(
                            Duration::from_millis(100),
                        ))
                        .build()
                        .unwrap(),
                )
                .service(transport)
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let transport = service_fn(move |_req: Request<ReplayBody<String>>| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    // UNAVAILABLE, trailers-only.
                    0 => Ok(grpc_status(14)),
                    // Hangs past its attempt bound.
                    1 => {
                        tokio::time::sleep(Duration::from_secs(10)).await;
                        Ok(grpc_status(0))
                    }
                    // The connection fails.
                    _ => Err::<Response<String>, BoxError>("connection reset".into()),
                }
            }
        });
        let client = grpc_client(transport);
        for _ in 0..3 {
            let _ = client
                .clone()
                .oneshot(grpc_post("/inventory.Stock/Get", String::new()))
                .await;
        }
    });
    assert_eq!(failures(&metrics, "status"), 1);
    assert_eq!(failures(&metrics, "timeout"), 1);
    assert_eq!(failures(&metrics, "transport"), 1);
    let requests = "backstop.client.requests";
    assert!(
        value(&metrics, requests, &[INVENTORY, ("outcome", "failure")]).is_none(),
        "no failure without its error_type"
    );
}

#[test]
fn a_rate_limit_and_a_caller_error_have_their_own_outcomes() {
    let metrics = recorded(|| async {
        let mut client = ServiceBuilder::new()
            .layer(inventory().max_attempts(1).build().unwrap())
            .service(scripted(&[429, 404]));
        for _ in 0..2 {
            let req = get_item();
            client.ready().await.unwrap().call(req).await.unwrap();
        }
    });
    assert_eq!(outcome(&metrics, "throttled"), 1);
    assert_eq!(outcome(&metrics, "ignored"), 1);
    // One attempt each, never retried: counted as first attempts all the same.
    assert_eq!(attempts(&metrics, "first"), 2);
}

#[test]
fn the_breaker_reports_its_state_its_transitions_and_its_refusals() {
    let metrics = recorded(|| async {
        let breaker = BreakerConfig::http().consecutive_failures(2).jitter(false);
        call_through(breaker, &["/item/1"; 3]).await;
    });
    let state = "backstop.breaker.state";
    assert_eq!(gauge(&metrics, state, &[INVENTORY]), 1.0, "open");
    let transitions = "backstop.breaker.transitions";
    assert_eq!(inventory_count(&metrics, transitions, ("to", "open")), 1);
    assert_eq!(
        inventory_count(&metrics, transitions, ("to", "half_open")),
        0
    );
    assert_eq!(
        counter(&metrics, "backstop.breaker.rejections", &[INVENTORY]),
        1
    );
    assert_eq!(outcome(&metrics, "rejected"), 1);
}

/// What the recorder holds at each step of a test: `test` gets a closure that snapshots it
/// (a snapshot reads counters as the change since the last one, and a gauge as the value
/// last set since then, 0 when none was).
fn recorded_in_steps<F: std::future::Future<Output = ()>>(
    test: impl FnOnce(Box<dyn Fn() -> Recorded>) -> F,
) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let step: Box<dyn Fn() -> Recorded> =
        Box::new(move || backstop_test_support::snapshot(&snapshotter));
    metrics::with_local_recorder(&recorder, || {
        backstop_test_support::paused_runtime().block_on(test(step));
    });
}

/// A breaker that opens, lets a probe through after its open time (half-open) and closes or
/// opens again on the probe's outcome: each transition is counted under its `to`, and the
/// state gauge reads each state while the breaker is in it (2 while the probe is out).
#[test]
fn the_breaker_reports_half_open_between_open_and_its_probes_outcome() {
    for (probe, after) in [(200, "closed"), (503, "open")] {
        recorded_in_steps(|step| async move {
            let breaker = BreakerConfig::http()
                .consecutive_failures(2)
                .probes(1)
                .open_duration(Duration::from_secs(5), Duration::from_secs(60))
                .jitter(false);
            let calls = Arc::new(AtomicUsize::new(0));
            let transport = service_fn(move |_req: Request<ReplayBody<String>>| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    // The probe (the third call) takes 100 ms.
                    let code = match n {
                        0 | 1 => 503,
                        _ => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            probe
                        }
                    };
                    Ok::<_, Infallible>(status(code))
                }
            });
            let client = ServiceBuilder::new()
                .layer(single_attempt(breaker).build().unwrap())
                .service(transport);
            let state = "backstop.breaker.state";
            let transitions = "backstop.breaker.transitions";
            let to = |m: &Recorded, to: &str| counter(m, transitions, &[INVENTORY, ("to", to)]);
            for _ in 0..2 {
                let _ = client.clone().oneshot(get_item()).await;
            }
            let opened = step();
            assert_eq!(gauge(&opened, state, &[INVENTORY]), 1.0, "open");
            assert_eq!(to(&opened, "open"), 1);
            tokio::time::advance(Duration::from_secs(5)).await;
            let probe = tokio::spawn(client.clone().oneshot(get_item()));
            tokio::time::sleep(Duration::from_millis(10)).await;
            let probing = step();
            assert_eq!(gauge(&probing, state, &[INVENTORY]), 2.0, "half-open");
            assert_eq!(to(&probing, "half_open"), 1);
            let _ = probe.await.unwrap();
            let ended = step();
            let code = if after == "open" { 1.0 } else { 0.0 };
            assert_eq!(gauge(&ended, state, &[INVENTORY]), code, "{after}");
            assert_eq!(to(&ended, after), 1, "then {after}");
            assert_eq!(to(&ended, "half_open"), 0);
        });
    }
}

#[test]
fn a_slow_dependency_shows_in_the_duration_histogram_and_the_expired_deadlines() {
    let metrics = recorded(|| async {
        let slow = service_fn(|req: Request<ReplayBody<String>>| async move {
            let wait = if req.uri().path() == "/slow" {
                1_000
            } else {
                20
            };
            tokio::time::sleep(Duration::from_millis(wait)).await;
            Ok::<_, Infallible>(status(200))
        });
        let mut client = ServiceBuilder::new()
            .layer(
                inventory()
                    .timeout(Duration::from_millis(100))
                    // No attempt bound of its own: the deadline ends the slow call (with the
                    // preset's, the attempt would time out first, at 80 % of the deadline).
                    .attempt(AttemptBound::None)
                    .build()
                    .unwrap(),
            )
            .service(slow);
        for path in ["/fast", "/slow"] {
            let req = Request::get(path).body(String::new()).unwrap();
            let _ = client.ready().await.unwrap().call(req).await;
        }
    });
    let expired = "backstop.deadline.expired";
    assert_eq!(inventory_count(&metrics, expired, ("side", "client")), 1);
    let duration = "backstop.client.attempt.duration";
    match value(&metrics, duration, &[INVENTORY]) {
        // The fast call's 20 ms; the slow one was cancelled by its deadline (not an attempt
        // that ended).
        Some(DebugValue::Histogram(samples)) => {
            let samples: Vec<f64> = samples.iter().map(|s| s.into_inner()).collect();
            assert_eq!(samples, [0.02]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(outcome(&metrics, "success"), 1);
    // The expired call is the stack's own answer.
    assert_eq!(outcome(&metrics, "rejected"), 1);
}

/// A gRPC call whose only attempt ran out of its own bound while the caller's deadline had
/// time left: DEADLINE_EXCEEDED with its own message, and no expired deadline counted.
#[test]
fn a_grpc_attempt_timeout_is_not_an_expired_deadline() {
    let metrics = recorded(|| async {
        let hang = service_fn(|_req: Request<ReplayBody<Full<Bytes>>>| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok::<_, Infallible>(grpc_status(0))
        });
        let client = ServiceBuilder::new()
            .layer(
                backstop::client::grpc()
                    .name("inventory")
                    .timeout(Duration::from_secs(5))
                    .attempt(AttemptBound::Fixed(Duration::from_millis(100)))
                    .build()
                    .unwrap(),
            )
            .service(hang);
        let req = grpc_post("/inventory.Stock/Get", empty_message());
        let started = tokio::time::Instant::now();
        let response = client.oneshot(req).await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(100));
        assert_eq!(response.headers()["grpc-status"], "4");
        assert_eq!(response.headers()["grpc-message"], "attempt timed out");
        assert_eq!(
            response.extensions().get::<backstop::Rejection>(),
            Some(&backstop::Rejection::AttemptTimedOut)
        );
    });
    let expired = "backstop.deadline.expired";
    assert_eq!(inventory_count(&metrics, expired, ("side", "client")), 0);
    // The attempt that timed out is the dependency's failure (the breaker counts it).
    assert_eq!(outcome(&metrics, "failure"), 1);
}

/// A gRPC response committed by its headers: the outcome is counted when the trailers come
/// (UNAVAILABLE here: a failure, where the headers alone looked like a success).
#[test]
fn a_grpc_status_in_the_trailers_is_counted_at_the_end_of_the_body() {
    let metrics = recorded(|| async {
        let grpc = service_fn(|_req: Request<ReplayBody<Full<Bytes>>>| async {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", "14".parse().unwrap());
            let body =
                empty_message().with_trailers(async move { Some(Ok::<_, Infallible>(trailers)) });
            Ok::<_, Infallible>(grpc_response(body))
        });
        let client = ServiceBuilder::new()
            .layer(backstop::client::grpc().name("inventory").build().unwrap())
            .service(grpc);
        let req = grpc_post("/inventory.Stock/Get", empty_message());
        let response = client.oneshot(req).await.unwrap();
        let collected = response.into_body().collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "14");
    });
    assert_eq!(outcome(&metrics, "failure"), 1);
    assert_eq!(outcome(&metrics, "success"), 0);
}

/// A server's expired deadlines carry the request's route (its path, for gRPC
/// `/pkg.Service/Method`); a malformed `grpc-timeout` is the caller's bug, counted without one.
#[test]
fn the_server_counts_malformed_headers_and_expired_deadlines() {
    let metrics = recorded(|| async {
        let handler = service_fn(|_req: Request<String>| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, Infallible>(status(200))
        });
        let mut server = ServiceBuilder::new()
            .layer(backstop::server())
            .service(handler);
        for timeout in ["1x", "50m"] {
            let req = Request::post("/svc.Orders/Place")
                .header("content-type", "application/grpc")
                .header("grpc-timeout", timeout)
                .body(String::new())
                .unwrap();
            let response = server.ready().await.unwrap().call(req).await.unwrap();
            assert_ne!(response.headers()["grpc-status"], "0");
        }
        // Refused at arrival (nothing left), over HTTP.
        let req = Request::get("/orders/7")
            .header("grpc-timeout", "0m")
            .body(String::new())
            .unwrap();
        let response = server.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(response.status(), 504);
    });
    assert_eq!(counter(&metrics, "backstop.deadline.malformed", &[]), 1);
    let expired = "backstop.deadline.expired";
    let server = ("side", "server");
    assert_eq!(
        counter(&metrics, expired, &[server, ("route", "/svc.Orders/Place")]),
        1
    );
    assert_eq!(
        counter(&metrics, expired, &[server, ("route", "/orders/7")]),
        1
    );
}

/// A streamed response the server's deadline cuts short is an expired deadline too, under
/// its route (it was not counted at all).
#[test]
fn a_response_body_cut_by_the_server_deadline_is_counted_under_its_route() {
    let metrics = recorded(|| async {
        let handler = service_fn(|_req: Request<String>| async {
            let (mut tx, body) = http_body_util::channel::Channel::<Bytes, Infallible>::new(1);
            tokio::spawn(async move {
                let _ = tx.send_data(Bytes::from_static(b"\0\0\0\0\0")).await;
                tokio::time::sleep(Duration::from_secs(10)).await;
                drop(tx);
            });
            Ok::<_, Infallible>(grpc_response(body))
        });
        let server = ServiceBuilder::new()
            .layer(backstop::server())
            .service(handler);
        let req = Request::post("/feed.Feed/Watch")
            .header("content-type", "application/grpc")
            .header("grpc-timeout", "100m")
            .body(String::new())
            .unwrap();
        let response = server.oneshot(req).await.unwrap();
        let collected = response.into_body().collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "4");
    });
    let expired = "backstop.deadline.expired";
    assert_eq!(
        counter(
            &metrics,
            expired,
            &[("side", "server"), ("route", "/feed.Feed/Watch")]
        ),
        1
    );
}

/// The server's `route` values are bounded, as the admission layer keys its models: a path
/// hashed into a slot another path holds is counted without `route`, so clients sending a
/// thousand paths make at most `routes` series. The preset's deadline layer takes its count
/// from the admission layer, whichever is set last.
#[test]
fn the_servers_routes_are_bounded_by_its_slots() {
    let metrics = recorded(|| async {
        let admission = backstop::server::admission::AdmissionLayer::builder()
            .routes(4)
            .build()
            .unwrap();
        let preset = backstop::server()
            .admission(admission)
            .deadline(backstop::deadline::DeadlineLayer::new());
        let server = ServiceBuilder::new().layer(preset).service(service_fn(
            |_req: Request<String>| async { Ok::<_, Infallible>(status(200)) },
        ));
        for n in 0..1_000 {
            let req = Request::get(format!("/item/{n}"))
                .header("grpc-timeout", "0m")
                .body(String::new())
                .unwrap();
            assert_eq!(server.clone().oneshot(req).await.unwrap().status(), 504);
        }
    });
    let got = series(&metrics, "backstop.deadline.expired");
    let routes = got
        .iter()
        .filter(|(labels, _)| labels.iter().any(|(k, _)| k == "route"))
        .count();
    assert!((1..=4).contains(&routes), "{got:#?}");
    assert_eq!(got.len(), routes + 1, "and one series without a route");
    let total: u64 = got
        .iter()
        .map(|(_, v)| match v {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum();
    assert_eq!(total, 1_000);
}

#[test]
fn a_keyed_breaker_reports_under_its_key() {
    let metrics = recorded(|| async {
        let breaker = backstop::client::http_breaker()
            .consecutive_failures(2)
            .jitter(false)
            .per_key(backstop::RouteKey::Path);
        call_through(breaker, &["/down", "/down", "/down", "/up"]).await;
    });
    let state = "backstop.breaker.state";
    assert_eq!(
        gauge(&metrics, state, &[INVENTORY, ("route", "/down")]),
        1.0
    );
    assert_eq!(gauge(&metrics, state, &[INVENTORY, ("route", "/up")]), 0.0);
    let rejections = "backstop.breaker.rejections";
    assert_eq!(inventory_count(&metrics, rejections, ("route", "/down")), 1);
}

#[cfg(feature = "service-config")]
#[test]
fn a_service_config_labels_each_entry_by_its_methods() {
    let metrics = recorded(|| get_balance_then_charge(Duration::ZERO));
    let billing = ("dependency", "billing");
    let attempts = "backstop.client.attempts";
    let get_balance = ("route", "/pkg.Billing/GetBalance");
    assert_eq!(
        counter(
            &metrics,
            attempts,
            &[billing, get_balance, ("kind", "retry")]
        ),
        1
    );
    let unnamed = ("route", "(none)");
    assert_eq!(
        counter(&metrics, attempts, &[billing, unnamed, ("kind", "first")]),
        1
    );
    assert_eq!(
        counter(&metrics, attempts, &[billing, unnamed, ("kind", "retry")]),
        0
    );
}

/// A service-config client's attempt durations carry the `route` its request and attempt
/// series carry (the methodConfig entry's names), so a route's latency joins its outcomes.
#[cfg(feature = "service-config")]
#[test]
fn a_service_config_labels_its_attempt_durations_by_entry() {
    let metrics = recorded(|| get_balance_then_charge(Duration::from_millis(10)));
    let billing = ("dependency", "billing");
    let duration = "backstop.client.attempt.duration";
    assert_eq!(
        histogram(
            &metrics,
            duration,
            &[billing, ("route", "/pkg.Billing/GetBalance")]
        ),
        [0.01, 0.01],
        "the failed attempt and its retry"
    );
    assert_eq!(
        histogram(&metrics, duration, &[billing, ("route", "(none)")]),
        [0.01]
    );
    assert!(
        value(&metrics, duration, &[billing]).is_none_or(|v| samples(v) == 0),
        "nothing left unrouted"
    );
}

/// A preset whose breaker is keyed by path keys its attempt bound with it: each route's
/// attempt durations carry the route, as its breaker's series do.
#[test]
fn a_keyed_presets_attempt_durations_carry_the_route() {
    let metrics = recorded(|| async {
        let transport = service_fn(|req: Request<ReplayBody<String>>| async move {
            let wait = if req.uri().path() == "/report" {
                40
            } else {
                10
            };
            tokio::time::sleep(Duration::from_millis(wait)).await;
            Ok::<_, Infallible>(status(200))
        });
        let breaker = backstop::client::http_breaker().per_key(backstop::RouteKey::Path);
        let mut client = ServiceBuilder::new()
            .layer(inventory().breaker(breaker).build().unwrap())
            .service(transport);
        for path in ["/item", "/report", "/item"] {
            let req = Request::get(path).body(String::new()).unwrap();
            client.ready().await.unwrap().call(req).await.unwrap();
        }
    });
    let duration = "backstop.client.attempt.duration";
    assert_eq!(
        histogram(&metrics, duration, &[INVENTORY, ("route", "/item")]),
        [0.01, 0.01]
    );
    assert_eq!(
        histogram(&metrics, duration, &[INVENTORY, ("route", "/report")]),
        [0.04]
    );
    let state = "backstop.breaker.state";
    assert_eq!(
        gauge(&metrics, state, &[INVENTORY, ("route", "/report")]),
        0.0
    );
}

/// An operator joins a keyed breaker's series and a service-config client's series on one
/// label: both say `route`, in the form of the request's path.
#[cfg(feature = "service-config")]
#[test]
fn breaker_and_client_series_join_on_the_route() {
    let metrics = recorded(|| async {
        let config = billing_config(2);
        let breaker = backstop::client::grpc_breaker()
            .consecutive_failures(100)
            .per_key(backstop::RouteKey::Path);
        let layer = backstop::client::grpc()
            .name("billing")
            .breaker(breaker)
            .service_config(config)
            .unwrap();
        let transport = service_fn(|_req: Request<ReplayBody<String>>| async {
            Ok::<_, Infallible>(grpc_status(14))
        });
        let mut client = ServiceBuilder::new().layer(layer).service(transport);
        let req = grpc_post("/pkg.Billing/GetBalance", String::new());
        client.ready().await.unwrap().call(req).await.unwrap();
    });
    let billing = ("dependency", "billing");
    let route = ("route", "/pkg.Billing/GetBalance");
    let attempts = "backstop.client.attempts";
    let retries = counter(&metrics, attempts, &[billing, route, ("kind", "retry")]);
    assert_eq!(retries, 1, "the client series carry the route");
    let state = "backstop.breaker.state";
    assert_eq!(
        gauge(&metrics, state, &[billing, route]),
        0.0,
        "so do the breaker's"
    );
}

/// A histogram's samples, for `name` with exactly these labels.
fn histogram(recorded: &Recorded, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    match value(recorded, name, labels) {
        Some(DebugValue::Histogram(samples)) => samples.iter().map(|s| s.into_inner()).collect(),
        other => panic!("{name} {labels:?}: {other:?}\n{recorded:#?}"),
    }
}

/// Under OpenTelemetry's conventions, `SemconvLayer` between the preset and the transport
/// times each attempt of an HTTP call: the 503 that was retried and the 200 that answered,
/// with the server they went to.
#[test]
fn semconv_times_each_http_attempt_with_its_status() {
    use backstop::semconv::SemconvLayer;
    let metrics = recorded(|| async {
        let client = ServiceBuilder::new()
            .layer(inventory().build().unwrap())
            .layer(SemconvLayer::new())
            .service(service_fn({
                let calls = Arc::new(AtomicUsize::new(0));
                move |_req: Request<ReplayBody<String>>| {
                    let n = calls.fetch_add(1, Ordering::SeqCst);
                    async move {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, Infallible>(status(if n == 0 { 503 } else { 200 }))
                    }
                }
            }));
        let req = Request::get("http://inventory.internal/item/1")
            .body(String::new())
            .unwrap();
        assert_eq!(client.oneshot(req).await.unwrap().status(), 200);
    });
    let server = [
        ("http.request.method", "GET"),
        ("server.address", "inventory.internal"),
        ("server.port", "80"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut labels = server.to_vec();
        labels.extend_from_slice(extra);
        labels
    };
    let failed = histogram(
        &metrics,
        "http.client.request.duration",
        &with(&[("http.response.status_code", "503"), ("error.type", "503")]),
    );
    let ok = histogram(
        &metrics,
        "http.client.request.duration",
        &with(&[("http.response.status_code", "200")]),
    );
    // Seconds, each attempt's own 20 ms.
    assert_eq!((failed, ok), (vec![0.02], vec![0.02]));
}

/// A gRPC call is timed until its status, in milliseconds: a trailers-only answer at its
/// headers, a streamed one at its trailers, one whose body is dropped first as CANCELLED;
/// an attempt that ran out of its bound as DEADLINE_EXCEEDED; an HTTP call that failed as
/// `timeout`.
#[test]
fn semconv_times_grpc_calls_until_their_status() {
    use backstop::semconv::SemconvLayer;
    use tower::Layer;
    let metrics = recorded(|| async {
        let grpc = |code: Option<&'static str>, wait: u64| {
            SemconvLayer::new().layer(service_fn(move |_req: Request<String>| async move {
                tokio::time::sleep(Duration::from_millis(wait)).await;
                let response = match code {
                    Some(code) => grpc_status(code.parse().unwrap()),
                    None => {
                        // Streamed: data, then the status in trailers 10 ms later.
                        let (mut tx, body) =
                            http_body_util::channel::Channel::<Bytes, Infallible>::new(2);
                        tokio::spawn(async move {
                            tx.send_data(Bytes::from_static(b"\0\0\0\0\0"))
                                .await
                                .unwrap();
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            let mut trailers = HeaderMap::new();
                            trailers.insert("grpc-status", "0".parse().unwrap());
                            let _ = tx.send_trailers(trailers).await;
                        });
                        return Ok::<_, Infallible>(grpc_response(body.boxed()));
                    }
                };
                Ok(response.map(|b| Full::new(Bytes::from(b)).boxed()))
            }))
        };
        let call = || grpc_post("http://stock:50051/stock.Stock/Get", String::new());
        let _ = grpc(Some("14"), 5).oneshot(call()).await.unwrap();
        let streamed = grpc(None, 5).oneshot(call()).await.unwrap();
        let _ = streamed.into_body().collect().await.unwrap();
        let dropped = grpc(None, 5).oneshot(call()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(3)).await;
        drop(dropped);
        // An attempt bound of 30 ms around a dependency that never answers.
        let bound =
            AttemptTimeoutLayer::new(AttemptBound::Fixed(Duration::from_millis(30))).unwrap();
        let hung = || {
            SemconvLayer::new().layer(bound.layer(service_fn(|_req: Request<String>| async {
                std::future::pending::<()>().await;
                Ok::<_, Infallible>(Response::new(String::new()))
            })))
        };
        let _ = hung().oneshot(call()).await.unwrap_err();
        let get = Request::get("https://partner/v1")
            .body(String::new())
            .unwrap();
        let _ = hung().oneshot(get).await.unwrap_err();
    });
    let rpc = |code: &'static str| {
        vec![
            ("rpc.system", "grpc"),
            ("rpc.service", "stock.Stock"),
            ("rpc.method", "Get"),
            ("server.address", "stock"),
            ("server.port", "50051"),
            ("rpc.grpc.status_code", code),
        ]
    };
    assert_eq!(
        histogram(&metrics, "rpc.client.duration", &rpc("14")),
        [5.0]
    );
    assert_eq!(
        histogram(&metrics, "rpc.client.duration", &rpc("0")),
        [15.0]
    );
    assert_eq!(histogram(&metrics, "rpc.client.duration", &rpc("1")), [8.0]);
    assert_eq!(
        histogram(&metrics, "rpc.client.duration", &rpc("4")),
        [30.0]
    );
    let timeout = [
        ("http.request.method", "GET"),
        ("server.address", "partner"),
        ("server.port", "443"),
        ("error.type", "timeout"),
    ];
    assert_eq!(
        histogram(&metrics, "http.client.request.duration", &timeout),
        [0.03]
    );
}

/// A dependency that answers 503 after 5 ms, counting the calls it is sent.
fn overloaded(
    hits: &Arc<AtomicUsize>,
) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    let hits = hits.clone();
    service_fn(move |_req: Request<ReplayBody<String>>| {
        hits.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok::<_, Infallible>(status(503))
        }
    })
}

/// The probability gauge follows the throttle's recomputes, not only its refusals: once the
/// dependency answers again and the throttle has let go, it reads 0 (it kept the last
/// refusal's value before).
/// The adaptive throttle these tests share, seeded so its draws repeat.
fn seeded_throttle() -> backstop::client::overload::throttle::AdaptiveThrottleBuilder {
    backstop::client::overload::throttle::AdaptiveThrottle::builder().seed(28)
}

/// The HTTP preset named `inventory`, one attempt, behind `throttle`, with a breaker that
/// never opens: every call the throttle lets through is sent.
fn throttled_inventory(
    throttle: backstop::client::overload::throttle::AdaptiveThrottleBuilder,
) -> backstop::client::ClientLayer<HttpClassifier> {
    let breaker = BreakerConfig::http()
        .count_window(100_000)
        .minimum_calls(100_000);
    single_attempt(breaker)
        .throttle(Some(throttle))
        .build()
        .unwrap()
}

#[test]
fn the_throttle_probability_falls_back_when_the_dependency_recovers() {
    let metrics = recorded(|| async {
        let inventory = throttled_inventory(seeded_throttle());
        let throttle = inventory.throttle_layer().throttle().clone();
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let fails = failing.clone();
        let dependency = service_fn(move |_req: Request<ReplayBody<String>>| {
            let code = if fails.load(Ordering::SeqCst) {
                503
            } else {
                200
            };
            async move { Ok::<_, Infallible>(status(code)) }
        });
        let client = ServiceBuilder::new().layer(inventory).service(dependency);
        let call = || client.clone().oneshot(get_item());
        for _ in 0..300 {
            let _ = call().await;
            tokio::time::advance(Duration::from_millis(20)).await;
        }
        failing.store(false, Ordering::SeqCst);
        // 40 s of answers: longer than the 30 s window.
        // Three minutes of answers: the refusals counted as requests leave the 30 s window
        // over a few window lengths (the SRE rule halves its excess over K per window).
        for _ in 0..1800 {
            let _ = call().await;
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        assert_eq!(throttle.probability(), 0.0, "the throttle let go");
    });
    let rejections = "backstop.throttle.rejections";
    assert!(
        counter(&metrics, rejections, &[INVENTORY]) > 0,
        "it refused"
    );
    let p = gauge(&metrics, "backstop.throttle.probability", &[INVENTORY]);
    assert_eq!(p, 0.0, "the gauge fell back with the probability");
}

#[test]
fn a_throttle_refusal_counts_under_its_dependency_with_the_probability() {
    let refused = Arc::new(AtomicUsize::new(0));
    let metrics = recorded(|| {
        let refused = refused.clone();
        async move {
            let hits = Arc::new(AtomicUsize::new(0));
            let client = ServiceBuilder::new()
                .layer(throttled_inventory(seeded_throttle()))
                .service(overloaded(&hits));
            for _ in 0..300 {
                if client.clone().oneshot(get_item()).await.is_err() {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::advance(Duration::from_millis(20)).await;
            }
            assert_eq!(
                hits.load(Ordering::SeqCst) + refused.load(Ordering::SeqCst),
                300
            );
        }
    });
    let refused = refused.load(Ordering::SeqCst) as u64;
    assert!(refused >= 100, "{refused} refused");
    let rejections = "backstop.throttle.rejections";
    assert_eq!(counter(&metrics, rejections, &[INVENTORY]), refused);
    // The probability the last refusal was drawn against: above 0, at most the default cap.
    let p = gauge(&metrics, "backstop.throttle.probability", &[INVENTORY]);
    assert!(p > 0.0 && p <= 0.9, "{p}");
    // A refusal never reached the retry layer: no request outcome, no attempt for it.
    assert_eq!(attempts(&metrics, "first"), 300 - refused);
}

#[test]
fn a_full_bulkhead_counts_each_refusal_under_the_knob_that_refused_it() {
    let metrics = recorded(|| async {
        let bulkhead = backstop::client::overload::bulkhead::BulkheadLayer::builder(1)
            .max_queue(1)
            .max_wait(Duration::from_millis(50));
        let client = ServiceBuilder::new()
            .layer(
                inventory()
                    .max_attempts(1)
                    .bulkhead(bulkhead)
                    .build()
                    .unwrap(),
            )
            .service(service_fn(|_req: Request<ReplayBody<String>>| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, Infallible>(status(200))
            }));
        let within = |ms: u64| {
            let mut req = get_item();
            req.extensions_mut()
                .insert(backstop::deadline::Deadline::after(Duration::from_millis(
                    ms,
                )));
            req
        };
        let knob = |err: BoxError| {
            backstop::find::<backstop::BulkheadFull>(err.as_ref())
                .expect("a bulkhead refusal")
                .knob()
                .to_owned()
        };
        // One call holds the one permit 300 ms; the next waits (hold time not yet known)…
        let holder = tokio::spawn(client.clone().oneshot(within(1_000)));
        tokio::task::yield_now().await;
        let waiter = tokio::spawn(client.clone().oneshot(within(1_000)));
        tokio::task::yield_now().await;
        // …so a third finds the queue full,
        let err = client.clone().oneshot(within(1_000)).await.unwrap_err();
        assert_eq!(knob(err), "max_queue");
        // and the waiter gives up after max_wait.
        assert_eq!(knob(waiter.await.unwrap().unwrap_err()), "max_wait");
        assert!(holder.await.unwrap().is_ok());
        // Now a call is known to hold its permit 300 ms: one with 200 ms left is refused at once.
        let holder = tokio::spawn(client.clone().oneshot(within(1_000)));
        tokio::task::yield_now().await;
        let err = client.clone().oneshot(within(200)).await.unwrap_err();
        assert_eq!(knob(err), "max_concurrency");
        assert!(holder.await.unwrap().is_ok());
    });
    let rejections = "backstop.bulkhead.rejections";
    for reason in ["max_queue", "max_wait", "max_concurrency"] {
        assert_eq!(
            inventory_count(&metrics, rejections, ("reason", reason)),
            1,
            "{reason}"
        );
    }
    // The refused calls were never sent: two first attempts, both answered.
    assert_eq!(attempts(&metrics, "first"), 2);
    assert_eq!(outcome(&metrics, "success"), 2);
}

/// An admission refusal carries its route: the path that holds the latency model that
/// refused it (for gRPC, `/pkg.Service/Method`).
#[test]
fn an_admission_refusal_is_counted_under_its_route() {
    let calls = Arc::new(AtomicUsize::new(0));
    let metrics = recorded(|| {
        let calls = calls.clone();
        async move {
            let handler = service_fn(move |_req: Request<String>| {
                calls.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, Infallible>(status(200))
                }
            });
            let server = ServiceBuilder::new()
                .layer(backstop::server())
                .service(handler);
            let http = |timeout: &str| {
                Request::get("/report")
                    .header("grpc-timeout", timeout)
                    .body(String::new())
                    .unwrap()
            };
            let grpc = |timeout: &str| {
                let mut req = grpc_post("/pkg.Reports/Get", String::new());
                let value = http::HeaderValue::from_str(timeout).unwrap();
                req.headers_mut().insert("grpc-timeout", value);
                req
            };
            // Each route's model learns that the handler takes 100 ms (100 answers).
            for _ in 0..100 {
                assert_eq!(
                    server.clone().oneshot(http("1S")).await.unwrap().status(),
                    200
                );
                assert_eq!(
                    server.clone().oneshot(grpc("1S")).await.unwrap().status(),
                    200
                );
            }
            tokio::time::advance(Duration::from_millis(100)).await;
            // 50 ms left: refused on arrival, over HTTP and over gRPC.
            assert_eq!(
                server.clone().oneshot(http("50m")).await.unwrap().status(),
                504
            );
            let response = server.clone().oneshot(grpc("50m")).await.unwrap();
            assert_eq!(response.headers()["grpc-status"], "4");
        }
    });
    assert_eq!(
        calls.load(Ordering::SeqCst),
        200,
        "the handler was not called"
    );
    let rejections = "backstop.admission.rejections";
    assert_eq!(counter(&metrics, rejections, &[("route", "/report")]), 1);
    assert_eq!(
        counter(&metrics, rejections, &[("route", "/pkg.Reports/Get")]),
        1
    );
}

/// `ThrottleLayer::with` docs: layers built with the same `AdaptiveThrottle` share
/// one window; the module docs say the `backstop.throttle.probability` gauge follows every
/// recompute after the first refusal. Only the first layer's gauge is ever attached
/// (`OnceLock`): the second dependency's series keeps its refusal-time value forever.
#[test]
fn every_layer_sharing_a_throttle_reports_its_probability() {
    let metrics = recorded(|| async {
        let shared = std::sync::Arc::new(seeded_throttle().build().unwrap());
        let layer =
            |name: &str| ThrottleLayer::with(shared.clone(), HttpClassifier::new()).named(name);
        let ok = service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        });
        let a = ServiceBuilder::new().layer(layer("a")).service(ok);
        let b = ServiceBuilder::new().layer(layer("b")).service(ok);
        for _ in 0..1_000 {
            shared.record_request();
        }
        tokio::time::advance(Duration::from_millis(200)).await;
        // Both refuse (p = 0.9 with this seed for the first draws).
        for _ in 0..20 {
            let _ = a.clone().oneshot(Request::new(String::new())).await;
            let _ = b.clone().oneshot(Request::new(String::new())).await;
        }
        // The refusals leave the window: p = 0, recomputed on the next calls.
        tokio::time::advance(Duration::from_secs(31)).await;
        for _ in 0..5 {
            a.clone()
                .oneshot(Request::new(String::new()))
                .await
                .unwrap();
            b.clone()
                .oneshot(Request::new(String::new()))
                .await
                .unwrap();
            tokio::time::advance(Duration::from_millis(200)).await;
        }
        assert_eq!(shared.probability(), 0.0);
    });
    let gauges: Vec<(String, f64)> = series(&metrics, "backstop.throttle.probability")
        .into_iter()
        .map(|(labels, v)| {
            let dep = labels[0].1.clone();
            let DebugValue::Gauge(v) = v else { panic!() };
            (dep, v.into_inner())
        })
        .collect();
    assert_eq!(gauges.len(), 2, "{gauges:?}");
    for (dep, p) in &gauges {
        assert_eq!(
            *p, 0.0,
            "dependency {dep}: the gauge reads {p}, the throttle 0 ({gauges:?})"
        );
    }
}

// SemconvLayer in its documented place, between a client preset and the transport: every
// attempt is one sample, including those the attempt bound outside drops (timed out) and
// those a proxy answers without a gRPC status (cases an outside review found unrecorded or
// misrecorded).

/// Every series of `name`: its labels (sorted) and value.
fn series<'a>(recorded: &'a Recorded, name: &str) -> Vec<(Vec<(String, String)>, &'a DebugValue)> {
    recorded
        .iter()
        .filter(|(k, _)| k.key().name() == name)
        .map(|(k, v)| {
            let mut labels: Vec<(String, String)> = k
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            (labels, v)
        })
        .collect()
}

/// `preset` with 300 ms per call and each attempt bounded at 30 ms.
fn bounded<C: Clone + Send + Sync + 'static>(
    preset: backstop::ClientBuilder<C>,
) -> backstop::ClientLayer<C> {
    preset
        .timeout(Duration::from_millis(300))
        .attempt(AttemptBound::Fixed(Duration::from_millis(30)))
        .build()
        .unwrap()
}

fn samples(v: &DebugValue) -> usize {
    match v {
        DebugValue::Histogram(s) => s.len(),
        _ => 0,
    }
}

/// Between a client preset and the transport, each attempt is a sample, also one the preset's
/// attempt bound (outside the layer) drops when it runs out: the slow calls a latency
/// histogram exists for, recorded with `error.type = timeout`.
#[test]
fn every_attempt_the_bound_ended_is_a_sample() {
    use backstop::semconv::SemconvLayer;
    let sent = Arc::new(AtomicUsize::new(0));
    let hits = sent.clone();
    let metrics = recorded(|| async move {
        let client = ServiceBuilder::new()
            .layer(bounded(backstop::client::http().name("partner")))
            .layer(SemconvLayer::new())
            .service(service_fn(move |_req: Request<ReplayBody<String>>| {
                hits.fetch_add(1, Ordering::SeqCst);
                async {
                    std::future::pending::<()>().await;
                    Ok::<_, Infallible>(status(200))
                }
            }));
        let get = Request::get("https://partner/v1")
            .body(String::new())
            .unwrap();
        client.oneshot(get).await.unwrap_err();
    });
    let sent = sent.load(Ordering::SeqCst);
    let recorded_samples: usize = series(&metrics, "http.client.request.duration")
        .iter()
        .map(|(_, v)| samples(v))
        .sum();
    assert!(sent >= 1);
    assert_eq!(
        recorded_samples,
        sent,
        "{sent} attempts reached the transport through SemconvLayer, {recorded_samples} \
         http.client.request.duration samples: {:#?}",
        series(&metrics, "http.client.request.duration")
    );
    let timeout = ("error.type".to_owned(), "timeout".to_owned());
    for (labels, _) in series(&metrics, "http.client.request.duration") {
        assert!(labels.contains(&timeout), "{labels:?}");
    }
}

/// The same for gRPC: a call behind the gRPC preset whose attempts hang is recorded with
/// `rpc.grpc.status_code = 4`.
#[test]
fn a_grpc_attempt_the_bound_ended_is_deadline_exceeded() {
    use backstop::semconv::SemconvLayer;
    let metrics = recorded(|| async {
        let client = ServiceBuilder::new()
            .layer(bounded(backstop::client::grpc().name("stock")))
            .layer(SemconvLayer::new().server("stock", 50051))
            .service(service_fn(|_req: Request<ReplayBody<String>>| async {
                std::future::pending::<()>().await;
                Ok::<_, Infallible>(status(200))
            }));
        let req = grpc_post("/stock.Stock/Get", String::new());
        let _ = client.oneshot(req).await;
    });
    let got = series(&metrics, "rpc.client.duration");
    assert!(
        got.iter().any(|(labels, v)| samples(v) > 0
            && labels.contains(&("rpc.grpc.status_code".into(), "4".into()))),
        "no rpc.client.duration sample with status 4: {got:#?}"
    );
}

/// gRPC's HTTP-to-gRPC status mapping (and tonic, which reports it): an HTTP 503 without a
/// grpc-status (a proxy's or load balancer's answer) is UNAVAILABLE (14), and so is its
/// sample, as the status the caller gets.
#[test]
fn a_grpc_call_a_proxy_answered_503_is_unavailable() {
    use backstop::semconv::SemconvLayer;
    use tower::Layer;
    let metrics = recorded(|| async {
        let svc = SemconvLayer::new().layer(service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(503)
                    .header("content-type", "text/plain")
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        }));
        let req = grpc_post("http://stock:50051/stock.Stock/Get", String::new());
        let response = svc.oneshot(req).await.unwrap();
        let _ = response.into_body().collect().await;
    });
    let got = series(&metrics, "rpc.client.duration");
    assert!(
        got.iter().any(|(labels, v)| samples(v) == 1
            && labels.contains(&("rpc.grpc.status_code".into(), "14".into()))),
        "{got:#?}"
    );
}

/// Defect (outside audit): an IPv6 URI's host is `[::1]`, and `server.address` was recorded
/// with its brackets; OpenTelemetry's `server.address` is the address alone (`::1`). The same
/// for an address given to `SemconvLayer::server`.
#[test]
fn semconv_records_an_ipv6_server_address_without_brackets() {
    use backstop::semconv::SemconvLayer;
    use tower::Layer;
    let metrics = recorded(|| async {
        let answering = || {
            service_fn(|_req: Request<String>| async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok::<_, Infallible>(status(200))
            })
        };
        let req = Request::get("http://[::1]:8080/item")
            .body(String::new())
            .unwrap();
        let client = SemconvLayer::new().layer(answering());
        assert_eq!(client.oneshot(req).await.unwrap().status(), 200);
        // No host in the URI: the configured server's, brackets or not.
        let client = SemconvLayer::new()
            .server("[2001:db8::7]", 443)
            .layer(answering());
        let req = Request::get("/item").body(String::new()).unwrap();
        assert_eq!(client.oneshot(req).await.unwrap().status(), 200);
    });
    for (address, port) in [("::1", "8080"), ("2001:db8::7", "443")] {
        let labels = [
            ("http.request.method", "GET"),
            ("server.address", address),
            ("server.port", port),
            ("http.response.status_code", "200"),
        ];
        let seconds = histogram(&metrics, "http.client.request.duration", &labels);
        assert_eq!(seconds, vec![0.02], "{address}");
    }
}

/// Each sample's last label under `name`: `error.type` (HTTP; `-` for none) or
/// `rpc.grpc.status_code` (gRPC), with how many samples carry it, sorted.
fn ends(recorded: &Recorded, name: &str) -> Vec<(String, usize)> {
    let mut ends: Vec<(String, usize)> = series(recorded, name)
        .into_iter()
        .filter(|(_, v)| samples(v) > 0)
        .map(|(labels, v)| {
            let end = labels
                .iter()
                .find(|(k, _)| k == "error.type" || k == "rpc.grpc.status_code")
                .map_or("-".to_owned(), |(_, v)| v.clone());
            (end, samples(v))
        })
        .collect();
    ends.sort();
    ends
}

/// The `SemconvLayer` table: every local outcome, with the layer where its docs put it
/// (between the preset and the transport) or, for the stack's refusals, around the whole
/// client (there it sees the stack's own answers), gets OpenTelemetry's `error.type` (HTTP) or
/// `rpc.grpc.status_code` (gRPC). An attempt cut by its bound is a timeout (4) with a
/// deadline or without one, and whether or not `grpc-timeout` is sent; a hedge that lost is
/// cancelled (1); a refusal is its own low-cardinality class (gRPC: UNAVAILABLE, 14).
#[test]
fn semconv_gives_every_local_outcome_its_error_type_and_status() {
    use backstop::client::breaker::Mode;
    use backstop::client::overload::bulkhead::BulkheadLayer;
    use backstop::client::overload::throttle::{AdaptiveThrottle, AdaptiveThrottleBuilder};
    use backstop::client::retry::RetryOverrides;
    use backstop::client::retry::hedge::Hedging;
    use backstop::semconv::SemconvLayer;
    const MS: Duration = Duration::from_millis(1);
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Case {
        AttemptTimedOut,
        AttemptTimedOutNoHeader,
        ShareCutNoHeader,
        DeadlineExceeded,
        HedgeLost,
        BreakerOpen,
        Throttled,
        BulkheadFull,
    }
    use Case::*;
    fn throttled() -> AdaptiveThrottleBuilder {
        AdaptiveThrottle::builder().max_probability(1.0).seed(7)
    }
    // Attempt 1 hangs; later ones (a hedge) answer after 5 ms, except under `hang`.
    fn dependency(
        grpc: bool,
        hang: bool,
    ) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
        let calls = Arc::new(AtomicUsize::new(0));
        service_fn(move |_req: Request<ReplayBody<String>>| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 || hang {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(if grpc { grpc_status(0) } else { status(200) })
            }
        })
    }
    macro_rules! run {
        ($preset:expr, $classifier:expr, $grpc:expr, $case:expr, $deadline:expr) => {{
            let case = $case;
            let mut layer = $preset;
            if let Some(ms) = $deadline {
                layer = layer.timeout(Duration::from_millis(ms));
            }
            match case {
                AttemptTimedOut => {
                    layer = layer.attempt(backstop::client::attempt::AttemptBound::Fixed(30 * MS))
                }
                AttemptTimedOutNoHeader => {
                    layer = layer
                        .attempt(backstop::client::attempt::AttemptBound::Fixed(30 * MS))
                        .send_grpc_timeout(false)
                }
                ShareCutNoHeader => layer = layer.send_grpc_timeout(false),
                DeadlineExceeded => {}
                HedgeLost => {
                    let hedging = Hedging::new(20 * MS).max_attempts(2);
                    layer = layer.retry(RetryConfig::new($classifier).hedging(hedging))
                }
                BreakerOpen => {}
                Throttled => layer = layer.throttle(Some(throttled())),
                BulkheadFull => {
                    let bulkhead = BulkheadLayer::builder(1).max_wait(50 * MS);
                    layer = layer.bulkhead(bulkhead)
                }
            }
            let layer = layer.build().unwrap();
            if matches!(case, Throttled) {
                // 1000 requests and no answer: the throttle refuses all it may.
                for _ in 0..1000 {
                    layer.throttle_layer().throttle().record_request();
                }
            }
            if matches!(case, BreakerOpen) {
                layer.breaker_layer().set_mode(Mode::ForcedOpen);
            }
            let request = || {
                let mut req = if $grpc {
                    grpc_post("http://stock:50051/stock.Stock/Get", String::new())
                } else {
                    Request::get("http://partner/v1")
                        .body(String::new())
                        .unwrap()
                };
                // Retried after a timeout, hedged: an idempotent call (gRPC opts in).
                req.extensions_mut()
                    .insert(RetryOverrides::new().idempotent(true));
                req
            };
            let hang = case != HedgeLost;
            let metrics = recorded(|| async move {
                if matches!(case, BreakerOpen | Throttled | BulkheadFull) {
                    // A clone of the stack, unrecorded, holds the bulkhead's only permit.
                    let holder = ServiceBuilder::new()
                        .layer(layer.clone())
                        .service(dependency($grpc, true));
                    tokio::spawn(holder.oneshot(request()));
                    tokio::task::yield_now().await;
                    let client = ServiceBuilder::new()
                        .layer(SemconvLayer::new())
                        .layer(layer)
                        .service(dependency($grpc, hang));
                    let _ = client.oneshot(request()).await;
                } else {
                    let client = ServiceBuilder::new()
                        .layer(layer)
                        .layer(SemconvLayer::new())
                        .service(dependency($grpc, hang));
                    let _ = client.oneshot(request()).await;
                }
            });
            let name = if $grpc {
                "rpc.client.duration"
            } else {
                "http.client.request.duration"
            };
            ends(&metrics, name)
                .into_iter()
                .map(|(end, _)| end)
                .collect::<Vec<String>>()
        }};
    }
    // Each case with the ends wanted over HTTP and over gRPC.
    let table: [(Case, &[&str], &[&str]); 8] = [
        (AttemptTimedOut, &["timeout"], &["4"]),
        (AttemptTimedOutNoHeader, &["timeout"], &["4"]),
        (ShareCutNoHeader, &["timeout"], &["4"]),
        (DeadlineExceeded, &["timeout"], &["4"]),
        (HedgeLost, &["-", "cancelled"], &["0", "1"]),
        (BreakerOpen, &["breaker_open"], &["14"]),
        (Throttled, &["throttled"], &["14"]),
        (BulkheadFull, &["bulkhead_full"], &["14"]),
    ];
    let mut wrong = Vec::new();
    for (case, http_wants, grpc_wants) in table {
        for deadline in [Some(300u32), None] {
            if deadline.is_none() && matches!(case, ShareCutNoHeader | DeadlineExceeded) {
                continue;
            }
            let deadline = deadline.map(u64::from);
            for grpc in [false, true] {
                let got = if grpc {
                    run!(
                        backstop::client::grpc(),
                        GrpcClassifier::new(),
                        true,
                        case,
                        deadline
                    )
                } else {
                    run!(
                        backstop::client::http(),
                        HttpClassifier::new(),
                        false,
                        case,
                        deadline
                    )
                };
                let want = if grpc { grpc_wants } else { http_wants };
                let ok = got == want;
                println!(
                    "{:<5} {case:?}, deadline {deadline:?}, grpc {grpc}: {got:?}",
                    if ok { "ok" } else { "WRONG" }
                );
                if !ok {
                    wrong.push((case, deadline, grpc, got));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Idempotency is visible: each keyed request through `IdempotencyLayer` is counted under
/// what happened to it (the handler ran, an answer replayed, a duplicate in flight, a key
/// reused for another body, a bad key, a key released by an answer that says nothing
/// happened). Found by a new user: none of these had a series.
#[test]
fn each_keyed_request_is_counted_under_its_idempotency_outcome() {
    use backstop::NotExecuted;
    use backstop::idempotency::{IdempotencyLayer, MemoryStore};
    const NAME: &str = "backstop.idempotency.requests";
    let metrics = recorded(|| async {
        let server = ServiceBuilder::new()
            .layer(IdempotencyLayer::new(MemoryStore::new()))
            .service(service_fn(|req: Request<Full<Bytes>>| async move {
                if req.uri().path() == "/slow" {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                let mut answer = Response::new(Full::new(Bytes::from_static(b"done")));
                if req.uri().path() == "/nothing" {
                    answer.extensions_mut().insert(NotExecuted);
                }
                Ok::<_, Infallible>(answer)
            }));
        let post = |path: &str, key: &str, body: &'static str| {
            Request::post(path)
                .header("idempotency-key", key)
                .body(Full::new(Bytes::from_static(body.as_bytes())))
                .unwrap()
        };
        let status = |r: Response<_>| r.status().as_u16();
        let send = |req| server.clone().oneshot(req);
        assert_eq!(status(send(post("/a", "\"k1\"", "x")).await.unwrap()), 200);
        assert_eq!(status(send(post("/a", "\"k1\"", "x")).await.unwrap()), 200);
        assert_eq!(status(send(post("/a", "\"k1\"", "y")).await.unwrap()), 422);
        assert_eq!(status(send(post("/a", "", "x")).await.unwrap()), 400);
        assert_eq!(
            status(send(post("/nothing", "\"k2\"", "x")).await.unwrap()),
            200
        );
        let slow = tokio::spawn(send(post("/slow", "\"k3\"", "x")));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            status(send(post("/slow", "\"k3\"", "x")).await.unwrap()),
            409
        );
        assert_eq!(status(slow.await.unwrap().unwrap()), 200);
    });
    for (outcome, n) in [
        ("executed", 2),
        ("replayed", 1),
        ("mismatch", 1),
        ("bad_key", 1),
        ("released", 1),
        ("in_flight", 1),
    ] {
        assert_eq!(
            counter(&metrics, NAME, &[("outcome", outcome)]),
            n,
            "{outcome}"
        );
    }
}

/// gRFC A96's per-call series beside backstop's own: a gRPC call answered UNAVAILABLE twice
/// and then OK records 2 retries, no hedge and the backoff it waited, under `grpc.method` (the
/// path) and `grpc.target` (the dependency); a plain HTTP call records none of them.
#[test]
fn a_grpc_call_records_a96s_retries_hedges_and_retry_delay() {
    let metrics = recorded(|| async {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let dependency = service_fn(move |_req: Request<ReplayBody<Full<Bytes>>>| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok::<_, Infallible>(match n {
                    0 | 1 => grpc_status(14),
                    _ => grpc_status(0),
                })
            }
        });
        let client = ServiceBuilder::new()
            .layer(backstop::client::grpc().name("billing").build().unwrap())
            .service(dependency);
        charge(&client).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Plain HTTP: backstop's series only.
        let http = ServiceBuilder::new()
            .layer(backstop::client::http().name("web").build().unwrap())
            .service(service_fn(|_req: Request<ReplayBody<String>>| async {
                Ok::<_, Infallible>(status(200))
            }));
        http.oneshot(get_item()).await.unwrap();
    });
    let labels = [
        ("grpc.method", "/bank.Billing/Charge"),
        ("grpc.target", "billing"),
    ];
    assert_eq!(
        histogram(&metrics, "grpc.client.call.retries", &labels),
        vec![2.0]
    );
    let delay = histogram(&metrics, "grpc.client.call.retry_delay", &labels);
    assert!(
        delay.len() == 1 && delay[0] > 0.0 && delay[0] < 2.0,
        "{delay:?}"
    );
    for (name, n) in [
        ("grpc.client.call.retries", 1),
        // No hedge: A96 reports no 0.
        ("grpc.client.call.hedges", 0),
        ("grpc.client.call.retry_delay", 1),
    ] {
        assert_eq!(
            metrics
                .iter()
                .filter(|(k, _)| k.key().name() == name)
                .count(),
            n,
            "{name}: the gRPC call's series only"
        );
    }
}

/// gRFC A96: "If there were no retries, 0 is not reported" (and none for no hedges). gRPC
/// calls answered OK at once record no retries and no hedges, so the histograms' count and
/// mean are gRPC's own; `retry_delay` (no such rule) records each call's 0.
#[test]
fn a_grpc_call_sent_once_reports_no_zero_retries_or_hedges() {
    let metrics = recorded(|| async {
        let client = ServiceBuilder::new()
            .layer(backstop::client::grpc().name("billing").build().unwrap())
            .service(service_fn(|_req: Request<ReplayBody<Full<Bytes>>>| async {
                Ok::<_, Infallible>(grpc_status(0))
            }));
        for _ in 0..3 {
            charge(&client).await;
        }
    });
    let labels = [
        ("grpc.method", "/bank.Billing/Charge"),
        ("grpc.target", "billing"),
    ];
    for name in ["grpc.client.call.retries", "grpc.client.call.hedges"] {
        assert!(
            value(&metrics, name, &labels).is_none(),
            "{name}: no 0 reported"
        );
    }
    assert_eq!(
        histogram(&metrics, "grpc.client.call.retry_delay", &labels),
        vec![0.0, 0.0, 0.0]
    );
}
