//! The HTTP preset's `idempotency_keys` knob: a POST gets one key per call, the same on every
//! attempt, and becomes retryable; without the knob it gets no key and is not retried; a key
//! the caller set and idempotent methods are left alone.

use backstop::ReplayBody;
use http::{Request, Response};
use std::sync::{Arc, Mutex};
use tower::{ServiceBuilder, ServiceExt, service_fn};

/// A dependency (one per call) that answers 503 to the first attempt, then 201, and records the
/// key of every attempt it sees (`None`: no key).
fn flaky(
    seen: Arc<Mutex<Vec<Option<String>>>>,
) -> impl tower::Service<
    Request<ReplayBody<String>>,
    Response = Response<String>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    service_fn(move |req: Request<ReplayBody<String>>| {
        let key = req
            .headers()
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap().to_owned());
        let mut seen = seen.lock().unwrap();
        let first = seen.is_empty();
        seen.push(key);
        let status = if first { 503 } else { 201 };
        async move {
            Ok(Response::builder()
                .status(status)
                .body(String::new())
                .unwrap())
        }
    })
}

async fn call(
    preset: backstop::ClientLayer<backstop::HttpClassifier>,
    req: Request<String>,
) -> (u16, Vec<Option<String>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let client = ServiceBuilder::new()
        .layer(preset)
        .service(flaky(seen.clone()));
    let response = client.oneshot(req).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    (response.status().as_u16(), seen)
}

fn post() -> Request<String> {
    Request::post("http://payments/charges")
        .body("{\"amount\":100}".to_owned())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_is_retried_with_the_same_key() {
    let preset = backstop::client::http()
        .idempotency_keys(true)
        .build()
        .unwrap();
    let (status, seen) = call(preset, post()).await;
    assert_eq!(status, 201, "retried after the 503");
    assert_eq!(seen.len(), 2);
    let key = seen[0].clone().expect("stamped");
    assert_eq!(
        key.len(),
        34,
        "a structured-field string of 32 hex digits: {key}"
    );
    assert_eq!(
        seen[1].as_deref(),
        Some(key.as_str()),
        "every attempt, one key"
    );
}

#[tokio::test(start_paused = true)]
async fn without_the_knob_a_post_gets_no_key_and_no_retry() {
    let (status, seen) = call(backstop::client::http().build().unwrap(), post()).await;
    assert_eq!(status, 503);
    assert_eq!(seen, vec![None]);
    let (status, seen) = call(
        backstop::client::http()
            .idempotency_keys(false)
            .build()
            .unwrap(),
        post(),
    )
    .await;
    assert_eq!((status, seen.len()), (503, 1));
}

#[tokio::test(start_paused = true)]
async fn each_call_gets_its_own_key_and_the_callers_key_is_kept() {
    let preset = backstop::client::http()
        .idempotency_keys(true)
        .build()
        .unwrap();
    let (_, a) = call(preset.clone(), post()).await;
    let (_, b) = call(preset.clone(), post()).await;
    assert_ne!(a[0], b[0]);
    let mut mine = post();
    mine.headers_mut()
        .insert("idempotency-key", "\"order-42\"".parse().unwrap());
    let (status, seen) = call(preset, mine).await;
    assert_eq!(status, 201);
    assert_eq!(seen, vec![Some("\"order-42\"".to_owned()); 2]);
}

#[tokio::test(start_paused = true)]
async fn idempotent_methods_get_no_key() {
    let preset = backstop::client::http()
        .idempotency_keys(true)
        .build()
        .unwrap();
    let put = Request::put("http://payments/x")
        .body(String::new())
        .unwrap();
    let (status, seen) = call(preset, put).await;
    // PUT is retried because it is idempotent, not because of a key.
    assert_eq!(status, 201);
    assert_eq!(seen, vec![None, None]);
}
