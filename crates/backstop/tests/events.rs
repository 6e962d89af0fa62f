//! The events an operator reads: every client event names its dependency, the request's
//! method and path (no query), the attempt and how it failed; the server deadline layer tells
//! of malformed headers and of what it rejects.

use backstop::ReplayBody;
use backstop::prelude::*;
use backstop_test_support::{find_event as find, record_events};
use http::{Request, Response};
use tower::{ServiceBuilder, ServiceExt, service_fn};

#[tokio::test(start_paused = true)]
async fn client_events_name_the_dependency_the_request_and_the_failure() {
    let (events, _guard) = record_events();
    let down = service_fn(|_req: Request<ReplayBody<String>>| async {
        let response = Response::builder().status(503).body(String::new());
        Ok::<_, std::convert::Infallible>(response.unwrap())
    });
    // A layer passed in keeps its own name (the stack names only its own): named here.
    let backend = backstop::client::http()
        .name("inventory")
        .max_attempts(2)
        .breaker(BreakerConfig::http().minimum_calls(2).jitter(false))
        .build()
        .unwrap();
    let client = ServiceBuilder::new().layer(backend).service(down);
    let req = Request::get("http://inventory/item/1?token=secret")
        .body(String::new())
        .unwrap();
    let response = client.oneshot(req).await.unwrap();
    assert_eq!(response.status(), 503);

    let retrying = find(&events, "retrying request");
    assert_eq!(retrying["dependency"], "inventory");
    assert_eq!(retrying["method"], "GET");
    assert_eq!(retrying["path"], "/item/1", "no query string");
    assert_eq!(retrying["attempt"], "2");
    assert_eq!(retrying["failed"], "status 503");
    let gave_up = find(&events, "not retrying");
    assert_eq!(gave_up["dependency"], "inventory");
    assert_eq!(gave_up["reason"], "attempts");
    assert_eq!(gave_up["attempts"], "2");
    let opened = find(&events, "circuit breaker opened");
    assert_eq!(opened["dependency"], "inventory");
    assert_eq!(opened["level"], "WARN");
    assert!(
        !format!("{:?}", events.lock().unwrap()).contains("secret"),
        "the query string never reaches an event"
    );
}

/// Naming is configuration: a named stack's keyed breaker names the breaker of every key it
/// adds, as every other layer of the stack is named.
#[tokio::test(start_paused = true)]
async fn a_named_keyed_breaker_names_every_key() {
    let (events, _guard) = record_events();
    let down = service_fn(|_req: Request<ReplayBody<String>>| async {
        let response = Response::builder().status(503).body(String::new());
        Ok::<_, std::convert::Infallible>(response.unwrap())
    });
    let breaker = BreakerConfig::http()
        .minimum_calls(2)
        .jitter(false)
        .per_key(backstop::RouteKey::Path);
    let backend = backstop::client::http()
        .max_attempts(2)
        .breaker(breaker)
        .name("inventory")
        .build()
        .unwrap();
    assert_eq!(backend.breaker_layer().name(), "inventory");
    assert_eq!(backend.retry_layer().name(), "inventory");
    let client = ServiceBuilder::new().layer(backend).service(down);
    let req = Request::get("http://inventory/item/1")
        .body(String::new())
        .unwrap();
    client.oneshot(req).await.unwrap();
    let opened = find(&events, "circuit breaker opened");
    assert_eq!(opened["dependency"], "inventory");
    assert_eq!(opened["key"], "/item/1");
    assert_eq!(find(&events, "not retrying")["dependency"], "inventory");
}

#[tokio::test(start_paused = true)]
async fn the_server_deadline_layer_tells_what_it_rejects() {
    let (events, _guard) = record_events();
    let handler = service_fn(|_req: Request<String>| async {
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    });
    let server = ServiceBuilder::new()
        .layer(backstop::server())
        .service(handler);
    let grpc = |timeout: &str| {
        Request::post("http://svc/pkg.Svc/Call")
            .header("content-type", "application/grpc")
            .header("grpc-timeout", timeout)
            .body(String::new())
            .unwrap()
    };
    server.clone().oneshot(grpc("bogus")).await.unwrap();
    let malformed = find(&events, "malformed grpc-timeout: rejected");
    assert_eq!(malformed["level"], "WARN");
    assert_eq!(malformed["path"], "/pkg.Svc/Call");
    server.clone().oneshot(grpc("100m")).await.unwrap();
    let expired = find(&events, "deadline expired: the handler is cancelled");
    assert_eq!(expired["level"], "DEBUG");
    server.clone().oneshot(grpc("0n")).await.unwrap();
    let spent = find(&events, "rejected on arrival: no time left");
    assert_eq!(spent["level"], "DEBUG");
}
