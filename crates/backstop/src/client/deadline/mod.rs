//! The client side: [`PropagateDeadlineLayer`] sends the time really left in `grpc-timeout` and
//! bounds the call by it. Its configuration and the rule that picks the call's deadline live
//! here; the service and its future are in their own files.

mod future;
mod service;

pub(crate) use future::PropagateFuture;
pub use service::PropagateDeadline;

use crate::ConfigError;
use crate::deadline::Deadline;
use crate::deadline::head::Head;
use crate::deadline::scope::current;
use crate::deadline::value::{FAR_FUTURE, scale};
use http::Request;
use std::{sync::Arc, time::Duration};
use tokio::time::Instant;
use tower_layer::Layer;

/// The longest `offset` or `min_remaining` a client may keep back: more would leave no call
/// with time to run under any realistic deadline.
const MAX_MARGIN: Duration = Duration::from_secs(60);

/// Propagates the deadline to an outbound call as the remaining time, and enforces it.
///
/// See the [crate docs](crate#outbound-propagatedeadlinelayer). Build one with
/// [`PropagateDeadlineLayer::new`] (inherit only) or [`PropagateDeadlineLayer::builder`].
#[derive(Debug, Clone)]
pub struct PropagateDeadlineLayer {
    pub(crate) config: OutboundConfig,
    pub(crate) name: Arc<Named>,
}

/// The dependency's name and, with the `metrics` feature, its `backstop.deadline.expired`
/// counter (registered on the first call that needs it), shared by the layer's services.
#[derive(Debug, Default)]
pub(crate) struct Named {
    pub(crate) name: crate::rt::DependencyName,
    #[cfg(feature = "metrics")]
    expired: std::sync::OnceLock<metrics::Counter>,
}

impl Named {
    /// The state of a layer named `name` (its counter registered on first use).
    fn new(name: &str) -> Self {
        Self {
            name: crate::rt::DependencyName::new(name),
            #[cfg(feature = "metrics")]
            expired: std::sync::OnceLock::new(),
        }
    }

    /// The client side's expiry counter.
    #[cfg(feature = "metrics")]
    pub(crate) fn expired(&self) -> &metrics::Counter {
        self.expired.get_or_init(|| {
            use crate::metrics as names;
            crate::rt::metrics::describe();
            metrics::counter!(
                names::DEADLINE_EXPIRED,
                "side" => "client",
                "dependency" => self.name.get().to_owned()
            )
        })
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct OutboundConfig {
    pub(crate) timeout: Option<Duration>,
    pub(crate) fraction: Option<f64>,
    pub(crate) offset: Duration,
    pub(crate) min_remaining: Duration,
    /// Whether this layer writes `grpc-timeout`; see
    /// [`PropagateDeadlineLayer::send_grpc_timeout`].
    pub(crate) send_header: bool,
}

impl PropagateDeadlineLayer {
    /// Inherits the deadline (the handler's [`current()`](crate::deadline::current), the request's
    /// extension, or a `grpc-timeout` already on the request) and adds no limit of its own.
    pub fn new() -> Self {
        Self {
            config: OutboundConfig {
                timeout: None,
                fraction: None,
                offset: Duration::ZERO,
                min_remaining: Duration::ZERO,
                send_header: true,
            },
            name: Arc::default(),
        }
    }

    /// This layer's configuration for the dependency `name`: with the `metrics` feature, its
    /// expired deadlines are counted as `backstop.deadline.expired{side="client", dependency}`.
    /// Naming is configuration, done before the layer serves; the layers cloned before keep
    /// their name.
    ///
    /// ```
    /// use backstop::deadline::PropagateDeadlineLayer;
    ///
    /// let layer = PropagateDeadlineLayer::new().named("inventory");
    /// assert_eq!(layer.name(), "inventory");
    /// ```
    #[must_use]
    pub fn named(&self, name: &str) -> Self {
        Self {
            config: self.config,
            name: Arc::new(Named::new(name)),
        }
    }

    /// The dependency's name (`""` when unnamed).
    pub fn name(&self) -> &str {
        self.name.name.get()
    }

    /// The same layer (same configuration, same name), writing the `grpc-timeout` header or
    /// not: how the presets build theirs (see the builder's `send_grpc_timeout`).
    #[must_use]
    pub(crate) fn send_grpc_timeout(&self, send: bool) -> Self {
        Self {
            config: OutboundConfig {
                send_header: send,
                ..self.config
            },
            name: self.name.clone(),
        }
    }

    /// Whether the calls tell the server their deadline in `grpc-timeout` (see
    /// [`send_grpc_timeout`](PropagateDeadlineLayerBuilder::send_grpc_timeout)). backstop's client presets read it
    /// when they build the stack: their attempt bound writes each attempt's header only when
    /// this says so.
    pub fn sends_grpc_timeout(&self) -> bool {
        self.config.send_header
    }

    /// What this layer keeps back from the time it tells the server; see
    /// [`PropagateDeadlineLayerBuilder::offset`].
    pub fn offset(&self) -> Duration {
        self.config.offset
    }

    /// A builder for a tuned `PropagateDeadlineLayer`.
    pub fn builder() -> PropagateDeadlineLayerBuilder {
        PropagateDeadlineLayerBuilder {
            config: Self::new().config,
        }
    }
}

impl Default for PropagateDeadlineLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for PropagateDeadlineLayer {
    type Service = PropagateDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PropagateDeadline::from_config(inner, self.config, self.name.clone())
    }
}

/// Builds a [`PropagateDeadlineLayer`]; every knob is optional.
///
/// ```
/// use backstop::deadline::PropagateDeadlineLayer;
/// use std::time::Duration;
///
/// // Each call gets at most 300 ms and at most half of what its caller has left, and tells
/// // the server 5 ms less than that to cover the network.
/// let layer = PropagateDeadlineLayer::builder()
///     .timeout(Duration::from_millis(300))
///     .fraction(0.5)
///     .offset(Duration::from_millis(5))
///     .min_remaining(Duration::from_millis(10))
///     .build()
///     .unwrap();
/// # let _ = layer;
///
/// let err = PropagateDeadlineLayer::builder().fraction(1.5).build().unwrap_err();
/// assert_eq!(err.to_string(), "invalid `fraction`: must be in (0, 1], got 1.5");
/// ```
#[derive(Debug, Clone)]
pub struct PropagateDeadlineLayerBuilder {
    config: OutboundConfig,
}

impl PropagateDeadlineLayerBuilder {
    /// A limit for each call of its own: the call's deadline is at most `now + timeout`, even
    /// with no inherited deadline.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = Some(timeout);
        self
    }

    /// Gives each call at most this share, in (0, 1], of the inherited deadline's remaining
    /// time, keeping the rest for the caller's own work (or a retry).
    #[must_use]
    pub fn fraction(mut self, fraction: f64) -> Self {
        self.config.fraction = Some(fraction);
        self
    }

    /// Subtracted from the remaining time written in `grpc-timeout`, to cover the network, so
    /// the server gives up before the caller does.
    #[must_use]
    pub fn offset(mut self, offset: Duration) -> Self {
        self.config.offset = offset;
        self
    }

    /// Whether the layer writes `grpc-timeout` (default `true`).
    ///
    /// Without it the server is told nothing by this layer, and a `grpc-timeout` the caller
    /// put on the request is removed (it was read into the deadline; passed on, it could say
    /// more time than the call has). The call is still bounded by its deadline, and the
    /// deadline travels on the request as a [`Deadline`] extension for the layers inside. For
    /// calls to third-party HTTP APIs, which have no business knowing your internal deadlines.
    /// (The client presets build theirs without it too: their attempt bound writes each
    /// attempt's header instead, the shorter of its own bound and this deadline less
    /// [`offset`](Self::offset).)
    ///
    /// With the header on (the default), a [`Deadline`] extension the caller put on the
    /// request is replaced by the deadline this layer picked, so layers inside never read
    /// more time than the call has.
    ///
    /// ```
    /// use backstop::deadline::{Deadline, PropagateDeadlineLayer};
    /// use http::{Request, Response};
    /// use std::time::Duration;
    /// use tower::{ServiceBuilder, ServiceExt, service_fn};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), backstop::BoxError> {
    /// let layer = PropagateDeadlineLayer::builder()
    ///     .timeout(Duration::from_millis(300))
    ///     .send_grpc_timeout(false)
    ///     .build()?;
    /// let svc = ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service(service_fn(|req: Request<String>| {
    ///         // No header, not even the caller's, but the deadline is on the request.
    ///         assert!(req.headers().get("grpc-timeout").is_none());
    ///         assert!(req.extensions().get::<Deadline>().is_some());
    ///         async { Ok::<_, backstop::BoxError>(Response::new(String::new())) }
    ///     }));
    /// let request = Request::builder().header("grpc-timeout", "10S").body(String::new())?;
    /// svc.oneshot(request).await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn send_grpc_timeout(mut self, send: bool) -> Self {
        self.config.send_header = send;
        self
    }

    /// Fails at once with DEADLINE_EXCEEDED, without sending, when less than this is left.
    #[must_use]
    pub fn min_remaining(mut self, min_remaining: Duration) -> Self {
        self.config.min_remaining = min_remaining;
        self
    }

    /// Validates the configuration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the knob when:
    /// - `timeout` is zero;
    /// - `fraction` is not in (0, 1] (NaN included);
    /// - `offset` or `min_remaining` is not shorter than `timeout` (no call could be sent), or
    ///   longer than 1 min.
    pub fn build(self) -> Result<PropagateDeadlineLayer, ConfigError> {
        let config = self.config;
        if config.timeout.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::new("timeout", "must be greater than zero"));
        }
        if let Some(f) = config.fraction.filter(|f| !(*f > 0.0 && *f <= 1.0)) {
            return Err(ConfigError::new(
                "fraction",
                format!("must be in (0, 1], got {f}"),
            ));
        }
        for (knob, value) in [
            ("offset", config.offset),
            ("min_remaining", config.min_remaining),
        ] {
            if value > MAX_MARGIN {
                return Err(ConfigError::new(
                    knob,
                    format!(
                        "must be at most 1 min (time kept back for the network and the reply), got {value:?}"
                    ),
                ));
            }
        }
        if let Some(timeout) = config.timeout {
            for (knob, value) in [
                ("offset", config.offset),
                ("min_remaining", config.min_remaining),
            ] {
                if value >= timeout {
                    return Err(ConfigError::new(
                        knob,
                        format!(
                            "{value:?} is not shorter than `timeout` ({timeout:?}): no call could be sent"
                        ),
                    ));
                }
            }
        }
        Ok(PropagateDeadlineLayer {
            config,
            name: Arc::default(),
        })
    }
}
fn min_deadline(a: Option<Deadline>, b: Deadline) -> Deadline {
    a.map_or(b, |a| a.min(b))
}

impl OutboundConfig {
    /// The call's effective deadline and the time left until it: the earliest of the
    /// current deadline (the scope being polled), the request's extension, a `grpc-timeout` the caller already set,
    /// `now + fraction × remaining` and `now + timeout`. Candidates given as durations are
    /// compared as durations, so the common case (only this layer's `timeout`) does no instant
    /// arithmetic but the one addition.
    pub(crate) fn deadline<B>(
        &self,
        now: Instant,
        head: &Head,
        req: &Request<B>,
    ) -> Option<(Deadline, Duration)> {
        let mut inherited = current();
        if let Some(&d) = req.extensions().get::<Deadline>() {
            inherited = Some(min_deadline(inherited, d));
        }
        let mut best = inherited.map(|d| (d, d.remaining_at(now)));
        // A deadline `t` from now, if earlier than the best so far.
        let offer = |best: &mut Option<(Deadline, Duration)>, t: Duration| {
            let t = t.min(FAR_FUTURE);
            if best.is_none_or(|(_, left)| t < left) {
                *best = Some((Deadline::after_from(now, t), t));
            }
        };
        if let Some(t) = head.timeout {
            offer(&mut best, t);
        }
        if let (Some(fraction), Some((_, left))) = (self.fraction, best) {
            offer(&mut best, scale(left, fraction));
        }
        if let Some(timeout) = self.timeout {
            offer(&mut best, timeout);
        }
        best
    }
}
