//! Deadline-aware admission behind a `DeadlineLayer`: a request with less time left than its
//! route's measured need is answered DEADLINE_EXCEEDED / 504 without running the handler;
//! requests without a deadline, and every request of a cold route, pass.

use backstop::deadline::DeadlineLayer;
use backstop::server::admission::AdmissionLayer;
use backstop::{NotExecuted, Rejection};
use backstop_test_support::{Dependency, grpc_request, http_request};
use http::{Request, Response};
use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tower::{Layer, ServiceExt, service_fn};

/// A handler taking 200 ms, counting its calls.
fn slow_handler(calls: Arc<AtomicU64>) -> impl Dependency<Request<String>> {
    service_fn(move |_req: Request<String>| {
        calls.fetch_add(1, Ordering::Relaxed);
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    })
}

/// Answers a model holds before its need is trusted (the layer's fixed 100).
const TRUSTED_FROM: usize = 100;

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_finish_in_time_is_refused_without_running_the_handler() {
    let calls = Arc::new(AtomicU64::new(0));
    let admission = AdmissionLayer::new();
    let server = DeadlineLayer::new().layer(admission.layer(slow_handler(calls.clone())));
    // Cold: even a request with 100 ms left runs (and times out).
    let response = server
        .clone()
        .oneshot(grpc_request(Some("100m")))
        .await
        .unwrap();
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    // The handler ran and was cut by its deadline: it may have done its work.
    assert!(response.extensions().get::<NotExecuted>().is_none());
    // A hundred measured answers of 200 ms, without deadlines (20 s: inside the window); one
    // short of them the route is still cold.
    for _ in 0..TRUSTED_FROM - 1 {
        server.clone().oneshot(http_request(None)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(admission.need("/"), None, "99 answers: not trusted yet");
    server.clone().oneshot(http_request(None)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let need = admission.need("/").unwrap();
    assert!((190..=210).contains(&need.as_millis()), "{need:?}");
    let before = calls.load(Ordering::Relaxed);

    let grpc = server
        .clone()
        .oneshot(grpc_request(Some("100m")))
        .await
        .unwrap();
    assert_eq!(grpc.status(), 200);
    assert_eq!(grpc.headers()["grpc-status"], "4");
    assert_eq!(
        grpc.extensions().get::<Rejection>(),
        Some(&Rejection::DeadlineExceeded)
    );
    let http = server
        .clone()
        .oneshot(http_request(Some("100m")))
        .await
        .unwrap();
    assert_eq!(http.status(), 504);
    assert!(grpc.extensions().get::<NotExecuted>().is_some());
    assert!(http.extensions().get::<NotExecuted>().is_some());
    assert_eq!(
        calls.load(Ordering::Relaxed),
        before,
        "the handler never ran"
    );

    // Enough time left, or no deadline at all: the handler runs.
    let ok = server
        .clone()
        .oneshot(http_request(Some("300m")))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let ok = server.clone().oneshot(http_request(None)).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(calls.load(Ordering::Relaxed), before + 2);
}

#[tokio::test(start_paused = true)]
async fn a_handler_dropped_before_it_answers_is_not_measured() {
    let calls = Arc::new(AtomicU64::new(0));
    let admission = AdmissionLayer::new();
    let server = admission.layer(slow_handler(calls.clone()));
    // One answer short of trust: a single measured sample more would make the need known.
    for _ in 0..TRUSTED_FROM - 1 {
        server.clone().oneshot(http_request(None)).await.unwrap();
    }
    let measured = calls.load(Ordering::Relaxed);
    // Polled once, then dropped; raced and lost in select!; through a Buffer, then dropped.
    let mut call = tokio_test::task::spawn(server.clone().oneshot(http_request(None)));
    tokio_test::assert_pending!(call.poll());
    drop(call);
    tokio::select! {
        _ = server.clone().oneshot(http_request(None)) => panic!("200 ms handler"),
        () = tokio::time::sleep(Duration::from_millis(50)) => {}
    }
    let buffered = tower::buffer::Buffer::new(server.clone(), 4);
    let task = tokio::spawn(buffered.oneshot(http_request(None)));
    tokio::time::sleep(Duration::from_millis(10)).await;
    task.abort();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(admission.need("/"), None, "nothing measured");
    assert_eq!(calls.load(Ordering::Relaxed), measured + 3);
    // The next answer is the hundredth measured one.
    server.clone().oneshot(http_request(None)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(admission.need("/").is_some());
}

/// A handler that never answers (a queue nobody drains), counting its calls.
fn stuck_handler(calls: Arc<AtomicU64>) -> impl Dependency<Request<String>> {
    service_fn(move |_req: Request<String>| {
        calls.fetch_add(1, Ordering::Relaxed);
        std::future::pending::<Result<Response<String>, Infallible>>()
    })
}

/// A request its client gave up on before its deadline says nothing of what the route needs.
#[tokio::test(start_paused = true)]
async fn a_request_dropped_before_its_deadline_is_not_measured() {
    let calls = Arc::new(AtomicU64::new(0));
    let admission = AdmissionLayer::new();
    let server = DeadlineLayer::new().layer(admission.layer(stuck_handler(calls.clone())));
    for _ in 0..TRUSTED_FROM {
        let call = server.clone().oneshot(http_request(Some("1S")));
        // The client leaves after 10 ms of a 1 s deadline.
        assert!(
            tokio::time::timeout(Duration::from_millis(10), call)
                .await
                .is_err()
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(calls.load(Ordering::Relaxed), TRUSTED_FROM as u64);
    assert_eq!(admission.need("/"), None, "nothing was measured");
}

/// A `call` that panics leaves admission as it was (it holds nothing across `inner.call`):
/// the next request is admitted and measured. Checked with the bulkhead's leaked permit
/// (outside audit).
#[tokio::test(start_paused = true)]
async fn a_call_that_panics_leaves_admission_as_it_was() {
    use backstop_test_support::{call_catching, panicking};
    use std::sync::atomic::AtomicBool;
    let panics = Arc::new(AtomicBool::new(true));
    let admission = AdmissionLayer::new();
    let mut service = admission.layer(panicking::<Request<String>>(panics.clone()));
    assert!(call_catching(&mut service, http_request(Some("1S"))).is_err());
    panics.store(false, Ordering::SeqCst);
    for _ in 0..TRUSTED_FROM {
        let response = service.clone().oneshot(http_request(Some("1S"))).await;
        assert_eq!(response.unwrap().status(), 200);
    }
    // Every one of them was measured (the panicked call was not): the route is trusted now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(admission.need("/").is_some());
}
