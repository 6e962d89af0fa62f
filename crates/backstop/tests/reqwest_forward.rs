//! An axum handler forwards its own request body (axum's `Body`, which is not `Sync`) through
//! backstop's client preset and [`Reqwest`] to an upstream over loopback; the upstream fails
//! the first attempt after reading the whole body, and the retry carries the same bytes.

#![cfg(feature = "reqwest")]

use axum::{Router, body::Body, extract::State, routing::put};
use backstop::reqwest::Reqwest;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicUsize, Ordering},
};
use tower::ServiceExt;

type Client = backstop::HttpClient<Reqwest>;

/// Serves `app` on 127.0.0.1 and returns its address.
async fn serve(app: Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[derive(Clone, Default)]
struct Upstream {
    calls: Arc<AtomicUsize>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

async fn upstream(State(up): State<Upstream>, body: Bytes) -> (StatusCode, Bytes) {
    up.bodies.lock().unwrap().push(body.clone());
    if up.calls.fetch_add(1, Ordering::SeqCst) == 0 {
        (StatusCode::SERVICE_UNAVAILABLE, Bytes::new())
    } else {
        (StatusCode::OK, body)
    }
}

async fn forward(
    State((client, url)): State<(Client, String)>,
    req: Request<Body>,
) -> Response<Body> {
    let outbound = Request::put(url).body(req.into_body()).unwrap();
    let response = client.oneshot(outbound).await.unwrap();
    let attempts = backstop::client::call_info(&response).attempts();
    let (mut parts, body) = response.into_parts();
    parts
        .headers
        .insert("x-attempts", attempts.to_string().parse().unwrap());
    Response::from_parts(parts, Body::new(body))
}

#[tokio::test]
async fn an_axum_body_is_forwarded_through_reqwest_and_replayed_byte_for_byte() {
    let up = Upstream::default();
    let up_addr = serve(
        Router::new()
            .route("/item", put(upstream))
            .with_state(up.clone()),
    )
    .await;

    let client: Client = tower::ServiceBuilder::new()
        .layer(backstop::client::http().name("upstream").build().unwrap())
        .service(Reqwest::new(reqwest::Client::new()));
    let front = Router::new()
        .route("/forward", put(forward))
        .with_state((client, format!("http://{up_addr}/item")));
    let front_addr = serve(front).await;

    // 64 KiB in many chunks, so the body streams through both hops.
    let payload: Vec<u8> = (0..65_536u32).map(|i| (i % 251) as u8).collect();
    let response = reqwest::Client::new()
        .put(format!("http://{front_addr}/forward"))
        .body(payload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-attempts"], "2");
    assert_eq!(response.bytes().await.unwrap(), payload);
    let bodies = up.bodies.lock().unwrap();
    assert_eq!(bodies.len(), 2);
    assert!(
        bodies.iter().all(|b| b[..] == payload[..]),
        "both attempts carried the body"
    );
}

#[tokio::test]
async fn a_uri_reqwest_cannot_take_is_its_error() {
    let err = Reqwest::default()
        .oneshot(Request::get("/relative").body(String::new()).unwrap())
        .await
        .unwrap_err();
    assert!(err.is_builder(), "{err}");
}

#[test]
fn a_sync_body_answers_from_its_last_poll() {
    use http_body::Body as _;
    let body =
        backstop::reqwest::SyncBody::new(http_body_util::Full::new(Bytes::from_static(b"abc")));
    assert_eq!(body.size_hint().exact(), Some(3));
    assert!(!body.is_end_stream());
    let collected = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(async {
            let mut body = std::pin::pin!(body);
            let frame = body.frame().await.unwrap().unwrap();
            assert!(body.is_end_stream(), "the end, seen at the last poll");
            frame.into_data().unwrap()
        });
    assert_eq!(collected, "abc");
}
