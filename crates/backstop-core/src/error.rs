use std::fmt;

/// A type-erased error, as tower and hyper use it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A configuration that cannot work, caught when the layer is built rather than at the first
/// request.
///
/// The message names the knob and the rule it broke, e.g.
/// ``invalid `fraction`: must be in (0, 1], got 1.5``.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    knob: &'static str,
    reason: String,
}

impl ConfigError {
    /// A configuration error for `knob`, with the rule it broke.
    pub fn new(knob: &'static str, reason: impl Into<String>) -> Self {
        Self {
            knob,
            reason: reason.into(),
        }
    }

    /// The name of the knob at fault, as its builder method spells it.
    pub fn knob(&self) -> &'static str {
        self.knob
    }

    /// Why the value was refused.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.knob, self.reason)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_knob() {
        let err = ConfigError::new("max", "must be greater than zero");
        assert_eq!(err.to_string(), "invalid `max`: must be greater than zero");
        assert_eq!(err.knob(), "max");
        assert_eq!(err.reason(), "must be greater than zero");
    }
}
