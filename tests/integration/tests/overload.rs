//! The overload layers over 127.0.0.1 against real servers: the client preset's throttle
//! refuses calls that then never reach the server, a full bulkhead refuses at once while the
//! server holds its permits, and `backstop::server()`'s admission answers 504 (axum) and
//! DEADLINE_EXCEEDED (tonic) without running the handler once the route's need is learned
//! from real calls. Real time, each test bounded to a few seconds.

use backstop::ReplayBody;
use backstop::client::overload::bulkhead::BulkheadLayer;
use backstop::client::overload::throttle::AdaptiveThrottle;
use backstop::deadline::Deadline;
use backstop::{BulkheadFull, ClientThrottled};
use backstop_integration::{listener, raw_say_hello};
use bytes::Bytes;
use example_proto::helloworld::{
    HelloReply, HelloRequest,
    greeter_server::{Greeter, GreeterServer},
};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};
use tokio::time::Instant;
use tonic::transport::{Server, server::TcpIncoming};
use tower::ServiceExt;

/// An axum server on a loopback port answering every request with `status` after `latency`,
/// counting the requests that reach it (`hits`) and those in its handler now (`busy`).
async fn counting_server(
    status: StatusCode,
    latency: Duration,
    hits: &Arc<AtomicU32>,
    busy: &Arc<AtomicU32>,
) -> String {
    let (listener, addr) = listener().await;
    let (hits, busy) = (hits.clone(), busy.clone());
    let app = axum::Router::new().fallback(move || {
        let (hits, busy) = (hits.clone(), busy.clone());
        async move {
            hits.fetch_add(1, Ordering::SeqCst);
            busy.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(latency).await;
            busy.fetch_sub(1, Ordering::SeqCst);
            status
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/")
}

fn transport() -> Client<hyper_util::client::legacy::connect::HttpConnector, ReplayBody<Full<Bytes>>>
{
    Client::builder(TokioExecutor::new()).build_http()
}

fn get(url: &str) -> Request<Full<Bytes>> {
    Request::get(url).body(Full::new(Bytes::new())).unwrap()
}

/// A GET whose caller gives it `ms` milliseconds.
fn get_within(url: &str, ms: u64) -> Request<Full<Bytes>> {
    let mut req = get(url);
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_millis(ms)));
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_presets_throttle_refuses_and_the_refused_calls_never_reach_the_server() {
    let (hits, busy) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    // An overloaded server: every call answered 429 (not accepted; never a breaker failure).
    let url = counting_server(StatusCode::TOO_MANY_REQUESTS, Duration::ZERO, &hits, &busy).await;
    let backend = backstop::client::http()
        .name("overloaded")
        .max_attempts(1)
        .throttle(Some(AdaptiveThrottle::builder().seed(28)))
        .build()
        .unwrap();
    let throttle = backend.throttle_layer().throttle().clone();
    let client = tower::ServiceBuilder::new()
        .layer(backend.clone())
        .service(transport());

    let started = Instant::now();
    let (mut calls, mut refused) = (0u32, 0u32);
    // 300 calls, one every 2 ms: the throttle acts once 30 are in its window (its minimum
    // rate: 1 a second over 30 s) and its cached probability is refreshed (every 100 ms).
    while calls < 300 && started.elapsed() < Duration::from_secs(3) {
        match client.clone().oneshot(get(&url)).await {
            Ok(response) => assert_eq!(response.status(), 429),
            Err(err) => {
                assert!(
                    backstop::find::<ClientThrottled>(err.as_ref()).is_some(),
                    "{err}"
                );
                refused += 1;
            }
        }
        calls += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let sent = hits.load(Ordering::SeqCst);
    println!(
        "{calls} calls in {:?}: {refused} refused, {sent} reached the server",
        started.elapsed()
    );
    assert!(refused >= calls / 3, "{refused} of {calls} refused");
    assert_eq!(u64::from(refused), throttle.rejections());
    // Every call the throttle let through reached the server once; no refused one did.
    assert_eq!(sent + refused, calls);
    assert_eq!(backend.retry_layer().stats().requests, u64::from(sent));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_bulkhead_fails_fast_while_the_server_holds_its_permits() {
    let (hits, busy) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let url = counting_server(StatusCode::OK, Duration::from_millis(400), &hits, &busy).await;
    let backend = backstop::client::http()
        .name("slow")
        .bulkhead(BulkheadLayer::builder(2))
        .build()
        .unwrap();
    let client = tower::ServiceBuilder::new()
        .layer(backend.clone())
        .service(transport());
    // One answer teaches the bulkhead that a call holds its permit about 400 ms.
    let response = client
        .clone()
        .oneshot(get_within(&url, 2_000))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let hold = backend.bulkhead_layer().hold_time();
    assert!(hold >= Duration::from_millis(400), "{hold:?}");

    // Two calls hold both permits, in the server's handler.
    let holders: Vec<_> = (0..2)
        .map(|_| tokio::spawn(client.clone().oneshot(get_within(&url, 2_000))))
        .collect();
    let waited = Instant::now();
    while busy.load(Ordering::SeqCst) < 2 {
        assert!(
            waited.elapsed() < Duration::from_secs(1),
            "the holders reach the server"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(backend.bulkhead_layer().in_flight(), 2);
    // 300 ms left, and a permit is about 400 ms away: refused now, not at the deadline.
    let asked = Instant::now();
    let err = client
        .clone()
        .oneshot(get_within(&url, 300))
        .await
        .unwrap_err();
    let took = asked.elapsed();
    let full = backstop::find::<BulkheadFull>(err.as_ref()).expect("a bulkhead refusal");
    assert_eq!(full.knob(), "max_concurrency");
    assert!(took < Duration::from_millis(50), "refused after {took:?}");
    assert_eq!(busy.load(Ordering::SeqCst), 2, "the server still held both");
    for holder in holders {
        assert_eq!(holder.await.unwrap().unwrap().status(), 200);
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        3,
        "the refused call was not sent"
    );
}

/// A plain HTTP client (no timer of its own) sending `grpc-timeout`.
async fn raw_get(url: &str, grpc_timeout: &str) -> StatusCode {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let request = Request::get(url)
        .header("grpc-timeout", grpc_timeout)
        .body(Empty::new())
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    response.into_body().collect().await.unwrap();
    status
}

/// Handler time of the admission tests' routes.
const WORK: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_under_the_server_preset_answers_504_without_running_the_handler() {
    let ran = Arc::new(AtomicU32::new(0));
    let count = ran.clone();
    let preset = backstop::server();
    let app = axum::Router::new()
        .route(
            "/work",
            axum::routing::get(move || {
                let count = count.clone();
                async move {
                    count.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(WORK).await;
                    "done"
                }
            }),
        )
        .layer(preset.clone());
    let (listener, addr) = listener().await;
    tokio::spawn(async move { axum::serve(listener, app).await });
    let url = format!("http://{addr}/work");

    // Warm: 120 real calls (the model trusts 100), 20 at a time.
    for _ in 0..6 {
        let batch: Vec<_> = (0..20)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { raw_get(&url, "5S").await })
            })
            .collect();
        for call in batch {
            assert_eq!(call.await.unwrap(), StatusCode::OK);
        }
    }
    // The need is cached per 100 ms: the next tick reads the trusted model.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let need = preset
        .admission_layer()
        .need("/work")
        .expect("trusted after 120 calls");
    assert!(need >= WORK && need < WORK * 4, "{need:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 120);

    // 20 ms left where the route needs about 50: refused on arrival, the handler not run.
    for _ in 0..5 {
        assert_eq!(raw_get(&url, "20m").await, StatusCode::GATEWAY_TIMEOUT);
    }
    assert_eq!(ran.load(Ordering::SeqCst), 120);
    // Enough time: admitted.
    assert_eq!(raw_get(&url, "2S").await, StatusCode::OK);
    assert_eq!(ran.load(Ordering::SeqCst), 121);
    println!("learned need {need:?}");
}

/// A Greeter whose handler takes [`WORK`] and counts its runs.
#[derive(Debug, Clone, Default)]
struct Counting(Arc<AtomicU32>);

#[tonic::async_trait]
impl Greeter for Counting {
    async fn say_hello(
        &self,
        request: tonic::Request<HelloRequest>,
    ) -> Result<tonic::Response<HelloReply>, tonic::Status> {
        self.0.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(WORK).await;
        Ok(tonic::Response::new(HelloReply {
            message: format!("hello {}", request.into_inner().name),
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_under_the_server_preset_answers_deadline_exceeded_without_running_the_handler() {
    let greeter = Counting::default();
    let preset = backstop::server();
    let (listener, addr) = listener().await;
    tokio::spawn(
        Server::builder()
            .layer(preset.clone())
            .add_service(GreeterServer::new(greeter.clone()))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let base = format!("http://{addr}");
    for _ in 0..6 {
        let batch: Vec<_> = (0..20)
            .map(|_| {
                let base = base.clone();
                tokio::spawn(async move { raw_say_hello(&base, "warm", Some("5S")).await })
            })
            .collect();
        for call in batch {
            assert_eq!(call.await.unwrap().code, "0");
        }
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let need = preset
        .admission_layer()
        .need("/helloworld.Greeter/SayHello")
        .expect("trusted after 120 calls");
    assert!(need >= WORK && need < WORK * 4, "{need:?}");
    assert_eq!(greeter.0.load(Ordering::SeqCst), 120);

    for _ in 0..5 {
        let status = raw_say_hello(&base, "late", Some("20m")).await;
        assert_eq!(status.code, "4", "{status:?}");
    }
    assert_eq!(
        greeter.0.load(Ordering::SeqCst),
        120,
        "the handler never ran"
    );
    assert_eq!(raw_say_hello(&base, "on time", Some("2S")).await.code, "0");
    assert_eq!(greeter.0.load(Ordering::SeqCst), 121);
}

/// The client preset's adaptive limit over real HTTP/2 (one connection, prior knowledge) to
/// a hyper server that serves 200 calls a second (2 workers × 10 ms behind a FIFO queue),
/// offered about 500 a second for 3 s with 1 s each: never told the capacity, the limit is cut
/// below its cap, the excess is refused at once (never sent, never retried), and what is sent
/// is answered in time. Real time; bounds lenient for a busy machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_learns_a_real_servers_capacity_over_http2() {
    let workers = Arc::new(tokio::sync::Semaphore::new(2));
    let hits = Arc::new(AtomicU32::new(0));
    let addr = backstop_integration::serve_hyper(
        true,
        (workers, hits.clone()),
        |_req, (workers, hits): (Arc<tokio::sync::Semaphore>, Arc<AtomicU32>)| async move {
            hits.fetch_add(1, Ordering::SeqCst);
            let worker = workers.acquire_owned().await.expect("never closed");
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(worker);
            Ok::<_, std::convert::Infallible>(http::Response::new(Empty::<Bytes>::new()))
        },
    )
    .await;
    let layer = backstop::client::http()
        .name("capacity")
        .timeout(Duration::from_secs(1))
        .throttle(None)
        .build()
        .unwrap();
    let transport = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<ReplayBody<Full<Bytes>>>();
    let client = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(transport);
    let url = format!("http://{addr}/work");
    let start = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..1_500u32 {
        tokio::time::sleep_until(start + Duration::from_millis(2) * i).await;
        let (client, url) = (client.clone(), url.clone());
        calls.spawn(async move {
            let sent = Instant::now();
            let req = Request::get(url).body(Full::new(Bytes::new())).unwrap();
            (client.oneshot(req).await, sent.elapsed())
        });
    }
    let (mut ok, mut refused) = (0u32, 0u32);
    while let Some(joined) = calls.join_next().await {
        match joined.unwrap() {
            (Ok(response), took) => {
                assert_eq!(response.status(), StatusCode::OK);
                assert!(took <= Duration::from_millis(1_200), "{took:?}");
                ok += 1;
            }
            (Err(err), _) => {
                if let Some(full) = backstop::find::<BulkheadFull>(err.as_ref()) {
                    assert_eq!(full.knob(), "adaptive_limit");
                    refused += 1;
                }
            }
        }
    }
    let limit = layer.adaptive_limit_layer().limit();
    assert!(limit < 10_000, "the limit was never cut");
    assert!(refused > 0, "nothing refused: {ok} answered");
    // Every attempt the server saw was sent by an answered or failed call: none refused
    // reached it.
    let stats = layer.retry_layer().stats();
    assert!(
        u64::from(hits.load(Ordering::SeqCst)) + u64::from(refused)
            <= stats.requests + stats.retries
    );
    assert!(ok >= 200, "{ok} answered, {refused} refused, limit {limit}");
}
