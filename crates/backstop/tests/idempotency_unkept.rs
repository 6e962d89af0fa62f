//! What the layer does with a handler that misbehaves in ways a `Full` body cannot show: a
//! `call` that panics before any future exists, an answer with trailers, an answer whose body
//! fails. In each, the handler runs at most as often as it gave an answer.

mod common;

use backstop::idempotency::{IdempotencyLayer, MemoryStore};
use bytes::Bytes;
use common::*;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};
use tower::{BoxError, Layer, Service, ServiceExt};

/// A body of one data frame, then trailers or an error.
struct Tail {
    data: Option<Bytes>,
    end: Option<Result<HeaderMap, BoxError>>,
}

impl Body for Tail {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.end.take().map(|end| end.map(Frame::trailers)))
    }
}

/// A handler whose answer ends in trailers (`/trailers`) or a body error (`/broken`).
#[derive(Clone)]
struct Tailed(Arc<AtomicUsize>);

impl Service<Request<Full<Bytes>>> for Tailed {
    type Response = Response<Tail>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Response<Tail>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Full<Bytes>>) -> Self::Future {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        let end = if req.uri().path() == "/trailers" {
            let mut t = HeaderMap::new();
            t.insert("x-checksum", "abc".parse().unwrap());
            Ok(t)
        } else {
            Err("connection reset".into())
        };
        let body = Tail {
            data: Some(Bytes::from(format!("run {n}"))),
            end: Some(end),
        };
        std::future::ready(Ok(Response::builder().status(201).body(body).unwrap()))
    }
}

/// Every frame of a body: its data joined, its trailers, its error.
async fn drain<B: Body<Data = Bytes, Error: std::fmt::Display>>(
    body: B,
) -> (Bytes, Option<HeaderMap>, Option<String>) {
    let mut body = std::pin::pin!(body);
    let mut data = Vec::new();
    let mut trailers = None;
    while let Some(frame) = body.as_mut().frame().await {
        match frame {
            Ok(frame) => match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(frame) => trailers = frame.into_trailers().ok(),
            },
            Err(e) => return (data.into(), trailers, Some(e.to_string())),
        }
    }
    (data.into(), trailers, None)
}

#[tokio::test(start_paused = true)]
async fn an_answer_with_trailers_or_a_failed_body_reaches_its_caller_and_is_never_rerun() {
    for path in ["/trailers", "/broken"] {
        let runs = Arc::new(AtomicUsize::new(0));
        let layer = IdempotencyLayer::builder(MemoryStore::new())
            .lock_timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let svc = layer.layer(Tailed(runs.clone()));
        let first = svc
            .clone()
            .oneshot(post(path, Some("k"), "{}"))
            .await
            .unwrap();
        assert_eq!(first.status(), 201);
        let (data, trailers, error) = drain(first.into_body()).await;
        assert_eq!(data, "run 1", "{path}: the caller gets every byte");
        if path == "/trailers" {
            assert_eq!(trailers.unwrap()["x-checksum"], "abc");
            assert_eq!(error, None);
        } else {
            assert_eq!(error.as_deref(), Some("connection reset"));
        }
        // Long after the lock would have expired, the key still says its request ran.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let dup = svc
            .clone()
            .oneshot(post(path, Some("k"), "{}"))
            .await
            .unwrap();
        assert_eq!(dup.status(), 409, "{path}");
        assert!(dup.headers().get("retry-after").is_none());
        assert_eq!(dup.headers()["idempotent-replayed"], "true");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{path}: ran once");
    }
}

/// A service whose `call` panics the first time, before it returns a future.
#[derive(Clone)]
struct PanicsInCall {
    runs: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

impl Service<Request<Full<Bytes>>> for PanicsInCall {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Response<Full<Bytes>>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Full<Bytes>>) -> Self::Future {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("call panicked");
        }
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready(Ok(Response::builder()
            .status(201)
            .body(Full::new(Bytes::from(format!("run {n}"))))
            .unwrap()))
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_call_leaves_a_record_that_the_request_ran() {
    let runs = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = PanicsInCall {
        runs: runs.clone(),
        calls: calls.clone(),
    };
    let h = Harness::around(IdempotencyLayer::builder(MemoryStore::new()), runs, handler);
    let panicked = tokio::spawn(h.send(post("/ok", Some("k"), ""))).await;
    assert!(panicked.unwrap_err().is_panic());
    // `call` may have done anything before it panicked: the retry does not call it again.
    let retry = h.post("/ok", Some("k"), "").await;
    assert_problem(&retry, 409);
    assert!(retry.headers().get("retry-after").is_none(), "{retry:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
