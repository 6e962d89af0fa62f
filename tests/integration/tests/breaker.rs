//! The breaker in front of a real hyper client and an axum server over 127.0.0.1 that goes
//! down and comes back. The breaker's clock is tokio's: the test jumps it over the open time
//! (`pause`, `advance`, `resume`) instead of sleeping.

use backstop::BreakerOpen;
use backstop::client::breaker::{BreakerConfig, State};
use backstop_integration::listener;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};
use tower::{Service, ServiceBuilder, ServiceExt};

/// A server that answers 200, or 503 while `down`, and counts every request it sees.
async fn flaky_server(down: Arc<AtomicBool>, hits: Arc<AtomicU64>) -> String {
    let (listener, addr) = listener().await;
    let app = axum::Router::new().fallback(move || {
        let (down, hits) = (down.clone(), hits.clone());
        async move {
            hits.fetch_add(1, Ordering::SeqCst);
            if down.load(Ordering::SeqCst) {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            }
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/")
}

/// Moves tokio's clock (and so the breaker's) forward without waiting.
async fn jump(by: Duration) {
    tokio::time::pause();
    tokio::time::advance(by).await;
    tokio::time::resume();
}

#[tokio::test(flavor = "current_thread")]
async fn the_server_sees_only_probes_while_open_and_traffic_returns_after_recovery() {
    let (down, hits) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let url = flaky_server(down.clone(), hits.clone()).await;
    let breaker = BreakerConfig::http()
        .count_window(10)
        .minimum_calls(10)
        .probes(3)
        .open_duration(Duration::from_secs(1), Duration::from_secs(60))
        .jitter(false)
        .build()
        .unwrap();
    let mut client = ServiceBuilder::new()
        .layer(breaker.clone())
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());
    let mut call = async || -> Result<StatusCode, backstop::BoxError> {
        let request = Request::get(&url).body(Full::new(Bytes::new())).unwrap();
        let response = client.ready().await?.call(request).await?;
        let status = response.status();
        response.into_body().collect().await?;
        Ok(status)
    };

    // Healthy.
    for _ in 0..20 {
        assert_eq!(call().await.unwrap(), StatusCode::OK);
    }
    assert_eq!(hits.load(Ordering::SeqCst), 20);

    // Down: the breaker opens once half of the last 10 calls failed.
    down.store(true, Ordering::SeqCst);
    let mut failed = 0;
    while call().await.is_ok() {
        failed += 1;
        assert!(failed <= 10, "the breaker must open within the window");
    }
    assert_eq!(failed, 5, "5 failures of the last 10 calls open it");
    assert_eq!(breaker.snapshot().state, State::Open);
    let seen = hits.load(Ordering::SeqCst);

    // Open: 100 calls fail locally and fast; the server sees none of them.
    for _ in 0..100 {
        let err = call().await.unwrap_err();
        assert!(err.downcast_ref::<BreakerOpen>().is_some(), "{err}");
    }
    assert_eq!(hits.load(Ordering::SeqCst), seen);

    // After the open time, a probe reaches the server, fails, and re-opens for 2 s.
    jump(Duration::from_secs(1)).await;
    assert_eq!(call().await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(hits.load(Ordering::SeqCst), seen + 1);
    assert_eq!(breaker.snapshot().state, State::Open);
    assert!(call().await.is_err());
    jump(Duration::from_secs(1)).await;
    assert!(
        call().await.is_err(),
        "the second open time is twice as long"
    );

    // Recovered: three probes succeed, the breaker closes, all traffic flows again.
    down.store(false, Ordering::SeqCst);
    jump(Duration::from_secs(1)).await;
    for _ in 0..3 {
        assert_eq!(call().await.unwrap(), StatusCode::OK);
    }
    assert_eq!(breaker.snapshot().state, State::Closed);
    for _ in 0..20 {
        assert_eq!(call().await.unwrap(), StatusCode::OK);
    }
    assert_eq!(hits.load(Ordering::SeqCst), seen + 1 + 3 + 20);
}
