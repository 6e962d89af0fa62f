//! A keyed POST through `http().idempotency_keys(true)`, hedged or retried after its attempt
//! bound, against a server behind `IdempotencyLayer`: the duplicate in flight is answered 409
//! with `Retry-After`, which never wins the race and is retried later, so the caller gets the
//! one charge's answer. (Defects found by an outside attack on the idempotency work.)

use backstop::ReplayBody;
use backstop::client::retry::RetryConfig;
use backstop::client::retry::hedge::Hedging;
use backstop::idempotency::{IdempotencyLayer, MemoryStore};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tower::{ServiceBuilder, ServiceExt, service_fn};

/// The server: a slow (200 ms) charge handler behind the idempotency layer, counting its
/// runs in `runs` and answering 201 `charge {n}`, as a service of the client's requests (the
/// "network": the client's ReplayBody in, the server's body out as a String).
fn charge_server(
    runs: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<ReplayBody<String>>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<String>, Infallible>> + Send,
> + Clone
+ Send
+ 'static {
    let server = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service(service_fn(move |_req: Request<Full<Bytes>>| {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(201)
                        .body(Full::new(Bytes::from(format!("charge {n}"))))
                        .unwrap(),
                )
            }
        }));
    service_fn(move |req: Request<ReplayBody<String>>| {
        let server = server.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await.unwrap().to_bytes();
            let resp = server
                .oneshot(Request::from_parts(parts, Full::new(bytes)))
                .await
                .unwrap();
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await.ok().unwrap().to_bytes();
            Ok::<_, Infallible>(Response::from_parts(
                parts,
                String::from_utf8(bytes.to_vec()).unwrap(),
            ))
        }
    })
}

fn charge() -> Request<String> {
    Request::post("http://payments/charges")
        .body("{\"amount\":100}".to_owned())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_hedge_answered_409_does_not_beat_the_original() {
    let runs = Arc::new(AtomicUsize::new(0));
    let wire = charge_server(runs.clone());
    let preset = backstop::client::http()
        .idempotency_keys(true)
        .retry(RetryConfig::http().hedging(Hedging::new(Duration::from_millis(50)).max_attempts(2)))
        .build()
        .unwrap();
    let client = ServiceBuilder::new().layer(preset).service(wire);
    let resp = client.oneshot(charge()).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "charged once");
    assert_eq!(
        resp.status(),
        201,
        "the caller gets the charge's answer, not the hedge's 409: {:?}",
        resp.body()
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_the_attempt_bound_comes_back_for_the_stored_answer() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = charge_server(runs.clone());
    // A real server goes on when its caller gives up: each request runs in its own task,
    // which the client's attempt bound cannot cancel.
    let wire = service_fn(move |req: Request<ReplayBody<String>>| {
        let handled = tokio::spawn(server.clone().oneshot(req));
        async move { handled.await.unwrap() }
    });
    let preset = backstop::client::http()
        .idempotency_keys(true)
        .timeout(Duration::from_secs(5))
        .max_attempts(5)
        .attempt(backstop::client::attempt::AttemptBound::Fixed(
            Duration::from_millis(50),
        ))
        .build()
        .unwrap();
    let client = ServiceBuilder::new().layer(preset).service(wire);
    let started = tokio::time::Instant::now();
    let resp = client.oneshot(charge()).await.unwrap();
    // The first attempt timed out at 50 ms while the charge went on; the retry met the
    // charge in flight (409, Retry-After: 1) and came back a second later for its answer.
    assert_eq!(resp.status(), 201, "{:?}", resp.body());
    assert_eq!(resp.headers()["idempotent-replayed"], "true");
    let body = resp.into_body().collect().await.ok().unwrap().to_bytes();
    assert_eq!(body, "charge 1");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "charged once");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited the Retry-After: {:?}",
        started.elapsed()
    );
}
