//! An outside review of the gRPC preset around a real tonic `Channel` over 127.0.0.1: every
//! attempt carries exactly one `grpc-timeout` on the wire (none with `send_grpc_timeout(false)`),
//! whatever the caller set with `tonic::Request::set_timeout` and whatever the `Endpoint`'s own
//! timeout; retries and hedges included.

use backstop::client::ClientLayer;
use backstop::client::retry::{Idempotency, RetryConfig, hedge::Hedging};
use backstop::{GrpcClassifier, ReplayBody};
use backstop_integration::serve_hyper;
use bytes::Bytes;
use example_proto::helloworld::{HelloRequest, greeter_client::GreeterClient};
use http::{HeaderMap, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, StreamBody, combinators::BoxBody};
use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};
use tonic::{body::Body, transport::Endpoint};
use tower::{Layer, util::MapRequest};

/// What the server saw: each attempt's `grpc-timeout` values.
type Seen = Arc<Mutex<Vec<Vec<String>>>>;

fn ok_reply() -> Response<BoxBody<Bytes, Infallible>> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    let frames = vec![
        Ok::<_, Infallible>(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
        Ok(Frame::trailers(trailers)),
    ];
    Response::builder()
        .header("content-type", "application/grpc")
        .body(StreamBody::new(futures_util::stream::iter(frames)).boxed())
        .unwrap()
}

fn unavailable() -> Response<BoxBody<Bytes, Infallible>> {
    Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", "14")
        .body(Empty::new().boxed())
        .unwrap()
}

/// A server that logs each request's `grpc-timeout` values; attempts 1 and 2 of each call
/// (by count) answer as `first_two` says (`None`: 300 ms late, then OK), the rest OK at once.
async fn server(fail_first_two: bool) -> (String, Seen) {
    let seen = Seen::default();
    let addr = serve_hyper(
        true,
        seen.clone(),
        move |req: Request<hyper::body::Incoming>, seen: Seen| async move {
            let n = {
                let mut seen = seen.lock().unwrap();
                seen.push(
                    req.headers()
                        .get_all("grpc-timeout")
                        .iter()
                        .map(|v| v.to_str().unwrap().to_owned())
                        .collect(),
                );
                seen.len()
            };
            let _ = req.into_body().collect().await;
            if n % 3 != 0 {
                if fail_first_two {
                    return Ok::<_, Infallible>(unavailable());
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Ok(ok_reply())
        },
    )
    .await;
    (format!("http://{addr}"), seen)
}

type ToBody = fn(http::Request<ReplayBody<Body>>) -> http::Request<Body>;
type Stack =
    <ClientLayer<GrpcClassifier> as Layer<MapRequest<tonic::transport::Channel, ToBody>>>::Service;

fn client(url: &str, layer: &ClientLayer<GrpcClassifier>) -> GreeterClient<Stack> {
    let channel = Endpoint::from_shared(url.to_owned())
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    let to_body: ToBody = |r| r.map(Body::new);
    GreeterClient::new(layer.layer(MapRequest::new(channel, to_body)))
}

fn hello(timeout: Option<Duration>) -> tonic::Request<HelloRequest> {
    let mut req = tonic::Request::new(HelloRequest {
        name: "world".to_owned(),
    });
    if let Some(t) = timeout {
        req.set_timeout(t);
    }
    req
}

/// Retried (UNAVAILABLE twice) and hedged (two slow attempts) calls through a tonic `Channel`:
/// one header per attempt, no more than the caller's `set_timeout` or the stack's `timeout`.
#[tokio::test]
async fn each_attempt_on_the_wire_carries_one_grpc_timeout() {
    for hedged in [false, true] {
        for (stack_timeout, caller_timeout, most) in [
            (None, Some(Duration::from_millis(1500)), 1500),
            (
                Some(Duration::from_millis(1200)),
                Some(Duration::from_secs(5)),
                1200,
            ),
            (Some(Duration::from_millis(1200)), None, 1200),
        ] {
            let (url, seen) = server(!hedged).await;
            let builder = backstop::client::grpc().throttle(None);
            let builder = if hedged {
                builder.retry(
                    RetryConfig::grpc()
                        .idempotency(Idempotency::All)
                        .hedging(Hedging::new(Duration::from_millis(50)).max_attempts(3)),
                )
            } else {
                builder
            };
            let builder = match stack_timeout {
                Some(t) => builder.timeout(t),
                None => builder,
            };
            let layer = builder.build().unwrap();
            let mut greeter = client(&url, &layer);
            let case =
                format!("hedged {hedged}, stack {stack_timeout:?}, caller {caller_timeout:?}");
            greeter
                .say_hello(hello(caller_timeout))
                .await
                .unwrap_or_else(|s| panic!("{case}: {s:?}"));
            let seen = seen.lock().unwrap().clone();
            assert_eq!(seen.len(), 3, "{case}: {seen:?}");
            for told in &seen {
                assert_eq!(told.len(), 1, "{case}: {seen:?}");
                assert!(
                    backstop_test_support::told_ms(&told[0]) <= most,
                    "{case}: {seen:?}"
                );
            }
        }
    }
}

/// `send_grpc_timeout(false)`: no attempt on the wire carries the header, though the caller set
/// one with `set_timeout`; the call is still bounded by it.
#[tokio::test]
async fn no_grpc_timeout_on_the_wire_when_none_is_sent() {
    let (url, seen) = server(true).await;
    let layer = backstop::client::grpc()
        .throttle(None)
        .send_grpc_timeout(false)
        .build()
        .unwrap();
    let mut greeter = client(&url, &layer);
    greeter
        .say_hello(hello(Some(Duration::from_millis(1500))))
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(Vec::is_empty), "{seen:?}");
}
