//! The server side: [`DeadlineLayer`] reads the caller's deadline, enforces it, and hands it
//! to the handler. Its configuration and the rules that turn a request's headers into a
//! deadline live here, next to each other; the service and its future are in their own files.

mod future;
mod service;

pub use future::ResponseFuture;
pub use service::DeadlineService;

#[cfg(feature = "metrics")]
use crate::deadline::meter::ServerMeters;
pub(crate) use crate::deadline::meter::{Meter, count_expired};

use crate::deadline::Deadline;
use crate::deadline::head::{Head, min_opt};
use crate::wire::grpc_timeout::MalformedTimeout;
use crate::{ConfigError, Rejection};
use http::{HeaderMap, HeaderName, HeaderValue};
#[cfg(feature = "metrics")]
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tower_layer::Layer;

/// Largest accepted `lead`: it is a safety margin, not a budget.
const MAX_LEAD: Duration = Duration::from_secs(1);
/// The paths a layer's metrics name, by default: the admission layer's models.
const DEFAULT_ROUTES: usize = 16;

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
    /// `backstop.deadline.expired{side="server"}`, per route.
    #[cfg(feature = "metrics")]
    pub(crate) expired: Arc<ServerMeters>,
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
                #[cfg(feature = "metrics")]
                expired: Arc::new(ServerMeters::new(DEFAULT_ROUTES)),
            },
        }
    }

    /// A builder for a tuned `DeadlineLayer`.
    pub fn builder() -> DeadlineLayerBuilder {
        DeadlineLayerBuilder {
            config: Self::new().config,
            millis_header: None,
            routes: DEFAULT_ROUTES,
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
/// use backstop::deadline::DeadlineLayer;
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
    routes: usize,
}

impl DeadlineLayerBuilder {
    /// The longest deadline this server grants: a longer `grpc-timeout` is clamped to it.
    /// Without one, any value the header can say is taken (up to `99999999H`, read as about
    /// 30 years: the most tokio's clock holds). backstop's `server()` preset caps at 1 hour.
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

    /// How many routes the layer's metrics name (default 16, 1..=1024), as the admission
    /// layer keys its models: a request's path (for gRPC, `/package.Service/Method`) is hashed
    /// into one of `routes` slots, the first path there holds it and labels the slot's
    /// `backstop.deadline.expired{side="server"}` series with `route`; a path whose slot
    /// another holds is counted without `route`. So a server's series are bounded whatever
    /// paths its clients send. Raise it for a service with many routes.
    #[must_use]
    pub fn routes(mut self, routes: usize) -> Self {
        self.routes = routes;
        self
    }

    /// Validates the configuration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the knob when:
    /// - `routes` is not in 1..=1024;
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
        if !(1..=1024).contains(&self.routes) {
            return Err(ConfigError::new(
                "routes",
                format!("must be in 1..=1024, got {}", self.routes),
            ));
        }
        #[cfg(feature = "metrics")]
        {
            config.expired = Arc::new(ServerMeters::new(self.routes));
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
            if header == crate::wire::grpc::GRPC_TIMEOUT {
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

impl InboundConfig {
    /// The timeout the request asks for: the shortest of every `grpc-timeout` value and the
    /// milliseconds header. `Err` when one is malformed and malformed input is rejected.
    fn requested(&self, head: &Head, headers: &HeaderMap) -> Result<Option<Duration>, Rejection> {
        let mut timeout = head.timeout;
        let mut malformed = head.malformed;
        if let Some(name) = &self.millis_header {
            for value in headers.get_all(name) {
                match parse_millis(value) {
                    Ok(t) => timeout = Some(min_opt(timeout, t)),
                    Err(_) => malformed = true,
                }
            }
        }
        if malformed && self.reject_malformed {
            return Err(Rejection::MalformedTimeout);
        }
        Ok(timeout)
    }

    /// The request's deadline as this server grants it, or the rejection to answer at once.
    pub(crate) fn deadline(
        &self,
        now: Instant,
        head: &Head,
        headers: &HeaderMap,
    ) -> Result<Option<Deadline>, Rejection> {
        let timeout = match self.requested(head, headers)? {
            Some(t) => Some(t.saturating_sub(self.lead)),
            None => self.default,
        };
        let Some(timeout) = timeout.map(|t| self.max.map_or(t, |max| t.min(max))) else {
            return Ok(None);
        };
        if timeout.is_zero() || timeout < self.min_remaining {
            return Err(Rejection::DeadlineExceeded);
        }
        Ok(Some(Deadline::after_from(now, timeout)))
    }
}

/// A timeout in decimal milliseconds: 1–19 ASCII digits.
fn parse_millis(value: &HeaderValue) -> Result<Duration, MalformedTimeout> {
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > 19 || !bytes.iter().all(u8::is_ascii_digit) {
        return Err(MalformedTimeout::new());
    }
    let n = bytes.iter().fold(0u64, |n, &b| {
        n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    });
    Ok(Duration::from_millis(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_header_grammar() {
        let ok = |s: &'static str| parse_millis(&HeaderValue::from_static(s));
        assert_eq!(ok("0"), Ok(Duration::ZERO));
        assert_eq!(ok("250"), Ok(Duration::from_millis(250)));
        assert_eq!(ok("0000250"), Ok(Duration::from_millis(250)));
        assert_eq!(
            ok("9999999999999999999"),
            Ok(Duration::from_millis(9_999_999_999_999_999_999))
        );
        for bad in ["", "-1", "1.5", "1s", " 1", "99999999999999999999"] {
            assert!(ok(bad).is_err(), "{bad:?}");
        }
    }
}
