//! The server service: claim, run, store or release, replay.

use crate::deadline::Deadline;
use crate::idempotency::body::IdempotencyBody;
use crate::idempotency::config::{MAX_KEY_LEN, RETRY_AFTER_SECS, STORE_TIMEOUT, Settings};
use crate::idempotency::key::{IDEMPOTENCY_KEY, parse_key};
use crate::idempotency::problem::Problem;
use crate::idempotency::record;
use crate::idempotency::record::{Fingerprint, StoredResponse};
use crate::idempotency::store::{Claim, Record, Store, StoreError, StoreErrorKind, Token};
use crate::{NotExecuted, Rejection};
use bytes::{Bytes, BytesMut};
use http::{HeaderName, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use std::{
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};
use tower_service::Service;

/// The header a replayed answer carries.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The service of an [`IdempotencyLayer`](crate::idempotency::IdempotencyLayer).
pub struct Idempotency<S, St> {
    inner: S,
    settings: Arc<Settings<St>>,
}

impl<S: Clone, St> Clone for Idempotency<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            settings: self.settings.clone(),
        }
    }
}

impl<S: fmt::Debug, St> fmt::Debug for Idempotency<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("settings", &self.settings)
            .finish()
    }
}

impl<S, St> Idempotency<S, St> {
    pub(crate) fn from_parts(inner: S, settings: Arc<Settings<St>>) -> Self {
        Self { inner, settings }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

type Boxed<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

pin_project_lite::pin_project! {
    /// The response future of [`Idempotency`]: the inner future untouched for a request the
    /// layer does not handle, an answer it already has, or the keyed path (boxed: it holds
    /// store calls and the buffered bodies, and costs far more than the allocation).
    pub struct ResponseFuture<F, RB, E>
    where
        RB: Body,
    {
        #[pin]
        state: State<F, RB, E>,
    }
}

pin_project_lite::pin_project! {
    #[project = Proj]
    enum State<F, RB, E>
    where
        RB: Body,
    {
        Pass { #[pin] future: F },
        Ready { response: Option<Response<IdempotencyBody<RB>>> },
        Keyed { future: Boxed<Response<IdempotencyBody<RB>>, E> },
    }
}

impl<F, RB: Body, E> fmt::Debug for ResponseFuture<F, RB, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.state {
            State::Pass { .. } => "ResponseFuture::Pass",
            State::Ready { .. } => "ResponseFuture::Ready",
            State::Keyed { .. } => "ResponseFuture::Keyed",
        })
    }
}

impl<F, RB: Body, E> ResponseFuture<F, RB, E> {
    fn pass(future: F) -> Self {
        Self {
            state: State::Pass { future },
        }
    }
}

impl<F, RB, E> Future for ResponseFuture<F, RB, E>
where
    F: Future<Output = Result<Response<RB>, E>>,
    RB: Body,
{
    type Output = Result<Response<IdempotencyBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            Proj::Pass { future } => future
                .poll(cx)
                .map(|r| r.map(|r| r.map(IdempotencyBody::inner))),
            Proj::Ready { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
            Proj::Keyed { future } => future.as_mut().poll(cx),
        }
    }
}

impl<S, St, B, RB> Service<Request<B>> for Idempotency<S, St>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    St: Store,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    RB: Body + Unpin + Send + 'static,
    RB::Data: Send,
    RB::Error: Send + 'static,
{
    type Response = Response<IdempotencyBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, RB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let s = &self.settings;
        // gRPC answers in trailers and streams: not de-duplicated (see the crate docs).
        if !s.methods.contains(req.method()) || crate::is_grpc(req.headers()) {
            return ResponseFuture::pass(self.inner.call(req));
        }
        let mut values = req.headers().get_all(IDEMPOTENCY_KEY).iter();
        let key = match (values.next(), values.next()) {
            (None, _) if !s.require_key => {
                return ResponseFuture::pass(self.inner.call(req));
            }
            (None, _) => Err(Problem::Missing),
            (Some(_), Some(_)) => Err(Problem::BadKey(crate::idempotency::KeyError::Repeated)),
            (Some(value), None) => parse_key(value, MAX_KEY_LEN).map_err(Problem::BadKey),
        };
        let key = match key {
            Ok(key) => key,
            Err(problem) => {
                // Refused before the handler: the readiness reserved for it goes back.
                crate::rt::release(&mut self.inner);
                return ready(count(problem, BAD_KEY));
            }
        };
        // The body is read and the key claimed before the handler may run, and a duplicate
        // is answered (after waiting for the original, with `wait_in_flight`) without it: the
        // readiness reserved for this request goes back now, and the future readies a clone
        // of its own once the key is its own.
        crate::rt::release(&mut self.inner);
        let inner = self.inner.clone();
        ResponseFuture {
            state: State::Keyed {
                future: Box::pin(keyed(self.settings.clone(), inner, req, key)),
            },
        }
    }
}

fn ready<F, RB: Body, E>(problem: Problem) -> ResponseFuture<F, RB, E> {
    ResponseFuture {
        state: State::Ready {
            response: Some(problem.into_response()),
        },
    }
}

impl<St: Store> Settings<St> {
    /// A store operation bounded by [`STORE_TIMEOUT`].
    async fn timed<T>(
        &self,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(STORE_TIMEOUT, op).await {
            Ok(result) => result,
            Err(elapsed) => Err(StoreError::new(StoreErrorKind::Timeout, elapsed)),
        }
    }

    /// Releases the claim of `token`: nothing ran, and the next request with the key runs.
    /// A store that fails leaves the claim to expire after the lock timeout.
    async fn release(&self, key: &str, token: Token) {
        if let Err(e) = self.timed(self.store.release(key, token)).await {
            tracing::warn!(error = %e, "idempotency claim not released; it expires after the lock timeout");
        }
    }

    /// Replaces the claim of `token` with `record`; when the store cannot keep it (full, too
    /// large, down), with the small record that the request ran, so no duplicate runs it
    /// again: whatever cannot be stored still leaves that record.
    async fn finish(&self, key: &str, token: Token, record: Arc<StoredResponse>) {
        let unreplayable = Problem::Unreplayable.into_record(record.fingerprint);
        let e = match self
            .timed(self.store.complete(key, token, record.clone(), self.ttl))
            .await
        {
            Ok(true) => return,
            Ok(false) => {
                tracing::warn!(
                    "idempotency claim expired before its answer; a duplicate may have run"
                );
                return;
            }
            Err(e) => e,
        };
        if *record == unreplayable {
            tracing::warn!(error = %e, "idempotent request's record not stored; its key stays claimed until the lock timeout");
            return;
        }
        tracing::warn!(error = %e, "idempotent answer not stored; duplicates are answered 409");
        let unreplayable = Arc::new(unreplayable);
        if let Err(e) = self
            .timed(self.store.complete(key, token, unreplayable, self.ttl))
            .await
        {
            tracing::warn!(error = %e, "idempotent request's record not stored; its key stays claimed until the lock timeout");
        }
    }

    fn store_down<B: Body>(&self) -> Response<IdempotencyBody<B>> {
        count(
            Problem::StoreDown(RETRY_AFTER_SECS).into_response(),
            STORE_ERROR,
        )
    }

    /// The answer to a request whose key is already held.
    async fn held<B: Body>(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        record: Record,
    ) -> Response<IdempotencyBody<B>> {
        let mut record = record;
        // Saturated: a wait as long as the clock holds (any value below `lock_timeout`) waits
        // without overflowing the instant.
        let waited_until = self
            .wait_in_flight
            .map(|w| crate::rt::timer::after(tokio::time::Instant::now(), w));
        let mut pause = Duration::from_millis(5);
        loop {
            match record {
                Record::Completed(r) if r.fingerprint == fingerprint => {
                    return count(replay(&r), REPLAYED);
                }
                Record::Completed(_) => return count(Problem::Mismatch.into_response(), MISMATCH),
                Record::InFlight(f) if f != fingerprint => {
                    return count(Problem::Mismatch.into_response(), MISMATCH);
                }
                Record::InFlight(_) => {}
            }
            let Some(until) = waited_until else {
                return count(
                    Problem::InFlight(RETRY_AFTER_SECS).into_response(),
                    IN_FLIGHT,
                );
            };
            if crate::rt::timer::after(tokio::time::Instant::now(), pause) > until {
                return count(
                    Problem::InFlight(RETRY_AFTER_SECS).into_response(),
                    IN_FLIGHT,
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
            record = match self.timed(self.store.get(key)).await {
                Ok(Some(r)) => r,
                // Released (the original failed): this request may run, when retried.
                Ok(None) => {
                    return count(
                        Problem::InFlight(RETRY_AFTER_SECS).into_response(),
                        IN_FLIGHT,
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "idempotency store failed while waiting");
                    return self.store_down();
                }
            };
        }
    }
}

/// A stored answer, replayed.
fn replay<B: Body>(record: &StoredResponse) -> Response<IdempotencyBody<B>> {
    let mut response = Response::new(IdempotencyBody::full(record.body.clone()));
    *response.status_mut() = record.status;
    *response.headers_mut() = record.headers.clone();
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// Whether the answer says the handler never ran (it carries [`NotExecuted`]: a refusal made
/// before the handler, by a layer inside this one or by the handler itself). Only such an
/// answer releases the key; every other answer, 5xx included, is the key's answer.
fn not_executed<B>(response: &Response<B>) -> bool {
    response.extensions().get::<NotExecuted>().is_some()
}

/// The answer the deadline layer gives when a request's deadline passes while its handler
/// runs (HTTP 504, `deadline exceeded`), as a record: what a request cut by its deadline
/// leaves under its key, whichever of the two layers is outside.
fn deadline_record(fingerprint: Fingerprint) -> StoredResponse {
    let rejection = Rejection::DeadlineExceeded;
    let response = rejection.into_response::<http_body_util::Empty<Bytes>>(false);
    StoredResponse {
        fingerprint,
        status: response.status(),
        headers: response.headers().clone(),
        body: Bytes::from_static(rejection.message().as_bytes()),
    }
}

/// The claim of a request whose handler has started. From then on the key ends holding a
/// record that the request ran, whatever happens: its answer, or (a handler error, a panic,
/// an answer that cannot be kept) the unreplayable record. Only an answer carrying
/// [`NotExecuted`] releases it. Dropped armed (the request's future was dropped while the
/// handler ran: the caller left, a timeout outside fired), it completes the key on its own,
/// on the tokio runtime: the work may have happened, so a retry must not run it again.
struct ClaimGuard<St: Store> {
    settings: Arc<Settings<St>>,
    key: String,
    token: Token,
    fingerprint: Fingerprint,
    /// The request's deadline (the deadline layer's extension), when it came through one.
    deadline: Option<Deadline>,
    /// What a drop leaves: the answer being stored, once there is one.
    pending: Option<Arc<StoredResponse>>,
    armed: bool,
    /// Whether the handler was called: a claim dropped before is released (nothing ran).
    started: bool,
}

impl<St: Store> ClaimGuard<St> {
    /// Releases the claim: the handler said it did nothing.
    async fn release(mut self) {
        self.armed = false;
        self.settings.release(&self.key, self.token).await;
    }

    /// Completes the claim with `record`. Armed until the store has answered: dropped before,
    /// the guard still completes the key.
    async fn complete(mut self, record: Arc<StoredResponse>) {
        self.pending = Some(record.clone());
        self.settings.finish(&self.key, self.token, record).await;
        self.armed = false;
    }

    /// Completes the claim with the record that the request ran without an answer to replay.
    async fn ran(self) {
        let record = Arc::new(Problem::Unreplayable.into_record(self.fingerprint));
        self.complete(record).await;
    }

    /// What a dropped request leaves: the answer it was storing; else, when its deadline had
    /// passed, the deadline layer's 504 (so `Deadline → Idempotency` replays what
    /// `Idempotency → Deadline` stores); else the unreplayable record.
    fn dropped_record(&mut self) -> Arc<StoredResponse> {
        if let Some(record) = self.pending.take() {
            return record;
        }
        if self.deadline.is_some_and(|d| d.is_expired()) {
            return Arc::new(deadline_record(self.fingerprint));
        }
        Arc::new(Problem::Unreplayable.into_record(self.fingerprint))
    }
}

impl<St: Store> Drop for ClaimGuard<St> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "idempotent request dropped outside a tokio runtime; its key stays claimed until the lock timeout"
            );
            return;
        };
        let (settings, key, token) = (
            self.settings.clone(),
            std::mem::take(&mut self.key),
            self.token,
        );
        let mut finish: Pin<Box<dyn Future<Output = ()> + Send>> = if self.started {
            let record = self.dropped_record();
            Box::pin(async move { settings.finish(&key, token, record).await })
        } else {
            // Dropped while it waited for the handler's service: nothing ran, the key is
            // free for a retry.
            Box::pin(async move { settings.release(&key, token).await })
        };
        // A store that answers at once (the memory store) completes the key before the drop
        // returns, so a retry right after finds it; any other finishes on a task of its own.
        if !std::thread::panicking()
            && finish
                .as_mut()
                .poll(&mut Context::from_waker(std::task::Waker::noop()))
                .is_ready()
        {
            return;
        }
        runtime.spawn(finish);
    }
}

pin_project_lite::pin_project! {
    /// The handler's future, with a panic caught so the claim can be released before the
    /// panic goes on.
    struct CatchUnwind<F> {
        #[pin]
        future: F,
    }
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn std::any::Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = self.project().future;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

async fn keyed<S, St, B, RB>(
    s: Arc<Settings<St>>,
    mut inner: S,
    req: Request<B>,
    key: String,
) -> Result<Response<IdempotencyBody<RB>>, S::Error>
where
    S: Service<Request<B>, Response = Response<RB>>,
    St: Store,
    B: Body + From<Bytes>,
    RB: Body + Unpin,
    RB::Error: 'static,
{
    let (parts, body) = req.into_parts();
    let bytes = match read_body(body, s.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(problem) => return Ok(count(problem.into_response(), BAD_BODY)),
    };
    let identity = s.identity.as_ref().and_then(|f| f(&parts));
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let fingerprint = Fingerprint::of(&parts.method, path, identity.as_deref(), &bytes);
    let deadline = request_deadline(&parts);
    let lock = s.lock_for(deadline);
    let key = scoped(&key, s.identity.is_some(), identity.as_deref());
    let request = Request::from_parts(parts, B::from(bytes));

    let token = Token::new(crate::idempotency::client::random_bits(), fingerprint);
    let token = match claim(&s, &key, token, lock).await {
        Ok(Claim::Acquired(token)) => token,
        // Answered without the handler (a replay, 409, 422, or the original's answer once it
        // ends), and without waiting for its capacity.
        Ok(Claim::Held(record)) => return Ok(s.held(&key, fingerprint, record).await),
        Err(e) if s.fail_open => {
            tracing::warn!(error = %e, "idempotency store failed; running without de-duplication");
            count((), FAIL_OPEN);
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            return Ok(inner.call(request).await?.map(IdempotencyBody::inner));
        }
        Err(e) => {
            tracing::warn!(error = %e, "idempotency store failed; request refused");
            return Ok(s.store_down());
        }
    };
    let mut guard = ClaimGuard {
        settings: s.clone(),
        key,
        token,
        fingerprint,
        deadline,
        pending: None,
        armed: true,
        started: false,
    };
    // The key is this request's: the handler's service is readied now. Until the handler
    // starts, nothing ran: a readiness error, or the request dropped while it waits, frees the
    // key for a retry.
    if let Err(e) = std::future::poll_fn(|cx| inner.poll_ready(cx)).await {
        guard.release().await;
        return Err(e);
    }
    guard.started = true;
    // The handler has started: from here on the key keeps a record that it ran. A panic in
    // the inner `call` itself counts: it may have done anything before it panicked.
    let future =
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.call(request))) {
            Ok(future) => CatchUnwind { future },
            Err(panic) => {
                guard.ran().await;
                std::panic::resume_unwind(panic);
            }
        };
    let response = match future.await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => {
            // No answer to replay; the work may have happened.
            count((), NOT_KEPT);
            guard.ran().await;
            return Err(e);
        }
        Err(panic) => {
            count((), NOT_KEPT);
            guard.ran().await;
            std::panic::resume_unwind(panic);
        }
    };
    if not_executed(&response) {
        count((), RELEASED);
        guard.release().await;
        return Ok(response.map(IdempotencyBody::inner));
    }

    let (parts, mut body) = response.into_parts();
    // The largest body to store: `max_body_bytes`, and what the store can hold of a
    // record with these headers (a larger one is not offered to it).
    let limit = s.store.max_record_bytes().map_or(s.max_body_bytes, |most| {
        s.max_body_bytes
            .min(most.saturating_sub(record::head_size(&parts.headers)))
    });
    let mut buf = BytesMut::new();
    // Read the answer whole to store it; when it cannot be kept, the caller still gets all of
    // it (what was read, then the rest of the body, its error or its trailers) and the key
    // keeps a record that the request ran, so no duplicate runs the handler again.
    let unkept = loop {
        match body.frame().await {
            None => break None,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(mut data) => {
                    use bytes::Buf;
                    let over = buf.len() + data.remaining() > limit;
                    buf.extend_from_slice(&data.copy_to_bytes(data.remaining()));
                    if over {
                        tracing::warn!(
                            limit,
                            "idempotent answer too large to store; duplicates are answered 409"
                        );
                        break Some(IdempotencyBody::parts(
                            std::mem::take(&mut buf).freeze(),
                            Some(body),
                            None,
                            None,
                        ));
                    }
                }
                Err(frame) => {
                    tracing::warn!(
                        "idempotent answer has trailers, which are not stored; duplicates are answered 409"
                    );
                    let trailers = frame.into_trailers().ok();
                    break Some(IdempotencyBody::parts(
                        std::mem::take(&mut buf).freeze(),
                        None,
                        None,
                        trailers,
                    ));
                }
            },
            // The deadline cut the answer while it was read here, before its head went out
            // (a deadline layer inside this one): the caller gets the deadline's whole 504,
            // and so does every retry, as in the other order of the two layers.
            Some(Err(e)) if cut_by_deadline(&e) || deadline.is_some_and(|d| d.is_expired()) => {
                let record = Arc::new(deadline_record(fingerprint));
                let mut response = Response::new(IdempotencyBody::full(record.body.clone()));
                *response.status_mut() = record.status;
                *response.headers_mut() = record.headers.clone();
                count((), EXECUTED);
                guard.complete(record).await;
                return Ok(response);
            }
            Some(Err(e)) => {
                tracing::warn!("idempotent answer's body failed; duplicates are answered 409");
                break Some(IdempotencyBody::parts(
                    std::mem::take(&mut buf).freeze(),
                    None,
                    Some(e),
                    None,
                ));
            }
        }
    };
    let unkept_is_none = unkept.is_none();
    let (record, body) = match unkept {
        None => {
            let record = Arc::new(StoredResponse {
                fingerprint,
                status: parts.status,
                headers: parts.headers.clone(),
                body: buf.freeze(),
            });
            let body = IdempotencyBody::full(record.body.clone());
            (record, body)
        }
        Some(body) => {
            count((), NOT_KEPT);
            (
                Arc::new(Problem::Unreplayable.into_record(fingerprint)),
                body,
            )
        }
    };
    if unkept_is_none {
        count((), EXECUTED);
    }
    guard.complete(record).await;
    Ok(Response::from_parts(parts, body))
}

/// Claims `key` with `token`, bounded by [`STORE_TIMEOUT`]. A claim whose answer never came (it
/// timed out, the store failed) may still land, and would block every retry until the lock
/// timeout although the handler never ran: a task of its own waits for it (at most the lock
/// timeout) and releases the token's claim, best effort. The token is the layer's, so the
/// release needs nothing the store did not answer.
async fn claim<St: Store>(
    s: &Arc<Settings<St>>,
    key: &str,
    token: Token,
    lock: Duration,
) -> Result<Claim, StoreError> {
    let mut landing = Landing {
        sent: Some({
            let (s, key) = (s.clone(), key.to_owned());
            Box::pin(async move { s.store.claim(&key, token, lock).await })
        }),
        settings: s.clone(),
        key: key.to_owned(),
        token,
        lock,
    };
    let sent = landing.sent.as_mut().expect("set above");
    match tokio::time::timeout(STORE_TIMEOUT, sent.as_mut()).await {
        Ok(Ok(claim)) => {
            landing.sent = None;
            landing.key.clear();
            Ok(claim)
        }
        // Answered with an error: released now, in case it landed all the same.
        Ok(Err(e)) => {
            landing.sent = None;
            Err(e)
        }
        // Still on its way: released once it lands (the drop below).
        Err(elapsed) => Err(StoreError::new(StoreErrorKind::Timeout, elapsed)),
    }
}

/// The claim future is boxed so it can outlive the request.
type Sending = Pin<Box<dyn Future<Output = Result<Claim, StoreError>> + Send>>;

/// A claim whose answer the layer did not take: it timed out, failed, or the request's
/// future was dropped while it was on its way (a deadline outside, the caller gone). Such a
/// claim may still land, and would block every retry until its lock expires although the
/// handler never ran: dropped, this waits for it on a task of its own (at most the lock) and
/// releases the token's claim, best effort. The token is the layer's, so the release needs
/// nothing the store did not answer. Disarmed (an empty `key`) once the claim was answered.
struct Landing<St: Store> {
    sent: Option<Sending>,
    settings: Arc<Settings<St>>,
    key: String,
    token: Token,
    lock: Duration,
}

impl<St: Store> Drop for Landing<St> {
    fn drop(&mut self) {
        if self.key.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (s, key, token, lock) = (
            self.settings.clone(),
            std::mem::take(&mut self.key),
            self.token,
            self.lock,
        );
        let sent = self.sent.take();
        runtime.spawn(async move {
            if let Some(sent) = sent {
                let _ = tokio::time::timeout(lock, sent).await;
            }
            if let Err(e) = s.timed(s.store.release(&key, token)).await {
                tracing::warn!(error = %e, "idempotency claim that timed out not released; it expires after the lock timeout");
            }
        });
    }
}

/// The request's deadline, whichever order the layers are in: the deadline layer's extension
/// (it is outside), else the caller's `grpc-timeout` (it is inside, and will read the same).
fn request_deadline(parts: &http::request::Parts) -> Option<Deadline> {
    if let Some(deadline) = parts.extensions.get::<Deadline>() {
        return Some(*deadline);
    }
    let value = parts.headers.get(crate::wire::grpc::GRPC_TIMEOUT)?;
    let timeout = crate::wire::grpc_timeout::decode_header(value).ok()?;
    Some(Deadline::after(timeout))
}

/// The longest a request's deadline stretches its claim: an hour, the server preset's own cap
/// on a caller's deadline (a longer one would keep a key claimed for as long after a crash).
const MAX_LOCK: Duration = Duration::from_secs(3600);

impl<St: Store> Settings<St> {
    /// How long a request's claim is held: `lock_timeout`, or, when the request's deadline
    /// lets its handler run longer, until a second after that deadline (at most an hour):
    /// a claim that expired while its handler still ran would let a retry run it again.
    fn lock_for(&self, deadline: Option<Deadline>) -> Duration {
        let needed = deadline.map_or(Duration::ZERO, |d| {
            d.remaining().min(MAX_LOCK) + Duration::from_secs(1)
        });
        let lock = self.lock_timeout.max(needed);
        match self.store.max_expiry() {
            Some(most) => lock.min(most),
            None => lock,
        }
    }
}

/// The key under which the store keeps a request's record. With an `identity` configured,
/// each caller has its own key space: one caller's key never answers, blocks nor reveals
/// another's. The identity enters as a digest (an API key is not written into the store's key
/// names), and a caller without one has a space of its own, which no client-chosen key can
/// reach (a digest is 32 hex digits, the anonymous prefix is not).
fn scoped(key: &str, configured: bool, identity: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write;
    if !configured {
        return key.to_owned();
    }
    let Some(identity) = identity else {
        return format!("anonymous:{key}");
    };
    let digest = Sha256::digest(identity.as_bytes());
    let mut out = String::with_capacity(33 + key.len());
    for b in &digest[..16] {
        let _ = write!(out, "{b:02x}");
    }
    out.push(':');
    out.push_str(key);
    out
}

/// The whole request body, at most `limit` bytes (trailers are dropped).
async fn read_body<B: Body>(body: B, limit: usize) -> Result<Bytes, Problem> {
    if body.size_hint().lower() > limit as u64 {
        return Err(Problem::BodyTooLarge(limit));
    }
    let mut body = std::pin::pin!(body);
    let mut buf = BytesMut::new();
    while let Some(frame) = body.as_mut().frame().await {
        let Ok(frame) = frame else {
            return Err(Problem::BodyUnreadable);
        };
        if let Ok(mut data) = frame.into_data() {
            use bytes::Buf;
            if buf.len() + data.remaining() > limit {
                return Err(Problem::BodyTooLarge(limit));
            }
            buf.extend_from_slice(&data.copy_to_bytes(data.remaining()));
        }
    }
    Ok(buf.freeze())
}

// The outcomes of `backstop.idempotency.requests` (see `crate::metrics`).
const EXECUTED: &str = "executed";
const REPLAYED: &str = "replayed";
const IN_FLIGHT: &str = "in_flight";
const MISMATCH: &str = "mismatch";
const BAD_KEY: &str = "bad_key";
const BAD_BODY: &str = "bad_body";
const STORE_ERROR: &str = "store_error";
const FAIL_OPEN: &str = "fail_open";
const RELEASED: &str = "released";
const NOT_KEPT: &str = "not_kept";

/// Counts one keyed request's outcome in `backstop.idempotency.requests` and hands `value`
/// back (a no-op without the `metrics` feature).
#[inline]
fn count<T>(value: T, outcome: &'static str) -> T {
    #[cfg(feature = "metrics")]
    {
        crate::rt::metrics::describe();
        metrics::counter!(crate::metrics::IDEMPOTENCY_REQUESTS, "outcome" => outcome).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = outcome;
    value
}

/// Whether a body's error is a deadline's cut (`DeadlineExceeded`, as itself or in a
/// `BoxError`'s chain, as the deadline layer's body reports it).
fn cut_by_deadline<E: 'static>(error: &E) -> bool {
    use crate::DeadlineExceeded;
    let any: &dyn std::any::Any = error;
    if let Some(boxed) = any.downcast_ref::<crate::BoxError>() {
        return crate::find::<DeadlineExceeded>(&**boxed).is_some();
    }
    any.downcast_ref::<DeadlineExceeded>().is_some()
}
