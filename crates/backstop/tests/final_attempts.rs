//! The whole deadline goes to an attempt no retry could follow, whatever the reason: its
//! count, its request (an attempt timeout is not retried for a request that is not
//! idempotent: every gRPC call by default), the time a retry would need (the least backoff and
//! the median call), or being the last hedge. Each test is a case an outside review found cut
//! at the 80 % share, kept so it stays fixed.

use backstop::ReplayBody;
use backstop_test_support::{Latency, adjustable as slow, telling, timed};
use http::{Request, Response};
use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};

const MS: Duration = Duration::from_millis(1);

/// How a call ended, to print: its status, or its error's text.
fn outcome<B>(
    result: &Result<Response<B>, backstop::BoxError>,
) -> Result<http::StatusCode, String> {
    result
        .as_ref()
        .map(|r| r.status())
        .map_err(|e| e.to_string())
}

/// A service config with a retry policy (maxAttempts 3, retryable UNAVAILABLE) and
/// `"timeout": "0.3s"`, to a server that hangs: nothing can retry a call that runs out of
/// time (an attempt timeout is retried only for an idempotent request, and a gRPC call is not
/// one by default), so, as grpcio, the call waits the whole 300 ms and tells the server 300m.
/// The same for the plain `grpc()` preset.
#[cfg(feature = "service-config")]
#[tokio::test(start_paused = true)]
async fn a_grpc_call_whose_timeout_cannot_be_retried_gets_the_whole_deadline() {
    let config = backstop::service_config::ServiceConfig::from_json(
        r#"{ "methodConfig": [ { "name": [{}], "timeout": "0.3s",
              "retryPolicy": { "maxAttempts": 3, "initialBackoff": "0.01s",
                "maxBackoff": "0.1s", "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"] } } ] }"#,
    )
    .unwrap();
    let service_config = backstop::client::grpc().service_config(config).unwrap();
    let preset = backstop::client::grpc().timeout(300 * MS).build().unwrap();
    let mut results = Vec::new();
    for which in ["service config", "grpc() preset"] {
        let start = Instant::now();
        let (seen, dependency) = telling(backstop_test_support::never::<ReplayBody<String>>);
        let _ = match which {
            "service config" => ServiceBuilder::new()
                .layer(service_config.clone())
                .service(dependency)
                .oneshot(backstop_test_support::grpc_call(""))
                .await
                .map(|_| ()),
            _ => ServiceBuilder::new()
                .layer(preset.clone())
                .service(dependency)
                .oneshot(backstop_test_support::grpc_call(""))
                .await
                .map(|_| ()),
        };
        let seen = seen.lock().unwrap().clone();
        results.push((which, start.elapsed(), seen));
    }
    for (which, took, seen) in &results {
        println!("{which}: ended after {took:?}, attempts {seen:?}");
    }
    for (which, took, seen) in &results {
        assert_eq!(seen.len(), 1, "{which}: one attempt");
        assert_eq!(
            seen[0].1.as_deref(),
            Some("300m"),
            "{which}: told the server"
        );
        assert_eq!(*took, 300 * MS, "{which}: the call's end");
    }
}

fn get(path: &str) -> Request<String> {
    Request::get(format!("http://dep{path}"))
        .body(String::new())
        .unwrap()
}

/// Sends `n` GETs to `path`, one every `every`, each on its own task; returns how many got 200.
macro_rules! load {
    ($client:expr, $path:expr, $n:expr, $every:expr) => {{
        let mut tasks = Vec::new();
        for _ in 0..$n {
            let client = $client.clone();
            let path: &'static str = $path;
            tasks.push(tokio::spawn(async move {
                matches!(client.oneshot(get(path)).await, Ok(ref r) if r.status() == 200)
            }));
            tokio::time::sleep($every).await;
        }
        let mut ok = 0u32;
        for t in tasks {
            ok += u32::from(t.await.unwrap());
        }
        ok
    }};
}

/// A retry needs the backoff's least wait (25 ms by default) and the median call before the
/// deadline: where the share would leave less, the first attempt gets the whole deadline.
/// Here: p50 = 100 ms, a 600 ms deadline, one call that takes 520 ms, which fits.
#[tokio::test(start_paused = true)]
async fn no_share_is_kept_for_a_retry_the_backoff_leaves_no_room_for() {
    let latency: Latency = Arc::new(Mutex::new(Some(100 * MS)));
    let backend = backstop::client::http().timeout(600 * MS).build().unwrap();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(slow(latency.clone()));
    assert_eq!(load!(client, "/x", 200, 10 * MS), 200);
    tokio::time::advance(200 * MS).await;
    let p50 = backend.latency().p50.expect("trusted");
    println!("p50 {p50:?}");

    *latency.lock().unwrap() = Some(520 * MS);
    let (result, took) = timed(client.clone().oneshot(get("/x"))).await;
    let info = match &result {
        Ok(r) => Some(backstop::client::call_info(r)),
        Err(e) => backstop::client::error_info(e.as_ref()),
    };
    println!(
        "after {took:?}: {:?}, attempts {:?}, gave up {:?}",
        outcome(&result),
        info.as_ref().map(|i| i.attempts()),
        info.as_ref().and_then(|i| i.gave_up()),
    );
    assert!(
        matches!(&result, Ok(r) if r.status() == 200),
        "a 520 ms answer under a 600 ms deadline was lost after {took:?}"
    );
}

/// Measured hedging (`http().hedging(0.95, 2)`): no attempt follows the hedge, the last by count,
/// so it gets all that is left when it goes. Every attempt takes 900 ms under a 1 s deadline:
/// the hedge (sent at the p95, about 62 ms in) answers within the deadline.
#[tokio::test(start_paused = true)]
async fn the_last_hedge_gets_the_whole_deadline() {
    let latency: Latency = Arc::new(Mutex::new(Some(60 * MS)));
    let lat = latency.clone();
    let (seen, dependency) = telling(move |_, _: &Request<ReplayBody<String>>| {
        let latency = *lat.lock().unwrap();
        async move {
            tokio::time::sleep(latency.unwrap()).await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let backend = backstop::client::http()
        .timeout(1000 * MS)
        .hedging(0.95, 2)
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(dependency);
    assert_eq!(load!(client, "/x", 300, 10 * MS), 300);
    tokio::time::advance(200 * MS).await;
    seen.lock().unwrap().clear();

    *latency.lock().unwrap() = Some(900 * MS);
    let (result, took) = timed(client.clone().oneshot(get("/x"))).await;
    let seen = seen.lock().unwrap().clone();
    println!(
        "after {took:?}: {:?}; attempts told {seen:?}",
        outcome(&result)
    );
    assert_eq!(seen.len(), 2, "a hedge was sent");
    assert!(
        matches!(&result, Ok(r) if r.status() == 200),
        "the last attempt by count was cut before the deadline, after {took:?}"
    );
}

/// The same over HTTP: a POST without an idempotency key is never retried after its attempt
/// timed out, so its first attempt gets the whole 1 s deadline.
#[tokio::test(start_paused = true)]
async fn an_http_post_without_a_key_gets_the_whole_deadline() {
    let backend = backstop::client::http().timeout(1000 * MS).build().unwrap();
    let client = ServiceBuilder::new()
        .layer(backend)
        .service(slow(Arc::new(Mutex::new(None))));
    let req = Request::post("http://dep/orders")
        .body(String::new())
        .unwrap();
    let start = Instant::now();
    let err = client.oneshot(req).await.unwrap_err();
    let info = backstop::client::error_info(err.as_ref());
    println!(
        "after {:?}: {err}; gave up {:?}",
        start.elapsed(),
        info.and_then(|i| i.gave_up())
    );
    assert_eq!(start.elapsed(), 1000 * MS, "the call's end");
}

/// A cold client (its latency model not trusted yet: no median measured) decides from what it
/// knows: the share's 20 ms of a 100 ms deadline is less than the retry's least backoff
/// (25 ms), so no retry could follow the first attempt and it gets the whole deadline. The
/// dependency answers in 90 ms: 200, and the server was told 100m (it was cut at 80 ms and
/// told 80m while the rule waited for a median).
#[tokio::test(start_paused = true)]
async fn a_cold_client_gives_its_only_possible_attempt_the_whole_deadline() {
    let (seen, dependency) = telling(|_, _: &Request<ReplayBody<String>>| async {
        tokio::time::sleep(90 * MS).await;
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let backend = backstop::client::http().timeout(100 * MS).build().unwrap();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(dependency);
    let (result, took) = timed(client.oneshot(get("/x"))).await;
    let seen = seen.lock().unwrap().clone();
    println!(
        "after {took:?}: {:?}; attempts told {seen:?}",
        outcome(&result)
    );
    assert_eq!(backend.latency().p50, None, "the model is cold");
    assert!(
        matches!(&result, Ok(r) if r.status() == 200),
        "a 90 ms answer under a cold 100 ms deadline was cut after {took:?}"
    );
    assert_eq!(seen.len(), 1, "one attempt");
    assert_eq!(seen[0].1.as_deref(), Some("100m"), "told the server");
    assert_eq!(took, 90 * MS);
}

/// The same cold client with room for a retry (a 1 s deadline: the share leaves 200 ms, more
/// than the 25 ms backoff) keeps the share: the first attempt is told 800m.
#[tokio::test(start_paused = true)]
async fn a_cold_client_keeps_the_share_where_a_retry_fits() {
    let (seen, dependency) = telling(|_, _: &Request<ReplayBody<String>>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let client = ServiceBuilder::new()
        .layer(backstop::client::http().timeout(1000 * MS).build().unwrap())
        .service(dependency);
    let result = client.oneshot(get("/x")).await;
    assert!(matches!(&result, Ok(r) if r.status() == 200));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[0].1.as_deref(), Some("800m"), "told the server");
}
