//! What `IdempotencyLayer` costs per keyed POST, beside the bare handler, in one run:
//! `cargo bench -p backstop-benches --bench idempotency`. Each call has a fresh key (the
//! claim, the handler, the answer stored) unless it says replay (a key answered before: one
//! read, no handler). The Redis rows go to a `redis-server` this bench starts on a free port
//! of 127.0.0.1 (one multiplexed connection, the same runtime thread) and kills at the end;
//! without `redis-server` on `PATH` they are skipped.

use backstop::idempotency::{IdempotencyLayer, MemoryStore, RedisStore, Store};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use std::{
    convert::Infallible,
    hint::black_box,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};
use tokio::runtime::Runtime;
use tower::{ServiceBuilder, ServiceExt, service_fn};

/// A keyed POST; a fresh key per call unless `key` is given.
fn charge(key: Option<&str>) -> Request<Full<Bytes>> {
    static N: AtomicU64 = AtomicU64::new(0);
    let key = key.map_or_else(
        || format!("\"k{}\"", N.fetch_add(1, Ordering::Relaxed)),
        |k| format!("\"{k}\""),
    );
    Request::post("/charges")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{\"amount\":100}")))
        .unwrap()
}

fn handler() -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    service_fn(|_req: Request<Full<Bytes>>| async {
        let mut r = Response::new(Full::new(Bytes::from_static(b"charge 1")));
        *r.status_mut() = http::StatusCode::CREATED;
        Ok::<_, Infallible>(r)
    })
}

/// One call through `layer`, its body read to the end.
async fn through<St: Store>(layer: &IdempotencyLayer<St>, key: Option<&str>) {
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(handler());
    let r = svc.oneshot(charge(key)).await.unwrap();
    black_box(r.into_body().collect().await.unwrap().to_bytes());
}

/// A redis-server on a free port of 127.0.0.1, killed when dropped.
struct Redis(Child, u16);

impl Redis {
    fn start() -> Option<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .ok()?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .ok()?;
        Some(Self(child, port))
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("idempotency");
    g.bench_function("bare handler", |b| {
        b.to_async(&rt).iter(|| async {
            let r = handler().oneshot(charge(None)).await.unwrap();
            black_box(r.into_body().collect().await.unwrap().to_bytes());
        });
    });
    // Answers kept 10 ms: millions of fresh keys never fill the store, whose full shards
    // would make each claim scan for the answer to evict (a cost of a full store, not of a call).
    let fresh = IdempotencyLayer::builder(MemoryStore::new())
        .ttl(Duration::from_millis(10))
        .build()
        .unwrap();
    g.bench_function("memory, fresh key", |b| {
        b.to_async(&rt).iter(|| through(&fresh, None));
    });
    let memory = IdempotencyLayer::new(MemoryStore::new());
    rt.block_on(through(&memory, Some("answered")));
    g.bench_function("memory, replay", |b| {
        b.to_async(&rt).iter(|| through(&memory, Some("answered")));
    });
    if let Some(redis) = Redis::start() {
        let store = IdempotencyLayer::new(connect(&rt, redis.1));
        g.bench_function("redis loopback, fresh key", |b| {
            b.to_async(&rt).iter(|| through(&store, None));
        });
        rt.block_on(through(&store, Some("answered")));
        g.bench_function("redis loopback, replay", |b| {
            b.to_async(&rt).iter(|| through(&store, Some("answered")));
        });
        drop(redis);
    } else {
        eprintln!("skipped the Redis rows: no redis-server on PATH");
    }
    g.finish();
}

/// The Redis store, once the server listens (bounded: 5 s).
fn connect(rt: &Runtime, port: u16) -> RedisStore {
    rt.block_on(async {
        for _ in 0..250 {
            if let Ok(store) = RedisStore::connect(&format!("redis://127.0.0.1:{port}/")).await {
                return store;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("redis-server did not answer on 127.0.0.1:{port}");
    })
}

criterion_group!(benches, bench);
criterion_main!(benches);
