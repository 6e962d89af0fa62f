//! The retry layer's attempt timer is not armed when the deadline layer polling it already
//! wakes the task by the attempt's deadline; these tests hold what must not change with it:
//! every call still ends at its own deadline — one earlier than the enclosing one, or one
//! moved to another task after a first poll inside a handler.
//!
//! Each call is bounded by a guard `timeout` far past its deadline: a call that no timer wakes
//! would otherwise hang (paused time only moves to registered timers); with the guard, it fails.

use backstop_deadline::{Deadline, DeadlineLayer, is_deadline_exceeded};
use backstop_retry::{ReplayBody, RetryConfig};
use http::{Request, Response};
use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    task::Poll,
    time::Duration,
};
use tokio::time::Instant;
use tower::{Layer, ServiceExt, service_fn};

const MS: Duration = Duration::from_millis(1);
const GUARD: Duration = Duration::from_secs(60);

/// A dependency that never answers, and arms no timer.
fn hung() -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    service_fn(|_req: Request<ReplayBody<String>>| {
        std::future::pending::<Result<Response<String>, Infallible>>()
    })
}

fn request() -> Request<String> {
    backstop_test_support::http_request(None)
}

/// Inside a handler with one second left, a call carrying its own, earlier deadline (a request
/// extension) ends at that one: the handler's deadline layer does not cover it.
#[tokio::test(start_paused = true)]
async fn an_earlier_deadline_than_the_handlers_arms_its_own_timer() {
    let retry = RetryConfig::http().build().unwrap().layer(hung());
    let handler = service_fn(move |_req: Request<String>| {
        let retry = retry.clone();
        async move {
            let mut req = request();
            req.extensions_mut()
                .insert(Deadline::after(Duration::from_millis(300)));
            let start = Instant::now();
            let err = retry.oneshot(req).await.unwrap_err();
            assert!(is_deadline_exceeded(&*err), "{err}");
            assert_eq!(start.elapsed(), 300 * MS);
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let response = tokio::time::timeout(
        GUARD,
        DeadlineLayer::new()
            .layer(handler)
            .oneshot(backstop_test_support::http_request(Some("1S"))),
    )
    .await
    .expect("the call ended at its own deadline")
    .unwrap();
    assert_eq!(response.status(), 200);
}

/// A retried call polled once inside a handler and then moved to a task of its own ends at
/// its deadline there (its timer wakes the task it is polled on).
#[tokio::test(start_paused = true)]
async fn a_call_moved_to_another_task_arms_its_timer_there() {
    let retry = RetryConfig::http().build().unwrap().layer(hung());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let tx = Arc::new(Mutex::new(Some(tx)));
    let handler = service_fn(move |_req: Request<String>| {
        let retry = retry.clone();
        let tx = tx.clone();
        async move {
            let mut call = Box::pin(retry.oneshot(request()));
            let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            assert!(first.is_pending());
            let _ = tx.lock().unwrap().take().unwrap().send(tokio::spawn(call));
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let start = Instant::now();
    let response = DeadlineLayer::new()
        .layer(handler)
        .oneshot(backstop_test_support::http_request(Some("1S")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let result = tokio::time::timeout(GUARD, rx.await.unwrap())
        .await
        .expect("the moved call ended at its deadline")
        .unwrap();
    let err = result.unwrap_err();
    assert!(is_deadline_exceeded(&*err), "{err}");
    // The handler's deadline: one second less the server's 1 ms lead.
    assert_eq!(start.elapsed(), 999 * MS);
}
