//! The deadline holds whatever the caller does around the layers (issue 23's method: vary the
//! caller, not only the dependency). A handler behind `backstop::server()` calls a dependency
//! through the client preset and then does what user code does with the call: awaits it,
//! polls it and moves it to another task, drops it there or here, races it in `select!`, puts
//! it in a `FuturesUnordered` or a `JoinSet`; the client is called plainly, behind a `Buffer`
//! or a `ConcurrencyLimit`, or with one of those inside the preset. Under every action:
//!
//! - the server answers by its deadline, with the handler's answer when the handler had one;
//! - every outbound call ends by its deadline, on whichever task it ended up;
//! - the dependency is told the deadline (`grpc-timeout`) on every attempt.

use backstop::BoxError;
use backstop::client::retry::ReplayBody;
use backstop::deadline::{DeadlineFutureExt, current};
use backstop_test_support::{Step, deadline_case, script_answer, scripted};
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use proptest::prelude::*;
use std::{
    convert::Infallible,
    pin::Pin,
    sync::{Arc, Mutex},
    task::Poll,
    time::Duration,
};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt, util::BoxCloneService};

/// Far past every deadline here: a call still running then was never woken.
const GUARD: Duration = Duration::from_secs(60);

/// What the handler does with its call once it has polled it `polls` times.
#[derive(Debug, Clone, Copy)]
enum Then {
    /// Awaits it.
    Await,
    /// Moves it to a task of its own and waits on something no timer wakes.
    Spawn,
    /// Moves it to a task of its own and awaits that task.
    SpawnAndAwait,
    /// Moves it into a `JoinSet` and awaits it there.
    JoinSet,
    /// Pushes it into a `FuturesUnordered` and awaits the set.
    Unordered,
    /// Drops it and waits on something no timer wakes.
    Drop,
    /// Hands it to another task that drops it, and waits on something no timer wakes.
    DropElsewhere,
    /// Races it against a timer of the handler's own (this many ms); if the timer wins, the
    /// call is moved to a task of its own and the handler waits on something no timer wakes.
    Select(u64),
    /// Does not call in the handler at all: spawns `oneshot(..).with_current_deadline()`, the
    /// documented way to carry the deadline into a task, and awaits it.
    SpawnWithCurrentDeadline,
}

/// How the handler's client is put together.
#[derive(Debug, Clone, Copy)]
enum Wiring {
    /// The preset over the dependency.
    Plain,
    /// A `Buffer` around the preset: its `call` runs on the buffer's worker task, so the
    /// handler puts the deadline on the request (the documented way).
    BufferAround,
    /// A `ConcurrencyLimit` around the preset.
    LimitAround,
    /// The preset over a `Buffer` (a tonic `Channel` is one).
    BufferInside,
    /// The preset over a `ConcurrencyLimit`.
    LimitInside,
}

fn then() -> impl Strategy<Value = Then> {
    prop_oneof![
        Just(Then::Await),
        Just(Then::Spawn),
        Just(Then::SpawnAndAwait),
        Just(Then::JoinSet),
        Just(Then::Unordered),
        Just(Then::Drop),
        Just(Then::DropElsewhere),
        (1u64..120).prop_map(Then::Select),
        Just(Then::SpawnWithCurrentDeadline),
    ]
}

fn wiring() -> impl Strategy<Value = Wiring> {
    prop_oneof![
        Just(Wiring::Plain),
        Just(Wiring::BufferAround),
        Just(Wiring::LimitAround),
        Just(Wiring::BufferInside),
        Just(Wiring::LimitInside),
    ]
}

type Client = BoxCloneService<Request<String>, StatusCode, BoxError>;

/// What the dependency and the calls saw: each attempt's `grpc-timeout`, and when each call
/// that was moved to another task ended (`None`: it has not).
#[derive(Debug, Default)]
struct Seen {
    timeouts: Vec<Option<String>>,
    moved: Vec<Option<Duration>>,
}

fn client(wiring: Wiring, steps: &[Step], attempt: u64, seen: &Arc<Mutex<Seen>>) -> Client {
    let seen = seen.clone();
    let dependency = ServiceBuilder::new()
        .map_request(move |req: Request<ReplayBody<String>>| {
            let timeout = req.headers().get("grpc-timeout");
            let timeout = timeout.map(|v| v.to_str().unwrap().to_owned());
            seen.lock().unwrap().timeouts.push(timeout);
            req
        })
        .service(scripted::<Request<ReplayBody<String>>>(steps.to_vec()));
    let preset = backstop::client::http()
        .attempt(backstop::client::attempt::AttemptBound::Fixed(
            Duration::from_millis(attempt),
        ))
        .build()
        .unwrap();
    let status = |r: Response<_>| r.status();
    match wiring {
        Wiring::Plain => BoxCloneService::new(preset.layer(dependency).map_response(status)),
        Wiring::BufferAround => BoxCloneService::new(tower::buffer::Buffer::new(
            preset.layer(dependency).map_response(status),
            8,
        )),
        Wiring::LimitAround => BoxCloneService::new(tower::limit::ConcurrencyLimit::new(
            preset.layer(dependency).map_response(status),
            1,
        )),
        Wiring::BufferInside => BoxCloneService::new(
            preset
                .layer(tower::buffer::Buffer::new(dependency, 8))
                .map_response(status),
        ),
        Wiring::LimitInside => BoxCloneService::new(
            preset
                .layer(tower::limit::ConcurrencyLimit::new(dependency, 1))
                .map_response(status),
        ),
    }
}

fn answer(result: Result<StatusCode, BoxError>) -> Result<Response<String>, Infallible> {
    let mut response = Response::new(String::new());
    *response.status_mut() = match result {
        Ok(status) => status,
        Err(_) => StatusCode::BAD_GATEWAY,
    };
    Ok(response)
}

/// Runs `call` on a task of its own, recording when it ended.
fn spawn_recorded<F>(call: F, seen: &Arc<Mutex<Seen>>, start: Instant)
where
    F: Future + Send + 'static,
{
    let seen = seen.clone();
    let slot = {
        let mut seen = seen.lock().unwrap();
        seen.moved.push(None);
        seen.moved.len() - 1
    };
    drop(tokio::spawn(async move {
        call.await;
        seen.lock().unwrap().moved[slot] = Some(start.elapsed());
    }));
}

/// Waits on something no timer wakes.
async fn forever() -> Result<Response<String>, Infallible> {
    let (_tx, never) = tokio::sync::oneshot::channel::<()>();
    let _ = never.await;
    std::future::pending().await
}

async fn handle(
    mut client: Client,
    wiring: Wiring,
    polls: u8,
    then: Then,
    seen: Arc<Mutex<Seen>>,
    start: Instant,
) -> Result<Response<String>, Infallible> {
    let mut req = backstop_test_support::get();
    if let Wiring::BufferAround = wiring {
        // The client's `call` runs on the buffer's task: the deadline goes on the request.
        let deadline = current().expect("the server's deadline");
        req.extensions_mut().insert(deadline);
    }
    if let Then::SpawnWithCurrentDeadline = then {
        let call = client.oneshot(req).with_current_deadline();
        return answer(tokio::spawn(call).await.unwrap());
    }
    client.ready().await.expect("the client is ready");
    let mut call: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(client.call(req));
    for _ in 0..polls {
        let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        if let Poll::Ready(result) = polled {
            return answer(result);
        }
        tokio::task::yield_now().await;
    }
    match then {
        Then::Await => answer(call.await),
        Then::Spawn => {
            spawn_recorded(call, &seen, start);
            forever().await
        }
        Then::SpawnAndAwait => answer(tokio::spawn(call).await.unwrap()),
        Then::JoinSet => {
            let mut set = tokio::task::JoinSet::new();
            set.spawn(call);
            answer(set.join_next().await.unwrap().unwrap())
        }
        Then::Unordered => {
            let mut set = futures_util::stream::FuturesUnordered::new();
            set.push(call);
            answer(set.next().await.unwrap())
        }
        Then::Drop => {
            drop(call);
            forever().await
        }
        Then::DropElsewhere => {
            drop(tokio::spawn(async move { drop(call) }));
            forever().await
        }
        Then::Select(ms) => {
            tokio::select! {
                result = &mut call => answer(result),
                () = tokio::time::sleep(Duration::from_millis(ms)) => {
                    spawn_recorded(call, &seen, start);
                    forever().await
                }
            }
        }
        Then::SpawnWithCurrentDeadline => unreachable!("answered above"),
    }
}

/// Whether the handler answers with its call's result when that comes in time.
fn answers_with_the_call(then: Then) -> bool {
    matches!(
        then,
        Then::Await
            | Then::SpawnAndAwait
            | Then::JoinSet
            | Then::Unordered
            | Then::SpawnWithCurrentDeadline
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_deadline_holds_whatever_the_caller_does(
        (steps, deadline, attempt) in deadline_case(5),
        polls in 0u8..3,
        then in then(),
        wiring in wiring(),
    ) {
        let rt = backstop_test_support::paused_runtime();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (status, took) = rt.block_on(async {
            let client = client(wiring, &steps, attempt, &seen);
            let start = Instant::now();
            let handler_seen = seen.clone();
            let handler = tower::service_fn(move |_req: Request<String>| {
                handle(client.clone(), wiring, polls, then, handler_seen.clone(), start)
            });
            let server = backstop::server().layer(handler);
            let response = backstop_test_support::answer_within(server, deadline, GUARD).await;
            let took = start.elapsed();
            // Whatever was moved to another task has all the time it wants to end.
            tokio::time::sleep(GUARD).await;
            (response.status(), took)
        });
        // The server keeps 1 ms of the caller's time for its answer.
        let by = Duration::from_millis(deadline - 1);
        prop_assert!(took <= by, "answered at {:?}", took);
        let seen = seen.lock().unwrap();
        for ended in &seen.moved {
            let ended = ended.expect("a call moved to another task ended");
            prop_assert!(ended <= by, "a moved call ended at {:?}", ended);
        }
        for timeout in &seen.timeouts {
            prop_assert!(timeout.is_some(), "an attempt went out without the deadline");
        }
        let (answer, _) = script_answer(&steps);
        if let Some(ms) = answer.filter(|&ms| ms < attempt.min(deadline - 1))
            && answers_with_the_call(then)
        {
            prop_assert_eq!(status, StatusCode::OK);
            prop_assert_eq!(took, Duration::from_millis(ms));
        } else if matches!(then, Then::Spawn | Then::Drop | Then::DropElsewhere)
            && answer.is_none_or(|ms| ms > 0)
        {
            // The handler let go of a call that was not answered at once: nothing but the
            // server's deadline answers.
            prop_assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
            prop_assert_eq!(took, by);
        }
    }
}

/// A deadline holds for a handler that blocks its worker thread on the call
/// (`block_in_place` + `block_on`, as code bridging to a synchronous API does): the call still
/// ends at the server's deadline, told to the dependency. Real time on a multi-threaded
/// runtime (paused time needs a current-thread one): only the outcome is asserted, the guard
/// is far from the deadline.
#[test]
fn a_handler_that_blocks_on_its_call_keeps_the_deadline() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let client = client(Wiring::Plain, &[Step::Hang], 5_000, &seen);
    let handler = tower::service_fn(move |_req: Request<String>| {
        let client = client.clone();
        async move {
            let result = tokio::task::block_in_place(|| {
                let call = client.oneshot(backstop_test_support::get());
                tokio::runtime::Handle::current().block_on(call)
            });
            answer(result)
        }
    });
    let (status, took) = rt.block_on(async {
        let server = backstop::server().layer(handler);
        let start = Instant::now();
        let response = tokio::time::timeout(
            Duration::from_secs(30),
            server.oneshot(backstop_test_support::http_request(Some("300m"))),
        )
        .await
        .expect("the server answered")
        .unwrap();
        (response.status(), start.elapsed())
    });
    // The call failed at the deadline (the handler then answered 502), or the server did.
    assert!(
        status == StatusCode::BAD_GATEWAY || status == StatusCode::GATEWAY_TIMEOUT,
        "{status}"
    );
    assert!(took >= Duration::from_millis(250), "{took:?}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.timeouts.len(), 1);
    assert!(seen.timeouts[0].is_some());
}
