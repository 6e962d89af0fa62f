//! The deadline across the stack from the caller's side (a server's grpc-timeout → the handler →
//! its client call, awaited, spawned, raced, in a JoinSet or FuturesUnordered, under a
//! ConcurrencyLimit), retries within it, and POSTs that are never sent twice.

use backstop::client::retry::{ReplayBody, RetryConfig, backoff};
use backstop::{BoxError, is_deadline_exceeded};
use http::{Request, Response};
use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

const MS: Duration = Duration::from_millis(1);

type Log = Arc<Mutex<Vec<(Duration, Option<String>, String)>>>;

/// A dependency that logs (when since `t0`, grpc-timeout, method) and then behaves as the
/// path says: `/hang` never answers, `/fail` answers 503 after 300 ms, `/ra` answers 503 with
/// `Retry-After: 5` after 10 ms, `/pb` a gRPC UNAVAILABLE with a huge pushback, else 200
/// after 5 ms.
fn dep(
    t0: Instant,
    log: Log,
) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    service_fn(move |req: Request<ReplayBody<String>>| {
        let told = req
            .headers()
            .get("grpc-timeout")
            .map(|v| v.to_str().unwrap().to_owned());
        log.lock()
            .unwrap()
            .push((t0.elapsed(), told, req.method().to_string()));
        let path = req.uri().path().to_owned();
        async move {
            match path.as_str() {
                "/hang" => std::future::pending::<()>().await,
                "/fail" => {
                    tokio::time::sleep(300 * MS).await;
                    return Ok(Response::builder().status(503).body(String::new()).unwrap());
                }
                "/ra" => {
                    tokio::time::sleep(10 * MS).await;
                    return Ok(Response::builder()
                        .status(503)
                        .header("retry-after", "5")
                        .body(String::new())
                        .unwrap());
                }
                _ => tokio::time::sleep(5 * MS).await,
            }
            Ok(Response::new(String::new()))
        }
    })
}

fn preset() -> backstop::ClientLayer<backstop::HttpClassifier> {
    backstop::client::http().throttle(None).build().unwrap()
}

/// How the handler runs its call.
#[derive(Debug, Clone, Copy)]
enum How {
    Await,
    CallThenSpawn,
    PollThenSpawn,
    Select,
    JoinSet,
    FuturesUnordered,
    UnderConcurrencyLimit,
}

/// server() with grpc-timeout 1S; the handler calls a hanging dependency through the client
/// preset, run as `how` says. The server answers 504 by its deadline; the dependency was told
/// no more than the handler had; and the call (wherever it went) ends by that deadline.
async fn handler_call(how: How) {
    let t0 = Instant::now();
    let log: Log = Arc::default();
    let client = preset().layer(dep(t0, log.clone()));
    let limited = tower::limit::ConcurrencyLimit::new(client.clone(), 2);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<(Duration, bool)>();
    let done_tx = Arc::new(Mutex::new(Some(done_tx)));
    let handler = service_fn(move |_req: Request<String>| {
        let mut client = client.clone();
        let mut limited = limited.clone();
        let done_tx = done_tx.clone();
        async move {
            let req = Request::get("/hang").body(String::new()).unwrap();
            let report = move |r: Result<_, BoxError>| {
                let expired = r
                    .as_ref()
                    .err()
                    .is_some_and(|e| is_deadline_exceeded(e.as_ref()));
                if let Some(tx) = done_tx.lock().unwrap().take() {
                    let _ = tx.send((t0.elapsed(), expired));
                }
            };
            match how {
                How::Await => {
                    let r = client.oneshot(req).await;
                    report(r.map(|_| ()));
                }
                How::CallThenSpawn => {
                    let call = client.ready().await.unwrap().call(req);
                    let h = tokio::spawn(async move { report(call.await.map(|_| ())) });
                    let _ = h.await;
                }
                How::PollThenSpawn => {
                    let mut call = Box::pin(client.ready().await.unwrap().call(req));
                    let _ = std::future::poll_fn(|cx| {
                        std::task::Poll::Ready(call.as_mut().poll(cx).is_pending())
                    })
                    .await;
                    tokio::spawn(async move { report(call.await.map(|_| ())) });
                    std::future::pending::<()>().await;
                }
                How::Select => {
                    let call = client.ready().await.unwrap().call(req);
                    tokio::select! {
                        r = call => report(r.map(|_| ())),
                        _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                    }
                }
                How::JoinSet => {
                    let call = client.ready().await.unwrap().call(req);
                    let mut set = tokio::task::JoinSet::new();
                    set.spawn(async move { report(call.await.map(|_| ())) });
                    let _ = set.join_next().await;
                }
                How::FuturesUnordered => {
                    use futures_util::StreamExt;
                    let mut set = futures_util::stream::FuturesUnordered::new();
                    set.push(client.ready().await.unwrap().call(req));
                    let r = set.next().await.unwrap();
                    report(r.map(|_| ()));
                }
                How::UnderConcurrencyLimit => {
                    let call = limited.ready().await.unwrap().call(req);
                    let h = tokio::spawn(async move { report(call.await.map(|_| ())) });
                    let _ = h.await;
                }
            }
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let server = ServiceBuilder::new()
        .layer(backstop::server())
        .service(handler);
    let request = Request::get("/")
        .header("grpc-timeout", "1S")
        .body(String::new())
        .unwrap();
    let response = server.oneshot(request).await.unwrap();
    let answered = t0.elapsed();
    // The handler's own answer (it answered when its call was cut) or the 504.
    assert!([200, 504].contains(&response.status().as_u16()), "{how:?}");
    assert!(
        answered <= Duration::from_secs(1),
        "{how:?}: answered at {answered:?}"
    );
    let (ended, expired) = tokio::time::timeout(Duration::from_secs(60), done_rx)
        .await
        .map(|r| r.unwrap_or((Duration::ZERO, true)))
        .unwrap_or((Duration::from_secs(60), false));
    assert!(
        ended <= Duration::from_secs(1),
        "{how:?}: the call ran on until {ended:?}, past its handler's deadline"
    );
    let _ = expired;
    for (at, told, _) in log.lock().unwrap().iter() {
        let told = told.as_deref().expect("every attempt says its time");
        assert!(
            *at + Duration::from_millis(backstop_test_support::told_ms(told))
                <= Duration::from_secs(1),
            "{how:?}: an attempt at {at:?} was told {told}: past the handler's deadline"
        );
    }
    assert!(
        !log.lock().unwrap().is_empty(),
        "{how:?}: the call was sent"
    );
}

#[tokio::test(start_paused = true)]
async fn a_handlers_call_is_bounded_by_its_deadline_however_it_runs() {
    for how in [
        How::Await,
        How::CallThenSpawn,
        How::PollThenSpawn,
        How::Select,
        How::JoinSet,
        How::FuturesUnordered,
        How::UnderConcurrencyLimit,
    ] {
        handler_call(how).await;
    }
}

/// Retries never past the deadline: with `.timeout(1s)` and a dependency failing in 300 ms,
/// every attempt goes out before the deadline, tells no more than what is left, and the call
/// returns by the deadline.
#[tokio::test(start_paused = true)]
async fn retries_never_run_past_the_deadline() {
    let t0 = Instant::now();
    let log: Log = Arc::default();
    let client = backstop::client::http()
        .throttle(None)
        .timeout(Duration::from_secs(1))
        .retry(
            RetryConfig::http()
                .max_attempts(10)
                .backoff(backoff::constant(10 * MS))
                .no_budget(),
        )
        .build()
        .unwrap()
        .layer(dep(t0, log.clone()));
    let r = client
        .oneshot(Request::get("/fail").body(String::new()).unwrap())
        .await;
    let ended = t0.elapsed();
    assert!(ended <= Duration::from_secs(1), "returned at {ended:?}");
    let log = log.lock().unwrap();
    assert!(log.len() >= 2, "retried: {log:?}");
    for (at, told, _) in log.iter() {
        let told = told.as_deref().unwrap();
        assert!(*at < Duration::from_secs(1));
        assert!(
            *at + Duration::from_millis(backstop_test_support::told_ms(told))
                <= Duration::from_secs(1),
            "attempt at {at:?} told {told}"
        );
    }
    drop(r);
}

/// A `Retry-After` longer than what is left: the failure is returned at once (RFC 9110's
/// Retry-After is a minimum; the retry cannot fit before the deadline).
#[tokio::test(start_paused = true)]
async fn a_retry_after_past_the_deadline_returns_at_once() {
    let t0 = Instant::now();
    let log: Log = Arc::default();
    let client = backstop::client::http()
        .throttle(None)
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap()
        .layer(dep(t0, log.clone()));
    let r = client
        .oneshot(Request::get("/ra").body(String::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(t0.elapsed() < 50 * MS, "waited {:?}", t0.elapsed());
    assert_eq!(log.lock().unwrap().len(), 1);
}

/// A POST without a key is sent once: after a 503, after an attempt timeout, after a hang cut
/// by the attempt bound; with hedging on and a trusted model, a slow POST is not hedged.
#[tokio::test(start_paused = true)]
async fn a_post_without_a_key_is_sent_once() {
    let t0 = Instant::now();
    let log: Log = Arc::default();
    let client = backstop::client::http()
        .throttle(None)
        .timeout(Duration::from_secs(5))
        .attempt(backstop::client::attempt::AttemptBound::Fixed(
            Duration::from_millis(200),
        ))
        .retry(
            RetryConfig::http()
                .max_attempts(5)
                .backoff(backoff::constant(MS))
                .no_budget(),
        )
        .hedging(0.95, 3)
        .build()
        .unwrap()
        .layer(dep(t0, log.clone()));
    // Train the model so hedging would fire.
    for _ in 0..150 {
        client
            .clone()
            .oneshot(Request::get("/ok").body(String::new()).unwrap())
            .await
            .unwrap();
    }
    log.lock().unwrap().clear();
    for path in ["/fail", "/hang", "/ra"] {
        let _ = client
            .clone()
            .oneshot(Request::post(path).body("pay".to_owned()).unwrap())
            .await;
        let posts = log.lock().unwrap().iter().filter(|e| e.2 == "POST").count();
        assert_eq!(posts, 1, "POST {path} sent {posts} times");
        log.lock().unwrap().clear();
    }
    // PATCH too (not idempotent).
    let _ = client
        .clone()
        .oneshot(Request::patch("/fail").body("x".to_owned()).unwrap())
        .await;
    assert_eq!(log.lock().unwrap().len(), 1, "PATCH retried");
    log.lock().unwrap().clear();
    // A GET hedges and retries (control).
    let _ = client
        .clone()
        .oneshot(Request::get("/hang").body(String::new()).unwrap())
        .await;
    assert!(
        log.lock().unwrap().len() > 1,
        "GET not retried: the control failed"
    );
}

/// A gRPC request whose handler outlives its deadline is answered DEADLINE_EXCEEDED whole:
/// trailers-only (grpc-status in the headers, HTTP 200), an empty body.
#[tokio::test(start_paused = true)]
async fn a_grpc_handler_cut_by_its_deadline_gets_a_whole_deadline_exceeded() {
    use http_body_util::BodyExt;
    let t0 = Instant::now();
    let log: Log = Arc::default();
    let client = backstop::client::grpc()
        .throttle(None)
        .build()
        .unwrap()
        .layer(dep(t0, log.clone()));
    let server = ServiceBuilder::new()
        .layer(backstop::server())
        .service(service_fn(move |_req: Request<String>| {
            let client = client.clone();
            async move {
                let r = client
                    .oneshot(backstop_test_support::grpc_call("").map(|b| b))
                    .await;
                // Whatever the client said, answer slowly.
                tokio::time::sleep(Duration::from_secs(3)).await;
                let _ = r;
                Ok::<_, Infallible>(
                    Response::builder()
                        .header("content-type", "application/grpc")
                        .body("partial".to_owned())
                        .unwrap(),
                )
            }
        }));
    let mut req = backstop_test_support::grpc_call("");
    req.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("500m"));
    let r = server.oneshot(req).await.unwrap();
    assert!(t0.elapsed() <= 500 * MS);
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["grpc-status"], "4");
    let body = r.into_body().collect().await.unwrap();
    assert!(
        body.trailers()
            .is_none_or(|t| t.get("grpc-status").is_none())
    );
    assert!(body.to_bytes().is_empty());
}

/// A client request forwarded with the caller's own long grpc-timeout header inside a
/// handler with a short deadline: the earliest wins.
#[tokio::test(start_paused = true)]
async fn a_longer_header_on_the_call_does_not_extend_the_handlers_deadline() {
    let t0 = Instant::now();
    let log: Log = Arc::default();
    let client = preset().layer(dep(t0, log.clone()));
    let server = ServiceBuilder::new()
        .layer(backstop::server())
        .service(service_fn(move |req: Request<String>| {
            let client = client.clone();
            async move {
                // Forward the inbound request as is, then one with a longer header of its own.
                let _ = client.clone().oneshot(req.map(|_| String::new())).await;
                let long = Request::get("/ok")
                    .header("grpc-timeout", "99S")
                    .body(String::new())
                    .unwrap();
                let _ = client.oneshot(long).await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        }));
    let r = server
        .oneshot(
            Request::get("/ok")
                .header("grpc-timeout", "1S")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 2);
    for (at, told, _) in log.iter() {
        let told = told.as_deref().unwrap();
        assert!(
            *at + Duration::from_millis(backstop_test_support::told_ms(told))
                <= Duration::from_secs(1),
            "told {told} at {at:?}"
        );
    }
}
