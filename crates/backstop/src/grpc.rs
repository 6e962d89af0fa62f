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
//! | `timeout` | the method's timeout (proto3 JSON duration, e.g. `"1.5s"`, at most proto3's 315 576 000 000 s, as every duration here) |
//! | `retryPolicy` | `maxAttempts` (≥ 2, clamped to 5 unless [`ServiceConfig::from_json_with_max_attempts`] raises the cap), `initialBackoff`, `maxBackoff` (> 0; above 1 h, clamped to 1 h: see below), `backoffMultiplier` (> 0), `retryableStatusCodes` (non-empty; names like `"UNAVAILABLE"` or numbers; not `OK`) |
//! | `hedgingPolicy` | `maxAttempts` (≥ 2, clamped likewise), `hedgingDelay` (default `0s`: all at once), `nonFatalStatusCodes` (not `OK`) |
//! | `retryThrottling` | `maxTokens` (a whole number in (0, 1000]), `tokenRatio` (> 0, at most 3 decimals; above `maxTokens` it could not be told from `maxTokens`, and is refused) |
//!
//! **One deliberate difference:** A6 sets no bound on `maxBackoff`; the retry layer waits at
//! most [`MAX_DELAY`](backstop_retry::backoff::MAX_DELAY) (1 h) between attempts, so a longer
//! `maxBackoff` is read as written and its waits are capped at 1 h
//! ([`RetryPolicyConfig::backoff`]). Every value A6 allows is accepted, and a config
//! [`from_json`](ServiceConfig::from_json) accepts always builds into a client.
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
//! `hedgingPolicy` in one entry, or the same method named by two entries. The rules on values
//! are [`ServiceConfig::validate`]'s, which
//! [`ClientLayer::service_config`](crate::ClientLayer::service_config) applies to a config
//! built or changed by hand too, naming the same paths.

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
    /// wait at `maxBackoff`; one above the retry layer's longest backoff
    /// ([`MAX_DELAY`](backstop_retry::backoff::MAX_DELAY), 1 h) is clamped to it, a deliberate
    /// difference from A6, which sets no bound.
    pub fn backoff(&self) -> backstop_retry::backoff::Exponential {
        let cap = self.max_backoff.min(backstop_retry::backoff::MAX_DELAY);
        let base = self.initial_backoff.min(cap);
        backstop_retry::backoff::exponential(base, cap).multiplier(self.backoff_multiplier)
    }

    /// The policy as a [`RetryConfig`](backstop_retry::RetryConfig) for gRPC: its attempts, its
    /// backoff and its retryable codes (no budget: the channel's throttle is one per client,
    /// see [`RetryThrottling::throttle`]). It builds for every policy that passes
    /// [`ServiceConfig::validate`].
    pub fn retry_policy(&self) -> backstop_retry::RetryConfig<backstop_core::GrpcClassifier> {
        backstop_retry::RetryConfig::new(
            backstop_core::GrpcClassifier::new()
                .retryable_codes(self.retryable_status_codes.iter().copied()),
        )
        .max_attempts(self.max_attempts)
        .backoff(self.backoff())
        .no_budget()
    }
}

impl HedgingPolicyConfig {
    /// The policy as [`Hedging`](backstop_retry::hedge::Hedging): its attempts, a fixed delay
    /// (valid for every policy that passes [`ServiceConfig::validate`]).
    pub fn hedging(&self) -> backstop_retry::hedge::Hedging {
        backstop_retry::hedge::Hedging::new(self.hedging_delay).max_attempts(self.max_attempts)
    }
}

impl RetryThrottling {
    /// gRFC A6's throttle with these parameters.
    ///
    /// # Panics
    ///
    /// For parameters [`ServiceConfig::validate`] refuses (never for a config read by
    /// [`ServiceConfig::from_json`], nor in
    /// [`ClientLayer::service_config`](crate::ClientLayer::service_config), which validates
    /// first).
    pub fn throttle(&self) -> backstop_retry::GrpcThrottle {
        backstop_retry::GrpcThrottle::builder()
            .max_tokens(self.max_tokens)
            .token_ratio(self.token_ratio)
            .build()
            .expect("validated when the config was read")
    }
}

impl RetryPolicyConfig {
    /// The rules of a `retryPolicy` at `path`; see [`ServiceConfig::validate`].
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        attempts(self.max_attempts, path)?;
        for (key, d) in [
            ("initialBackoff", self.initial_backoff),
            ("maxBackoff", self.max_backoff),
        ] {
            if d.is_zero() {
                return Err(ConfigError::new(
                    format!("{path}.{key}"),
                    "must be greater than zero",
                ));
            }
        }
        let m = self.backoff_multiplier;
        if !(m.is_finite() && m > 0.0) {
            return Err(ConfigError::new(
                format!("{path}.backoffMultiplier"),
                format!("must be a number greater than zero, got {m}"),
            ));
        }
        let at = format!("{path}.retryableStatusCodes");
        if self.retryable_status_codes.is_empty() {
            return Err(ConfigError::new(at, "must not be empty"));
        }
        error_codes(&self.retryable_status_codes, &at)
    }
}

impl HedgingPolicyConfig {
    /// The rules of a `hedgingPolicy` at `path`; see [`ServiceConfig::validate`].
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        attempts(self.max_attempts, path)?;
        error_codes(
            &self.non_fatal_status_codes,
            &format!("{path}.nonFatalStatusCodes"),
        )
    }
}

impl RetryThrottling {
    /// The rules of `retryThrottling` at `path`; see [`ServiceConfig::validate`].
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        if !(1..=1000).contains(&self.max_tokens) {
            return Err(ConfigError::new(
                format!("{path}.maxTokens"),
                format!(
                    "must be a whole number in (0, 1000], got {}",
                    self.max_tokens
                ),
            ));
        }
        let at = format!("{path}.tokenRatio");
        let r = self.token_ratio;
        if !(r.is_finite() && r > 0.0 && r <= f64::from(self.max_tokens)) {
            return Err(ConfigError::new(
                at,
                format!("must be a number greater than zero and at most maxTokens, got {r}"),
            ));
        }
        // "Up to 3 decimal places are supported": more is refused rather than silently
        // rounded (r ≤ 1000, so a thousandth is far above the error of the product).
        let thousandths = r * 1000.0;
        if (thousandths - thousandths.round()).abs() > 1e-6 {
            return Err(ConfigError::new(
                at,
                format!("at most 3 decimal places, got {r}"),
            ));
        }
        Ok(())
    }
}

/// `maxAttempts` at `path`: 2 or more (A6), at most what the retry layer takes.
fn attempts(n: u32, path: &str) -> Result<(), ConfigError> {
    let limit = backstop_retry::MAX_ATTEMPTS_LIMIT;
    let reason = if n < 2 {
        format!("must be 2 or more, got {n}")
    } else if n > limit {
        format!("must be at most {limit} (the retry layer's limit), got {n}")
    } else {
        return Ok(());
    };
    Err(ConfigError::new(format!("{path}.maxAttempts"), reason))
}

/// Status codes after which something is done again: `OK` is not one.
fn error_codes(codes: &[Code], path: &str) -> Result<(), ConfigError> {
    match codes.iter().position(|c| *c == Code::Ok) {
        Some(k) => Err(ConfigError::new(
            format!("{path}[{k}]"),
            "OK is not an error code",
        )),
        None => Ok(()),
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
        let retry_throttling = root
            .get("retryThrottling")
            .map(|t| throttling(t, "retryThrottling"))
            .transpose()?;
        let config = Self {
            methods,
            retry_throttling,
        };
        // What was read has the right shapes; its values meet the rules here, the same
        // rules as for a config built by hand.
        config.validate()?;
        Ok(config)
    }

    /// Checks the config's values against gRFC A6's rules, as
    /// [`from_json`](Self::from_json) does (after its clamp of `maxAttempts`), for a config
    /// built or changed by hand (the fields are public);
    /// [`ClientLayer::service_config`](crate::ClientLayer::service_config) calls it. A config
    /// that passes builds into retry layers, hedging and a throttle as it is.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] whose [`knob`](ConfigError::knob) is the JSON path of the field at
    /// fault (`methodConfig[1].retryPolicy.maxAttempts`): a method named without its service,
    /// or named by two entries; `maxAttempts` not in
    /// `2..=`[`MAX_ATTEMPTS_LIMIT`](backstop_retry::MAX_ATTEMPTS_LIMIT); a backoff of zero; a
    /// `backoffMultiplier` not a finite number above zero; no retryable code, or `OK` among
    /// the codes; `maxTokens` not in 1..=1000; a `tokenRatio` not above zero, above
    /// `maxTokens`, or with more than 3 decimal places.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // A6 and gRPC's service-config document: a method may be named once.
        let mut seen = std::collections::HashMap::new();
        for (i, m) in self.methods.iter().enumerate() {
            let path = format!("methodConfig[{i}]");
            for (j, name) in m.names.iter().enumerate() {
                if name.service.is_none() && name.method.is_some() {
                    return Err(ConfigError::new(
                        format!("{path}.name[{j}].service"),
                        "is required when a method is named",
                    ));
                }
                if let Some((first, _)) = seen.insert(name.clone(), (i, j)) {
                    return Err(ConfigError::new(
                        format!("{path}.name[{j}]"),
                        format!("names a method that methodConfig[{first}] names already"),
                    ));
                }
            }
            match &m.policy {
                Some(MethodPolicy::Retry(r)) => r.validate(&format!("{path}.retryPolicy"))?,
                Some(MethodPolicy::Hedging(h)) => h.validate(&format!("{path}.hedgingPolicy"))?,
                None => {}
            }
        }
        if let Some(t) = &self.retry_throttling {
            t.validate("retryThrottling")?;
        }
        Ok(())
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
    Ok(MethodName { service, method })
}

fn field<'a>(map: &'a Map<String, Value>, path: &str, key: &str) -> Result<&'a Value, ConfigError> {
    map.get(key)
        .ok_or_else(|| ConfigError::new(format!("{path}.{key}"), "is required"))
}

/// `maxAttempts`, clamped to the cap (the range is checked by `validate`).
fn max_attempts(value: &Value, path: &str, cap: u32) -> Result<u32, ConfigError> {
    let n = value
        .as_u64()
        .ok_or_else(|| ConfigError::new(path.to_owned(), "must be a whole number"))?;
    // A6: larger values are treated as the client's cap (which is at least 2, so a value
    // below 2 is left for `validate` to refuse).
    Ok(n.min(u64::from(cap)) as u32)
}

fn retry_policy(value: &Value, path: &str, cap: u32) -> Result<RetryPolicyConfig, ConfigError> {
    let map = object(value, path)?;
    let max_attempts = max_attempts(
        field(map, path, "maxAttempts")?,
        &format!("{path}.maxAttempts"),
        cap,
    )?;
    let backoff = |key: &str| duration(field(map, path, key)?, &format!("{path}.{key}"));
    let initial_backoff = backoff("initialBackoff")?;
    let max_backoff = backoff("maxBackoff")?;
    let multiplier_at = format!("{path}.backoffMultiplier");
    let backoff_multiplier = field(map, path, "backoffMultiplier")?
        .as_f64()
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
    let codes_at = format!("{path}.nonFatalStatusCodes");
    let non_fatal_status_codes = match map.get("nonFatalStatusCodes") {
        // Absent: every failure is fatal; an empty list says nothing, and is refused.
        Some(Value::Array(list)) if list.is_empty() => {
            return Err(ConfigError::new(codes_at, "must not be empty"));
        }
        Some(list) => codes(list, &codes_at)?,
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
        .ok_or_else(|| ConfigError::new(tokens_at, "must be a whole number in (0, 1000]"))?;
    let ratio_at = format!("{path}.tokenRatio");
    let token_ratio = field(map, path, "tokenRatio")?.as_f64().ok_or_else(|| {
        ConfigError::new(
            ratio_at,
            "must be a number greater than zero (and at most maxTokens)",
        )
    })?;
    Ok(RetryThrottling {
        // Out of range either way: `validate` refuses it.
        max_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
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
    list.iter()
        .enumerate()
        .map(|(i, code)| {
            let at = || format!("{path}[{i}]");
            match code {
                Value::String(name) => Code::from_name(name).ok_or_else(|| {
                    ConfigError::new(at(), format!("{name:?} is not a gRPC status code"))
                }),
                // `OK` (0) is a code, though not an error one: `validate` refuses it, by
                // name or by number alike.
                Value::Number(n) => n
                    .as_u64()
                    .filter(|n| (0..=16).contains(n))
                    .map(|n| Code::from_i32(n as i32))
                    .ok_or_else(|| {
                        ConfigError::new(at(), format!("{n} is not a gRPC status code"))
                    }),
                _ => Err(ConfigError::new(at(), "must be a code name or number")),
            }
        })
        .collect()
}

/// The longest proto3 `Duration`: 10 000 years of seconds.
const PROTO3_MAX_SECONDS: u64 = 315_576_000_000;

/// A proto3 JSON duration: decimal seconds with an `s`, up to 9 fractional digits (`"1.5s"`,
/// `".1s"`, `"0s"`), at most proto3's 315 576 000 000 s; never negative here.
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
    if secs > PROTO3_MAX_SECONDS {
        return Err(ConfigError::new(
            path.to_owned(),
            format!(
                "must be at most {PROTO3_MAX_SECONDS}s (proto3's longest duration), got {text}"
            ),
        ));
    }
    Ok(Duration::new(secs, nanos))
}
