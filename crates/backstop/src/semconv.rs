//! Call durations under OpenTelemetry's semantic conventions (feature `metrics`), from a layer
//! of their own: [`SemconvLayer`].
//!
//! backstop's own series (`backstop.*`, [`metrics`](crate::metrics)) say what the resilience
//! layers did. Dashboards built on OpenTelemetry's conventions want the calls themselves, under
//! the names and attributes every instrumented client uses. This layer records them, through
//! the same `metrics` facade, for each request that goes through it:
//!
//! | name | kind | labels |
//! |------|------|--------|
//! | `http.client.request.duration` | histogram (s) | `http.request.method`, `server.address`, `server.port`, `http.response.status_code` (when there is a response), `error.type` (the status code for 4xx and 5xx; for an error, `timeout`, `cancelled`, the stack's refusals `breaker_open`, `throttled`, `bulkhead_full`, else `_OTHER`) |
//! | `rpc.client.duration` | histogram (ms) | `rpc.system` (`grpc`), `rpc.service`, `rpc.method`, `rpc.grpc.status_code`, `server.address`, `server.port` |
//!
//! A gRPC call (`content-type: application/grpc…`) is timed until its status: the response
//! headers of a trailers-only answer, else the trailers at the end of its body; a body dropped
//! before them records `rpc.grpc.status_code = 1` (CANCELLED), as gRPC's clients report a
//! call their caller cancelled; a response with another HTTP status than 200 and no
//! `grpc-status` (a proxy's error page) records the code gRPC's clients give it
//! (`Code::of_http_status`: 503 → 14). An attempt dropped before its response headers is
//! recorded too: as timed out (`rpc.grpc.status_code = 4`, `error.type = timeout`) when its
//! time had run out (the attempt bound outside, or the deadline, dropped it: its
//! `grpc-timeout` or `Deadline` says when, and the attempt bound puts its end in the
//! `Deadline` of every attempt, with a deadline or without one), else as cancelled (`1`,
//! `error.type = cancelled`: a hedge that lost, a caller that let go). An error becomes the
//! status gRPC's clients give it: 4 (DEADLINE_EXCEEDED) for an expired deadline or attempt
//! bound, 14 (UNAVAILABLE) for the stack's refusals (an open breaker, the throttle, the
//! bulkhead) and transport errors; for HTTP, its class (`timeout`, `breaker_open`,
//! `throttled`, `bulkhead_full`, else `_OTHER`). Around a whole client stack, the layer sees
//! the stack's own answers: a gRPC call's local failures are trailers-only responses with
//! their status, a plain HTTP call's are those errors.
//! Any other request is timed until its response headers. `http.request.method` is one of
//! RFC 9110's methods or PATCH, else `_OTHER`; `server.address` is the URI's host (an
//! IPv6 address without its brackets, as the conventions say) and
//! `server.port` its port, else the scheme's default (80, 443). A request whose URI names no
//! host (a tonic client's: its `Channel` adds the origin) takes them from
//! [`SemconvLayer::server`], or goes without them.
//!
//! # Where it goes
//!
//! **Between a client preset and the transport**: it then times each attempt, which is what
//! the conventions mean (a retried call is several requests), and its labels name the server
//! each attempt went to.
//!
//! ```
//! use backstop::ReplayBody;
//! use backstop::semconv::SemconvLayer;
//! use http::{Request, Response};
//! use std::convert::Infallible;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), backstop::BoxError> {
//! let client = ServiceBuilder::new()
//!     .layer(backstop::client::http().name("billing").build()?)
//!     .layer(SemconvLayer::new())
//!     .service(service_fn(|_req: Request<ReplayBody<String>>| async {
//!         Ok::<_, Infallible>(Response::new(String::new()))
//!     }));
//! let response = client.oneshot(Request::get("http://billing:8080/invoices").body(String::new())?).await?;
//! assert_eq!(response.status(), 200);
//! // Recorded: http.client.request.duration{http.request.method="GET",
//! //   server.address="billing", server.port="8080", http.response.status_code="200"}
//! # Ok(())
//! # }
//! ```
//!
//! # Differences from the conventions
//!
//! The attributes are labels of the `metrics` facade, with the conventions' dotted names (a
//! Prometheus exporter writes `http_request_method`). `rpc.client.duration` keeps the unit of
//! the conventions that define it, milliseconds. `url.scheme`, `network.protocol.version`
//! and the size histograms are not recorded.

use crate::wire::grpc::GRPC_STATUS;
use crate::{BoxError, is_grpc};
use http::{HeaderMap, Method, Request, Response};
use http_body::{Body, Frame};
use metrics::Label;
use std::{
    pin::Pin,
    task::{Context, Poll, ready},
};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

/// `http.client.request.duration`
pub(crate) const HTTP_CLIENT_REQUEST_DURATION: &str = "http.client.request.duration";
/// `rpc.client.duration`
pub(crate) const RPC_CLIENT_DURATION: &str = "rpc.client.duration";

/// Records each request's duration under OpenTelemetry's semantic conventions; see the
/// [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct SemconvLayer {
    server: Option<Server>,
}

/// The server a transport sends to when the requests it is given name none.
#[derive(Debug, Clone)]
struct Server {
    address: std::sync::Arc<str>,
    port: u16,
}

impl SemconvLayer {
    /// The layer: `server.address` and `server.port` from each request's URI, and left out
    /// for a request whose URI names no host.
    pub fn new() -> Self {
        Self::default()
    }

    /// The server to report for requests whose URI names no host: a tonic client's requests
    /// carry only a path (its `Channel` adds the endpoint's origin), so behind one, say the
    /// endpoint here. A request that names its host is reported with its own.
    ///
    /// ```
    /// use backstop::semconv::SemconvLayer;
    ///
    /// // A tonic `Channel` to http://inventory:50051.
    /// let layer = SemconvLayer::new().server("inventory", 50051);
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn server(mut self, address: &str, port: u16) -> Self {
        self.server = Some(Server {
            address: unbracketed(address).into(),
            port,
        });
        self
    }
}

impl<S> Layer<S> for SemconvLayer {
    type Service = Semconv<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Semconv {
            inner,
            server: self.server.clone(),
        }
    }
}

/// The service of [`SemconvLayer`]: readiness, responses and errors are the inner service's.
#[derive(Debug, Clone)]
pub struct Semconv<S> {
    inner: S,
    server: Option<Server>,
}

#[derive(Debug)]
struct Call {
    start: Instant,
    grpc: bool,
    labels: Vec<Label>,
    /// When the attempt runs out of time, if the request says (its `grpc-timeout`, written by
    /// the attempt bound outside, or its `Deadline`): a call dropped from then on timed out,
    /// one dropped before was cancelled.
    expires: Option<Instant>,
}

/// An IPv6 address without the brackets a URI puts around it (`[::1]` → `::1`): OpenTelemetry's
/// `server.address` is the address alone.
fn unbracketed(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

impl Call {
    fn of<B>(req: &Request<B>, server: Option<&Server>) -> Self {
        let uri = req.uri();
        // The URI's host and port (else its scheme's default port), else the configured
        // server's; none at all leaves both labels out, as the conventions say for an
        // attribute that is not available.
        let server = match uri.host() {
            Some(host) => Some((
                unbracketed(host).to_owned(),
                uri.port_u16().or_else(|| match uri.scheme_str() {
                    Some("https") => Some(443),
                    Some("http") => Some(80),
                    _ => None,
                }),
            )),
            None => server.map(|s| (s.address.to_string(), Some(s.port))),
        };
        let grpc = is_grpc(req.headers());
        let mut labels = Vec::with_capacity(6);
        if grpc {
            let path = uri.path().trim_start_matches('/');
            let (service, method) = path.split_once('/').unwrap_or((path, ""));
            labels.push(Label::new("rpc.system", "grpc"));
            labels.push(Label::new("rpc.service", service.to_owned()));
            labels.push(Label::new("rpc.method", method.to_owned()));
        } else {
            labels.push(Label::new(
                "http.request.method",
                method_label(req.method()),
            ));
        }
        if let Some((address, port)) = server {
            labels.push(Label::new("server.address", address));
            if let Some(port) = port {
                labels.push(Label::new("server.port", port.to_string()));
            }
        }
        let start = Instant::now();
        Self {
            start,
            grpc,
            labels,
            expires: expiry(req, start),
        }
    }

    /// Records the call, ended with `status` (gRPC: its code; HTTP: the response's status or
    /// the error's type).
    fn record(self, end: End) {
        let Self {
            start,
            grpc,
            mut labels,
            ..
        } = self;
        let elapsed = start.elapsed();
        match end {
            End::Grpc(code) => labels.push(Label::new("rpc.grpc.status_code", code.to_string())),
            End::Http(status) => {
                labels.push(Label::new(
                    "http.response.status_code",
                    status.as_u16().to_string(),
                ));
                if status.is_client_error() || status.is_server_error() {
                    labels.push(Label::new("error.type", status.as_u16().to_string()));
                }
            }
            End::HttpError(kind) => labels.push(Label::new("error.type", kind)),
        }
        if grpc {
            metrics::histogram!(RPC_CLIENT_DURATION, labels).record(elapsed.as_secs_f64() * 1e3);
        } else {
            metrics::histogram!(HTTP_CLIENT_REQUEST_DURATION, labels).record(elapsed.as_secs_f64());
        }
    }
}

/// How a call ended, for its last label.
enum End {
    Grpc(u32),
    Http(http::StatusCode),
    HttpError(&'static str),
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "_OTHER",
    }
}

/// The gRPC status code in `headers`, if they carry one (an unreadable one is UNKNOWN, 2).
/// When an attempt sent at `start` runs out of time: the earlier of what its `grpc-timeout`
/// tells the server and its `Deadline` extension.
fn expiry<B>(req: &Request<B>, start: Instant) -> Option<Instant> {
    let told = req
        .headers()
        .get(crate::wire::grpc::GRPC_TIMEOUT)
        .and_then(|v| crate::wire::grpc_timeout::decode_header(v).ok())
        .and_then(|t| start.checked_add(t));
    let deadline = req
        .extensions()
        .get::<crate::deadline::Deadline>()
        .map(|d| d.instant());
    match (told, deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How a call dropped before its response ended: timed out if its time had run out (the
/// attempt bound or the deadline outside dropped it), else cancelled (a hedge that lost, a
/// caller that let go).
fn dropped_end(call: &Call) -> End {
    let timed_out = call.expires.is_some_and(|at| Instant::now() >= at);
    match (call.grpc, timed_out) {
        (true, true) => End::Grpc(4),
        (true, false) => End::Grpc(1),
        (false, true) => End::HttpError("timeout"),
        (false, false) => End::HttpError("cancelled"),
    }
}

fn grpc_code(headers: &HeaderMap) -> Option<u32> {
    let value = headers.get(GRPC_STATUS)?;
    Some(
        value
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2),
    )
}

/// How a call that failed with `err` ended: for gRPC, the status gRPC's clients give it (a
/// local failure's own, [`Rejection::grpc_code`](crate::Rejection::grpc_code): 4 for
/// either timeout, 14 for a refusal; 14 for a transport error); for HTTP, its low-cardinality
/// class (`timeout`, `breaker_open`, `throttled`, `bulkhead_full`, else `_OTHER`).
fn error_end(grpc: bool, err: &(dyn std::error::Error + 'static)) -> End {
    use crate::Rejection;
    let rejection = Rejection::of(err);
    if grpc {
        return End::Grpc(rejection.map_or(14, |r| r.grpc_code().as_i32() as u32));
    }
    End::HttpError(match rejection {
        Some(Rejection::DeadlineExceeded | Rejection::AttemptTimedOut) => "timeout",
        Some(Rejection::BreakerOpen { .. }) => "breaker_open",
        Some(Rejection::ClientThrottled) => "throttled",
        Some(Rejection::BulkheadFull) => "bulkhead_full",
        _ => "_OTHER",
    })
}

impl<S, B, RB> Service<Request<B>> for Semconv<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<SemconvBody<RB>>;
    type Error = BoxError;
    type Future = SemconvFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let call = Call::of(&req, self.server.as_ref());
        SemconvFuture {
            future: self.inner.call(req),
            call: Some(call),
        }
    }
}

// The response future and body of `Semconv`: public (they are in its `Service` impl) but
// unnameable, as only this crate names them.
mod future {
    use super::*;

    pin_project_lite::pin_project! {
        /// The response future of [`Semconv`].
        #[derive(Debug)]
        pub struct SemconvFuture<F> {
            #[pin]
            pub(super) future: F,
            pub(super) call: Option<Call>,
        }

        impl<F> PinnedDrop for SemconvFuture<F> {
            fn drop(this: Pin<&mut Self>) {
                // Dropped before its response: timed out or cancelled, still an attempt made.
                if let Some(call) = this.project().call.take() {
                    let end = dropped_end(&call);
                    call.record(end);
                }
            }
        }
    }

    impl<F, RB, E> Future for SemconvFuture<F>
    where
        F: Future<Output = Result<Response<RB>, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<Response<SemconvBody<RB>>, BoxError>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = self.project();
            let result = ready!(this.future.poll(cx)).map_err(Into::into);
            let call = this.call.take().expect("polled after completion");
            Poll::Ready(match result {
                Err(err) => {
                    let end = error_end(call.grpc, &*err);
                    call.record(end);
                    Err(err)
                }
                Ok(response) if !call.grpc => {
                    call.record(End::Http(response.status()));
                    Ok(response.map(|body| SemconvBody { body, call: None }))
                }
                Ok(response) => match grpc_code(response.headers()) {
                    // Trailers-only: the status is here.
                    Some(code) => {
                        call.record(End::Grpc(code));
                        Ok(response.map(|body| SemconvBody { body, call: None }))
                    }
                    // Not a gRPC answer (a proxy's error page): the status gRPC's clients give it.
                    None if response.status() != http::StatusCode::OK => {
                        let code = crate::Code::of_http_status(response.status());
                        call.record(End::Grpc(code.as_i32() as u32));
                        Ok(response.map(|body| SemconvBody { body, call: None }))
                    }
                    None => Ok(response.map(|body| SemconvBody {
                        body,
                        call: Some(call),
                    })),
                },
            })
        }
    }

    pin_project_lite::pin_project! {
        /// The response body of [`Semconv`]: a gRPC call's body, timed until its trailers.
        #[derive(Debug)]
        pub struct SemconvBody<B> {
            #[pin]
            pub(super) body: B,
            pub(super) call: Option<Call>,
        }

        impl<B> PinnedDrop for SemconvBody<B> {
            fn drop(this: Pin<&mut Self>) {
                // Dropped before its status: cancelled by its caller.
                if let Some(call) = this.project().call.take() {
                    call.record(End::Grpc(1));
                }
            }
        }
    }

    impl<B: Body> Body for SemconvBody<B> {
        type Data = B::Data;
        type Error = B::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
            let mut this = self.project();
            let frame = ready!(this.body.as_mut().poll_frame(cx));
            if this.call.is_some() {
                let end = match &frame {
                    Some(Ok(frame)) => frame.trailers_ref().map(|t| grpc_code(t).unwrap_or(2)),
                    // A stream that failed: UNAVAILABLE, as gRPC's clients report a broken stream
                    // (or what the error says it is).
                    Some(Err(_)) => Some(14),
                    // Ended with no trailers: the status is missing, UNKNOWN.
                    None => Some(2),
                }
                // The last data frame of a stream that says no trailers follow: UNKNOWN now, so
                // a reader that stops at the end does not record a cancel.
                .or_else(|| this.body.is_end_stream().then_some(2));
                if let Some(code) = end {
                    this.call
                        .take()
                        .expect("checked above")
                        .record(End::Grpc(code));
                }
            }
            Poll::Ready(frame)
        }

        fn is_end_stream(&self) -> bool {
            self.body.is_end_stream()
        }

        fn size_hint(&self) -> http_body::SizeHint {
            self.body.size_hint()
        }
    }
}
use future::{SemconvBody, SemconvFuture};
