//! Every local failure of the gRPC client stack reaches tonic as a status, never UNKNOWN: the
//! stack answers it with a trailers-only response (tonic reads its `grpc-status`), where an
//! `Err` would become UNKNOWN in tonic's hands. One table: each local failure (breaker open,
//! throttled, bulkhead full, deadline exceeded, attempt timed out), with and without a
//! deadline, on the first attempt, on the last retry, and on a hedged call.

use backstop::GrpcClassifier;
use backstop::ReplayBody;
use backstop::client::ClientBuilder;
use backstop::client::breaker::{BreakerLayer, Mode};
use backstop::client::overload::bulkhead::BulkheadLayer;
use backstop::client::overload::throttle::AdaptiveThrottle;
use backstop::client::retry::hedge::Hedging;
use backstop::client::retry::{RetryConfig, RetryOverrides};
use backstop_test_support::{grpc_call, grpc_status};
use http::{Request, Response};
use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};
use tonic::{Code, Status};
use tower::{ServiceBuilder, ServiceExt, service_fn};

const MS: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Failure {
    BreakerOpen,
    Throttled,
    BulkheadFull,
    DeadlineExceeded,
    AttemptTimedOut,
}

/// Where in the call the failure happens.
#[derive(Debug, Clone, Copy, PartialEq)]
enum When {
    /// The first attempt (a call that is not retried, or refused before any attempt).
    First,
    /// The last retry (the first attempt failed UNAVAILABLE and was retried).
    LastRetry,
    /// A hedged call (idempotent, a hedge 30 ms after the first attempt).
    Hedged,
}

/// What tonic makes of the stack's answer: a trailers-only response's status, or an error's
/// (UNKNOWN unless a status is in its chain).
fn as_tonic<B>(result: Result<Response<B>, backstop::BoxError>) -> Status {
    match result {
        Ok(response) => Status::from_header_map(response.headers())
            .unwrap_or_else(|| Status::new(Code::Ok, "no grpc-status")),
        Err(err) => Status::from_error(err),
    }
}

/// What the dependency does on the first attempt; later attempts hang.
#[derive(Debug, Clone, Copy)]
enum First {
    Hang,
    /// UNAVAILABLE (retryable), no message.
    Unavailable,
    /// UNAVAILABLE, and the breaker is forced open while it answers.
    UnavailableThenOpen,
}

async fn run(failure: Failure, deadline: bool, when: When) -> Status {
    let mut layer: ClientBuilder<GrpcClassifier> = backstop::client::grpc();
    if deadline {
        layer = layer.timeout(1000 * MS);
    }
    let retried = when == When::LastRetry;
    if retried {
        layer = layer.max_attempts(2);
    }
    if when == When::Hedged {
        layer = layer.retry(RetryConfig::grpc().hedging(Hedging::new(30 * MS).max_attempts(2)));
    }
    let mut first = First::Hang;
    match failure {
        Failure::BreakerOpen if retried => first = First::UnavailableThenOpen,
        Failure::BreakerOpen => {}
        Failure::Throttled => {
            let throttle = AdaptiveThrottle::builder().max_probability(1.0).seed(7);
            layer = layer.throttle(Some(throttle));
        }
        Failure::BulkheadFull => {
            layer = layer.bulkhead(BulkheadLayer::builder(1).max_wait(50 * MS));
        }
        Failure::DeadlineExceeded if retried => first = First::Unavailable,
        Failure::DeadlineExceeded => {}
        Failure::AttemptTimedOut => {
            layer = layer.attempt(backstop::client::attempt::AttemptBound::Fixed(100 * MS))
        }
    }
    let layer = layer.build().unwrap();
    if matches!(failure, Failure::Throttled) {
        // 1000 requests and no answer: the throttle refuses all it may.
        for _ in 0..1000 {
            layer.throttle_layer().throttle().record_request();
        }
    }
    if matches!(failure, Failure::BreakerOpen) && !retried {
        layer.breaker_layer().set_mode(Mode::ForcedOpen);
    }
    let breaker: BreakerLayer<GrpcClassifier> = layer.breaker_layer().clone();
    let calls = Arc::new(AtomicU32::new(0));
    let dependency = service_fn(move |_req: Request<ReplayBody<String>>| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        let breaker = breaker.clone();
        async move {
            match (n, first) {
                (0, First::Unavailable) => Ok(grpc_status(14, None)),
                (0, First::UnavailableThenOpen) => {
                    breaker.set_mode(Mode::ForcedOpen);
                    Ok(grpc_status(14, None))
                }
                _ => std::future::pending::<Result<Response<String>, Infallible>>().await,
            }
        }
    });
    let client = ServiceBuilder::new().layer(layer).service(dependency);
    let request = || {
        let mut req = grpc_call("");
        if when != When::First {
            // Retried after an attempt timeout, and hedged: an idempotent method.
            req.extensions_mut()
                .insert(RetryOverrides::new().idempotent(true));
        }
        req
    };
    if failure == Failure::BulkheadFull {
        // One call holds the only permit.
        let holder = client.clone();
        tokio::spawn(async move { holder.oneshot(grpc_call("")).await });
        tokio::task::yield_now().await;
    }
    as_tonic(client.oneshot(request()).await)
}

#[tokio::test(start_paused = true)]
async fn every_local_failure_of_a_grpc_call_reaches_tonic_as_its_status() {
    use Failure::*;
    use When::*;
    let mut wrong = Vec::new();
    for failure in [
        BreakerOpen,
        Throttled,
        BulkheadFull,
        DeadlineExceeded,
        AttemptTimedOut,
    ] {
        for deadline in [true, false] {
            for when in [First, LastRetry, Hedged] {
                // Without a deadline nothing expires; the throttle and the bulkhead gate a
                // call, not its retries.
                if (failure == DeadlineExceeded && !deadline)
                    || (matches!(failure, Throttled | BulkheadFull) && when == LastRetry)
                {
                    continue;
                }
                let (code, message) = match failure {
                    BreakerOpen => (Code::Unavailable, "circuit breaker open"),
                    Throttled => (Code::Unavailable, "throttled by client"),
                    BulkheadFull => (Code::Unavailable, "bulkhead full"),
                    DeadlineExceeded => (Code::DeadlineExceeded, "deadline exceeded"),
                    AttemptTimedOut => (Code::DeadlineExceeded, "attempt timed out"),
                };
                let status = run(failure, deadline, when).await;
                let ok = status.code() == code && status.message() == message;
                println!(
                    "{:<5} {failure:?}, deadline {deadline}, {when:?}: {:?} {:?}",
                    if ok { "ok" } else { "WRONG" },
                    status.code(),
                    status.message()
                );
                if !ok {
                    wrong.push((failure, deadline, when, status.code()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "not the status tonic should report: {wrong:?}"
    );
}
