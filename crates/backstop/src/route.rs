//! What a layer keys its per-route state by: the breaker's breakers per key, the attempt
//! layer's latency models per key. One type, so a stack keys both the same way.

use http::{Method, Uri};
use std::{borrow::Cow, fmt, sync::Arc};

/// A key function: the key of a request from its method and URI (`None`: no key; the layer's
/// own, unkeyed state takes the request).
pub type KeyFn = Arc<dyn for<'a> Fn(&'a Method, &'a Uri) -> Option<Cow<'a, str>> + Send + Sync>;

/// What a keyed layer keys its state by: the breaker's breakers
/// (`backstop::client::breaker::BreakerConfig::per_key`)
/// and the attempt layer's latency models
/// (`backstop::client::attempt::AttemptTimeoutLayer::per_key`).
///
/// ```
/// use backstop::RouteKey;
/// use http::{Method, Uri};
///
/// let uri: Uri = "http://api.example:8080/report?day=1".parse().unwrap();
/// assert_eq!(RouteKey::Path.of(&Method::GET, &uri).as_deref(), Some("/report"));
/// assert_eq!(RouteKey::Authority.of(&Method::GET, &uri).as_deref(), Some("api.example:8080"));
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub enum RouteKey {
    /// The request URI's authority (`host:port`): one per host of the dependency. Requests
    /// without one (a path-only URI) have no key.
    Authority,
    /// The request's path (no query). Only for a dependency with a fixed set of paths; one
    /// with ids in its paths wants a [`custom`](RouteKey::custom) key of its routes.
    Path,
    /// A function of the method and URI.
    Custom(KeyFn),
}

impl RouteKey {
    /// A key from a function of the method and URI, e.g. a route template:
    ///
    /// ```
    /// use backstop::RouteKey;
    /// use std::borrow::Cow;
    ///
    /// // `/item/42/stock` → `/item/stock`: one key per kind of call, not per item.
    /// let key = RouteKey::custom(|_method, uri| {
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
        RouteKey::Custom(Arc::new(f))
    }

    /// The key of a request with this method and URI; `None`: it has none.
    pub fn of<'a>(&self, method: &'a Method, uri: &'a Uri) -> Option<Cow<'a, str>> {
        match self {
            RouteKey::Authority => uri.authority().map(|a| Cow::Borrowed(a.as_str())),
            RouteKey::Path => Some(Cow::Borrowed(uri.path())),
            RouteKey::Custom(f) => f(method, uri),
        }
    }
}

impl fmt::Debug for RouteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteKey::Authority => f.write_str("Authority"),
            RouteKey::Path => f.write_str("Path"),
            RouteKey::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// The metric label a keyed layer's series carry their key under: `authority` for
/// [`RouteKey::Authority`](RouteKey::Authority), `route` for a path or a custom key (a
/// custom key names a route, as the client series of a service-config stack do), so the
/// breaker's, the attempt bound's and the client series of one route join on one label.
pub(crate) fn key_label(key: &RouteKey) -> &'static str {
    match key {
        RouteKey::Authority => "authority",
        _ => "route",
    }
}
