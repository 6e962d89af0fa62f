//! The storm check in virtual time: 1000 requests/s for 60 s against a dependency failing with
//! probability p, 5 attempts, with and without the 10 % ratio budget.

use backstop::client::retry::{ReplayBody, RetryConfig};
use http::{Request, Response};
use std::{
    convert::Infallible,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tower::{Layer, ServiceExt, service_fn};

/// Runs the load and returns downstream attempts per request.
async fn amplification(p_fail: f64, budget: bool) -> f64 {
    let attempts = Arc::new(AtomicU64::new(0));
    let rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(0x5eed)));
    let counter = attempts.clone();
    let dependency = service_fn(move |_req: Request<ReplayBody<String>>| {
        counter.fetch_add(1, Ordering::Relaxed);
        let fail = rng.lock().unwrap().f64() < p_fail;
        let status = if fail { 503 } else { 200 };
        std::future::ready(Ok::<_, Infallible>(
            Response::builder()
                .status(status)
                .body(String::new())
                .unwrap(),
        ))
    });
    let mut policy = RetryConfig::http().max_attempts(5).seed(9);
    if !budget {
        policy = policy.no_budget();
    }
    let client = policy.build().unwrap().layer(dependency);

    let requests = 60_000;
    let mut tasks = Vec::with_capacity(requests);
    for _ in 0..requests {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let _ = client
                .oneshot(Request::get("http://dep/").body(String::new()).unwrap())
                .await;
        }));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    attempts.load(Ordering::Relaxed) as f64 / requests as f64
}

#[tokio::test(start_paused = true)]
async fn the_ratio_budget_keeps_amplification_near_ten_percent() {
    let half_naive = amplification(0.5, false).await;
    let half_budget = amplification(0.5, true).await;
    let down_naive = amplification(1.0, false).await;
    let down_budget = amplification(1.0, true).await;
    println!("| failure rate | 5 attempts, no budget | 5 attempts, 10 % budget |");
    println!("| 50 %  | {half_naive:.3} | {half_budget:.3} |");
    println!("| 100 % | {down_naive:.3} | {down_budget:.3} |");
    // Without a budget the storm is there: 1 + 0.5 + 0.25 + 0.125 + 0.0625 ≈ 1.94, and 5.
    assert!(half_naive > 1.9, "{half_naive}");
    assert!((down_naive - 5.0).abs() < 1e-9, "{down_naive}");
    // With it, the extra load stays about the ratio.
    assert!(half_budget <= 1.12, "{half_budget}");
    assert!(down_budget <= 1.02, "{down_budget}");
}
