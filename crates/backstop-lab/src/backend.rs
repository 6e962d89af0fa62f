//! The dependency (a backend with injected faults) and the middle hop of a chain.

use crate::{
    metrics::Recorder,
    scenario::{Capacity, Schedule},
    stacks::{Body, Svc, empty, status},
};
use backstop::deadline::Deadline;
use backstop::{BoxError, BreakerOpen, DeadlineExceeded};
use http::{Request, Response};
use std::{
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    sync::{Semaphore, oneshot},
    time::Instant,
};
use tower::{Service, ServiceExt};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The header that says which user request a call is for (`post`: the dependency counts its
/// side effects per user request, so duplicates show).
pub const USER_REQUEST: &str = "x-user-request";

/// The dependency: answers after its service time (plus the phase's added latency), with a
/// 503 for the phase's share of requests.
///
/// Its work runs in a task of its own, as a query or a computation would: a caller that
/// gives up does not stop it. Only a deadline the request carries (set by backstop's
/// `DeadlineLayer` on this server from the caller's `grpc-timeout`) bounds it. Work done after
/// the caller gave up is recorded as orphaned.
///
/// With a [`Capacity`] (`overload`), a request waits in one FIFO queue for one of the
/// workers, so its latency grows with the queue; a request that finds the queue full is
/// answered 503 at once. A request waiting past the deadline it carries leaves the queue
/// without being worked on; one without a deadline is worked on when its turn comes, whether
/// its caller is still there or not. The number of workers may change during the run
/// (`capacity-drop`, [`Backend::change_workers`]): a worker taken away finishes the request
/// it is serving first.
#[derive(Clone, Debug)]
pub struct Backend {
    state: Arc<BackendState>,
}

#[derive(Debug)]
struct BackendState {
    schedule: Schedule,
    service_time: Duration,
    rng: Mutex<fastrand::Rng>,
    recorder: Arc<Recorder>,
    queue: Option<Queue>,
}

/// The workers of a dependency with a fixed capacity, and who waits for them.
#[derive(Debug)]
struct Queue {
    /// One permit per worker; tokio's semaphore grants them in FIFO order.
    workers: Arc<Semaphore>,
    /// Requests waiting for a worker now.
    waiting: AtomicU32,
    limit: u32,
    /// The workers there are now, and how many busy ones are to go away when they finish
    /// (taken away while serving a request).
    staff: Mutex<Staff>,
}

#[derive(Debug)]
struct Staff {
    workers: u32,
    leaving: u32,
}

impl Queue {
    /// Sets the number of workers to `workers`: idle ones go at once, busy ones when they
    /// finish; new ones take the first waiters in turn.
    fn set_workers(&self, workers: u32) {
        let mut staff = self.staff.lock().expect("staff");
        if workers < staff.workers {
            let fewer = staff.workers - workers;
            let gone = self.workers.forget_permits(fewer as usize) as u32;
            staff.leaving += fewer - gone;
        } else {
            let more = workers - staff.workers;
            let stay = more.min(staff.leaving);
            staff.leaving -= stay;
            self.workers.add_permits((more - stay) as usize);
        }
        staff.workers = workers;
    }

    /// A worker is done with its request: it serves the next one, unless it is to go away.
    fn release(&self, worker: tokio::sync::OwnedSemaphorePermit) {
        let mut staff = self.staff.lock().expect("staff");
        if staff.leaving > 0 {
            staff.leaving -= 1;
            worker.forget();
        } else {
            drop(staff);
            drop(worker);
        }
    }
}

/// The service time of every request (before the fault's added latency).
pub const SERVICE_TIME: Duration = Duration::from_millis(10);

impl Backend {
    /// A backend following `schedule`, seeded with `seed`, recording into `recorder`; with
    /// `capacity`, its workers and queue.
    pub fn new(
        schedule: Schedule,
        seed: u64,
        recorder: Arc<Recorder>,
        capacity: Option<Capacity>,
    ) -> Self {
        Self {
            state: Arc::new(BackendState {
                schedule,
                service_time: SERVICE_TIME,
                rng: Mutex::new(fastrand::Rng::with_seed(seed)),
                recorder,
                queue: capacity.map(|c| Queue {
                    workers: Arc::new(Semaphore::new(c.workers as usize)),
                    waiting: AtomicU32::new(0),
                    limit: c.queue,
                    staff: Mutex::new(Staff {
                        workers: c.workers,
                        leaving: 0,
                    }),
                }),
            }),
        }
    }

    /// Changes the number of workers at each `(when, workers)` of `changes`, `when` from the
    /// start of the schedule (`capacity-drop`). Spawns a task on the current runtime; nothing
    /// without a capacity or without changes.
    pub fn change_workers(&self, changes: Vec<(Duration, u32)>) {
        if self.state.queue.is_none() || changes.is_empty() {
            return;
        }
        let state = self.state.clone();
        tokio::spawn(async move {
            for (when, workers) in changes {
                tokio::time::sleep_until(state.schedule.start + when).await;
                if let Some(queue) = &state.queue {
                    queue.set_workers(workers);
                }
            }
        });
    }
}

impl Service<Request<Body>> for Backend {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let state = self.state.clone();
        let now = Instant::now();
        let fault = state.schedule.fault_at(now);
        let faulty = fault.applies_to(req.uri().path());
        let route = crate::scenario::route_of(req.uri().path());
        state.recorder.attempt(now, route);
        let fault = if faulty {
            fault
        } else {
            state.schedule.phases[0].fault
        };
        let (fail, tail) = {
            let mut rng = state.rng.lock().expect("rng");
            let fail = rng.f64() < fault.error_rate;
            // Drawn only when there is a tail, so other scenarios keep their sequences.
            (fail, fault.tail_rate > 0.0 && rng.f64() < fault.tail_rate)
        };
        let mut work = state.service_time + fault.added_latency;
        if tail {
            work += fault.tail_latency;
        }
        if let Some((slow, more)) = fault.slow_route
            && route == Some(slow)
        {
            work += more;
        }
        let deadline = req.extensions().get::<Deadline>().map(|d| d.instant());
        // With a capacity: in the queue now (one waiting for a free worker too, briefly), or
        // a 503 at once when it is full.
        if let Some(queue) = &state.queue
            && queue.waiting.fetch_add(1, Ordering::Relaxed) >= queue.limit
        {
            queue.waiting.fetch_sub(1, Ordering::Relaxed);
            return Box::pin(async { Ok(status(503)) });
        }
        // A POST's side effect (a charge), done with the work whoever still waits for it.
        let effect = (req.method() == http::Method::POST)
            .then(|| {
                req.headers()
                    .get(USER_REQUEST)?
                    .to_str()
                    .ok()?
                    .parse::<u64>()
                    .ok()
            })
            .flatten();
        let (tx, rx) = oneshot::channel();
        let recorder = state.recorder.clone();
        recorder.work_started();
        tokio::spawn(async move {
            let mut tx = tx;
            // With a capacity: a worker first, in turn, unless the deadline passes first.
            let worker = match &state.queue {
                None => None,
                Some(queue) => {
                    let far = Instant::now() + Duration::from_secs(3600);
                    // Biased, so a tie (a worker freed at the very instant the deadline
                    // passes, common on the sim's paused clock) goes the same way every
                    // run: the deadline first, as a worker could do nothing in no time.
                    let worker = tokio::select! {
                        biased;
                        () = tokio::time::sleep_until(deadline.unwrap_or(far)) => None,
                        permit = queue.workers.clone().acquire_owned() => permit.ok(),
                    };
                    queue.waiting.fetch_sub(1, Ordering::Relaxed);
                    if worker.is_none() {
                        recorder.work_ended();
                        let _ = tx.send(status(504));
                        return;
                    }
                    worker
                }
            };
            let mut end = Instant::now() + work;
            if let Some(deadline) = deadline {
                end = end.min(deadline);
            }
            // The worker goes back to the queue (or away, if it was taken away meanwhile)
            // when this task ends, whichever way it ends.
            let _held = Released {
                worker,
                state: state.clone(),
            };
            // Biased: work that ends at the instant its caller leaves was done, not orphaned
            // (the same on every run).
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(end) => {}
                () = tx.closed() => {
                    let gave_up = Instant::now();
                    tokio::time::sleep_until(end).await;
                    recorder.orphaned(end.saturating_duration_since(gave_up));
                }
            }
            recorder.work_ended();
            if let (Some(user), false) = (effect, fail) {
                recorder.effect(user);
            }
            let _ = tx.send(status(if fail { 503 } else { 200 }));
        });
        Box::pin(async move { Ok(rx.await.unwrap_or_else(|_| status(503))) })
    }
}

/// A worker held by a request, given back through [`Queue::release`] when dropped.
struct Released {
    worker: Option<tokio::sync::OwnedSemaphorePermit>,
    state: Arc<BackendState>,
}

impl Drop for Released {
    fn drop(&mut self) {
        if let (Some(worker), Some(queue)) = (self.worker.take(), &self.state.queue) {
            queue.release(worker);
        }
    }
}

/// The middle hop of a chain: forwards each request to the next hop through its client stack
/// and answers with the status it got (503 for a local rejection or a transport error, 504
/// for a spent deadline). With [`work`](Self::work), its handler first spends that long on
/// its own (parsing, a cache lookup) before it calls the next hop.
#[derive(Clone, Debug)]
pub struct Relay {
    next: Svc,
    work: Option<Arc<RelayWork>>,
}

#[derive(Debug)]
struct RelayWork {
    least: Duration,
    spread: Duration,
    rng: Mutex<fastrand::Rng>,
}

impl Relay {
    /// A relay calling `next` (a client stack) at once.
    pub fn new(next: Svc) -> Self {
        Self { next, work: None }
    }

    /// Spends between `least` and `most` on each request (uniformly, seeded with `seed`)
    /// before calling the next hop.
    #[must_use]
    pub fn work(mut self, least: Duration, most: Duration, seed: u64) -> Self {
        if !most.is_zero() {
            self.work = Some(Arc::new(RelayWork {
                least,
                spread: most.saturating_sub(least),
                rng: Mutex::new(fastrand::Rng::with_seed(seed ^ 0x0b0b)),
            }));
        }
        self
    }
}

impl Service<Request<Body>> for Relay {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let next = self.next.clone();
        let mut forward = Request::new(empty());
        *forward.uri_mut() = req.uri().clone();
        // Boxed with its type spelled out: rustc cannot prove the `Send` of this future
        // through the trait objects in `Svc` otherwise.
        let call: BoxFuture<Result<Response<Body>, BoxError>> = Box::pin(next.oneshot(forward));
        let work = self.work.as_ref().map(|w| {
            let share = w.rng.lock().expect("rng").f64();
            w.least + w.spread.mul_f64(share)
        });
        Box::pin(async move {
            if let Some(work) = work {
                tokio::time::sleep(work).await;
            }
            Ok(match call.await {
                Ok(response) => status(response.status().as_u16()),
                Err(err) if backstop::find::<DeadlineExceeded>(err.as_ref()).is_some() => {
                    status(504)
                }
                Err(err) if backstop::find::<BreakerOpen>(err.as_ref()).is_some() => status(503),
                Err(_) => status(503),
            })
        })
    }
}

/// The network between a server and its callers, losing the phase's share of answers after
/// the server sent them (`post`): the caller sees a reset stream, the work is done.
#[derive(Clone, Debug)]
pub struct Lossy {
    inner: Svc,
    state: Arc<LossyState>,
}

#[derive(Debug)]
struct LossyState {
    schedule: Schedule,
    rng: Mutex<fastrand::Rng>,
}

/// The error a caller sees for a lost answer.
#[derive(Debug)]
pub struct AnswerLost;

impl std::fmt::Display for AnswerLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection reset: the answer was lost after the work was done")
    }
}

impl std::error::Error for AnswerLost {}

impl Lossy {
    /// Answers of `inner`, lost as `schedule` says (seeded with `seed`).
    pub fn new(inner: Svc, schedule: Schedule, seed: u64) -> Self {
        Self {
            inner,
            state: Arc::new(LossyState {
                schedule,
                rng: Mutex::new(fastrand::Rng::with_seed(seed ^ 0x105e)),
            }),
        }
    }
}

impl Service<Request<Body>> for Lossy {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let call = self.inner.call(req);
        let state = self.state.clone();
        Box::pin(async move {
            let response = call.await?;
            let lose_rate = state.schedule.fault_at(Instant::now()).lose_rate;
            let lost = lose_rate > 0.0 && state.rng.lock().expect("rng").f64() < lose_rate;
            if lost {
                return Err(Box::new(AnswerLost) as BoxError);
            }
            Ok(response)
        })
    }
}
