//! `SemconvLayer` in its documented place, between a client preset and the transport: every
//! attempt is one sample, including those the attempt bound outside drops (timed out) and
//! those a proxy answers without a gRPC status. Cases an outside review found unrecorded or
//! misrecorded, kept so they stay fixed.
#![cfg(feature = "metrics")]

use backstop::ReplayBody;
use backstop_test_support::reply as status;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use metrics_util::{
    CompositeKey,
    debugging::{DebugValue, DebuggingRecorder},
};
use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tower::{ServiceBuilder, ServiceExt, service_fn};

type Recorded = Vec<(CompositeKey, DebugValue)>;

fn recorded<F: std::future::Future<Output = ()>>(test: impl FnOnce() -> F) -> Recorded {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(test());
    });
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key, value))
        .collect()
}

/// Every series of `name`: its labels (sorted) and value.
fn series<'a>(recorded: &'a Recorded, name: &str) -> Vec<(Vec<(String, String)>, &'a DebugValue)> {
    recorded
        .iter()
        .filter(|(k, _)| k.key().name() == name)
        .map(|(k, v)| {
            let mut labels: Vec<(String, String)> = k
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            (labels, v)
        })
        .collect()
}

fn samples(v: &DebugValue) -> usize {
    match v {
        DebugValue::Histogram(s) => s.len(),
        _ => 0,
    }
}

/// Between a client preset and the transport, each attempt is a sample, also one the preset's
/// attempt bound (outside the layer) drops when it runs out: the slow calls a latency
/// histogram exists for, recorded with `error.type = timeout`.
#[test]
fn every_attempt_the_bound_ended_is_a_sample() {
    use backstop::semconv::{HTTP_CLIENT_REQUEST_DURATION, SemconvLayer};
    let sent = Arc::new(AtomicUsize::new(0));
    let hits = sent.clone();
    let metrics = recorded(|| async move {
        let client = ServiceBuilder::new()
            .layer(
                backstop::client::http()
                    .name("partner")
                    .timeout(Duration::from_millis(300))
                    .attempt_timeout(Duration::from_millis(30)),
            )
            .layer(SemconvLayer::new())
            .service(service_fn(move |_req: Request<ReplayBody<String>>| {
                hits.fetch_add(1, Ordering::SeqCst);
                async {
                    std::future::pending::<()>().await;
                    Ok::<_, Infallible>(status(200))
                }
            }));
        let get = Request::get("https://partner/v1")
            .body(String::new())
            .unwrap();
        client.oneshot(get).await.unwrap_err();
    });
    let sent = sent.load(Ordering::SeqCst);
    let recorded_samples: usize = series(&metrics, HTTP_CLIENT_REQUEST_DURATION)
        .iter()
        .map(|(_, v)| samples(v))
        .sum();
    assert!(sent >= 1);
    assert_eq!(
        recorded_samples,
        sent,
        "{sent} attempts reached the transport through SemconvLayer, {recorded_samples} \
         http.client.request.duration samples: {:#?}",
        series(&metrics, HTTP_CLIENT_REQUEST_DURATION)
    );
    let timeout = ("error.type".to_owned(), "timeout".to_owned());
    for (labels, _) in series(&metrics, HTTP_CLIENT_REQUEST_DURATION) {
        assert!(labels.contains(&timeout), "{labels:?}");
    }
}

/// The same for gRPC: a call behind the gRPC preset whose attempts hang is recorded with
/// `rpc.grpc.status_code = 4`.
#[test]
fn a_grpc_attempt_the_bound_ended_is_deadline_exceeded() {
    use backstop::semconv::{RPC_CLIENT_DURATION, SemconvLayer};
    let metrics = recorded(|| async {
        let client = ServiceBuilder::new()
            .layer(
                backstop::client::grpc()
                    .name("stock")
                    .timeout(Duration::from_millis(300))
                    .attempt_timeout(Duration::from_millis(30)),
            )
            .layer(SemconvLayer::new().server("stock", 50051))
            .service(service_fn(|_req: Request<ReplayBody<String>>| async {
                std::future::pending::<()>().await;
                Ok::<_, Infallible>(status(200))
            }));
        let req = Request::post("/stock.Stock/Get")
            .header("content-type", "application/grpc")
            .body(String::new())
            .unwrap();
        let _ = client.oneshot(req).await;
    });
    let got = series(&metrics, RPC_CLIENT_DURATION);
    assert!(
        got.iter().any(|(labels, v)| samples(v) > 0
            && labels.contains(&("rpc.grpc.status_code".into(), "4".into()))),
        "no rpc.client.duration sample with status 4: {got:#?}"
    );
}

/// gRPC's HTTP-to-gRPC status mapping (and tonic, which reports it): an HTTP 503 without a
/// grpc-status (a proxy's or load balancer's answer) is UNAVAILABLE (14), and so is its
/// sample, as the status the caller gets.
#[test]
fn a_grpc_call_a_proxy_answered_503_is_unavailable() {
    use backstop::semconv::{RPC_CLIENT_DURATION, SemconvLayer};
    use tower::Layer;
    let metrics = recorded(|| async {
        let svc = SemconvLayer::new().layer(service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(503)
                    .header("content-type", "text/plain")
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        }));
        let req = Request::post("http://stock:50051/stock.Stock/Get")
            .header("content-type", "application/grpc")
            .body(String::new())
            .unwrap();
        let response = svc.oneshot(req).await.unwrap();
        let _ = response.into_body().collect().await;
    });
    let got = series(&metrics, RPC_CLIENT_DURATION);
    assert!(
        got.iter().any(|(labels, v)| samples(v) == 1
            && labels.contains(&("rpc.grpc.status_code".into(), "14".into()))),
        "{got:#?}"
    );
}
