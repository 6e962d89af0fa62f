//! The bulkhead: at most `max_concurrency` calls in flight, a wait bounded by the call's
//! deadline (refused at once when no permit can come in time), and every permit back
//! whatever the caller does with the future (drop mid-wait, poll then drop, `select!`,
//! `FuturesUnordered`, `JoinSet`, behind a `Buffer`).

use backstop::client::overload::bulkhead::BulkheadLayer;
use backstop::deadline::Deadline;
use backstop::{BoxError, BulkheadFull};
use http::{Request, Response};
use std::{future::Future, pin::pin, task::Poll, time::Duration};
use tokio::time::{Instant, advance};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

const WORK: Duration = Duration::from_millis(100);

/// A dependency that answers after `WORK`.
fn dependency()
-> impl Service<Request<()>, Response = Response<()>, Error = BoxError, Future: Send> + Clone {
    service_fn(|_req: Request<()>| async {
        tokio::time::sleep(WORK).await;
        Ok::<_, BoxError>(Response::new(()))
    })
}

fn request_with_deadline(left: Duration) -> Request<()> {
    let mut req = Request::new(());
    req.extensions_mut()
        .insert(Deadline::at(Instant::now() + left));
    req
}

fn knob(err: &BoxError) -> &'static str {
    err.downcast_ref::<BulkheadFull>()
        .expect("a BulkheadFull")
        .knob()
}

/// Polls `f` once.
fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    f.poll(&mut cx)
}

#[tokio::test(start_paused = true)]
async fn a_call_that_cannot_get_a_permit_before_its_deadline_is_refused_at_once() {
    let layer = BulkheadLayer::new(1).unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(dependency());
    // Teach it the hold time: one call of 100 ms.
    svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(layer.hold_time(), WORK);
    let first = tokio::spawn(svc.clone().oneshot(Request::new(())));
    tokio::task::yield_now().await;
    assert_eq!(layer.in_flight(), 1);
    let start = Instant::now();
    // 150 ms left, less the 100 ms a call holds: no permit by 50 ms is expected.
    let err = svc
        .clone()
        .oneshot(request_with_deadline(Duration::from_millis(150)))
        .await
        .unwrap_err();
    assert_eq!(knob(&err), "max_concurrency");
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "refused at once, not at the deadline"
    );
    // With time for one hold, it waits and is served.
    let ok = svc
        .clone()
        .oneshot(request_with_deadline(Duration::from_millis(300)))
        .await;
    assert!(ok.is_ok());
    assert!(first.await.unwrap().is_ok());
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_call_without_a_deadline_waits_up_to_max_wait() {
    let layer = BulkheadLayer::builder(1)
        .max_wait(Duration::from_millis(30))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(dependency());
    let first = tokio::spawn(svc.clone().oneshot(Request::new(())));
    tokio::task::yield_now().await;
    let start = Instant::now();
    let err = svc.clone().oneshot(Request::new(())).await.unwrap_err();
    assert_eq!(knob(&err), "max_wait");
    assert_eq!(start.elapsed(), Duration::from_millis(30));
    assert!(first.await.unwrap().is_ok());
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_at_once() {
    let layer = BulkheadLayer::builder(1).max_queue(1).build().unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(dependency());
    let first = tokio::spawn(svc.clone().oneshot(Request::new(())));
    let second = tokio::spawn(svc.clone().oneshot(Request::new(())));
    tokio::task::yield_now().await;
    assert_eq!((layer.in_flight(), layer.waiting()), (1, 1));
    let err = svc.clone().oneshot(Request::new(())).await.unwrap_err();
    assert_eq!(knob(&err), "max_queue");
    assert!(first.await.unwrap().is_ok());
    assert!(
        second.await.unwrap().is_ok(),
        "the queued call is served next"
    );
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn poll_then_drop_gives_the_place_and_the_permit_back() {
    let layer = BulkheadLayer::new(1).unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(dependency());
    {
        let mut holding = pin!(svc.clone().oneshot(Request::new(())));
        assert!(poll_once(holding.as_mut()).is_pending());
        assert_eq!(layer.in_flight(), 1);
        let mut waiting = pin!(svc.clone().oneshot(Request::new(())));
        assert!(poll_once(waiting.as_mut()).is_pending());
        assert_eq!(layer.waiting(), 1);
    }
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
    // A waiter granted its permit and dropped before it saw it gives the permit on.
    let mut holding = Box::pin(svc.clone().oneshot(Request::new(())));
    assert!(poll_once(holding.as_mut()).is_pending());
    let mut waiting = Box::pin(svc.clone().oneshot(Request::new(())));
    assert!(poll_once(waiting.as_mut()).is_pending());
    advance(WORK).await;
    assert!(
        poll_once(holding.as_mut()).is_ready(),
        "answered: permit handed on"
    );
    assert_eq!((layer.in_flight(), layer.waiting()), (1, 0));
    drop(waiting);
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn select_futures_unordered_and_join_set_leave_no_permit_behind() {
    use futures_util::{StreamExt, stream::FuturesUnordered};
    let layer = BulkheadLayer::builder(2).max_queue(8).build().unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(dependency());
    // `select!` with a short timer: the losing call is dropped mid-wait or mid-call.
    for _ in 0..3 {
        tokio::select! {
            _ = svc.clone().oneshot(Request::new(())) => {}
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
    // Six at once through two permits: all served, two at a time.
    let start = Instant::now();
    let mut all: FuturesUnordered<_> = (0..6)
        .map(|_| svc.clone().oneshot(Request::new(())))
        .collect();
    let mut ok = 0;
    while let Some(result) = all.next().await {
        ok += usize::from(result.is_ok());
        assert!(layer.in_flight() <= 2);
    }
    assert_eq!(ok, 6);
    assert_eq!(start.elapsed(), WORK * 3);
    // A JoinSet aborted mid-way.
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..5 {
        set.spawn(svc.clone().oneshot(Request::new(())));
    }
    tokio::task::yield_now().await;
    assert_eq!((layer.in_flight(), layer.waiting()), (2, 3));
    set.abort_all();
    while set.join_next().await.is_some() {}
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn behind_a_buffer_the_deadline_on_the_request_bounds_the_wait() {
    let layer = BulkheadLayer::new(1).unwrap();
    let svc = ServiceBuilder::new()
        .buffer(16)
        .layer(layer.clone())
        .service(dependency());
    svc.clone().oneshot(Request::new(())).await.unwrap();
    let first = tokio::spawn(svc.clone().oneshot(Request::new(())));
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    let err = svc
        .clone()
        .oneshot(request_with_deadline(Duration::from_millis(50)))
        .await
        .unwrap_err();
    assert!(backstop::find::<BulkheadFull>(&*err).is_some(), "{err}");
    assert!(first.await.unwrap().is_ok());
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_grpc_call_is_refused_with_unavailable() {
    let layer = BulkheadLayer::builder(1).max_queue(0).build().unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(dependency());
    let first = tokio::spawn(svc.clone().oneshot(Request::new(())));
    tokio::task::yield_now().await;
    let req = Request::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let response = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(response.headers()["grpc-retry-pushback-ms"], "-1");
    assert!(first.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn an_off_bulkhead_lets_every_call_through_at_once() {
    let layer = BulkheadLayer::off();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(dependency());
    let calls: Vec<_> = (0..5)
        .map(|_| tokio::spawn(svc.clone().oneshot(request_with_deadline(Duration::ZERO))))
        .collect();
    let start = Instant::now();
    for call in calls {
        assert!(call.await.unwrap().is_ok());
    }
    // All five ran side by side, none queued, none refused (even out of time), no permit
    // counted.
    assert_eq!(start.elapsed(), WORK);
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
    assert_eq!(layer.hold_time(), Duration::ZERO);
}

/// Defect (outside audit): the permit was taken before `inner.call` and its guard built
/// after, so a `call` that panicked kept it for good: with one permit, every later call was
/// refused "bulkhead full". The guard now owns the permit before `inner.call` runs, on the
/// free-permit path and on the queue's (a permit granted at once, and one granted to a call
/// that waited).
#[tokio::test(start_paused = true)]
async fn a_call_that_panics_gives_its_permit_back() {
    use backstop_test_support::{call_catching, panicking};
    use std::sync::{Arc, atomic::AtomicBool, atomic::Ordering};
    let panics = Arc::new(AtomicBool::new(true));
    let layer = BulkheadLayer::new(1).unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(panicking::<Request<()>>(panics.clone()));
    // Free permit: taken, then the call panics.
    assert!(call_catching(&mut svc, Request::new(())).is_err());
    assert_eq!(layer.in_flight(), 0, "the permit came back");
    // A call that waited for its permit, then panics in its `call` when it is granted.
    let holder = svc.clone();
    let holding = ServiceBuilder::new()
        .layer(layer.clone())
        .service(dependency());
    let held = tokio::spawn(holding.oneshot(Request::new(())));
    tokio::task::yield_now().await;
    assert_eq!(layer.in_flight(), 1);
    let waiting = tokio::spawn(holder.oneshot(request_with_deadline(Duration::from_secs(5))));
    tokio::task::yield_now().await;
    advance(WORK).await;
    held.await.unwrap().unwrap();
    assert!(waiting.await.unwrap_err().is_panic());
    assert_eq!(layer.in_flight(), 0, "the permit came back");
    // Later calls get the permit.
    panics.store(false, Ordering::SeqCst);
    for _ in 0..3 {
        svc.ready().await.unwrap();
        svc.call(Request::new(())).await.unwrap();
    }
}
