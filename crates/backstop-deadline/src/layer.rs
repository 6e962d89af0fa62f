use crate::{DeadlineService, PropagateDeadline};
use backstop_core::ConfigError;
use http::HeaderName;
use std::{sync::Arc, time::Duration};
use tower_layer::Layer;

/// Largest accepted `lead`: it is a safety margin, not a budget.
const MAX_LEAD: Duration = Duration::from_secs(1);
/// The longest `offset` or `min_remaining` a client may keep back: more would leave no call
/// with time to run under any realistic deadline.
const MAX_MARGIN: Duration = Duration::from_secs(60);

/// Reads the caller's deadline on a server, enforces it, and hands it to the handler.
///
/// See the [crate docs](crate#inbound-deadlinelayer) for exactly what it does. Build one with
/// [`DeadlineLayer::new`] (defaults) or [`DeadlineLayer::builder`].
#[derive(Debug, Clone)]
pub struct DeadlineLayer {
    pub(crate) config: InboundConfig,
}

#[derive(Debug, Clone)]
pub(crate) struct InboundConfig {
    pub(crate) max: Option<Duration>,
    pub(crate) default: Option<Duration>,
    pub(crate) min_remaining: Duration,
    pub(crate) millis_header: Option<HeaderName>,
    pub(crate) reject_malformed: bool,
    pub(crate) lead: Duration,
}

impl DeadlineLayer {
    /// The default lead: 1 ms.
    pub const DEFAULT_LEAD: Duration = Duration::from_millis(1);

    /// Reads `grpc-timeout`, rejects a malformed one, and applies no `max`, no `default` and no
    /// `min_remaining`; `lead` is [`DEFAULT_LEAD`](Self::DEFAULT_LEAD).
    pub fn new() -> Self {
        Self {
            config: InboundConfig {
                max: None,
                default: None,
                min_remaining: Duration::ZERO,
                millis_header: None,
                reject_malformed: true,
                lead: Self::DEFAULT_LEAD,
            },
        }
    }

    /// A builder for a tuned `DeadlineLayer`.
    pub fn builder() -> DeadlineLayerBuilder {
        DeadlineLayerBuilder {
            config: Self::new().config,
            millis_header: None,
        }
    }
}

impl Default for DeadlineLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = DeadlineService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService::from_config(inner, self.config.clone())
    }
}

/// Builds a [`DeadlineLayer`]; every knob is optional.
///
/// ```
/// use backstop_deadline::DeadlineLayer;
/// use std::time::Duration;
///
/// let layer = DeadlineLayer::builder()
///     .max(Duration::from_secs(10))
///     .default_timeout(Duration::from_secs(2))
///     .min_remaining(Duration::from_millis(5))
///     .millis_header("x-envoy-expected-rq-timeout-ms")
///     .build()
///     .unwrap();
/// # let _ = layer;
///
/// let err = DeadlineLayer::builder()
///     .max(Duration::from_secs(1))
///     .default_timeout(Duration::from_secs(2))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.knob(), "default_timeout");
/// ```
#[derive(Debug, Clone)]
pub struct DeadlineLayerBuilder {
    config: InboundConfig,
    millis_header: Option<String>,
}

impl DeadlineLayerBuilder {
    /// The longest deadline this server grants: a longer `grpc-timeout` is clamped to it.
    #[must_use]
    pub fn max(mut self, max: Duration) -> Self {
        self.config.max = Some(max);
        self
    }

    /// The deadline for requests that carry none.
    #[must_use]
    pub fn default_timeout(mut self, default: Duration) -> Self {
        self.config.default = Some(default);
        self
    }

    /// Rejects a request at once (DEADLINE_EXCEEDED / 504, without calling the service) when
    /// less than this is left of its deadline on arrival.
    #[must_use]
    pub fn min_remaining(mut self, min_remaining: Duration) -> Self {
        self.config.min_remaining = min_remaining;
        self
    }

    /// Also reads a timeout in decimal milliseconds from this header, such as Envoy's
    /// `x-envoy-expected-rq-timeout-ms`. When both it and `grpc-timeout` are present the shorter
    /// wins.
    #[must_use]
    pub fn millis_header(mut self, name: &str) -> Self {
        self.millis_header = Some(name.to_owned());
        self
    }

    /// Treats a malformed timeout header as absent instead of rejecting the request
    /// (INTERNAL "malformed grpc-timeout" / 400 by default).
    #[must_use]
    pub fn ignore_malformed(mut self) -> Self {
        self.config.reject_malformed = false;
        self
    }

    /// How much earlier than the caller's header says this server gives up (default 1 ms,
    /// at most 1 s; applies only to deadlines read from headers).
    ///
    /// The margin makes this layer's own answer (DEADLINE_EXCEEDED) reach the client before a
    /// transport's timer does: tonic's server arms its own `grpc-timeout` timer a moment before
    /// this layer sees the request and answers CANCELLED when it fires. With a lead at least as
    /// long as that moment, this layer's timer fires first (or in the same timer tick, where it
    /// is polled first), so the client sees 4, not 1.
    #[must_use]
    pub fn lead(mut self, lead: Duration) -> Self {
        self.config.lead = lead;
        self
    }

    /// Validates the configuration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the knob when:
    /// - `max` or `default_timeout` is zero;
    /// - `default_timeout` is longer than `max`;
    /// - `min_remaining` is not shorter than `max` or than `default_timeout` (every request
    ///   would be rejected);
    /// - `lead` is longer than 1 s;
    /// - `millis_header` is not a valid header name, or is `grpc-timeout`.
    pub fn build(self) -> Result<DeadlineLayer, ConfigError> {
        let mut config = self.config;
        if config.max.is_some_and(|m| m.is_zero()) {
            return Err(ConfigError::new("max", "must be greater than zero"));
        }
        if let Some(default) = config.default {
            if default.is_zero() {
                return Err(ConfigError::new(
                    "default_timeout",
                    "must be greater than zero",
                ));
            }
            if let Some(max) = config.max.filter(|&max| default > max) {
                return Err(ConfigError::new(
                    "default_timeout",
                    format!("{default:?} is longer than `max` ({max:?})"),
                ));
            }
        }
        for (knob, limit) in [("max", config.max), ("default_timeout", config.default)] {
            if let Some(limit) = limit.filter(|&l| config.min_remaining >= l) {
                return Err(ConfigError::new(
                    "min_remaining",
                    format!(
                        "{:?} is not shorter than `{knob}` ({limit:?}): every request would be rejected",
                        config.min_remaining
                    ),
                ));
            }
        }
        if config.lead > MAX_LEAD {
            return Err(ConfigError::new(
                "lead",
                format!("{:?} is longer than 1s", config.lead),
            ));
        }
        if let Some(name) = self.millis_header {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                ConfigError::new(
                    "millis_header",
                    format!("{name:?} is not a valid header name"),
                )
            })?;
            if header == backstop_core::grpc::GRPC_TIMEOUT {
                return Err(ConfigError::new(
                    "millis_header",
                    "grpc-timeout is always read; name another header",
                ));
            }
            config.millis_header = Some(header);
        }
        Ok(DeadlineLayer { config })
    }
}

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
    pub(crate) name: backstop_core::DependencyName,
    #[cfg(feature = "metrics")]
    expired: std::sync::OnceLock<metrics::Counter>,
}

impl Named {
    /// The client side's expiry counter.
    #[cfg(feature = "metrics")]
    pub(crate) fn expired(&self) -> &metrics::Counter {
        self.expired.get_or_init(|| {
            use backstop_core::metrics as names;
            names::describe();
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
}

impl PropagateDeadlineLayer {
    /// Inherits the deadline (task-local, request extension, or a `grpc-timeout` already on the
    /// request) and adds no limit of its own.
    pub fn new() -> Self {
        Self {
            config: OutboundConfig {
                timeout: None,
                fraction: None,
                offset: Duration::ZERO,
                min_remaining: Duration::ZERO,
            },
            name: Arc::default(),
        }
    }

    /// Names the dependency: with the `metrics` feature, its expired deadlines are counted as
    /// `backstop.deadline.expired{side="client", dependency}` (unnamed: `""`).
    ///
    /// # Errors
    ///
    /// When the layer already has another name.
    pub fn set_name(&self, name: &str) -> Result<(), ConfigError> {
        self.name.name.set(name)
    }

    /// The dependency's name (`""` when unnamed).
    pub fn name(&self) -> &str {
        self.name.name.get()
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
/// use backstop_deadline::PropagateDeadlineLayer;
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
