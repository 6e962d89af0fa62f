//! Idempotency keys end to end: a server layer that makes a retried POST happen once, and a
//! client layer that stamps the keys.
//!
//! # Example
//!
//! ```
//! use backstop::idempotency::{IdempotencyLayer, MemoryStore};
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use bytes::Bytes;
//! use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let charges = Arc::new(AtomicUsize::new(0));
//! let counter = charges.clone();
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()))
//!     .service(service_fn(move |_req: Request<Full<Bytes>>| {
//!         let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
//!         async move {
//!             let body = Full::new(Bytes::from(format!("charge {n}")));
//!             Ok::<_, std::convert::Infallible>(
//!                 Response::builder().status(StatusCode::CREATED).body(body).unwrap(),
//!             )
//!         }
//!     }));
//! let charge = || {
//!     Request::post("/charges")
//!         .header("idempotency-key", "\"a1b2c3\"")
//!         .body(Full::new(Bytes::from_static(b"{\"amount\":100}")))
//!         .unwrap()
//! };
//! let first = svc.clone().oneshot(charge()).await.unwrap();
//! let again = svc.clone().oneshot(charge()).await.unwrap();
//! assert_eq!(again.status(), StatusCode::CREATED);
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//! assert_eq!(again.into_body().collect().await.unwrap().to_bytes(), "charge 1");
//! assert_eq!(charges.load(Ordering::SeqCst), 1);
//! # let _ = first;
//! # }
//! ```
//!
//! # Semantics
//!
//! For a request whose method is one of `methods` (POST and PATCH by default) and that
//! carries an `Idempotency-Key` (a structured-field string, `"…"`, per
//! draft-ietf-httpapi-idempotency-key-header; a bare token is accepted too), in this order:
//!
//! 1. The key is checked: empty, longer than 255 bytes, not printable ASCII, or repeated →
//!    **400**. A request without a key runs as usual, unless the layer is set to
//!    `require_key` → **400**.
//! 2. The body is buffered, at most `max_body_bytes` (1 MiB) → **413** above, and the
//!    request's fingerprint taken: SHA-256 over method, path and query, the caller's
//!    identity (when an `identity` function is set) and the body. With an `identity`, each
//!    caller also has **its own key space** (the store's key is scoped by a digest of the
//!    identity): a key one caller chose never answers, blocks or reveals another's.
//! 3. **Claim before running**: a conditional write of an in-progress record, held for
//!    `lock_timeout` (60 s), or, when the request's deadline lets its handler run longer,
//!    until a second after that deadline (at most an hour, `server()`'s own cap): a claim
//!    that expired while its handler still ran would let a retry run it again. The deadline
//!    is the deadline layer's [`Deadline`](crate::deadline::Deadline) extension when that
//!    layer is outside, else the caller's `grpc-timeout`, so either order of the layers
//!    holds the claim as long. If the key already holds
//!    - a record of a different fingerprint → **422** (the key was reused for another
//!      request);
//!    - a claim in flight → **409** with `Retry-After: 1` (backstop's client
//!      classifiers read it as "come back later", so a retry or a hedge of the call is sent
//!      again later and never wins the race with the original), or, with
//!      `wait_in_flight`, the original's answer once
//!      it comes within that bound;
//!    - a completed answer → that answer **replayed**: its status, headers and body, with
//!      `Idempotent-Replayed: true`. The handler does not run.
//!
//!    Readiness: what the caller's `poll_ready` reserved in the handler's service (a
//!    `ConcurrencyLimit` permit, a `Buffer` slot) goes back at `call` for a keyed request,
//!    and the layer readies a clone of its own only once the claim is the request's. So a
//!    slow upload, a duplicate waiting for the original, a replay, a 409, a 422 and the
//!    store's 503 hold none of the handler's capacity and never wait for it. A claimed
//!    request dropped while it waits for the handler's service, or whose service fails its
//!    readiness, **releases** the key: the handler never started, and a retry runs it.
//! 4. The handler runs. **Once it has started, its answer is the key's answer**, 5xx, 408
//!    and 429 included: stored (kept `ttl`, 24 h) and replayed to every retry with the key.
//!    The reason: a handler that charged and then answered 500 or 504 (a downstream call
//!    failed after the charge, its deadline cut it) has done the work; running it again for
//!    a retry charges twice, and a retry with another body would run instead of getting 422
//!    (Stripe's keys work the same way). Only an answer carrying
//!    [`backstop::NotExecuted`](crate::NotExecuted) **releases** the key, so a retry runs: backstop's server
//!    layers put it on the refusals they make before calling the handler (the deadline
//!    layer's refusal on arrival, the admission layer's), whatever the order of the layers,
//!    and a handler that did nothing may put it on its own answer:
//!
//!    ```
//!    use backstop::NotExecuted;
//!    use http::{Response, StatusCode};
//!
//!    // The handler checked a precondition and touched nothing: a retry may run it.
//!    let mut answer = Response::new(String::from("inventory service down, nothing charged"));
//!    *answer.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
//!    answer.extensions_mut().insert(NotExecuted);
//!    # let _ = answer;
//!    ```
//!
//!    A [`Rejection`](crate::Rejection) alone (a response `backstop::axum::CallError`
//!    made from a downstream failure, an open breaker's included) does not release: it says
//!    who answered, not that nothing happened.
//! 5. When the handler started but left **no answer to replay**, the key keeps, for `ttl`,
//!    a record that the request ran, and a duplicate is answered **409** without
//!    `Retry-After` (coming back later will not help; the handler never runs twice for the
//!    key): a handler error (`Err`), a **panic** (in `call` or in its future), an answer
//!    larger than `max_body_bytes` (1 MiB) or than the store can hold
//!    ([`Store::max_record_bytes`]: a memory-store shard's share of its bytes), one with
//!    trailers, or one whose body fails (each sent whole to its caller, with a warning
//!    logged), and a keyed future **dropped** while the handler runs (the caller left, a
//!    timeout outside fired). A dropped request's record is written on the tokio runtime as
//!    the future is dropped; when its deadline (the deadline layer's [`Deadline`](crate::deadline::Deadline) extension)
//!    had passed, it is the deadline layer's 504, so `Deadline → Idempotency` replays what
//!    `Idempotency → Deadline` stores.
//!    A claim no one completes (the process died, the store failed at the end) expires after
//!    `lock_timeout` (60 s).
//! 6. When the store fails or takes longer than 1 s, the request is answered **503** with
//!    `Retry-After: 1` and the handler does not run (fail closed), unless
//!    `fail_open` is set. A claim whose answer never came (it timed out, failed, or the
//!    request was dropped while it was on its way) may still land in the store: the layer
//!    releases it (its token is the layer's) once it has, so the retry runs. A failure
//!    to store the answer after the handler ran is logged and the answer sent; the key gets the record that the request ran instead (whatever cannot
//!    be stored still leaves that record).
//!
//! Every refusal carries a problem-details body (`application/problem+json`, RFC 9457).
//! Other methods and gRPC requests pass through untouched. The layer's service takes
//! requests whose body can be rebuilt from bytes (`B: From<Bytes>`: axum's body, `Full`),
//! because a keyed request's body is read whole before the handler sees it.
//!
//! **gRPC** is not de-duplicated: a gRPC answer's status comes in trailers after a stream,
//! which this layer would have to buffer and replay frame by frame; a unary gRPC method that
//! must happen once takes a key in its message and checks it against a [`Store`] itself.
//!
//! # The store
//!
//! [`Store`] says what any store promises (one live claim per key; complete and release only
//! by the claim's holder, atomically). [`MemoryStore`] is the embedded default (sharded,
//! bounded, model-checked); `RedisStore` (feature `redis`) serves a fleet. A handler without
//! a deadline that runs longer than `lock_timeout` may run again beside a duplicate: bound it
//! (a server deadline: the claim then lasts as long) or raise the lock timeout.
//!
//! # The client
//!
//! [`IdempotencyKeyLayer`] stamps a fresh key (128 random bits from the OS, as a
//! structured-field string) on each POST and PATCH that has none, once per logical call: put
//! it **outside** the retry layer, so every attempt of a call carries the same key. A keyed
//! request is one that backstop's retry layer retries and hedges (its
//! `Idempotency::Standard` rule): stamp keys only for a server that de-duplicates them.
//!
//! # Ordering
//!
//! On the server, either order with `backstop::server()` (Deadline → Admission → Pushback)
//! keeps the rule above: a request refused before its handler ran releases its key (inside
//! the deadline layer it is refused before a claim is made; outside, the refusal carries
//! [`NotExecuted`](crate::NotExecuted)), a handler cut by its deadline leaves the
//! same 504 under its key (an answer still streaming when the deadline cuts it too: with
//! this layer outside, the cut comes while the answer is read here, before its head went
//! out, so the caller gets the 504 whole), and the claim lasts as long as the deadline. `Deadline → IdempotencyLayer → your routes` makes no claim for a
//! request refused on arrival; keep the layer outside the handler's own layers. On the
//! client:
//! `IdempotencyKeyLayer → Retry → …` (the `backstop::client` presets do this with
//! `.idempotency_keys(true)`).
//!
//! # Feature flags
//!
//! - `redis`: `RedisStore`, over the `redis` crate (tokio, a reconnecting connection).

pub(crate) mod body;
pub(crate) mod client;
pub(crate) mod config;
pub(crate) mod key;
pub(crate) mod layer;
pub(crate) mod memory;
pub(crate) mod problem;
pub(crate) mod record;
#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod service;
pub(crate) mod store;
pub(crate) mod sync;

#[cfg(all(test, loom))]
pub(crate) mod loom_tests;

pub use client::{IdempotencyKey, IdempotencyKeyLayer};
pub use config::IdempotencyConfig;
pub use key::IDEMPOTENCY_KEY;
pub(crate) use key::KeyError;
pub use layer::IdempotencyLayer;
pub use memory::{MemoryStore, MemoryStoreBuilder};
pub use record::{Fingerprint, StoredResponse};
#[cfg(feature = "redis")]
pub use redis::RedisStore;
pub use service::{IDEMPOTENT_REPLAYED, Idempotency};
pub use store::{Claim, Record, Store, StoreError, StoreErrorKind, StoreFuture, Token};
