//! Run: `cargo run -p example-three-hops -- --requests 10`
//!
//! A → B → C over 127.0.0.1, C down (every answer a 503), twice: first with a naive retry loop
//! at each hop (5 attempts, 10 ms apart), then with backstop (`client::http().build().unwrap()` at each hop,
//! `server()` on B). Prints how many attempts each hop saw per user request: naive retries
//! multiply per hop (up to 25 on C), backstop's pushback and breakers keep C near 1 and then
//! down to probes.

use axum::{Router, extract::State, http::StatusCode, routing::get};
use backstop::ReplayBody;
use bytes::Bytes;
use clap::Parser;
use http::{Request, Uri};
use http_body_util::Empty;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};

/// A → B → C with C down: attempts per hop, naive retries against backstop.
#[derive(Debug, Parser)]
struct Args {
    /// User requests sent to A's client, one after the other.
    #[arg(long, default_value_t = 10)]
    requests: u64,
}

type Plain = Client<HttpConnector, Empty<Bytes>>;
type Replayed = Client<HttpConnector, ReplayBody<Empty<Bytes>>>;

/// How a hop calls the next one.
#[derive(Clone)]
enum Caller {
    Naive(Plain),
    // Boxed: the preset's layer is several times the size of a hyper client.
    Backstop(
        Box<backstop::client::ClientLayer<backstop::HttpClassifier>>,
        Replayed,
    ),
}

impl Caller {
    fn naive() -> Self {
        Caller::Naive(Client::builder(TokioExecutor::new()).build_http())
    }

    fn backstop() -> Self {
        let client = backstop::client::http()
            .timeout(Duration::from_secs(1))
            .build()
            .expect("a valid client stack");
        Caller::Backstop(
            Box::new(client),
            Client::builder(TokioExecutor::new()).build_http(),
        )
    }

    /// GETs `uri`; the status, or 503 when no answer came.
    async fn get(&self, uri: &Uri) -> StatusCode {
        let request = || {
            Request::get(uri.clone())
                .body(Empty::new())
                .expect("a request")
        };
        match self {
            Caller::Naive(client) => {
                let mut status = StatusCode::SERVICE_UNAVAILABLE;
                for attempt in 0..5 {
                    if attempt > 0 {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    status = match client.request(request()).await {
                        Ok(response) => response.status(),
                        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
                    };
                    if !status.is_server_error() {
                        break;
                    }
                }
                status
            }
            Caller::Backstop(layer, client) => {
                let stack = ServiceBuilder::new()
                    .layer(layer.as_ref().clone())
                    .service(client.clone());
                match stack.oneshot(request()).await {
                    Ok(response) => response.status(),
                    Err(_) => StatusCode::SERVICE_UNAVAILABLE,
                }
            }
        }
    }
}

async fn listen() -> (TcpListener, Uri) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let uri = format!("http://{}/", listener.local_addr().expect("address"))
        .parse()
        .expect("a URI");
    (listener, uri)
}

/// C: counts its hits and fails every one.
async fn start_c(hits: Arc<AtomicU64>) -> Uri {
    let (listener, uri) = listen().await;
    let app = Router::new().fallback(move || {
        hits.fetch_add(1, Ordering::Relaxed);
        async { StatusCode::SERVICE_UNAVAILABLE }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    uri
}

#[derive(Clone)]
struct Hop {
    hits: Arc<AtomicU64>,
    caller: Caller,
    next: Uri,
}

async fn relay(State(hop): State<Hop>) -> StatusCode {
    hop.hits.fetch_add(1, Ordering::Relaxed);
    hop.caller.get(&hop.next).await
}

/// B: counts its hits and relays each to C through `caller` (behind `backstop::server()`
/// when backstop is on, so it reads A's deadline and pushes back when its retries give up).
async fn start_b(hits: Arc<AtomicU64>, caller: Caller, next: Uri) -> Uri {
    let (listener, uri) = listen().await;
    let backstop = matches!(caller, Caller::Backstop(..));
    let app = Router::new()
        .fallback(get(relay))
        .with_state(Hop { hits, caller, next });
    let app = if backstop {
        app.layer(backstop::server())
    } else {
        app
    };
    tokio::spawn(async move { axum::serve(listener, app).await });
    uri
}

async fn run(name: &str, caller: fn() -> Caller, requests: u64) {
    let (b_hits, c_hits) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let c = start_c(c_hits.clone()).await;
    let b = start_b(b_hits.clone(), caller(), c).await;
    let a = caller();
    let mut ok = 0;
    for _ in 0..requests {
        if a.get(&b).await.is_success() {
            ok += 1;
        }
    }
    let (b_seen, c_seen) = (
        b_hits.load(Ordering::Relaxed),
        c_hits.load(Ordering::Relaxed),
    );
    println!(
        "{name:<8} {requests} user requests ({ok} ok): B saw {b_seen} ({:.1} per request), C saw {c_seen} ({:.1} per request)",
        b_seen as f64 / requests as f64,
        c_seen as f64 / requests as f64,
    );
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    run("naive", Caller::naive, args.requests).await;
    run("backstop", Caller::backstop, args.requests).await;
}
