//! The facade's presets end to end with tonic over 127.0.0.1: a generated client over a
//! `Channel` under `backstop::client::grpc().build().unwrap()`, a server under `backstop::server()`, the
//! deadline crossing the wire, and the breaker answering UNAVAILABLE while the server is gone.

use backstop::GrpcClassifier;
use backstop::ReplayBody;
use backstop::client::ClientLayer;
use backstop::client::breaker::State;
use backstop::deadline::PropagateDeadlineLayer;
use backstop_integration::listener;
use example_proto::helloworld::{
    HelloRequest, greeter_client::GreeterClient, greeter_server::GreeterServer,
};
use std::time::Duration;
use tonic::{
    Code,
    body::Body,
    transport::{Channel, Endpoint, Server, server::TcpIncoming},
};
use tower::{Layer, util::MapRequest};

fn preset() -> ClientLayer<GrpcClassifier> {
    backstop::client::grpc()
        .deadline(PropagateDeadlineLayer::builder().timeout(Duration::from_millis(800)))
        .build()
        .unwrap()
}

type ToBody = fn(http::Request<ReplayBody<Body>>) -> http::Request<Body>;
/// The preset's stack around a tonic `Channel`, the replayable body mapped back to tonic's.
type Stack = <ClientLayer<GrpcClassifier> as Layer<MapRequest<Channel, ToBody>>>::Service;

/// A generated client over a tonic `Channel` under `layer`.
fn client(url: String, layer: &ClientLayer<GrpcClassifier>) -> GreeterClient<Stack> {
    let channel = Endpoint::from_shared(url).unwrap().connect_lazy();
    let to_body: ToBody = |r| r.map(Body::new);
    GreeterClient::new(layer.layer(MapRequest::new(channel, to_body)))
}

#[tokio::test]
async fn a_tonic_client_and_server_under_the_presets() {
    let (listener, addr) = listener().await;
    tokio::spawn(
        Server::builder()
            .layer(backstop::server())
            .add_service(GreeterServer::new(example_tonic_server::Greeter::new()))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let layer = preset();
    let mut greeter = client(format!("http://{addr}"), &layer);
    let reply = greeter
        .say_hello(HelloRequest {
            name: "world".to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    // The server saw the client's deadline (800 ms, less what the trip took).
    let left: u64 = reply
        .message
        .rsplit("deadline ")
        .next()
        .and_then(|s| s.trim_end_matches(" ms").parse().ok())
        .expect("the reply names the deadline");
    assert!((200..=800).contains(&left), "{}", reply.message);

    // The handler sleeps past the deadline: the server answers DEADLINE_EXCEEDED, the client
    // reports it as such.
    let status = greeter
        .say_hello(HelloRequest {
            name: "sleep:3000".to_owned(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(layer.breaker_layer().snapshot().state, State::Closed);
}

#[tokio::test]
async fn with_the_server_gone_the_breaker_answers_unavailable_locally() {
    // A port nobody listens on: every attempt is refused by the kernel.
    let (listener, addr) = listener().await;
    drop(listener);
    let layer = preset();
    let mut greeter = client(format!("http://{addr}"), &layer);
    let mut local = 0;
    for _ in 0..30 {
        let status = greeter
            .say_hello(HelloRequest {
                name: "world".to_owned(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        if status.message() == "circuit breaker open" {
            local += 1;
        }
    }
    // 20 failed attempts in a row open the preset's breaker; the rest never leave the process.
    assert_eq!(layer.breaker_layer().snapshot().state, State::Open);
    assert!(local >= 20, "{local} answered by the breaker");
}
