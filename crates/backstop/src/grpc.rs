//! gRPC's own service config: the JSON that grpc-go, grpc-java, grpc-dotnet and C-core (and so
//! Python's grpcio) read, with per-method retry, hedging and timeout policies (gRFC A6 and
//! gRPC's service-config document), read and validated as those clients do.
//!
//! ```
//! use backstop::grpc::{MethodPolicy, ServiceConfig};
//! use std::time::Duration;
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
//!
//! let balance = config.method("/bank.Accounts/GetBalance").unwrap();
//! assert!(matches!(&balance.policy, Some(MethodPolicy::Retry(r)) if r.max_attempts == 4));
//! // `Charge` has an entry of its own, without a policy: never retried.
//! assert!(config.method("/bank.Accounts/Charge").unwrap().policy.is_none());
//! // Anything else gets the default entry.
//! assert_eq!(config.method("/bank.Other/Call").unwrap().timeout, Some(Duration::from_secs(2)));
//! # Ok::<(), backstop::ConfigError>(())
//! ```
//!
//! # What is read
//!
//! | field | honoured as |
//! |---|---|
//! | `methodConfig[].name[]` (`service`, optional `method`; neither: the default) | the entry for those methods; the most specific wins: `service/method`, then `service`, then the default; none: no retries |
//! | `timeout` | the method's timeout (proto3 JSON duration, e.g. `"1.5s"`) |
//! | `retryPolicy` | `maxAttempts` (≥ 2, clamped to 5 unless [`ServiceConfig::from_json_with_max_attempts`] raises the cap), `initialBackoff`, `maxBackoff` (> 0), `backoffMultiplier` (> 0), `retryableStatusCodes` (non-empty; names like `"UNAVAILABLE"` or numbers) |
//! | `hedgingPolicy` | `maxAttempts` (≥ 2, clamped likewise), `hedgingDelay` (default `0s`: all at once), `nonFatalStatusCodes` |
//! | `retryThrottling` | `maxTokens` (a whole number in (0, 1000]), `tokenRatio` (> 0, at most 3 decimals; above `maxTokens` it could not be told from `maxTokens`, and is refused) |
//!
//! Accepted and ignored (they do not apply to a tower layer): `waitForReady`,
//! `maxRequestMessageBytes`, `maxResponseMessageBytes`, `loadBalancingPolicy`,
//! `loadBalancingConfig`, `healthCheckConfig`, and any other top-level or method field.
//!
//! # Validation
//!
//! As gRFC A6 states it, and every rejection is a [`ConfigError`] whose
//! [`knob`](ConfigError::knob) is the JSON path of the field at fault
//! (`methodConfig[2].retryPolicy.maxAttempts`): a required field missing, a value out of its
//! range, a duration that is not proto3 JSON, an unknown status code, a `retryPolicy` and a
//! `hedgingPolicy` in one entry, or the same method named by two entries.

use crate::ConfigError;
use backstop_core::Code;
use serde_json::{Map, Value};
use std::time::Duration;

/// The most attempts a policy may ask for unless the caller raises the cap (gRFC A6).
pub const DEFAULT_MAX_ATTEMPTS_CAP: u32 = 5;

/// A parsed and validated service config; see the [module docs](self).
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceConfig {
    /// The `methodConfig` entries, in order.
    pub methods: Vec<MethodConfig>,
    /// `retryThrottling`: one throttle for every method of the channel.
    pub retry_throttling: Option<RetryThrottling>,
}

/// One `methodConfig` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodConfig {
    /// The methods it applies to.
    pub names: Vec<MethodName>,
    /// The methods' timeout.
    pub timeout: Option<Duration>,
    /// The retry or hedging policy; `None`: calls are neither retried nor hedged.
    pub policy: Option<MethodPolicy>,
}

/// A `name` entry: a service and optionally one of its methods; neither is the default.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MethodName {
    /// The fully qualified service, e.g. `bank.Accounts`.
    pub service: Option<String>,
    /// The method, e.g. `GetBalance`.
    pub method: Option<String>,
}

/// A method's policy: retries or hedging, never both.
#[derive(Debug, Clone, PartialEq)]
pub enum MethodPolicy {
    /// `retryPolicy`.
    Retry(RetryPolicyConfig),
    /// `hedgingPolicy`.
    Hedging(HedgingPolicyConfig),
}

/// `retryPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicyConfig {
    /// Attempts in all, the first included (after the cap).
    pub max_attempts: u32,
    /// The first backoff's bound.
    pub initial_backoff: Duration,
    /// The largest backoff bound.
    pub max_backoff: Duration,
    /// The bound's growth per retry.
    pub backoff_multiplier: f64,
    /// The codes that are retried.
    pub retryable_status_codes: Vec<Code>,
}

/// `hedgingPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub struct HedgingPolicyConfig {
    /// Attempts in all, the first included (after the cap).
    pub max_attempts: u32,
    /// The delay between attempts (zero: all at once).
    pub hedging_delay: Duration,
    /// The codes after which the other attempts go on.
    pub non_fatal_status_codes: Vec<Code>,
}

/// `retryThrottling`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryThrottling {
    /// The bucket's size.
    pub max_tokens: u32,
    /// Tokens a success adds.
    pub token_ratio: f64,
}

impl RetryPolicyConfig {
    /// The policy's backoff: gRFC A6's formula, `random(0, min(initialBackoff ×
    /// backoffMultiplier^(n−1), maxBackoff))` ([`exponential`](backstop_retry::backoff::exponential)
    /// with this multiplier and full jitter). A `maxBackoff` below `initialBackoff` caps every
    /// wait at `maxBackoff`.
    pub fn backoff(&self) -> backstop_retry::backoff::Exponential {
        let base = self.initial_backoff.min(self.max_backoff);
        backstop_retry::backoff::exponential(base, self.max_backoff)
            .multiplier(self.backoff_multiplier)
    }

    /// The policy as a [`RetryConfig`](backstop_retry::RetryConfig) for gRPC: its attempts, its
    /// backoff and its retryable codes (no budget: the channel's throttle is one per client,
    /// see [`RetryThrottling::throttle`]).
    pub fn retry_policy(&self) -> backstop_retry::RetryConfig<backstop_core::GrpcClassifier> {
        backstop_retry::RetryConfig::with_classifier(
            backstop_core::GrpcClassifier::new()
                .retryable_codes(self.retryable_status_codes.iter().copied()),
        )
        .max_attempts(self.max_attempts)
        .backoff(self.backoff())
        .no_budget()
    }
}

impl HedgingPolicyConfig {
    /// The policy as [`Hedging`](backstop_retry::hedge::Hedging): its attempts, a fixed delay.
    pub fn hedging(&self) -> backstop_retry::hedge::Hedging {
        backstop_retry::hedge::Hedging::new(self.hedging_delay).max_attempts(self.max_attempts)
    }
}

impl RetryThrottling {
    /// gRFC A6's throttle with these parameters.
    pub fn throttle(&self) -> backstop_retry::GrpcThrottle {
        backstop_retry::GrpcThrottle::builder()
            .max_tokens(self.max_tokens)
            .token_ratio(self.token_ratio)
            .build()
            .expect("validated when the config was read")
    }
}

impl ServiceConfig {
    /// Reads and validates a service config, with gRFC A6's default cap of 5 attempts.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the JSON path at fault and the rule (see the module docs).
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        Self::from_json_with_max_attempts(json, DEFAULT_MAX_ATTEMPTS_CAP)
    }

    /// As [`from_json`](Self::from_json), with `cap` as the most attempts a policy gets (A6
    /// lets a client raise it; at most [`MAX_ATTEMPTS_LIMIT`](backstop_retry::MAX_ATTEMPTS_LIMIT)).
    ///
    /// # Errors
    ///
    /// As [`from_json`](Self::from_json), and for a `cap` outside `2..=10`.
    pub fn from_json_with_max_attempts(json: &str, cap: u32) -> Result<Self, ConfigError> {
        if !(2..=backstop_retry::MAX_ATTEMPTS_LIMIT).contains(&cap) {
            return Err(ConfigError::new(
                "max_attempts_cap",
                format!(
                    "must be in 2..={}, got {cap}",
                    backstop_retry::MAX_ATTEMPTS_LIMIT
                ),
            ));
        }
        let root: Value = serde_json::from_str(json)
            .map_err(|e| ConfigError::new("service config", format!("not JSON: {e}")))?;
        let root = object(&root, "service config")?;
        let mut methods = Vec::new();
        if let Some(list) = root.get("methodConfig") {
            let Value::Array(list) = list else {
                return Err(ConfigError::new("methodConfig", "must be an array"));
            };
            for (i, entry) in list.iter().enumerate() {
                methods.push(method_config(entry, &format!("methodConfig[{i}]"), cap)?);
            }
        }
        // A6 and gRPC's service-config document: a method may be named once.
        let mut seen = std::collections::HashMap::new();
        for (i, m) in methods.iter().enumerate() {
            for (j, name) in m.names.iter().enumerate() {
                if let Some((first, _)) = seen.insert(name.clone(), (i, j)) {
                    return Err(ConfigError::new(
                        format!("methodConfig[{i}].name[{j}]"),
                        format!("names a method that methodConfig[{first}] names already"),
                    ));
                }
            }
        }
        let retry_throttling = root
            .get("retryThrottling")
            .map(|t| throttling(t, "retryThrottling"))
            .transpose()?;
        Ok(Self {
            methods,
            retry_throttling,
        })
    }

    /// The entry for a request's `:path` (`/package.Service/Method`): the most specific of the
    /// entry naming that method, the one naming its service, and the default. `None`: no entry
    /// applies (the call is neither retried nor hedged, as gRPC's clients do).
    pub fn method(&self, path: &str) -> Option<&MethodConfig> {
        self.method_index(path).map(|i| &self.methods[i])
    }

    /// The index in [`methods`](Self::methods) of [`method`](Self::method)'s entry. A scan of
    /// the names, without allocating.
    pub fn method_index(&self, path: &str) -> Option<usize> {
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

fn object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(ConfigError::new(path.to_owned(), "must be an object")),
    }
}

fn method_config(value: &Value, path: &str, cap: u32) -> Result<MethodConfig, ConfigError> {
    let map = object(value, path)?;
    let mut names = Vec::new();
    if let Some(list) = map.get("name") {
        let Value::Array(list) = list else {
            return Err(ConfigError::new(format!("{path}.name"), "must be an array"));
        };
        for (j, name) in list.iter().enumerate() {
            names.push(method_name(name, &format!("{path}.name[{j}]"))?);
        }
    }
    let timeout = map
        .get("timeout")
        .map(|t| duration(t, &format!("{path}.timeout")))
        .transpose()?;
    let policy = match (map.get("retryPolicy"), map.get("hedgingPolicy")) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                format!("{path}.hedgingPolicy"),
                "a method has a retryPolicy or a hedgingPolicy, never both (gRFC A6)",
            ));
        }
        (Some(r), None) => Some(MethodPolicy::Retry(retry_policy(
            r,
            &format!("{path}.retryPolicy"),
            cap,
        )?)),
        (None, Some(h)) => Some(MethodPolicy::Hedging(hedging_policy(
            h,
            &format!("{path}.hedgingPolicy"),
            cap,
        )?)),
        (None, None) => None,
    };
    Ok(MethodConfig {
        names,
        timeout,
        policy,
    })
}

fn method_name(value: &Value, path: &str) -> Result<MethodName, ConfigError> {
    let map = object(value, path)?;
    let text = |key: &str| -> Result<Option<String>, ConfigError> {
        match map.get(key) {
            None => Ok(None),
            // gRPC's service-config document: an empty string is the same as absent.
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ConfigError::new(
                format!("{path}.{key}"),
                "must be a string",
            )),
        }
    };
    let (service, method) = (text("service")?, text("method")?);
    if service.is_none() && method.is_some() {
        return Err(ConfigError::new(
            format!("{path}.service"),
            "is required when a method is named",
        ));
    }
    Ok(MethodName { service, method })
}

fn field<'a>(map: &'a Map<String, Value>, path: &str, key: &str) -> Result<&'a Value, ConfigError> {
    map.get(key)
        .ok_or_else(|| ConfigError::new(format!("{path}.{key}"), "is required"))
}

fn max_attempts(value: &Value, path: &str, cap: u32) -> Result<u32, ConfigError> {
    let n = value
        .as_u64()
        .ok_or_else(|| ConfigError::new(path.to_owned(), "must be a whole number"))?;
    if n < 2 {
        return Err(ConfigError::new(
            path.to_owned(),
            format!("must be 2 or more, got {n}"),
        ));
    }
    // A6: larger values are treated as the client's cap.
    Ok(n.min(u64::from(cap)) as u32)
}

fn retry_policy(value: &Value, path: &str, cap: u32) -> Result<RetryPolicyConfig, ConfigError> {
    let map = object(value, path)?;
    let max_attempts = max_attempts(
        field(map, path, "maxAttempts")?,
        &format!("{path}.maxAttempts"),
        cap,
    )?;
    let positive = |key: &str| -> Result<Duration, ConfigError> {
        let at = format!("{path}.{key}");
        let d = duration(field(map, path, key)?, &at)?;
        if d.is_zero() {
            return Err(ConfigError::new(at, "must be greater than zero"));
        }
        Ok(d)
    };
    let initial_backoff = positive("initialBackoff")?;
    let max_backoff = positive("maxBackoff")?;
    let multiplier_at = format!("{path}.backoffMultiplier");
    let backoff_multiplier = field(map, path, "backoffMultiplier")?
        .as_f64()
        .filter(|m| m.is_finite() && *m > 0.0)
        .ok_or_else(|| ConfigError::new(multiplier_at, "must be a number greater than zero"))?;
    let retryable_status_codes = codes(
        field(map, path, "retryableStatusCodes")?,
        &format!("{path}.retryableStatusCodes"),
    )?;
    Ok(RetryPolicyConfig {
        max_attempts,
        initial_backoff,
        max_backoff,
        backoff_multiplier,
        retryable_status_codes,
    })
}

fn hedging_policy(value: &Value, path: &str, cap: u32) -> Result<HedgingPolicyConfig, ConfigError> {
    let map = object(value, path)?;
    let max_attempts = max_attempts(
        field(map, path, "maxAttempts")?,
        &format!("{path}.maxAttempts"),
        cap,
    )?;
    let hedging_delay = map
        .get("hedgingDelay")
        .map(|d| duration(d, &format!("{path}.hedgingDelay")))
        .transpose()?
        .unwrap_or_default();
    let non_fatal_status_codes = match map.get("nonFatalStatusCodes") {
        Some(list) => codes(list, &format!("{path}.nonFatalStatusCodes"))?,
        None => Vec::new(),
    };
    Ok(HedgingPolicyConfig {
        max_attempts,
        hedging_delay,
        non_fatal_status_codes,
    })
}

fn throttling(value: &Value, path: &str) -> Result<RetryThrottling, ConfigError> {
    let map = object(value, path)?;
    let tokens_at = format!("{path}.maxTokens");
    let max_tokens = field(map, path, "maxTokens")?
        .as_u64()
        .filter(|n| (1..=1000).contains(n))
        .ok_or_else(|| ConfigError::new(tokens_at, "must be a whole number in (0, 1000]"))?;
    let ratio_at = format!("{path}.tokenRatio");
    let ratio = field(map, path, "tokenRatio")?;
    let token_ratio = ratio
        .as_f64()
        .filter(|r| r.is_finite() && *r > 0.0 && *r <= max_tokens as f64)
        .ok_or_else(|| {
            ConfigError::new(
                ratio_at.clone(),
                "must be a number greater than zero (and at most maxTokens)",
            )
        })?;
    // "Up to 3 decimal places are supported": more is refused rather than silently rounded.
    let text = ratio.to_string();
    let decimals = text
        .split_once('.')
        .map_or(0, |(_, frac)| frac.trim_end_matches('0').len());
    if decimals > 3 || text.contains(['e', 'E']) {
        return Err(ConfigError::new(
            ratio_at,
            format!("at most 3 decimal places, got {text}"),
        ));
    }
    Ok(RetryThrottling {
        max_tokens: max_tokens as u32,
        token_ratio,
    })
}

fn codes(value: &Value, path: &str) -> Result<Vec<Code>, ConfigError> {
    let Value::Array(list) = value else {
        return Err(ConfigError::new(
            path.to_owned(),
            "must be an array of status codes",
        ));
    };
    if list.is_empty() {
        return Err(ConfigError::new(path.to_owned(), "must not be empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, code)| {
            let at = || format!("{path}[{i}]");
            match code {
                Value::String(name) => Code::from_name(name).ok_or_else(|| {
                    ConfigError::new(at(), format!("{name:?} is not a gRPC status code"))
                }),
                Value::Number(n) => n
                    .as_u64()
                    .filter(|n| (1..=16).contains(n))
                    .map(|n| Code::from_i32(n as i32))
                    .ok_or_else(|| ConfigError::new(at(), format!("{n} is not a gRPC error code"))),
                _ => Err(ConfigError::new(at(), "must be a code name or number")),
            }
        })
        .collect()
}

/// A proto3 JSON duration: decimal seconds with an `s`, up to 9 fractional digits (`"1.5s"`,
/// `".1s"`, `"0s"`); never negative here.
fn duration(value: &Value, path: &str) -> Result<Duration, ConfigError> {
    let bad = || {
        ConfigError::new(
            path.to_owned(),
            format!("must be a proto3 JSON duration such as \"1.5s\", got {value}"),
        )
    };
    let text = value.as_str().ok_or_else(bad)?;
    let number = text.strip_suffix('s').ok_or_else(bad)?;
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && frac.is_empty())
        || frac.len() > 9
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let secs: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let nanos: u32 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").parse().map_err(|_| bad())?
    };
    Ok(Duration::new(secs, nanos))
}
