//! Attempts that overlap on a real transport: hyper (HTTP/1.1 and HTTP/2) over 127.0.0.1 keeps
//! sending the first attempt's request body after the server answered 503 early, while the
//! retry already sends its own copy. Whatever the cap, the pace of the chunks or the protocol,
//! the server never answers 200 to a body that differs from the one the caller sent, and no
//! call stalls.

use backstop::client::retry::{ReplayBody, RetryConfig, backoff};
use backstop_integration::serve_hyper;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, channel::Channel};
use hyper::body::Incoming;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use std::{
    convert::Infallible,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tower::{ServiceBuilder, ServiceExt};

const CHUNKS: [&[u8]; 4] = [b"aaaa", b"bbbb", b"cccc", b"dddd"];
/// The server reads this much of a first attempt, then answers 503 without reading on.
const EARLY_AFTER: usize = 8;

/// What the server saw.
#[derive(Default)]
struct Seen {
    attempts: AtomicUsize,
    /// Every body the server answered 200 to.
    answered_ok: Mutex<Vec<Vec<u8>>>,
}

async fn handle(
    req: Request<Incoming>,
    seen: Arc<Seen>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let attempt = seen.attempts.fetch_add(1, Ordering::SeqCst);
    let mut body = req.into_body();
    let mut got = Vec::new();
    if attempt == 0 {
        while got.len() < EARLY_AFTER {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        got.extend_from_slice(&data);
                    }
                }
                _ => break,
            }
        }
        // Answer before the body is over, and go on reading it as a server that drains what
        // it was sent would: the client's transport keeps sending the first attempt's body
        // while the retry sends its own copy.
        tokio::spawn(async move {
            let _ = body.collect().await;
        });
        let response = Response::builder()
            .status(503)
            .body(Full::new(Bytes::from_static(b"early")))
            .unwrap();
        return Ok(response);
    }
    match body.collect().await {
        Ok(collected) => got.extend_from_slice(&collected.to_bytes()),
        // The client aborted this body (a fenced-off copy): nothing to answer 200 to.
        Err(_) => {
            return Ok(Response::builder()
                .status(400)
                .body(Full::default())
                .unwrap());
        }
    }
    seen.answered_ok.lock().unwrap().push(got);
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

/// Serves `handle` on a loopback port, HTTP/1.1 or HTTP/2 only.
async fn serve(http2: bool) -> (String, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let addr = serve_hyper(http2, seen.clone(), handle).await;
    (format!("http://{addr}/put"), seen)
}

/// One PUT whose body is streamed in `CHUNKS`, `gap` apart, through a retry layer with the
/// given replay cap. Returns the status the caller got.
async fn put(url: &str, http2: bool, cap: usize, gap: Duration) -> StatusCode {
    let transport = Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build_http::<ReplayBody<Channel<Bytes, Infallible>>>();
    let layer = RetryConfig::http()
        .no_budget()
        .max_replay_bytes(cap)
        .backoff(backoff::constant(Duration::from_millis(5)))
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(layer.clone())
        .service(transport);
    let (mut tx, body) = Channel::<Bytes, Infallible>::new(1);
    let producer = tokio::spawn(async move {
        for chunk in CHUNKS {
            if tx.send_data(Bytes::from_static(chunk)).await.is_err() {
                return;
            }
            tokio::time::sleep(gap).await;
        }
    });
    let request = Request::put(url).body(body).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.oneshot(request))
        .await
        .expect("no call stalls")
        .expect("an answer");
    let status = response.status();
    let _ = response.into_body().collect().await;
    // Every attempt after the first is a retry the layer decided.
    assert!(layer.stats().retries <= 2);
    producer.abort();
    status
}

async fn campaign(http2: bool) {
    let original: Vec<u8> = CHUNKS.concat();
    // Below the first read, between it and the whole body, exactly the body, far above.
    for cap in [4, 10, 16, 1024] {
        for gap in [
            Duration::ZERO,
            Duration::from_millis(2),
            Duration::from_millis(20),
        ] {
            let (url, seen) = serve(http2).await;
            let status = put(&url, http2, cap, gap).await;
            let ok = seen.answered_ok.lock().unwrap().clone();
            for body in &ok {
                assert_eq!(
                    body, &original,
                    "http2 {http2}, cap {cap}, gap {gap:?}: a 200 to a different body"
                );
            }
            let attempts = seen.attempts.load(Ordering::SeqCst);
            match status {
                StatusCode::OK => assert_eq!(ok.len(), 1),
                // Not replayable: the cap was crossed before the early answer.
                StatusCode::SERVICE_UNAVAILABLE => {
                    assert_eq!(attempts, 1, "cap {cap}, gap {gap:?}");
                    assert!(
                        cap < original.len(),
                        "cap {cap}, gap {gap:?}: a replayable body was not retried"
                    );
                }
                other => panic!("http2 {http2}, cap {cap}, gap {gap:?}: {other}"),
            }
            // A body that fits under the cap is always retried, and the retry carries it
            // whole. (Between the server's read and the cap, either outcome is right: hyper's
            // HTTP/2 client reads a frame ahead of what the server has seen.)
            if cap >= original.len() {
                assert_eq!(
                    status,
                    StatusCode::OK,
                    "http2 {http2}, cap {cap}, gap {gap:?}"
                );
            }
            if cap < EARLY_AFTER {
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "cap {cap}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_early_503_while_the_body_streams() {
    campaign(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_early_503_while_the_body_streams() {
    campaign(true).await;
}
