//! Across hops: a server whose own retries gave up tells its callers not to retry either.

use crate::wire::grpc;
use crate::wire::grpc::{GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS};
use crate::wire::hint::NO_RETRY;
use http::{HeaderName, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use std::{
    cell::Cell,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, ready},
};
use tower_layer::Layer;
use tower_service::Service;

/// Where a handler's client calls report that their retries gave up: one per request a
/// [`Pushback`] serves, made the first time a client call inside the handler asks for it.
///
/// **Concurrency rule.** Shared between the request's [`PushbackFuture`] and the client calls
/// its handler makes (which may run on other tasks); a relaxed flag is enough: it only ever goes
/// from `false` to `true`, and the future reads it after the handler has answered.
#[derive(Debug, Default)]
pub(crate) struct GaveUp(AtomicBool);

impl GaveUp {
    /// Reports that a client call's retries gave up.
    pub(crate) fn mark(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn is_marked(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The handler scope's sink, as a thread-local sees it.
#[derive(Debug, Default)]
enum Sink {
    /// No [`Pushback`] future is being polled on this thread.
    #[default]
    Outside,
    /// One is; its request's flag, once a client call asked for it.
    Inside(Option<Arc<GaveUp>>),
}

thread_local! {
    /// Set while a [`PushbackFuture`] polls its handler (what it found put back after, so
    /// scopes nest). It is read once per client call, by the first client layer the call
    /// meets (see `client::call`), when the call is made; the call then keeps the flag, so a
    /// call spawned onto another task, or polled after the handler's poll, still reports.
    static SINK: Cell<Sink> = const { Cell::new(Sink::Outside) };
}

/// The flag of the request whose handler is making a client call on this thread, made on first
/// use (`None` outside a [`PushbackLayer`]). Called by the first client layer of a call, in
/// `call`.
pub(crate) fn sink() -> Option<Arc<GaveUp>> {
    SINK.with(|cell| match cell.take() {
        Sink::Outside => None,
        Sink::Inside(slot) => {
            let flag = slot.unwrap_or_default();
            cell.set(Sink::Inside(Some(flag.clone())));
            Some(flag)
        }
    })
}

/// Whether a client call made by the handler this task serves gave up on a retryable failure
/// (always `false` outside a [`PushbackLayer`]).
pub fn retries_exhausted() -> bool {
    SINK.with(|cell| {
        let sink = cell.take();
        let marked = matches!(&sink, Sink::Inside(Some(flag)) if flag.is_marked());
        cell.set(sink);
        marked
    })
}

/// The scope a [`PushbackFuture`] enters for one poll of its handler: puts back what it found
/// when dropped (also when the handler panics); `exit` hands back the request's flag, which a
/// client call may have made during the poll.
type Scope = crate::rt::scope::Scope<Sink>;

/// Enters the pushback scope of a request whose flag (if a call made one) is `flag`.
fn enter(flag: Option<Arc<GaveUp>>) -> Scope {
    Scope::enter(&SINK, Sink::Inside(flag))
}

/// Ends the pushback scope, handing back the request's flag.
fn exit(scope: Scope) -> Option<Arc<GaveUp>> {
    match scope.exit() {
        Sink::Inside(flag) => flag,
        Sink::Outside => None,
    }
}

/// Server side: when a [`RetryLayer`](crate::client::retry::RetryLayer) used by the handler gave up on a
/// retryable failure (attempts, budget, deadline, or a downstream "do not retry"), stamps
/// "do not retry" on the handler's failed response, so callers' retry layers do not retry it
/// again: `grpc-retry-pushback-ms: -1` on a gRPC response (gRPC A6), `backstop-no-retry: 1`
/// ([`NO_RETRY`]) on a plain HTTP one, which carries no gRPC
/// header (browsers, curl and proxies ignore the one they do not know).
///
/// Without it, each hop multiplies the attempts: three hops of 3 attempts make 27 on the last
/// one. With it, the failing dependency sees at most `max_attempts` per user request.
///
/// A failed response is a trailers-only gRPC response with a non-zero `grpc-status` (which is
/// how tonic answers an `Err(Status)`), or an HTTP 5xx. A client call reports to the request
/// whose handler made it (called it) while this layer polled the handler: it keeps the report's
/// address from then on, so a call the handler spawns onto another task, or moves into a
/// `FuturesUnordered`, still reports. A call whose first backstop layer is called elsewhere
/// does not: one made by a task the handler spawned, one built with `oneshot` and spawned
/// (`oneshot` calls when first polled), one behind a `Buffer` (its worker task calls the
/// layers). Call the client in the handler, then move the call where you like. A handler that
/// forwards the request it was given to a client in the same process reports to its own
/// request, not to the one that sent it there: each stack's first layer replaces the context
/// a request carries from another stack, and the retry layer takes it off the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct PushbackLayer {
    _priv: (),
}

impl PushbackLayer {
    /// The layer.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<S> Layer<S> for PushbackLayer {
    type Service = Pushback<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Pushback { inner }
    }
}

/// The service built by [`PushbackLayer`].
#[derive(Debug, Clone)]
pub struct Pushback<S> {
    inner: S,
}

impl<S> Pushback<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Pushback<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = PushbackFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // A handler that calls its client within `call` (not in its future) reports too.
        let scope = enter(None);
        let future = self.inner.call(req);
        PushbackFuture {
            future,
            flag: exit(scope),
        }
    }
}

// The response future of `Pushback`: public (it is its `Service::Future`) but unnameable,
// as only this crate names it.
mod future {
    use super::*;

    pin_project! {
        /// The response future of [`Pushback`].
        #[derive(Debug)]
        #[must_use = "futures do nothing unless polled"]
        pub struct PushbackFuture<F> {
            #[pin]
            pub(super) future: F,
            // The request's flag, once a client call of the handler asked for it.
            pub(super) flag: Option<Arc<GaveUp>>,
        }
    }

    /// Whether the response is a failure, and the header that says "do not retry" in its
    /// protocol.
    fn failure_header<B>(response: &Response<B>) -> Option<(HeaderName, HeaderValue)> {
        match response.headers().get(GRPC_STATUS) {
            Some(code) => (code.as_bytes() != b"0")
                .then(|| (GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"))),
            // A gRPC response whose status is still to come (in its trailers) is not a failure
            // yet: its HTTP status is 200.
            None if !response.status().is_server_error() => None,
            None if grpc::is_grpc(response.headers()) => {
                Some((GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1")))
            }
            None => Some((NO_RETRY, HeaderValue::from_static("1"))),
        }
    }

    impl<F, B, E> Future for PushbackFuture<F>
    where
        F: Future<Output = Result<Response<B>, E>>,
    {
        type Output = F::Output;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            let this = self.project();
            let scope = enter(this.flag.take());
            let poll = this.future.poll(cx);
            *this.flag = exit(scope);
            let mut result = ready!(poll);
            let exhausted = this.flag.as_ref().is_some_and(|flag| flag.is_marked());
            if let Ok(response) = &mut result
                && exhausted
                && let Some((name, value)) = failure_header(response)
            {
                response.headers_mut().insert(name, value);
            }
            Poll::Ready(result)
        }
    }
}
use future::PushbackFuture;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Polls `f` inside a scope holding `flag`, as a `PushbackFuture` does, and says whether
    /// the request was marked after it.
    fn in_scope(flag: &mut Option<Arc<GaveUp>>, f: impl FnOnce()) -> bool {
        let scope = enter(flag.take());
        f();
        *flag = exit(scope);
        flag.as_ref().is_some_and(|flag| flag.is_marked())
    }

    #[test]
    fn the_flag_lives_in_its_scope_only_and_scopes_nest() {
        assert!(
            sink().is_none(),
            "outside any scope, there is nothing to report to"
        );
        assert!(!retries_exhausted());
        let mut outer = None;
        let marked = in_scope(&mut outer, || {
            assert!(!retries_exhausted());
            let mut inner = None;
            let marked = in_scope(&mut inner, || sink().unwrap().mark());
            assert!(marked, "the inner request was marked");
            assert!(!retries_exhausted(), "the outer one was not");
        });
        assert!(!marked);
        assert!(outer.is_none(), "no client call asked: no flag was made");
    }

    #[test]
    fn a_call_keeps_its_flag_after_the_poll_that_made_it() {
        let mut flag = None;
        let mut kept = None;
        assert!(!in_scope(&mut flag, || kept = sink()));
        // The call reports later, from wherever it runs now.
        kept.unwrap().mark();
        assert!(in_scope(&mut flag, || ()), "the mark reaches the request");
    }

    #[test]
    fn a_panic_puts_the_enclosing_scope_back() {
        let caught = std::panic::catch_unwind(|| {
            let _scope = enter(None);
            sink().unwrap().mark();
            panic!("handler panicked");
        });
        assert!(caught.is_err());
        assert!(sink().is_none());
        assert!(!retries_exhausted());
    }
}
