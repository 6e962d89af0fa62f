//! A tonic Greeter client whose calls carry a deadline: [`PropagateDeadlineLayer`] over a
//! tonic [`Channel`]; or, with a gRPC service config, backstop's whole gRPC stack with the
//! config's retry, hedging and timeout policy per method.

use backstop::deadline::{PropagateDeadline, PropagateDeadlineLayer};
use example_proto::helloworld::{HelloRequest, greeter_client::GreeterClient};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};
use tower::ServiceBuilder;

/// A Greeter client whose every call gets at most `timeout`, and less when called inside a
/// request that has less left.
pub type Client = GreeterClient<PropagateDeadline<Channel>>;

/// A Greeter client behind the service-config client: each method's `timeout`, retry or
/// hedging policy from the JSON, one breaker, one attempt bound and one budget for the
/// channel.
pub type ConfiguredClient = GreeterClient<backstop::tonic::TonicMethodsClient<Channel>>;

/// Connects to `addr` (lazily: the connection is made by the first call).
///
/// # Errors
///
/// When `addr` is not a valid URI or `timeout` is zero.
pub fn client(addr: &str, timeout: Duration) -> Result<Client, Box<dyn std::error::Error>> {
    let channel = Endpoint::from_shared(addr.to_owned())?.connect_lazy();
    let channel = ServiceBuilder::new()
        .layer(PropagateDeadlineLayer::builder().timeout(timeout).build()?)
        .service(channel);
    Ok(GreeterClient::new(channel))
}

/// Connects to `addr` with gRPC's service config `json` (gRFC A6): the calls of each method
/// follow its `methodConfig` entry, as grpc-js and grpcio would. `TonicBodyLayer` hands the
/// channel the body it takes (without it the stack does not compile: the channel takes
/// `Request<tonic::body::Body>`, the retry layer sends a replayable body).
///
/// # Errors
///
/// When `addr` is not a valid URI, or the config is not valid JSON or breaks a rule of A6
/// (the error names the JSON path at fault).
pub fn configured_client(
    addr: &str,
    json: &str,
) -> Result<ConfiguredClient, Box<dyn std::error::Error>> {
    let config = backstop::service_config::ServiceConfig::from_json(json)?;
    let channel = Endpoint::from_shared(addr.to_owned())?.connect_lazy();
    let channel = ServiceBuilder::new()
        .layer(
            backstop::client::grpc()
                .name("greeter")
                .service_config(config)?,
        )
        .layer(backstop::tonic::TonicBodyLayer)
        .service(channel);
    Ok(GreeterClient::new(channel))
}

/// Calls SayHello and returns the reply, or the status as `CODE: message`.
pub async fn say_hello<T>(
    client: &mut GreeterClient<T>,
    name: &str,
) -> Result<String, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let reply = client
        .say_hello(HelloRequest {
            name: name.to_owned(),
        })
        .await?;
    Ok(reply.into_inner().message)
}
