//! Compile-time proof that the layers fit where users put them: `tonic::transport::Server`
//! `.layer(..)`, a tonic client `Channel`, and `axum::Router::layer(..)`, with no
//! `HandleErrorLayer` anywhere.

use backstop::deadline::{DeadlineLayer, PropagateDeadlineLayer};
use example_proto::helloworld::{greeter_client::GreeterClient, greeter_server::GreeterServer};
use std::convert::Infallible;
use tonic::transport::{Endpoint, Server};
use tower::ServiceBuilder;

#[allow(dead_code)]
async fn tonic_server_accepts_the_layer() -> Result<(), tonic::transport::Error> {
    Server::builder()
        .layer(DeadlineLayer::new())
        .add_service(GreeterServer::new(example_tonic_server::Greeter::new()))
        .serve("127.0.0.1:0".parse().unwrap())
        .await
}

#[allow(dead_code)]
async fn axum_serves_the_layered_router() -> std::io::Result<()> {
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(DeadlineLayer::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    axum::serve(listener, app).await
}

#[tokio::test]
async fn layers_fit_tonic_server_tonic_channel_and_axum_router() {
    // tonic server
    let _router = Server::builder()
        .layer(DeadlineLayer::new())
        .add_service(GreeterServer::new(example_tonic_server::Greeter::new()));
    // tonic client over a Channel
    let channel = Endpoint::from_static("http://127.0.0.1:9").connect_lazy();
    let _client = GreeterClient::new(
        ServiceBuilder::new()
            .layer(PropagateDeadlineLayer::new())
            .service(channel),
    );
    // axum: the layered router keeps `Error = Infallible`.
    let router: axum::Router = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(DeadlineLayer::new());
    fn infallible<S: tower::Service<http::Request<axum::body::Body>, Error = Infallible>>(_: &S) {}
    infallible(&router);
}
