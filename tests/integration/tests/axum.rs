//! Deadlines through a real axum app and a hyper-util client over 127.0.0.1.

use backstop_integration::{deadlines_in, start_axum};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};

async fn get(uri: String, headers: &[(&str, &str)]) -> (StatusCode, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut request = Request::get(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn the_outbound_call_inherits_a_share_of_the_deadline() {
    let b = start_axum(None).await;
    let a = start_axum(Some(&b)).await;
    let (status, text) = get(format!("{a}chain"), &[("grpc-timeout", "3S")]).await;
    assert_eq!(status, 200, "{text}");
    let [on_a, on_b] = deadlines_in(&text)[..] else {
        panic!("two deadlines in {text:?}")
    };
    assert!(on_a < 3_000 && on_a > 1_500, "{text}");
    // A's client passes on 90 % of what is left, less a 2 ms offset.
    assert!(on_b * 10 <= on_a * 9, "{text}");
    assert!(on_b > 0, "{text}");
}

#[tokio::test]
async fn the_milliseconds_header_and_the_default_apply() {
    let a = start_axum(None).await;
    let (_, text) = get(format!("{a}deadline"), &[("x-timeout-ms", "1500")]).await;
    let [ms] = deadlines_in(&text)[..] else {
        panic!("{text}")
    };
    assert!(ms < 1_500 && ms > 500, "{text}");
    let (_, text) = get(format!("{a}deadline"), &[]).await;
    let [ms] = deadlines_in(&text)[..] else {
        panic!("{text}")
    };
    assert!(ms <= 5_000 && ms > 3_000, "{text}");
}

#[tokio::test]
async fn expiry_answers_504() {
    let a = start_axum(None).await;
    let (status, text) = get(format!("{a}sleep/10000"), &[("x-timeout-ms", "30")]).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(text, "deadline exceeded");
}

#[tokio::test]
async fn a_malformed_timeout_answers_400() {
    let a = start_axum(None).await;
    let (status, text) = get(format!("{a}deadline"), &[("grpc-timeout", "soon")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(text, "malformed grpc-timeout");
}

/// A request body limit beside `server()` (tower-http's `RequestBodyLimitLayer`, as the
/// server preset's docs show): a declared or streamed body over the limit is answered 413
/// and the handler's work is not done, a body within it is read whole, and the deadline
/// still answers 504 through the limit.
#[tokio::test]
async fn a_body_limit_beside_the_server_preset_answers_413_and_keeps_the_deadline() {
    use axum::{Router, routing::post};
    use std::sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    };
    use tower::ServiceBuilder;
    let ran = Arc::new(AtomicU32::new(0));
    let count = ran.clone();
    let app = Router::new()
        .route(
            "/echo",
            post(move |body: Bytes| async move {
                count.fetch_add(1, Ordering::SeqCst);
                format!("{} bytes", body.len())
            }),
        )
        .route(
            "/slow",
            post(|_body: Bytes| async {
                tokio::time::sleep(std::time::Duration::from_secs(10)).await;
                "slept"
            }),
        )
        .layer(
            ServiceBuilder::new()
                .layer(backstop::server())
                .layer(tower_http::limit::RequestBodyLimitLayer::new(1024)),
        );
    let (listener, addr) = backstop_integration::listener().await;
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::builder(TokioExecutor::new()).build_http::<http_body_util::Full<Bytes>>();
    let post = |path: &str, body: Vec<u8>, timeout: Option<&str>| {
        let mut request = Request::post(format!("http://{addr}{path}"));
        if let Some(t) = timeout {
            request = request.header("grpc-timeout", t);
        }
        let request = request
            .body(http_body_util::Full::new(Bytes::from(body)))
            .unwrap();
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let (status, text) = post("/echo", vec![b'x'; 1000], Some("5S")).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "1000 bytes"));
    let (status, _) = post("/echo", vec![b'x'; 4096], Some("5S")).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the handler ran for the small body only"
    );
    // Streamed, with no content-length: cut when the limit is passed.
    let streaming = Client::builder(TokioExecutor::new())
        .build_http::<http_body_util::channel::Channel<Bytes, std::convert::Infallible>>();
    let (mut tx, body) = http_body_util::channel::Channel::new(4);
    let request = Request::post(format!("http://{addr}/echo"))
        .body(body)
        .unwrap();
    let send = tokio::spawn(async move {
        for _ in 0..8 {
            if tx.send_data(Bytes::from(vec![b'y'; 512])).await.is_err() {
                break;
            }
        }
    });
    let response = streaming.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    send.await.unwrap();
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the handler's work was not done"
    );
    let (status, text) = post("/slow", vec![b'x'; 10], Some("50m")).await;
    assert_eq!(
        (status, text.as_str()),
        (StatusCode::GATEWAY_TIMEOUT, "deadline exceeded")
    );
}

/// Defect (outside audit): a handler answering at its deadline (after `remaining()`) behind
/// `server()` had its body, complete in memory, cut by the deadline when hyper read it a few
/// µs later: over HTTP/1.1, of 200 calls none got the 200, about half a torn connection
/// (hyper's `IncompleteMessage`). Every call now gets one whole answer, the handler's 200 or
/// the 504, over HTTP/1.1 and HTTP/2.
#[tokio::test]
async fn a_handler_answering_at_its_deadline_is_never_torn() {
    use axum::{Router, routing::get};
    use futures_util::future::join_all;
    use tower::ServiceExt;
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                let left = backstop::deadline::current().unwrap().remaining();
                tokio::time::sleep(left).await;
                "the handler's whole answer"
            }),
        )
        .layer(backstop::server());
    for http2 in [false, true] {
        let addr =
            backstop_integration::serve_hyper(http2, app.clone(), |req, app| app.oneshot(req))
                .await;
        let client = Client::builder(TokioExecutor::new())
            .http2_only(http2)
            .build_http::<Empty<Bytes>>();
        let call = || async {
            let request = Request::get(format!("http://{addr}/"))
                .header("grpc-timeout", "20m")
                .body(Empty::new())
                .unwrap();
            let response = client
                .request(request)
                .await
                .map_err(|e| format!("{e:?}"))?;
            let status = response.status();
            let body = response.into_body().collect().await;
            let body = body.map_err(|e| format!("torn: {e:?}"))?.to_bytes();
            Ok::<_, String>((status, String::from_utf8(body.to_vec()).unwrap()))
        };
        let answers = join_all((0..50).map(|_| call())).await;
        let mut whole = 0;
        for answer in answers {
            let (status, text) = answer.unwrap_or_else(|e| panic!("http2 {http2}: {e}"));
            match status {
                StatusCode::OK => {
                    assert_eq!(text, "the handler's whole answer");
                    whole += 1;
                }
                StatusCode::GATEWAY_TIMEOUT => {}
                other => panic!("http2 {http2}: {other} {text:?}"),
            }
        }
        // The handler is polled before the deadline's timer, so its answer gets out.
        assert!(whole > 0, "http2 {http2}: no call got the handler's answer");
    }
}

/// The client's rule, over a real hyper HTTP/1.1 connection (found by an outside attack: the
/// docs said a response that arrived whole is read whole after the call's deadline, which a
/// client cannot know: hyper's `Incoming` yields one chunk, then waits for its connection
/// task, whether or not the rest is on the socket). The call's deadline bounds the whole call,
/// reading the body included, as reqwest's `timeout` does: a 64 KiB answer read within it is
/// whole; read after it, it ends with `DeadlineExceeded`, an error the caller recognises,
/// never a short body that looks complete.
#[tokio::test]
async fn the_calls_deadline_bounds_reading_the_body_over_http1() {
    use backstop::deadline::PropagateDeadlineLayer;
    use http_body_util::Full;
    use std::time::Duration;
    use tower::{Layer, ServiceExt};
    const SIZE: usize = 64 << 10;
    let addr = backstop_integration::serve_hyper(false, (), |_req, ()| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(vec![
            b'x';
            SIZE
        ]))))
    })
    .await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let client = PropagateDeadlineLayer::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap()
        .layer(client);
    let request = || {
        Request::get(format!("http://{addr}/"))
            .body(Empty::new())
            .unwrap()
    };
    let response = client.clone().oneshot(request()).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), SIZE, "read within the deadline: whole");

    let response = client.oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(700)).await;
    match response.into_body().collect().await {
        // All of it was ready when read (the platform handed hyper every byte at once).
        Ok(body) => assert_eq!(body.to_bytes().len(), SIZE),
        Err(e) => assert!(
            backstop::is_deadline_exceeded(e.as_ref()),
            "read after the deadline: DeadlineExceeded, got {e:?}"
        ),
    }
}
