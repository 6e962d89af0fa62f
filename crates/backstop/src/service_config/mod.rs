//! gRPC's own service config: the JSON that grpc-go, grpc-java, grpc-dotnet and C-core (and so
//! Python's grpcio) read, with per-method retry, hedging and timeout policies (gRFC A6 and
//! gRPC's service-config document), read and validated as those clients do.
//!
//! The config is JSON in, as grpc-go's and grpc-java's channels take it: a [`ServiceConfig`] is
//! what [`from_json`](ServiceConfig::from_json) read and validated, and what
//! [`ClientBuilder::service_config`](crate::ClientBuilder::service_config) builds a client from.
//! Its parsed form is the crate's own (a field gRPC adds to the schema is then no breaking
//! change): what a call gets is stated below, and the client's layers tell what they do.
//!
//! ```
//! use backstop::service_config::ServiceConfig;
//!
//! let config = ServiceConfig::from_json(r#"{
//!   "methodConfig": [
//!     { "name": [{}], "timeout": "2s" },
//!     { "name": [{ "service": "bank.Accounts", "method": "GetBalance" }],
//!       "retryPolicy": { "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
//!                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"] } },
//!     { "name": [{ "service": "bank.Accounts", "method": "Charge" }] }
//!   ],
//!   "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
//! }"#)?;
//! // `GetBalance` is retried up to 4 attempts; `Charge` has an entry of its own, without a
//! // policy: never retried; anything else gets the default entry's 2 s.
//! let client = backstop::client::grpc().service_config(config)?;
//! # let _ = client;
//!
//! // A rule broken names the JSON path at fault.
//! let err = ServiceConfig::from_json(r#"{ "methodConfig": [
//!     { "name": [{ "service": "s.S" }],
//!       "retryPolicy": { "maxAttempts": 1, "initialBackoff": "0.1s", "maxBackoff": "1s",
//!                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"] } }
//! ] }"#)
//! .unwrap_err();
//! assert_eq!(err.knob(), "methodConfig[0].retryPolicy.maxAttempts");
//! # Ok::<(), backstop::ConfigError>(())
//! ```
//!
//! # What is read
//!
//! | field | honoured as |
//! |---|---|
//! | `methodConfig[].name[]` (`service`, optional `method`; neither: the default) | the entry for those methods; the most specific wins: `service/method`, then `service`, then the default; none: no retries |
//! | `timeout` | the method's timeout (proto3 JSON duration, e.g. `"1.5s"`, at most proto3's 315 576 000 000 s and 999 999 999 ns, as every duration here) |
//! | `retryPolicy` | `maxAttempts` (≥ 2, clamped to 5 unless [`ServiceConfig::from_json_with_max_attempts`] raises the cap), `initialBackoff`, `maxBackoff` (> 0; above 1 h, clamped to 1 h: see below), `backoffMultiplier` (> 0), `retryableStatusCodes` (non-empty; names like `"UNAVAILABLE"` or numbers; not `OK`) |
//! | `hedgingPolicy` | `maxAttempts` (≥ 2, clamped likewise), `hedgingDelay` (default `0s`: all at once), `nonFatalStatusCodes` (not `OK`) |
//! | `retryThrottling` | `maxTokens` (a whole number in (0, 1000]), `tokenRatio` (> 0, at most 3 decimals; above `maxTokens` it could not be told from `maxTokens`, and is refused) |
//!
//! **One deliberate difference:** A6 sets no bound on `maxBackoff`; the retry layer waits at
//! most [`MAX_DELAY`](crate::client::retry::backoff::MAX_DELAY) (1 h) between attempts, so a longer
//! `maxBackoff` is read as written and its waits are capped at 1 h. Every value A6 allows is accepted, and a config
//! [`from_json`](ServiceConfig::from_json) accepts always builds into a client.
//!
//! Values are read as proto3 JSON reads them, as gRPC C-core (and so grpcio) does: `null` is
//! an absent field, a whole number may be written in any notation or as a string (`3`, `3.0`,
//! `"3"`), and a number as a string (`"0.1"`). A fraction where a whole number belongs, or a
//! word, is refused. (grpc-go's own parser refuses a number written as a string; a config
//! written with plain numbers reads the same everywhere.)
//!
//! Accepted and ignored (they do not apply to a tower layer): `waitForReady`,
//! `maxRequestMessageBytes`, `maxResponseMessageBytes`, `loadBalancingPolicy`,
//! `loadBalancingConfig`, `healthCheckConfig`, and any other top-level or method field.
//!
//! # Validation
//!
//! As gRFC A6 states it, and every rejection is a [`ConfigError`](crate::ConfigError) whose
//! [`knob`](crate::ConfigError::knob) is the JSON path of the field at fault
//! (`methodConfig[2].retryPolicy.maxAttempts`): a required field missing, a value out of its
//! range, a duration that is not proto3 JSON, an unknown status code, a `retryPolicy` and a
//! `hedgingPolicy` in one entry, or the same method named by two entries. Text that is not
//! JSON (a number beyond an `f64`'s range, ±1.8 × 10³⁰⁸, included: the JSON reader refuses it
//! before any field is read) is refused under the knob `service config`, its reason naming
//! the line and column. A config
//! [`from_json`](ServiceConfig::from_json) accepts always builds into a client.

mod convert;
mod parse;
mod validate;

#[cfg(test)]
mod tests;

use crate::Code;
use std::time::Duration;

/// The most attempts a policy may ask for unless the caller raises the cap (gRFC A6).
pub(crate) const DEFAULT_MAX_ATTEMPTS_CAP: u32 = 5;

/// A parsed and validated service config; see the [module docs](self).
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceConfig {
    /// The `methodConfig` entries, in order.
    pub(crate) methods: Vec<MethodConfig>,
    /// `retryThrottling`: one throttle for every method of the channel.
    pub(crate) retry_throttling: Option<RetryThrottling>,
}

/// One `methodConfig` entry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MethodConfig {
    /// The methods it applies to.
    pub(crate) names: Vec<MethodName>,
    /// The methods' timeout.
    pub(crate) timeout: Option<Duration>,
    /// The retry or hedging policy; `None`: calls are neither retried nor hedged.
    pub(crate) policy: Option<MethodPolicy>,
}

/// A `name` entry: a service and optionally one of its methods; neither is the default.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MethodName {
    /// The fully qualified service, e.g. `bank.Accounts`.
    pub(crate) service: Option<String>,
    /// The method, e.g. `GetBalance`.
    pub(crate) method: Option<String>,
}

/// A method's policy: retries or hedging, never both.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MethodPolicy {
    /// `retryPolicy`.
    Retry(RetryPolicyConfig),
    /// `hedgingPolicy`.
    Hedging(HedgingPolicyConfig),
}

/// `retryPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RetryPolicyConfig {
    /// Attempts in all, the first included (after the cap).
    pub(crate) max_attempts: u32,
    /// The first backoff's bound.
    pub(crate) initial_backoff: Duration,
    /// The largest backoff bound.
    pub(crate) max_backoff: Duration,
    /// The bound's growth per retry.
    pub(crate) backoff_multiplier: f64,
    /// The codes that are retried.
    pub(crate) retryable_status_codes: Vec<Code>,
}

/// `hedgingPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HedgingPolicyConfig {
    /// Attempts in all, the first included (after the cap).
    pub(crate) max_attempts: u32,
    /// The delay between attempts (zero: all at once).
    pub(crate) hedging_delay: Duration,
    /// The codes after which the other attempts go on.
    pub(crate) non_fatal_status_codes: Vec<Code>,
}

/// `retryThrottling`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RetryThrottling {
    /// The bucket's size.
    pub(crate) max_tokens: u32,
    /// Tokens a success adds.
    pub(crate) token_ratio: f64,
}

impl ServiceConfig {
    /// The entry for a request's `:path` (`/package.Service/Method`): the most specific of the
    /// entry naming that method, the one naming its service, and the default. `None`: no entry
    /// applies (the call is neither retried nor hedged, as gRPC's clients do).
    pub(crate) fn method(&self, path: &str) -> Option<&MethodConfig> {
        self.method_index(path).map(|i| &self.methods[i])
    }

    /// The index in [`methods`](Self::methods) of [`method`](Self::method)'s entry. A scan of
    /// the names, without allocating.
    pub(crate) fn method_index(&self, path: &str) -> Option<usize> {
        let (service, method) = path.strip_prefix('/')?.split_once('/')?;
        let mut by_service = None;
        let mut default = None;
        for (i, entry) in self.methods.iter().enumerate() {
            for name in &entry.names {
                match (name.service.as_deref(), name.method.as_deref()) {
                    (Some(s), Some(m)) if s == service && m == method => return Some(i),
                    (Some(s), None) if s == service => by_service = by_service.or(Some(i)),
                    (None, None) => default = default.or(Some(i)),
                    _ => {}
                }
            }
        }
        by_service.or(default)
    }
}
