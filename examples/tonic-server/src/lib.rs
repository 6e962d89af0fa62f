//! `helloworld.Greeter` behind [`DeadlineLayer`]: the handler sees the caller's deadline, and a
//! call it makes to an upstream Greeter inherits it.
//!
//! The reply is `hello NAME; deadline N ms`, where N is the time the handler has left when it
//! starts (or `hello NAME; no deadline`). A name `sleep:MS` makes the handler sleep MS
//! milliseconds first, so a deadline can cut it. With an upstream, the handler then calls the
//! upstream's SayHello with the same name and appends `; upstream: REPLY`: the upstream's
//! deadline is what is left of this one, with nothing passed by hand.

use backstop::deadline::{Deadline, DeadlineLayer, PropagateDeadline};
use example_proto::helloworld::{
    HelloReply, HelloRequest,
    greeter_client::GreeterClient,
    greeter_server::{self, GreeterServer},
};
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::{
    Request, Response, Status,
    transport::{Channel, Endpoint, Server, server::TcpIncoming},
};

/// The Greeter service.
#[derive(Debug, Clone, Default)]
pub struct Greeter {
    upstream: Option<GreeterClient<PropagateDeadline<Channel>>>,
}

impl Greeter {
    /// A Greeter that answers by itself.
    pub fn new() -> Self {
        Self::default()
    }

    /// A Greeter that also calls the Greeter at `url` (connected lazily, on first use), through
    /// [`PropagateDeadline`], for every request.
    ///
    /// # Errors
    ///
    /// When `url` is not a valid endpoint URI.
    pub fn with_upstream(url: &str) -> Result<Self, tonic::transport::Error> {
        let channel = Endpoint::from_shared(url.to_owned())?.connect_lazy();
        Ok(Self {
            upstream: Some(GreeterClient::new(PropagateDeadline::new(channel))),
        })
    }
}

/// The reply for `name` with `deadline` as the handler sees it on arrival.
pub fn greeting(name: &str, deadline: Option<Deadline>) -> String {
    match deadline {
        Some(d) => format!("hello {name}; deadline {} ms", d.remaining().as_millis()),
        None => format!("hello {name}; no deadline"),
    }
}

#[tonic::async_trait]
impl greeter_server::Greeter for Greeter {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        // DeadlineLayer puts the deadline in the request's extensions, and makes it the
        // task-local `backstop::deadline::current()` for everything this handler awaits.
        let deadline = request.extensions().get::<Deadline>().copied();
        let name = request.into_inner().name;
        let mut message = greeting(&name, deadline);
        if let Some(ms) = name.strip_prefix("sleep:") {
            let ms = ms
                .parse()
                .map_err(|_| Status::invalid_argument("sleep:MS wants a number of milliseconds"))?;
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if let Some(upstream) = &self.upstream {
            let reply = upstream
                .clone()
                .say_hello(HelloRequest { name: name.clone() })
                .await?;
            message.push_str("; upstream: ");
            message.push_str(&reply.into_inner().message);
        }
        Ok(Response::new(HelloReply { message }))
    }
}

/// Serves `greeter` behind `layer` on `listener` until the task is dropped.
///
/// # Errors
///
/// When the server fails.
pub async fn serve(
    listener: TcpListener,
    greeter: Greeter,
    layer: DeadlineLayer,
) -> Result<(), tonic::transport::Error> {
    Server::builder()
        .layer(layer)
        .add_service(GreeterServer::new(greeter))
        .serve_with_incoming(TcpIncoming::from(listener))
        .await
}
