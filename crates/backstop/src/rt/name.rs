//! The name of a dependency, carried by every event and metric a client layer emits about it.
//!
//! # Concurrency rule
//!
//! None needed: a name is fixed when its layer is built (each layer's `named`) and never
//! changes; every clone of the layer reads the same immutable string.

use std::sync::Arc;

/// A dependency's name, fixed when its layer is built and read by every event the layer
/// emits. Unnamed reads as `""`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DependencyName(Option<Arc<str>>);

impl DependencyName {
    /// The name `name` (`""`: unnamed).
    pub(crate) fn new(name: &str) -> Self {
        Self((!name.is_empty()).then(|| Arc::from(name)))
    }

    /// The name, or `""` when unnamed.
    pub(crate) fn get(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unnamed_reads_as_empty() {
        assert_eq!(DependencyName::default().get(), "");
        assert_eq!(DependencyName::new("").get(), "");
        assert_eq!(DependencyName::new("inventory").get(), "inventory");
    }
}
