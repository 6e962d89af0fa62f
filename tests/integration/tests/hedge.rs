//! Hedged attempts side by side on a real transport: hyper (HTTP/1.1 and HTTP/2) over
//! 127.0.0.1. The first attempt is slow; the hedge goes while the first is still in flight,
//! with the same body, and wins. A hedge due while the body is still streaming waits for the
//! body to be complete, then goes, so no attempt's body is ever cut short.

use backstop::client::retry::hedge::Hedging;
use backstop::client::retry::{ReplayBody, RetryConfig};
use backstop_integration::serve_hyper;
use bytes::Bytes;
use http::{Request, Response};
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
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};

/// The first attempt the server sees answers after this long; every other one at once.
const SLOW: Duration = Duration::from_millis(1_500);
const HEDGE_AFTER: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Seen {
    attempts: AtomicUsize,
    /// Every body the server read to its end.
    bodies: Mutex<Vec<Vec<u8>>>,
}

async fn handle(
    req: Request<Incoming>,
    seen: Arc<Seen>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let attempt = seen.attempts.fetch_add(1, Ordering::SeqCst);
    let Ok(body) = req.into_body().collect().await else {
        return Ok(Response::builder()
            .status(400)
            .body(Full::default())
            .unwrap());
    };
    seen.bodies.lock().unwrap().push(body.to_bytes().to_vec());
    if attempt == 0 {
        tokio::time::sleep(SLOW).await;
    } else {
        // The hedge answers once the slow attempt's body is read too: the client drops the
        // slow attempt when the hedge wins, and on a loaded machine the server could still be
        // reading that body then (the client had sent it all: its bytes are what the
        // assertions compare, not how fast the server reads).
        let read_both = async {
            while seen.bodies.lock().unwrap().len() < 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let _ = tokio::time::timeout(SLOW / 2, read_both).await;
    }
    let answer = if attempt == 0 { "slow" } else { "fast" };
    Ok(Response::new(Full::new(Bytes::from_static(
        answer.as_bytes(),
    ))))
}

async fn serve(http2: bool) -> (String, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let addr = serve_hyper(http2, seen.clone(), handle).await;
    (format!("http://{addr}/item"), seen)
}

/// The body every PUT sends: 48 KiB in 4 KiB chunks, each chunk's bytes its index.
fn chunks() -> Vec<Bytes> {
    (0..12u8).map(|i| Bytes::from(vec![i; 4096])).collect()
}

/// One hedged PUT whose body is streamed `gap` apart; returns the answer and how long it took.
async fn put(url: &str, http2: bool, gap: Duration) -> (String, Duration) {
    let transport = Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build_http::<ReplayBody<Channel<Bytes, Infallible>>>();
    let layer = RetryConfig::http()
        .hedging(Hedging::new(HEDGE_AFTER).max_attempts(2))
        .no_budget()
        .build()
        .unwrap();
    let client = ServiceBuilder::new().layer(layer).service(transport);
    let (mut tx, body) = Channel::<Bytes, Infallible>::new(1);
    tokio::spawn(async move {
        for chunk in chunks() {
            if tx.send_data(chunk).await.is_err() {
                return;
            }
            tokio::time::sleep(gap).await;
        }
    });
    let start = Instant::now();
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        client.oneshot(Request::put(url).body(body).unwrap()),
    )
    .await
    .expect("no call stalls")
    .expect("an answer");
    let answer = response.into_body().collect().await.unwrap().to_bytes();
    (String::from_utf8(answer.to_vec()).unwrap(), start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_overtakes_a_slow_attempt_with_the_same_body() {
    let expected: Vec<u8> = chunks().concat();
    for http2 in [false, true] {
        let (url, seen) = serve(http2).await;
        let (answer, took) = put(&url, http2, Duration::ZERO).await;
        assert_eq!(answer, "fast", "http2: {http2}");
        assert!(took < SLOW, "http2: {http2}, took {took:?}");
        assert_eq!(seen.attempts.load(Ordering::SeqCst), 2, "http2: {http2}");
        let bodies = seen.bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), 2, "http2: {http2}");
        for body in bodies {
            assert!(body == expected, "http2: {http2}: a body differs");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_due_while_the_body_streams_goes_once_the_body_is_complete() {
    let expected: Vec<u8> = chunks().concat();
    let gap = Duration::from_millis(20);
    for http2 in [false, true] {
        let (url, seen) = serve(http2).await;
        // 12 chunks 20 ms apart: the body is still streaming when the hedge is due, and
        // complete once the last chunk has gone (after 11 gaps).
        let (answer, took) = put(&url, http2, gap).await;
        assert_eq!(answer, "fast", "http2: {http2}");
        assert!(
            took >= gap * 11 && took < SLOW,
            "http2: {http2}, took {took:?}"
        );
        assert_eq!(seen.attempts.load(Ordering::SeqCst), 2, "http2: {http2}");
        let bodies = seen.bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), 2, "http2: {http2}");
        for body in bodies {
            assert!(body == expected, "http2: {http2}: a body differs");
        }
    }
}
