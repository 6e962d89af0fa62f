//! gRFC A6's rules for a config's values, one set for a config read from JSON and one built by
//! hand; each error names the JSON path at fault.

use super::{HedgingPolicyConfig, MethodPolicy, RetryPolicyConfig, RetryThrottling, ServiceConfig};
use crate::Code;
use crate::ConfigError;

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
    let limit = crate::client::retry::MAX_ATTEMPTS_LIMIT;
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
    /// Checks the config's values against gRFC A6's rules: [`from_json`](Self::from_json)
    /// calls it after its clamp of `maxAttempts`, and
    /// [`ClientBuilder::service_config`](crate::ClientBuilder::service_config) again, so a
    /// config changed inside the crate (the tests build some by hand) cannot build a client
    /// the rules refuse. A config that passes builds into retry layers, hedging and a
    /// throttle as it is.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] whose [`knob`](ConfigError::knob) is the JSON path of the field at
    /// fault (`methodConfig[1].retryPolicy.maxAttempts`): a method named without its service,
    /// or named by two entries; `maxAttempts` not in
    /// `2..=`[`MAX_ATTEMPTS_LIMIT`](crate::client::retry::MAX_ATTEMPTS_LIMIT); a backoff of zero; a
    /// `backoffMultiplier` not a finite number above zero; no retryable code, or `OK` among
    /// the codes; `maxTokens` not in 1..=1000; a `tokenRatio` not above zero, above
    /// `maxTokens`, or with more than 3 decimal places.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
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
}
