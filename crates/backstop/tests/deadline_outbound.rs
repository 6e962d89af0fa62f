//! `PropagateDeadlineLayer` driven with mock services under paused time.

use backstop::deadline::{Deadline, PropagateDeadlineLayer, current};
use backstop::{Rejection, is_deadline_exceeded};
use backstop_test_support::*;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use std::{
    convert::Infallible,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};
use tokio::time::advance;
use tokio_test::{assert_pending, assert_ready};
use tower::{Layer, ServiceExt, service_fn};
use tower_test::mock;

/// Sends `req` through `layer` and returns the request the dependency received.
async fn sent(layer: PropagateDeadlineLayer, req: Request<String>) -> Request<String> {
    let (service, mut handle) = mock::spawn_layer::<Request<String>, Response<String>, _>(layer);
    let mut call = tokio_test::task::spawn(service.into_inner().oneshot(req));
    assert_pending!(call.poll());
    let (received, send) = handle.next_request().await.expect("the call was sent");
    send.send_response(Response::new(String::new()));
    call.await.unwrap();
    received
}

fn timeout_of(req: &Request<String>) -> Option<&str> {
    req.headers()
        .get("grpc-timeout")
        .map(|v| v.to_str().unwrap())
}

#[tokio::test(start_paused = true)]
async fn without_any_deadline_nothing_is_added() {
    let req = sent(PropagateDeadlineLayer::new(), http_request(None)).await;
    assert_eq!(timeout_of(&req), None);
    assert!(req.extensions().get::<Deadline>().is_none());
}

#[tokio::test(start_paused = true)]
async fn the_task_local_deadline_is_sent_as_the_remaining_time() {
    let deadline = Deadline::after(Duration::from_millis(800));
    advance(Duration::from_millis(300)).await;
    let req = deadline
        .scope(sent(PropagateDeadlineLayer::new(), grpc_request(None)))
        .await;
    assert_eq!(timeout_of(&req), Some("500m"));
    let seen = deadline
        .scope(seen_inside(
            PropagateDeadlineLayer::new(),
            http_request(None),
        ))
        .await;
    assert_eq!(seen, (Some(deadline), Some(deadline)));
}

/// The deadline the inner service sees as `current()`: in `call`, and in its future.
async fn seen_inside(
    layer: PropagateDeadlineLayer,
    req: Request<String>,
) -> (Option<Deadline>, Option<Deadline>) {
    let seen = Arc::new(Mutex::new((None, None)));
    let record = seen.clone();
    let service = layer.layer(service_fn(move |_req: Request<String>| {
        let at_call = current();
        let record = record.clone();
        async move {
            tokio::task::yield_now().await;
            *record.lock().unwrap() = (at_call, current());
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    }));
    service.oneshot(req).await.unwrap();
    *seen.lock().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_deadline_in_the_extensions_is_used() {
    let mut req = http_request(None);
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_secs(2)));
    let req = sent(PropagateDeadlineLayer::new(), req).await;
    assert_eq!(timeout_of(&req), Some("2S"));
}

#[tokio::test(start_paused = true)]
async fn a_grpc_timeout_set_by_the_caller_is_kept_when_shorter_and_cut_when_longer() {
    let req = sent(PropagateDeadlineLayer::new(), grpc_request(Some("150m"))).await;
    assert_eq!(timeout_of(&req), Some("150m"));

    let deadline = Deadline::after(Duration::from_millis(100));
    let req = deadline
        .scope(sent(
            PropagateDeadlineLayer::new(),
            grpc_request(Some("10S")),
        ))
        .await;
    assert_eq!(timeout_of(&req), Some("100m"));
    assert_eq!(req.headers().get_all("grpc-timeout").iter().count(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_earliest_source_wins() {
    let layer = PropagateDeadlineLayer::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    // timeout alone, with nothing inherited
    let req = sent(layer.clone(), http_request(None)).await;
    assert_eq!(timeout_of(&req), Some("300m"));
    // inherited is shorter than the timeout
    let short = Deadline::after(Duration::from_millis(120));
    let req = short.scope(sent(layer.clone(), http_request(None))).await;
    assert_eq!(timeout_of(&req), Some("120m"));
    // extension shorter than the task-local
    let mut req = http_request(None);
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_millis(50)));
    let req = short.scope(sent(layer, req)).await;
    assert_eq!(timeout_of(&req), Some("50m"));
}

#[tokio::test(start_paused = true)]
async fn fraction_takes_a_share_of_what_is_left() {
    let layer = PropagateDeadlineLayer::builder()
        .fraction(0.25)
        .build()
        .unwrap();
    let deadline = Deadline::after(Duration::from_secs(1));
    let req = deadline
        .scope(sent(layer.clone(), http_request(None)))
        .await;
    assert_eq!(timeout_of(&req), Some("250m"));
    let (child, _) = deadline
        .scope(seen_inside(layer.clone(), http_request(None)))
        .await;
    assert!(child.unwrap() < deadline);
    // With nothing inherited there is nothing to take a share of.
    let req = sent(layer, http_request(None)).await;
    assert_eq!(timeout_of(&req), None);
}

#[tokio::test(start_paused = true)]
async fn offset_is_taken_off_the_wire_value_only() {
    let layer = PropagateDeadlineLayer::builder()
        .offset(Duration::from_millis(20))
        .build()
        .unwrap();
    let deadline = Deadline::after(Duration::from_millis(500));
    let req = deadline
        .scope(sent(layer.clone(), http_request(None)))
        .await;
    assert_eq!(timeout_of(&req), Some("480m"));
    // Inner layers see the full deadline; only the wire value is reduced.
    let seen = deadline.scope(seen_inside(layer, http_request(None))).await;
    assert_eq!(seen, (Some(deadline), Some(deadline)));
}

#[tokio::test(start_paused = true)]
async fn too_little_left_fails_at_once_without_sending() {
    let layer = PropagateDeadlineLayer::builder()
        .min_remaining(Duration::from_millis(10))
        .offset(Duration::from_millis(2))
        .build()
        .unwrap();
    for (left, grpc) in [(9 * MS, false), (9 * MS, true), (Duration::ZERO, false)] {
        let (service, mut handle) =
            mock::spawn_layer::<Request<String>, Response<String>, _>(layer.clone());
        let mut service = service.into_inner();
        let req = request(grpc, None);
        let result = Deadline::after(left)
            .scope((&mut service).oneshot(req))
            .await;
        if grpc {
            let response = result.unwrap();
            assert_eq!(response.headers()["grpc-status"], "4");
            assert_eq!(
                response.extensions().get::<Rejection>(),
                Some(&Rejection::DeadlineExceeded)
            );
        } else {
            assert!(is_deadline_exceeded(result.unwrap_err().as_ref()));
        }
        assert_pending!(handle.poll_request());
    }
}

#[tokio::test(start_paused = true)]
async fn nothing_left_after_the_offset_fails_without_sending() {
    let layer = PropagateDeadlineLayer::builder()
        .offset(Duration::from_millis(5))
        .build()
        .unwrap();
    let (service, mut handle) = mock::spawn_layer::<Request<String>, Response<String>, _>(layer);
    let mut service = service.into_inner();
    let err = Deadline::after(5 * MS)
        .scope((&mut service).oneshot(http_request(None)))
        .await
        .unwrap_err();
    assert!(is_deadline_exceeded(err.as_ref()));
    assert_pending!(handle.poll_request());
}

#[tokio::test(start_paused = true)]
async fn expiry_drops_the_call() {
    for grpc in [false, true] {
        let hang = Hang::default();
        let service = PropagateDeadlineLayer::builder()
            .timeout(Duration::from_millis(100))
            .build()
            .unwrap()
            .layer(hang.clone());
        let req = request(grpc, None);
        let mut call = tokio_test::task::spawn(service.oneshot(req));
        assert_pending!(call.poll());
        advance(99 * MS).await;
        assert_pending!(call.poll());
        advance(MS).await;
        let result = assert_ready!(call.poll());
        assert!(hang.dropped.load(Ordering::SeqCst), "the call is cancelled");
        if grpc {
            let response = result.unwrap();
            assert_eq!(response.headers()["grpc-status"], "4");
        } else {
            assert!(is_deadline_exceeded(result.unwrap_err().as_ref()));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_failure_before_the_wire_deadline_passes_through_and_after_it_is_the_deadlines() {
    let layer = PropagateDeadlineLayer::builder()
        .timeout(Duration::from_millis(100))
        .offset(Duration::from_millis(10))
        .build()
        .unwrap();
    // Before: the dependency's own error.
    let (service, mut handle) =
        mock::spawn_layer::<Request<String>, Response<String>, _>(layer.clone());
    let mut call = tokio_test::task::spawn(service.into_inner().oneshot(http_request(None)));
    assert_pending!(call.poll());
    let (_, send) = handle.next_request().await.unwrap();
    advance(89 * MS).await;
    send.send_error("connection reset");
    let err = assert_ready!(call.poll()).unwrap_err();
    assert_eq!(err.to_string(), "connection reset");

    // After 90 ms (what the server was told), a transport timer armed from our header fired.
    for grpc in [false, true] {
        let (service, mut handle) =
            mock::spawn_layer::<Request<String>, Response<String>, _>(layer.clone());
        let req = request(grpc, None);
        let mut call = tokio_test::task::spawn(service.into_inner().oneshot(req));
        assert_pending!(call.poll());
        let (_, send) = handle.next_request().await.unwrap();
        advance(90 * MS).await;
        send.send_error("timeout expired");
        let result = assert_ready!(call.poll());
        if grpc {
            assert_eq!(result.unwrap().headers()["grpc-status"], "4");
        } else {
            assert!(is_deadline_exceeded(result.unwrap_err().as_ref()));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_response_in_time_passes_through() {
    let deadline = Deadline::after(Duration::from_secs(1));
    let service =
        PropagateDeadlineLayer::new().layer(service_fn(|_req: Request<String>| async move {
            assert!(current().is_some());
            Ok::<_, Infallible>(
                Response::builder()
                    .status(503)
                    .body("busy".to_owned())
                    .unwrap(),
            )
        }));
    let response = deadline
        .scope(service.oneshot(http_request(None)))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"busy");
}

async fn next_frame_at_deadline<
    B: http_body::Body<Data = Bytes, Error = backstop::BoxError> + Unpin,
>(
    body: &mut B,
    after: Duration,
) -> Result<http_body::Frame<Bytes>, backstop::BoxError> {
    let mut next = tokio_test::task::spawn(body.frame());
    assert_pending!(next.poll());
    advance(after - MS).await;
    assert_pending!(next.poll());
    advance(MS).await;
    assert_ready!(next.poll()).expect("a frame")
}

#[tokio::test(start_paused = true)]
async fn streamed_response_bodies_are_bounded_too() {
    let layer = PropagateDeadlineLayer::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    // HTTP: the body fails with DeadlineExceeded.
    let (_tx, body) = streamed();
    let response = layer
        .layer(streaming(body, false))
        .oneshot(http_request(None))
        .await
        .unwrap();
    let mut body = response.into_body();
    let err = next_frame_at_deadline(&mut body, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(is_deadline_exceeded(err.as_ref()));

    // gRPC: the body ends with DEADLINE_EXCEEDED trailers.
    let (mut tx, body) = streamed();
    let response = layer
        .layer(streaming(body, true))
        .oneshot(grpc_request(None))
        .await
        .unwrap();
    let mut body = response.into_body();
    tx.send_data(Bytes::from_static(b"part")).await.unwrap();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "part"
    );
    advance(Duration::from_millis(50)).await;
    let trailers = next_frame_at_deadline(&mut body, Duration::from_millis(50))
        .await
        .unwrap()
        .into_trailers()
        .unwrap();
    assert_eq!(trailers["grpc-status"], "4");
    assert!(body.frame().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_spawned_task_keeps_the_deadline_with_the_extension() {
    use backstop::deadline::DeadlineFutureExt;
    let deadline = Deadline::after(Duration::from_millis(700));
    let req = deadline
        .scope(async {
            tokio::spawn(
                sent(PropagateDeadlineLayer::new(), http_request(None)).with_current_deadline(),
            )
            .await
            .unwrap()
        })
        .await;
    assert_eq!(timeout_of(&req), Some("700m"));
    assert_eq!(current(), None);
}

#[test]
fn configuration_is_validated_and_names_the_knob() {
    let s = Duration::from_secs(1);
    let cases = [
        (
            PropagateDeadlineLayer::builder().timeout(Duration::ZERO),
            "timeout",
        ),
        (PropagateDeadlineLayer::builder().fraction(0.0), "fraction"),
        (PropagateDeadlineLayer::builder().fraction(1.01), "fraction"),
        (
            PropagateDeadlineLayer::builder().fraction(f64::NAN),
            "fraction",
        ),
        (PropagateDeadlineLayer::builder().fraction(-0.5), "fraction"),
        (
            PropagateDeadlineLayer::builder().timeout(s).offset(s),
            "offset",
        ),
        (
            PropagateDeadlineLayer::builder()
                .timeout(s)
                .min_remaining(2 * s),
            "min_remaining",
        ),
        // Without a timeout: an offset or margin past 1 min leaves no call any time.
        (
            PropagateDeadlineLayer::builder().offset(Duration::MAX),
            "offset",
        ),
        (
            PropagateDeadlineLayer::builder().min_remaining(61 * s),
            "min_remaining",
        ),
    ];
    for (builder, knob) in cases {
        let err = builder.build().unwrap_err();
        assert_eq!(err.knob(), knob, "{err}");
    }
    assert!(
        PropagateDeadlineLayer::builder()
            .fraction(1.0)
            .timeout(s)
            .offset(Duration::from_millis(999))
            .build()
            .is_ok()
    );
}

/// The client's side of the rule: frames that are ready when a body is read after the call's
/// deadline are delivered (an answer in memory is whole); a body that must wait for the
/// network past the deadline ends with `DeadlineExceeded`
/// (`streamed_response_bodies_are_bounded_too`; over hyper, the integration test
/// `the_calls_deadline_bounds_reading_the_body_over_http1`).
#[tokio::test(start_paused = true)]
async fn a_response_arrived_whole_before_the_deadline_is_read_whole_after_it() {
    let dependency = service_fn(|_req: Request<String>| async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok::<_, Infallible>(Response::new("arrived".to_owned()))
    });
    let client = PropagateDeadlineLayer::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap()
        .layer(dependency);
    let response = client.oneshot(http_request(None)).await.unwrap();
    advance(Duration::from_millis(5)).await;
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"arrived");
}
