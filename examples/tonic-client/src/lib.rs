//! A tonic Greeter client whose calls carry a deadline: [`PropagateDeadlineLayer`] over a
//! tonic [`Channel`].

use backstop_deadline::{PropagateDeadline, PropagateDeadlineLayer};
use example_proto::helloworld::{HelloRequest, greeter_client::GreeterClient};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};
use tower::ServiceBuilder;

/// A Greeter client whose every call gets at most `timeout`, and less when called inside a
/// request that has less left.
pub type Client = GreeterClient<PropagateDeadline<Channel>>;

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

/// Calls SayHello and returns the reply, or the status as `CODE: message`.
pub async fn say_hello(client: &mut Client, name: &str) -> Result<String, tonic::Status> {
    let reply = client
        .say_hello(HelloRequest {
            name: name.to_owned(),
        })
        .await?;
    Ok(reply.into_inner().message)
}
