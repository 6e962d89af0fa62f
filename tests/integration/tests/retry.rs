//! Retries across real tonic and hyper servers over 127.0.0.1.

use backstop::GrpcClassifier;
use backstop::client::retry::{CallInfo, ReplayBody, Retry, RetryConfig, backoff};
use backstop::deadline::DeadlineLayer;
use backstop::server::pushback::PushbackLayer;
use backstop_integration::listener;
use bytes::Bytes;
use example_proto::collect::{
    Chunk, Summary,
    collector_client::CollectorClient,
    collector_server::{Collector, CollectorServer},
};
use example_proto::helloworld::{
    HelloReply, HelloRequest,
    greeter_client::GreeterClient,
    greeter_server::{Greeter, GreeterServer},
};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tonic::{
    Code, Status,
    body::Body,
    transport::{Channel, Endpoint, Server, server::TcpIncoming},
};
use tower::{ServiceBuilder, ServiceExt, util::MapRequest};

type RetriedChannel =
    Retry<MapRequest<Channel, fn(Request<ReplayBody<Body>>) -> Request<Body>>, GrpcClassifier>;
type Retried = GreeterClient<RetriedChannel>;

/// A tonic client whose calls are retried (3 attempts, 5 ms apart, no budget).
fn retried_client(url: &str) -> Retried {
    GreeterClient::new(retried_channel(url))
}

/// A tonic channel under a retry layer, with the replayed body mapped back to tonic's.
fn retried_channel(url: &str) -> RetriedChannel {
    let channel = Endpoint::from_shared(url.to_owned())
        .unwrap()
        .connect_lazy();
    let to_body: fn(Request<ReplayBody<Body>>) -> Request<Body> = |req| req.map(Body::new);
    ServiceBuilder::new()
        .layer(
            RetryConfig::grpc()
                .backoff(backoff::constant(Duration::from_millis(5)))
                .no_budget()
                .build()
                .unwrap(),
        )
        .map_request(to_body)
        .service(channel)
}

/// Fails the first `fail_first` calls with UNAVAILABLE (all of them with `u64::MAX`); with an
/// upstream, forwards successful calls there.
#[derive(Clone)]
struct Flaky {
    calls: Arc<AtomicU64>,
    fail_first: u64,
    upstream: Option<Retried>,
}

#[tonic::async_trait]
impl Greeter for Flaky {
    async fn say_hello(
        &self,
        request: tonic::Request<HelloRequest>,
    ) -> Result<tonic::Response<HelloReply>, Status> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n < self.fail_first {
            return Err(Status::unavailable("warming up"));
        }
        let name = request.into_inner().name;
        let message = match &self.upstream {
            Some(upstream) => {
                let reply = upstream
                    .clone()
                    .say_hello(HelloRequest { name: name.clone() })
                    .await?;
                reply.into_inner().message
            }
            None => format!("hello {name}"),
        };
        Ok(tonic::Response::new(HelloReply { message }))
    }
}

async fn serve(flaky: Flaky) -> String {
    let (listener, addr) = listener().await;
    tokio::spawn(
        Server::builder()
            .layer(
                ServiceBuilder::new()
                    .layer(DeadlineLayer::new())
                    .layer(PushbackLayer::new()),
            )
            .add_service(GreeterServer::new(flaky))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    format!("http://{addr}")
}

#[tokio::test]
async fn a_tonic_client_is_retried_past_unavailable() {
    let calls = Arc::new(AtomicU64::new(0));
    let url = serve(Flaky {
        calls: calls.clone(),
        fail_first: 2,
        upstream: None,
    })
    .await;
    let reply = retried_client(&url)
        .say_hello(HelloRequest {
            name: "again".into(),
        })
        .await
        .unwrap();
    // What the call did reaches a generated client's response, through tonic's own wrapping.
    assert_eq!(
        reply.extensions().get::<CallInfo>(),
        Some(&CallInfo::new(3, None))
    );
    assert_eq!(reply.into_inner().message, "hello again");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn three_hops_cost_the_failing_one_max_attempts_not_its_square() {
    let c_calls = Arc::new(AtomicU64::new(0));
    let c = serve(Flaky {
        calls: c_calls.clone(),
        fail_first: u64::MAX,
        upstream: None,
    })
    .await;
    let b = serve(Flaky {
        calls: Arc::new(AtomicU64::new(0)),
        fail_first: 0,
        upstream: Some(retried_client(&c)),
    })
    .await;
    let status = retried_client(&b)
        .say_hello(HelloRequest {
            name: "chain".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status
            .metadata()
            .get("grpc-retry-pushback-ms")
            .map(|v| v.to_str().unwrap()),
        Some("-1")
    );
    // B gave up after 3 attempts on C and said so; A did not retry B.
    assert_eq!(c_calls.load(Ordering::SeqCst), 3);
}

/// A hyper server that counts requests and answers 503 with a checksum of the body it read.
async fn counting_http_server(hits: Arc<AtomicU64>) -> String {
    let (listener, addr) = listener().await;
    let app = axum::Router::new().fallback(move |body: Bytes| {
        let hits = hits.clone();
        async move {
            hits.fetch_add(1, Ordering::SeqCst);
            let sum: u64 = body.iter().map(|&b| u64::from(b)).sum();
            Response::builder()
                .status(503)
                .header("x-sum", sum)
                .header("x-len", body.len())
                .body(axum::body::Body::empty())
                .unwrap()
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/")
}

#[tokio::test]
async fn over_hyper_post_is_sent_once_and_put_bodies_replay_byte_identical() {
    let hits = Arc::new(AtomicU64::new(0));
    let url = counting_http_server(hits.clone()).await;
    let client = ServiceBuilder::new()
        .layer(
            RetryConfig::http()
                .backoff(backoff::constant(Duration::from_millis(5)))
                .no_budget()
                .build()
                .unwrap(),
        )
        .service(Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Full<Bytes>>>());

    // POST + 503: the server may have acted on it; it must see it exactly once.
    let post = Request::post(&url)
        .body(Full::new(Bytes::from_static(b"charge card")))
        .unwrap();
    let response = client.clone().oneshot(post).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(hits.swap(0, Ordering::SeqCst), 1);

    // PUT + 503: idempotent, retried; every attempt carries the same bytes.
    let payload: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let want: u64 = payload.iter().map(|&b| u64::from(b)).sum();
    let put = Request::put(&url)
        .body(Full::new(Bytes::from(payload.clone())))
        .unwrap();
    let response = client.oneshot(put).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["x-sum"], want.to_string().as_str());
    assert_eq!(
        response.headers()["x-len"],
        payload.len().to_string().as_str()
    );
    let _ = response.into_body().collect().await;
    assert_eq!(hits.load(Ordering::SeqCst), 3);
}

/// Reads the whole request stream, and fails the first call with UNAVAILABLE after reading it.
#[derive(Clone, Default)]
struct Collecting {
    calls: Arc<AtomicU64>,
    seen: Arc<std::sync::Mutex<Vec<Summary>>>,
}

#[tonic::async_trait]
impl Collector for Collecting {
    async fn collect(
        &self,
        request: tonic::Request<tonic::Streaming<Chunk>>,
    ) -> Result<tonic::Response<Summary>, Status> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let mut stream = request.into_inner();
        let mut summary = Summary::default();
        while let Some(chunk) = stream.message().await? {
            summary.chunks += 1;
            summary.bytes += chunk.data.len() as u64;
            summary.sum += chunk.data.iter().map(|&b| u64::from(b)).sum::<u64>();
        }
        self.seen.lock().unwrap().push(summary);
        if n == 0 {
            return Err(Status::unavailable("read it all, then failed"));
        }
        Ok(tonic::Response::new(summary))
    }
}

#[tokio::test]
async fn a_streamed_tonic_request_is_replayed_byte_for_byte() {
    let collecting = Collecting::default();
    let (listener, addr) = listener().await;
    tokio::spawn(
        Server::builder()
            .add_service(CollectorServer::new(collecting.clone()))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let mut client = CollectorClient::new(retried_channel(&format!("http://{addr}")));
    let chunks: Vec<Chunk> = (0..50u32)
        .map(|i| Chunk {
            data: (0..(i * 37 % 700)).map(|j| ((i + j) % 251) as u8).collect(),
        })
        .collect();
    let want = Summary {
        chunks: 50,
        bytes: chunks.iter().map(|c| c.data.len() as u64).sum(),
        sum: chunks
            .iter()
            .flat_map(|c| c.data.iter())
            .map(|&b| u64::from(b))
            .sum(),
    };
    let reply = client
        .collect(tonic::codegen::tokio_stream::iter(chunks))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply, want);
    // Both attempts carried the same stream.
    assert_eq!(collecting.calls.load(Ordering::SeqCst), 2);
    assert_eq!(*collecting.seen.lock().unwrap(), vec![want, want]);
}

/// The presets around a tonic `Channel` have types a struct can spell (feature `tonic`):
/// the preset's `TonicClient<Channel>` and the service-config client's
/// `TonicMethodsClient<Channel>`, whose layer shows the breaker, the latency model and the
/// attempt bound every method shares.
#[tokio::test]
async fn the_tonic_clients_have_names() {
    use backstop::service_config::ServiceConfig;
    use backstop::tonic::{TonicBodyLayer, TonicClient, TonicMethodsClient};

    struct Clients {
        preset: GreeterClient<TonicClient<Channel>>,
        methods: GreeterClient<TonicMethodsClient<Channel>>,
    }
    let calls = Arc::new(AtomicU64::new(0));
    let url = serve(Flaky {
        calls: calls.clone(),
        fail_first: 1,
        upstream: None,
    })
    .await;
    let channel = Endpoint::from_shared(url).unwrap().connect_lazy();
    let config = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{"service": "helloworld.Greeter"}], "timeout": "2s",
            "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
            "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
    )
    .unwrap();
    let methods = backstop::client::grpc()
        .name("greeter")
        .service_config(config)
        .unwrap();
    let mut clients = Clients {
        preset: GreeterClient::new(
            ServiceBuilder::new()
                .layer(
                    backstop::client::grpc()
                        .name("greeter-preset")
                        .build()
                        .unwrap(),
                )
                .layer(TonicBodyLayer)
                .service(channel.clone()),
        ),
        methods: GreeterClient::new(
            ServiceBuilder::new()
                .layer(methods.clone())
                .layer(TonicBodyLayer)
                .service(channel),
        ),
    };
    let hello = |name: &str| HelloRequest { name: name.into() };
    // The first call is refused with UNAVAILABLE and retried by the preset.
    let reply = clients.preset.say_hello(hello("preset")).await.unwrap();
    assert_eq!(
        reply.extensions().get::<CallInfo>(),
        Some(&CallInfo::new(2, None))
    );
    let reply = clients.methods.say_hello(hello("methods")).await.unwrap();
    assert_eq!(reply.into_inner().message, "hello methods");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(methods.dependency(), "greeter");
    assert_eq!(methods.breaker_layer().snapshot().calls, 1);
    assert_eq!(methods.latency().count, 1);
    assert!(methods.attempt_layer().current_bound().is_some());
}

/// What a failed call did reaches a generated client's `Status` (which keeps no
/// extensions): the retry layer tells it in the failure's metadata.
#[tokio::test]
async fn a_failed_calls_status_says_how_many_attempts_and_why_it_stopped() {
    use backstop::client::retry::GiveUp;
    use backstop::tonic::{TonicBodyLayer, status_info};
    let calls = Arc::new(AtomicU64::new(0));
    let url = serve(Flaky {
        calls: calls.clone(),
        fail_first: u64::MAX,
        upstream: None,
    })
    .await;
    let channel = Endpoint::from_shared(url).unwrap().connect_lazy();
    let retry = RetryConfig::grpc()
        .backoff(backoff::constant(Duration::from_millis(5)))
        .no_budget();
    let mut client = GreeterClient::new(
        ServiceBuilder::new()
            .layer(backstop::client::grpc().retry(retry).build().unwrap())
            .layer(TonicBodyLayer)
            .service(channel),
    );
    let hello = HelloRequest { name: "x".into() };
    let status = client.say_hello(hello.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "warming up");
    assert_eq!(
        status_info(&status),
        Some(CallInfo::new(3, Some(GiveUp::Attempts)))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // A status the client's own stack made (the deadline spent before sending): no record.
    let mut request = tonic::Request::new(hello);
    request.set_timeout(Duration::from_nanos(1));
    let status = client.say_hello(request).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(status_info(&status), None);
    assert_eq!(calls.load(Ordering::SeqCst), 3, "nothing was sent");
}
