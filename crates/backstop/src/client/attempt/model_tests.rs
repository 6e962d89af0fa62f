//! The attempt layer over a latency model built with knobs the public API does not have
//! (`min_samples`, `window`): at extreme values, refused by name or working. Moved here from
//! the integration test of every duration knob (`tests/durations.rs`) when the model became
//! crate-private.

use crate::client::attempt::{Adaptive, AttemptBound, AttemptTimeoutLayer};
use crate::latency::LatencyModel;
use http::{Request, Response};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tower::{Layer, ServiceExt, service_fn};

/// Zero, one nanosecond and the longest: each duration knob meets these.
const VALUES: [Duration; 3] = [Duration::ZERO, Duration::from_nanos(1), Duration::MAX];

/// The test's own bound on a call: none of the knobs' values may hang it past this.
const GUARD: Duration = Duration::from_secs(3600);

/// The requests: no deadline, a short one, the longest `grpc-timeout`.
fn request(i: u32) -> Request<String> {
    let builder = Request::get(format!("http://dep/{}", i % 2));
    let builder = match i % 3 {
        0 => builder,
        1 => builder.header("grpc-timeout", "50m"),
        _ => builder.header("grpc-timeout", "99999999H"),
    };
    builder.body(String::new()).unwrap()
}

/// Calls through `layer` to a dependency that answers after a few milliseconds or never,
/// across a day of virtual time.
async fn exercise_attempt_layer(layer: AttemptTimeoutLayer) {
    let calls = Arc::new(AtomicU32::new(0));
    let dependency = service_fn(move |_req: Request<String>| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if n % 2 == 1 {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(u64::from(n))).await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let service = layer.layer(dependency);
    for i in 0..24 {
        let _ = tokio::time::timeout(GUARD, service.clone().oneshot(request(i))).await;
        tokio::time::advance(Duration::from_secs(3600 * (u64::from(i) % 3))).await;
    }
}

/// Runs `exercise` on a paused runtime: `Err` with the panic's message if it panicked.
fn run<F: Future<Output = ()>>(exercise: F) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(exercise))).map_err(
        |panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default()
        },
    )
}

/// Factors of the same class (a `Duration` times a user's number, `mul_f64` panicking past
/// `Duration::MAX`): the attempt bound's `multiplier` at its largest.
#[test]
fn the_largest_factor_of_the_attempt_bound_works() {
    let adaptive = Adaptive::new().multiplier(f64::MAX);
    // Trusted from the first sample, so the bound is computed from it.
    let model = LatencyModel::builder().min_samples(1).build().unwrap();
    let layer = AttemptTimeoutLayer::with_model(AttemptBound::Adaptive(adaptive), model);
    run(exercise_attempt_layer(layer.unwrap())).unwrap();
}

/// The latency model's `window`, at zero, one nanosecond and `Duration::MAX`, under an
/// adaptive attempt bound: refused by name, or working.
#[test]
fn the_latency_models_window_is_refused_by_name_or_works() {
    for d in VALUES {
        match LatencyModel::builder().window(d).build() {
            Err(e) => assert_eq!(e.knob(), "window", "{d:?}"),
            Ok(model) => {
                let bound = AttemptBound::Adaptive(Adaptive::new());
                let layer = AttemptTimeoutLayer::with_model(bound, model).unwrap();
                run(exercise_attempt_layer(layer)).unwrap_or_else(|e| panic!("{d:?}: {e}"));
            }
        }
    }
}
