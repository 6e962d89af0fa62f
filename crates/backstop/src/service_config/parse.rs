//! Reading a service config's JSON into its types: shapes and units here, values in
//! [`validate`](super::validate).

use super::{
    DEFAULT_MAX_ATTEMPTS_CAP, HedgingPolicyConfig, MethodConfig, MethodName, MethodPolicy,
    RetryPolicyConfig, RetryThrottling, ServiceConfig,
};
use crate::Code;
use crate::ConfigError;
use serde_json::{Map, Value};
use std::time::Duration;

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
    /// lets a client raise it; at most [`MAX_ATTEMPTS_LIMIT`](crate::client::retry::MAX_ATTEMPTS_LIMIT)).
    ///
    /// # Errors
    ///
    /// As [`from_json`](Self::from_json), and for a `cap` outside `2..=10`.
    pub fn from_json_with_max_attempts(json: &str, cap: u32) -> Result<Self, ConfigError> {
        if !(2..=crate::client::retry::MAX_ATTEMPTS_LIMIT).contains(&cap) {
            return Err(ConfigError::new(
                "max_attempts_cap",
                format!(
                    "must be in 2..={}, got {cap}",
                    crate::client::retry::MAX_ATTEMPTS_LIMIT
                ),
            ));
        }
        let root: Value = serde_json::from_str(json)
            .map_err(|e| ConfigError::new("service config", format!("not JSON: {e}")))?;
        let root = object(&root, "service config")?;
        let mut methods = Vec::new();
        if let Some(list) = get(root, "methodConfig") {
            let Value::Array(list) = list else {
                return Err(ConfigError::new("methodConfig", "must be an array"));
            };
            for (i, entry) in list.iter().enumerate() {
                methods.push(method_config(entry, &format!("methodConfig[{i}]"), cap)?);
            }
        }
        let retry_throttling = get(root, "retryThrottling")
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
    if let Some(list) = get(map, "name") {
        let Value::Array(list) = list else {
            return Err(ConfigError::new(format!("{path}.name"), "must be an array"));
        };
        for (j, name) in list.iter().enumerate() {
            names.push(method_name(name, &format!("{path}.name[{j}]"))?);
        }
    }
    let timeout = get(map, "timeout")
        .map(|t| duration(t, &format!("{path}.timeout")))
        .transpose()?;
    let policy = match (get(map, "retryPolicy"), get(map, "hedgingPolicy")) {
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
        match get(map, key) {
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

/// A field as proto3 JSON reads one: `null` is the same as absent.
fn get<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|value| !value.is_null())
}

/// A whole number as proto3 JSON writes one: a number without a fraction, in any notation
/// (`3`, `3.0`, `1e1`), or a string of one (`"3"`).
fn whole(value: &Value) -> Option<u64> {
    let integral =
        |f: f64| (f.fract() == 0.0 && (0.0..=u64::MAX as f64).contains(&f)).then_some(f as u64);
    match value {
        Value::Number(n) => n.as_u64().or_else(|| n.as_f64().and_then(integral)),
        Value::String(s) => s.parse().ok().or_else(|| s.parse().ok().and_then(integral)),
        _ => None,
    }
}

/// A number as proto3 JSON writes one: a number, or a string of one.
fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn field<'a>(map: &'a Map<String, Value>, path: &str, key: &str) -> Result<&'a Value, ConfigError> {
    get(map, key).ok_or_else(|| ConfigError::new(format!("{path}.{key}"), "is required"))
}

/// The policy's `maxAttempts`, clamped to the cap (the range is checked by `validate`).
fn max_attempts(policy: &Map<String, Value>, path: &str, cap: u32) -> Result<u32, ConfigError> {
    let n = whole(field(policy, path, "maxAttempts")?)
        .ok_or_else(|| ConfigError::new(format!("{path}.maxAttempts"), "must be a whole number"))?;
    // A6: larger values are treated as the client's cap (which is at least 2, so a value
    // below 2 is left for `validate` to refuse).
    Ok(n.min(u64::from(cap)) as u32)
}

fn retry_policy(value: &Value, path: &str, cap: u32) -> Result<RetryPolicyConfig, ConfigError> {
    let map = object(value, path)?;
    let max_attempts = max_attempts(map, path, cap)?;
    let backoff = |key: &str| duration(field(map, path, key)?, &format!("{path}.{key}"));
    let initial_backoff = backoff("initialBackoff")?;
    let max_backoff = backoff("maxBackoff")?;
    let multiplier_at = format!("{path}.backoffMultiplier");
    let backoff_multiplier = number(field(map, path, "backoffMultiplier")?)
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
    let max_attempts = max_attempts(map, path, cap)?;
    let hedging_delay = get(map, "hedgingDelay")
        .map(|d| duration(d, &format!("{path}.hedgingDelay")))
        .transpose()?
        .unwrap_or_default();
    let codes_at = format!("{path}.nonFatalStatusCodes");
    let non_fatal_status_codes = match get(map, "nonFatalStatusCodes") {
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
    let max_tokens = whole(field(map, path, "maxTokens")?)
        .ok_or_else(|| ConfigError::new(tokens_at, "must be a whole number in (0, 1000]"))?;
    let ratio_at = format!("{path}.tokenRatio");
    let token_ratio = number(field(map, path, "tokenRatio")?).ok_or_else(|| {
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
/// `".1s"`, `"0s"`), at most proto3's 315 576 000 000 s and 999 999 999 ns; never negative here.
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
                "must be at most {PROTO3_MAX_SECONDS}.999999999s (proto3's longest duration), got {text}"
            ),
        ));
    }
    Ok(Duration::new(secs, nanos))
}
