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
