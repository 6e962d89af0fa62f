//! Hostile inputs over 127.0.0.1: `grpc-timeout` in every malformed shape and overlong, and
//! server hints no client should obey (`grpc-retry-pushback-ms: -1`, `2147483648`, garbage).
//! Each is answered as docs/ARCHITECTURE.md says, without a panic and without an unbounded sleep, and the
//! server is still up afterwards.

use backstop::client::retry::{GiveUp, RetryConfig, backoff};
use backstop::deadline::PropagateDeadlineLayer;
use backstop_integration::listener;
use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::time::Instant;
use tower::ServiceExt;

/// An axum app behind `backstop::server()` answering 200 `ok`.
async fn guarded() -> String {
    let (listener, addr) = listener().await;
    let app = axum::Router::new()
        .fallback(|| async { "ok" })
        .layer(backstop::server());
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/")
}

/// GETs `url` with `grpc-timeout: value` over a plain client; the status and the body.
async fn get_with_timeout(
    url: &str,
    value: &[u8],
    grpc: bool,
) -> (StatusCode, String, Option<String>) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::get(url)
        .header("grpc-timeout", HeaderValue::from_bytes(value).unwrap())
        .body(Full::new(Bytes::new()))
        .unwrap();
    if grpc {
        request
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
    }
    let response = client.request(request).await.expect("the server answers");
    let status = response.status();
    let code = response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned(), code)
}

#[tokio::test]
async fn malformed_grpc_timeouts_are_rejected_never_trusted() {
    let url = guarded().await;
    let overlong = format!("{}S", "1".repeat(8000));
    let malformed: Vec<&[u8]> = vec![
        b"",
        b"1",
        b"S",
        b"-1S",
        b"+1S",
        b"1.5S",
        b"123456789S", // 9 digits
        b"1x",
        b"1s",
        // (" 1S" and "1S " are not here: leading and trailing whitespace is not part of an
        // HTTP field value, so they arrive as "1S".)
        b"0x1S",
        b"1 S",
        b"1SS",
        b"99999999999999999999S",
        overlong.as_bytes(),
    ];
    for value in malformed {
        let shown = String::from_utf8_lossy(&value[..value.len().min(24)]).into_owned();
        let (status, body, _) = get_with_timeout(&url, value, false).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{shown:?}");
        assert_eq!(body, "malformed grpc-timeout", "{shown:?}");
        let (status, _, code) = get_with_timeout(&url, value, true).await;
        assert_eq!(status, StatusCode::OK, "{shown:?}");
        assert_eq!(code.as_deref(), Some("13"), "{shown:?}: INTERNAL");
    }
    // Valid extremes: 0 means already expired; 8 digits of hours saturate, never overflow.
    assert_eq!(
        get_with_timeout(&url, b"0S", false).await.0,
        StatusCode::GATEWAY_TIMEOUT
    );
    for value in [&b"99999999H"[..], b"00000001m", b"1n"] {
        let (status, _, _) = get_with_timeout(&url, value, false).await;
        assert!(
            status == StatusCode::OK || status == StatusCode::GATEWAY_TIMEOUT,
            "{status}"
        );
    }
    // Still up.
    assert_eq!(get_with_timeout(&url, b"5S", false).await.1, "ok");
}

/// A server answering 503 with `grpc-retry-pushback-ms: value`, counting requests.
async fn pushing_back(value: &'static str, hits: Arc<AtomicU64>) -> String {
    let (listener, addr) = listener().await;
    let app = axum::Router::new().fallback(move || {
        hits.fetch_add(1, Ordering::SeqCst);
        async move {
            http::Response::builder()
                .status(503)
                .header("grpc-retry-pushback-ms", value)
                .body(axum::body::Body::empty())
                .unwrap()
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/")
}

#[tokio::test]
async fn hostile_pushbacks_never_make_a_client_retry_or_sleep() {
    let cases = [
        ("-1", 1, Some(GiveUp::Hint)),
        ("2147483648", 1, Some(GiveUp::Hint)), // past int32: "do not retry"
        ("99999999999999999999", 1, Some(GiveUp::Hint)),
        ("soon", 1, Some(GiveUp::Hint)),
        ("2147483647", 1, Some(GiveUp::Hint)), // 24 days: over the 30 s a call waits
        ("0", 3, Some(GiveUp::Attempts)),
    ];
    for (value, want_hits, reason) in cases {
        let hits = Arc::new(AtomicU64::new(0));
        let url = pushing_back(value, hits.clone()).await;
        let layer = backstop::client::http()
            .deadline(PropagateDeadlineLayer::builder().timeout(Duration::from_millis(400)))
            .retry(RetryConfig::http().backoff(backoff::constant(Duration::from_millis(5))))
            .build()
            .unwrap();
        let client = tower::ServiceBuilder::new().layer(layer.clone()).service(
            Client::builder(TokioExecutor::new()).build_http::<backstop::ReplayBody<Full<Bytes>>>(),
        );
        let started = Instant::now();
        let response = client
            .oneshot(Request::get(&url).body(Full::new(Bytes::new())).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(started.elapsed() < Duration::from_secs(2), "{value}: slept");
        assert_eq!(hits.load(Ordering::SeqCst), want_hits, "{value}");
        if let Some(reason) = reason {
            assert_eq!(layer.retry_layer().stats().gave_up(reason), 1, "{value}");
        }
    }
}
