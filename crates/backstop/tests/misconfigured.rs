//! Misconfigured builders return errors, never panic (zero, 1 ns and `Duration::MAX`, NaN and
//! negative ratios, counts from 0 to `u32::MAX`), and a stack that built never panics at a request.

use backstop::client::attempt::{Adaptive, AttemptBound};
use backstop::client::breaker::BreakerConfig;
use backstop::client::overload::bulkhead::BulkheadLayer;
use backstop::client::overload::throttle::{AdaptiveThrottle, AdaptiveThrottleBuilder};
use backstop::client::retry::RatioBudget;
use backstop::client::retry::{RetryConfig, backoff};
use backstop::deadline::{DeadlineLayer, PropagateDeadlineLayer, PropagateDeadlineLayerBuilder};
use backstop::server::admission::AdmissionLayer;
use backstop::{ClientLayer, ConfigError, HttpClassifier, ReplayBody};
use http::{Request, Response};
use std::{convert::Infallible, sync::Arc, time::Duration};
use tower::{Layer, ServiceBuilder, ServiceExt, service_fn};

const NS: Duration = Duration::from_nanos(1);
const MAX: Duration = Duration::MAX;
const DURS: [Duration; 4] = [Duration::ZERO, NS, Duration::from_secs(1), MAX];
const RATIOS: [f64; 8] = [f64::NAN, -1.0, 0.0, 1e-300, 0.5, 1.0, 2.0, f64::INFINITY];

type Built = Result<ClientLayer<HttpClassifier>, ConfigError>;

/// Every knob of the client builder and of the parts it takes, each value given to the
/// builder as is: `build` checks them all (none is checked before it is given).
fn cases() -> Vec<(String, Built)> {
    let mut v: Vec<(String, Built)> = Vec::new();
    let http = backstop::client::http;
    let adaptive = |a: Adaptive| http().attempt(AttemptBound::Adaptive(a)).build();
    let throttle = |t: AdaptiveThrottleBuilder| http().throttle(Some(t)).build();
    let retry = |r: RetryConfig<HttpClassifier>| http().retry(r).build();
    let breaker = |b: BreakerConfig<HttpClassifier>| http().breaker(b).build();
    let deadline = |p: PropagateDeadlineLayerBuilder| http().deadline(p).build();
    for d in DURS {
        v.push((format!("timeout({d:?})"), http().timeout(d).build()));
        v.push((
            format!("attempt Fixed({d:?})"),
            http().attempt(AttemptBound::Fixed(d)).build(),
        ));
        let p = PropagateDeadlineLayer::builder;
        v.push((format!("deadline timeout({d:?})"), deadline(p().timeout(d))));
        v.push((format!("deadline offset({d:?})"), deadline(p().offset(d))));
        v.push((
            format!("min_remaining({d:?})"),
            deadline(p().min_remaining(d)),
        ));
        v.push((
            format!("bulkhead max_wait({d:?})"),
            http()
                .bulkhead(BulkheadLayer::builder(1).max_wait(d))
                .build(),
        ));
        v.push((
            format!("retry hint/min/backoff({d:?})"),
            retry(RetryConfig::http().backoff(backoff::constant(d))),
        ));
        v.push((
            format!("decorrelated({d:?})"),
            retry(RetryConfig::http().backoff(backoff::decorrelated(d, d))),
        ));
        v.push((
            format!("exponential({d:?})"),
            retry(RetryConfig::http().backoff(backoff::exponential(d, d))),
        ));
        if let Ok(budget) = RatioBudget::builder().ttl(d).build() {
            v.push((
                format!("budget ttl({d:?})"),
                retry(RetryConfig::http().budget(Arc::new(budget))),
            ));
        }
        for a in [Adaptive::new().ceiling(d), Adaptive::new().floor(d)] {
            v.push((format!("adaptive dur({d:?})"), adaptive(a)));
        }
        v.push((
            format!("breaker slow_start({d:?})"),
            breaker(BreakerConfig::http().slow_start(d)),
        ));
        v.push((
            format!("breaker open({d:?})"),
            breaker(BreakerConfig::http().open_duration(d, d)),
        ));
    }
    for n in [0u32, 1, 2, 10, 11, u32::MAX] {
        v.push((format!("max_attempts({n})"), http().max_attempts(n).build()));
        v.push((
            format!("hedging(0.95, {n})"),
            http().hedging(0.95, n).build(),
        ));
        v.push((
            format!("bulkhead({n})"),
            http().bulkhead(BulkheadLayer::builder(n)).build(),
        ));
        v.push((
            format!("bulkhead max_queue({n})"),
            http()
                .bulkhead(BulkheadLayer::builder(1).max_queue(n))
                .build(),
        ));
        v.push((
            format!("breaker counts({n})"),
            breaker(
                BreakerConfig::http()
                    .count_window(n)
                    .minimum_calls(n)
                    .consecutive_failures(n),
            ),
        ));
    }
    for r in RATIOS {
        v.push((format!("hedging({r}, 2)"), http().hedging(r, 2).build()));
        v.push((
            format!("retry_reserve({r})"),
            http().retry_reserve(Some(r)).build(),
        ));
        v.push((
            format!("fraction({r})"),
            deadline(PropagateDeadlineLayer::builder().fraction(r)),
        ));
        v.push((
            format!("adaptive ratio({r})"),
            adaptive(Adaptive::new().multiplier(r)),
        ));
        for b in [
            BreakerConfig::http().failure_rate(r),
            BreakerConfig::http().slow_calls(Duration::from_secs(1), r),
        ] {
            v.push((format!("breaker ratio({r})"), breaker(b)));
        }
        for t in [
            AdaptiveThrottle::builder().k(r),
            AdaptiveThrottle::builder().max_probability(r),
        ] {
            v.push((format!("throttle ratio({r})"), throttle(t)));
        }
        for b in [RatioBudget::builder().ratio(r).build()]
            .into_iter()
            .flatten()
        {
            v.push((
                format!("budget ratio({r})"),
                retry(RetryConfig::http().budget(Arc::new(b))),
            ));
        }
        v.push((
            format!("exp multiplier({r})"),
            retry(
                RetryConfig::http().backoff(
                    backoff::exponential(Duration::from_millis(10), Duration::from_secs(1))
                        .multiplier(r),
                ),
            ),
        ));
    }
    v
}

fn dependency() -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
    service_fn(|req: Request<ReplayBody<String>>| async move {
        match req.uri().path() {
            "/hang" => std::future::pending::<()>().await,
            "/fail" => {
                tokio::time::sleep(Duration::from_millis(3)).await;
                return Ok(Response::builder().status(503).body(String::new()).unwrap());
            }
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
        Ok(Response::new(String::new()))
    })
}

async fn exercise(layer: ClientLayer<HttpClassifier>) {
    let client = layer.layer(dependency());
    let bound = Duration::from_secs(7200);
    for i in 0..130 {
        let path = if i % 10 == 9 { "/fail" } else { "/ok" };
        let _ = tokio::time::timeout(
            bound,
            client
                .clone()
                .oneshot(Request::get(path).body(String::new()).unwrap()),
        )
        .await;
    }
    for req in [
        Request::post("/fail").body("x".to_owned()).unwrap(),
        Request::get("/hang").body(String::new()).unwrap(),
        Request::get("/hang")
            .header("grpc-timeout", "99999999H")
            .body(String::new())
            .unwrap(),
        Request::get("/ok")
            .header("grpc-timeout", "1n")
            .body(String::new())
            .unwrap(),
        Request::get("/fail")
            .header("grpc-timeout", "bogus")
            .body(String::new())
            .unwrap(),
    ] {
        let _ = tokio::time::timeout(bound, client.clone().oneshot(req)).await;
    }
    let mut with_ext = Request::get("/hang").body(String::new()).unwrap();
    with_ext
        .extensions_mut()
        .insert(backstop::deadline::Deadline::after(MAX));
    let _ = tokio::time::timeout(bound, client.clone().oneshot(with_ext)).await;
    // In a handler under server(), with a deadline.
    let server = ServiceBuilder::new()
        .layer(backstop::server())
        .service(service_fn(move |_req: Request<String>| {
            let client = client.clone();
            async move {
                let _ = client
                    .oneshot(Request::get("/hang").body(String::new()).unwrap())
                    .await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        }));
    let _ = tokio::time::timeout(
        bound,
        server.oneshot(
            Request::get("/")
                .header("grpc-timeout", "1S")
                .body(String::new())
                .unwrap(),
        ),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn no_client_config_panics_at_build_or_at_a_request() {
    let cases = std::panic::catch_unwind(cases);
    let cases = match cases {
        Ok(c) => c,
        Err(_) => panic!("a builder panicked while building the cases"),
    };
    let mut panicked = Vec::new();
    let mut built = 0;
    for (name, result) in cases {
        let Ok(layer) = result else { continue };
        built += 1;
        let task = tokio::spawn(exercise(layer));
        if let Err(e) = task.await
            && e.is_panic()
        {
            panicked.push(name);
        }
    }
    eprintln!("{built} stacks built and exercised");
    assert!(panicked.is_empty(), "panicked at a request: {panicked:?}");
}

#[tokio::test(start_paused = true)]
async fn no_server_config_panics() {
    let mut layers = vec![("server()".to_owned(), backstop::server())];
    for d in DURS {
        for (n, b) in [
            ("max", DeadlineLayer::builder().max(d).build()),
            (
                "min_remaining",
                DeadlineLayer::builder().min_remaining(d).build(),
            ),
            (
                "default_timeout",
                DeadlineLayer::builder().default_timeout(d).build(),
            ),
        ] {
            if let Ok(l) = b {
                layers.push((
                    format!("deadline {n}({d:?})"),
                    backstop::server().deadline(l),
                ));
            }
        }
        // `min_remaining` with admission off: a fixed need.
        if let Ok(l) = DeadlineLayer::builder().min_remaining(d).build() {
            layers.push((
                format!("deadline min_remaining({d:?}), admission off"),
                backstop::server()
                    .deadline(l)
                    .admission(AdmissionLayer::off()),
            ));
        }
    }
    for n in [0usize, 1, 1024, usize::MAX] {
        if let Ok(l) = AdmissionLayer::builder().routes(n).build() {
            layers.push((
                format!("admission routes({n})"),
                backstop::server().admission(l),
            ));
        }
    }
    let mut panicked = Vec::new();
    for (name, layer) in layers {
        let task = tokio::spawn(async move {
            let svc = ServiceBuilder::new().layer(layer).service(service_fn(
                |req: Request<String>| async move {
                    if req.uri().path() == "/slow" {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Ok::<_, Infallible>(Response::new("body".to_owned()))
                },
            ));
            for i in 0..120 {
                for t in [
                    None,
                    Some("1n"),
                    Some("1S"),
                    Some("99999999H"),
                    Some("0m"),
                    Some("x"),
                    Some("100000000S"),
                ] {
                    let mut b = Request::get(if i % 2 == 0 { "/slow" } else { "/" });
                    if let Some(t) = t {
                        b = b.header("grpc-timeout", t);
                    }
                    let _ = tokio::time::timeout(
                        Duration::from_secs(7200),
                        svc.clone().oneshot(b.body(String::new()).unwrap()),
                    )
                    .await;
                }
            }
        });
        if let Err(e) = task.await
            && e.is_panic()
        {
            panicked.push(name);
        }
    }
    assert!(panicked.is_empty(), "panicked: {panicked:?}");
}
