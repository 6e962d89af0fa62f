//! What the server is told: every attempt's `grpc-timeout` says no more than the time really
//! left on the wire (the deadline less the deadline layer's offset), however the stack was
//! built, and whatever deadline or header the caller already put on the request. Defects
//! found attacking the "each layer owns its timer" change from the caller's side.

use backstop::client::attempt::{Adaptive, AttemptBound, AttemptTimeoutLayer};
use backstop::client::retry::{RetryConfig, backoff};
use backstop::deadline::{Deadline, PropagateDeadlineLayer};
use backstop::wire::grpc_timeout;
use backstop::{BoxError, ReplayBody};
use backstop_test_support::{grpc_call, grpc_reply, never, telling};
use http::{Request, Response};
use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt, service_fn};

const MS: Duration = Duration::from_millis(1);

/// The gRPC preset under a 200 ms deadline of which 50 ms stay off the wire (150 ms are
/// told), up to `max_attempts`, 1 ms apart. Its attempt bound is longer than the deadline,
/// so only the deadline bounds the attempts.
fn preset_keeping_50ms_off_the_wire(
    max_attempts: u32,
) -> backstop::client::ClientLayer<backstop::prelude::GrpcClassifier> {
    backstop::client::grpc()
        .deadline(
            PropagateDeadlineLayer::builder()
                .timeout(200 * MS)
                .offset(50 * MS),
        )
        .retry(
            RetryConfig::grpc()
                .max_attempts(max_attempts)
                .backoff(backoff::constant(MS)),
        )
        .attempt(backstop::client::attempt::AttemptBound::Fixed(
            Duration::from_secs(1),
        ))
        .build()
        .unwrap()
}

/// An adaptive attempt bound takes at most its share (80 %) of what is left of the call's
/// deadline. Defect: a caller's own later `Deadline` extension (10 s) won over the 100 ms the
/// deadline layer picked and wrote in the header, so the attempt ran to the outer deadline
/// and ended as an expired deadline instead of a timed-out attempt.
#[tokio::test(start_paused = true)]
async fn an_adaptive_bound_takes_its_share_whatever_deadline_the_caller_put_on_the_request() {
    for caller in [None, Some(Deadline::after(Duration::from_secs(10)))] {
        let svc = ServiceBuilder::new()
            .layer(
                PropagateDeadlineLayer::builder()
                    .timeout(100 * MS)
                    .build()
                    .unwrap(),
            )
            .layer(AttemptTimeoutLayer::new(AttemptBound::Adaptive(Adaptive::new())).unwrap())
            .service(service_fn(|_req: Request<String>| async {
                std::future::pending::<()>().await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }));
        let mut req = grpc_call("");
        if let Some(deadline) = caller {
            req.extensions_mut().insert(deadline);
        }
        let start = Instant::now();
        let _ = svc.oneshot(req).await;
        assert_eq!(start.elapsed(), 80 * MS, "caller's extension: {caller:?}");
    }
}

/// Defect: the client preset, whose attempt bound writes the header, sent a retry with
/// `grpc-timeout: 1n` once the deadline less the offset had passed (its retry layer checked
/// the retry against the deadline, not against what the server would be told). The retry is
/// now refused for the deadline, as a hand-built stack reading the header refuses it.
#[tokio::test(start_paused = true)]
async fn the_preset_sends_no_attempt_with_nothing_left_on_the_wire() {
    let (seen, dependency) = telling(|attempt, _: &Request<ReplayBody<String>>| async move {
        if attempt == 1 {
            tokio::time::sleep(155 * MS).await;
        }
        Ok::<_, Infallible>(grpc_reply(14))
    });
    let client = ServiceBuilder::new()
        .layer(preset_keeping_50ms_off_the_wire(3))
        .service(dependency);
    let response = client.oneshot(grpc_call("")).await.unwrap();
    // The server's answer, not retried for the deadline.
    assert_eq!(response.headers()["grpc-status"], "14");
    let info = backstop::client::call_info(&response);
    assert_eq!(
        info,
        backstop::client::retry::CallInfo::new(1, Some(backstop::client::retry::GiveUp::Deadline))
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        1,
        "no retry with nothing left on the wire: {seen:?}"
    );
    let first = grpc_timeout::decode(seen[0].1.as_deref().unwrap().as_bytes()).unwrap();
    assert!(first <= 150 * MS, "{first:?}");
}

/// The same preset with room for a retry: every attempt is told what is left on the wire,
/// never more, never zero.
#[tokio::test(start_paused = true)]
async fn every_attempt_of_the_preset_is_told_what_is_left_on_the_wire() {
    let (seen, dependency) = telling(|_, _: &Request<ReplayBody<String>>| async {
        tokio::time::sleep(40 * MS).await;
        Ok::<_, Infallible>(grpc_reply(14))
    });
    let client = ServiceBuilder::new()
        .layer(preset_keeping_50ms_off_the_wire(5))
        .service(dependency);
    client.oneshot(grpc_call("")).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 2, "{seen:?}");
    for (at, header) in &seen {
        let told = grpc_timeout::decode(header.as_deref().unwrap().as_bytes()).unwrap();
        let left = (150 * MS).saturating_sub(*at);
        assert!(
            !left.is_zero() && told <= left,
            "{at:?}: {told:?} of {left:?}"
        );
    }
}

/// Defect: a deadline layer built with `send_grpc_timeout(false)` passed the caller's own
/// `grpc-timeout: 10S` on for a call it bounds at 100 ms. The server is now told nothing by
/// such a layer; in the presets, whose attempt bound writes each attempt's header, it is told
/// what is left.
#[tokio::test(start_paused = true)]
async fn a_silent_deadline_layer_never_lets_the_server_hear_more_than_is_left() {
    for preset in [false, true] {
        let (seen, dependency) = telling(|_, _: &Request<ReplayBody<String>>| async {
            Ok::<_, BoxError>(grpc_reply(0))
        });
        let mut req = grpc_call("");
        req.headers_mut()
            .insert("grpc-timeout", "10S".parse().unwrap());
        if preset {
            let client = backstop::client::grpc()
                .timeout(100 * MS)
                .attempt(AttemptBound::Fixed(Duration::from_secs(1)))
                .build()
                .unwrap();
            tower::Layer::layer(&client, dependency)
                .oneshot(req)
                .await
                .unwrap();
        } else {
            let deadline = PropagateDeadlineLayer::builder()
                .timeout(100 * MS)
                .send_grpc_timeout(false)
                .build()
                .unwrap();
            let attempt =
                AttemptTimeoutLayer::new(AttemptBound::Fixed(Duration::from_secs(1))).unwrap();
            let svc = ServiceBuilder::new()
                .layer(deadline)
                .layer(attempt)
                .map_request(|r: Request<String>| r.map(ReplayBody::passthrough))
                .service(dependency);
            svc.oneshot(req.map(|_| String::new())).await.unwrap();
        }
        let heard = seen.lock().unwrap()[0].1.clone();
        match preset {
            false => assert_eq!(heard, None),
            true => assert_eq!(heard.as_deref(), Some("100m")),
        }
    }
}

/// The presets' attempt bound writes each attempt's `grpc-timeout`: the shorter of its own
/// bound and what is left of the deadline.
#[tokio::test(start_paused = true)]
async fn the_presets_attempt_bound_tells_the_shorter_of_its_bound_and_the_deadline() {
    for (timeout, told) in [(Duration::from_secs(1), 300 * MS), (100 * MS, 100 * MS)] {
        let (seen, dependency) = telling(|_, _: &Request<ReplayBody<String>>| async {
            Ok::<_, BoxError>(grpc_reply(0))
        });
        let client = backstop::client::grpc()
            .timeout(timeout)
            .attempt(AttemptBound::Fixed(300 * MS))
            .build()
            .unwrap();
        tower::Layer::layer(&client, dependency)
            .oneshot(grpc_call(""))
            .await
            .unwrap();
        let heard = seen.lock().unwrap()[0].1.clone().expect("a grpc-timeout");
        let heard = grpc_timeout::decode(heard.as_bytes()).unwrap();
        assert!(
            heard <= told && heard + MS >= told,
            "{timeout:?}: told {heard:?}"
        );
    }
}

/// Issue 25, 1: a call after which no retry can follow gets the whole deadline. A service
/// config's `"timeout": "0.3s"` on a method without a retry policy, and the preset with
/// `max_attempts(1)`, were cut at 240 ms (the adaptive bound's 80 % share) and told the server
/// 240 ms; gRPC's own clients wait the full 300 ms and say so.
#[cfg(feature = "service-config")]
#[tokio::test(start_paused = true)]
async fn a_call_no_retry_can_follow_gets_the_whole_deadline() {
    let config = backstop::service_config::ServiceConfig::from_json(
        r#"{ "methodConfig": [ { "name": [{}], "timeout": "0.3s" } ] }"#,
    )
    .unwrap();
    let service_config = backstop::client::grpc().service_config(config).unwrap();
    let once = backstop::client::grpc()
        .timeout(300 * MS)
        .retry(RetryConfig::grpc().max_attempts(1))
        .build()
        .unwrap();
    for which in ["service config", "max_attempts(1)"] {
        let (seen, dependency) = telling(never::<ReplayBody<String>>);
        let start = Instant::now();
        let response = match which {
            "service config" => {
                let client = ServiceBuilder::new()
                    .layer(service_config.clone())
                    .service(dependency);
                client.oneshot(grpc_call("")).await.unwrap().map(|_| ())
            }
            _ => {
                let client = ServiceBuilder::new()
                    .layer(once.clone())
                    .service(dependency);
                client.oneshot(grpc_call("")).await.unwrap().map(|_| ())
            }
        };
        assert_eq!(response.headers()["grpc-status"], "4", "{which}");
        assert_eq!(start.elapsed(), 300 * MS, "{which}");
        let heard = seen.lock().unwrap()[0].1.clone();
        assert_eq!(heard.as_deref(), Some("300m"), "{which}");
    }
}

/// The last attempt of a retried call gets what is left of the deadline, not its share; the
/// ones before it keep the share, so a retry has room.
#[tokio::test(start_paused = true)]
async fn the_last_attempt_gets_what_is_left() {
    let start = Instant::now();
    let (seen, dependency) = telling(never::<ReplayBody<String>>);
    let client = backstop::client::http()
        .timeout(Duration::from_secs(1))
        .retry(
            RetryConfig::http()
                .max_attempts(2)
                .backoff(backoff::constant(MS)),
        )
        .build()
        .unwrap();
    let client = ServiceBuilder::new().layer(client).service(dependency);
    let req = Request::get("http://svc/").body(String::new()).unwrap();
    let err = client.oneshot(req).await.unwrap_err();
    assert!(backstop::is_deadline_exceeded(&*err), "{err}");
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    let seen = seen.lock().unwrap().clone();
    // The first: 80 % of 1 s. The second, at 801 ms: all of the 199 ms left.
    assert_eq!(seen[0], (Duration::ZERO, Some("800m".to_owned())));
    assert_eq!(seen[1], (801 * MS, Some("199m".to_owned())));
}

/// `send_grpc_timeout(false)` on a preset (for third-party APIs): no attempt carries the
/// header, not even the caller's own, whichever way it was turned off (the short form, before
/// or after `timeout`, or a silent deadline layer passed to `deadline`), while the deadline
/// still bounds the call, the attempt bound still cuts an attempt, a retry still goes, and
/// every attempt carries its deadline on the request.
#[tokio::test(start_paused = true)]
async fn a_preset_told_not_to_send_the_header_sends_none_yet_keeps_every_bound() {
    let silent = PropagateDeadlineLayer::builder()
        .timeout(300 * MS)
        .send_grpc_timeout(false);
    let http = backstop::client::http;
    let presets = [
        (
            "short form first",
            http().send_grpc_timeout(false).timeout(300 * MS),
        ),
        (
            "short form last",
            http().timeout(300 * MS).send_grpc_timeout(false),
        ),
        ("silent layer", http().deadline(silent)),
    ];
    for (how, preset) in presets {
        let carried = Arc::new(Mutex::new(Vec::new()));
        let deadlines = carried.clone();
        let (seen, dependency) = telling(move |attempt, req: &Request<ReplayBody<String>>| {
            let deadline = req.extensions().get::<Deadline>().copied();
            deadlines
                .lock()
                .unwrap()
                .push(deadline.map(|d| d.remaining()));
            async move {
                if attempt == 1 {
                    // Hangs: cut by the attempt bound (100 ms), then retried (a GET).
                    std::future::pending::<()>().await;
                }
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        });
        let client = ServiceBuilder::new()
            .layer(
                preset
                    .attempt(backstop::client::attempt::AttemptBound::Fixed(100 * MS))
                    .build()
                    .unwrap(),
            )
            .service(dependency);
        let req = Request::get("http://partner/v1")
            .header("grpc-timeout", "10S")
            .body(String::new())
            .unwrap();
        let response = client.oneshot(req).await.unwrap();
        assert_eq!(
            backstop::client::call_info(&response).attempts(),
            2,
            "{how}"
        );
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{how}: {seen:?}");
        assert!(seen.iter().all(|(_, h)| h.is_none()), "{how}: {seen:?}");
        // The retry came after the first attempt's 100 ms bound (and its backoff).
        assert!(seen[1].0 >= 100 * MS, "{how}: {seen:?}");
        // Each attempt carried its own end (its 100 ms bound, within what was left of the
        // call's 300 ms), not the caller's 10 s.
        let carried = carried.lock().unwrap().clone();
        assert_eq!(carried[0], Some(100 * MS), "{how}");
        let second = carried[1].unwrap();
        assert!(
            second <= (300 * MS - seen[1].0).min(100 * MS),
            "{how}: {second:?}"
        );
    }
}

/// The gRPC preset too: no header on any attempt, a retryable status still retried.
#[tokio::test(start_paused = true)]
async fn the_grpc_preset_without_the_header_still_retries() {
    let (seen, dependency) = telling(|attempt, _: &Request<ReplayBody<String>>| {
        let code = if attempt == 1 { 14 } else { 0 };
        std::future::ready(Ok::<_, Infallible>(grpc_reply(code)))
    });
    let preset = backstop::client::grpc()
        .timeout(300 * MS)
        .send_grpc_timeout(false)
        .build()
        .unwrap();
    let client = ServiceBuilder::new().layer(preset).service(dependency);
    let response = client.oneshot(grpc_call("")).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "0");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.iter().all(|(_, h)| h.is_none()), "{seen:?}");
}

/// The deadline still ends a call whose dependency never answers, with no header sent.
#[tokio::test(start_paused = true)]
async fn without_the_header_the_deadline_still_ends_the_call() {
    let client = ServiceBuilder::new()
        .layer(
            backstop::client::http()
                .timeout(250 * MS)
                .max_attempts(1)
                .send_grpc_timeout(false)
                .build()
                .unwrap(),
        )
        .service(service_fn(|req: Request<ReplayBody<String>>| async move {
            assert!(req.headers().get("grpc-timeout").is_none());
            std::future::pending::<()>().await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let start = Instant::now();
    let err: BoxError = client
        .oneshot(
            Request::get("http://partner/v1")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert!(backstop::is_deadline_exceeded(&*err), "{err}");
    assert_eq!(start.elapsed(), 250 * MS);
}
