//! Hedging under paused time: when hedges go, which answer wins, what each hedge carries, and
//! everything that stops a hedge (A6 pushback, the budget, the deadline, the body, the method).

use backstop::BoxError;
use backstop::client::retry::hedge::{HedgeDelay, Hedging};
use backstop::client::retry::{
    Attempt, Budget, GiveUp, Idempotency, ReplayBody, RetryConfig, RetryLayer,
};
use backstop::deadline::Deadline;
use backstop_test_support::grpc_status as status;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, channel::Channel};
use std::{
    convert::Infallible,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tokio::time::{Instant, sleep};
use tower::{Layer, ServiceExt, service_fn};

/// One attempt as the dependency saw it.
#[derive(Debug, Clone)]
struct Seen {
    /// When it arrived, since the call started.
    at: Duration,
    previous: Option<String>,
    timeout: Option<String>,
    /// Its `Attempt` extension, as a layer inside the retry layer reads it.
    attempt: Attempt,
    body: Vec<u8>,
}

/// What the dependency saw, and how many attempts were dropped before they answered.
#[derive(Debug)]
struct Log {
    /// When the dependency was made: the call starts at once.
    t0: Instant,
    seen: Mutex<Vec<Seen>>,
    cancelled: AtomicUsize,
}

impl Log {
    fn starting_now() -> Arc<Self> {
        Arc::new(Self {
            t0: Instant::now(),
            seen: Mutex::default(),
            cancelled: AtomicUsize::new(0),
        })
    }

    fn at(&self) -> Vec<u64> {
        let seen = self.seen.lock().unwrap();
        seen.iter().map(|s| s.at.as_millis() as u64).collect()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Logs an attempt arriving now, its body not read yet; returns its index, where the
    /// body goes once read.
    fn arrived<B>(&self, headers: (Option<String>, Option<String>), req: &Req<B>) -> usize {
        let (previous, timeout) = headers;
        let mut seen = self.seen.lock().unwrap();
        seen.push(Seen {
            at: Instant::now() - self.t0,
            previous,
            timeout,
            attempt: Attempt::of(req),
            body: Vec::new(),
        });
        seen.len() - 1
    }
}

/// Counts an attempt as cancelled unless it answered.
struct Guard<'a>(&'a AtomicUsize, bool);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

type Req<B> = Request<ReplayBody<B>>;

/// What the scripted dependencies below are: a service the retry layer can clone per attempt.
trait Dependency<B>:
    tower::Service<Req<B>, Response = Response<String>, Error = BoxError> + Clone
{
}

impl<B, S> Dependency<B> for S where
    S: tower::Service<Req<B>, Response = Response<String>, Error = BoxError> + Clone
{
}

/// A dependency that answers attempt `i` with `script[i]` (after its delay; the last entry
/// repeats), logging every attempt. The body is read first, then the answer waits.
fn dependency<B>(script: Vec<(u64, Response<String>)>) -> (impl Dependency<B>, Arc<Log>)
where
    B: http_body::Body<Data = Bytes> + 'static,
    B::Error: Into<BoxError>,
{
    let log = Log::starting_now();
    let script = Arc::new(script);
    let svc_log = log.clone();
    let svc = service_fn(move |req: Req<B>| {
        let log = svc_log.clone();
        let script = script.clone();
        async move {
            let header = |name: &str| {
                req.headers()
                    .get(name)
                    .map(|v| v.to_str().unwrap().to_owned())
            };
            let headers = (header("grpc-previous-rpc-attempts"), header("grpc-timeout"));
            let i = log.arrived(headers, &req);
            let mut guard = Guard(&log.cancelled, false);
            let body = req.into_body().collect().await?.to_bytes();
            log.seen.lock().unwrap()[i].body = body.to_vec();
            let (delay, response) = script[i.min(script.len() - 1)].clone();
            sleep(Duration::from_millis(delay)).await;
            guard.1 = true;
            Ok::<_, BoxError>(response)
        }
    });
    (svc, log)
}

fn ok() -> Response<String> {
    Response::new("ok".into())
}

fn http_status(code: u16) -> Response<String> {
    Response::builder()
        .status(code)
        .body(String::new())
        .unwrap()
}

fn get() -> Request<Full<Bytes>> {
    Request::get("http://dep/item")
        .body(Full::default())
        .unwrap()
}

fn hedged(delay: u64, max_attempts: u32) -> RetryLayer<backstop::HttpClassifier> {
    RetryConfig::http()
        .hedging(Hedging::new(Duration::from_millis(delay)).max_attempts(max_attempts))
        .no_budget()
        .seed(1)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_slow_first_attempt_is_overtaken_by_a_hedge() {
    let (svc, log) = dependency(vec![(1_000, ok()), (10, ok())]);
    let layer = hedged(100, 2);
    let t0 = Instant::now();
    let response = layer.layer(svc).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!((Instant::now() - t0).as_millis(), 110);
    assert_eq!(log.at(), [0, 100]);
    assert_eq!(
        log.cancelled.load(Ordering::SeqCst),
        1,
        "the first attempt is dropped"
    );
    let stats = layer.stats();
    assert_eq!((stats.hedges, stats.retries), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn an_answer_before_the_delay_sends_no_hedge() {
    let (svc, log) = dependency(vec![(50, ok())]);
    let layer = hedged(100, 3);
    let response = layer.layer(svc).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(log.at(), [0]);
    assert_eq!(layer.stats().hedges, 0);
}

#[tokio::test(start_paused = true)]
async fn hedges_go_one_delay_apart_up_to_max_attempts() {
    let (svc, log) = dependency(vec![(1_000, ok())]);
    let layer = hedged(100, 3);
    let t0 = Instant::now();
    let response = layer.layer(svc).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(log.at(), [0, 100, 200]);
    // The first attempt answers first; the two hedges are dropped.
    assert_eq!((Instant::now() - t0).as_millis(), 1_000);
    assert_eq!(log.cancelled.load(Ordering::SeqCst), 2);
    assert_eq!(layer.stats().hedges, 2);
}

/// A6: "If a non-fatal status code is received from a hedged request, then the next hedged
/// request in line is sent immediately, shortcutting its hedging delay."
#[tokio::test(start_paused = true)]
async fn a_retryable_failure_sends_the_next_hedge_at_once() {
    let (svc, log) = dependency(vec![(30, http_status(503)), (1_000, ok()), (20, ok())]);
    let layer = hedged(100, 3);
    let t0 = Instant::now();
    let response = layer.layer(svc).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    // The 503 at 30 ms sends the second at once; the third goes one delay after it.
    assert_eq!(log.at(), [0, 30, 130]);
    assert_eq!((Instant::now() - t0).as_millis(), 150);
}

/// When every attempt fails and none is left, the last failure is the answer.
#[tokio::test(start_paused = true)]
async fn every_attempt_failing_returns_the_last_failure() {
    let (svc, log) = dependency(vec![(10, http_status(503)), (10, http_status(502))]);
    let layer = hedged(100, 2);
    let response = layer.layer(svc).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(log.at(), [0, 10]);
    assert_eq!(layer.stats().gave_up(GiveUp::Attempts), 1);
}

fn grpc_hedged(delay: u64, max_attempts: u32) -> RetryLayer<backstop::GrpcClassifier> {
    RetryConfig::grpc()
        .hedging(Hedging::new(Duration::from_millis(delay)).max_attempts(max_attempts))
        .idempotency(Idempotency::All)
        .no_budget()
        .build()
        .unwrap()
}

fn grpc_call() -> Request<Full<Bytes>> {
    Request::post("http://svc/pkg.Svc/Get")
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\x03abc")))
        .unwrap()
}

fn grpc_status(response: &Response<impl http_body::Body>) -> &str {
    response.headers()["grpc-status"].to_str().unwrap()
}

/// A6: a fatal status code commits the call; the hedges in flight are cancelled.
#[tokio::test(start_paused = true)]
async fn a_fatal_status_commits_and_cancels_the_others() {
    let (svc, log) = dependency(vec![(1_000, status(0, None)), (10, status(3, None))]);
    let layer = grpc_hedged(100, 3);
    let t0 = Instant::now();
    let response = layer.layer(svc).oneshot(grpc_call()).await.unwrap();
    assert_eq!(grpc_status(&response), "3"); // INVALID_ARGUMENT
    assert_eq!((Instant::now() - t0).as_millis(), 110);
    assert_eq!(log.at(), [0, 100]);
    assert_eq!(log.cancelled.load(Ordering::SeqCst), 1);
}

/// Each gRPC hedge says how many attempts went before it, the time really left, and sends
/// the same message bytes.
#[tokio::test(start_paused = true)]
async fn grpc_hedges_carry_previous_attempts_the_time_left_and_the_same_body() {
    let (svc, log) = dependency(vec![(5_000, status(0, None))]);
    let layer = grpc_hedged(100, 3);
    // The call carries its deadline and the `grpc-timeout` that tells it (as a deadline layer
    // outside writes it): each hedge refreshes the header to the time left.
    let mut req = grpc_call();
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_secs(1)));
    req.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("1S"));
    let response = layer.layer(svc).oneshot(req).await;
    // Nobody answers within the deadline: the error says so, and that three were sent.
    let err = response.unwrap_err();
    assert!(backstop::find::<backstop::DeadlineExceeded>(&*err).is_some());
    let info = err
        .downcast_ref::<backstop::client::retry::RetryError>()
        .unwrap();
    assert_eq!(info.attempts(), 3);
    let seen = log.seen();
    assert_eq!(log.at(), [0, 100, 200]);
    let previous: Vec<_> = seen.iter().map(|s| s.previous.clone()).collect();
    assert_eq!(previous, [None, Some("1".into()), Some("2".into())]);
    let timeouts: Vec<_> = seen.iter().map(|s| s.timeout.clone().unwrap()).collect();
    assert_eq!(timeouts, ["1S", "900000u", "800000u"]);
    for s in &seen {
        assert_eq!(s.body, b"\0\0\0\0\x03abc");
    }
}

/// A6: a negative pushback stops hedging; the call then waits for the attempts in flight.
#[tokio::test(start_paused = true)]
async fn pushback_minus_one_stops_hedging() {
    let (svc, log) = dependency(vec![(10, status(14, Some("-1"))), (10, status(0, None))]);
    let layer = grpc_hedged(100, 3);
    let response = layer.layer(svc).oneshot(grpc_call()).await.unwrap();
    assert_eq!(grpc_status(&response), "14");
    assert_eq!(log.at(), [0]);
    assert_eq!(layer.stats().gave_up(GiveUp::Hint), 1);
}

/// A6: a pushback of n ms sends the next hedge in exactly n ms, not after the hedging delay.
#[tokio::test(start_paused = true)]
async fn pushback_n_sends_the_next_hedge_in_n_ms() {
    let (svc, log) = dependency(vec![(10, status(14, Some("300"))), (10, status(0, None))]);
    let layer = grpc_hedged(100, 3);
    let response = layer.layer(svc).oneshot(grpc_call()).await.unwrap();
    assert_eq!(grpc_status(&response), "0");
    assert_eq!(log.at(), [0, 310]);
}

fn retry_after(code: u16, seconds: u64) -> Response<String> {
    Response::builder()
        .status(code)
        .header("retry-after", seconds.to_string())
        .body(String::new())
        .unwrap()
}

/// `Retry-After` is the least wait before the next hedge, as it is before a retry (RFC 9110):
/// neither the failure's shortcut nor the hedging delay sends one sooner.
#[tokio::test(start_paused = true)]
async fn a_retry_after_holds_the_next_hedge_back() {
    // The first attempt is slow; the hedge at 100 ms is told to come back in 2 s at 110 ms.
    let (svc, log) = dependency(vec![(5_000, ok()), (10, retry_after(429, 2)), (10, ok())]);
    let layer = hedged(100, 3);
    let t0 = Instant::now();
    let response = layer.layer(svc).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    // Not at 110 ms (the failure's shortcut) nor at 200 ms (the delay): at 2 110 ms.
    assert_eq!(log.at(), [0, 100, 2_110]);
    assert_eq!((Instant::now() - t0).as_millis(), 2_120);

    // Nothing else in flight: the same wait.
    let (svc, log) = dependency(vec![(10, retry_after(503, 2)), (10, ok())]);
    let response = layer.layer(svc).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(log.at(), [0, 2_010]);
}

/// A server's wait that ends past the deadline (less `min_attempt_time`) stops hedging at
/// once, as it gives a retry up: with nothing else in flight, the failure is the answer now,
/// not the deadline's error later.
#[tokio::test(start_paused = true)]
async fn a_server_wait_past_the_deadline_stops_hedging_at_once() {
    let (svc, log) = dependency(vec![(10, retry_after(503, 2))]);
    let layer = hedged(100, 3);
    let mut req = get();
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_secs(1)));
    let t0 = Instant::now();
    let response = layer.layer(svc).oneshot(req).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!((Instant::now() - t0).as_millis(), 10);
    assert_eq!(log.at(), [0]);
    assert_eq!(layer.stats().gave_up(GiveUp::Deadline), 1);

    // A gRPC pushback likewise.
    let (svc, log) = dependency(vec![(10, status(14, Some("5000")))]);
    let layer = grpc_hedged(100, 3);
    let mut req = grpc_call();
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_secs(1)));
    let t0 = Instant::now();
    let response = layer.layer(svc).oneshot(req).await.unwrap();
    assert_eq!(grpc_status(&response), "14");
    assert_eq!((Instant::now() - t0).as_millis(), 10);
    assert_eq!(log.at(), [0]);
    assert_eq!(layer.stats().gave_up(GiveUp::Deadline), 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_the_idempotency_rule_refuses_is_not_hedged() {
    let (svc, log) = dependency(vec![(1_000, ok())]);
    let layer = hedged(100, 3);
    let post = Request::post("http://dep/order")
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap();
    let response = layer.layer(svc).oneshot(post).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(log.at(), [0]);
}

/// A budget that grants `left` tokens and counts what it is asked.
#[derive(Debug)]
struct Tokens {
    left: AtomicUsize,
    asked: AtomicUsize,
}

impl Budget for Tokens {
    fn record_success(&self) {}
    fn try_withdraw(&self) -> bool {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
    fn balance(&self) -> f64 {
        self.left.load(Ordering::SeqCst) as f64
    }
}

/// Every hedge takes a retry token; without one, no hedge is sent.
#[tokio::test(start_paused = true)]
async fn every_hedge_takes_a_token_from_the_retry_budget() {
    let tokens = Arc::new(Tokens {
        left: AtomicUsize::new(1),
        asked: AtomicUsize::new(0),
    });
    let (svc, log) = dependency(vec![(1_000, ok())]);
    let layer = RetryConfig::http()
        .hedging(Hedging::new(Duration::from_millis(100)).max_attempts(4))
        .budget(tokens.clone())
        .build()
        .unwrap();
    let response = layer.layer(svc).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(log.at(), [0, 100], "one token, one hedge");
    assert_eq!(tokens.asked.load(Ordering::SeqCst), 2);
}

/// No hedge is sent without 1 ms (fixed) left before the deadline.
#[tokio::test(start_paused = true)]
async fn no_hedge_without_time_left() {
    let (svc, log) = dependency(vec![(1_000, ok())]);
    let layer = RetryConfig::http()
        .hedging(Hedging::new(Duration::from_millis(100)).max_attempts(3))
        .no_budget()
        .build()
        .unwrap();
    let mut req = get();
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_micros(100_900)));
    let response = layer.layer(svc).oneshot(req).await;
    let err = response.unwrap_err();
    assert!(backstop::find::<backstop::DeadlineExceeded>(&*err).is_some());
    assert_eq!(log.at(), [0], "at 100 ms only 0.9 ms was left");
}

/// What a [`connection`] does with one attempt: when (ms after the call) its task reads the
/// request body, if it ever does, and when and what it answers.
struct Exchange {
    read_at: Option<u64>,
    answer_at: u64,
    response: Response<String>,
}

fn exchange(read_at: Option<u64>, answer_at: u64, response: Response<String>) -> Exchange {
    Exchange {
        read_at,
        answer_at,
        response,
    }
}

/// A transport as hyper's and tonic's are: the call hands the request to a connection task,
/// which sends (reads) the body on its own time, so the body is not in the replay buffer yet
/// when the response future is first polled; the response future waits for the answer.
/// Attempt `i` follows `script[i]` (the last entry repeats).
fn connection<B>(script: Vec<Exchange>) -> (impl Dependency<B>, Arc<Log>)
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let log = Log::starting_now();
    let script = Arc::new(script);
    let svc_log = log.clone();
    let svc = service_fn(move |req: Req<B>| {
        let i = svc_log.arrived((None, None), &req);
        let step = &script[i.min(script.len() - 1)];
        let (read_at, answer_at) = (step.read_at, step.answer_at);
        let response = step.response.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let log = svc_log.clone();
        let start = Instant::now();
        tokio::spawn(async move {
            let body = req.into_body();
            if let Some(at) = read_at {
                tokio::time::sleep_until(start + Duration::from_millis(at)).await;
                if let Ok(body) = body.collect().await {
                    log.seen.lock().unwrap()[i].body = body.to_bytes().to_vec();
                }
            } else {
                drop(body);
            }
            tokio::time::sleep_until(start + Duration::from_millis(answer_at)).await;
            let _ = tx.send(response);
        });
        async move { rx.await.map_err(|_| BoxError::from("connection closed")) }
    });
    (svc, log)
}

fn put(body: &'static [u8]) -> Request<Full<Bytes>> {
    Request::put("http://dep/item")
        .body(Full::new(Bytes::from_static(body)))
        .unwrap()
}

/// A failure that came before the transport read the body (a server shedding load answers
/// before it reads) is retried as it is without hedging: the next attempt takes the body over.
#[tokio::test(start_paused = true)]
async fn a_failure_before_the_body_was_read_is_retried_as_without_hedging() {
    let script = || {
        vec![
            exchange(None, 5, http_status(503)),
            exchange(Some(0), 10, ok()),
        ]
    };
    let unhedged = RetryConfig::http().no_budget().seed(1).build().unwrap();
    let (svc, log) = connection(script());
    let response = unhedged.layer(svc).oneshot(put(b"payload")).await.unwrap();
    assert_eq!(response.status(), 200, "without hedging");
    assert_eq!(log.seen()[1].body, b"payload");

    let (svc, log) = connection(script());
    let layer = hedged(100, 3);
    let response = layer.layer(svc).oneshot(put(b"payload")).await.unwrap();
    assert_eq!(response.status(), 200, "with hedging");
    assert_eq!(log.at(), [0, 5], "sent when the first failed");
    assert_eq!(log.seen()[1].body, b"payload");
    assert_eq!(layer.stats().hedges, 1);
}

/// A hedge due while the transport is still sending the body waits for the body to be
/// complete in the replay buffer (a copy before would cut the first attempt's body short),
/// then goes at once, with every byte.
#[tokio::test(start_paused = true)]
async fn a_hedge_due_while_the_body_streams_goes_once_it_is_complete() {
    let (mut tx, rx) = Channel::<Bytes, Infallible>::new(4);
    let (svc, log) = connection(vec![
        exchange(Some(0), 1_000, ok()),
        exchange(Some(0), 5, ok()),
    ]);
    let layer = hedged(10, 3);
    let req = Request::put("http://dep/item").body(rx).unwrap();
    let send = async move {
        tx.send_data(Bytes::from_static(b"part")).await.unwrap();
        sleep(Duration::from_millis(50)).await;
        tx.send_data(Bytes::from_static(b"-rest")).await.unwrap();
    };
    let t0 = Instant::now();
    let (response, ()) = tokio::join!(layer.layer(svc).oneshot(req), send);
    assert_eq!(response.unwrap().status(), 200);
    assert_eq!(
        t0.elapsed(),
        Duration::from_millis(55),
        "the hedge answered"
    );
    // The third is due 10 ms after the hedge; the hedge answers first.
    assert_eq!(log.at(), [0, 50]);
    for seen in log.seen() {
        assert_eq!(seen.body, b"part-rest");
    }
}

/// A body past `max_replay_bytes` can never be copied: it is neither hedged nor retried, and
/// the call waits for its one attempt.
#[tokio::test(start_paused = true)]
async fn a_body_past_the_replay_cap_is_sent_once() {
    let (mut tx, rx) = Channel::<Bytes, Infallible>::new(4);
    let (svc, log) = connection(vec![exchange(Some(0), 200, http_status(503))]);
    let layer = RetryConfig::http()
        .hedging(Hedging::new(Duration::from_millis(10)).max_attempts(3))
        .max_replay_bytes(4)
        .no_budget()
        .build()
        .unwrap();
    let req = Request::put("http://dep/item").body(rx).unwrap();
    let send = async move {
        tx.send_data(Bytes::from_static(b"payload")).await.unwrap();
    };
    let (response, ()) = tokio::join!(layer.layer(svc).oneshot(req), send);
    assert_eq!(response.unwrap().status(), 503);
    assert_eq!(log.at(), [0]);
    assert_eq!(log.seen()[0].body, b"payload");
    assert_eq!(layer.stats().gave_up(GiveUp::NotReplayable), 1);
}

/// A6: with a hedging delay of 0, every attempt goes at once — on a transport that sends the
/// body on its connection task, once the body is complete (the same instant here).
#[tokio::test(start_paused = true)]
async fn a_zero_hedging_delay_sends_every_attempt_at_once_on_a_streaming_transport() {
    let (svc, log) = connection(vec![
        exchange(Some(0), 30, ok()),
        exchange(Some(0), 20, ok()),
        exchange(Some(0), 10, ok()),
    ]);
    let layer = hedged(0, 3);
    let t0 = Instant::now();
    let response = layer.layer(svc).oneshot(put(b"payload")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        t0.elapsed(),
        Duration::from_millis(10),
        "the third answered first"
    );
    assert_eq!(log.at(), [0, 0, 0]);
    assert_eq!(layer.stats().hedges, 2);
}

/// A delay source with nothing to say yet (a latency model not trusted): the request is
/// retried as without hedging.
#[derive(Debug)]
struct NotYet;

impl HedgeDelay for NotYet {
    fn delay(&self) -> Option<Duration> {
        None
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_delay_the_request_is_retried_as_before() {
    let (svc, log) = dependency(vec![(10, http_status(503)), (10, ok())]);
    let layer = RetryConfig::http()
        .hedging(Hedging::new(NotYet).max_attempts(3))
        .no_budget()
        .seed(3)
        .build()
        .unwrap();
    let response = layer.layer(svc).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(log.at().len(), 2);
    let stats = layer.stats();
    assert_eq!((stats.retries, stats.hedges), (1, 0));
}

#[test]
fn hedging_max_attempts_is_validated() {
    for n in [0, 1, 11] {
        let err = RetryConfig::http()
            .hedging(Hedging::new(Duration::from_millis(10)).max_attempts(n))
            .build()
            .unwrap_err();
        assert_eq!(err.knob(), "hedging.max_attempts", "{n}");
    }
}

/// Per-request overrides: no hedging for this request, or a cap on its attempts.
#[tokio::test(start_paused = true)]
async fn a_request_can_turn_hedging_off_or_cap_its_attempts() {
    use backstop::client::retry::RetryOverrides;
    let (svc, log) = dependency(vec![(1_000, ok())]);
    let layer = hedged(100, 3);
    let mut req = get();
    req.extensions_mut()
        .insert(RetryOverrides::new().hedge(false));
    layer.layer(svc).oneshot(req).await.unwrap();
    assert_eq!(log.at(), [0], "not hedged");

    let (svc, log) = dependency(vec![(1_000, ok())]);
    let mut req = get();
    req.extensions_mut()
        .insert(RetryOverrides::new().max_attempts(2));
    layer.layer(svc).oneshot(req).await.unwrap();
    assert_eq!(log.at(), [0, 100], "capped at two attempts");
}

/// Each attempt says which it is (the hook a layer inside uses to prepare it): the first
/// carries nothing (read as `Attempt::FIRST`), hedges are numbered and marked, and a retry
/// after them is numbered on and not marked.
#[tokio::test(start_paused = true)]
async fn every_attempt_after_the_first_says_which_it_is() {
    // Two hedges 10 ms apart, all three fail after 30 ms; then retries are refused by
    // max_attempts (3 in all): the numbers and kinds of what was sent.
    let (svc, log) = dependency::<Full<Bytes>>(vec![(30, http_status(503))]);
    let _ = hedged(10, 3).layer(svc).oneshot(get()).await;
    let attempts: Vec<Attempt> = log.seen().iter().map(|s| s.attempt).collect();
    assert_eq!(
        attempts,
        [Attempt::FIRST, Attempt::new(2, true), Attempt::new(3, true)]
    );
    assert!(attempts[0].is_first() && !attempts[0].is_hedge());
    // Retries, no hedging: numbered, not hedges.
    let (svc, log) = dependency::<Full<Bytes>>(vec![(1, http_status(503))]);
    let retry = RetryConfig::http().no_budget().seed(1).build().unwrap();
    let _ = retry.layer(svc).oneshot(get()).await;
    let attempts: Vec<Attempt> = log.seen().iter().map(|s| s.attempt).collect();
    assert_eq!(
        attempts,
        [
            Attempt::FIRST,
            Attempt::new(2, false),
            Attempt::new(3, false)
        ]
    );
}

/// A hedge that is not sent gives back what the service's `poll_ready` reserved for it, and a
/// service that fails its readiness only ends the hedging while an attempt is in flight (the
/// outside attack's findings, from the caller's side: a `ConcurrencyLimit`, a `LoadShed`, a
/// transport whose readiness fails as a closed `Buffer`'s or a failed `Reconnect`'s does).
mod hedge_readiness {
    use backstop::BoxError;
    use backstop::client::retry::hedge::Hedging;
    use backstop::client::retry::{Budget, ReplayBody, RetryConfig};
    use bytes::Bytes;
    use http::{Request, Response};
    use http_body_util::{BodyExt, Full};
    use std::{
        convert::Infallible,
        sync::{
            Arc, Mutex,
            atomic::{AtomicUsize, Ordering},
        },
        task::{Context, Poll},
        time::Duration,
    };
    use tokio::time::{Instant, sleep};
    use tower::{Layer, Service, ServiceExt, service_fn};

    /// A budget that grants nothing.
    #[derive(Debug)]
    struct Spent;

    impl Budget for Spent {
        fn record_success(&self) {}
        fn try_withdraw(&self) -> bool {
            false
        }
        fn balance(&self) -> f64 {
            0.0
        }
    }

    fn get(path: &str) -> Request<Full<Bytes>> {
        Request::get(format!("http://dep{path}"))
            .body(Full::default())
            .unwrap()
    }

    /// A retry layer that hedges after 100 ms, up to `max_attempts`, with no budget.
    fn hedged_after_100ms(
        max_attempts: u32,
    ) -> backstop::prelude::RetryLayer<backstop::HttpClassifier> {
        RetryConfig::http()
            .hedging(Hedging::new(Duration::from_millis(100)).max_attempts(max_attempts))
            .no_budget()
            .seed(1)
            .build()
            .unwrap()
    }

    /// Sends a GET through `client` and returns its answer's body and when it came.
    async fn answered<S, B>(client: S) -> (Bytes, Duration)
    where
        S: Service<Request<Full<Bytes>>, Response = Response<B>>,
        S::Error: std::fmt::Debug,
        B: http_body::Body,
        B::Error: std::fmt::Debug,
    {
        let t0 = Instant::now();
        let response = client.oneshot(get("/item")).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (body, t0.elapsed())
    }

    /// A hedge the budget refuses holds no permit of a `ConcurrencyLimit` inside: a second
    /// call, 200 ms later, goes at once (one of the two permits is A's attempt).
    #[tokio::test(start_paused = true)]
    async fn a_hedge_the_budget_refuses_gives_its_permit_back() {
        let t0 = Instant::now();
        let arrivals = Arc::new(Mutex::new(Vec::<(String, u128)>::new()));
        let log = arrivals.clone();
        let dependency = service_fn(move |req: Request<ReplayBody<Full<Bytes>>>| {
            let log = log.clone();
            async move {
                let at = (Instant::now() - t0).as_millis();
                log.lock().unwrap().push((req.uri().path().to_owned(), at));
                if req.uri().path() == "/slow" {
                    sleep(Duration::from_secs(1)).await;
                }
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        });
        let layer = RetryConfig::http()
            .hedging(Hedging::new(Duration::from_millis(100)).max_attempts(2))
            .budget(Arc::new(Spent))
            .seed(1)
            .build()
            .unwrap();
        let client = layer.layer(tower::limit::ConcurrencyLimit::new(dependency, 2));
        let slow = tokio::spawn(client.clone().oneshot(get("/slow")));
        sleep(Duration::from_millis(200)).await;
        let fast = tokio::spawn(client.clone().oneshot(get("/fast")));
        fast.await.unwrap().unwrap();
        slow.await.unwrap().unwrap();
        assert_eq!(
            *arrivals.lock().unwrap(),
            [("/slow".to_owned(), 0), ("/fast".to_owned(), 200)]
        );
    }

    /// A transport whose second `poll_ready` fails; every call answers after 300 ms.
    #[derive(Clone)]
    struct FailsSecondReadiness {
        polls: Arc<AtomicUsize>,
    }

    impl Service<Request<ReplayBody<Full<Bytes>>>> for FailsSecondReadiness {
        type Response = Response<String>;
        type Error = BoxError;
        type Future =
            std::pin::Pin<Box<dyn Future<Output = Result<Response<String>, BoxError>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            match self.polls.fetch_add(1, Ordering::SeqCst) {
                1 => Poll::Ready(Err("the pool is closed".into())),
                _ => Poll::Ready(Ok(())),
            }
        }

        fn call(&mut self, _req: Request<ReplayBody<Full<Bytes>>>) -> Self::Future {
            Box::pin(async {
                sleep(Duration::from_millis(300)).await;
                Ok(Response::new("the first attempt's answer".to_owned()))
            })
        }
    }

    /// The hedge due at 100 ms finds the service failing its readiness: the hedging ends,
    /// and the attempt in flight still answers the call at 300 ms.
    #[tokio::test(start_paused = true)]
    async fn a_hedges_failed_readiness_keeps_the_attempt_in_flight() {
        let layer = hedged_after_100ms(3);
        let polls = Arc::new(AtomicUsize::new(0));
        let client = layer.layer(FailsSecondReadiness {
            polls: polls.clone(),
        });
        let (body, at) = answered(client).await;
        assert_eq!(body, "the first attempt's answer");
        assert_eq!(at, Duration::from_millis(300));
        // Not polled again once it failed: no third attempt was tried.
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    /// `LoadShed` over a full `ConcurrencyLimit(1)`: the hedge's readiness says `Overloaded`,
    /// and the first attempt's 200 is the call's answer.
    #[tokio::test(start_paused = true)]
    async fn a_shed_hedge_keeps_the_attempt_in_flight() {
        let dependency = service_fn(|_req: Request<ReplayBody<Full<Bytes>>>| async {
            sleep(Duration::from_millis(300)).await;
            Ok::<_, Infallible>(Response::new("ok".to_owned()))
        });
        let layer = hedged_after_100ms(2);
        let inner = tower::ServiceBuilder::new()
            .load_shed()
            .concurrency_limit(1)
            .service(dependency);
        let client = layer.layer(inner);
        let (body, at) = answered(client).await;
        assert_eq!(body, "ok");
        assert_eq!(at, Duration::from_millis(300));
    }

    /// With no attempt in flight (the hedge after a failure), a readiness error is the call's
    /// answer, as it is a retry's.
    #[tokio::test(start_paused = true)]
    async fn with_none_in_flight_a_failed_readiness_ends_the_call() {
        let polls = Arc::new(AtomicUsize::new(0));
        let seen = polls.clone();
        #[derive(Clone)]
        struct FailsThenBroken(Arc<AtomicUsize>);
        impl Service<Request<ReplayBody<Full<Bytes>>>> for FailsThenBroken {
            type Response = Response<String>;
            type Error = BoxError;
            type Future = std::future::Ready<Result<Response<String>, BoxError>>;
            fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
                match self.0.fetch_add(1, Ordering::SeqCst) {
                    0 => Poll::Ready(Ok(())),
                    _ => Poll::Ready(Err("the pool is closed".into())),
                }
            }
            fn call(&mut self, _req: Request<ReplayBody<Full<Bytes>>>) -> Self::Future {
                let mut response = Response::new(String::new());
                *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                std::future::ready(Ok(response))
            }
        }
        let layer = hedged_after_100ms(3);
        let err = layer
            .layer(FailsThenBroken(seen))
            .oneshot(get("/item"))
            .await
            .unwrap_err();
        assert!(format!("{err:?}").contains("the pool is closed"), "{err:?}");
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }
}
