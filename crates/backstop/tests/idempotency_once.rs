//! "Once": N concurrent duplicates of one key run the handler's side effect exactly once,
//! and every other duplicate is answered 409 or with the replayed answer
//! (`Idempotent-Replayed: true`). Duplicates come as tasks of a multi-thread runtime and as
//! OS threads each with its own runtime (for Redis: each thread a server of a fleet, with its
//! own connection and layer), against both stores.
//!
//! Then a seeded property over interleavings of duplicates, cancels (the caller drops the
//! future after the handler started) and handler errors (both leave a record that the
//! request ran: duplicates get 409 until it expires) and expiry of claims and answers, on paused time against the memory store: a
//! checker replays the observed runs through the store's rules and says what each request
//! had to get. (Redis cannot run on paused time: its clock is its own; the suite and the
//! concurrent tests cover it.)

mod common;

use backstop::idempotency::{IdempotencyLayer, MemoryStore, Store};
use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::{
    collections::HashMap,
    sync::{
        Arc, Barrier, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tower::{BoxError, service_fn};

const DUPLICATES: usize = 24;

/// What the duplicates got: exactly one fresh 201, and only 409s and replays of it besides.
#[track_caller]
fn assert_once(answers: &[Response<Bytes>], runs: usize) {
    assert_eq!(runs, 1, "the side effect ran {runs} times");
    let fresh: Vec<_> = answers
        .iter()
        .filter(|r| r.status() == StatusCode::CREATED && !replayed(r))
        .collect();
    assert_eq!(fresh.len(), 1, "one request ran the handler");
    let original = fresh[0].body();
    for r in answers {
        match r.status() {
            StatusCode::CREATED if replayed(r) => assert_eq!(r.body(), original),
            StatusCode::CREATED => {}
            _ => assert_problem(r, 409),
        }
    }
}

/// `DUPLICATES` tasks of a multi-thread runtime, released together, on `path` (`/slow`: the
/// original is still running when the others arrive; `/ok`: some may come after it answered).
async fn tasks_against<St: Store>(store: St, path: &'static str) {
    let h = Harness::new(store);
    let key = fresh_key("tasks");
    let barrier = Arc::new(tokio::sync::Barrier::new(DUPLICATES));
    let mut handles = Vec::new();
    for _ in 0..DUPLICATES {
        let barrier = barrier.clone();
        let send = h.send(post(path, Some(&key), "{\"amount\":100}"));
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            send.await.unwrap()
        }));
    }
    let mut answers = Vec::new();
    for handle in handles {
        answers.push(handle.await.unwrap());
    }
    assert_once(&answers, h.runs());
    if path == "/slow" {
        let conflicts = answers.iter().filter(|r| r.status() == 409).count();
        assert_eq!(conflicts, DUPLICATES - 1, "the original was in flight");
    }
    // Afterwards, one more duplicate is a replay.
    assert!(replayed(
        &h.post(path, Some(&key), "{\"amount\":100}").await
    ));
    assert_eq!(h.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_as_tasks_run_once_against_the_memory_store() {
    tasks_against(MemoryStore::new(), "/slow").await;
    tasks_against(MemoryStore::new(), "/ok").await;
}

/// `DUPLICATES` OS threads, each with its own current-thread runtime, released together by a
/// barrier; `layer_for` makes each thread's store (inside its runtime).
fn threads_against<St, F>(store_for: F, path: &'static str)
where
    St: Store,
    F: Fn() -> std::pin::Pin<Box<dyn Future<Output = St>>> + Send + Sync + 'static,
{
    let runs = Arc::new(AtomicUsize::new(0));
    let key = Arc::new(fresh_key("threads"));
    let barrier = Arc::new(Barrier::new(DUPLICATES));
    let store_for = Arc::new(store_for);
    let threads: Vec<_> = (0..DUPLICATES)
        .map(|_| {
            let (runs, key, barrier, store_for) = (
                runs.clone(),
                key.clone(),
                barrier.clone(),
                store_for.clone(),
            );
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let store = store_for().await;
                    let h = Harness::around(
                        IdempotencyLayer::builder(store),
                        runs.clone(),
                        handler(runs),
                    );
                    let req = post(path, Some(&key), "{\"amount\":100}");
                    barrier.wait();
                    h.send(req).await.unwrap()
                })
            })
        })
        .collect();
    let answers: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_once(&answers, runs.load(Ordering::SeqCst));
}

#[test]
fn duplicates_as_threads_run_once_against_the_memory_store() {
    for path in ["/slow", "/ok"] {
        // One store for the process, shared by every thread's runtime.
        let shared = MemoryStore::new();
        threads_against(
            move || {
                let store = shared.clone();
                Box::pin(async move { store })
            },
            path,
        );
    }
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use backstop::idempotency::RedisStore;
    use common::redis_server::{RedisServer, available};

    async fn connect() -> RedisStore {
        RedisStore::connect(&RedisServer::shared().url())
            .await
            .expect("the shared redis-server answers")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn duplicates_as_tasks_run_once_against_redis() {
        if !available() {
            return;
        }
        tasks_against(connect().await, "/slow").await;
        tasks_against(connect().await, "/ok").await;
    }

    #[test]
    fn duplicates_as_threads_of_a_fleet_run_once_against_redis() {
        if !available() {
            return;
        }
        for path in ["/slow", "/ok"] {
            // Each thread a server of its own: its own connection, its own layer.
            threads_against(|| Box::pin(connect()), path);
        }
    }
}

// The property: interleavings on paused time.
//
// Times are chosen so that no two kinds of event meet at one millisecond (arrivals at
// multiples of 10 ms; handler ends at 3 mod 10; cancels at 6 mod 10; lock expiry at 5 mod 10;
// answer expiry at 4 mod 10, a cancelled request's record expiry at 7 mod 10), so the checker needs no rule for ties, except duplicates that
// arrive together, of which exactly one may run.

/// What a request asks its handler to do (header `x-do`; not part of the fingerprint).
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Answer 201 after this many ms.
    Ok(u64),
    /// Fail (`Err`) after this many ms.
    Err(u64),
    /// Take this many ms; the caller gives up after `cut` ms (the future is dropped).
    Cut { takes: u64, cut: u64 },
}

/// One run of the handler, as it recorded itself.
#[derive(Debug, Clone)]
struct Run {
    request: usize,
    started: u64,
    body: String,
}

/// What a request got.
#[derive(Debug)]
enum Got {
    Fresh(String),
    Replayed(String),
    Conflict,
    Failed,
    Cut,
}

/// A handler that does what `x-do` says and records each run with the request's id
/// (`x-id`) and its start (ms since `t0`).
fn scripted(
    runs: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<Run>>>,
    t0: tokio::time::Instant,
) -> impl Handler {
    service_fn(move |req: Request<Full<Bytes>>| {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        let header = |name: &str| req.headers()[name].to_str().unwrap().to_owned();
        let (request, what) = (header("x-id").parse().unwrap(), header("x-do"));
        let body = format!("run {n}");
        log.lock().unwrap().push(Run {
            request,
            started: t0.elapsed().as_millis() as u64,
            body: body.clone(),
        });
        async move {
            let (verb, ms) = what.split_once(':').unwrap();
            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
            if verb == "err" {
                return Err::<_, BoxError>("the handler failed".into());
            }
            let mut r = Response::new(Full::new(Bytes::from(body)));
            *r.status_mut() = StatusCode::CREATED;
            Ok(r)
        }
    })
}

struct Case {
    lock: u64,
    ttl: u64,
    /// (key, arrival ms, kind), in no particular order.
    requests: Vec<(usize, u64, Kind)>,
}

fn case(seed: u64) -> Case {
    let mut rng = fastrand::Rng::with_seed(seed);
    let keys = rng.usize(1..=3);
    let n = rng.usize(1..=14);
    let requests = (0..n)
        .map(|_| {
            // Arrivals bunch on a few instants, so same-instant duplicates are common.
            let at = 30 * rng.u64(0..40);
            let takes = 10 * rng.u64(1..=30) + 3;
            let kind = match rng.u8(0..10) {
                0..=4 => Kind::Ok(takes),
                5..=6 => Kind::Err(takes),
                _ => Kind::Cut {
                    takes,
                    cut: 10 * rng.u64(0..(takes / 10)) + 6,
                },
            };
            (rng.usize(0..keys), at, kind)
        })
        .collect();
    Case {
        // Longer than any handler runs (303 ms): a claim never expires under a live handler.
        lock: 10 * rng.u64(31..=60) + 5,
        ttl: 10 * rng.u64(5..=60) + 1,
        requests,
    }
}

/// Runs a case on paused time and returns what each request got and the handler's runs.
async fn play(case: &Case) -> (Vec<Got>, Vec<Run>) {
    let t0 = tokio::time::Instant::now();
    let runs = Arc::new(AtomicUsize::new(0));
    let log = Arc::new(Mutex::new(Vec::new()));
    let h = Harness::around(
        IdempotencyLayer::builder(MemoryStore::new())
            .lock_timeout(Duration::from_millis(case.lock))
            .ttl(Duration::from_millis(case.ttl)),
        runs.clone(),
        scripted(runs, log.clone(), t0),
    );
    let tag = fresh_key("prop");
    let tasks: Vec<_> = case
        .requests
        .iter()
        .enumerate()
        .map(|(id, &(key, at, kind))| {
            let mut req = post("/charge", Some(&format!("{tag}-{key}")), "{\"amount\":1}");
            let what = match kind {
                Kind::Ok(ms) => format!("ok:{ms}"),
                Kind::Err(ms) => format!("err:{ms}"),
                Kind::Cut { takes, .. } => format!("ok:{takes}"),
            };
            req.headers_mut().insert("x-do", what.parse().unwrap());
            req.headers_mut().insert("x-id", id.into());
            let svc = h.svc.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(t0 + Duration::from_millis(at)).await;
                let send = tower::ServiceExt::oneshot(svc, req);
                let result = match kind {
                    Kind::Cut { cut, .. } => {
                        match tokio::time::timeout(Duration::from_millis(cut), send).await {
                            Ok(r) => r,
                            Err(_) => return Got::Cut,
                        }
                    }
                    _ => send.await,
                };
                match result {
                    Err(_) => Got::Failed,
                    Ok(r) if r.status() == 409 => Got::Conflict,
                    Ok(r) if replayed(&r) => {
                        Got::Replayed(String::from_utf8(r.body().to_vec()).unwrap())
                    }
                    Ok(r) => {
                        assert_eq!(r.status(), 201, "{r:?}");
                        Got::Fresh(String::from_utf8(r.body().to_vec()).unwrap())
                    }
                }
            })
        })
        .collect();
    let mut got = Vec::new();
    for task in tasks {
        got.push(task.await.unwrap());
    }
    let runs = log.lock().unwrap().clone();
    (got, runs)
}

/// What a key holds at `t` after its last run (`kind` started at `started`).
#[derive(Debug, PartialEq)]
enum Held {
    Free,
    InFlight,
    Done(String),
    /// The request ran and left no answer to replay (a handler error, a cancel): 409.
    Ran,
}

fn held(case: &Case, last: Option<(&Run, Kind)>, t: u64) -> Held {
    let Some((run, kind)) = last else {
        return Held::Free;
    };
    let s = run.started;
    match kind {
        Kind::Ok(d) if t < s + d => Held::InFlight,
        Kind::Ok(d) if t < s + d + case.ttl => Held::Done(run.body.clone()),
        Kind::Err(d) if t < s + d => Held::InFlight,
        Kind::Err(d) if t < s + d + case.ttl => Held::Ran,
        // Dropped after the handler started: the key records that it ran, for `ttl`.
        Kind::Cut { cut, .. } if t < s + cut => Held::InFlight,
        Kind::Cut { cut, .. } if t < s + cut + case.ttl => Held::Ran,
        _ => Held::Free,
    }
}

/// Checks what each request got against the store's rules, key by key, in arrival order.
fn check(seed: u64, case: &Case, got: &[Got], runs: &[Run]) {
    let ran: HashMap<usize, &Run> = runs.iter().map(|r| (r.request, r)).collect();
    assert_eq!(ran.len(), runs.len(), "seed {seed}: a request ran twice");
    let mut order: Vec<usize> = (0..case.requests.len()).collect();
    // Arrival order; among duplicates arriving together, the one that ran first.
    order.sort_by_key(|&i| (case.requests[i].1, !ran.contains_key(&i)));
    let mut last: HashMap<usize, (&Run, Kind)> = HashMap::new();
    for i in order {
        let (key, at, kind) = case.requests[i];
        let state = held(case, last.get(&key).copied(), at);
        let ctx = || {
            format!(
                "seed {seed}: request {i} {kind:?} at {at} ms found {state:?}, got {:?}",
                got[i]
            )
        };
        match (&state, &got[i], ran.get(&i)) {
            (Held::Free, _, Some(run)) => {
                assert_eq!(run.started, at, "{}", ctx());
                match (kind, &got[i]) {
                    (Kind::Ok(_), Got::Fresh(body)) => assert_eq!(body, &run.body, "{}", ctx()),
                    (Kind::Err(_), Got::Failed) | (Kind::Cut { .. }, Got::Cut) => {}
                    _ => panic!("{}", ctx()),
                }
                last.insert(key, (run, kind));
            }
            (Held::Free, _, None) => panic!("a free key must run: {}", ctx()),
            (_, _, Some(_)) => panic!("a duplicate side effect: {}", ctx()),
            (Held::InFlight | Held::Ran, Got::Conflict, None) => {}
            (Held::Done(body), Got::Replayed(replay), None) => {
                assert_eq!(body, replay, "{}", ctx());
            }
            _ => panic!("{}", ctx()),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn any_interleaving_of_duplicates_cancels_errors_and_expiry_keeps_once() {
    for seed in 0..300 {
        let case = case(seed);
        let (got, runs) = play(&case).await;
        check(seed, &case, &got, &runs);
    }
}
