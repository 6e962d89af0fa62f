//! The behavioural suite against the embedded store, on paused time; then what only a store
//! that fails can show: fail closed (503 + Retry-After, the handler not run), fail open, a
//! slow store, a full store.

mod common;

mod suite {
    crate::behaviour!(true, backstop::idempotency::MemoryStore::new());
}

use backstop::idempotency::{
    Claim, IdempotencyLayer, MemoryStore, Record, Store, StoreError, StoreErrorKind, StoreFuture,
    StoredResponse, Token,
};
use common::*;
use std::{sync::Arc, time::Duration};

/// A store that is down, or slow.
#[derive(Debug, Clone, Copy)]
enum Broken {
    Down,
    Slow,
}

impl Broken {
    fn fail<'a, T: Send + 'a>(&'a self) -> StoreFuture<'a, T> {
        let this = *self;
        Box::pin(async move {
            if let Broken::Slow = this {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "connection refused",
            ))
        })
    }
}

impl Store for Broken {
    fn claim<'a>(&'a self, _: &'a str, _: Token, _: Duration) -> StoreFuture<'a, Claim> {
        self.fail()
    }
    fn complete<'a>(
        &'a self,
        _: &'a str,
        _: Token,
        _: Arc<StoredResponse>,
        _: Duration,
    ) -> StoreFuture<'a, bool> {
        self.fail()
    }
    fn release<'a>(&'a self, _: &'a str, _: Token) -> StoreFuture<'a, bool> {
        self.fail()
    }
    fn get<'a>(&'a self, _: &'a str) -> StoreFuture<'a, Option<Record>> {
        self.fail()
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_that_is_down_fails_closed_with_retry_after() {
    for store in [Broken::Down, Broken::Slow] {
        let h = Harness::new(store);
        let started = tokio::time::Instant::now();
        let r = h.post("/ok", Some("k"), "").await;
        assert_problem(&r, 503);
        assert_eq!(r.headers()["retry-after"], "1", "the fixed 1 s");
        assert_eq!(h.runs(), 0, "{store:?}: the handler did not run");
        let waited = started.elapsed();
        match store {
            Broken::Down => assert!(waited < Duration::from_secs(1), "answered at once"),
            // A store that never answers is given the fixed 1 s, not a moment less or more.
            Broken::Slow => assert_eq!(waited, Duration::from_secs(1)),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn fail_open_runs_the_handler_without_de_duplication() {
    let h = Harness::with(IdempotencyLayer::builder(Broken::Down), |c| {
        c.fail_open(true)
    });
    assert_eq!(h.post("/ok", Some("k"), "").await.status(), 201);
    assert_eq!(h.post("/ok", Some("k"), "").await.status(), 201);
    assert_eq!(h.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_store_full_of_claims_in_flight_refuses_with_503() {
    // One record in each of the 16 shards.
    let store = MemoryStore::builder().max_entries(16).build().unwrap();
    let h = Harness::new(store.clone());
    // 400 slow requests in flight: every shard gets a claim (the chance that one of 16 shards
    // gets none of 400 random keys is 16 × (15/16)^400, below 1e-10); the rest are refused.
    let originals: Vec<_> = (0..400)
        .map(|i| tokio::spawn(h.send(post("/slow", Some(&format!("a{i}")), ""))))
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(store.len(), 16, "a claim in every shard");
    assert_problem(&h.post("/ok", Some("b"), "").await, 503);
    let mut statuses = Vec::new();
    for original in originals {
        statuses.push(original.await.unwrap().unwrap().status().as_u16());
    }
    assert_eq!(statuses.iter().filter(|&&s| s == 201).count(), 16);
    assert_eq!(statuses.iter().filter(|&&s| s == 503).count(), 400 - 16);
    // Once answered, a record may be evicted for `b`.
    assert_eq!(h.post("/ok", Some("b"), "").await.status(), 201);
    assert_eq!(store.len(), 16);
}

#[tokio::test(start_paused = true)]
async fn bad_keys_never_reach_the_store_nor_the_handler() {
    let store = MemoryStore::new();
    let h = Harness::new(store.clone());
    let with_keys = |values: &[&[u8]]| {
        let mut req = post("/ok", None, "");
        for v in values {
            req.headers_mut()
                .append("idempotency-key", http::HeaderValue::from_bytes(v).unwrap());
        }
        req
    };
    let long = "k".repeat(255);
    let too_long = "k".repeat(256);
    for bad in [
        &[b"   ".as_slice()][..],
        &[b"\"\xff\"".as_slice()],
        &[b"caf\xc3\xa9".as_slice()],
        &[too_long.as_bytes()],
        &[b"\"a\"".as_slice(), b"\"a\"".as_slice()],
    ] {
        let r = h.send(with_keys(bad)).await.unwrap();
        assert_eq!(r.status(), 400, "{bad:?}");
        assert_problem(&r, 400);
    }
    assert_eq!(h.runs(), 0);
    assert!(store.is_empty(), "refused before any claim");
    // The longest key allowed is a key.
    assert_eq!(
        h.send(with_keys(&[long.as_bytes()]))
            .await
            .unwrap()
            .status(),
        201
    );
    assert!(replayed(
        &h.send(with_keys(&[long.as_bytes()])).await.unwrap()
    ));
    assert_eq!(h.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_body_too_large_is_refused_before_any_claim() {
    let store = MemoryStore::new();
    let h = Harness::with(IdempotencyLayer::builder(store.clone()), |c| {
        c.max_body_bytes(1024)
    });
    let big: &'static str = Box::leak("x".repeat(1025).into_boxed_str());
    assert_problem(&h.post("/ok", Some("big"), big).await, 413);
    assert_eq!(h.runs(), 0);
    assert!(store.is_empty());
}

#[tokio::test(start_paused = true)]
async fn grpc_requests_pass_through_with_a_key() {
    let store = MemoryStore::new();
    let h = Harness::new(store.clone());
    let grpc = || {
        let mut req = post("/pkg.Payments/Charge", Some("g1"), "");
        req.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/grpc"),
        );
        req
    };
    for _ in 0..2 {
        assert!(!replayed(&h.send(grpc()).await.unwrap()));
    }
    assert_eq!(h.runs(), 2, "not de-duplicated (the crate docs say why)");
    assert!(store.is_empty());
}

/// After the answer, whatever the lock timeout: a duplicate is 409 without `Retry-After`, and
/// the handler ran once.
async fn never_run_again(h: &Harness, path: &str) {
    for wait in [0, 600, 5_000] {
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let dup = h.post(path, Some("k"), "").await;
        assert_problem(&dup, 409);
        assert!(dup.headers().get("retry-after").is_none(), "{dup:?}");
    }
    assert_eq!(h.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_answer_larger_than_a_memory_store_shard_is_sent_whole_and_never_run_again() {
    // 16 shards of 4 KiB; the answer is 8 KiB, below `max_body_bytes` (1 MiB).
    let store = MemoryStore::builder().max_bytes(64 << 10).build().unwrap();
    let h = Harness::with(IdempotencyLayer::builder(store), |c| {
        c.lock_timeout(Duration::from_millis(500))
    });
    let first = h.post("/huge", Some("k"), "").await;
    assert_eq!(first.status(), 201);
    assert_eq!(first.body().len(), 8 << 10);
    never_run_again(&h, "/huge").await;
}

#[tokio::test(start_paused = true)]
async fn an_answer_the_store_refuses_to_keep_leaves_a_record_that_the_request_ran() {
    let picky = Quirky {
        picky: true,
        ..Quirky::default()
    };
    let h = Harness::with(IdempotencyLayer::builder(picky), |c| {
        c.lock_timeout(Duration::from_millis(500))
    });
    let first = h.post("/big", Some("k"), "").await;
    assert_eq!(first.status(), 201);
    assert_eq!(first.body().len(), 4096);
    never_run_again(&h, "/big").await;
}

#[tokio::test(start_paused = true)]
async fn every_duration_knob_is_refused_by_build_or_honoured_by_the_memory_store() {
    every_duration_knob_is_refused_or_honoured(MemoryStore::new).await;
}

/// The memory store with the quirks of a remote one, each off unless set.
#[derive(Debug, Clone, Default)]
struct Quirky {
    inner: MemoryStore,
    /// Refuses (`Full`) any answer above 100 bytes of body without saying so up front
    /// (`max_record_bytes` left at its default): a store whose limit the layer learns only
    /// when `complete` fails.
    picky: bool,
    /// The first claim is sent at once but lands this much later, whether or not its caller
    /// still waits (as a command already written to Redis's socket does): a slow link.
    first_claim_lands_after: Option<Duration>,
    claimed: Arc<std::sync::atomic::AtomicBool>,
}

impl Store for Quirky {
    fn claim<'a>(&'a self, key: &'a str, token: Token, lock: Duration) -> StoreFuture<'a, Claim> {
        let claimed = self.claimed.swap(true, std::sync::atomic::Ordering::SeqCst);
        let Some(delay) = self.first_claim_lands_after.filter(|_| !claimed) else {
            return self.inner.claim(key, token, lock);
        };
        let (inner, key) = (self.inner.clone(), key.to_owned());
        let landed = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            inner.claim(&key, token, lock).await
        });
        Box::pin(async move { landed.await.unwrap() })
    }
    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        response: Arc<StoredResponse>,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        if self.picky && response.body.len() > 100 && response.status != 409 {
            return Box::pin(async { Err(StoreError::kind_only(StoreErrorKind::Full)) });
        }
        self.inner.complete(key, token, response, ttl)
    }
    fn release<'a>(&'a self, key: &'a str, token: Token) -> StoreFuture<'a, bool> {
        self.inner.release(key, token)
    }
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        self.inner.get(key)
    }
}

/// A layer (its store timeout is the fixed 1 s) over a memory store whose first claim lands
/// `delay` after it is sent.
fn late_claim(delay: Duration) -> Harness {
    Harness::new(Quirky {
        first_claim_lands_after: Some(delay),
        ..Quirky::default()
    })
}

#[tokio::test(start_paused = true)]
async fn a_claim_that_lands_after_its_store_timeout_does_not_block_the_retry() {
    let h = late_claim(Duration::from_secs(2));
    // Not processed: 503, come back later. Its claim lands in the store a second after.
    let first = h.post("/ok", Some("k"), "").await;
    assert_problem(&first, 503);
    assert_eq!(h.runs(), 0);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // The retry runs (the handler never did), not 409 until the lock timeout.
    let retry = h.post("/ok", Some("k"), "").await;
    assert_eq!(retry.status(), 201, "{retry:?}");
    assert!(!replayed(&retry));
    assert!(replayed(&h.post("/ok", Some("k"), "").await));
    assert_eq!(h.runs(), 1);
}

/// Found by the outside attack (issue 37, 14): a claim that lands after the store timeout (1 s)
/// was released, but not one whose request was dropped while the claim was on its way (a deadline layer
/// outside, `server()` in the documented `Deadline → IdempotencyLayer` order, or the caller
/// leaving): the claim lands, nobody releases it, and the retry of a request whose handler
/// never ran is answered 409 until the lock timeout (60 s). The docs: "A claim whose answer
/// never came may still land in the store: the layer releases it … so the retry runs."
#[tokio::test(start_paused = true)]
async fn a_claim_that_lands_after_its_request_was_dropped_does_not_block_the_retry() {
    let h = late_claim(Duration::from_millis(500));
    // The request's deadline (outside this layer) ends it at 200 ms, its claim on the way.
    let cut = tokio::time::timeout(Duration::from_millis(200), h.post("/ok", Some("k"), "")).await;
    assert!(cut.is_err());
    assert_eq!(h.runs(), 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The handler never ran: the retry runs.
    let retry = h.post("/ok", Some("k"), "").await;
    assert_eq!(retry.status(), 201, "{retry:?}");
    assert_eq!(h.runs(), 1);
}
