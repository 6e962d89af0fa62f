//! Deadlines across real tonic servers and clients over 127.0.0.1.

use backstop::deadline::{DeadlineLayer, PropagateDeadlineLayer};
use backstop_integration::{deadlines_in, listener, raw_say_hello, start_greeter};
use example_proto::helloworld::{
    HelloReply, HelloRequest,
    greeter_client::GreeterClient,
    greeter_server::{Greeter, GreeterServer},
};
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tonic::{
    Code,
    transport::{Endpoint, Server, server::TcpIncoming},
};
use tower::ServiceBuilder;

#[tokio::test]
async fn the_handler_sees_the_deadline_and_a_second_hop_gets_what_is_left() {
    let b = start_greeter(None).await;
    let a = start_greeter(Some(&b)).await;
    let mut client = example_tonic_client::client(&a, Duration::from_secs(5)).unwrap();
    let reply = example_tonic_client::say_hello(&mut client, "world")
        .await
        .unwrap();
    assert!(reply.starts_with("hello world; deadline "), "{reply}");
    let seen = deadlines_in(&reply);
    let [on_a, on_b] = seen[..] else {
        panic!("two deadlines in {reply:?}")
    };
    // A got 5 s less the lead and the time on the way; B got what A had left, never more.
    assert!(on_a < 5_000 && on_a > 2_500, "{reply}");
    assert!(on_b <= on_a && on_b > 0, "{reply}");
}

#[tokio::test]
async fn without_a_deadline_the_handler_sees_none() {
    let a = start_greeter(None).await;
    let mut client = GreeterClient::new(Endpoint::from_shared(a).unwrap().connect_lazy());
    let reply = client
        .say_hello(HelloRequest {
            name: "plain".into(),
        })
        .await
        .unwrap();
    assert_eq!(reply.into_inner().message, "hello plain; no deadline");
}

#[tokio::test]
async fn a_tonic_client_sees_deadline_exceeded_every_time_never_cancelled() {
    let a = start_greeter(None).await;
    let mut client = example_tonic_client::client(&a, Duration::from_millis(25)).unwrap();
    for _ in 0..20 {
        let status = example_tonic_client::say_hello(&mut client, "sleep:5000")
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    }
}

#[tokio::test]
async fn the_servers_answer_beats_tonics_own_timer() {
    // A bare HTTP/2 client runs no timer, so this is exactly what the server sends. tonic's
    // server arms its own grpc-timeout timer (answering CANCELLED); DeadlineLayer must win.
    let a = start_greeter(None).await;
    for timeout in ["15m", "20m", "25000u", "30000000n"]
        .iter()
        .cycle()
        .take(40)
    {
        let status = raw_say_hello(&a, "sleep:5000", Some(timeout)).await;
        assert_eq!(status.code, "4", "{timeout}: {status:?}");
        assert_eq!(status.message.as_deref(), Some("deadline exceeded"));
    }
}

#[tokio::test]
async fn a_grpc_call_with_time_left_succeeds_over_the_bare_client() {
    let a = start_greeter(None).await;
    let status = raw_say_hello(&a, "world", Some("10S")).await;
    assert_eq!(status.code, "0");
}

#[tokio::test]
async fn a_malformed_grpc_timeout_is_internal() {
    let a = start_greeter(None).await;
    for bad in ["1.5S", "123456789n", "10X", "S"] {
        let status = raw_say_hello(&a, "world", Some(bad)).await;
        assert_eq!(status.code, "13", "{bad}");
        assert_eq!(status.message.as_deref(), Some("malformed grpc-timeout"));
    }
}

#[tokio::test]
async fn an_already_expired_deadline_is_answered_without_running_the_handler() {
    let a = start_greeter(None).await;
    let status = raw_say_hello(&a, "world", Some("0n")).await;
    assert_eq!(status.code, "4");
}

/// A Greeter that never answers, and records that its handler started and was dropped.
#[derive(Debug, Clone, Default)]
struct Stuck {
    started: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tonic::async_trait]
impl Greeter for Stuck {
    async fn say_hello(
        &self,
        _: tonic::Request<HelloRequest>,
    ) -> Result<tonic::Response<HelloReply>, tonic::Status> {
        let _guard = SetOnDrop(self.dropped.clone());
        self.started.store(true, Ordering::SeqCst);
        std::future::pending::<()>().await;
        unreachable!()
    }
}

#[tokio::test]
async fn expiry_cancels_the_handlers_work() {
    let stuck = Stuck::default();
    let (listener, addr) = listener().await;
    tokio::spawn(
        Server::builder()
            .layer(DeadlineLayer::new())
            .add_service(GreeterServer::new(stuck.clone()))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    // Long enough for the handler to have started on a loaded machine.
    let status = raw_say_hello(&format!("http://{addr}"), "x", Some("1S")).await;
    assert_eq!(status.code, "4");
    // The handler ran, and its future was dropped before the answer was sent.
    assert!(stuck.started.load(Ordering::SeqCst));
    assert!(stuck.dropped.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_caller_deadline_shortens_the_client_timeout() {
    let a = start_greeter(None).await;
    let channel = Endpoint::from_shared(a).unwrap().connect_lazy();
    let mut client = GreeterClient::new(
        ServiceBuilder::new()
            .layer(
                PropagateDeadlineLayer::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap(),
            )
            .service(channel),
    );
    let reply = backstop::deadline::Deadline::after(Duration::from_millis(900))
        .scope(client.say_hello(HelloRequest {
            name: "inner".into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .message;
    let [seen] = deadlines_in(&reply)[..] else {
        panic!("one deadline in {reply:?}")
    };
    assert!(seen < 900 && seen > 400, "{reply}");
}
