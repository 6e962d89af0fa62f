//! gRFC A6 where the retry layer used to differ: what the throttle counts, the retryable set,
//! pushback timing, and failures that arrive in trailers after the headers.

use backstop::client::retry::backoff::Jitter;
use backstop::client::retry::{
    Budget, GrpcThrottle, RatioBudget, ReplayBody, RetryConfig, RetryLayer, backoff,
};
use backstop::{Code, GrpcClassifier};
use backstop_test_support::{MS, grpc_status as status};
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, channel::Channel};
use std::{convert::Infallible, sync::Arc, time::Duration};
use tokio::time::{Instant, advance};
use tokio_test::{assert_pending, assert_ready};
use tower::{Layer, ServiceExt};
use tower_test::mock;

/// A unary gRPC call to `pkg.Svc/Call`.
fn grpc() -> Request<String> {
    backstop_test_support::grpc_call("msg")
}

type Req = Request<ReplayBody<String>>;

/// Runs one gRPC call through `layer`, answering attempt `i` with `answers[i]`; returns how
/// many attempts were made, the instants (since the call) they were sent at, and the final
/// status.
async fn run(
    layer: RetryLayer<GrpcClassifier>,
    answers: &[Response<String>],
) -> (usize, Vec<Duration>, String) {
    let (mock, mut handle) = mock::pair::<Req, Response<String>>();
    let t0 = Instant::now();
    let mut call = tokio_test::task::spawn(layer.layer(mock).oneshot(grpc()));
    let mut sent = Vec::new();
    for answer in answers {
        // Bounded: every wait in these tests is below 10 s.
        let mut next = None;
        for _ in 0..10_000 {
            if let std::task::Poll::Ready(result) = call.poll() {
                let response = result.unwrap();
                return (sent.len(), sent, status_of(&response));
            }
            if let std::task::Poll::Ready(Some(pair)) = handle.poll_request() {
                next = Some(pair);
                break;
            }
            advance(MS).await;
        }
        let (_, send) = next.expect("an attempt or an answer within 10 s");
        sent.push(Instant::now() - t0);
        send.send_response(answer.clone());
    }
    let response = assert_ready!(call.poll()).unwrap();
    (sent.len(), sent, status_of(&response))
}

/// gRPC's A6 throttle with 10 tokens, each success giving back `token_ratio` of one.
fn throttle_of_10_tokens(token_ratio: f64) -> Arc<GrpcThrottle> {
    Arc::new(
        GrpcThrottle::builder()
            .max_tokens(10)
            .token_ratio(token_ratio)
            .build()
            .unwrap(),
    )
}

fn gaps(sent: &[Duration]) -> Vec<Duration> {
    sent.windows(2).map(|w| w[1] - w[0]).collect()
}

/// Defect: every failure took a throttle token, so six INTERNALs (never retryable) drained
/// `GrpcThrottle(10, 0.1)` and the next UNAVAILABLE was not retried. A6 counts only failures
/// with a retryable status, or a "do not retry" pushback.
#[tokio::test(start_paused = true)]
async fn the_throttle_counts_only_retryable_failures() {
    let throttle = throttle_of_10_tokens(0.1);
    let layer = RetryConfig::grpc()
        .budget(throttle.clone())
        .backoff(backoff::constant(MS))
        .build()
        .unwrap();
    for _ in 0..6 {
        let (attempts, _, code) = run(layer.clone(), &[status(13, None)]).await;
        assert_eq!((attempts, code.as_str()), (1, "13"));
    }
    assert_eq!(throttle.balance(), 10.0);
    let (attempts, _, code) = run(layer.clone(), &[status(14, None), status(0, None)]).await;
    assert_eq!((attempts, code.as_str()), (2, "0"));
    // A "do not retry" pushback counts, even on a code that is not retryable.
    let (attempts, _, _) = run(layer, &[status(13, Some("-1"))]).await;
    assert_eq!(attempts, 1);
    assert!((throttle.balance() - (10.0 - 1.0 + 0.1 - 1.0)).abs() < 1e-9);
}

/// Defect (found against grpcio): a RESOURCE_EXHAUSTED carrying a pushback was retried even
/// though the retryable set was UNAVAILABLE alone. The code decides; the pushback says when.
#[tokio::test(start_paused = true)]
async fn the_retryable_set_alone_decides() {
    let policy = || {
        RetryConfig::grpc()
            .no_budget()
            .backoff(backoff::constant(MS))
    };
    let only_unavailable = policy()
        .classifier(GrpcClassifier::new().retryable_codes([Code::Unavailable]))
        .build()
        .unwrap();
    let (attempts, _, code) =
        run(only_unavailable, &[status(8, Some("10")), status(0, None)]).await;
    assert_eq!((attempts, code.as_str()), (1, "8"));
    let with_exhausted = policy()
        .classifier(GrpcClassifier::new().retryable_codes([Code::ResourceExhausted]))
        .build()
        .unwrap();
    let (attempts, _, code) = run(with_exhausted, &[status(8, Some("10")), status(0, None)]).await;
    assert_eq!((attempts, code.as_str()), (2, "0"));
}

/// Defect: the wait was max(pushback, backoff) and the backoff kept growing (gaps 100/200/400
/// ms). A6: retry in exactly n ms, and the backoff starts over from its initial value.
#[tokio::test(start_paused = true)]
async fn a_pushback_is_when_to_retry_and_resets_the_backoff() {
    let layer = RetryConfig::grpc()
        .no_budget()
        .max_attempts(5)
        .backoff(backoff::exponential(100 * MS, Duration::from_secs(10)).jitter(Jitter::None))
        .build()
        .unwrap();
    let answers = [
        status(14, None),        // backoff: 100 ms
        status(14, None),        // backoff: 200 ms
        status(14, Some("0")),   // pushback: now, and the backoff starts over
        status(14, Some("250")), // pushback: 250 ms, shorter than any backoff would not matter
        status(0, None),
    ];
    let (attempts, sent, code) = run(layer.clone(), &answers).await;
    assert_eq!((attempts, code.as_str()), (5, "0"));
    assert_eq!(gaps(&sent), [100 * MS, 200 * MS, Duration::ZERO, 250 * MS]);
    // After a pushback the next backoff is the initial one again.
    let answers = [
        status(14, None),
        status(14, Some("30")),
        status(14, None),
        status(0, None),
    ];
    let (_, sent, _) = run(layer, &answers).await;
    assert_eq!(gaps(&sent), [100 * MS, 30 * MS, 100 * MS]);
}

type Streamed = Response<Channel<Bytes, Infallible>>;

fn committed() -> (Streamed, http_body_util::channel::Sender<Bytes, Infallible>) {
    let (tx, body) = Channel::new(4);
    let response = Response::builder()
        .header("content-type", "application/grpc")
        .body(body)
        .unwrap();
    (response, tx)
}

fn trailers(code: u16) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", code.to_string().parse().unwrap());
    t
}

/// Sends a committed response, then `end` on its body, and drains the body the caller got.
async fn committed_call(budget: Arc<dyn Budget>, end: Option<u16>) {
    let layer = RetryConfig::grpc().budget(budget).build().unwrap();
    let (mock, mut handle) = mock::pair::<Req, Streamed>();
    let mut call = tokio_test::task::spawn(layer.layer(mock).oneshot(grpc()));
    assert_pending!(call.poll());
    let (_, send) = handle.next_request().await.unwrap();
    let (response, mut tx) = committed();
    send.send_response(response);
    let response = assert_ready!(call.poll()).unwrap();
    tx.send_data(Bytes::from_static(b"message")).await.unwrap();
    if let Some(code) = end {
        tx.send_trailers(trailers(code)).await.unwrap();
    }
    drop(tx);
    let _ = response.into_body().collect().await;
}

/// Defect: a response whose headers arrived and whose trailers then said UNAVAILABLE was
/// counted a success at the headers, so the budget gained a token for a failed RPC.
#[tokio::test(start_paused = true)]
async fn a_failure_in_trailers_is_no_success() {
    // No reserve: the balance is what was deposited (one deposit is under the token a second
    // the burst limit always allows).
    let ratio = || Arc::new(RatioBudget::builder().min_per_sec(0).build().unwrap());
    let ok = ratio();
    committed_call(ok.clone(), Some(0)).await;
    assert!((ok.balance() - 0.1).abs() < 1e-9, "OK in trailers deposits");
    let failed = ratio();
    committed_call(failed.clone(), Some(14)).await;
    assert_eq!(
        failed.balance(),
        0.0,
        "UNAVAILABLE in trailers deposits nothing"
    );
    let cut = ratio();
    committed_call(cut.clone(), None).await;
    assert_eq!(
        cut.balance(),
        0.0,
        "a stream without a status is no success"
    );

    let throttle = throttle_of_10_tokens(0.5);
    committed_call(throttle.clone(), Some(14)).await;
    assert_eq!(throttle.balance(), 9.0, "A6: a failed RPC takes a token");
    committed_call(throttle.clone(), Some(0)).await;
    assert_eq!(throttle.balance(), 9.5);
    committed_call(throttle.clone(), Some(13)).await;
    assert_eq!(
        throttle.balance(),
        9.5,
        "INTERNAL is not retryable: not counted"
    );
}

/// A response's `grpc-status`.
fn status_of<B>(response: &Response<B>) -> String {
    response.headers()["grpc-status"]
        .to_str()
        .unwrap()
        .to_owned()
}

/// Defect (issue 23, 9): a call sent once (retries off: `max_attempts(1)`, as the service
/// config gives a method without a policy) never told the throttle its outcome; A6 counts
/// every RPC, whatever its method. Its failures take tokens and its successes add them.
#[tokio::test(start_paused = true)]
async fn the_throttle_hears_calls_that_are_never_retried() {
    let throttle = throttle_of_10_tokens(0.1);
    let once = RetryConfig::grpc()
        .max_attempts(1)
        .budget(throttle.clone())
        .build()
        .unwrap();
    for _ in 0..6 {
        let (attempts, _, code) = run(once.clone(), &[status(14, None)]).await;
        assert_eq!((attempts, code.as_str()), (1, "14"));
    }
    assert!((throttle.balance() - 4.0).abs() < 1e-9);
    for _ in 0..30 {
        run(once.clone(), &[status(0, None)]).await;
    }
    assert!(
        (throttle.balance() - 7.0).abs() < 1e-9,
        "{}",
        throttle.balance()
    );
    // A status that is not retryable is not a throttle failure, sent once or not.
    run(once, &[status(13, None)]).await;
    assert!((throttle.balance() - 7.0).abs() < 1e-9);
}
