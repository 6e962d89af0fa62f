//! The name of a dependency, carried by every event a client layer emits about it.
//!
//! # Concurrency rule
//!
//! Set once (a `OnceLock`), then read without a lock by every clone of the layer.

use crate::ConfigError;
use std::sync::{Arc, OnceLock};

/// A dependency's name, set at most once (the facade's `ClientLayer::name` sets it on every
/// layer of a stack) and read by every event the layer emits. Unnamed reads as `""`.
#[derive(Debug, Default)]
pub struct DependencyName(OnceLock<Arc<str>>);

impl DependencyName {
    /// Names the dependency.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `name` when the layer already has another name (layers shared
    /// by two stacks cannot tell two dependencies apart).
    pub fn set(&self, name: &str) -> Result<(), ConfigError> {
        let current = self.0.get_or_init(|| Arc::from(name));
        if &**current == name {
            Ok(())
        } else {
            Err(ConfigError::new(
                "name",
                format!("this layer is already named {current:?}; got {name:?}"),
            ))
        }
    }

    /// The name, or `""` when unnamed.
    pub fn get(&self) -> &str {
        self.0.get().map_or("", |name| name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_set_once() {
        let name = DependencyName::default();
        assert_eq!(name.get(), "");
        name.set("inventory").unwrap();
        name.set("inventory").unwrap();
        assert_eq!(name.get(), "inventory");
        let err = name.set("billing").unwrap_err();
        assert_eq!(err.knob(), "name");
        assert_eq!(name.get(), "inventory");
    }
}
