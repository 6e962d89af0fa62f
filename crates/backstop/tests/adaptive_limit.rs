//! The presets' adaptive limit on attempts, against a dependency of fixed capacity (workers
//! behind one FIFO queue, so its latency grows with the queue) under paused time: it learns
//! what the dependency serves within the callers' deadlines without being told, refuses the
//! rest at once (never sent, never retried), and lets a dependency that is slow but not busy
//! alone. And the callers around a call that waits for one of its permits.

use backstop::ReplayBody;
use backstop::client::overload::bulkhead::BulkheadLayer;
use backstop::client::retry::GiveUp;
use backstop::client::{ClientLayer, call_info};
use backstop::{AttemptTimedOut, BreakerOpen, BulkheadFull, DeadlineExceeded};
use http::{Request, Response};
use std::{
    convert::Infallible,
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};
use tokio::{task::JoinSet, time::Instant};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

const MS: Duration = Duration::from_millis(1);

/// What the dependency saw: attempts sent to it, and the most it held at once.
#[derive(Default)]
struct Seen {
    sent: AtomicU32,
    holding: AtomicU32,
    most: AtomicU32,
}

/// A dependency of `workers` workers taking `service` each, behind one FIFO queue (tokio's
/// semaphore is fair): it serves `workers / service` calls a second, and a call waits for the
/// ones queued before it.
fn queued(
    workers: usize,
    service: Duration,
    seen: &Arc<Seen>,
    reply: fn() -> Response<String>,
) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    let (seen, queue) = (seen.clone(), Arc::new(tokio::sync::Semaphore::new(workers)));
    service_fn(move |_req: Request<ReplayBody<String>>| {
        let (seen, queue) = (seen.clone(), queue.clone());
        seen.sent.fetch_add(1, Ordering::SeqCst);
        let holding = seen.holding.fetch_add(1, Ordering::SeqCst) + 1;
        seen.most.fetch_max(holding, Ordering::SeqCst);
        async move {
            let worker = queue.acquire_owned().await.expect("never closed");
            tokio::time::sleep(service).await;
            drop(worker);
            seen.holding.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, Infallible>(reply())
        }
    })
}

/// How the calls of a run ended.
#[derive(Debug, Default)]
struct Ended {
    /// Answered 200 before their deadline.
    in_time: u32,
    /// Refused by the adaptive limit (never sent).
    refused: u32,
    /// Refused by the open breaker.
    breaker: u32,
    /// Answered by the deadline, or by the attempt bound with no time left to retry.
    expired: u32,
}

/// Sends `per_second` calls a second for `seconds` through `client` (an HTTP preset with a
/// `deadline` timeout), each on a task of its own in a `JoinSet`, arrivals on a fixed schedule (a
/// slow answer does not slow them); returns how they ended from `from` on.
async fn offer<S, B>(
    client: S,
    per_second: u64,
    seconds: u64,
    from: Duration,
    deadline: Duration,
) -> Ended
where
    S: Service<Request<String>, Response = Response<B>> + Clone + Send + 'static,
    S::Error: Into<backstop::BoxError>,
    S::Future: Send,
    B: Send + 'static,
{
    let start = Instant::now();
    let gap = Duration::from_secs(1) / u32::try_from(per_second).unwrap();
    let mut calls = JoinSet::new();
    for i in 0..per_second * seconds {
        tokio::time::sleep_until(start + gap * u32::try_from(i).unwrap()).await;
        let client = client.clone();
        let sent = Instant::now();
        calls.spawn(async move {
            let result = client.oneshot(backstop_test_support::get()).await;
            (sent, Instant::now(), result.map_err(Into::into))
        });
    }
    let mut ended = Ended::default();
    while let Some(joined) = calls.join_next().await {
        let (sent, done, result) = joined.unwrap();
        if sent.duration_since(start) < from {
            continue;
        }
        match result {
            Ok(response) => {
                assert_eq!(response.status(), 200);
                assert!(done - sent <= deadline);
                ended.in_time += 1;
            }
            Err(err) => {
                if let Some(full) = backstop::find::<BulkheadFull>(err.as_ref()) {
                    assert_eq!(full.knob(), "adaptive_limit", "{err}");
                    ended.refused += 1;
                } else if backstop::find::<BreakerOpen>(err.as_ref()).is_some() {
                    ended.breaker += 1;
                } else {
                    assert!(
                        backstop::find::<DeadlineExceeded>(err.as_ref()).is_some()
                            || backstop::find::<AttemptTimedOut>(err.as_ref()).is_some(),
                        "{err:?}"
                    );
                    ended.expired += 1;
                }
            }
        }
    }
    ended
}

fn preset(throttle: bool) -> ClientLayer<backstop::HttpClassifier> {
    let builder = backstop::client::http()
        .name("capacity")
        .timeout(Duration::from_secs(1));
    let builder = if throttle {
        builder
    } else {
        builder.throttle(None)
    };
    builder.build().unwrap()
}

/// Polls `future` once, from the calling task.
async fn poll_once<F: Future + Unpin>(mut future: F) -> std::task::Poll<F::Output> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut future).poll(cx)))
        .await
}

fn ok() -> Response<String> {
    backstop_test_support::reply(200)
}

/// 1 000 calls a second offered to a dependency that serves 400 (4 workers × 10 ms), each
/// call with 1 s: with no limit its queue grows until every call waits past its deadline.
/// The limit, never told the capacity, keeps the answers in time near 400 a second.
#[tokio::test(start_paused = true)]
async fn a_dependency_of_fixed_capacity_serves_near_its_capacity_in_time() {
    for throttle in [false, true] {
        let seen = Arc::new(Seen::default());
        let layer = preset(throttle);
        let client =
            ServiceBuilder::new()
                .layer(layer.clone())
                .service(queued(4, 10 * MS, &seen, ok));
        // Measured from 3 s on: the limit has learnt, and the queue the dependency had
        // before it did is served.
        let ended = offer(
            client,
            1_000,
            8,
            Duration::from_secs(3),
            Duration::from_secs(1),
        )
        .await;
        let goodput = f64::from(ended.in_time) / 5.0;
        assert!(goodput >= 0.9 * 400.0, "throttle {throttle}: {ended:?}");
        assert!(ended.refused > 0, "{ended:?}");
        let limit = layer.adaptive_limit_layer();
        assert!(limit.limit() < 1_000, "learnt {}", limit.limit());
        // Every attempt the dependency saw is one of the calls' (none refused was sent: a
        // refusal inside the retry layer is an attempt it counts).
        let stats = layer.retry_layer().stats();
        let sent = u64::from(seen.sent.load(Ordering::SeqCst));
        assert!(sent + u64::from(ended.refused) <= stats.requests + stats.retries);
    }
}

/// The same dependency with the limit taken out: the queue grows and most calls miss their
/// deadline (what the limit is for).
#[tokio::test(start_paused = true)]
async fn without_the_limit_the_queue_takes_the_deadlines() {
    let seen = Arc::new(Seen::default());
    let layer = backstop::client::http()
        .timeout(Duration::from_secs(1))
        .throttle(None)
        .adaptive_limit(false)
        .build()
        .unwrap();
    assert!(!layer.adaptive_limit_layer().is_on());
    let client = ServiceBuilder::new()
        .layer(layer)
        .service(queued(4, 10 * MS, &seen, ok));
    let ended = offer(
        client,
        1_000,
        8,
        Duration::from_secs(2),
        Duration::from_secs(1),
    )
    .await;
    assert_eq!(ended.refused, 0);
    assert!(
        f64::from(ended.in_time) / 6.0 < 0.75 * 400.0,
        "{ended:?}: the queue should have cost answers"
    );
    assert!(seen.most.load(Ordering::SeqCst) > 400);
}

/// A dependency that is slow (800 ms) but not busy, with 3 s per call: nothing is held
/// back, whatever its latency did before.
#[tokio::test(start_paused = true)]
async fn a_slow_dependency_that_is_not_busy_is_not_limited() {
    let seen = Arc::new(Seen::default());
    let layer = backstop::client::http()
        .timeout(Duration::from_secs(3))
        .throttle(None)
        .build()
        .unwrap();
    let latency = Arc::new(std::sync::atomic::AtomicU64::new(50));
    let dependency = {
        let (seen, latency) = (seen.clone(), latency.clone());
        service_fn(move |_req: Request<ReplayBody<String>>| {
            seen.sent.fetch_add(1, Ordering::SeqCst);
            let ms = latency.load(Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok::<_, Infallible>(ok())
            }
        })
    };
    let client = ServiceBuilder::new()
        .layer(layer.clone())
        .service(dependency);
    let stepped = {
        let latency = latency.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            latency.store(800, Ordering::SeqCst);
        })
    };
    let ended = offer(client, 500, 6, Duration::ZERO, Duration::from_secs(3)).await;
    stepped.await.unwrap();
    assert_eq!(ended.refused, 0, "{ended:?}");
    assert_eq!(ended.in_time, 3_000);
    assert_eq!(layer.adaptive_limit_layer().limit(), 10_000);
}

/// A gRPC call the limit refuses is a trailers-only UNAVAILABLE with pushback −1, not
/// retried.
#[tokio::test(start_paused = true)]
async fn a_refused_grpc_attempt_is_unavailable_with_pushback_and_not_retried() {
    let seen = Arc::new(Seen::default());
    let layer = backstop::client::grpc()
        .timeout(Duration::from_secs(1))
        .throttle(None)
        .build()
        .unwrap();
    let client =
        ServiceBuilder::new()
            .layer(layer.clone())
            .service(queued(4, 10 * MS, &seen, || {
                backstop_test_support::grpc_reply(0)
            }));
    let start = Instant::now();
    let mut calls = JoinSet::new();
    for i in 0..4_000u32 {
        tokio::time::sleep_until(start + i * MS).await;
        let client = client.clone();
        calls.spawn(client.oneshot(backstop_test_support::grpc_call("")));
    }
    let mut refused = 0;
    while let Some(joined) = calls.join_next().await {
        let response = joined.unwrap().unwrap();
        if response.extensions().get::<backstop::Rejection>()
            == Some(&backstop::Rejection::BulkheadFull)
        {
            assert_eq!(response.headers()["grpc-status"], "14");
            assert_eq!(response.headers()["grpc-retry-pushback-ms"], "-1");
            assert_eq!(call_info(&response).attempts(), 1, "one attempt, refused");
            assert_ne!(call_info(&response).gave_up(), Some(GiveUp::Attempts));
            refused += 1;
        }
    }
    assert!(refused > 0);
    assert!(layer.adaptive_limit_layer().limit() < 1_000);
}

/// Callers around a call waiting for an adaptive limit's permit (the cap 1, held): dropped
/// after a poll, it leaves the queue; lost in a `select!`, likewise; spawned after a poll, it
/// is granted when the permit is given back.
#[tokio::test(start_paused = true)]
async fn callers_around_a_waiting_call() {
    let layer = BulkheadLayer::builder(1).adaptive(true).build().unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let service = {
        let gate = gate.clone();
        ServiceBuilder::new()
            .layer(layer.clone())
            .service(service_fn(move |_req: Request<()>| {
                let gate = gate.clone();
                async move {
                    gate.acquire().await.unwrap().forget();
                    Ok::<_, Infallible>(Response::new(()))
                }
            }))
    };
    let holder = tokio::spawn(service.clone().oneshot(Request::new(())));
    tokio::task::yield_now().await;
    assert_eq!(layer.in_flight(), 1);

    // Poll, then drop: out of the queue.
    {
        let mut waiting = pin!(service.clone().oneshot(Request::new(())));
        assert!(poll_once(waiting.as_mut()).await.is_pending());
        assert_eq!(layer.waiting(), 1);
    }
    assert_eq!(layer.waiting(), 0);

    // Lost in a `select!`: likewise.
    tokio::select! {
        _ = service.clone().oneshot(Request::new(())) => panic!("no permit is free"),
        () = tokio::time::sleep(10 * MS) => {}
    }
    assert_eq!(layer.waiting(), 0);

    // Polled here, then spawned: granted when the holder answers.
    let mut waiting = Box::pin(service.clone().oneshot(Request::new(())));
    assert!(poll_once(waiting.as_mut()).await.is_pending());
    let spawned = tokio::spawn(waiting);
    gate.add_permits(2);
    holder.await.unwrap().unwrap();
    spawned.await.unwrap().unwrap();
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

/// With the breaker keyed by path, each route learns its own limit: a route whose
/// dependency queues (4 workers × 10 ms, offered 1 000 calls a second) is cut, while a route
/// that answers at once, called as often through the same stack, keeps the cap.
#[tokio::test(start_paused = true)]
async fn each_route_learns_its_own_limit_where_the_breaker_is_keyed() {
    let seen = Arc::new(Seen::default());
    let layer = backstop::client::http()
        .timeout(Duration::from_secs(1))
        .throttle(None)
        .breaker(
            backstop::client::http_breaker()
                .per_key(backstop::RouteKey::Path)
                .max_keys(8),
        )
        .build()
        .unwrap();
    let limit = layer.adaptive_limit_layer();
    assert!(matches!(limit.key(), Some(backstop::RouteKey::Path)));
    let queued = queued(4, 10 * MS, &seen, ok);
    let dependency = service_fn(move |req: Request<ReplayBody<String>>| {
        let slow = req.uri().path() == "/slow";
        let call = slow.then(|| queued.clone().oneshot(req));
        async move {
            match call {
                Some(call) => call.await,
                None => Ok(ok()),
            }
        }
    });
    let client = ServiceBuilder::new()
        .layer(layer.clone())
        .service(dependency);
    let start = Instant::now();
    let mut calls = JoinSet::new();
    for i in 0..4_000u32 {
        tokio::time::sleep_until(start + i * MS / 2).await;
        let path = if i % 2 == 0 { "/slow" } else { "/fast" };
        let req = Request::get(path).body(String::new()).unwrap();
        calls.spawn(client.clone().oneshot(req));
    }
    while calls.join_next().await.is_some() {}
    assert_eq!(limit.keys(), ["/fast", "/slow"]);
    assert!(
        limit.key_limit("/slow").unwrap() < 1_000,
        "{:?}",
        limit.key_limit("/slow")
    );
    assert_eq!(limit.key_limit("/fast"), Some(10_000));
    assert_eq!(limit.limit(), 10_000, "the overflow saw no call");
}
