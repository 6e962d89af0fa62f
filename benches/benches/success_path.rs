//! The success path of a retry stack, next to tower's own in the same run:
//! `cargo bench -p backstop-benches --bench success_path`.
//!
//! Every call succeeds at once (a ready inner service, a current-thread runtime), so what is
//! measured is what each stack adds to a call that needs no retry.

use backstop_deadline::PropagateDeadlineLayer;
use backstop_retry::{ReplayBody, RetryPolicy};
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use std::{convert::Infallible, future::Ready, hint::black_box, sync::Arc, time::Duration};
use tower::{
    ServiceBuilder, ServiceExt,
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

/// tower's retry as a careful user writes it today: TpsBudget, at most 2 retries, the request
/// rebuilt by hand because `http::Request` is not `Clone`.
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

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("success_path");

    let bare = service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    group.bench_function("bare", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(bare.oneshot(request()).await.unwrap()) })
    });

    let tower_stack = ServiceBuilder::new()
        .retry(TowerPolicy {
            budget: Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.1)),
            retries: 2,
        })
        .timeout(Duration::from_secs(1))
        .service(bare);
    group.bench_function("tower retry + TpsBudget + timeout", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(tower_stack.clone().oneshot(request()).await.unwrap()) })
    });

    let inner = service_fn(|_req: Request<ReplayBody<String>>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let backstop_stack = ServiceBuilder::new()
        .layer(
            PropagateDeadlineLayer::builder()
                .timeout(Duration::from_secs(1))
                .build()
                .unwrap(),
        )
        .layer(RetryPolicy::http().build().unwrap())
        .service(inner);
    group.bench_function("backstop deadline + retry + ratio budget", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(backstop_stack.clone().oneshot(request()).await.unwrap()) })
    });

    let retry_only = ServiceBuilder::new()
        .layer(RetryPolicy::http().build().unwrap())
        .service(inner);
    group.bench_function("backstop retry + ratio budget", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(retry_only.clone().oneshot(request()).await.unwrap()) })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
