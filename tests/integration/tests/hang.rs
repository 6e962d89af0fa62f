//! A real server that stops answering, over 127.0.0.1: with nothing but the HTTP preset's
//! defaults, attempts are bounded by the latency measured while it answered, the timeouts
//! open the breaker, and callers are then answered at once.

use backstop::ReplayBody;
use backstop::client::breaker::State;
use backstop_integration::listener;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo},
};
use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};

async fn handle(
    _req: Request<Incoming>,
    hung: Arc<AtomicBool>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if hung.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    // 20 ms: a bound of about 60 ms, far above the scheduling noise of a loaded machine.
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_opens_the_default_breaker() {
    let (listener, addr) = listener().await;
    let hung = Arc::new(AtomicBool::new(false));
    let flag = hung.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let flag = flag.clone();
            let service = hyper::service::service_fn(move |req| handle(req, flag.clone()));
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let backend = backstop::client::http().build().unwrap();
    let transport = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Full<Bytes>>>();
    let client = ServiceBuilder::new()
        .layer(backend.clone())
        .service(transport);
    let url = format!("http://{addr}/");
    let request = || Request::get(&url).body(Full::new(Bytes::new())).unwrap();

    // Warm the model: 150 calls at 100 requests/s.
    for _ in 0..150 {
        let response = client
            .clone()
            .oneshot(request())
            .await
            .expect("the server answers");
        assert_eq!(response.status(), 200);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let warm = backend.latency();
    assert!(warm.count >= 100, "{warm:?}");
    let bound = backend.attempt_layer().current_bound().unwrap();
    // 20 ms answers: p99 × 3 is far below the default floor, which applies: p99 × 20, within
    // 250 ms to 1 s (about 500 ms on loopback, where the fixed floor was 1 s).
    let p99 = warm.p99.expect("trusted");
    let floor = (p99 * 20).clamp(Duration::from_millis(250), Duration::from_secs(1));
    assert!(
        bound.abs_diff(floor) <= floor / 20,
        "{bound:?} for {warm:?}"
    );

    // The server stops answering; requests go on at 100/s, each bounded at 3 s (bounded loop:
    // 4 s of requests at most).
    hung.store(true, Ordering::SeqCst);
    let hung_at = Instant::now();
    let mut tasks = Vec::new();
    let mut opened_after = None;
    for _ in 0..400 {
        let c = client.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let request = Request::get(&url).body(Full::new(Bytes::new())).unwrap();
            let started = Instant::now();
            let result = tokio::time::timeout(Duration::from_secs(3), c.oneshot(request)).await;
            (
                started,
                started.elapsed(),
                !matches!(result, Ok(Ok(ref r)) if r.status() == 200),
            )
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
        if backend.breaker_layer().snapshot().state == State::Open {
            opened_after = Some(hung_at.elapsed());
            break;
        }
    }
    let opened_after = opened_after.expect("the breaker opened within 4 s");
    // From now on (within the open time, 2.5 s at least) callers are answered at once,
    // without reaching the server.
    let started = Instant::now();
    let err = client.clone().oneshot(request()).await.unwrap_err();
    assert!(
        backstop::find::<backstop::BreakerOpen>(&*err).is_some(),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_millis(50));
    assert!(
        opened_after <= Duration::from_secs(2),
        "opened {opened_after:?} after the hang"
    );
    for t in tasks {
        let (_, took, failed) = t.await.unwrap();
        assert!(failed, "no request to a hung server succeeds");
        // Each request gave up by the test's 3 s limit at the latest (three attempts of at
        // most 1 s).
        assert!(
            took <= Duration::from_secs(3) + Duration::from_millis(50),
            "{took:?}"
        );
    }
    println!("breaker open {opened_after:?} after the server hung (bound before: {bound:?})");
}
