//! `BackstopMiddleware` inside reqwest-middleware's client, against a real axum server over
//! 127.0.0.1: reqwest's builder stays, and the stack's retries, deadline and errors hold.
#![cfg(feature = "reqwest-middleware")]

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri},
    routing::any,
};
use backstop::reqwest::BackstopMiddleware;
use bytes::Bytes;
use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tokio::time::Instant;

/// What the server saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    grpc_timeout: Option<String>,
    body: Bytes,
}

#[derive(Clone, Default)]
struct Server {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    fn seen(&self, path: &str) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter().filter(|s| s.path == path).cloned().collect()
    }
}

/// `/unavailable` answers 503 always; `/flaky` 503 twice, then 200 with the body echoed;
/// `/hang` never answers in time; anything else 200.
async fn handler(
    State(server): State<Server>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Bytes) {
    let path = uri.path().to_owned();
    let seen = Seen {
        method,
        path: path.clone(),
        grpc_timeout: headers
            .get("grpc-timeout")
            .map(|v| v.to_str().unwrap().to_owned()),
        body: body.clone(),
    };
    let before = {
        let mut all = server.seen.lock().unwrap();
        all.push(seen);
        all.iter().filter(|s| s.path == path).count() - 1
    };
    match path.as_str() {
        "/unavailable" => (StatusCode::SERVICE_UNAVAILABLE, Bytes::new()),
        "/flaky" if before < 2 => (StatusCode::SERVICE_UNAVAILABLE, Bytes::new()),
        "/hang" => {
            tokio::time::sleep(Duration::from_secs(10)).await;
            (StatusCode::OK, Bytes::new())
        }
        _ => (StatusCode::OK, body),
    }
}

async fn serve() -> (String, Server) {
    let server = Server::default();
    let app = Router::new()
        .fallback(any(handler))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), server)
}

/// Counts the requests that pass it.
#[derive(Clone, Default)]
struct Count(Arc<AtomicUsize>);

#[async_trait::async_trait]
impl Middleware for Count {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.0.fetch_add(1, Ordering::SeqCst);
        next.run(req, extensions).await
    }
}

fn client() -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(BackstopMiddleware::new(
            backstop::client::http().name("upstream").build().unwrap(),
        ))
        .build()
}

/// A `grpc-timeout` value as a duration (PROTOCOL-HTTP2: digits and a unit).
fn grpc_timeout(value: &str) -> Duration {
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().unwrap();
    match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => panic!("{value}"),
    }
}

fn attempts(response: &reqwest::Response) -> u32 {
    response
        .extensions()
        .get::<backstop::client::retry::CallInfo>()
        .map_or(1, |info| info.attempts())
}

#[tokio::test]
async fn a_put_is_retried_through_503s_with_the_same_bytes_and_reqwests_response_api() {
    let (base, server) = serve().await;
    let outer = Count::default();
    let inner = Count::default();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(outer.clone())
        .with(BackstopMiddleware::new(
            backstop::client::http().name("upstream").build().unwrap(),
        ))
        .with(inner.clone())
        .build();
    let payload: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let response = client
        .put(format!("{base}/flaky"))
        .query(&[("item", "1")])
        .body(payload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(attempts(&response), 3);
    assert_eq!(response.url().path(), "/flaky");
    assert_eq!(response.url().query(), Some("item=1"));
    assert_eq!(response.bytes().await.unwrap(), payload);
    let seen = server.seen("/flaky");
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter()
            .all(|s| s.method == Method::PUT && s.body == payload)
    );
    // Middlewares before backstop's run once per call, those after once per attempt.
    assert_eq!(outer.0.load(Ordering::SeqCst), 1);
    assert_eq!(inner.0.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_post_is_sent_once_without_a_key_and_retried_with_one() {
    let (base, server) = serve().await;
    let client = client();
    let response = client
        .post(format!("{base}/unavailable"))
        .body("order")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(server.seen("/unavailable").len(), 1);

    let response = client
        .post(format!("{base}/unavailable"))
        .header("idempotency-key", "\"c7f2a9\"")
        .body("order")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(attempts(&response), 3);
    assert_eq!(server.seen("/unavailable").len(), 4);
}

#[tokio::test]
async fn a_streamed_body_is_replayed_byte_for_byte() {
    let (base, server) = serve().await;
    let chunks = futures_util::stream::iter(
        ["one ", "two ", "three"]
            .map(|c| Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from(c)))),
    );
    let body = reqwest::Body::wrap(http_body_util::StreamBody::new(chunks));
    let response = client()
        .put(format!("{base}/flaky"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.bytes().await.unwrap(), "one two three");
    let seen = server.seen("/flaky");
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|s| s.body == "one two three"));
}

#[tokio::test]
async fn reqwests_timeout_is_the_calls_deadline_sent_on_the_wire() {
    let (base, server) = serve().await;
    let client = client();
    let started = Instant::now();
    let err = client
        .get(format!("{base}/hang"))
        .timeout(Duration::from_millis(400))
        .send()
        .await
        .unwrap_err();
    let took = started.elapsed();
    // The whole call, retries included, within the timeout (and not reqwest's timer: the
    // error is the stack's).
    assert!(took >= Duration::from_millis(350), "{took:?}");
    assert!(took < Duration::from_millis(1_500), "{took:?}");
    let reqwest_middleware::Error::Middleware(err) = err else {
        panic!("{err:?}")
    };
    // backstop's error, reachable as anyhow reaches errors: by downcast, and in the chain.
    // The retry layer's, when its last attempt's bound ends the call; the deadline layer's
    // own, when the call's deadline (the same instant, over a real clock) fires first.
    match err.downcast_ref::<backstop::client::retry::RetryError>() {
        Some(info) => assert!(info.attempts() >= 1),
        None => assert!(
            err.downcast_ref::<backstop::DeadlineExceeded>().is_some(),
            "{err:?}"
        ),
    }
    assert!(
        err.chain()
            .any(|e| e.is::<backstop::DeadlineExceeded>() || e.is::<backstop::AttemptTimedOut>()),
        "{err:?}"
    );
    let err: &(dyn std::error::Error + 'static) = err.as_ref();
    assert!(
        backstop::find::<backstop::DeadlineExceeded>(err).is_some()
            || backstop::find::<backstop::AttemptTimedOut>(err).is_some(),
        "{err:?}"
    );
    let seen = server.seen("/hang");
    assert!(!seen.is_empty());
    for s in &seen {
        let sent = s.grpc_timeout.as_deref().expect("grpc-timeout sent");
        assert!(grpc_timeout(sent) <= Duration::from_millis(400), "{sent}");
    }

    // A `Deadline` in the chain's extensions works the same way.
    let started = Instant::now();
    let err = client
        .get(format!("{base}/hang"))
        .with_extension(backstop::deadline::Deadline::after(Duration::from_millis(
            300,
        )))
        .send()
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(1_500));
    let reqwest_middleware::Error::Middleware(err) = err else {
        panic!("{err:?}")
    };
    assert!(
        err.chain()
            .any(|e| e.is::<backstop::DeadlineExceeded>() || e.is::<backstop::AttemptTimedOut>()),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_connection_refused_is_reqwests_own_error_after_the_retries() {
    // A port nobody listens on: bound, then closed.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let count = Count::default();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(BackstopMiddleware::new(
            backstop::client::http().name("gone").build().unwrap(),
        ))
        .with(count.clone())
        .build();
    let err = client
        .post(format!("http://{addr}/order"))
        .body("order")
        .send()
        .await
        .unwrap_err();
    // Nothing was sent, so even a POST without a key is retried; the caller sees reqwest's
    // error, as without the middleware.
    assert_eq!(count.0.load(Ordering::SeqCst), 3);
    let reqwest_middleware::Error::Reqwest(err) = err else {
        panic!("{err:?}")
    };
    assert!(err.is_connect(), "{err:?}");
}

#[tokio::test]
async fn the_layers_stats_are_reachable_from_the_middleware() {
    let (base, _server) = serve().await;
    let middleware =
        BackstopMiddleware::new(backstop::client::http().name("upstream").build().unwrap());
    let stats = middleware.get_ref().clone();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(middleware)
        .build();
    client.get(format!("{base}/flaky")).send().await.unwrap();
    assert_eq!(stats.retry_layer().stats().retries, 2);
}

/// The earliest of reqwest's `.timeout()` and a `Deadline` in the chain's extensions bounds the
/// call, whichever is set how: a longer extension never stretches a shorter timeout, nor a
/// longer timeout a shorter extension, and the server is told the earlier one.
#[tokio::test]
async fn the_earliest_of_timeout_and_a_deadline_extension_wins() {
    let (base, server) = serve().await;
    let client = client();
    for (timeout, extension) in [(200, 2_000), (2_000, 200)] {
        let started = Instant::now();
        let err = client
            .get(format!("{base}/hang"))
            .timeout(Duration::from_millis(timeout))
            .with_extension(backstop::deadline::Deadline::after(Duration::from_millis(
                extension,
            )))
            .send()
            .await
            .unwrap_err();
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(1_000),
            "timeout {timeout} ms, extension {extension} ms: held {took:?}"
        );
        assert!(
            matches!(err, reqwest_middleware::Error::Middleware(_)),
            "{err:?}"
        );
    }
    let seen = server.seen("/hang");
    assert!(!seen.is_empty());
    for s in &seen {
        let sent = s.grpc_timeout.as_deref().expect("grpc-timeout sent");
        assert!(grpc_timeout(sent) <= Duration::from_millis(200), "{sent}");
    }
}
