//! An outside attack on the restructured client stack (issue 38), from the caller's side.
//! Tests named `was_finding_*` showed a defect, since fixed (they failed on the code as
//! attacked); tests named `pinned_*` pin a promise that held.

use backstop::client::attempt::AttemptBound;
use backstop::client::overload::bulkhead::BulkheadLayer;
use backstop::client::retry::hedge::Hedging;
use backstop::client::retry::{Budget, RetryConfig, backoff};
use backstop::client::{call_info, error_info};
use backstop::deadline::Deadline;
use backstop::{BoxError, ReplayBody};
use backstop_test_support::{MS, S, told_ms};
use futures_util::stream::{FuturesUnordered, StreamExt};
use http::{Request, Response};
use std::{
    convert::Infallible,
    future::Future,
    pin::{Pin, pin},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::{Instant, sleep};
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

type Req = Request<ReplayBody<String>>;

/// What the dependency heard: (ms since t0, grpc-timeout values, idempotency keys, method).
#[derive(Debug, Clone)]
struct Heard {
    at_ms: u64,
    timeouts: Vec<String>,
    key: Option<String>,
}

#[derive(Debug, Clone, Default)]
struct Log(Arc<Mutex<Vec<Heard>>>);

impl Log {
    fn push(&self, t0: Instant, req: &Req) {
        self.0.lock().unwrap().push(Heard {
            at_ms: t0.elapsed().as_millis() as u64,
            timeouts: req
                .headers()
                .get_all("grpc-timeout")
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect(),
            key: req
                .headers()
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned()),
        });
    }
    fn all(&self) -> Vec<Heard> {
        self.0.lock().unwrap().clone()
    }
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// The HTTP preset with the throttle off (nothing here is about its refusals).
fn unthrottled() -> backstop::ClientBuilder<backstop::HttpClassifier> {
    backstop::client::http().throttle(None)
}

/// A GET whose body is one byte longer than the retry layer replays (64 KiB): sent once.
fn too_long_to_replay() -> Request<http_body_util::Full<bytes::Bytes>> {
    let big = vec![b'x'; 64 * 1024 + 1];
    Request::get("http://svc/x")
        .body(http_body_util::Full::new(bytes::Bytes::from(big)))
        .unwrap()
}

/// A scripted transport: `answer(attempt number from 1)` gives (latency, status, headers);
/// latency `None` hangs.
fn scripted(
    log: Log,
    answer: impl Fn(usize) -> (Option<Duration>, u16, Vec<(&'static str, String)>)
    + Clone
    + Send
    + Sync
    + 'static,
) -> impl Service<Req, Response = Response<String>, Error = Infallible, Future: Send> + Clone + Send
{
    let t0 = Instant::now();
    service_fn(move |req: Req| {
        log.push(t0, &req);
        let n = log.len();
        let (latency, status, headers) = answer(n);
        async move {
            match latency {
                Some(d) => sleep(d).await,
                None => std::future::pending::<()>().await,
            }
            let mut r = Response::builder().status(status);
            for (k, v) in headers {
                r = r.header(k, v);
            }
            Ok(r.body(String::new()).unwrap())
        }
    })
}

/// A budget that counts what it lends and what comes back, and always lends.
#[derive(Debug, Default)]
struct Counting {
    withdrawn: AtomicUsize,
    refunded: AtomicUsize,
}

impl Budget for Counting {
    fn record_success(&self) {}
    fn try_withdraw(&self) -> bool {
        self.withdrawn.fetch_add(1, Ordering::SeqCst);
        true
    }
    fn refund(&self) {
        self.refunded.fetch_add(1, Ordering::SeqCst);
    }
    fn balance(&self) -> f64 {
        1.0
    }
}

impl Counting {
    fn kept(&self) -> usize {
        self.withdrawn.load(Ordering::SeqCst) - self.refunded.load(Ordering::SeqCst)
    }
}

fn get(uri: &str) -> Request<String> {
    Request::get(uri).body(String::new()).unwrap()
}

fn post(uri: &str) -> Request<String> {
    Request::post(uri).body("charge".to_owned()).unwrap()
}

fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    f.poll(&mut cx)
}

// ---------------------------------------------------------------------------------------
// RFC 9110 Retry-After / gRFC A6 pushback: a minimum, never shortened
// ---------------------------------------------------------------------------------------

/// Was a defect (medium), fixed. README: "`Retry-After` is a minimum (RFC 9110)"; gRFC A6:
/// with `grpc-retry-pushback-ms` the client retries after exactly that delay. A server that
/// said "come back in 60 s" (or pushed back 45 s) was retried after 30 s (the hint clamped to
/// 30 s, then used), earlier than the server allowed. A hint beyond what the client waits for
/// now ends the retries (`GiveUp::Hint`): no attempt goes before the server's time.
#[tokio::test(start_paused = true)]
async fn was_finding_a_hint_longer_than_30s_is_retried_early() {
    for grpc in [false, true] {
        let log = Log::default();
        let transport = scripted(log.clone(), move |n| match (n, grpc) {
            (1, false) => (Some(MS), 503, vec![("retry-after", "60".to_owned())]),
            (1, true) => (
                Some(MS),
                200,
                vec![
                    ("content-type", "application/grpc".to_owned()),
                    ("grpc-status", "14".to_owned()),
                    ("grpc-retry-pushback-ms", "45000".to_owned()),
                ],
            ),
            (_, false) => (Some(MS), 200, vec![]),
            (_, true) => (
                Some(MS),
                200,
                vec![
                    ("content-type", "application/grpc".to_owned()),
                    ("grpc-status", "0".to_owned()),
                ],
            ),
        });
        let asked = if grpc { 45_000 } else { 60_000 };
        let gave_up = if grpc {
            let client = backstop::client::grpc().throttle(None).build().unwrap();
            let res = client.layer(transport).oneshot(grpc_req(None)).await;
            call_info(&res.unwrap()).gave_up()
        } else {
            let client = unthrottled().build().unwrap();
            let res = client.layer(transport).oneshot(get("http://svc/x")).await;
            call_info(&res.unwrap()).gave_up()
        };
        assert_eq!(
            gave_up,
            Some(backstop::client::retry::GiveUp::Hint),
            "grpc {grpc}"
        );
        let heard = log.all();
        assert_eq!(heard.len(), 1, "grpc {grpc}: {heard:?}");
        for h in &heard[1..] {
            assert!(
                h.at_ms >= asked,
                "a retry {} ms after a hint of {asked} ms",
                h.at_ms
            );
        }
    }
}

/// Pinned: a Retry-After that cannot fit before the deadline returns the dependency's answer
/// at once (nothing is slept for nothing, nothing answered past the deadline).
#[tokio::test(start_paused = true)]
async fn pinned_retry_after_past_the_deadline_answers_at_once() {
    let log = Log::default();
    let transport = scripted(log.clone(), |_| {
        (Some(MS), 503, vec![("retry-after", "5".to_owned())])
    });
    let client = unthrottled().timeout(S).build().unwrap().layer(transport);
    let start = Instant::now();
    let res = client.oneshot(get("http://svc/x")).await.unwrap();
    assert_eq!(res.status(), 503);
    assert!(start.elapsed() < 10 * MS, "{:?}", start.elapsed());
    assert_eq!(log.len(), 1);
    assert_eq!(call_info(&res).attempts(), 1);
}

// ---------------------------------------------------------------------------------------
// grpc-timeout: once per attempt, the time really left
// ---------------------------------------------------------------------------------------

/// Pinned: every attempt (retries and hedges) carries exactly one `grpc-timeout`, never more
/// than what is left of the deadline when it is sent.
#[tokio::test(start_paused = true)]
async fn pinned_grpc_timeout_once_per_attempt_never_more_than_left() {
    for hedged in [false, true] {
        let log = Log::default();
        let transport = scripted(log.clone(), |n| match n {
            1 | 2 => (Some(Duration::from_millis(150)), 503, vec![]),
            _ => (Some(Duration::from_millis(40)), 200, vec![]),
        });
        let mut retry = RetryConfig::http()
            .backoff(backoff::constant(Duration::from_millis(30)))
            .max_attempts(3);
        if hedged {
            retry = retry.hedging(Hedging::new(Duration::from_millis(100)).max_attempts(3));
        }
        let client = unthrottled()
            .timeout(S)
            .retry(retry)
            .build()
            .unwrap()
            .layer(transport);
        let _ = client.oneshot(get("http://svc/x")).await;
        let heard = log.all();
        assert!(heard.len() >= 2, "{heard:?}");
        for h in &heard {
            assert_eq!(h.timeouts.len(), 1, "hedged {hedged}: {heard:?}");
            let told = told_ms(&h.timeouts[0]);
            assert!(
                told + h.at_ms <= 1000,
                "hedged {hedged}: told {told} ms at {} ms: {heard:?}",
                h.at_ms
            );
        }
    }
}

/// A `Buffer` around the built layer: the call runs on the buffer's worker, and the deadline a
/// caller puts on the request is what bounds it and what the server is told.
#[tokio::test(start_paused = true)]
async fn pinned_buffer_around_the_stack_keeps_the_request_deadline() {
    let log = Log::default();
    let transport = scripted(log.clone(), |_| (None, 200, vec![]));
    let client = ServiceBuilder::new()
        .buffer(8)
        .layer(unthrottled().attempt(AttemptBound::None).build().unwrap())
        .service(transport);
    let mut req = get("http://svc/x");
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_millis(300)));
    let start = Instant::now();
    let err = client.oneshot(req).await.unwrap_err();
    assert!(backstop::is_deadline_exceeded(&*err), "{err}");
    assert!(
        start.elapsed() <= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
    for h in log.all() {
        assert_eq!(h.timeouts.len(), 1);
        assert!(told_ms(&h.timeouts[0]) + h.at_ms <= 300, "{h:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Budget tokens never leaked
// ---------------------------------------------------------------------------------------

/// A transport whose `poll_ready` fails once it has been called once (a closed connection).
#[derive(Clone)]
struct DiesAfterOne {
    calls: Arc<AtomicUsize>,
}

impl Service<Req> for DiesAfterOne {
    type Response = Response<String>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<String>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.calls.load(Ordering::SeqCst) >= 1 {
            return Poll::Ready(Err("connection closed".into()));
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {
            sleep(MS).await;
            Ok(Response::builder().status(503).body(String::new()).unwrap())
        })
    }
}

/// Was a defect (low), fixed. A retry decided (token withdrawn) whose transport then refuses
/// to be ready is never sent:
/// its token must come back and the call must say 1 attempt, as it says for a retry the
/// deadline stopped before it was sent (`RetryState::unsent`).
#[tokio::test(start_paused = true)]
async fn was_finding_retry_whose_transport_fails_ready_counts_an_unsent_attempt() {
    let budget = Arc::new(Counting::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = unthrottled()
        .retry(RetryConfig::http().budget(budget.clone()))
        .build()
        .unwrap();
    let client = layer.clone().layer(DiesAfterOne {
        calls: calls.clone(),
    });
    let err = client.oneshot(get("http://svc/x")).await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(budget.kept(), 0, "a token kept for a retry never sent");
    let info = error_info(&*err).expect("a RetryError");
    let stats = layer.retry_layer().stats();
    assert_eq!(
        (info.attempts(), stats.retries),
        (1, 0),
        "one attempt was sent; the call says {info:?} ({err}), the stats {stats:?}"
    );
}

/// Pinned: calls dropped at every stage (in flight, in backoff, between hedges, while
/// waiting for a bulkhead permit), by `select!`, `FuturesUnordered` and poll-then-drop: every
/// token withdrawn is either spent on an attempt that was sent, or refunded.
#[tokio::test(start_paused = true)]
async fn pinned_budget_balanced_when_calls_are_dropped_anywhere() {
    for hedged in [false, true] {
        let budget = Arc::new(Counting::default());
        let sent = Arc::new(AtomicUsize::new(0));
        let s = sent.clone();
        let transport = service_fn(move |_req: Req| {
            s.fetch_add(1, Ordering::SeqCst);
            async {
                sleep(Duration::from_millis(20)).await;
                Ok::<_, Infallible>(Response::builder().status(503).body(String::new()).unwrap())
            }
        });
        let mut retry = RetryConfig::http()
            .budget(budget.clone())
            .backoff(backoff::constant(Duration::from_millis(15)))
            .max_attempts(5);
        if hedged {
            retry = retry.hedging(Hedging::new(Duration::from_millis(7)).max_attempts(5));
        }
        let layer = unthrottled()
            .bulkhead(BulkheadLayer::builder(3))
            .retry(retry)
            .build()
            .unwrap();
        let client = layer.clone().layer(transport);
        let mut set = FuturesUnordered::new();
        for i in 0..40u64 {
            let c = client.clone();
            set.push(async move {
                let call = c.oneshot(get("http://svc/x"));
                // Dropped after i ms (select! against a timer).
                tokio::select! {
                    _ = call => {}
                    _ = sleep(Duration::from_millis(i * 3)) => {}
                }
            });
        }
        while set.next().await.is_some() {}
        // And poll-then-drop.
        for _ in 0..5 {
            let mut call = pin!(client.clone().oneshot(get("http://svc/x")));
            let _ = poll_once(call.as_mut());
        }
        sleep(S).await;
        let sent = sent.load(Ordering::SeqCst);
        let stats = layer.retry_layer().stats();
        let first = stats.requests as usize;
        assert_eq!(
            budget.kept(),
            sent.saturating_sub(first.min(sent)),
            "hedged {hedged}: tokens kept {} for {sent} attempts of {first} calls (stats {stats:?})",
            budget.kept(),
        );
        assert_eq!(layer.bulkhead_layer().in_flight(), 0);
        assert_eq!(layer.bulkhead_layer().waiting(), 0);
    }
}

// ---------------------------------------------------------------------------------------
// Wakers: poll on one task, finish on another
// ---------------------------------------------------------------------------------------

/// Pinned: a call polled once with a no-op waker at each stage, then spawned, finishes (under
/// paused time a lost waker would hang it) and never past its deadline.
#[tokio::test(start_paused = true)]
async fn pinned_poll_then_spawn_at_every_stage_completes() {
    // (what the transport does, hedged, bulkhead pre-occupied)
    for stage in 0..4 {
        let log = Log::default();
        let transport = scripted(log.clone(), move |n| match (stage, n) {
            // 0: in flight, the attempt bound cuts it
            (0, _) => (None, 200, vec![]),
            // 1: backoff after a 503
            (1, 1) => (Some(MS), 503, vec![]),
            (1, _) => (Some(MS), 200, vec![]),
            // 2: between hedges
            (2, 1) => (None, 200, vec![]),
            (2, _) => (Some(Duration::from_millis(50)), 200, vec![]),
            // 3: waiting for a bulkhead permit
            _ => (Some(Duration::from_millis(100)), 200, vec![]),
        });
        let mut retry = RetryConfig::http().backoff(backoff::constant(Duration::from_millis(200)));
        if stage == 2 {
            retry = retry.hedging(Hedging::new(Duration::from_millis(100)));
        }
        let layer = unthrottled()
            .timeout(S)
            .attempt(AttemptBound::Fixed(Duration::from_millis(300)))
            .bulkhead(BulkheadLayer::builder(1))
            .retry(retry)
            .build()
            .unwrap();
        let client = layer.layer(transport);
        let blocker =
            (stage == 3).then(|| tokio::spawn(client.clone().oneshot(get("http://svc/y"))));
        tokio::task::yield_now().await;
        let start = Instant::now();
        let mut call = Box::pin(client.clone().oneshot(get("http://svc/x")));
        assert!(poll_once(call.as_mut()).is_pending());
        sleep(Duration::from_millis(20)).await;
        assert!(poll_once(call.as_mut()).is_pending());
        let done = tokio::time::timeout(Duration::from_secs(5), tokio::spawn(call))
            .await
            .unwrap_or_else(|_| panic!("stage {stage}: a lost waker: never finished"))
            .unwrap();
        assert!(start.elapsed() <= S, "stage {stage}: {:?}", start.elapsed());
        let _ = done;
        if let Some(b) = blocker {
            let _ = b.await;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Deadlines at every stage, gRPC: one whole DEADLINE_EXCEEDED, never later
// ---------------------------------------------------------------------------------------

fn grpc_req(timeout: Option<&str>) -> Request<String> {
    let mut b = Request::post("http://svc/pkg.Svc/Call").header("content-type", "application/grpc");
    if let Some(t) = timeout {
        b = b.header("grpc-timeout", t);
    }
    b.body(String::new()).unwrap()
}

fn grpc_status<B>(r: &Response<B>) -> Option<&str> {
    r.headers().get("grpc-status").map(|v| v.to_str().unwrap())
}

/// Pinned: a gRPC call whose deadline passes while it waits for a bulkhead permit, during a
/// backoff, during a hedge, or before it is sent, gets one trailers-only DEADLINE_EXCEEDED
/// (4), at its deadline or before, never an `Err` (tonic would say UNKNOWN).
#[tokio::test(start_paused = true)]
async fn pinned_grpc_deadline_at_every_stage_is_one_deadline_exceeded() {
    for stage in 1..4 {
        let t0 = Instant::now();
        let transport = service_fn(move |_req: Req| async move {
            let (latency, code) = match stage {
                1 => (Some(Duration::from_millis(50)), "14"),
                _ => (None, "0"),
            };
            match latency {
                Some(d) => sleep(d).await,
                None => std::future::pending::<()>().await,
            }
            let _ = t0;
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "application/grpc")
                    .header("grpc-status", code)
                    .body(String::new())
                    .unwrap(),
            )
        });
        let mut retry = RetryConfig::grpc().backoff(backoff::constant(Duration::from_millis(400)));
        if stage == 2 {
            retry = retry
                .idempotency(backstop::client::retry::Idempotency::All)
                .hedging(Hedging::new(Duration::from_millis(100)));
        }
        let layer = backstop::client::grpc()
            .throttle(None)
            .attempt(AttemptBound::None)
            .bulkhead(BulkheadLayer::builder(1).max_wait(Duration::from_secs(10)))
            .retry(retry)
            .build()
            .unwrap();
        let client = layer.layer(transport);
        if stage == 0 {
            // Hold the one permit with a call that hangs.
            let c = client.clone();
            tokio::spawn(c.oneshot(grpc_req(None)));
            tokio::task::yield_now().await;
        }
        let timeout = if stage == 3 { "1n" } else { "250m" };
        let start = Instant::now();
        let res = client.oneshot(grpc_req(Some(timeout))).await;
        let res = res.unwrap_or_else(|e| panic!("stage {stage}: an Err for gRPC: {e}"));
        if stage == 1 {
            // The backoff cannot fit: the dependency's answer, at once, says why.
            assert_eq!(grpc_status(&res), Some("14"), "{:?}", res.headers());
            assert_eq!(start.elapsed(), Duration::from_millis(50));
            assert_eq!(
                call_info(&res).gave_up(),
                Some(backstop::client::retry::GiveUp::Deadline)
            );
            continue;
        }
        assert_eq!(
            grpc_status(&res),
            Some("4"),
            "stage {stage}: {:?}",
            res.headers()
        );
        assert!(
            start.elapsed() <= Duration::from_millis(250),
            "stage {stage}: answered at {:?}",
            start.elapsed()
        );
    }
}

// ---------------------------------------------------------------------------------------
// A retried POST only when keyed
// ---------------------------------------------------------------------------------------

/// Pinned: an unkeyed POST whose attempt is cut by the bound is sent once; with keys on,
/// retried with the same key on every attempt, and the key is an sf-string (draft-ietf-
/// httpapi-idempotency-key-header).
#[tokio::test(start_paused = true)]
async fn pinned_post_retried_only_when_keyed_same_key_every_attempt() {
    for keyed in [false, true] {
        let log = Log::default();
        let transport = scripted(log.clone(), |n| match n {
            1 => (None, 200, vec![]),
            _ => (Some(MS), 200, vec![]),
        });
        let client = unthrottled()
            .timeout(S)
            .attempt(AttemptBound::Fixed(Duration::from_millis(200)))
            .idempotency_keys(keyed)
            .build()
            .unwrap()
            .layer(transport);
        let res = client.oneshot(post("http://svc/charge")).await;
        let heard = log.all();
        if keyed {
            assert!(res.is_ok());
            assert_eq!(heard.len(), 2);
            let key = heard[0].key.clone().unwrap();
            assert!(key.starts_with('"') && key.ends_with('"'), "{key}");
            assert_eq!(heard[1].key.as_deref(), Some(&*key));
        } else {
            let err = res.unwrap_err();
            assert!(backstop::is_attempt_timed_out(&*err), "{err}");
            assert_eq!(heard.len(), 1);
            assert_eq!(heard[0].key, None);
        }
    }
}

/// An unkeyed POST can never be retried, so its one attempt is its last: README "each attempt
/// sends grpc-timeout = the time that attempt has: the whole deadline when no retry could
/// follow it". Pinned: it is told the whole deadline and its bound is not cut to 80 %.
#[tokio::test(start_paused = true)]
async fn pinned_unkeyed_post_is_told_the_whole_deadline() {
    let log = Log::default();
    let transport = scripted(log.clone(), |_| {
        (Some(Duration::from_millis(900)), 200, vec![])
    });
    let client = unthrottled()
        .timeout(S)
        .attempt(AttemptBound::Fixed(Duration::from_secs(5)))
        .build()
        .unwrap()
        .layer(transport);
    let res = client.oneshot(post("http://svc/charge")).await;
    let heard = log.all();
    assert!(res.is_ok(), "{:?} {heard:?}", res.err());
    assert_eq!(told_ms(&heard[0].timeouts[0]), 1000, "{heard:?}");
}

// ---------------------------------------------------------------------------------------
// Misconfiguration at the edges
// ---------------------------------------------------------------------------------------

/// Pinned: every Duration knob of the short forms at 1 ns and `Duration::MAX` either fails to
/// build or serves a call without panicking, within a bounded time.
#[tokio::test(start_paused = true)]
async fn pinned_extreme_durations_never_panic_at_a_request() {
    let ns = Duration::from_nanos(1);
    let max = Duration::MAX;
    let mut built = Vec::new();
    for d in [ns, max] {
        built.push(backstop::client::http().timeout(d).build());
        built.push(
            backstop::client::http()
                .attempt(AttemptBound::Fixed(d))
                .build(),
        );
        built.push(
            backstop::client::http()
                .bulkhead(BulkheadLayer::builder(1).max_wait(d))
                .build(),
        );
        built.push(
            backstop::client::http()
                .retry(RetryConfig::http().backoff(backoff::constant(d)))
                .build(),
        );
        built.push(
            backstop::client::http()
                .retry(RetryConfig::http().hedging(Hedging::new(d)))
                .build(),
        );
        built.push(
            backstop::client::http()
                .retry(RetryConfig::http().reserve(d))
                .build(),
        );
    }
    for (i, layer) in built.into_iter().enumerate() {
        let Ok(layer) = layer else { continue };
        let log = Log::default();
        let transport = scripted(log.clone(), |n| match n {
            1 => (Some(MS), 503, vec![]),
            _ => (Some(MS), 200, vec![]),
        });
        let client = layer.layer(transport);
        let mut req = get("http://svc/x");
        req.extensions_mut()
            .insert(Deadline::after(Duration::from_secs(2)));
        let r = tokio::time::timeout(Duration::from_secs(3), client.oneshot(req)).await;
        assert!(r.is_ok(), "case {i}: no answer within its 2 s deadline");
    }
}

/// Pinned: one built layer cloned into many clients shares one bulkhead and one budget, and
/// a bulkhead of 2 bounds what is in flight across all of them.
#[tokio::test(start_paused = true)]
async fn pinned_cloned_layer_shares_one_bulkhead() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (i, p) = (in_flight.clone(), peak.clone());
    let transport = service_fn(move |_req: Req| {
        let now = i.fetch_add(1, Ordering::SeqCst) + 1;
        p.fetch_max(now, Ordering::SeqCst);
        let i = i.clone();
        async move {
            sleep(Duration::from_millis(10)).await;
            i.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let layer = unthrottled()
        .bulkhead(BulkheadLayer::builder(2).max_queue(32))
        .build()
        .unwrap();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let client = layer.clone().layer(transport.clone());
        set.spawn(client.oneshot(get("http://svc/x")));
    }
    while let Some(r) = set.join_next().await {
        r.unwrap().unwrap();
    }
    assert!(
        peak.load(Ordering::SeqCst) <= 2,
        "{}",
        peak.load(Ordering::SeqCst)
    );
}

/// A `ConcurrencyLimit(1)` between the stack and the transport, with hedging: the hedge waits
/// for the one slot the hanging first attempt holds; the call still ends at its deadline.
#[tokio::test(start_paused = true)]
async fn pinned_concurrency_limit_inside_with_hedging_ends_at_deadline() {
    let log = Log::default();
    let transport = scripted(log.clone(), |_| (None, 200, vec![]));
    let client = ServiceBuilder::new()
        .layer(
            unthrottled()
                .timeout(Duration::from_millis(500))
                .attempt(AttemptBound::None)
                .retry(RetryConfig::http().hedging(Hedging::new(Duration::from_millis(50))))
                .build()
                .unwrap(),
        )
        .concurrency_limit(1)
        .service(transport);
    let start = Instant::now();
    let err = client.oneshot(get("http://svc/x")).await.unwrap_err();
    assert!(backstop::is_deadline_exceeded(&*err), "{err}");
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert_eq!(log.len(), 1);
}

/// Dropping a call while a hedge and its original are in flight cancels both.
#[tokio::test(start_paused = true)]
async fn pinned_dropping_a_hedged_call_cancels_every_attempt() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    struct OnDrop(Arc<AtomicUsize>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let transport = service_fn(move |_req: Req| {
        let guard = OnDrop(d.clone());
        async move {
            let _g = guard;
            std::future::pending::<()>().await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let client = unthrottled()
        .attempt(AttemptBound::None)
        .retry(RetryConfig::http().hedging(Hedging::new(Duration::from_millis(10)).max_attempts(3)))
        .build()
        .unwrap()
        .layer(transport);
    let r = tokio::time::timeout(
        Duration::from_millis(100),
        client.oneshot(get("http://svc/x")),
    )
    .await;
    assert!(r.is_err());
    assert_eq!(dropped.load(Ordering::SeqCst), 3);
    let _ = AtomicBool::new(false);
}

/// Was a defect (medium), fixed. A gRPC call whose deadline ends while it waits for a bulkhead
/// permit (no hold time measured yet, so the wait runs to the deadline) was answered
/// UNAVAILABLE "bulkhead full" with
/// pushback -1 at its deadline, where the same call over HTTP gets `DeadlineExceeded` (the
/// deadline layer turns the bulkhead's `Err` into it; the gRPC refusal is an `Ok` it passes
/// through). README: "when an answer is cut ... the caller gets the 504 / DEADLINE_EXCEEDED";
/// gRPC status codes: DEADLINE_EXCEEDED is "the deadline expired before the operation could
/// complete", and an UNAVAILABLE with pushback -1 tells the caller's own retry policy never
/// to retry.
#[tokio::test(start_paused = true)]
async fn was_finding_grpc_bulkhead_wait_ending_at_the_deadline_says_unavailable() {
    let mut said = Vec::new();
    for grpc in [false, true] {
        let transport = service_fn(move |_req: Req| async move {
            std::future::pending::<()>().await;
            Ok::<_, Infallible>(Response::new(String::new()))
        });
        let builder = backstop::client::grpc()
            .throttle(None)
            .attempt(AttemptBound::None)
            .bulkhead(BulkheadLayer::builder(1).max_wait(Duration::from_secs(10)));
        let client = builder.build().unwrap().layer(transport);
        tokio::spawn(client.clone().oneshot(grpc_req(None)));
        tokio::task::yield_now().await;
        let mut req = if grpc {
            grpc_req(Some("250m"))
        } else {
            get("http://svc/x")
        };
        if !grpc {
            req.extensions_mut()
                .insert(Deadline::after(Duration::from_millis(250)));
        }
        let start = Instant::now();
        let res = client.oneshot(req).await;
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        said.push(match res {
            Ok(r) => format!("grpc-status {}", grpc_status(&r).unwrap_or("-")),
            Err(e) if backstop::is_deadline_exceeded(&*e) => "deadline exceeded".to_owned(),
            Err(e) => format!("error {e}"),
        });
    }
    assert_eq!(said, ["deadline exceeded", "grpc-status 4"]);
}

/// Hedging and `Retry-After`: a hedged attempt answered 503 with `Retry-After: 1` is followed
/// by another copy no sooner than 1 s later (RFC 9110: the least to wait; README "Retry-After
/// is a minimum").
#[tokio::test(start_paused = true)]
async fn pinned_hedge_after_retry_after_waits_for_it() {
    let log = Log::default();
    let transport = scripted(log.clone(), |n| match n {
        1 => (
            Some(Duration::from_millis(10)),
            503,
            vec![("retry-after", "1".to_owned())],
        ),
        _ => (Some(Duration::from_millis(10)), 200, vec![]),
    });
    let client = unthrottled()
        .timeout(Duration::from_secs(5))
        .retry(
            RetryConfig::http().hedging(Hedging::new(Duration::from_millis(100)).max_attempts(3)),
        )
        .build()
        .unwrap()
        .layer(transport);
    let res = client.oneshot(get("http://svc/x")).await.unwrap();
    let heard = log.all();
    assert_eq!(res.status(), 200, "{heard:?}");
    for h in &heard[1..] {
        assert!(
            h.at_ms >= 1010,
            "a copy {} ms in, after Retry-After: 1 at 10 ms: {heard:?}",
            h.at_ms
        );
    }
}

/// Pinned: the short forms win over a part's knob whatever the order.
#[tokio::test(start_paused = true)]
async fn pinned_setter_order_never_matters() {
    for order in 0..2 {
        let log = Log::default();
        let transport = scripted(log.clone(), |_| (Some(MS), 503, vec![]));
        let b = unthrottled();
        let b = match order {
            0 => b.max_attempts(2).retry(
                RetryConfig::http()
                    .max_attempts(5)
                    .backoff(backoff::constant(MS)),
            ),
            _ => b
                .retry(
                    RetryConfig::http()
                        .max_attempts(5)
                        .backoff(backoff::constant(MS)),
                )
                .max_attempts(2),
        };
        let b = match order {
            0 => b.timeout(S).deadline(
                backstop::deadline::PropagateDeadlineLayer::builder()
                    .timeout(Duration::from_secs(9)),
            ),
            _ => b
                .deadline(
                    backstop::deadline::PropagateDeadlineLayer::builder()
                        .timeout(Duration::from_secs(9)),
                )
                .timeout(S),
        };
        let client = b.build().unwrap().layer(transport);
        let res = client.oneshot(get("http://svc/x")).await.unwrap();
        assert_eq!(call_info(&res).attempts(), 2, "order {order}");
        let heard = log.all();
        assert_eq!(heard.len(), 2);
        assert!(
            told_ms(&heard[0].timeouts[0]) <= 1000,
            "order {order}: {heard:?}"
        );
    }
}

/// Pinned: bodies that cannot be replayed are sent once (streamed keyed POST; a GET over the
/// replay limit), and the call says why it stopped.
#[tokio::test(start_paused = true)]
async fn pinned_unreplayable_bodies_are_sent_once() {
    use http_body_util::BodyExt;
    let sent = Arc::new(AtomicUsize::new(0));
    let s = sent.clone();
    let transport = service_fn(
        move |req: Request<ReplayBody<http_body_util::Full<bytes::Bytes>>>| {
            s.fetch_add(1, Ordering::SeqCst);
            async move {
                let _ = req.into_body().collect().await;
                Ok::<_, Infallible>(Response::builder().status(503).body(String::new()).unwrap())
            }
        },
    );
    let client = unthrottled()
        .idempotency_keys(true)
        .build()
        .unwrap()
        .layer(transport);
    let res = client.oneshot(too_long_to_replay()).await.unwrap();
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_eq!(call_info(&res).attempts(), 1);
    assert_eq!(
        call_info(&res).gave_up(),
        Some(backstop::client::retry::GiveUp::NotReplayable)
    );
}

/// Pinned: a keyed breaker with many routes (beyond max_keys): every call answered, no panic,
/// and the attempt bound's table follows.
#[tokio::test(start_paused = true)]
async fn pinned_keyed_breaker_many_routes() {
    use backstop::RouteKey;
    let log = Log::default();
    let transport = scripted(log.clone(), |n| {
        (Some(MS), if n % 2 == 0 { 503 } else { 200 }, vec![])
    });
    let layer = unthrottled()
        .breaker(
            backstop::client::http_breaker()
                .per_key(RouteKey::Path)
                .max_keys(100),
        )
        .build()
        .unwrap();
    let client = layer.clone().layer(transport);
    let mut set = FuturesUnordered::new();
    for i in 0..2000 {
        set.push(client.clone().oneshot(get(&format!("http://svc/r/{i}"))));
    }
    let mut n = 0;
    while let Some(r) = set.next().await {
        r.unwrap();
        n += 1;
    }
    assert_eq!(n, 2000);
    assert!(layer.breaker_layer().keys().len() <= 100);
}

/// Pinned: a handler's deadline reaches a call made through `block_in_place` + `block_on` on
/// a multi-thread runtime (the same logical task), and the call never outlives it.
#[test]
fn pinned_block_in_place_block_on_keeps_the_scope_deadline() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let log = Log::default();
        let transport = scripted(log.clone(), |_| (Some(Duration::from_secs(5)), 200, vec![]));
        let client = unthrottled()
            .attempt(AttemptBound::None)
            .build()
            .unwrap()
            .layer(transport);
        let h = tokio::spawn(
            Deadline::after(Duration::from_millis(200)).scope(async move {
                let start = tokio::time::Instant::now();
                let r = tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(client.oneshot(get("http://svc/x")))
                });
                (r.map(|_| ()).map_err(|e| e.to_string()), start.elapsed())
            }),
        );
        let (r, took) = h.await.unwrap();
        assert!(r.is_err(), "{r:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        let heard = log.all();
        assert!(told_ms(&heard[0].timeouts[0]) <= 200, "{heard:?}");
    });
}

/// An expired deadline before send: HTTP gets DeadlineExceeded at once, nothing is sent, no
/// budget token is taken; gRPC gets DEADLINE_EXCEEDED whose CallInfo says 0 attempts.
#[tokio::test(start_paused = true)]
async fn pinned_expired_before_send() {
    let budget = Arc::new(Counting::default());
    let log = Log::default();
    let transport = scripted(log.clone(), |_| (Some(MS), 200, vec![]));
    let layer = unthrottled()
        .retry(RetryConfig::http().budget(budget.clone()))
        .build()
        .unwrap();
    let client = layer.clone().layer(transport.clone());
    let mut req = get("http://svc/x");
    let d = Deadline::after(MS);
    sleep(2 * MS).await;
    req.extensions_mut().insert(d);
    let err = client.oneshot(req).await.unwrap_err();
    assert!(backstop::is_deadline_exceeded(&*err));
    assert_eq!(log.len(), 0);
    assert_eq!(budget.withdrawn.load(Ordering::SeqCst), 0);
    let g = backstop::client::grpc()
        .throttle(None)
        .build()
        .unwrap()
        .layer(transport);
    let res = g.oneshot(grpc_req(Some("0n"))).await.unwrap();
    assert_eq!(grpc_status(&res), Some("4"));
    assert_eq!(call_info(&res).attempts(), 0);
    assert_eq!(log.len(), 0);
}

/// Was a defect (medium), fixed: the backoff is now shortened to fit what is left (never below
/// its least delay). README: each attempt is told "its share (80 % of what is left) so a retry
/// fits after a timeout". The share is kept for the retry layer's *least* backoff (25 ms), but
/// the retry
/// layer then draws its backoff (decorrelated jitter, up to 3× the last) and gives up with
/// `GiveUp::Deadline` when the draw does not fit the 20 % kept: the first attempt was cut at
/// 80 % of the deadline for a retry that is never sent, and the caller gets `AttemptTimedOut`
/// with a fifth of its deadline unused. Over 40 seeds, a dependency whose second attempt
/// answers at once should serve every call.
#[tokio::test(start_paused = true)]
async fn was_finding_share_kept_for_a_retry_is_wasted_when_the_backoff_draw_is_longer() {
    let mut failed = Vec::new();
    for seed in 0..40u64 {
        let log = Log::default();
        let transport = scripted(log.clone(), |n| match n {
            1 => (None, 200, vec![]),
            _ => (Some(MS), 200, vec![]),
        });
        let client = unthrottled()
            .timeout(Duration::from_millis(300))
            .retry(RetryConfig::http().seed(seed))
            .build()
            .unwrap()
            .layer(transport);
        let start = Instant::now();
        match client.oneshot(get("http://svc/x")).await {
            Ok(_) => {}
            Err(e) => failed.push((seed, start.elapsed(), e.to_string(), log.len())),
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 40 calls ended early without a retry: {failed:?}",
        failed.len()
    );
}

/// Pinned: a call sent once (its body too long to replay) that the server answers with a
/// `Retry-After` longer than the layer waits for gives up for the hint, as a replayable call
/// does (one rule, `refuses_retry`), so its handler's callers are told not to retry either; a
/// shorter one leaves it given up for its body.
#[tokio::test(start_paused = true)]
async fn pinned_a_long_hint_ends_a_call_sent_once_as_it_ends_a_retried_one() {
    use backstop::client::retry::GiveUp;
    use http_body_util::BodyExt;
    for (retry_after, why) in [("3600", GiveUp::Hint), ("5", GiveUp::NotReplayable)] {
        let transport = service_fn(
            move |req: Request<ReplayBody<http_body_util::Full<bytes::Bytes>>>| async move {
                let _ = req.into_body().collect().await;
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(503)
                        .header("retry-after", retry_after)
                        .body(String::new())
                        .unwrap(),
                )
            },
        );
        let client = unthrottled().build().unwrap().layer(transport);
        let res = client.oneshot(too_long_to_replay()).await.unwrap();
        assert_eq!(call_info(&res).attempts(), 1);
        assert_eq!(
            call_info(&res).gave_up(),
            Some(why),
            "Retry-After: {retry_after}"
        );
        assert_eq!(why.exhausts_retries(), why == GiveUp::Hint);
    }
}
