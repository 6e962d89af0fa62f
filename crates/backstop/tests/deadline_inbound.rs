//! `DeadlineLayer` driven with mock services under paused time.

use backstop::deadline::{Deadline, DeadlineLayer, DeadlineService, current};
use backstop::{NotExecuted, Rejection};
use backstop_test_support::*;
use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, StreamBody};
use std::{convert::Infallible, sync::atomic::Ordering, time::Duration};
use tokio::time::advance;
use tokio_test::{assert_pending, assert_ready};
use tower::{Layer, ServiceExt, service_fn};
use tower_test::mock;

/// A service that answers with what the handler saw: the extension and the task-local.
fn reporter() -> impl backstop_test_support::Dependency<Request<String>> {
    service_fn(|req: Request<String>| async move {
        let ext = req.extensions().get::<Deadline>().copied();
        let body = match (ext, current()) {
            (Some(ext), Some(cur)) => {
                assert_eq!(ext, cur, "extension and task-local agree");
                format!("{}", ext.remaining().as_millis())
            }
            (None, None) => "none".to_owned(),
            other => panic!("extension and task-local disagree: {other:?}"),
        };
        Ok(Response::new(body))
    })
}

async fn text<B: http_body::Body<Error: std::fmt::Debug>>(response: Response<B>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn seen(layer: DeadlineLayer, req: Request<String>) -> String {
    let response = layer.layer(reporter()).oneshot(req).await.unwrap();
    text(response).await
}

/// `layer` in front of a mock, and the mock's handle.
fn mocked(layer: DeadlineLayer) -> (DeadlineService<Mock>, Handle) {
    let (service, handle) = mock::spawn_layer(layer);
    (service.into_inner(), handle)
}

/// A call through a `DeadlineLayer` in front of a mock, polled by hand.
type MockedCall =
    tokio_test::task::Spawn<tower::util::Oneshot<DeadlineService<Mock>, Request<String>>>;

/// A call with `req` through `layer` in front of a mock, spawned but not yet polled, and the
/// mock's handle.
fn mocked_call(layer: DeadlineLayer, req: Request<String>) -> (MockedCall, Handle) {
    let (service, handle) = mocked(layer);
    (tokio_test::task::spawn(service.oneshot(req)), handle)
}

/// What `handler` behind a `DeadlineLayer` answers a call with 100 ms left, gRPC or plain
/// HTTP.
async fn answered_with_100ms<H>(
    handler: H,
    grpc: bool,
) -> <DeadlineService<H> as tower::Service<Request<String>>>::Response
where
    DeadlineService<H>: tower::Service<Request<String>, Error = Infallible>,
{
    DeadlineLayer::new()
        .layer(handler)
        .oneshot(request(grpc, Some("100m")))
        .await
        .unwrap()
}

/// A handler that answers when its deadline comes, with `messages` and then the trailers
/// `grpc-status: 0`, every frame ready at once and no size declared (tonic's unary answer:
/// its message, then its trailers).
fn ready_at_the_deadline(
    messages: &'static [&'static str],
) -> impl tower::Service<
    Request<String>,
    Response = Response<impl Body<Data = Bytes, Error = Infallible> + Send + Unpin>,
    Error = Infallible,
> + Clone {
    service_fn(move |_req: Request<String>| async move {
        tokio::time::sleep(current().unwrap().remaining()).await;
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let frames = messages
            .iter()
            .map(|m| Frame::data(Bytes::from_static(m.as_bytes())))
            .chain([Frame::trailers(trailers)]);
        let body = StreamBody::new(futures_util::stream::iter(frames.map(Ok::<_, Infallible>)));
        Ok::<_, Infallible>(Response::new(body))
    })
}

#[tokio::test(start_paused = true)]
async fn grpc_timeout_becomes_the_handlers_deadline() {
    // 800 ms requested, less the 1 ms lead (a constant: tonic's own timer must lose).
    assert_eq!(
        seen(DeadlineLayer::new(), grpc_request(Some("800m"))).await,
        "799"
    );
    assert_eq!(
        seen(DeadlineLayer::new(), http_request(Some("2S"))).await,
        "1999"
    );
    // Leading zeros are fine.
    assert_eq!(
        seen(DeadlineLayer::new(), http_request(Some("00000003S"))).await,
        "2999"
    );
    // A timeout no longer than the lead leaves nothing: refused on arrival.
    let spent = DeadlineLayer::new()
        .layer(reporter())
        .oneshot(grpc_request(Some("1000u")))
        .await
        .unwrap();
    assert_eq!(spent.headers()["grpc-status"], "4");
}

#[tokio::test(start_paused = true)]
async fn no_header_and_no_default_means_no_deadline() {
    assert_eq!(seen(DeadlineLayer::new(), http_request(None)).await, "none");
}

#[tokio::test(start_paused = true)]
async fn default_applies_only_when_absent() {
    let layer = DeadlineLayer::builder()
        .default_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    assert_eq!(seen(layer.clone(), http_request(None)).await, "2000");
    assert_eq!(seen(layer, http_request(Some("300m"))).await, "299");
}

#[tokio::test(start_paused = true)]
async fn max_clamps_long_deadlines() {
    let layer = DeadlineLayer::builder()
        .max(Duration::from_secs(1))
        .default_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    assert_eq!(seen(layer.clone(), http_request(Some("10S"))).await, "1000");
    assert_eq!(
        seen(layer.clone(), http_request(Some("99999999H"))).await,
        "1000"
    );
    assert_eq!(seen(layer, http_request(Some("200m"))).await, "199");
}

#[tokio::test(start_paused = true)]
async fn huge_timeouts_without_max_do_not_panic() {
    let out = seen(DeadlineLayer::new(), http_request(Some("99999999H"))).await;
    assert!(out.parse::<u128>().unwrap() > 86_400_000 * 365, "{out}");
}

#[tokio::test(start_paused = true)]
async fn millis_header_is_read_and_the_shorter_wins() {
    let layer = DeadlineLayer::builder()
        .millis_header("x-envoy-expected-rq-timeout-ms")
        .build()
        .unwrap();
    let req = |grpc: Option<&str>, ms: &str| {
        let mut req = http_request(grpc);
        req.headers_mut()
            .insert("x-envoy-expected-rq-timeout-ms", ms.parse().unwrap());
        req
    };
    // The shorter of the two, less the 1 ms lead.
    assert_eq!(seen(layer.clone(), req(None, "250")).await, "249");
    assert_eq!(seen(layer.clone(), req(Some("1S"), "250")).await, "249");
    assert_eq!(seen(layer.clone(), req(Some("100m"), "250")).await, "99");
    let bad = seen(layer, req(None, "2.5")).await;
    assert_eq!(bad, "malformed grpc-timeout");
}

#[tokio::test(start_paused = true)]
async fn the_shortest_of_repeated_headers_wins() {
    let mut req = http_request(Some("5S"));
    req.headers_mut()
        .append("grpc-timeout", "300m".parse().unwrap());
    assert_eq!(seen(DeadlineLayer::new(), req).await, "299");
}

#[tokio::test(start_paused = true)]
async fn malformed_header_is_rejected_without_calling_the_service() {
    for bad in ["", "1.5S", "123456789n", "10X", "-1S", "S"] {
        let (mut service, mut handle) = mocked(DeadlineLayer::new());
        let grpc = (&mut service)
            .oneshot(grpc_request(Some(bad)))
            .await
            .unwrap();
        assert_eq!(grpc.status(), 200, "{bad:?}");
        assert_eq!(grpc.headers()["grpc-status"], "13");
        assert_eq!(grpc.headers()["grpc-message"], "malformed grpc-timeout");
        assert_eq!(
            grpc.extensions().get::<Rejection>(),
            Some(&Rejection::MalformedTimeout)
        );

        let plain = (&mut service)
            .oneshot(http_request(Some(bad)))
            .await
            .unwrap();
        assert_eq!(plain.status(), 400);
        // Refused before the service was called: nothing happened.
        assert!(grpc.extensions().get::<NotExecuted>().is_some());
        assert!(plain.extensions().get::<NotExecuted>().is_some());
        assert_eq!(text(plain).await, "malformed grpc-timeout");
        assert_pending!(handle.poll_request());
    }
}

/// A malformed header is never read as absent: a default timeout does not stand in for it
/// (the caller asked for a bound this server cannot read), and the service is not called.
#[tokio::test(start_paused = true)]
async fn a_malformed_header_is_refused_even_with_a_default() {
    let layer = DeadlineLayer::builder()
        .default_timeout(Duration::from_millis(700))
        .build()
        .unwrap();
    assert_eq!(
        seen(layer.clone(), http_request(Some("bogus"))).await,
        "malformed grpc-timeout"
    );
    assert_eq!(seen(layer, http_request(None)).await, "700");
}

#[tokio::test(start_paused = true)]
async fn zero_or_too_little_left_is_rejected_at_once() {
    let layer = DeadlineLayer::builder()
        .min_remaining(Duration::from_millis(10))
        .build()
        .unwrap();
    // What is left is the header's timeout less the 1 ms lead: 10 ms asked leaves 9.
    let cases = [
        ("0n", true),
        ("0S", true),
        ("9m", true),
        ("10m", true),
        ("11m", false),
    ];
    for (timeout, rejected) in cases {
        let (mut service, mut handle) = mocked(layer.clone());
        let mut call = tokio_test::task::spawn((&mut service).oneshot(grpc_request(Some(timeout))));
        if rejected {
            let response = assert_ready!(call.poll()).unwrap();
            assert_eq!(response.headers()["grpc-status"], "4", "{timeout}");
            assert_eq!(
                response.extensions().get::<Rejection>(),
                Some(&Rejection::DeadlineExceeded)
            );
            assert!(response.extensions().get::<NotExecuted>().is_some());
            assert_pending!(handle.poll_request());
        } else {
            assert_pending!(call.poll());
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(
                req.extensions().get::<Deadline>().unwrap().remaining(),
                Duration::from_millis(10)
            );
            send.send_response(Response::new("ok".to_owned()));
            let response = call.await.unwrap();
            assert_eq!(text(response).await, "ok");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn expiry_drops_the_handler_and_answers_deadline_exceeded() {
    for grpc in [true, false] {
        let hang = Hang::default();
        let service = DeadlineLayer::new().layer(hang.clone());
        let req = request(grpc, Some("100m"));
        let mut call = tokio_test::task::spawn(service.oneshot(req));
        assert_pending!(call.poll());
        assert_eq!(hang.calls.load(Ordering::SeqCst), 1);

        advance(98 * MS).await;
        assert_pending!(call.poll());
        assert!(!hang.dropped.load(Ordering::SeqCst));

        // 100 ms less the 1 ms lead.
        advance(MS).await;
        let response = assert_ready!(call.poll()).unwrap();
        // The handler's future is gone before anyone drops the response future.
        assert!(hang.dropped.load(Ordering::SeqCst));
        if grpc {
            assert_eq!(response.status(), 200);
            assert_eq!(response.headers()["grpc-status"], "4");
            assert_eq!(response.headers()["grpc-message"], "deadline exceeded");
        } else {
            assert_eq!(response.status(), 504);
            assert_eq!(text(response).await, "deadline exceeded");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_answer_in_time_passes_through_untouched() {
    let (mut call, mut handle) = mocked_call(DeadlineLayer::new(), grpc_request(Some("1S")));
    assert_pending!(call.poll());
    let (_, send) = handle.next_request().await.unwrap();
    advance(Duration::from_millis(900)).await;
    send.send_response(
        Response::builder()
            .status(201)
            .header("x-kept", "yes")
            .body("done".to_owned())
            .unwrap(),
    );
    let response = assert_ready!(call.poll()).unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["x-kept"], "yes");
    assert!(response.extensions().get::<Rejection>().is_none());
    assert_eq!(text(response).await, "done");
}

#[tokio::test(start_paused = true)]
async fn inner_errors_pass_through() {
    let (mut call, mut handle) = mocked_call(DeadlineLayer::new(), http_request(Some("1S")));
    assert_pending!(call.poll());
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error("boom");
    let err = assert_ready!(call.poll()).unwrap_err();
    assert_eq!(err.to_string(), "boom");
}

#[tokio::test(start_paused = true)]
async fn a_streamed_grpc_body_ends_with_deadline_exceeded_trailers() {
    let (mut tx, body) = streamed();
    let service = DeadlineLayer::new().layer(streaming(body, true));
    let response = service.oneshot(grpc_request(Some("100m"))).await.unwrap();
    let mut body = response.into_body();
    tx.send_data(Bytes::from_static(b"first")).await.unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "first");

    let mut next = tokio_test::task::spawn(body.frame());
    assert_pending!(next.poll());
    advance(Duration::from_millis(99)).await;
    let trailers = assert_ready!(next.poll())
        .unwrap()
        .unwrap()
        .into_trailers()
        .unwrap();
    drop(next);
    assert_eq!(trailers["grpc-status"], "4");
    assert!(body.is_expired());
    assert!(body.is_end_stream());
    assert!(body.frame().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_streamed_http_body_fails_at_the_deadline() {
    let (_tx, body) = streamed();
    let service = DeadlineLayer::new().layer(streaming(body, false));
    let response = service.oneshot(http_request(Some("100m"))).await.unwrap();
    let mut body = response.into_body();
    let mut next = tokio_test::task::spawn(body.frame());
    assert_pending!(next.poll());
    advance(Duration::from_millis(99)).await;
    let err = assert_ready!(next.poll()).unwrap().unwrap_err();
    assert!(backstop::is_deadline_exceeded(err.as_ref()));
}

#[tokio::test(start_paused = true)]
async fn a_body_without_deadline_is_never_cut() {
    let (mut tx, body) = streamed();
    let service = DeadlineLayer::new().layer(streaming(body, false));
    let response = service.oneshot(http_request(None)).await.unwrap();
    let mut body = response.into_body();
    let mut next = tokio_test::task::spawn(body.frame());
    assert_pending!(next.poll());
    advance(Duration::from_secs(3600)).await;
    assert_pending!(next.poll());
    tx.send_data(Bytes::from_static(b"late")).await.unwrap();
    assert_eq!(
        assert_ready!(next.poll())
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap(),
        "late"
    );
}

#[test]
fn error_type_passes_through_for_infallible_services() {
    fn assert_infallible<S: tower::Service<Request<String>, Error = Infallible>>(_: &S) {}
    let service = DeadlineLayer::new().layer(reporter());
    assert_infallible(&service);
    let _: &Mock = DeadlineLayer::new().layer(mock::pair().0).get_ref();
}

#[test]
fn configuration_is_validated_and_names_the_knob() {
    let s = Duration::from_secs(1);
    let cases = [
        (DeadlineLayer::builder().max(Duration::ZERO), "max"),
        (
            DeadlineLayer::builder().default_timeout(Duration::ZERO),
            "default_timeout",
        ),
        (
            DeadlineLayer::builder().max(s).default_timeout(2 * s),
            "default_timeout",
        ),
        (
            DeadlineLayer::builder().max(s).min_remaining(s),
            "min_remaining",
        ),
        (
            DeadlineLayer::builder()
                .default_timeout(s)
                .min_remaining(2 * s),
            "min_remaining",
        ),
        (
            DeadlineLayer::builder().millis_header("bad header"),
            "millis_header",
        ),
        (
            DeadlineLayer::builder().millis_header("grpc-timeout"),
            "millis_header",
        ),
    ];
    for (builder, knob) in cases {
        let err = builder.build().unwrap_err();
        assert_eq!(err.knob(), knob, "{err}");
        assert!(err.to_string().starts_with(&format!("invalid `{knob}`: ")));
    }
    assert!(
        DeadlineLayer::builder()
            .max(2 * s)
            .default_timeout(2 * s)
            .min_remaining(Duration::from_millis(1))
            .build()
            .is_ok()
    );
}

/// Defect (outside audit): a handler that answered at its deadline (hyper polls the body a
/// few µs later) had its body, complete in memory, cut with an error after the head went out:
/// a torn message. A body answered in time and complete is delivered whole, however late it
/// is read: with an exact size (axum's String, Json, Bytes) or unsized but all ready to its
/// end (a gRPC unary answer, its message and trailers).
#[tokio::test(start_paused = true)]
async fn a_complete_body_answered_at_the_deadline_is_delivered_whole_when_read_after_it() {
    for grpc in [false, true] {
        // An exact size: a String.
        let handler = service_fn(|_req: Request<String>| async {
            tokio::time::sleep(current().unwrap().remaining()).await;
            Ok::<_, Infallible>(Response::new("whole".to_owned()))
        });
        let response = answered_with_100ms(handler, grpc).await;
        assert_eq!(response.status(), 200, "{grpc}");
        advance(Duration::from_micros(50)).await;
        assert_eq!(text(response).await, "whole", "{grpc}");

        // No size, every frame ready: a message, then the handler's trailers.
        let response = answered_with_100ms(ready_at_the_deadline(&["message"]), grpc).await;
        advance(Duration::from_micros(50)).await;
        let mut body = response.into_body();
        let collected = (&mut body).collect().await.unwrap();
        assert!(!body.is_expired(), "{grpc}");
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "0", "{grpc}");
        assert_eq!(collected.to_bytes(), "message", "{grpc}");
    }
}

/// A streamed body, declaring its size or not (a `Content-Length` body still arriving).
struct Streamed(http_body_util::channel::Channel<Bytes>, Option<u64>);

impl Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        let frame = std::task::ready!(std::pin::Pin::new(&mut self.0).poll_frame(cx));
        let frame = frame.map(|f| f.unwrap());
        if let (Some(left), Some(data)) = (self.1, frame.as_ref().and_then(|f| f.data_ref())) {
            self.1 = Some(left - data.len() as u64);
        }
        std::task::Poll::Ready(frame.map(Ok))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.1
            .map_or_else(Default::default, http_body::SizeHint::with_exact)
    }
}

/// The other side of the rule: a body that would still have to wait once the deadline has
/// passed is cut there, sized or not, whatever frame it had ready.
#[tokio::test(start_paused = true)]
async fn a_body_still_streaming_past_the_deadline_is_cut() {
    for (grpc, size) in [
        (false, None),
        (false, Some(10)),
        (true, None),
        (true, Some(10)),
    ] {
        let (mut tx, channel) = streamed();
        let channel = std::sync::Arc::new(std::sync::Mutex::new(Some(channel)));
        let handler = service_fn(move |_req: Request<String>| {
            let channel = channel.lock().unwrap().take().unwrap();
            let mut response = Response::new(Streamed(channel, size));
            if grpc {
                response
                    .headers_mut()
                    .insert("content-type", "application/grpc".parse().unwrap());
            }
            std::future::ready(Ok::<_, Infallible>(response))
        });
        let response = answered_with_100ms(handler, grpc).await;
        let mut body = response.into_body();
        tx.send_data(Bytes::from_static(b"first")).await.unwrap();
        advance(Duration::from_millis(200)).await;
        // Past the deadline: its first frame is ready, the rest would have to wait.
        let delivered = body.frame().await.unwrap();
        let cut = match (size, delivered) {
            // A sized body's ready frames are delivered; it is cut where it would wait.
            (Some(_), Ok(frame)) if frame.is_data() => body.frame().await.unwrap(),
            (_, other) => other,
        };
        match cut {
            Ok(frame) => assert_eq!(frame.into_trailers().unwrap()["grpc-status"], "4"),
            Err(e) => assert!(!grpc && backstop::is_deadline_exceeded(e.as_ref())),
        }
        assert!(body.is_expired(), "{grpc} {size:?}");
    }
}

/// Attack (issue 37, 4): the deadline body rule (the `deadline` module docs), "without a
/// size, its frames up to its end (at most four …) are ready at once" is delivered whole. An unsized body of exactly four ready
/// frames (three messages and trailers, `is_end_stream` left at its default as most stream
/// bodies do) answered at the deadline is cut: the end after the fourth frame is never
/// polled, so a complete answer becomes a torn one (or DEADLINE_EXCEEDED for gRPC).
#[tokio::test(start_paused = true)]
async fn an_unsized_body_of_four_ready_frames_is_delivered_whole_after_the_deadline() {
    for grpc in [false, true] {
        let response = answered_with_100ms(ready_at_the_deadline(&["a", "b", "c"]), grpc).await;
        advance(Duration::from_micros(50)).await;
        let mut body = response.into_body();
        let collected = (&mut body).collect().await;
        assert!(!body.is_expired(), "grpc {grpc}: cut");
        let collected = collected.unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "0", "{grpc}");
        assert_eq!(collected.to_bytes(), "abc", "{grpc}");
    }
}
