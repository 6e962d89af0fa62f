//! Each layer of the client preset arms its own timer (docs/ARCHITECTURE.md, "Timers: each
//! layer owns its timer"). What must hold whatever the dependency does with timers of its own
//! and however the attempts go (`tests/callers.rs` varies what the caller does instead): every call ends by its deadline, and a first attempt that answers within its bound and
//! the deadline is the answer, at exactly that time.

use backstop::client::retry::{ReplayBody, RetryConfig};
use backstop_test_support::{deadline_case, script_answer, scripted};
use http::Request;
use std::time::Duration;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};

/// Far past every deadline here: a call still running then was never woken.
const GUARD: Duration = Duration::from_secs(60);

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

    #[test]
    fn every_call_ends_by_its_deadline_whatever_the_timers_inside(
        (steps, deadline, attempt) in deadline_case(6),
        attempts in 1u32..4,
        seed in 0u64..1_000,
    ) {
        let rt = backstop_test_support::paused_runtime();
        let (result, took) = rt.block_on(async {
            let retry = RetryConfig::http().max_attempts(attempts).seed(seed);
            let client = ServiceBuilder::new()
                .layer(
                    backstop::client::http()
                        .retry(retry)
                        .timeout(Duration::from_millis(deadline))
                        .attempt(backstop::client::attempt::AttemptBound::Fixed(Duration::from_millis(attempt))).build().unwrap(),
                )
                .service(scripted::<Request<ReplayBody<String>>>(steps.clone()));
            let start = Instant::now();
            let result = tokio::time::timeout(GUARD, client.oneshot(backstop_test_support::get()))
                .await
                .expect("the call ended by its deadline");
            (result.map(|r| r.status()), start.elapsed())
        });
        proptest::prop_assert!(took <= Duration::from_millis(deadline), "took {:?}", took);
        let (answer, _) = script_answer(&steps);
        if let Some(ms) = answer.filter(|&ms| ms < attempt.min(deadline)) {
            proptest::prop_assert_eq!(result.ok(), Some(http::StatusCode::OK));
            proptest::prop_assert_eq!(took, Duration::from_millis(ms));
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    /// A handler behind the server preset calls a dependency through the client preset, which
    /// inherits the request's deadline: the server answers by that deadline whatever the
    /// dependency does, with the handler's answer when the dependency answered in time.
    #[test]
    fn the_server_answers_by_its_deadline_whatever_the_timers_inside(
        (steps, deadline, attempt) in deadline_case(6),
    ) {
        use http::{Response, StatusCode};
        let rt = backstop_test_support::paused_runtime();
        let (status, took) = rt.block_on(async {
            let client = ServiceBuilder::new()
                .layer(backstop::client::http().attempt(backstop::client::attempt::AttemptBound::Fixed(Duration::from_millis(attempt))).build().unwrap())
                .service(scripted::<Request<ReplayBody<String>>>(steps.clone()));
            let handler = tower::service_fn(move |_req: Request<String>| {
                let client = client.clone();
                async move {
                    let status = match client.oneshot(backstop_test_support::get()).await {
                        Ok(_) => StatusCode::OK,
                        Err(_) => StatusCode::BAD_GATEWAY,
                    };
                    let mut response = Response::new(String::new());
                    *response.status_mut() = status;
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            let server = ServiceBuilder::new().layer(backstop::server()).service(handler);
            let start = Instant::now();
            let response = backstop_test_support::answer_within(server, deadline, GUARD).await;
            (response.status(), start.elapsed())
        });
        // The server keeps 1 ms of the caller's time for its answer.
        let by = Duration::from_millis(deadline - 1);
        proptest::prop_assert!(took <= by, "took {:?}", took);
        let (answer, _) = script_answer(&steps);
        if let Some(ms) = answer.filter(|&ms| ms < attempt.min(deadline - 1)) {
            proptest::prop_assert_eq!(status, StatusCode::OK);
            proptest::prop_assert_eq!(took, Duration::from_millis(ms));
        }
    }
}
