//! What each classifier makes of responses, trailers and errors.

use super::*;
use crate::wire::grpc::{Code, GRPC_STATUS};
use crate::{
    AttemptTimedOut, BreakerOpen, BulkheadFull, ClientThrottled, DeadlineExceeded, Rejection,
    ServerHint,
};
use ::http::{HeaderValue, Response, StatusCode};
use std::{error::Error, io};

fn response(status: u16, headers: &[(&'static str, &'static str)]) -> Response<()> {
    let mut r = Response::new(());
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    for (k, v) in headers {
        r.headers_mut().insert(*k, HeaderValue::from_static(v));
    }
    r
}

fn http(r: &Response<()>) -> Outcome {
    HttpClassifier::new().classify(Ok(r))
}

fn grpc(r: &Response<()>) -> Outcome {
    GrpcClassifier::new().classify(Ok(r))
}

#[test]
fn http_defaults() {
    use Retryable::*;
    assert_eq!(http(&response(200, &[])), Outcome::Success);
    assert_eq!(http(&response(304, &[])), Outcome::Success);
    assert_eq!(http(&response(404, &[])), Outcome::Ignored);
    assert_eq!(http(&response(400, &[])), Outcome::Ignored);
    assert_eq!(http(&response(500, &[])), Outcome::failure(Never));
    assert_eq!(http(&response(501, &[])), Outcome::failure(Never));
    for s in [502, 503, 504] {
        assert_eq!(
            http(&response(s, &[])),
            Outcome::failure(IfIdempotent),
            "{s}"
        );
    }
    assert_eq!(
        http(&response(429, &[("retry-after", "7")])),
        Outcome::Throttled {
            retryable: Always,
            hint: Some(ServerHint::RetryAfter(std::time::Duration::from_secs(7)))
        }
    );
    assert_eq!(
        http(&response(503, &[("grpc-retry-pushback-ms", "-1")])),
        Outcome::Failure {
            retryable: IfIdempotent,
            hint: Some(ServerHint::DoNotRetry)
        }
    );
}

#[test]
fn http_sets_are_configurable() {
    let c = HttpClassifier::new()
        .retry_if_idempotent([
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::REQUEST_TIMEOUT,
        ])
        .retry_always([]);
    assert_eq!(
        c.classify(Ok(&response(500, &[]))),
        Outcome::failure(Retryable::IfIdempotent)
    );
    assert_eq!(
        c.classify(Ok(&response(408, &[]))),
        Outcome::failure(Retryable::IfIdempotent)
    );
    assert_eq!(c.classify(Ok(&response(429, &[]))), Outcome::Ignored);
    assert_eq!(
        c.classify(Ok(&response(503, &[]))),
        Outcome::failure(Retryable::Never)
    );
}

/// A listed status below 400 is a failure, whatever the success shortcut does for the
/// statuses no list names.
#[test]
fn a_listed_success_status_is_a_failure() {
    let c = HttpClassifier::new().retry_always([StatusCode::ACCEPTED]);
    assert_eq!(
        c.classify(Ok(&response(202, &[]))),
        Outcome::failure(Retryable::Always)
    );
    for status in [200, 201, 204, 302] {
        assert_eq!(
            c.classify(Ok(&response(status, &[]))),
            Outcome::Success,
            "{status}"
        );
    }
    let c = c.retry_always([]);
    assert_eq!(c.classify(Ok(&response(202, &[]))), Outcome::Success);
}

#[test]
fn local_rejections_are_rejected() {
    let r = Rejection::DeadlineExceeded
        .into_response::<()>(true)
        .map(|_| ());
    assert_eq!(grpc(&r), Outcome::Rejected);
    let r = Rejection::DeadlineExceeded
        .into_response::<()>(false)
        .map(|_| ());
    assert_eq!(http(&r), Outcome::Rejected);
    let open = BreakerOpen::new(None);
    assert_eq!(classify_error(&open), Outcome::Rejected);
    assert_eq!(classify_error(&ClientThrottled::new()), Outcome::Rejected);
    assert_eq!(
        classify_error(&BulkheadFull::new("max_wait")),
        Outcome::Rejected
    );
    let err = DeadlineExceeded::new();
    assert_eq!(
        HttpClassifier::new().classify(Err::<&Response<()>, _>(&err)),
        Outcome::Rejected
    );
}

#[test]
fn grpc_trailers_only_codes() {
    use Retryable::*;
    let ct = ("content-type", "application/grpc");
    assert_eq!(
        grpc(&response(200, &[ct, ("grpc-status", "0")])),
        Outcome::Success
    );
    assert_eq!(
        grpc(&response(200, &[ct, ("grpc-status", "14")])),
        Outcome::failure(Always)
    );
    assert_eq!(
        grpc(&response(
            200,
            &[ct, ("grpc-status", "14"), ("grpc-retry-pushback-ms", "-1")]
        )),
        Outcome::Failure {
            retryable: Always,
            hint: Some(ServerHint::DoNotRetry)
        }
    );
    assert_eq!(
        grpc(&response(200, &[ct, ("grpc-status", "8")])),
        Outcome::Throttled {
            retryable: Never,
            hint: None
        }
    );
    // A6: the code decides, the pushback only says when.
    let pushback = Some(ServerHint::Pushback(std::time::Duration::from_millis(100)));
    let exhausted = response(
        200,
        &[ct, ("grpc-status", "8"), ("grpc-retry-pushback-ms", "100")],
    );
    assert_eq!(
        grpc(&exhausted),
        Outcome::Throttled {
            retryable: Never,
            hint: pushback
        }
    );
    let only_unavailable = GrpcClassifier::new().retryable_codes([Code::Unavailable]);
    assert_eq!(
        only_unavailable.classify(Ok(&exhausted)),
        Outcome::Throttled {
            retryable: Never,
            hint: pushback
        }
    );
    let with_exhausted = GrpcClassifier::new().retryable_codes([Code::ResourceExhausted]);
    assert_eq!(
        with_exhausted.classify(Ok(&exhausted)),
        Outcome::Throttled {
            retryable: Always,
            hint: pushback
        }
    );
    assert_eq!(
        with_exhausted.classify(Ok(&response(200, &[ct, ("grpc-status", "14")]))),
        Outcome::failure(Never),
        "the set is replaced, not extended"
    );
    for code in ["4", "2", "13", "15", "99", "x"] {
        assert_eq!(
            grpc(&response(200, &[ct, ("grpc-status", code)])),
            Outcome::failure(Never),
            "{code}"
        );
    }
    for code in ["1", "3", "5", "6", "7", "9", "10", "11", "12", "16"] {
        assert_eq!(
            grpc(&response(200, &[ct, ("grpc-status", code)])),
            Outcome::Ignored,
            "{code}"
        );
    }
}

#[test]
fn grpc_status_from_trailers_and_http() {
    let c = GrpcClassifier::new();
    let c: &dyn Classify<Response<()>> = &c;
    let ct = ("content-type", "application/grpc");
    // Headers without a status: success so far; the trailers decide.
    assert_eq!(grpc(&response(200, &[ct])), Outcome::Success);
    let mut trailers = HeaderMap::new();
    assert_eq!(c.classify_trailers(&trailers), None);
    trailers.insert(GRPC_STATUS, HeaderValue::from_static("14"));
    assert_eq!(
        c.classify_trailers(&trailers),
        Some(Outcome::failure(Retryable::Always))
    );
    assert_eq!(
        grpc(&response(503, &[])),
        Outcome::failure(Retryable::Always)
    );
    assert_eq!(grpc(&response(404, &[])), Outcome::Ignored);
    assert_eq!(
        grpc(&response(500, &[])),
        Outcome::failure(Retryable::Never)
    );
    assert_eq!(
        grpc(&response(200, &[("content-type", "text/html")])),
        Outcome::failure(Retryable::Never)
    );
    let custom = GrpcClassifier::new().retryable_codes([Code::Unavailable, Code::Aborted]);
    assert_eq!(
        custom.classify_code(Code::Aborted, &HeaderMap::new()),
        Outcome::failure(Retryable::Always)
    );
    assert!(is_trailers_only(&response(200, &[("grpc-status", "0")])));
    assert!(c.awaits_trailers(&response(200, &[ct])));
    assert!(!c.awaits_trailers(&response(200, &[ct, ("grpc-status", "0")])));
    assert!(!c.awaits_trailers(&response(503, &[])));
    let h: &dyn Classify<Response<()>> = &HttpClassifier::new();
    assert!(!h.awaits_trailers(&response(200, &[ct])));
    assert!(!is_trailers_only(&response(200, &[ct])));
}

#[derive(Debug)]
struct Wrap(io::Error);

impl std::fmt::Display for Wrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("client error")
    }
}

impl Error for Wrap {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.0)
    }
}

#[test]
fn transport_errors_through_the_source_chain() {
    use Retryable::*;
    let cases = [
        (io::ErrorKind::ConnectionRefused, Always),
        (io::ErrorKind::AddrNotAvailable, Always),
        (io::ErrorKind::ConnectionReset, IfIdempotent),
        (io::ErrorKind::BrokenPipe, IfIdempotent),
        (io::ErrorKind::UnexpectedEof, IfIdempotent),
        (io::ErrorKind::TimedOut, IfIdempotent),
    ];
    for (kind, want) in cases {
        let err = Wrap(io::Error::from(kind));
        assert_eq!(classify_error(&err), Outcome::failure(want), "{kind:?}");
    }
    assert_eq!(
        classify_error(&AttemptTimedOut::new()),
        Outcome::failure(IfIdempotent)
    );
    assert_eq!(
        classify_error(&std::fmt::Error),
        Outcome::failure(IfIdempotent)
    );
    assert!(Outcome::failure(Never).is_failure());
    assert!(!Outcome::Rejected.is_failure());
}

/// `classify_head`'s contract: the same answer as `classify` and, of a success,
/// `awaits_trailers`. Both classifiers override it: the gRPC one reads its headers once for
/// it, the HTTP one answers its `classify` (its headers always decide).
#[test]
fn classify_head_answers_as_classify_and_awaits_trailers_do() {
    fn asked_apart<C: Classify<Response<()>>>(c: &C, r: &Response<()>) -> Option<Outcome> {
        let outcome = c.classify(Ok(r));
        (outcome != Outcome::Success || !c.awaits_trailers(r)).then_some(outcome)
    }
    let rejected = Rejection::DeadlineExceeded
        .into_response::<()>(true)
        .map(|_| ());
    let cases = [
        (
            "a gRPC stream",
            response(200, &[("content-type", "application/grpc")]),
        ),
        (
            "a gRPC+proto stream",
            response(200, &[("content-type", "application/grpc+proto")]),
        ),
        ("no headers at all", response(200, &[])),
        (
            "trailers-only OK",
            response(
                200,
                &[("content-type", "application/grpc"), ("grpc-status", "0")],
            ),
        ),
        (
            "trailers-only UNAVAILABLE",
            response(
                200,
                &[("content-type", "application/grpc"), ("grpc-status", "14")],
            ),
        ),
        (
            "a malformed status",
            response(
                200,
                &[("content-type", "application/grpc"), ("grpc-status", "x")],
            ),
        ),
        (
            "a JSON 200",
            response(200, &[("content-type", "application/json")]),
        ),
        ("a proxy's 503", response(503, &[])),
        (
            "a 429 with Retry-After",
            response(429, &[("retry-after", "3")]),
        ),
        ("a 404", response(404, &[])),
        ("our own rejection", rejected),
    ];
    let grpc = GrpcClassifier::new();
    let http = HttpClassifier::new();
    for (name, r) in &cases {
        assert_eq!(grpc.classify_head(r), asked_apart(&grpc, r), "gRPC: {name}");
        assert_eq!(http.classify_head(r), asked_apart(&http, r), "HTTP: {name}");
    }
    assert_eq!(
        grpc.classify_head(&cases[0].1),
        None,
        "a stream's trailers decide"
    );
    assert_eq!(grpc.classify_head(&cases[3].1), Some(Outcome::Success));
}

/// `failure_parts` and `is_failure` see a throttled failure as a failure, with its own parts,
/// and nothing else as one.
#[test]
fn failure_parts_of_every_outcome() {
    use Retryable::*;
    let hint = Some(ServerHint::RetryAfter(std::time::Duration::from_secs(3)));
    let failure = Outcome::Failure {
        retryable: IfIdempotent,
        hint,
    };
    let throttled = Outcome::Throttled {
        retryable: Always,
        hint: None,
    };
    assert_eq!(failure.failure_parts(), Some((IfIdempotent, hint)));
    assert_eq!(throttled.failure_parts(), Some((Always, None)));
    assert!(throttled.is_failure());
    for other in [Outcome::Success, Outcome::Rejected, Outcome::Ignored] {
        assert_eq!(other.failure_parts(), None, "{other:?}");
        assert!(!other.is_failure(), "{other:?}");
    }
}

/// A classifier that answers fixed values and keeps the trait's default `classify_head`.
struct Fixed {
    outcome: Outcome,
    awaits: bool,
}

impl Classify<Response<()>> for Fixed {
    fn classify(&self, _: Result<&Response<()>, &(dyn Error + 'static)>) -> Outcome {
        self.outcome
    }

    fn awaits_trailers(&self, _: &Response<()>) -> bool {
        self.awaits
    }
}

/// The default `classify_head`: `None` only for a success whose outcome is still to come in
/// the trailers; any other outcome is final whatever `awaits_trailers` says.
#[test]
fn the_default_classify_head() {
    let r = response(200, &[]);
    let failure = Outcome::failure(Retryable::Never);
    let cases = [
        (Outcome::Success, true, None),
        (Outcome::Success, false, Some(Outcome::Success)),
        (failure, true, Some(failure)),
        (failure, false, Some(failure)),
    ];
    for (outcome, awaits, want) in cases {
        let c = Fixed { outcome, awaits };
        assert_eq!(c.classify_head(&r), want, "{outcome:?}, awaits {awaits}");
        // The trait's other defaults: no trailers decide.
        assert_eq!(c.classify_trailers(&HeaderMap::new()), None);
    }
}

/// RFC 9110 §15.5.10: 409 Conflict is a client error; with `Retry-After` (§10.2.3, "how long
/// the user agent ought to wait") it is the idempotency layer's "a duplicate still in flight,
/// come back later": throttled, always retryable, the hint kept. `Retry-After` turns no other
/// 4xx into anything but ignored, and a 409 without it is ignored too.
#[test]
fn a_409_with_retry_after_is_throttled() {
    let come_back = Outcome::Throttled {
        retryable: Retryable::Always,
        hint: Some(ServerHint::RetryAfter(std::time::Duration::from_secs(2))),
    };
    assert_eq!(http(&response(409, &[("retry-after", "2")])), come_back);
    assert_eq!(http(&response(409, &[])), Outcome::Ignored);
    for status in [400, 404, 410] {
        assert_eq!(
            http(&response(status, &[("retry-after", "2")])),
            Outcome::Ignored,
            "{status}"
        );
    }
}

/// HTTP/2 errors with the `h2` feature: RFC 9113 §8.7 says a stream refused with
/// `REFUSED_STREAM` was not processed, and one above the last stream id of a `GOAWAY` was not
/// either (§6.8); backstop counts only a graceful (`NO_ERROR`) `GOAWAY` from the peer. Any
/// other reason, a local one, or a peer's `RST_STREAM(NO_ERROR)` may follow processing.
#[cfg(feature = "h2")]
mod h2_errors {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An empty SETTINGS frame: length 0, type 0x4, no flags, stream 0 (RFC 9113 §6.5).
    const SETTINGS: [u8; 9] = [0, 0, 0, 0x4, 0, 0, 0, 0, 0];

    /// A GOAWAY frame (RFC 9113 §6.8): length 8, type 0x7, stream 0, last stream id 0, `code`.
    fn go_away(code: u8) -> Vec<u8> {
        vec![0, 0, 8, 0x7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, code]
    }

    /// A RST_STREAM frame (RFC 9113 §6.4) for stream 1: length 4, type 0x3, `code`.
    fn reset_stream_1(code: u8) -> Vec<u8> {
        vec![0, 0, 4, 0x3, 0, 0, 0, 0, 1, 0, 0, 0, code]
    }

    /// The error an h2 client's first request gets from a peer that reads the client preface
    /// and frames up to the request's HEADERS, then answers SETTINGS and `frames`.
    async fn client_error_after(frames: Vec<u8>) -> h2::Error {
        let (client, mut server) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let mut preface = [0u8; 24];
            server.read_exact(&mut preface).await.unwrap();
            loop {
                let mut head = [0u8; 9];
                server.read_exact(&mut head).await.unwrap();
                let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                let mut payload = vec![0u8; len];
                server.read_exact(&mut payload).await.unwrap();
                if head[3] == 0x1 {
                    break;
                }
            }
            server.write_all(&SETTINGS).await.unwrap();
            server.write_all(&frames).await.unwrap();
            let mut sink = [0u8; 1024];
            while server.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        });
        let (send, connection) = h2::client::handshake(client).await.unwrap();
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut send = send.ready().await.unwrap();
        let request = ::http::Request::get("http://localhost/").body(()).unwrap();
        let (response, _) = send.send_request(request, true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), response)
            .await
            .expect("the peer's frames end the request")
            .expect_err("the peer sent no response")
    }

    #[test]
    fn reasons_alone() {
        use Retryable::*;
        let cases = [
            (h2::Reason::REFUSED_STREAM, Always),
            // Not a GOAWAY, so not "graceful" even with NO_ERROR.
            (h2::Reason::NO_ERROR, IfIdempotent),
            (h2::Reason::CANCEL, IfIdempotent),
            (h2::Reason::INTERNAL_ERROR, IfIdempotent),
        ];
        for (reason, want) in cases {
            let err = h2::Error::from(reason);
            assert_eq!(classify_error(&err), Outcome::failure(want), "{reason:?}");
        }
    }

    #[tokio::test]
    async fn frames_from_the_peer() {
        use Retryable::*;
        let cases = [
            ("GOAWAY(NO_ERROR)", go_away(0x0), Always),
            ("GOAWAY(PROTOCOL_ERROR)", go_away(0x1), IfIdempotent),
            ("RST_STREAM(REFUSED_STREAM)", reset_stream_1(0x7), Always),
            ("RST_STREAM(NO_ERROR)", reset_stream_1(0x0), IfIdempotent),
        ];
        for (name, frames, want) in cases {
            let err = client_error_after(frames).await;
            assert!(err.is_remote(), "{name}: {err:?}");
            assert_eq!(
                classify_error(&err),
                Outcome::failure(want),
                "{name}: {err:?}"
            );
        }
    }
}
