//! The two engines: `sim` (tokio's paused clock, in-process, deterministic for a seed) and
//! `real` (hyper HTTP/2 servers on 127.0.0.1, the real clock). Both drive the same stacks with
//! the same open-loop load.

use crate::{
    backend::{Backend, Lossy, Relay, USER_REQUEST},
    chart::Series,
    metrics::Recorder,
    report::{HopReport, MeasuredPoint, VariantReport},
    scenario::{Scenario, Schedule},
    stacks::{Adaptive, Body, ClientConfig, Svc, Variant, boxed, client, empty, server},
};
use backstop::BoxError;
use http::{Request, Uri};
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo},
};
use serde::Serialize;
use std::{
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::{net::TcpListener, time::Instant};
use tower::{ServiceBuilder, ServiceExt, util::BoxCloneService};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Where the load runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// hyper servers on 127.0.0.1 (random ports), real time.
    Real,
    /// In-process, tokio's paused clock, seeded: the same report for the same seed.
    Sim,
}

impl Engine {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Real => "real",
            Engine::Sim => "sim",
        }
    }
}

/// One run of one variant.
#[derive(Debug, Clone)]
pub struct Run {
    /// The scenario.
    pub scenario: Scenario,
    /// The engine.
    pub engine: Engine,
    /// The seed.
    pub seed: u64,
    /// Offered user requests per second.
    pub rps: u32,
    /// Length of the run.
    pub duration: Duration,
    /// How long a user waits for an answer (backstop: the deadline it propagates).
    pub patience: Duration,
    /// The `tower-resilience` variant's algorithm ([`Adaptive::BEST`] unless told otherwise).
    pub adaptive: Adaptive,
    /// Whether the `tower-resilience` variant refuses at once when its limit is reached
    /// (tower's `LoadShed` in front of it) instead of waiting (`--shed`; off by default).
    pub shed: bool,
}

/// Called once per user request sent (for a progress bar).
pub type Progress = Arc<dyn Fn() + Send + Sync>;

impl Run {
    /// A run of `scenario` on the sim engine, `rps` for `seconds`, with the scenario's
    /// patience and [`Adaptive::BEST`].
    pub fn sim(scenario: Scenario, seed: u64, rps: u32, seconds: u64) -> Self {
        Self {
            scenario,
            engine: Engine::Sim,
            seed,
            rps,
            duration: Duration::from_secs(seconds),
            patience: scenario.patience(),
            adaptive: Adaptive::BEST,
            shed: false,
        }
    }

    /// Runs `variant`; returns its report and its per-second series.
    pub fn variant(&self, variant: Variant, progress: Progress) -> (VariantReport, Series) {
        let runtime = match self.engine {
            Engine::Sim => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build(),
            Engine::Real => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build(),
        }
        .expect("a tokio runtime");
        runtime.block_on(self.run(variant, progress))
    }

    async fn run(&self, variant: Variant, progress: Progress) -> (VariantReport, Series) {
        let recorder = Arc::new(Recorder::new(Instant::now()));
        let phases = self.scenario.phases(self.duration);
        let schedule = Schedule {
            start: recorder.start(),
            phases: phases.clone(),
        };
        let opens = Arc::new(AtomicU64::new(0));
        let first_open = Arc::new(AtomicU64::new(u64::MAX));
        let config = ClientConfig {
            seed: self.seed,
            deadline: self.patience,
            opens: opens.clone(),
            first_open: first_open.clone(),
            start: recorder.start(),
            hedge: self.scenario.hedges(),
            per_route: self.scenario.routes() > 1,
            // The presets' defaults: the adaptive limit learns the capacity no one told it.
            bulkhead: None,
            latency: Arc::default(),
            keys: self.scenario == Scenario::Post,
            adaptive: self.adaptive,
            shed: self.shed,
        };
        let post = self.scenario == Scenario::Post;
        let backend = Backend::new(
            schedule.clone(),
            self.seed,
            recorder.clone(),
            self.scenario.capacity(),
        );
        // `capacity-drop`: the workers it loses for a while, and gets back.
        backend.change_workers(self.scenario.worker_changes(self.duration));
        // Each server counts the requests that reach it and those its handler is called
        // for: the difference is what its stack refused on arrival (backstop's admission).
        let hops: [HopCounts; 3] = Default::default();
        let [on_a, on_b, on_c] = &hops;
        let backend = on_c.arrived(server(
            variant,
            on_c.handled(BoxCloneService::new(backend)),
            post,
        ));
        // The network loses answers after the server sent them (`post` only).
        let backend = if post {
            BoxCloneService::new(Lossy::new(backend, schedule.clone(), self.seed))
        } else {
            backend
        };
        let mut target = self.connect(backend).await;
        let edge = if self.scenario.chained() {
            // users → A → B → C: A and B are servers that relay through their own client stack,
            // behind their own server stack; users call A directly.
            for (hop, counts) in [("B", on_b), ("A", on_a)] {
                // Every hop with the presets' defaults (no bulkhead): no one is told C's
                // capacity.
                let config = config.clone();
                let work = self.scenario.hop_work(hop);
                let relay =
                    Relay::new(client(variant, target, &config)).work(work.0, work.1, self.seed);
                let relay = counts.handled(BoxCloneService::new(relay));
                target = self
                    .connect(counts.arrived(server(variant, relay, false)))
                    .await;
            }
            target
        } else {
            client(variant, target, &config)
        };

        // Once a second, what backstop's client measured of the dependency.
        let sampler = {
            let (latency, start) = (config.latency.clone(), recorder.start());
            let seconds = self.duration.as_secs() as u32;
            tokio::spawn(async move {
                let mut points = Vec::new();
                for t in 1..=seconds {
                    tokio::time::sleep_until(start + Duration::from_secs(u64::from(t))).await;
                    let layer = latency.get()?;
                    let snap = layer.latency();
                    let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
                    points.push(MeasuredPoint {
                        t_s: f64::from(t),
                        p50_ms: ms(snap.p50),
                        p99_ms: ms(snap.p99),
                    });
                }
                Some(points)
            })
        };
        let total = u64::from(self.rps) * self.duration.as_secs();
        let interval = Duration::from_secs(1) / self.rps;
        let start = recorder.start();
        let mut users = Vec::with_capacity(total as usize);
        for i in 0..total {
            let due = start + interval * i as u32;
            if self.scenario.silent(interval * i as u32, self.duration)
                || !self.scenario.sends(i, schedule.phase_index(due))
            {
                continue;
            }
            tokio::time::sleep_until(due).await;
            let (edge, recorder) = (edge.clone(), recorder.clone());
            let (patience, told) = self.scenario.user_patience(self.patience, i, self.seed);
            let path = self.scenario.path(i);
            let method = self.scenario.method();
            users.push(tokio::spawn(async move {
                let sent = Instant::now();
                let route = crate::scenario::route_of(&path);
                let body = if method == http::Method::POST {
                    // A charge: a few bytes the dependency acts on once per user request.
                    boxed(http_body_util::Full::new(bytes::Bytes::from(format!(
                        "{{\"charge\":{i}}}"
                    ))))
                } else {
                    empty()
                };
                let mut request = Request::builder()
                    .method(method)
                    .uri(format!("http://dependency{path}"))
                    .header(USER_REQUEST, i);
                if told {
                    // The user's own deadline, in whole milliseconds (rounded down).
                    request = request.header("grpc-timeout", format!("{}m", patience.as_millis()));
                }
                let request = request.body(body).expect("a valid request");
                // Boxed with its type spelled out: rustc cannot prove the `Send` of this
                // future through the trait objects in `Svc` otherwise.
                let call: BoxFuture<Result<http::Response<Body>, BoxError>> =
                    Box::pin(edge.oneshot(request));
                let result = tokio::time::timeout(patience, call).await;
                let success = matches!(&result, Ok(Ok(r)) if r.status().is_success());
                recorder.user(sent, sent.elapsed(), success, route);
            }));
            progress();
        }
        for user in users {
            let _ = user.await;
        }
        // Let the dependency finish what it was still doing, so orphaned work is counted
        // whole (bounded: no work lasts longer than the scenario's latency).
        let until = Instant::now() + Duration::from_secs(10);
        while recorder.work_in_flight() > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let breaker = (variant == Variant::Backstop).then(|| {
            let first = first_open.load(std::sync::atomic::Ordering::Relaxed);
            (
                opens.load(std::sync::atomic::Ordering::Relaxed),
                (first != u64::MAX).then(|| first as f64 / 1e6),
            )
        });
        let measured = sampler.await.expect("the sampler does not panic");
        let mut report = recorder.report(variant.name(), &phases, breaker);
        report.measured_latency = measured.clone();
        if self.scenario.chained() {
            report.hops = Some(
                ["A", "B", "C"]
                    .into_iter()
                    .zip(&hops)
                    .map(|(hop, counts)| counts.report(hop))
                    .collect(),
            );
        }
        if matches!(self.scenario, Scenario::Hang | Scenario::Quiet) {
            // The hung dependency's work never ends within the run: there is no orphaned work
            // to count, only work still held.
            report.orphaned_work_s = None;
        }
        let per_second = recorder.series(self.duration.as_secs() as usize);
        if self.scenario.overloads() {
            report.goodput_per_s = Some(per_second.goodput.clone());
        }
        let series = Series {
            name: variant.name().to_owned(),
            attempts: per_second.attempts,
            p99_ms: per_second.p99_ms,
            goodput: per_second.goodput,
            sent: per_second.sent,
            measured: measured.unwrap_or_default(),
        };
        (report, series)
    }

    /// Makes `service` reachable: itself in the sim; over HTTP/2 on 127.0.0.1 in the real
    /// engine (a hyper server on a random port, a hyper-util client).
    async fn connect(&self, service: Svc) -> Svc {
        match self.engine {
            // What crosses a real wire is the head, not the extensions: a server's local
            // rejection reaches the client as a plain status, and the client's own deadline
            // reaches the server only through `grpc-timeout`.
            Engine::Sim => BoxCloneService::new(
                ServiceBuilder::new()
                    .map_request(|mut r: Request<Body>| {
                        r.extensions_mut().clear();
                        r
                    })
                    .map_response(|mut r: http::Response<Body>| {
                        r.extensions_mut().clear();
                        r
                    })
                    .service(service),
            ),
            Engine::Real => {
                let addr = serve(service).await;
                loopback_client(addr)
            }
        }
    }
}

/// Serves `service` over HTTP/2 (prior knowledge) on a random loopback port; the server runs
/// until the runtime stops.
async fn serve(service: Svc) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            // Small requests, answered at once: Nagle's algorithm would add 40 ms to each.
            let _ = stream.set_nodelay(true);
            let service = service.clone();
            let handler = hyper::service::service_fn(move |r: Request<hyper::body::Incoming>| {
                // Boxed with its type spelled out, as in `run`.
                let call: BoxFuture<Result<http::Response<Body>, BoxError>> =
                    Box::pin(service.clone().oneshot(r.map(boxed)));
                call
            });
            let connection: BoxFuture<Result<(), hyper::Error>> = Box::pin(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(None)
                    .serve_connection(TokioIo::new(stream), handler),
            );
            tokio::spawn(connection);
        }
    });
    addr
}

/// An HTTP/2 client for `addr`: every request goes there, whatever its URI says.
fn loopback_client(addr: SocketAddr) -> Svc {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build::<_, Body>(connector);
    let authority: http::uri::Authority = addr.to_string().parse().expect("a valid authority");
    BoxCloneService::new(
        ServiceBuilder::new()
            // The loopback server's address, the request's own path (the routes of `partial`).
            .map_request(move |mut r: Request<Body>| {
                let mut parts = r.uri().clone().into_parts();
                parts.scheme = Some(http::uri::Scheme::HTTP);
                parts.authority = Some(authority.clone());
                if parts.path_and_query.is_none() {
                    parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/work"));
                }
                *r.uri_mut() = Uri::from_parts(parts).expect("a valid URI");
                r
            })
            .map_response(|r: http::Response<hyper::body::Incoming>| r.map(boxed))
            .map_err(|e: hyper_util::client::legacy::Error| -> BoxError { Box::new(e) })
            .service(client),
    )
}

/// What one server of a run counted: requests that reached it, and those its handler was
/// called for.
#[derive(Debug, Default)]
struct HopCounts {
    arrived: Arc<AtomicU64>,
    handled: Arc<AtomicU64>,
}

impl HopCounts {
    /// `service`, counting the requests it is called with in `counter`.
    fn counting(service: Svc, counter: &Arc<AtomicU64>) -> Svc {
        let counter = counter.clone();
        BoxCloneService::new(
            ServiceBuilder::new()
                .map_request(move |r: Request<Body>| {
                    counter.fetch_add(1, Ordering::Relaxed);
                    r
                })
                .service(service),
        )
    }

    /// The server stack `server`, counting arrivals.
    fn arrived(&self, server: Svc) -> Svc {
        Self::counting(server, &self.arrived)
    }

    /// The handler `handler`, counting the requests its server let through.
    fn handled(&self, handler: Svc) -> Svc {
        Self::counting(handler, &self.handled)
    }

    fn report(&self, hop: &str) -> HopReport {
        let arrived = self.arrived.load(Ordering::Relaxed);
        let handled = self.handled.load(Ordering::Relaxed);
        HopReport {
            hop: hop.to_owned(),
            arrived,
            refused_on_arrival: arrived.saturating_sub(handled),
        }
    }
}
