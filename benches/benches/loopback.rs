//! The success path over a real connection: each stack around a hyper HTTP/1.1 client calling
//! a hyper server on 127.0.0.1 (one kept-alive connection, one runtime thread for both ends),
//! each call reading the response to its end: `cargo bench -p backstop-benches --bench
//! loopback`.
//!
//! The other benches count what a stack adds to a call that costs almost nothing; this one
//! says what that is worth next to a call that goes through sockets (both ends' hyper, the
//! syscalls, a wake-up): the stacks' difference in nanoseconds, and as a share of the bare call.

use backstop::client::retry::ReplayBody;
use backstop_benches::TowerPolicy;
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
};
use std::{convert::Infallible, hint::black_box, net::SocketAddr, time::Duration};
use tokio::runtime::Runtime;
use tower::{ServiceBuilder, ServiceExt};

/// A server answering 200 with an empty body to every request, on 127.0.0.1.
async fn server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            stream.set_nodelay(true).unwrap();
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(
                TokioIo::new(stream),
                hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
                }),
            ));
        }
    });
    addr
}

fn client<B>() -> Client<HttpConnector, B>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// The benches' request (a GET with one header, an empty body), to `addr`.
fn request(addr: SocketAddr) -> Request<String> {
    Request::get(format!("http://{addr}/x"))
        .header("x-request-id", "1")
        .body(String::new())
        .unwrap()
}

fn loopback(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = rt.block_on(server());
    let mut group = c.benchmark_group("loopback");

    let bare = client::<String>();
    bench(&mut group, &rt, "bare hyper client", addr, bare.clone());
    let tower = ServiceBuilder::new()
        .retry(TowerPolicy::new())
        .timeout(Duration::from_secs(1))
        .service(bare);
    bench(
        &mut group,
        &rt,
        "tower retry + TpsBudget + timeout",
        addr,
        tower,
    );
    let preset = ServiceBuilder::new()
        .layer(
            backstop::client::http()
                .timeout(Duration::from_secs(1))
                .attempt(backstop::client::attempt::AttemptBound::Fixed(
                    Duration::from_millis(500),
                ))
                .build()
                .unwrap(),
        )
        .service(client::<ReplayBody<String>>());
    bench(&mut group, &rt, "backstop client preset", addr, preset);
    group.finish();
}

/// Calls through `service` that succeed, reading each response to its end.
fn bench<S, B>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &Runtime,
    name: &str,
    addr: SocketAddr,
    service: S,
) where
    S: tower::Service<Request<String>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    group.bench_function(name, |b| {
        b.to_async(rt).iter(|| async {
            let response = service.clone().oneshot(request(addr)).await.unwrap();
            black_box(response.into_body().collect().await.unwrap());
        })
    });
}

criterion_group!(benches, loopback);
criterion_main!(benches);
