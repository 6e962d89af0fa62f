//! Each deadline layer owns its timer: every call ends at its deadline, whatever the futures
//! inside do with their timers (let one fire and hang on, drop one in the poll that armed it)
//! and whatever the caller does with the call (poll it once in a handler and then spawn it,
//! drop it on another task, poll it with another waker).
//!
//! Each call is bounded by a guard `timeout` far past its deadline: a call that no timer wakes
//! would otherwise hang (paused time only moves to registered timers); with the guard, it fails.

use backstop::BoxError;
use backstop::deadline::{DeadlineLayer, PropagateDeadlineLayer, current};
use backstop::is_deadline_exceeded;
use backstop_test_support::{http_request, script_answer, scripted, step};
use http::{Request, Response};
use std::{
    convert::Infallible,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::{Instant, Sleep, sleep_until};
use tower::{Layer, Service, ServiceExt, service_fn};

const MS: Duration = Duration::from_millis(1);
/// Far past every deadline here: a call still running then was never woken.
const GUARD: Duration = Duration::from_secs(60);

/// What a dependency's future does with a timer of its own.
#[derive(Clone, Copy, Debug)]
enum Timer {
    /// None: it hangs.
    None,
    /// Armed for this long; once it has fired the future drops it and hangs with no timer.
    FiresAfter(Duration),
    /// Armed for this long and dropped in the same poll (a `select!` branch that lost), then
    /// it hangs with no timer.
    DroppedAtOnce(Duration),
}

/// A dependency future that never answers; it records, at each poll, whether it sees a
/// current deadline.
struct Hung {
    timer: Timer,
    armed: Option<Pin<Box<Sleep>>>,
    end: Option<Instant>,
    seen: Arc<Mutex<Vec<bool>>>,
}

impl Future for Hung {
    type Output = Result<Response<String>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let seen = current().is_some();
        self.seen.lock().unwrap().push(seen);
        let this = &mut *self;
        match this.timer {
            Timer::None => {}
            Timer::FiresAfter(after) | Timer::DroppedAtOnce(after) => {
                let end = *this.end.get_or_insert_with(|| Instant::now() + after);
                if let Some(timer) = this.armed.as_mut() {
                    if timer.as_mut().poll(cx).is_ready() {
                        this.armed = None;
                        this.timer = Timer::None;
                    }
                } else {
                    let mut timer = Box::pin(sleep_until(end));
                    assert!(timer.as_mut().poll(cx).is_pending());
                    if matches!(this.timer, Timer::DroppedAtOnce(_)) {
                        drop(timer);
                        this.timer = Timer::None;
                    } else {
                        this.armed = Some(timer);
                    }
                }
            }
        }
        Poll::Pending
    }
}

/// A dependency whose calls hang as `timer` says; `seen` gathers what they saw.
fn hung(
    timer: Timer,
    seen: &Arc<Mutex<Vec<bool>>>,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future = Hung>
+ Clone
+ use<> {
    let seen = seen.clone();
    service_fn(move |_req: Request<String>| Hung {
        timer,
        armed: None,
        end: None,
        seen: seen.clone(),
    })
}

fn one_second() -> PropagateDeadlineLayer {
    PropagateDeadlineLayer::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// Calls `service` with `req` under the guard: the error, and how long the call took.
async fn expiry<S>(service: S, req: Request<String>) -> (backstop::BoxError, Duration)
where
    S: Service<Request<String>, Error = backstop::BoxError>,
    S::Response: std::fmt::Debug,
{
    let start = Instant::now();
    let result = tokio::time::timeout(GUARD, service.oneshot(req))
        .await
        .expect("the call ended at its deadline, not at the guard");
    (
        result.expect_err("the dependency never answers"),
        start.elapsed(),
    )
}

#[tokio::test(start_paused = true)]
async fn nested_deadline_layers_end_the_call_at_the_deadline() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let inner = PropagateDeadlineLayer::new().layer(hung(Timer::None, &seen));
    let (err, took) = expiry(one_second().layer(inner), http_request(None)).await;
    assert!(backstop::find::<backstop::DeadlineExceeded>(&*err).is_some());
    assert_eq!(took, Duration::from_secs(1));
    assert!(seen.lock().unwrap().iter().all(|&seen| seen));
}

#[tokio::test(start_paused = true)]
async fn an_earlier_timer_inside_then_none_still_ends_the_call_at_the_deadline() {
    for timer in [
        Timer::FiresAfter(300 * MS),
        Timer::DroppedAtOnce(300 * MS),
        // Later than the deadline: it covers nothing.
        Timer::FiresAfter(Duration::from_secs(2)),
    ] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (err, took) = expiry(one_second().layer(hung(timer, &seen)), http_request(None)).await;
        assert!(
            backstop::find::<backstop::DeadlineExceeded>(&*err).is_some(),
            "{timer:?}: {err}"
        );
        assert_eq!(took, Duration::from_secs(1), "{timer:?}");
    }
}

/// A handler that hangs on no timer once its own has fired (or was dropped) is still cut off at
/// the request's deadline.
#[tokio::test(start_paused = true)]
async fn the_server_deadline_holds_whatever_the_handler_does_with_its_timers() {
    for timer in [
        Timer::None,
        Timer::FiresAfter(300 * MS),
        Timer::DroppedAtOnce(300 * MS),
    ] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let service = DeadlineLayer::new().layer(hung(timer, &seen));
        let start = Instant::now();
        let response = tokio::time::timeout(GUARD, service.oneshot(http_request(Some("1S"))))
            .await
            .expect("the handler was cut off at its deadline")
            .unwrap();
        assert_eq!(response.status(), 504, "{timer:?}");
        // One second less the server's 1 ms lead.
        assert_eq!(start.elapsed(), 999 * MS, "{timer:?}");
        assert!(seen.lock().unwrap().iter().all(|&seen| seen));
    }
}

/// Sends a request with one second left to `handler` behind the server's `DeadlineLayer`, and
/// waits for its 200; returns when the request was sent.
async fn answered_in_one_second<H>(handler: H) -> Instant
where
    H: Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone,
{
    let start = Instant::now();
    let response = DeadlineLayer::new()
        .layer(handler)
        .oneshot(http_request(Some("1S")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    start
}

/// A client call polled once inside a handler and then moved to a task of its own ends at its
/// deadline there.
#[tokio::test(start_paused = true)]
async fn a_call_moved_to_another_task_arms_its_own_timer_there() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let client = PropagateDeadlineLayer::new().layer(hung(Timer::None, &seen));
    let (spawned_tx, spawned_rx) = tokio::sync::oneshot::channel();
    let spawned_tx = Arc::new(Mutex::new(Some(spawned_tx)));
    let handler = service_fn(move |_req: Request<String>| {
        let client = client.clone();
        let spawned_tx = spawned_tx.clone();
        async move {
            let mut call = Box::pin(client.oneshot(http_request(None)));
            let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            assert!(first.is_pending());
            let task = tokio::spawn(async move {
                let start = Instant::now();
                (call.await, start.elapsed())
            });
            let _ = spawned_tx.lock().unwrap().take().unwrap().send(task);
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let start = answered_in_one_second(handler).await;
    let task = spawned_rx.await.unwrap();
    let (result, _) = tokio::time::timeout(GUARD, task)
        .await
        .expect("the moved call ended at its deadline")
        .unwrap();
    assert!(is_deadline_exceeded(&*result.unwrap_err()));
    assert_eq!(start.elapsed(), 999 * MS);
    assert!(seen.lock().unwrap().iter().all(|&seen| seen));
}

type Stalled = http_body_util::channel::Channel<bytes::Bytes>;
type Senders = Arc<Mutex<Vec<http_body_util::channel::Sender<bytes::Bytes>>>>;

/// A dependency that answers at once with a body that streams nothing and never ends (its
/// sender is kept in `senders`).
fn stalled_body(
    senders: &Senders,
) -> impl Service<
    Request<String>,
    Response = Response<Stalled>,
    Error = Infallible,
    Future = std::future::Ready<Result<Response<Stalled>, Infallible>>,
> + Clone
+ use<> {
    let senders = senders.clone();
    service_fn(move |_req: Request<String>| {
        let (tx, body) = http_body_util::channel::Channel::new(1);
        senders.lock().unwrap().push(tx);
        std::future::ready(Ok(Response::new(body)))
    })
}

/// A client's response body read inside a handler ends at its deadline; the same body read on
/// a task of its own ends at its deadline there.
#[tokio::test(start_paused = true)]
async fn a_response_body_ends_at_its_deadline_wherever_it_is_read() {
    use http_body_util::BodyExt;
    let senders = Arc::new(Mutex::new(Vec::new()));
    let client = PropagateDeadlineLayer::new().layer(stalled_body(&senders));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let tx = Arc::new(Mutex::new(Some(tx)));
    let handler = service_fn(move |req: Request<String>| {
        let client = client.clone();
        let tx = tx.clone();
        let read_here = req.uri().path() == "/here";
        async move {
            let mut body = client
                .oneshot(http_request(None))
                .await
                .unwrap()
                .into_body();
            let first = std::future::poll_fn(|cx| {
                Poll::Ready(http_body::Body::poll_frame(Pin::new(&mut body), cx))
            })
            .await;
            assert!(first.is_pending());
            if read_here {
                // At the deadline the body answers first: the handler polls it before the
                // server's deadline layer looks at its own timer.
                let start = Instant::now();
                let err = body.frame().await.expect("a frame").unwrap_err();
                assert!(is_deadline_exceeded(&*err), "{err}");
                assert_eq!(start.elapsed(), 999 * MS);
                return Ok(Response::new("cut".to_owned()));
            }
            let reader = tokio::spawn(async move {
                let start = Instant::now();
                (body.frame().await, start.elapsed())
            });
            let _ = tx.lock().unwrap().take().unwrap().send(reader);
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let server = DeadlineLayer::new().layer(handler);

    let start = Instant::now();
    let mut here = http_request(Some("1S"));
    *here.uri_mut() = "http://dep/here".parse().unwrap();
    let response = tokio::time::timeout(GUARD, server.clone().oneshot(here))
        .await
        .expect("the body ended at its deadline")
        .unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"cut");
    assert_eq!(start.elapsed(), 999 * MS);

    let start = Instant::now();
    let response = server.oneshot(http_request(Some("1S"))).await.unwrap();
    assert_eq!(response.status(), 200);
    let (frame, _) = tokio::time::timeout(GUARD, rx.await.unwrap())
        .await
        .expect("the body read on its own task ended at its deadline")
        .unwrap();
    let err = frame.expect("a frame").unwrap_err();
    assert!(is_deadline_exceeded(&*err), "{err}");
    assert_eq!(start.elapsed(), 999 * MS);
}

/// A waker that only counts its wakes.
struct Counting(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A client call polled inside a handler, but with another waker (a nested executor's, a
/// `block_on` inside the poll): its own timer wakes that waker at the deadline.
#[tokio::test(start_paused = true)]
async fn a_call_polled_with_another_waker_arms_its_own_timer() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let client = PropagateDeadlineLayer::new().layer(hung(Timer::None, &seen));
    let counting = Arc::new(Counting(0.into()));
    let theirs = std::task::Waker::from(counting.clone());
    let parked = Arc::new(Mutex::new(None));
    let handler = {
        let parked = parked.clone();
        let theirs = theirs.clone();
        service_fn(move |_req: Request<String>| {
            let (client, parked, theirs) = (client.clone(), parked.clone(), theirs.clone());
            // Polled inside the server's deadline layer's poll, as a handler's code is.
            async move {
                let mut call = Box::pin(client.oneshot(http_request(None)));
                let mut cx = Context::from_waker(&theirs);
                assert!(call.as_mut().poll(&mut cx).is_pending());
                *parked.lock().unwrap() = Some(call);
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        })
    };
    let start = answered_in_one_second(handler).await;
    assert_eq!(*seen.lock().unwrap(), [true]);
    tokio::time::sleep(Duration::from_millis(999)).await;
    tokio::task::yield_now().await;
    assert_eq!(start.elapsed(), 999 * MS);
    assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    let mut call = parked.lock().unwrap().take().unwrap();
    let mut cx = Context::from_waker(&theirs);
    let Poll::Ready(result) = call.as_mut().poll(&mut cx) else {
        panic!("the call ended at its deadline");
    };
    assert!(is_deadline_exceeded(&*result.unwrap_err()));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]

    /// Nested deadline layers around a dependency that waits on timers of its own, arms and
    /// drops others, spins and may hang: the call ends exactly when the dependency answers or
    /// at the earliest deadline, whichever is first (at the same instant the dependency, polled
    /// first, answers if its timer firing is all it waited for; one that still needs a poll
    /// more is too late), and never later.
    #[test]
    fn a_call_ends_at_its_answer_or_its_deadline_whatever_the_timers_inside(
        steps in proptest::collection::vec(step(), 0..6),
        timeouts in proptest::collection::vec(5u64..100, 1..4),
    ) {
        let rt = backstop_test_support::paused_runtime();
        let (answer, spins_after) = script_answer(&steps);
        let deadline = *timeouts.iter().min().unwrap();
        let in_time = answer.is_some_and(|ms| ms < deadline || (ms == deadline && !spins_after));
        let (result, took) = rt.block_on(async {
            let dependency = scripted::<Request<String>>(steps.clone());
            let layer = |ms: u64| {
                PropagateDeadlineLayer::builder()
                    .timeout(Duration::from_millis(ms))
                    .build()
                    .unwrap()
            };
            // Innermost first: each layer around the ones before it.
            type Boxed = tower::util::BoxCloneService<Request<String>, Response<()>, BoxError>;
            let mut service: Boxed = tower::util::BoxCloneService::new(
                dependency.map_response(|r| r.map(|_| ())).map_err(BoxError::from),
            );
            for &ms in timeouts.iter().rev() {
                service = tower::util::BoxCloneService::new(
                    layer(ms).layer(service).map_response(|r| r.map(|_| ())),
                );
            }
            let start = Instant::now();
            let result = tokio::time::timeout(GUARD, service.oneshot(http_request(None)))
                .await
                .expect("the call ended by its deadline");
            (result.map(|_| ()), start.elapsed())
        });
        match answer {
            Some(ms) if in_time => {
                proptest::prop_assert!(result.is_ok(), "{:?}", result.err());
                proptest::prop_assert_eq!(took, Duration::from_millis(ms));
            }
            _ => {
                let err = result.expect_err("past its deadline");
                proptest::prop_assert!(is_deadline_exceeded(&*err), "{}", err);
                proptest::prop_assert_eq!(took, Duration::from_millis(deadline));
            }
        }
    }
}

/// What a handler does with a client call it polled once, before it waits on something no
/// timer wakes (a channel nobody sends on).
#[derive(Clone, Copy, Debug)]
enum Then {
    /// Moves the call to a task of its own.
    Spawn,
    /// Hands the call to another task, which drops it.
    DropElsewhere,
    /// Drops it here.
    Drop,
}

/// A server's deadline holds whatever its handler does with a client call it polled once
/// (with a bound shorter than the server's deadline, so a timer was armed inside): the server
/// answers 504 at its own deadline. (A deadline layer that relied on the timer armed inside
/// lost the wake-up to the task the call was moved to, or to nothing once it was dropped.)
#[tokio::test(start_paused = true)]
async fn the_server_answers_at_its_deadline_whatever_the_handler_does_with_a_polled_call() {
    for then in [Then::Spawn, Then::DropElsewhere, Then::Drop] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let client = PropagateDeadlineLayer::builder()
            .timeout(500 * MS)
            .build()
            .unwrap()
            .layer(hung(Timer::None, &seen));
        let handler = service_fn(move |_req: Request<String>| {
            let client = client.clone();
            async move {
                let mut call = Box::pin(client.oneshot(http_request(None)));
                let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
                assert!(first.is_pending());
                match then {
                    Then::Spawn => drop(tokio::spawn(call)),
                    Then::DropElsewhere => drop(tokio::spawn(async move { drop(call) })),
                    Then::Drop => drop(call),
                }
                let (_tx, never) = tokio::sync::oneshot::channel::<()>();
                let _ = never.await;
                std::future::pending::<()>().await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        });
        let service = DeadlineLayer::new().layer(handler);
        let start = Instant::now();
        let response = tokio::time::timeout(GUARD, service.oneshot(http_request(Some("1S"))))
            .await
            .unwrap_or_else(|_| panic!("{then:?}: the server answered at its deadline"))
            .unwrap();
        assert_eq!(response.status(), 504, "{then:?}");
        assert_eq!(start.elapsed(), 999 * MS, "{then:?}");
    }
}

/// A body whose frames are always ready: a stream held back only by a slow reader.
struct AlwaysReady(u32);

impl http_body::Body for AlwaysReady {
    type Data = bytes::Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Infallible>>> {
        if self.0 == 0 {
            return Poll::Ready(None);
        }
        self.0 -= 1;
        Poll::Ready(Some(Ok(http_body::Frame::data(bytes::Bytes::from_static(
            b"x",
        )))))
    }
}

/// Reads `body` a frame every 30 ms: when each data frame came, and how it ended (`Some`:
/// the gRPC status of its trailers, `None`: an error).
async fn read_slowly<B>(body: B) -> (Vec<Duration>, Option<Option<String>>)
where
    B: http_body::Body,
{
    use http_body_util::BodyExt;
    let start = Instant::now();
    let mut body = std::pin::pin!(body);
    let mut data = Vec::new();
    loop {
        match body.frame().await {
            None => return (data, Some(None)),
            Some(Err(_)) => return (data, None),
            Some(Ok(frame)) if frame.is_data() => data.push(start.elapsed()),
            Some(Ok(frame)) => {
                let trailers = frame.into_trailers().ok().unwrap();
                let status = trailers["grpc-status"].to_str().unwrap().to_owned();
                return (data, Some(Some(status)));
            }
        }
        tokio::time::sleep(30 * MS).await;
    }
}

/// Defect (found attacking the change): a response body whose frames were always ready never
/// reached its timer, so a streaming handler read by a slow client ran past the deadline on
/// both sides. Every frame now reads the clock: the body ends at the first frame read past
/// the deadline, with DEADLINE_EXCEEDED trailers for gRPC and an error otherwise.
#[tokio::test(start_paused = true)]
async fn a_body_of_always_ready_frames_ends_at_its_deadline() {
    for grpc in [true, false] {
        let handler = service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(Response::new(AlwaysReady(20)))
        });
        let request = |timeout: Option<&str>| {
            let mut req = backstop_test_support::request(grpc, timeout);
            *req.body_mut() = String::new();
            req
        };
        // The server's side: its answer to a caller that gave it 100 ms.
        let server = DeadlineLayer::new().layer(handler);
        let response = server.oneshot(request(Some("101m"))).await.unwrap();
        let (data, end) = read_slowly(response.into_body()).await;
        assert!(data.iter().all(|&at| at < 100 * MS), "{grpc}: {data:?}");
        assert_eq!(end, grpc.then(|| Some("4".to_owned())), "{grpc}");
        // The client's side: a call bounded by 100 ms.
        let client = PropagateDeadlineLayer::builder()
            .timeout(100 * MS)
            .build()
            .unwrap()
            .layer(handler);
        let response = client.oneshot(request(None)).await.unwrap();
        let (data, end) = read_slowly(response.into_body()).await;
        assert!(data.iter().all(|&at| at < 100 * MS), "{grpc}: {data:?}");
        assert_eq!(end, grpc.then(|| Some("4".to_owned())), "{grpc}");
    }
}
