//! Deterministic per-call cost: runs one stack `N` times so `valgrind --tool=callgrind` can count
//! its instructions, which do not vary with machine load the way nanoseconds do.
//!
//! ```text
//! cargo bench -p backstop-benches --bench instructions --no-run
//! for s in bare tower backstop-retry backstop-full; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/deps/instructions-* $s 100000 2>&1 | grep refs
//! done
//! ```
//!
//! (Instructions per call) = (refs(stack) − refs(stack with N = 0)) / N.

use backstop_deadline::PropagateDeadlineLayer;
use backstop_retry::{ReplayBody, RetryPolicy};
use http::{Request, Response};
use std::{convert::Infallible, future::Ready, hint::black_box, sync::Arc, time::Duration};
use tower::{
    Service, ServiceBuilder, ServiceExt,
    retry::{
        Policy,
        budget::{Budget, TpsBudget},
    },
    service_fn,
};

fn request() -> Request<String> {
    Request::get("http://svc/x")
        .header("x-request-id", "1")
        .body(String::new())
        .unwrap()
}

#[derive(Clone)]
struct TowerPolicy {
    budget: Arc<TpsBudget>,
    retries: usize,
}

impl<E> Policy<Request<String>, Response<String>, E> for TowerPolicy {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _req: &mut Request<String>,
        result: &mut Result<Response<String>, E>,
    ) -> Option<Self::Future> {
        match result {
            Ok(r) if !r.status().is_server_error() => {
                self.budget.deposit();
                None
            }
            _ if self.retries > 0 && self.budget.withdraw() => {
                self.retries -= 1;
                Some(std::future::ready(()))
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, req: &Request<String>) -> Option<Request<String>> {
        let mut clone = Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.headers_mut() = req.headers().clone();
        Some(clone)
    }
}

async fn drive<S>(service: S, n: u64)
where
    S: Service<Request<String>> + Clone,
    S::Error: std::fmt::Debug,
{
    for _ in 0..n {
        black_box(service.clone().oneshot(request()).await.unwrap());
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "bare".to_owned());
    let n: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let bare = service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let inner = service_fn(|_req: Request<ReplayBody<String>>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    rt.block_on(async {
        match which.as_str() {
            "bare" => drive(bare, n).await,
            "tower" => {
                let stack = ServiceBuilder::new()
                    .retry(TowerPolicy {
                        budget: Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.1)),
                        retries: 2,
                    })
                    .timeout(Duration::from_secs(1))
                    .service(bare);
                drive(stack, n).await
            }
            "backstop-retry" => {
                let stack = ServiceBuilder::new()
                    .layer(RetryPolicy::http().build().unwrap())
                    .service(inner);
                drive(stack, n).await
            }
            "backstop-full" => {
                let stack = ServiceBuilder::new()
                    .layer(
                        PropagateDeadlineLayer::builder()
                            .timeout(Duration::from_secs(1))
                            .build()
                            .unwrap(),
                    )
                    .layer(RetryPolicy::http().build().unwrap())
                    .service(inner);
                drive(stack, n).await
            }
            other => panic!("unknown stack {other}"),
        }
    });
}
