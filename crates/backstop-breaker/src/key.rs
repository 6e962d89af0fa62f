//! What the breakers of a keyed layer are keyed by.

use http::{Method, Uri};
use std::{borrow::Cow, fmt, sync::Arc};

/// A key function: the key of a request from its method and URI (`None`: the overflow
/// breaker).
pub type KeyFn = Arc<dyn for<'a> Fn(&'a Method, &'a Uri) -> Option<Cow<'a, str>> + Send + Sync>;

/// What the breakers of one layer are keyed by ([`BreakerConfig::per_key`](crate::BreakerConfig::per_key)).
#[derive(Clone)]
#[non_exhaustive]
pub enum BreakerKey {
    /// The request URI's authority (`host:port`): a breaker per host of the dependency.
    /// Requests without one (a path-only URI) share the overflow breaker.
    Authority,
    /// The request's path (no query). Only for a dependency with a fixed set of paths; one
    /// with ids in its paths wants a [`custom`](BreakerKey::custom) key of its routes.
    Path,
    /// A function of the method and URI.
    Custom(KeyFn),
}

impl BreakerKey {
    /// A key from a function of the method and URI, e.g. a route template:
    ///
    /// ```
    /// use backstop_breaker::BreakerKey;
    /// use std::borrow::Cow;
    ///
    /// // `/item/42/stock` → `/item/stock`: one breaker per kind of call, not per item.
    /// let key = BreakerKey::custom(|_method, uri| {
    ///     let route: Vec<&str> = uri
    ///         .path()
    ///         .split('/')
    ///         .filter(|s| !s.is_empty() && !s.bytes().all(|b| b.is_ascii_digit()))
    ///         .collect();
    ///     Some(Cow::Owned(format!("/{}", route.join("/"))))
    /// });
    /// # let _ = key;
    /// ```
    pub fn custom(
        f: impl for<'a> Fn(&'a Method, &'a Uri) -> Option<Cow<'a, str>> + Send + Sync + 'static,
    ) -> Self {
        BreakerKey::Custom(Arc::new(f))
    }

    /// The metric label a key's series carry: `authority` for [`BreakerKey::Authority`],
    /// `route` for a path or a custom key (a custom key names a route, as the client series
    /// of a service-config stack do), so breaker and client series join on one label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            BreakerKey::Authority => "authority",
            BreakerKey::Path | BreakerKey::Custom(_) => "route",
        }
    }

    pub(crate) fn of<'a>(&self, method: &'a Method, uri: &'a Uri) -> Option<Cow<'a, str>> {
        match self {
            BreakerKey::Authority => uri.authority().map(|a| Cow::Borrowed(a.as_str())),
            BreakerKey::Path => Some(Cow::Borrowed(uri.path())),
            BreakerKey::Custom(f) => f(method, uri),
        }
    }
}

impl fmt::Debug for BreakerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BreakerKey::Authority => f.write_str("Authority"),
            BreakerKey::Path => f.write_str("Path"),
            BreakerKey::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}
