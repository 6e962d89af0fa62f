//! An axum app behind [`DeadlineLayer`] whose handler calls another service through
//! backstop's client preset, named `upstream` (a hyper-util client under
//! [`PropagateDeadlineLayer`], retries and a breaker): the outbound call inherits the
//! request's deadline without anything being passed by hand, and every layer records its
//! metrics, served in Prometheus' text format.
//!
//! Routes:
//! - `GET /deadline`: `deadline N ms` (what the handler has left) or `no deadline`.
//! - `GET /sleep/{ms}`: sleeps, then answers `slept`; a deadline cuts it with a 504.
//! - `GET /chain`: calls `{upstream}/deadline` and answers `deadline N ms; upstream: REPLY`.
//! - `GET /metrics`: what the layers recorded (`backstop_client_requests{dependency="upstream",
//!   outcome="success"} 1`, …), from the recorder the caller of [`app`] installed.
//!
//! A request's deadline comes from its `grpc-timeout` header or `x-timeout-ms` (decimal
//! milliseconds); requests without one get 5 s, and no request gets more than 30 s.

use axum::{
    Router,
    extract::{Path, State},
    routing::get,
};
use backstop::ReplayBody;
use backstop::axum::CallError;
use backstop::deadline::{DeadlineLayer, PropagateDeadlineLayer, current};
use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use metrics_exporter_prometheus::PrometheusHandle;
use std::time::Duration;
use tower::{ServiceBuilder, ServiceExt};

/// The outbound client: a hyper-util client under backstop's client preset.
pub type HttpClient = backstop::HttpClient<Client<HttpConnector, ReplayBody<Empty<Bytes>>>>;

#[derive(Debug, Clone)]
struct AppState {
    client: HttpClient,
    upstream: Uri,
    metrics: PrometheusHandle,
}

/// The app, calling `upstream` from `/chain` and serving `metrics` (the handle of the
/// Prometheus recorder installed before: layers register with the recorder installed when
/// they first record).
///
/// # Panics
///
/// Never: the layer configurations are fixed and valid (and checked by the tests).
pub fn app(upstream: Uri, metrics: PrometheusHandle) -> Router {
    let outbound = backstop::client::http()
        .name("upstream")
        .deadline(
            // Keep 10 % of what is left for ourselves, and tell the upstream 2 ms less than that
            // to cover the network.
            PropagateDeadlineLayer::builder()
                .fraction(0.9)
                .offset(Duration::from_millis(2)),
        )
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(outbound)
        .service(Client::builder(TokioExecutor::new()).build_http());
    let inbound = DeadlineLayer::builder()
        .default_timeout(Duration::from_secs(5))
        .max(Duration::from_secs(30))
        .millis_header("x-timeout-ms")
        .build()
        .expect("valid inbound configuration");
    Router::new()
        .route("/deadline", get(deadline))
        .route("/sleep/{ms}", get(sleep))
        .route("/chain", get(chain))
        .route("/metrics", get(render))
        .with_state(AppState {
            client,
            upstream,
            metrics,
        })
        // No HandleErrorLayer: DeadlineLayer answers 504 itself and keeps `Error = Infallible`.
        .layer(inbound)
}

fn describe() -> String {
    match current() {
        Some(d) => format!("deadline {} ms", d.remaining().as_millis()),
        None => "no deadline".to_owned(),
    }
}

async fn render(State(state): State<AppState>) -> String {
    state.metrics.render()
}

async fn deadline() -> String {
    describe()
}

async fn sleep(Path(ms): Path<u64>) -> &'static str {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    "slept"
}

/// `?` on the outbound call's error answers as a gateway should ([`CallError`]): 504 when the
/// deadline passed, 503 with `Retry-After` while the upstream's breaker is open, 502 for the
/// upstream's own failure.
async fn chain(State(state): State<AppState>) -> Result<String, CallError> {
    let own = describe();
    let request = Request::get(format!("{}deadline", state.upstream)).body(Empty::<Bytes>::new())?;
    let response = state.client.oneshot(request).await?;
    let body = response.into_body().collect().await?.to_bytes();
    Ok(format!(
        "{own}; upstream: {}",
        String::from_utf8_lossy(&body)
    ))
}
