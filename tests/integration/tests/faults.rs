//! The reliability campaign: the full client preset against a server that misbehaves in every
//! way it exists for, over 127.0.0.1. For each fault: the call ends by its deadline (never
//! hangs), the outcome is classified as docs/ARCHITECTURE.md says, a non-idempotent request is never
//! executed twice, replayed bodies are byte-identical, and no breaker permit leaks.

use backstop::ReplayBody;
use backstop::client::breaker::State;
use backstop::client::retry::{Budget, GiveUp, RetryConfig, backoff};
use backstop::client::{ClientBuilder, ClientLayer};
use backstop::{GrpcClassifier, HttpClassifier};
use backstop_integration::listener;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::Instant,
};
use tower::{Service, ServiceBuilder, ServiceExt};

const DEADLINE: Duration = Duration::from_millis(400);
/// Far above the deadline: a call that takes this long has hung.
const NEVER: Duration = Duration::from_secs(3);

type Transport = Client<HttpConnector, ReplayBody<Full<Bytes>>>;

fn transport(http2: bool) -> Transport {
    Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build_http()
}

/// A client preset with a 400 ms deadline and a fast deterministic backoff.
fn tuned<C: Clone>(preset: ClientBuilder<C>, retry: RetryConfig<C>) -> ClientBuilder<C> {
    preset.timeout(DEADLINE).retry(
        retry
            .backoff(backoff::constant(Duration::from_millis(5)))
            .seed(1),
    )
}

/// The HTTP client preset, tuned.
fn http_preset() -> ClientLayer<HttpClassifier> {
    http_builder().build().unwrap()
}

/// [`http_preset`] before it is built, to tune further.
fn http_builder() -> ClientBuilder<HttpClassifier> {
    tuned(backstop::client::http(), RetryConfig::http())
}

fn request(method: Method, url: &str, body: Vec<u8>) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(url)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// What one call through the preset gave: the status (or the error), the body (or its
/// error), and how long it all took.
#[derive(Debug)]
struct Outcome {
    status: Result<StatusCode, String>,
    body: Result<Bytes, String>,
    took: Duration,
}

async fn call(
    layer: &ClientLayer<HttpClassifier>,
    http2: bool,
    req: Request<Full<Bytes>>,
) -> Outcome {
    let started = Instant::now();
    let mut client = ServiceBuilder::new()
        .layer(layer.clone())
        .service(transport(http2));
    let result = client.ready().await.unwrap().call(req).await;
    let (status, body) = match result {
        Ok(response) => {
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .map_err(|e| e.to_string());
            (Ok(status), body)
        }
        Err(err) => (Err(err.to_string()), Err("no response".to_owned())),
    };
    let took = started.elapsed();
    assert!(took < NEVER, "the call hung: {took:?}");
    Outcome { status, body, took }
}

/// Accepts connections and hands each to `fault`, counting them; returns the URL.
async fn raw_server<F, Fut>(hits: Arc<AtomicU64>, fault: F) -> String
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (listener, addr) = listener().await;
    let fault = Arc::new(fault);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            hits.fetch_add(1, Ordering::SeqCst);
            let fault = fault.clone();
            tokio::spawn(async move {
                // Read the request head before misbehaving.
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read_exact(&mut byte).await.is_err() {
                        return;
                    }
                    head.push(byte[0]);
                }
                fault(stream).await;
            });
        }
    });
    format!("http://{addr}/")
}

/// Closes with a TCP reset (SO_LINGER 0).
// tokio deprecates `set_linger` because a non-zero linger blocks the thread on drop; a zero
// linger never blocks: the kernel sends RST at once.
#[allow(deprecated)]
fn reset(stream: TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

#[tokio::test]
async fn a_reset_before_the_response_is_retried_for_get_never_for_post() {
    let hits = Arc::new(AtomicU64::new(0));
    let url = raw_server(hits.clone(), |s| async move { reset(s) }).await;
    let layer = http_preset();

    let get = call(&layer, false, request(Method::GET, &url, vec![])).await;
    assert!(get.status.is_err(), "{get:?}");
    assert_eq!(hits.swap(0, Ordering::SeqCst), 3, "GET: three attempts");

    let post = call(
        &layer,
        false,
        request(Method::POST, &url, b"charge".to_vec()),
    )
    .await;
    assert!(post.status.is_err(), "{post:?}");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "POST: the server may have acted on it"
    );
    assert_eq!(layer.breaker_layer().snapshot().failures, 4);
}

#[tokio::test]
async fn a_body_cut_mid_way_fails_the_read_not_the_call() {
    let hits = Arc::new(AtomicU64::new(0));
    let url = raw_server(hits.clone(), |mut s| async move {
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
            .await;
        let _ = s.flush().await;
        reset(s);
    })
    .await;
    let outcome = call(&http_preset(), false, request(Method::GET, &url, vec![])).await;
    assert_eq!(outcome.status, Ok(StatusCode::OK));
    assert!(outcome.body.is_err(), "{outcome:?}");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "committed once headers arrived"
    );
}

#[tokio::test]
async fn a_body_that_hangs_or_crawls_ends_at_the_deadline() {
    for crawl in [false, true] {
        let hits = Arc::new(AtomicU64::new(0));
        let url = raw_server(hits.clone(), move |mut s| async move {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n")
                .await;
            for _ in 0..50 {
                if crawl {
                    let _ = s.write_all(b"x").await;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        let outcome = call(&http_preset(), false, request(Method::GET, &url, vec![])).await;
        assert_eq!(outcome.status, Ok(StatusCode::OK));
        let err = outcome.body.unwrap_err();
        assert!(err.contains("deadline exceeded"), "{err}");
        assert!(outcome.took >= DEADLINE, "{:?}", outcome.took);
    }
}

/// An axum server answering every request with `response()`, counting requests and keeping a
/// checksum of each body it read.
async fn answering(
    hits: Arc<AtomicU64>,
    sums: Arc<Mutex<Vec<(usize, u64)>>>,
    response: fn() -> Response<axum::body::Body>,
) -> String {
    let (listener, addr) = listener().await;
    let app = axum::Router::new().fallback(move |body: Bytes| {
        hits.fetch_add(1, Ordering::SeqCst);
        let sum = body.iter().enumerate().fold(0u64, |acc, (i, &b)| {
            acc.wrapping_mul(31).wrapping_add(u64::from(b) ^ i as u64)
        });
        sums.lock().unwrap().push((body.len(), sum));
        async move { response() }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/")
}

fn unavailable(retry_after: Option<&'static str>) -> Response<axum::body::Body> {
    let mut response = Response::builder().status(503);
    if let Some(value) = retry_after {
        response = response.header("retry-after", value);
    }
    response.body(axum::body::Body::empty()).unwrap()
}

#[tokio::test]
async fn retry_after_is_honoured_but_never_past_the_deadline() {
    type Case = (fn() -> Response<axum::body::Body>, u64, Option<GiveUp>);
    let cases: [Case; 5] = [
        // Retry at once: all three attempts, within the deadline.
        (|| unavailable(Some("0")), 3, Some(GiveUp::Attempts)),
        // One second, past a 400 ms deadline: give up now, not sleep into the deadline.
        (|| unavailable(Some("1")), 1, Some(GiveUp::Deadline)),
        // Absurd: over the 30 s the layer waits for, so no retry (never one sooner).
        (|| unavailable(Some("99999999999")), 1, Some(GiveUp::Hint)),
        // An HTTP date far in the future: the same.
        (
            || unavailable(Some("Fri, 31 Dec 9999 23:59:59 GMT")),
            1,
            Some(GiveUp::Hint),
        ),
        // Malformed: ignored, the backoff decides.
        (|| unavailable(Some("soon")), 3, Some(GiveUp::Attempts)),
    ];
    for (response, want_hits, reason) in cases {
        let hits = Arc::new(AtomicU64::new(0));
        let url = answering(hits.clone(), Arc::default(), response).await;
        let layer = http_preset();
        let outcome = call(&layer, false, request(Method::GET, &url, vec![])).await;
        assert_eq!(outcome.status, Ok(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(
            hits.load(Ordering::SeqCst),
            want_hits,
            "{:?}",
            response().headers()
        );
        let stats = layer.retry_layer().stats();
        if let Some(reason) = reason {
            assert_eq!(stats.gave_up(reason), 1, "{stats:?}");
        }
        assert!(
            outcome.took < DEADLINE + Duration::from_millis(200),
            "{outcome:?}"
        );
    }
}

#[tokio::test]
async fn post_runs_once_and_replayed_bodies_are_byte_identical_around_the_cap() {
    let hits = Arc::new(AtomicU64::new(0));
    let sums = Arc::new(Mutex::new(Vec::new()));
    let url = answering(hits.clone(), sums.clone(), || unavailable(None)).await;
    let layer = http_preset();

    let post = call(&layer, false, request(Method::POST, &url, vec![7; 1000])).await;
    assert_eq!(post.status, Ok(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(hits.swap(0, Ordering::SeqCst), 1);

    let cap = 64 * 1024;
    let mut rng = fastrand::Rng::with_seed(42);
    let sizes = [
        0,
        1,
        cap - 1,
        cap,
        cap + 1,
        cap - 1 - rng.usize(..512),
        cap + 1 + rng.usize(..512),
    ];
    for size in sizes {
        sums.lock().unwrap().clear();
        let payload: Vec<u8> = (0..size).map(|_| rng.u8(..)).collect();
        let put = call(&http_preset(), false, request(Method::PUT, &url, payload)).await;
        assert_eq!(put.status, Ok(StatusCode::SERVICE_UNAVAILABLE));
        let seen = sums.lock().unwrap().clone();
        let want = if size <= cap { 3 } else { 1 };
        assert_eq!(seen.len(), want, "size {size}: attempts");
        assert!(seen.iter().all(|s| s == &seen[0]), "size {size}: {seen:?}");
        assert_eq!(seen[0].0, size);
    }
}

/// An HTTP/2 server (the h2 crate, to send what hyper's server never would) that refuses every
/// stream with REFUSED_STREAM, counting them.
async fn refusing_server(hits: Arc<AtomicU64>) -> String {
    let (listener, addr) = listener().await;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let hits = hits.clone();
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(stream).await else {
                    return;
                };
                while let Some(Ok((_request, mut respond))) = connection.accept().await {
                    hits.fetch_add(1, Ordering::SeqCst);
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                }
            });
        }
    });
    format!("http://{addr}/")
}

#[tokio::test]
async fn a_refused_stream_is_retried_even_for_post() {
    let hits = Arc::new(AtomicU64::new(0));
    let url = refusing_server(hits.clone()).await;
    let layer = http_preset();
    let outcome = call(&layer, true, request(Method::POST, &url, b"order".to_vec())).await;
    assert!(outcome.status.is_err(), "{outcome:?}");
    // REFUSED_STREAM proves the server did not process it (RFC 9113 §8.7): safe to resend.
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    assert_eq!(layer.retry_layer().stats().gave_up(GiveUp::Attempts), 1);
}

/// An HTTP/2 server (the h2 crate) that sends response headers and 10 bytes of a 100-byte body,
/// then resets the stream (`cut`) or holds it open without another byte.
async fn h2_body_fault(cut: bool) -> String {
    let (listener, addr) = listener().await;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(stream).await else {
                    return;
                };
                while let Some(Ok((_request, mut respond))) = connection.accept().await {
                    tokio::spawn(async move {
                        let response = Response::builder()
                            .header("content-length", "100")
                            .body(())
                            .unwrap();
                        let Ok(mut body) = respond.send_response(response, false) else {
                            return;
                        };
                        let _ = body.send_data(Bytes::from_static(b"0123456789"), false);
                        if cut {
                            body.send_reset(h2::Reason::INTERNAL_ERROR);
                        } else {
                            tokio::time::sleep(NEVER).await;
                            drop(body);
                        }
                    });
                }
            });
        }
    });
    format!("http://{addr}/")
}

#[tokio::test]
async fn over_http2_a_cut_body_fails_the_read_and_a_held_one_ends_at_the_deadline() {
    for cut in [true, false] {
        let outcome = call(
            &http_preset(),
            true,
            request(Method::GET, &h2_body_fault(cut).await, vec![]),
        )
        .await;
        let took = outcome.took;
        if cut {
            // The reset may reach the client before or after it has read the headers: either
            // the call fails (a GET, retried, every attempt reset) or its body read does. It
            // never hangs, and never looks like a whole body.
            match outcome.status {
                Ok(status) => {
                    assert_eq!(status, StatusCode::OK);
                    assert!(outcome.body.is_err(), "{:?}", outcome.body);
                }
                Err(err) => assert!(!err.contains("deadline"), "{err}"),
            }
            assert!(took < DEADLINE, "{took:?}");
        } else {
            assert_eq!(outcome.status, Ok(StatusCode::OK));
            let err = outcome.body.unwrap_err();
            assert!(err.contains("deadline exceeded"), "{err}");
            assert!(took >= DEADLINE, "{took:?}");
        }
    }
}

/// An HTTP/2 server (the h2 crate) that answers the first request of each connection with
/// 200 and then goes away gracefully (GOAWAY naming that request as the last it processed),
/// counting the requests it processed.
async fn going_away(processed: Arc<AtomicU64>) -> String {
    let (listener, addr) = listener().await;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let processed = processed.clone();
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(stream).await else {
                    return;
                };
                // Every stream accepted is processed; after the first, the server goes away,
                // and h2 refuses the streams past the last one it accepted.
                let mut first = true;
                while let Some(Ok((_request, mut respond))) = connection.accept().await {
                    processed.fetch_add(1, Ordering::SeqCst);
                    let _ = respond.send_response(Response::new(()), true);
                    if first {
                        first = false;
                        connection.graceful_shutdown();
                    }
                }
            });
        }
    });
    format!("http://{addr}/")
}

#[tokio::test]
async fn posts_across_a_graceful_goaway_are_processed_exactly_once() {
    let processed = Arc::new(AtomicU64::new(0));
    let url = going_away(processed.clone()).await;
    let layer = http_preset();
    let client = ServiceBuilder::new()
        .layer(layer.clone())
        .service(transport(true));
    // POSTs sent together meet a connection that is going away: a stream the server accepted
    // before its last GOAWAY is processed there; one past it would fail with GOAWAY(NO_ERROR)
    // and be retried on a new connection (the server proved it never processed it), and the
    // next round opens a new connection. Either way: every POST succeeds, each is processed
    // exactly once. (h2's graceful shutdown accepts every stream already in flight, so this run
    // does not reach the GOAWAY retry itself; REFUSED_STREAM above is the retry on proof.)
    let mut sent = 0;
    for round in 1..=5 {
        let calls = (0..4).map(|i| {
            let post = request(
                Method::POST,
                &url,
                format!("order {round}.{i}").into_bytes(),
            );
            client.clone().oneshot(post)
        });
        for response in futures_util::future::join_all(calls).await {
            assert_eq!(response.unwrap().status(), StatusCode::OK, "round {round}");
        }
        sent += 4;
        assert_eq!(
            processed.load(Ordering::SeqCst),
            sent,
            "round {round}: once each"
        );
    }
    let snapshot = layer.breaker_layer().snapshot();
    assert_eq!(
        (snapshot.state, snapshot.probes_in_flight),
        (State::Closed, 0)
    );
}

/// A body of fixed frames.
struct Frames(std::collections::VecDeque<http_body::Frame<Bytes>>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// A gRPC server (hyper, HTTP/2) answering UNAVAILABLE: trailers-only, or in the trailers
/// after a message.
async fn grpc_unavailable(hits: Arc<AtomicU64>, in_trailers: bool) -> String {
    let (listener, addr) = listener().await;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let hits = hits.clone();
            let service =
                hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                    hits.fetch_add(1, Ordering::SeqCst);
                    let mut response =
                        Response::builder().header("content-type", "application/grpc");
                    let mut frames = std::collections::VecDeque::new();
                    if in_trailers {
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", "14".parse().unwrap());
                        frames.push_back(http_body::Frame::data(Bytes::from_static(b"\0\0\0\0\0")));
                        frames.push_back(http_body::Frame::trailers(trailers));
                    } else {
                        response = response.header("grpc-status", "14");
                    }
                    let response = response.body(Frames(frames)).unwrap();
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{addr}/pkg.Svc/Call")
}

/// The gRPC client preset, tuned.
fn grpc_preset() -> ClientLayer<GrpcClassifier> {
    tuned(backstop::client::grpc(), RetryConfig::grpc())
        .build()
        .unwrap()
}

#[tokio::test]
async fn grpc_unavailable_is_retried_when_trailers_only_and_counted_from_trailers() {
    for in_trailers in [false, true] {
        let hits = Arc::new(AtomicU64::new(0));
        let url = grpc_unavailable(hits.clone(), in_trailers).await;
        let layer = grpc_preset();
        let client = ServiceBuilder::new()
            .layer(layer.clone())
            .service(transport(true));
        let request = Request::post(&url)
            .header("content-type", "application/grpc")
            .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
            .unwrap();
        let started = Instant::now();
        let response = client.oneshot(request).await.unwrap();
        let breaker = layer.breaker_layer();
        if in_trailers {
            // Committed once headers without a status arrived: never retried, and the
            // breaker waits for the trailers to count it.
            assert_eq!(hits.load(Ordering::SeqCst), 1);
            assert_eq!(breaker.snapshot().calls, 0);
            let collected = response.into_body().collect().await.unwrap();
            assert_eq!(collected.trailers().unwrap()["grpc-status"], "14");
            assert_eq!(breaker.snapshot().failures, 1);
        } else {
            assert_eq!(
                hits.load(Ordering::SeqCst),
                3,
                "UNAVAILABLE is always retryable"
            );
            assert_eq!(response.headers()["grpc-status"], "14");
            assert_eq!(breaker.snapshot().failures, 3);
        }
        assert!(started.elapsed() < NEVER);
        let snapshot = breaker.snapshot();
        assert_eq!(
            (snapshot.state, snapshot.probes_in_flight),
            (State::Closed, 0)
        );
    }
}

#[tokio::test]
async fn no_permit_leaks_after_an_outage_and_a_recovery() {
    // A server that is down for the first 25 requests, then up.
    let hits = Arc::new(AtomicU64::new(0));
    let counter = hits.clone();
    let (listener, addr) = listener().await;
    let app = axum::Router::new().fallback(move || {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if n < 25 {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            }
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    let url = format!("http://{addr}/");
    let budget = Arc::new(backstop::client::retry::RatioBudget::new());
    let layer = http_builder()
        .breaker(
            backstop::client::http_breaker()
                .open_duration(Duration::from_millis(50), Duration::from_millis(50))
                .jitter(false),
        )
        .retry(
            RetryConfig::http()
                .backoff(backoff::constant(Duration::from_millis(5)))
                .budget(budget.clone()),
        )
        .build()
        .unwrap();
    let (mut refused, mut succeeded) = (0, 0);
    for _ in 0..40 {
        let outcome = call(&layer, false, request(Method::GET, &url, vec![])).await;
        if outcome.status == Ok(StatusCode::OK) {
            succeeded += 1;
        }
        if outcome.status.is_err() {
            refused += 1;
            // Jump the breaker's clock (tokio's) over the open time instead of sleeping.
            tokio::time::pause();
            tokio::time::advance(Duration::from_millis(60)).await;
            tokio::time::resume();
        }
    }
    assert!(refused > 0, "the breaker opened");
    let snapshot = layer.breaker_layer().snapshot();
    assert_eq!(snapshot.state, State::Closed, "{snapshot:?}");
    assert_eq!(snapshot.probes_in_flight, 0);
    assert!(
        hits.load(Ordering::SeqCst) < 25 + 40,
        "refused calls never reached it"
    );
    // The budget holds what was deposited and withdrawn, all within its 10 s: 0.1 per
    // success, minus one per retry sent, plus the reserve, which is a rate (10 a second) — so
    // at most the window's (10 a second × 10 s), and at least this second's reserve less every
    // retry (a withdrawal never given back would take the balance below that).
    let retries = layer.retry_layer().stats().retries as f64;
    let earned = 0.1 * f64::from(succeeded);
    let (window, floor) = (100.0 + earned - retries, (10.0 - retries).max(0.0));
    let balance = budget.balance();
    assert!(
        balance <= window + 1e-9 && balance >= floor - 1e-9,
        "{balance} not within [{floor}, {window}]"
    );
}

/// On the wire, over HTTP/1.1 and HTTP/2: every attempt of the preset carries exactly one
/// `grpc-timeout` (the deadline layer leaves it to the attempt bound, which writes it once),
/// within the attempt's share of the deadline and shrinking from attempt to attempt, but for the
/// last, which is told all that is left.
#[tokio::test]
async fn every_attempt_on_the_wire_carries_one_grpc_timeout() {
    type Seen = Arc<Mutex<Vec<Vec<String>>>>;
    for http2 in [false, true] {
        let seen = Seen::default();
        let addr = backstop_integration::serve_hyper(
            http2,
            seen.clone(),
            |req: Request<hyper::body::Incoming>, seen: Seen| async move {
                let values = req
                    .headers()
                    .get_all("grpc-timeout")
                    .iter()
                    .map(|v| v.to_str().unwrap().to_owned())
                    .collect::<Vec<_>>();
                let mut seen = seen.lock().unwrap();
                seen.push(values);
                let status = if seen.len() <= 2 { 503 } else { 200 };
                Ok(Response::builder()
                    .status(status)
                    .body(Full::new(Bytes::new()))
                    .unwrap())
            },
        )
        .await;
        let url = format!("http://{addr}/");
        let outcome = call(
            &http_preset(),
            http2,
            request(Method::GET, &url, Vec::new()),
        )
        .await;
        assert_eq!(
            outcome.status,
            Ok(StatusCode::OK),
            "http2 {http2}: {outcome:?}"
        );
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 3, "http2 {http2}: {seen:?}");
        let told: Vec<Duration> = seen
            .iter()
            .map(|values| {
                assert_eq!(values.len(), 1, "http2 {http2}: {seen:?}");
                backstop::wire::grpc_timeout::decode(values[0].as_bytes()).unwrap()
            })
            .collect();
        // The cold measured bound: at most 80 % of what is left of the 400 ms.
        assert!(
            told[0] <= DEADLINE * 4 / 5 && told[0] > DEADLINE / 2,
            "{told:?}"
        );
        assert!(told[1] <= told[0], "{told:?}");
        // The last attempt (no retry can follow it) is told all that is left, not a share.
        assert!(told[2] <= DEADLINE && told[2] > told[1], "{told:?}");
    }
}
