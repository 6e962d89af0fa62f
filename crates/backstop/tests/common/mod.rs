//! The behavioural suite every store runs (`behaviour!`), and the harness it drives: a
//! handler that counts its runs, behind an `IdempotencyLayer` over the store under test.
#![allow(dead_code, unreachable_pub)]

pub mod redis_server;

use backstop::Rejection;
use backstop::idempotency::{IdempotencyConfig, IdempotencyLayer, Store};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tower::{BoxError, Service, ServiceExt, service_fn, util::BoxCloneSyncService};

pub type Svc = BoxCloneSyncService<Request<Full<Bytes>>, Response<Bytes>, BoxError>;

/// A handler that counts its runs; its path says what it does.
pub struct Harness {
    pub runs: Arc<AtomicUsize>,
    pub svc: Svc,
}

/// A key no other test (nor an earlier run against a shared Redis) uses.
pub fn fresh_key(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{name}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// What the harness can put behind the layer: a handler it clones per call and whose calls
/// cross tasks.
pub trait Handler:
    Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>, Error = BoxError, Future: Send>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<H> Handler for H where
    H: Service<
            Request<Full<Bytes>>,
            Response = Response<Full<Bytes>>,
            Error = BoxError,
            Future: Send,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

pub fn handler(runs: Arc<AtomicUsize>) -> impl Handler {
    let panicked = Arc::new(std::sync::atomic::AtomicBool::new(false));
    service_fn(move |req: Request<Full<Bytes>>| {
        let runs = runs.clone();
        let panicked = panicked.clone();
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let path = req.uri().path().to_owned();
            let mut status = StatusCode::CREATED;
            let mut body = format!("run {n}");
            match path.as_str() {
                "/slow" => tokio::time::sleep(Duration::from_millis(200)).await,
                "/fail" => status = StatusCode::INTERNAL_SERVER_ERROR,
                "/bad" => status = StatusCode::BAD_REQUEST,
                "/busy" => status = StatusCode::TOO_MANY_REQUESTS,
                "/timeout" => status = StatusCode::REQUEST_TIMEOUT,
                "/err" => return Err::<Response<Full<Bytes>>, BoxError>("handler failed".into()),
                "/panic" if !panicked.swap(true, Ordering::SeqCst) => panic!("handler panicked"),
                "/big" => body = "x".repeat(4096),
                "/huge" => body = "x".repeat(8 << 10),
                "/nothing" => {
                    let mut r = Response::new(Full::new(Bytes::from_static(b"nothing done")));
                    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    r.extensions_mut().insert(backstop::NotExecuted);
                    return Ok(r);
                }
                "/reject" => {
                    let mut r = Response::new(Full::new(Bytes::from_static(b"open")));
                    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    r.extensions_mut()
                        .insert(Rejection::BreakerOpen { retry_after: None });
                    return Ok(r);
                }
                _ => {}
            }
            let mut r = Response::new(Full::new(Bytes::from(body)));
            *r.status_mut() = status;
            r.headers_mut().insert("x-run", n.into());
            Ok(r)
        }
    })
}

/// A response with its body read whole (the layer's body type is its own).
async fn collected<B>(r: Response<B>) -> Result<Response<Bytes>, BoxError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (parts, body) = r.into_parts();
    let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
    Ok(Response::from_parts(parts, bytes))
}

impl Harness {
    pub fn new<St: Store>(store: St) -> Self {
        Self::with(IdempotencyLayer::builder(store), |c| c)
    }

    pub fn with<St: Store>(
        config: IdempotencyConfig<St>,
        tune: impl FnOnce(IdempotencyConfig<St>) -> IdempotencyConfig<St>,
    ) -> Self {
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = handler(runs.clone());
        Self::around(tune(config), runs, svc)
    }

    /// The layer of `config` around `handler`, which counts its runs in `runs`.
    pub fn around<St: Store>(
        config: IdempotencyConfig<St>,
        runs: Arc<AtomicUsize>,
        handler: impl Handler,
    ) -> Self {
        Self::layered(config.build().unwrap(), runs, handler)
    }

    /// `layer` around `handler`, which counts its runs in `runs`.
    pub fn layered<St: Store>(
        layer: IdempotencyLayer<St>,
        runs: Arc<AtomicUsize>,
        handler: impl Handler,
    ) -> Self {
        let svc = tower::ServiceBuilder::new()
            .layer(layer)
            .service(handler)
            .and_then(collected);
        Self {
            runs,
            svc: BoxCloneSyncService::new(svc),
        }
    }

    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    pub async fn post(&self, path: &str, key: Option<&str>, body: &'static str) -> Response<Bytes> {
        self.send(post(path, key, body)).await.unwrap()
    }

    pub fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> impl Future<Output = Result<Response<Bytes>, BoxError>> + Send + 'static {
        self.svc.clone().oneshot(req)
    }
}

pub fn post(path: &str, key: Option<&str>, body: &'static str) -> Request<Full<Bytes>> {
    let mut b = Request::post(path);
    if let Some(key) = key {
        b = b.header("idempotency-key", format!("\"{key}\""));
    }
    b.body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

pub fn replayed(r: &Response<Bytes>) -> bool {
    r.headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

#[track_caller]
pub fn assert_problem(r: &Response<Bytes>, status: u16) {
    assert_eq!(r.status().as_u16(), status, "{:?}", r.body());
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let body = std::str::from_utf8(r.body()).unwrap();
    assert!(body.contains(&format!("\"status\":{status}")), "{body}");
}

/// The behaviour every store gives the layer, one test per rule. `$store` is an expression
/// making a fresh store (it may `.await`); `$paused` whether the tests run on paused time.
#[macro_export]
macro_rules! behaviour {
    ($paused:literal, $store:expr) => {
        use std::time::Duration;
        use $crate::common::*;

        #[tokio::test(start_paused = $paused)]
        async fn a_completed_answer_is_replayed_and_the_handler_runs_once() {
            let h = Harness::new($store);
            let key = fresh_key("replay");
            let first = h.post("/ok", Some(&key), "{}").await;
            assert_eq!(first.status(), 201);
            assert!(!replayed(&first));
            let again = h.post("/ok", Some(&key), "{}").await;
            assert_eq!(again.status(), 201);
            assert!(replayed(&again));
            assert_eq!(again.body(), "run 1");
            assert_eq!(again.headers()["x-run"], "1");
            assert_eq!(h.runs(), 1);
        }

        #[tokio::test(start_paused = $paused)]
        async fn one_key_with_another_body_is_422() {
            let h = Harness::new($store);
            let key = fresh_key("mismatch");
            h.post("/ok", Some(&key), "{\"amount\":1}").await;
            assert_problem(&h.post("/ok", Some(&key), "{\"amount\":2}").await, 422);
            assert_problem(&h.post("/other", Some(&key), "{\"amount\":1}").await, 422);
            assert_eq!(h.runs(), 1);
        }

        #[tokio::test(start_paused = $paused)]
        async fn a_duplicate_in_flight_is_409_then_replayed() {
            let h = Harness::new($store);
            let key = fresh_key("inflight");
            let original = tokio::spawn(h.send(post("/slow", Some(&key), "")));
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_problem(&h.post("/slow", Some(&key), "").await, 409);
            assert_eq!(original.await.unwrap().unwrap().status(), 201);
            assert!(replayed(&h.post("/slow", Some(&key), "").await));
            assert_eq!(h.runs(), 1);
        }

        #[tokio::test(start_paused = $paused)]
        async fn a_duplicate_may_wait_for_the_original_answer() {
            let h = Harness::with(
                backstop::idempotency::IdempotencyLayer::builder($store),
                |c| c.wait_in_flight(Duration::from_secs(2)),
            );
            let key = fresh_key("wait");
            let original = tokio::spawn(h.send(post("/slow", Some(&key), "")));
            tokio::time::sleep(Duration::from_millis(50)).await;
            let dup = h.post("/slow", Some(&key), "").await;
            assert!(replayed(&dup), "{dup:?}");
            assert_eq!(dup.body(), "run 1");
            original.await.unwrap().unwrap();
            assert_eq!(h.runs(), 1);
        }

        #[tokio::test(start_paused = $paused)]
        async fn a_5xx_is_the_keys_answer_replayed_and_another_body_is_422() {
            let h = Harness::new($store);
            let key = fresh_key("fail");
            assert_eq!(h.post("/fail", Some(&key), "").await.status(), 500);
            let again = h.post("/fail", Some(&key), "").await;
            assert_eq!(again.status(), 500);
            assert!(replayed(&again), "{again:?}");
            assert_eq!(again.body(), "run 1");
            assert_problem(&h.post("/fail", Some(&key), "{\"other\":1}").await, 422);
            assert_eq!(h.runs(), 1);
        }

        #[tokio::test(start_paused = $paused)]
        async fn an_error_and_a_panic_leave_a_record_that_the_request_ran() {
            let h = Harness::new($store);
            let key = fresh_key("err");
            assert!(h.send(post("/err", Some(&key), "")).await.is_err());
            let dup = h.post("/err", Some(&key), "").await;
            assert_problem(&dup, 409);
            assert!(dup.headers().get("retry-after").is_none(), "{dup:?}");
            assert_eq!(h.runs(), 1);
            let key = fresh_key("panic");
            let panicked = tokio::spawn(h.send(post("/panic", Some(&key), ""))).await;
            assert!(panicked.unwrap_err().is_panic());
            // The handler started: the retry does not run it again.
            let dup = h.post("/panic", Some(&key), "").await;
            assert_problem(&dup, 409);
            assert!(dup.headers().get("retry-after").is_none(), "{dup:?}");
            assert_eq!(h.runs(), 2);
        }

        #[tokio::test(start_paused = $paused)]
        async fn a_dropped_request_is_never_run_again_even_after_the_lock_expires() {
            let h = Harness::with(
                backstop::idempotency::IdempotencyLayer::builder($store),
                |c| c.lock_timeout(Duration::from_millis(500)),
            );
            let key = fresh_key("dropped");
            let cut = tokio::time::timeout(
                Duration::from_millis(50),
                h.send(post("/slow", Some(&key), "")),
            );
            assert!(cut.await.is_err(), "the caller went away");
            for wait in [50, 600] {
                tokio::time::sleep(Duration::from_millis(wait)).await;
                let dup = h.post("/slow", Some(&key), "").await;
                assert_problem(&dup, 409);
                assert!(dup.headers().get("retry-after").is_none(), "{dup:?}");
            }
            assert_eq!(h.runs(), 1);
        }

        #[tokio::test(start_paused = $paused)]
        async fn only_an_answer_marked_not_executed_releases_the_key() {
            let h = Harness::new($store);
            let key = fresh_key("nothing");
            assert_eq!(h.post("/nothing", Some(&key), "").await.status(), 503);
            let again = h.post("/nothing", Some(&key), "").await;
            assert!(!replayed(&again), "{again:?}");
            assert_eq!(h.runs(), 2);
            // A `Rejection` alone says who answered, not that nothing happened: stored.
            let key = fresh_key("reject");
            assert_eq!(h.post("/reject", Some(&key), "").await.status(), 503);
            let again = h.post("/reject", Some(&key), "").await;
            assert_eq!(again.status(), 503);
            assert!(replayed(&again), "{again:?}");
            let key = fresh_key("bad");
            assert_eq!(h.post("/bad", Some(&key), "").await.status(), 400);
            assert!(replayed(&h.post("/bad", Some(&key), "").await));
            assert_eq!(h.runs(), 4);
        }

        #[tokio::test(start_paused = $paused)]
        async fn the_handlers_own_429_and_408_are_stored_and_replayed() {
            // "Not now" from a handler that ran is still its answer: it may have done part
            // of the work; a handler that did nothing says so with `NotExecuted`.
            let h = Harness::new($store);
            for (path, status) in [("/busy", 429), ("/timeout", 408)] {
                let key = fresh_key(path.trim_start_matches('/'));
                let before = h.runs();
                let first = h.post(path, Some(&key), "").await;
                assert_eq!(first.status(), status);
                assert!(!replayed(&first));
                let again = h.post(path, Some(&key), "").await;
                assert_eq!(again.status(), status, "{again:?}");
                assert!(replayed(&again), "a {status} was not stored: {again:?}");
                assert_eq!(h.runs(), before + 1);
            }
        }

        #[tokio::test(start_paused = $paused)]
        async fn keys_are_checked_and_may_be_required() {
            let h = Harness::new($store);
            // No key, not required: runs every time.
            h.post("/ok", None, "").await;
            h.post("/ok", None, "").await;
            assert_eq!(h.runs(), 2);
            for bad in ["\"\"", "\"caf\u{e9}\"", &"k".repeat(256), "\"unterminated"] {
                let req = http::Request::post("/ok")
                    .header(
                        "idempotency-key",
                        http::HeaderValue::from_bytes(bad.as_bytes()).unwrap(),
                    )
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap();
                assert_problem(&h.send(req).await.unwrap(), 400);
            }
            assert_eq!(h.runs(), 2);
            let strict = Harness::with(
                backstop::idempotency::IdempotencyLayer::builder($store),
                |c| c.require_key(true),
            );
            assert_problem(&strict.post("/ok", None, "").await, 400);
            assert_eq!(strict.runs(), 0);
            // A bare token works as well as a string.
            let key = fresh_key("bare");
            let req = || {
                http::Request::post("/ok")
                    .header("idempotency-key", key.as_str())
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap()
            };
            strict.send(req()).await.unwrap();
            assert!(replayed(&strict.send(req()).await.unwrap()));
        }

        #[tokio::test(start_paused = $paused)]
        async fn a_body_too_large_to_fingerprint_is_413() {
            let h = Harness::with(
                backstop::idempotency::IdempotencyLayer::builder($store),
                |c| c.max_body_bytes(8),
            );
            let key = fresh_key("large");
            assert_problem(&h.post("/ok", Some(&key), "123456789").await, 413);
            assert_eq!(h.post("/ok", Some(&key), "12345678").await.status(), 201);
            assert_eq!(h.runs(), 1);
        }

        #[tokio::test(start_paused = $paused)]
        async fn an_answer_above_the_cap_is_sent_whole_and_never_run_again() {
            let h = Harness::with(
                backstop::idempotency::IdempotencyLayer::builder($store),
                |c| {
                    c.max_body_bytes(1024)
                        .lock_timeout(Duration::from_millis(500))
                },
            );
            let key = fresh_key("big");
            let first = h.post("/big", Some(&key), "").await;
            assert_eq!(first.status(), 201);
            assert_eq!(first.body().len(), 4096);
            assert!(!replayed(&first));
            // Not stored: the key records that its request ran. A duplicate, before and long
            // after the lock would have expired, is 409 without Retry-After, never a rerun.
            for wait in [0, 600, 5_000] {
                tokio::time::sleep(Duration::from_millis(wait)).await;
                let dup = h.post("/big", Some(&key), "").await;
                assert_problem(&dup, 409);
                assert!(replayed(&dup));
                assert!(dup.headers().get("retry-after").is_none(), "{dup:?}");
            }
            // Another request under the key is still a reuse.
            assert_problem(&h.post("/ok", Some(&key), "").await, 422);
            assert_eq!(h.runs(), 1);
        }

        #[tokio::test(start_paused = $paused)]
        async fn other_methods_pass_through_and_answers_expire() {
            let h = Harness::with(
                backstop::idempotency::IdempotencyLayer::builder($store),
                |c| c.ttl(Duration::from_millis(500)),
            );
            let key = fresh_key("get");
            for _ in 0..2 {
                let req = http::Request::get("/ok")
                    .header("idempotency-key", key.as_str())
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap();
                assert!(!replayed(&h.send(req).await.unwrap()));
            }
            assert_eq!(h.runs(), 2);
            h.post("/ok", Some(&key), "").await;
            assert!(replayed(&h.post("/ok", Some(&key), "").await));
            tokio::time::sleep(Duration::from_millis(600)).await;
            assert!(!replayed(&h.post("/ok", Some(&key), "").await));
            assert_eq!(h.runs(), 4);
        }

        #[tokio::test(start_paused = $paused)]
        async fn the_caller_identity_is_part_of_the_fingerprint() {
            let h = Harness::with(
                backstop::idempotency::IdempotencyLayer::builder($store),
                |c| {
                    c.identity(|parts| {
                        parts
                            .headers
                            .get("x-user")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned)
                    })
                },
            );
            let key = fresh_key("identity");
            let as_user = |user: &'static str| {
                let mut req = post("/ok", Some(&key), "");
                req.headers_mut()
                    .insert("x-user", http::HeaderValue::from_static(user));
                req
            };
            assert_eq!(h.send(as_user("alice")).await.unwrap().status(), 201);
            assert!(replayed(&h.send(as_user("alice")).await.unwrap()));
            // Each caller has its own keys: mallory's request with alice's key is mallory's
            // own (it runs, and replays to mallory only), neither a 422 nor alice's answer.
            let mallory = h.send(as_user("mallory")).await.unwrap();
            assert_eq!(mallory.status(), 201);
            assert!(!replayed(&mallory));
            assert_eq!(mallory.body(), "run 2");
            let again = h.send(as_user("mallory")).await.unwrap();
            assert!(replayed(&again));
            assert_eq!(again.body(), "run 2");
            // A request without an identity has a space of its own too.
            let anonymous = h.send(post("/ok", Some(&key), "")).await.unwrap();
            assert_eq!(anonymous.body(), "run 3");
            assert_eq!(h.send(as_user("alice")).await.unwrap().body(), "run 1");
            assert_eq!(h.runs(), 3);
        }
    };
}

/// Every Duration knob of the layer at zero, 1 ns and `Duration::MAX` (and the longest wait
/// below the longest lock), over stores made by `store`: each is refused by `build`, naming
/// one of the knobs its row set, or works: the first request is answered by the handler, a
/// duplicate by a replay or a rerun after its answer expired; nothing panics. (The store's
/// timeout and `Retry-After` are constants, 1 s each: the tests of a slow or failing store
/// check them.)
pub async fn every_duration_knob_is_refused_or_honoured<St: Store>(store: impl Fn() -> St) {
    type Tune<St> = Box<dyn Fn(IdempotencyConfig<St>) -> IdempotencyConfig<St>>;
    let mut rows: Vec<(&[&str], Duration, Tune<St>)> = Vec::new();
    for value in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
        rows.push((&["ttl"], value, Box::new(move |c| c.ttl(value))));
        rows.push((
            &["lock_timeout"],
            value,
            Box::new(move |c| c.lock_timeout(value)),
        ));
        rows.push((
            &["wait_in_flight"],
            value,
            Box::new(move |c| c.wait_in_flight(value)),
        ));
    }
    let longest_wait = Duration::MAX - Duration::from_nanos(1);
    rows.push((
        &["lock_timeout", "wait_in_flight"],
        longest_wait,
        Box::new(move |c| c.lock_timeout(Duration::MAX).wait_in_flight(longest_wait)),
    ));
    for (knobs, value, tune) in rows {
        let row = format!("{knobs:?} = {value:?}");
        let runs = Arc::new(AtomicUsize::new(0));
        let config = tune(IdempotencyLayer::builder(store()));
        let layer = match config.build() {
            Err(e) => {
                assert!(knobs.contains(&e.knob()), "{row}: refused naming {e}");
                continue;
            }
            Ok(layer) => layer,
        };
        let h = Harness::layered(layer, runs.clone(), handler(runs));
        let key = fresh_key("knob");
        let first = h.post("/ok", Some(&key), "").await;
        assert_eq!(first.status(), 201, "{row}: {first:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
        let dup = h.post("/ok", Some(&key), "").await;
        let tiny = value < Duration::from_millis(5);
        match dup.status().as_u16() {
            201 if replayed(&dup) => {}
            // A rerun only once the answer expired (a ttl below the wait above), or its claim
            // did before the answer came (a lock shorter than a store's round trip).
            201 => assert!(
                tiny && (knobs.contains(&"ttl") || knobs.contains(&"lock_timeout")),
                "{row}: ran again"
            ),
            // A 409 here is a key its answer never reached: a knob the store cannot honour.
            _ => panic!("{row}: {dup:?}"),
        }
    }
}
