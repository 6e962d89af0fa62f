//! The stacks the benchmarks compare, built once here so every benchmark measures the same
//! thing: `cargo bench -p backstop-benches`. See `benches/` for the benchmarks themselves.

use backstop_core::BoxError;
use backstop_deadline::PropagateDeadlineLayer;
use backstop_retry::{ReplayBody, RetryPolicy};
use http::{Request, Response};
use std::{convert::Infallible, future::Ready, sync::Arc, time::Duration};
use tower::{
    Service, ServiceBuilder,
    retry::{
        Policy,
        budget::{Budget, TpsBudget},
    },
    service_fn,
};

/// The request every benchmark sends: a GET with one header and an empty body.
pub fn request() -> Request<String> {
    Request::get("http://svc/x")
        .header("x-request-id", "1")
        .body(String::new())
        .unwrap()
}

/// tower's retry policy as a careful user writes it today: a shared `TpsBudget` (10 s, 10/s,
/// 10 %), at most 2 retries, and the request rebuilt by hand because `http::Request` is not
/// `Clone`.
#[derive(Clone, Debug)]
pub struct TowerPolicy {
    budget: Arc<TpsBudget>,
    retries: usize,
}

impl TowerPolicy {
    /// A policy with a new budget.
    pub fn new() -> Self {
        Self {
            budget: Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.1)),
            retries: 2,
        }
    }
}

impl Default for TowerPolicy {
    fn default() -> Self {
        Self::new()
    }
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

/// A ready service that answers 200 at once.
pub fn bare()
-> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future = impl Send>
+ Clone {
    service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) })
}

/// The same, behind a retry layer's replayable body.
fn replay_target() -> impl Service<
    Request<ReplayBody<String>>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    service_fn(|_req: Request<ReplayBody<String>>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    })
}

/// tower's `retry` + `TpsBudget` + `timeout` (1 s) around [`bare`].
pub fn tower_stack()
-> impl Service<Request<String>, Response = Response<String>, Error = BoxError> + Clone {
    ServiceBuilder::new()
        .retry(TowerPolicy::new())
        .timeout(Duration::from_secs(1))
        .service(bare())
}

/// backstop's `RetryLayer` (HTTP preset, ratio budget) alone.
pub fn backstop_retry()
-> impl Service<Request<String>, Response = Response<String>, Error = BoxError> + Clone {
    ServiceBuilder::new()
        .layer(RetryPolicy::http().build().unwrap())
        .service(replay_target())
}

/// backstop's `PropagateDeadlineLayer` (1 s) around its `RetryLayer`.
pub fn backstop_full()
-> impl Service<Request<String>, Response = impl Sized, Error = BoxError> + Clone {
    ServiceBuilder::new()
        .layer(
            PropagateDeadlineLayer::builder()
                .timeout(Duration::from_secs(1))
                .build()
                .unwrap(),
        )
        .layer(RetryPolicy::http().build().unwrap())
        .service(replay_target())
}
