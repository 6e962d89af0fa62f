//! The client preset arms one timer per attempt (its deadline layer, retry layer and attempt
//! bound share the one that fires first; see docs/ARCHITECTURE.md, "One timer per instant").
//! What must hold whatever the dependency does with timers of its own and however the attempts
//! go: every call ends by its deadline, and a first attempt that answers within its bound and
//! the deadline is the answer, at exactly that time.

use backstop::{retry::ReplayBody, retry::RetryConfig};
use backstop_test_support::{script_answer, scripted, step};
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
        steps in proptest::collection::vec(step(), 0..6),
        deadline in 5u64..120,
        attempt in 3u64..150,
        attempts in 1u32..4,
        seed in 0u64..1_000,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let (result, took) = rt.block_on(async {
            let retry = RetryConfig::http()
                .max_attempts(attempts)
                .seed(seed)
                .build()
                .unwrap();
            let client = ServiceBuilder::new()
                .layer(
                    backstop::client::http()
                        .retry(retry)
                        .timeout(Duration::from_millis(deadline))
                        .attempt_timeout(Duration::from_millis(attempt)),
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
