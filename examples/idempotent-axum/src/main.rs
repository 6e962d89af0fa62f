//! Run the server: `cargo run -p example-idempotent-axum -- serve --addr 127.0.0.1:3001`
//! (the in-memory store; `--redis redis://127.0.0.1:6379/` or `BACKSTOP_REDIS_URL` for a
//! Redis shared by a fleet), then the client:
//! `cargo run -p example-idempotent-axum -- charge --url http://127.0.0.1:3001 --calls 3`
//! prints `call 1: 201 Created (replayed after a lost answer) charge 1` for each call and
//! `3 calls, 3 charges`.
//!
//! The server loses the first answer of every key (as a connection reset after the work
//! would): the charge was made, the client saw a 503. The client preset stamps one
//! `Idempotency-Key` per call (`.idempotency_keys(true)`), so it retries the POST with the
//! same key, and `IdempotencyLayer` answers the retry with the stored answer instead of
//! charging again.

use axum::{
    Router,
    extract::{Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use backstop::ReplayBody;
use backstop::idempotency::{IdempotencyLayer, MemoryStore, RedisStore, Store};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use std::{
    collections::HashSet,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};
use tower::ServiceExt;

/// An idempotent POST, end to end.
#[derive(Debug, Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serves `POST /charges` behind `IdempotencyLayer`, and `GET /charges` (how many).
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:3001")]
        addr: SocketAddr,
        /// A Redis for the store (default: `BACKSTOP_REDIS_URL` if set, else in memory).
        #[arg(long)]
        redis: Option<String>,
    },
    /// Makes `calls` charges through the client preset with keys, then asks how many were made.
    Charge {
        /// The server.
        #[arg(long, default_value = "http://127.0.0.1:3001")]
        url: String,
        /// How many charges.
        #[arg(long, default_value_t = 3)]
        calls: usize,
    },
}

#[tokio::main]
async fn main() -> Result<(), backstop::BoxError> {
    match Args::parse().command {
        Command::Serve { addr, redis } => {
            serve(
                addr,
                redis.or_else(|| std::env::var("BACKSTOP_REDIS_URL").ok()),
            )
            .await
        }
        Command::Charge { url, calls } => charge(&url, calls).await,
    }
}

/// The side effects made, and the keys whose first answer was already lost.
#[derive(Debug, Clone, Default)]
struct Ledger {
    charges: Arc<AtomicUsize>,
    lost: Arc<Mutex<HashSet<Vec<u8>>>>,
}

async fn serve(addr: SocketAddr, redis: Option<String>) -> Result<(), backstop::BoxError> {
    let store: Arc<dyn Store> = match &redis {
        Some(url) => Arc::new(RedisStore::connect(url).await?),
        None => Arc::new(MemoryStore::new()),
    };
    let ledger = Ledger::default();
    let app = Router::new()
        .route("/charges", post(make_charge))
        .layer(IdempotencyLayer::new(store))
        // Outside the layer: the network between server and client, losing answers.
        .layer(middleware::from_fn_with_state(
            ledger.clone(),
            lose_first_answer,
        ))
        .route("/charges", get(count))
        .with_state(ledger);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let store = if redis.is_some() { "redis" } else { "memory" };
    println!("listening on {addr} ({store} store)");
    axum::serve(listener, app).await?;
    Ok(())
}

async fn make_charge(State(ledger): State<Ledger>, body: Bytes) -> impl IntoResponse {
    let n = ledger.charges.fetch_add(1, Ordering::SeqCst) + 1;
    let _amount = body;
    (StatusCode::CREATED, format!("charge {n}"))
}

async fn count(State(ledger): State<Ledger>) -> String {
    format!("{} charges", ledger.charges.load(Ordering::SeqCst))
}

/// The first answer for each key is made (the charge happens) and then lost: a 503.
async fn lose_first_answer(State(ledger): State<Ledger>, req: Request, next: Next) -> Response {
    let key = req
        .headers()
        .get("idempotency-key")
        .map(|v| v.as_bytes().to_vec());
    let response = next.run(req).await;
    match key {
        Some(key) if ledger.lost.lock().unwrap().insert(key.clone()) => {
            (StatusCode::SERVICE_UNAVAILABLE, "answer lost").into_response()
        }
        _ => response,
    }
}

async fn charge(url: &str, calls: usize) -> Result<(), backstop::BoxError> {
    let transport = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Full<Bytes>>>();
    let client = tower::ServiceBuilder::new()
        .layer(
            backstop::client::http()
                .name("payments")
                .idempotency_keys(true)
                .build()
                .unwrap(),
        )
        .service(transport);
    for i in 1..=calls {
        let req = http::Request::post(format!("{url}/charges"))
            .body(Full::new(Bytes::from_static(b"{\"amount\":100}")))?;
        let response = client.clone().oneshot(req).await?;
        let replayed = response.headers().contains_key("idempotent-replayed");
        let attempts = backstop::client::call_info(&response).attempts();
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        let how = if replayed {
            " (replayed after a lost answer)"
        } else {
            ""
        };
        println!(
            "call {i}: {status}{how} {} [{attempts} attempts]",
            String::from_utf8_lossy(&body)
        );
    }
    let req = http::Request::get(format!("{url}/charges")).body(Full::new(Bytes::new()))?;
    let body = client
        .oneshot(req)
        .await?
        .into_body()
        .collect()
        .await?
        .to_bytes();
    println!("{calls} calls, {}", String::from_utf8_lossy(&body));
    Ok(())
}
