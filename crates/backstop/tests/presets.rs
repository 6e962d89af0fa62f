//! The presets end to end, with a mock dependency under paused time.

use backstop::{BreakerOpen, ReplayBody, prelude::*};
use backstop_core::AttemptTimedOut;
use http::{Request, Response};
use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

fn get() -> Request<String> {
    Request::get("http://dep/x").body(String::new()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_outage_costs_the_dependency_probes_not_retries() {
    let hits = Arc::new(AtomicU32::new(0));
    let seen = hits.clone();
    let down = service_fn(move |_req: Request<ReplayBody<String>>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async {
            let response = Response::builder().status(503).body(String::new());
            Ok::<_, std::convert::Infallible>(response.unwrap())
        }
    });
    let backend = backstop::client::http().breaker(
        BreakerConfig::http()
            .minimum_calls(10)
            .jitter(false)
            .build()
            .unwrap(),
    );
    let mut client = ServiceBuilder::new().layer(backend.clone()).service(down);

    let mut refused = 0;
    for _ in 0..100 {
        match client.ready().await.unwrap().call(get()).await {
            Ok(response) => assert_eq!(response.status(), 503),
            Err(err) => {
                assert!(
                    backstop_core::find::<BreakerOpen>(err.as_ref()).is_some(),
                    "{err}"
                );
                refused += 1;
            }
        }
    }
    let snap = backend.breaker_layer().snapshot();
    assert_eq!(snap.state, State::Open);
    // The breaker opened after 10 failed attempts; the other calls never left the process.
    assert_eq!(hits.load(Ordering::SeqCst), 10);
    assert!(refused >= 95, "{refused} refused");
    // Three requests made 3 attempts each and the fourth was retried once into the open
    // breaker, which refused it: no retry was ever sent past the breaker.
    let stats = backend.retry_layer().stats();
    assert_eq!(stats.retries, 7, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_attempt_is_a_failure_the_breaker_counts() {
    let hang = service_fn(|_req: Request<ReplayBody<String>>| async {
        std::future::pending::<Result<Response<String>, std::convert::Infallible>>().await
    });
    let backend = backstop::client::http()
        .attempt_timeout(Duration::from_millis(100))
        .retry(RetryPolicy::http().max_attempts(1).build().unwrap())
        .breaker(
            BreakerConfig::http()
                .minimum_calls(2)
                .jitter(false)
                .build()
                .unwrap(),
        );
    let client = ServiceBuilder::new().layer(backend.clone()).service(hang);
    for _ in 0..2 {
        let err = client.clone().oneshot(get()).await.unwrap_err();
        assert!(
            backstop_core::find::<AttemptTimedOut>(err.as_ref()).is_some(),
            "{err}"
        );
    }
    assert_eq!(backend.breaker_layer().snapshot().state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn the_extension_methods_stack_the_same_layers() {
    let ok = service_fn(|_req: Request<ReplayBody<String>>| async {
        Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    });
    let breaker = BreakerConfig::http().build().unwrap();
    let client = ServiceBuilder::new()
        .propagate_deadline(PropagateDeadlineLayer::new())
        .retries(RetryPolicy::http().build().unwrap())
        .breaker(breaker.clone())
        .service(ok);
    let response = client.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(breaker.snapshot().calls, 1);
}
