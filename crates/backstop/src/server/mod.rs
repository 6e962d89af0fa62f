//! The server preset: the inbound stack as one layer.

pub mod admission;
pub(crate) mod deadline;
pub mod pushback;

use crate::deadline::{DeadlineLayer, DeadlineService};
use crate::server::admission::{Admission, AdmissionLayer};
use crate::server::pushback::{Pushback, PushbackLayer};
use std::time::Duration;
use tower_layer::Layer;

/// The server stack as one layer: `Deadline → Admission → Pushback → your service`.
///
/// [`DeadlineLayer`] reads the caller's `grpc-timeout`, exposes the deadline to handlers and
/// cancels them when it passes; [`AdmissionLayer`] refuses at once (DEADLINE_EXCEEDED, HTTP
/// 504), without calling the handler, a request whose remaining deadline is below its
/// route's measured median handler latency ([deadline-aware
/// admission](crate::server::admission)); [`PushbackLayer`] tells callers not to retry
/// when this service's own retries gave up. Keeps `Error = S::Error`, so it fits
/// `tonic::transport::Server::layer` and `axum::Router::layer` as is.
///
/// A caller always gets one whole answer: the handler's, or the 504 (gRPC:
/// DEADLINE_EXCEEDED), never a torn one. A handler that answers in time, even at its
/// deadline's instant, has its body delivered whole if it is complete (axum's `String`,
/// `Json`, `Bytes`; a tonic unary answer), though hyper reads it after the deadline; only a
/// body still streaming past the deadline is cut, with DEADLINE_EXCEEDED trailers (gRPC) or by
/// resetting the stream (HTTP: the only way to say a streamed body is incomplete). The rule,
/// and why: [the deadline module's docs](crate::deadline#response-bodies).
///
/// # Admission, on by default
///
/// With its defaults ([`AdmissionLayer::new`]: the p50 of each route's handler latency over
/// 30 s, trusted from 100 answers, admitting everything until then), admission refuses only a
/// request whose caller gave it less time than half of this route's requests take (each of 16
/// models measures one route; a route that finds its model held by another is admitted): most of
/// those would be cancelled by their deadline part-way through, and the work would go to
/// nobody. A request without a deadline is always admitted. It needs no number only the user
/// knows, so the preset turns it on; [`admission`](Self::admission) tunes it (more
/// routes keep more models) or turns it off
/// ([`AdmissionLayer::off`]). A least time every request must have left, measured or not, is
/// the deadline layer's `min_remaining`.
///
/// The admission layer's [`routes`](crate::server::admission::AdmissionLayerBuilder::routes)
/// also bound the `route` label of the deadline layer's `backstop.deadline.expired` series:
/// the preset gives its deadline layer as many route slots as its admission layer has,
/// whichever of [`deadline`](Self::deadline) and [`admission`](Self::admission) is set last.
///
/// # Carrying the deadline into a handler's calls
///
/// While the handler runs, its deadline is [`current()`](crate::deadline::current): a
/// client call made in the handler's task picks it up, whatever the handler then does with
/// the call's future. Two ways out of that task need a word from the handler:
///
/// - **A spawned task** starts with no deadline (the current deadline is set only while the
///   handler's future is polled, so it does not follow `tokio::spawn` or a `JoinSet`): wrap the future in
///   [`with_current_deadline()`](crate::deadline::DeadlineFutureExt::with_current_deadline)
///   where it is built, in the handler.
/// - **A client whose `call` runs on another task** (a `Buffer` around it) does not see the
///   handler's scope: put the deadline on the request, `req.extensions_mut().insert(deadline)`.
///   A `Buffer` inside the client preset (a tonic `Channel`) needs nothing.
///
/// Either way the server answers at its deadline; without them the call goes out with only
/// its own timeouts.
///
/// # Request bodies
///
/// The preset does not bound request bodies: the well-kept layers for that sit beside it.
/// tonic bounds each message (`max_decoding_message_size`, 4 MiB by default); axum's
/// extractors read at most `DefaultBodyLimit` (2 MB by default); for a hyper service, or a
/// handler that streams its body, put tower-http's `RequestBodyLimitLayer` inside the preset,
/// so a body declared or streamed over the limit is answered 413 and the deadline still
/// bounds the rest:
///
/// ```ignore
/// let app = axum::Router::new().route("/upload", post(upload)).layer(
///     tower::ServiceBuilder::new()
///         .layer(backstop::server())
///         .layer(tower_http::limit::RequestBodyLimitLayer::new(1 << 20)),
/// );
/// ```
///
/// (The loopback test `a_body_limit_beside_the_server_preset_answers_413_and_keeps_the_deadline`
/// runs this with a real axum server.)
///
/// ```
/// use backstop::prelude::*;
/// use http::{Request, Response};
/// use std::convert::Infallible;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // A dependency that says which grpc-timeout it was sent.
/// let dependency = service_fn(|req: Request<ReplayBody<String>>| async move {
///     let mut response = Response::new(String::new());
///     if let Some(told) = req.headers().get("grpc-timeout") {
///         response.headers_mut().insert("told", told.clone());
///     }
///     Ok::<_, Infallible>(response)
/// });
/// let client = ServiceBuilder::new()
///     .layer(backstop::client::http().build().expect("the defaults are valid"))
///     .service(dependency);
/// let handler = service_fn(move |_req: Request<String>| {
///     let client = client.clone();
///     async move {
///         // Called on a task of its own, with the handler's deadline carried along.
///         let call = client.oneshot(Request::new(String::new())).with_current_deadline();
///         let response = tokio::spawn(call).await.unwrap().unwrap();
///         let mut answer = Response::new(String::new());
///         *answer.headers_mut() = response.headers().clone();
///         Ok::<_, Infallible>(answer)
///     }
/// });
/// let server = ServiceBuilder::new().layer(backstop::server()).service(handler);
/// let request = Request::builder().header("grpc-timeout", "2S").body(String::new()).unwrap();
/// let response = server.oneshot(request).await.unwrap();
/// // What is left of the 2 s (less the server's 1 ms lead, the attempt's share of it, rounded
/// // down); without `with_current_deadline` the spawned call would be sent its attempt
/// // bound alone.
/// let told = response.headers()["told"].to_str().unwrap();
/// let ms: u64 = told.strip_suffix('m').unwrap().parse().unwrap();
/// assert!((1_000..2_000).contains(&ms), "{told}");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ServerLayer {
    deadline: DeadlineLayer,
    admission: AdmissionLayer,
}

/// The preset: [`DeadlineLayer`] with no default timeout and a cap of **1 hour**,
/// [`AdmissionLayer::new`] and [`PushbackLayer`].
///
/// The cap: a caller's `grpc-timeout` longer than an hour is read as an hour. The header can
/// say up to `99999999H` (11 000 years); an uncapped server takes that as "about 30 years"
/// (the most tokio's clock holds), which is a deadline in name only: a handler that hangs
/// holds its task and its memory for good. An hour keeps every real deadline (a unary call's
/// is seconds; a watch stream meant to outlive an hour sets none, or is served by a layer
/// built with another cap) and turns a bogus one into a bound. Requests without a deadline
/// get none. Another cap: `.deadline(DeadlineLayer::builder().max(..).build()?)`;
/// [`DeadlineLayer::new()`] has none.
///
/// ```
/// use backstop::deadline::current;
/// use http::{Request, Response};
/// use std::convert::Infallible;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let server = ServiceBuilder::new().layer(backstop::server()).service(service_fn(|_req| async {
///     let left = current().expect("the request said 99999999H").remaining();
///     let response = Response::builder().header("left-s", left.as_secs()).body(()).unwrap();
///     Ok::<_, Infallible>(response)
/// }));
/// let request = Request::builder().header("grpc-timeout", "99999999H").body(()).unwrap();
/// let response = server.oneshot(request).await.unwrap();
/// // An hour (the cap applies after the server's 1 ms lead is taken off what was asked).
/// assert_eq!(response.headers()["left-s"], "3600");
/// # }
/// ```
pub fn server() -> ServerLayer {
    let admission = AdmissionLayer::new();
    ServerLayer {
        deadline: DeadlineLayer::builder()
            .max(MAX_DEADLINE)
            .build()
            .expect("the defaults are valid")
            .with_routes(admission.routes()),
        admission,
    }
}

/// The longest deadline [`server()`] grants.
const MAX_DEADLINE: Duration = Duration::from_secs(3600);

impl ServerLayer {
    /// Replaces the deadline layer (another `max`, a `default_timeout`, a `min_remaining`, a
    /// milliseconds header); its `max` replaces the preset's 1 hour cap. Its metrics name as
    /// many routes as the preset's admission layer keeps models.
    #[must_use]
    pub fn deadline(mut self, layer: DeadlineLayer) -> Self {
        self.deadline = layer.with_routes(self.admission.routes());
        self
    }

    /// Replaces deadline-aware admission (more routes), or turns it off
    /// with [`AdmissionLayer::off`]. Clones of one layer share its latency models: give each
    /// server (each set of routes) its own. The deadline layer's metrics follow its count of
    /// routes.
    ///
    /// ```
    /// use backstop::server::admission::AdmissionLayer;
    ///
    /// let server = backstop::server().admission(AdmissionLayer::builder().routes(64).build()?);
    /// # let _ = server;
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn admission(mut self, layer: AdmissionLayer) -> Self {
        self.deadline = self.deadline.with_routes(layer.routes());
        self.admission = layer;
        self
    }

    /// The admission layer, for the [`need`](AdmissionLayer::need) of a route.
    pub fn admission_layer(&self) -> &AdmissionLayer {
        &self.admission
    }
}

impl<S> Layer<S> for ServerLayer {
    type Service = DeadlineService<Admission<Pushback<S>>>;

    fn layer(&self, inner: S) -> Self::Service {
        let inner = self.admission.layer(PushbackLayer::new().layer(inner));
        self.deadline.layer(inner)
    }
}
