//! What each attempt tells the server (`grpc-timeout`) and when retries may be scheduled,
//! against the deadline really on the wire.

use backstop::client::retry::{ReplayBody, RetryConfig, backoff};
use backstop::deadline::{Deadline, PropagateDeadlineLayer};
use backstop::find;
use backstop::wire::grpc_timeout;
use backstop_test_support::{MS, grpc_status as status};
use http::{Request, Response};
use proptest::prelude::*;
use std::time::Duration;
use tokio::time::{Instant, advance};
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_test::mock;

/// A unary gRPC call to `pkg.Svc/Call`.
fn grpc() -> Request<String> {
    backstop_test_support::grpc_call("msg")
}

type Req = Request<ReplayBody<String>>;

/// A server's hint in a generated answer.
#[derive(Debug, Clone, Copy)]
enum Hint {
    /// `grpc-retry-pushback-ms: n`.
    Pushback(u32),
    /// `Retry-After: n` (seconds).
    RetryAfter(u32),
}

fn hinted(code: u16, hint: Option<Hint>) -> Response<String> {
    match hint {
        Some(Hint::Pushback(ms)) => status(code, Some(&ms.to_string())),
        Some(Hint::RetryAfter(s)) => {
            let mut r = status(code, None);
            r.headers_mut()
                .insert("retry-after", s.to_string().parse().unwrap());
            r
        }
        None => status(code, None),
    }
}

fn header(req: &Req) -> Option<Duration> {
    req.headers()
        .get("grpc-timeout")
        .map(|v| grpc_timeout::decode_header(v).unwrap())
}

/// Defect: with `PropagateDeadline` (100 ms, offset 20 ms) outside the retry layer (backoff
/// 60 ms), an UNAVAILABLE at 30 ms was scheduled for a retry at 90 ms — after the 80 ms the
/// server was told — so the caller got DEADLINE_EXCEEDED at 90 ms, and a retry and a token
/// were spent on an attempt never sent. Now the real UNAVAILABLE comes back at 30 ms.
#[tokio::test(start_paused = true)]
async fn no_retry_is_scheduled_past_the_deadline_on_the_wire() {
    let retry = RetryConfig::grpc()
        .backoff(backoff::constant(60 * MS))
        .build()
        .unwrap();
    let deadline = PropagateDeadlineLayer::builder()
        .timeout(100 * MS)
        .offset(20 * MS)
        .build()
        .unwrap();
    let (mock, mut handle) = mock::pair::<Req, Response<String>>();
    let client = ServiceBuilder::new()
        .layer(deadline)
        .layer(retry.clone())
        .service(mock);
    let t0 = Instant::now();
    let call = tokio::spawn(client.oneshot(grpc()));
    let (first, send) = handle.next_request().await.unwrap();
    assert_eq!(header(&first), Some(80 * MS));
    advance(30 * MS).await;
    send.send_response(status(14, None));
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(Instant::now() - t0, 30 * MS);
    assert_eq!(retry.stats().retries, 0);
    assert!(!matches!(
        handle.poll_request(),
        std::task::Poll::Ready(Some(_))
    ));
}

/// Defect: the retry layer alone kept a caller's `grpc-timeout: 100m` (as tonic's
/// `set_timeout` writes it) on a retry sent at 90 ms; and with a 100 ms deadline in scope a
/// caller's `10S` went out on the first attempt as it was.
#[tokio::test(start_paused = true)]
async fn every_attempt_says_the_time_really_left_whoever_wrote_the_header() {
    let layer = retrying_every_10ms();
    let (mock, mut handle) = mock::pair::<Req, Response<String>>();
    let mut req = grpc();
    req.headers_mut()
        .insert("grpc-timeout", "100m".parse().unwrap());
    let call = tokio::spawn(layer.layer(mock).oneshot(req));
    let (first, send) = handle.next_request().await.unwrap();
    assert_eq!(header(&first), Some(100 * MS));
    advance(80 * MS).await;
    send.send_response(status(14, None));
    let (second, send) = handle.next_request().await.unwrap();
    assert_eq!(header(&second), Some(10 * MS), "sent at 90 ms of 100");
    send.send_response(status(0, None));
    call.await.unwrap().unwrap();

    // The same with a request of many headers (the header found among them).
    let layer = retrying_every_10ms();
    let (mock, mut handle) = mock::pair::<Req, Response<String>>();
    let mut req = grpc();
    for i in 0..12 {
        req.headers_mut().insert(
            format!("x-extra-{i}").parse::<http::HeaderName>().unwrap(),
            "1".parse().unwrap(),
        );
    }
    req.headers_mut()
        .insert("grpc-timeout", "100m".parse().unwrap());
    let call = tokio::spawn(layer.layer(mock).oneshot(req));
    let (_, send) = handle.next_request().await.unwrap();
    advance(80 * MS).await;
    send.send_response(status(14, None));
    let (second, send) = handle.next_request().await.unwrap();
    assert_eq!(header(&second), Some(10 * MS));
    send.send_response(status(0, None));
    call.await.unwrap().unwrap();

    let layer = RetryConfig::grpc().no_budget().build().unwrap();
    let (mock, mut handle) = mock::pair::<Req, Response<String>>();
    let mut req = grpc();
    req.headers_mut()
        .insert("grpc-timeout", "10S".parse().unwrap());
    req.extensions_mut().insert(Deadline::after(100 * MS));
    let call = tokio::spawn(layer.layer(mock).oneshot(req));
    let (first, send) = handle.next_request().await.unwrap();
    assert_eq!(header(&first), Some(100 * MS));
    send.send_response(status(0, None));
    call.await.unwrap().unwrap();
}

/// How the caller bounds the call in a generated case.
#[derive(Debug, Clone, Copy)]
enum Bound {
    /// `PropagateDeadline` outside the retry layer: local deadline `t0 + timeout`, wire
    /// `t0 + timeout − offset`.
    Propagate { timeout_ms: u64, offset_ms: u64 },
    /// A header the caller set, no local deadline.
    Header { ms: u64 },
    /// A local deadline and a caller's header that may say more or less.
    Both { deadline_ms: u64, header_ms: u64 },
}

fn bound() -> impl Strategy<Value = Bound> {
    prop_oneof![
        (20u64..1500, 0u64..100).prop_map(|(t, o)| Bound::Propagate {
            timeout_ms: t,
            offset_ms: o.min(t / 2),
        }),
        (20u64..1500).prop_map(|ms| Bound::Header { ms }),
        (20u64..1500, 20u64..1500).prop_map(|(d, h)| Bound::Both {
            deadline_ms: d,
            header_ms: h,
        }),
    ]
}

/// One attempt's answer: its latency and status (UNAVAILABLE with an optional pushback or
/// `Retry-After`, or OK).
fn answer() -> impl Strategy<Value = (u64, u16, Option<Hint>)> {
    (
        0u64..300,
        prop_oneof![3 => Just(14u16), 1 => Just(0u16)],
        prop_oneof![
            2 => Just(None),
            2 => (0u32..400).prop_map(|ms| Some(Hint::Pushback(ms))),
            1 => (0u32..2).prop_map(|s| Some(Hint::RetryAfter(s))),
        ],
    )
}

/// An answer not given yet: when, to whom, what.
type Pending = (
    Duration,
    mock::SendResponse<Response<String>>,
    u16,
    Option<Hint>,
);

#[derive(Debug)]
struct Sent {
    at: Duration,
    header: Option<Duration>,
    answer_at: Duration,
    code: u16,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Random bounds, offsets, backoffs, latencies, pushbacks and `Retry-After`s: every
    /// attempt's `grpc-timeout` is at most what is really left of every bound, no attempt is
    /// sent that could not be sent within the deadline on the wire, and the result returned
    /// is the last real one.
    #[test]
    fn the_schedule_respects_the_wire(
        bound in bound(),
        backoff_ms in 0u64..300,
        max_attempts in 2u32..6,
        answers in prop::collection::vec(answer(), 6),
    ) {
        let rt = backstop_test_support::paused_runtime();
        rt.block_on(async move {
            let retry = RetryConfig::grpc()
                .no_budget()
                .max_attempts(max_attempts)
                .backoff(backoff::constant(Duration::from_millis(backoff_ms)))
                .build()
                .unwrap();
            let (mock, mut handle) = mock::pair::<Req, Response<String>>();
            // Each attempt is stamped with the instant it was really sent.
            let stamp: fn(Req) -> Req = |mut r| {
                r.extensions_mut().insert(Instant::now());
                r
            };
            let mock = ServiceBuilder::new().map_request(stamp).service(mock);
            let t0 = Instant::now();
            let mut req = grpc();
            let (local, wire): (Option<Duration>, Option<Duration>) = match bound {
                Bound::Propagate { timeout_ms, offset_ms } => {
                    (Some(Duration::from_millis(timeout_ms)), Some(Duration::from_millis(timeout_ms - offset_ms)))
                }
                Bound::Header { ms } => {
                    req.headers_mut().insert("grpc-timeout", format!("{ms}m").parse().unwrap());
                    (Some(Duration::from_millis(ms)), Some(Duration::from_millis(ms)))
                }
                Bound::Both { deadline_ms, header_ms } => {
                    req.headers_mut().insert("grpc-timeout", format!("{header_ms}m").parse().unwrap());
                    req.extensions_mut().insert(Deadline::after(Duration::from_millis(deadline_ms)));
                    (Some(Duration::from_millis(deadline_ms)), Some(Duration::from_millis(header_ms)))
                }
            };
            let call = match bound {
                Bound::Propagate { timeout_ms, offset_ms } => {
                    let outer = PropagateDeadlineLayer::builder()
                        .timeout(Duration::from_millis(timeout_ms))
                        .offset(Duration::from_millis(offset_ms))
                        .build()
                        .unwrap();
                    let client = ServiceBuilder::new().layer(outer).layer(retry).service(mock);
                    tokio::spawn(async move {
                        client.oneshot(req).await.map(|r| r.headers().get("grpc-status").cloned())
                    })
                }
                _ => {
                    let client = retry.layer(mock);
                    tokio::spawn(async move {
                        client.oneshot(req).await.map(|r| r.headers().get("grpc-status").cloned())
                    })
                }
            };
            let send_by = match (local, wire) {
                (Some(l), Some(w)) => l.min(w),
                (l, w) => l.or(w).unwrap(),
            };
            let mut sent: Vec<Sent> = Vec::new();
            let mut pending: Vec<Pending> = Vec::new();
            // Bounded: every bound here is under 2 s.
            for _ in 0..4000 {
                if call.is_finished() {
                    break;
                }
                while let std::task::Poll::Ready(Some((req, send))) = handle.poll_request() {
                    let (latency, code, hint) = answers[sent.len().min(answers.len() - 1)];
                    let at = *req.extensions().get::<Instant>().unwrap() - t0;
                    sent.push(Sent { at, header: header(&req), answer_at: at + Duration::from_millis(latency), code });
                    pending.push((at + Duration::from_millis(latency), send, code, hint));
                }
                let now = Instant::now() - t0;
                for (_, send, code, hint) in pending.extract_if(.., |(at, ..)| *at <= now) {
                    send.send_response(hinted(code, hint));
                }
                tokio::task::yield_now().await;
                advance(MS).await;
            }
            prop_assert!(call.is_finished(), "the call ended within its bounds");
            let result = call.await.unwrap();
            prop_assert!(!sent.is_empty());
            for (i, s) in sent.iter().enumerate() {
                let mut left = send_by.saturating_sub(s.at);
                if let Some(l) = local {
                    left = left.min(l.saturating_sub(s.at));
                }
                let h = s.header.expect("every bounded attempt carries grpc-timeout");
                prop_assert!(h <= left + MS, "attempt {i} at {:?} says {h:?}, {left:?} left", s.at);
                prop_assert!(!h.is_zero());
                if i > 0 {
                    prop_assert!(s.at + MS <= send_by, "retry {i} sent at {:?}, wire ends {send_by:?}", s.at);
                }
            }
            let last = sent.last().unwrap();
            let end = local.unwrap();
            let in_time = last.answer_at < end;
            match result {
                // The last real answer (it may also win a tie at its end).
                Ok(Some(code)) if code.to_str().unwrap() == last.code.to_string() => {}
                // The deadline layer's own DEADLINE_EXCEEDED: only for an attempt still in
                // flight when the deadline came.
                Ok(Some(code)) => {
                    prop_assert_eq!(code.to_str().unwrap(), "4");
                    prop_assert!(!in_time, "{sent:?}");
                }
                Ok(None) => prop_assert!(false, "a response without a status"),
                Err(e) => {
                    prop_assert!(find::<backstop::DeadlineExceeded>(&*e).is_some(), "{e}");
                    prop_assert!(!in_time, "answered at {:?} before its end {end:?}", last.answer_at);
                }
            }
            Ok(())
        })?;
    }
}

/// The gRPC preset, no budget, a constant 10 ms backoff.
fn retrying_every_10ms() -> backstop::client::retry::RetryLayer<backstop::GrpcClassifier> {
    RetryConfig::grpc()
        .no_budget()
        .backoff(backoff::constant(10 * MS))
        .build()
        .unwrap()
}

/// A retry layer alone refreshes the `grpc-timeout` a request carried and writes none on a
/// request sent without one, a named copy as the layer: every attempt tells the server the
/// same thing (the header with the time left, or nothing).
#[tokio::test(start_paused = true)]
async fn a_retry_layer_alone_refreshes_only_a_header_the_request_carried() {
    let layer = RetryConfig::grpc()
        .no_budget()
        .backoff(backoff::constant(10 * MS))
        .build()
        .unwrap();
    for carried in [false, true] {
        for layer in [layer.clone(), layer.named("partner")] {
            let (mock, mut handle) = mock::pair::<Req, Response<String>>();
            let mut req = grpc();
            req.extensions_mut().insert(Deadline::after(100 * MS));
            if carried {
                req.headers_mut()
                    .insert("grpc-timeout", http::HeaderValue::from_static("100m"));
            }
            let call = tokio::spawn(layer.layer(mock).oneshot(req));
            let (first, send) = handle.next_request().await.unwrap();
            send.send_response(status(14, None));
            let (second, send) = handle.next_request().await.unwrap();
            send.send_response(status(0, None));
            call.await.unwrap().unwrap();
            assert_eq!(
                header(&first),
                carried.then_some(100 * MS),
                "carried: {carried}"
            );
            assert_eq!(
                header(&second),
                carried.then_some(90 * MS),
                "carried: {carried}"
            );
        }
    }
}

/// A retry layer used alone never sends an attempt whose deadline has passed, whatever says
/// so: a caller's `grpc-timeout: 0n` (with no local deadline, or under a far one), or a
/// `Deadline` extension or scope that passed, on a call it may retry or one it sends once
/// (`max_attempts(1)`, a body too long to keep). The caller gets `DeadlineExceeded`, no
/// attempt taken. (Found by an outside attack: the header and the sent-once paths sent it.)
#[tokio::test(start_paused = true)]
async fn a_retry_layer_alone_sends_nothing_past_the_deadline() {
    let layers = [
        ("retried", RetryConfig::grpc().build().unwrap()),
        ("once", RetryConfig::grpc().max_attempts(1).build().unwrap()),
        (
            "too long to keep",
            RetryConfig::grpc().max_replay_bytes(1).build().unwrap(),
        ),
    ];
    for (name, layer) in layers {
        for case in [
            "0n",
            "0n under a far scope",
            "passed extension",
            "passed scope",
        ] {
            let (mock, mut handle) = mock::pair::<Req, Response<String>>();
            let service = layer.layer(mock);
            let mut req = grpc();
            let passed = Deadline::after(5 * MS);
            match case {
                "passed extension" => {
                    req.extensions_mut().insert(passed);
                }
                "passed scope" => {}
                _ => {
                    req.headers_mut()
                        .insert("grpc-timeout", http::HeaderValue::from_static("0n"));
                }
            }
            advance(10 * MS).await;
            let call = service.oneshot(req);
            let result = match case {
                "passed scope" => passed.scope(call).await,
                "0n under a far scope" => {
                    Deadline::after(Duration::from_secs(10)).scope(call).await
                }
                _ => call.await,
            };
            let err = result.expect_err(&format!("{name}, {case}: answered"));
            assert!(
                backstop::is_deadline_exceeded(&*err),
                "{name}, {case}: {err}"
            );
            let info = err
                .downcast_ref::<backstop::client::retry::RetryError>()
                .unwrap();
            assert_eq!(info.attempts(), 0, "{name}, {case}");
            // The service is gone with the call: anything it sent would still be queued.
            assert!(
                handle.next_request().await.is_none(),
                "{name}, {case}: an attempt went out"
            );
        }
    }
}

/// A call a retry layer used alone sends once is bounded by its deadline as a retried call's
/// attempts are: a dependency still working at the deadline is cut there, `DeadlineExceeded`.
#[tokio::test(start_paused = true)]
async fn a_call_sent_once_by_a_retry_layer_alone_ends_at_its_deadline() {
    for layer in [
        RetryConfig::grpc().max_attempts(1).build().unwrap(),
        RetryConfig::grpc().max_replay_bytes(1).build().unwrap(),
    ] {
        let (mock, mut handle) = mock::pair::<Req, Response<String>>();
        let mut req = grpc();
        req.extensions_mut().insert(Deadline::after(50 * MS));
        let t0 = Instant::now();
        let call = tokio::spawn(layer.layer(mock).oneshot(req));
        let (_sent, _answer_never) = handle.next_request().await.unwrap();
        let err = call.await.unwrap().unwrap_err();
        assert_eq!(Instant::now() - t0, 50 * MS);
        assert!(backstop::is_deadline_exceeded(&*err), "{err}");
    }
}
