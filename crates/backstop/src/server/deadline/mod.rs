//! The server side: [`DeadlineLayer`] reads the caller's deadline, enforces it, and hands it
//! to the handler. Its configuration and the rules that turn a request's headers into a
//! deadline live here, next to each other; the service and its future are in their own files.

mod future;
mod service;

pub(crate) use future::ResponseFuture;
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

/// How much earlier than the caller's header says this server gives up: 1 ms, on deadlines
/// read from headers only. tonic's server arms its own `grpc-timeout` timer a moment before
/// this layer sees the request, and answers CANCELLED (1) when it fires; a deadline 1 ms
/// earlier than the header's makes this layer's timer fire first (or in the same timer tick,
/// where it is polled first), so the client sees DEADLINE_EXCEEDED (4). The moment between the
/// two is microseconds (a header parse and a poll), so 1 ms covers it with room, and costs a
/// handler 1 ms of a deadline that is at least milliseconds long (`grpc-timeout`'s finest
/// useful unit for a call over a network). The loopback tests
/// `the_servers_answer_beats_tonics_own_timer` and
/// `a_tonic_client_sees_deadline_exceeded_every_time_never_cancelled` run it against tonic.
pub(crate) const LEAD: Duration = Duration::from_millis(1);
/// The paths a layer's metrics name: the admission layer's default count of models. The
/// `server()` preset gives its deadline layer the count of its admission layer instead (see
/// [`ServerLayer`](crate::ServerLayer)), so one knob, `AdmissionLayerBuilder::routes`, bounds
/// the `route` values of both layers' series.
#[cfg(feature = "metrics")]
pub(crate) const DEFAULT_ROUTES: usize = 16;

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
    /// `backstop.deadline.expired{side="server"}`, per route.
    #[cfg(feature = "metrics")]
    pub(crate) expired: Arc<ServerMeters>,
}

impl DeadlineLayer {
    /// Reads `grpc-timeout`, rejects a malformed one, and applies no `max`, no `default` and no
    /// `min_remaining`. A deadline read from a header starts 1 ms earlier than the header
    /// says (the [crate docs](crate#inbound-deadlinelayer) say why).
    pub fn new() -> Self {
        Self {
            config: InboundConfig {
                max: None,
                default: None,
                min_remaining: Duration::ZERO,
                millis_header: None,
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
        }
    }

    /// The layer with its metrics' route slots counted again: `routes` of them (the
    /// `server()` preset gives it its admission layer's count).
    #[cfg(feature = "metrics")]
    pub(crate) fn with_routes(mut self, routes: usize) -> Self {
        self.config.expired = Arc::new(ServerMeters::new(routes));
        self
    }

    /// Without the `metrics` feature there are no route slots to count.
    #[cfg(not(feature = "metrics"))]
    pub(crate) fn with_routes(self, _routes: usize) -> Self {
        self
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
    /// less than this is left of its deadline on arrival: the least time any request of this
    /// server needs, whatever was measured. With deadline-aware
    /// [admission](crate::server::admission) inside (the `server()` preset), a request is so
    /// refused below the larger of this and its route's measured need; with admission off
    /// ([`AdmissionLayer::off`](crate::server::admission::AdmissionLayer::off)), this is a
    /// fixed need. Default 0: only a deadline already passed is refused.
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

    /// Validates the configuration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the knob when:
    /// - `max` or `default_timeout` is zero;
    /// - `default_timeout` is longer than `max`;
    /// - `min_remaining` is not shorter than `max` or than `default_timeout` (every request
    ///   would be rejected);
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
        // A malformed value is refused, as gRPC's own servers refuse it (INTERNAL): a caller
        // whose deadline cannot be read would otherwise run without the bound it asked for.
        if malformed {
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
            Some(t) => Some(t.saturating_sub(LEAD)),
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
