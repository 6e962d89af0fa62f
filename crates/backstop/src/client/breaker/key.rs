//! What the breakers of a keyed layer are keyed by: the crate's [`RouteKey`], under the
//! name this crate has always given it, so the attempt layer's latency models can follow the
//! same key (`backstop::client::attempt::AttemptTimeoutLayer::per_key`).

/// What the breakers of one layer are keyed by
/// ([`BreakerConfig::per_key`](crate::client::breaker::BreakerConfig::per_key)): [`RouteKey`](crate::RouteKey).
///
/// ```
/// use backstop::client::breaker::BreakerKey;
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
pub use crate::RouteKey as BreakerKey;

/// A key function: the key of a request from its method and URI (`None`: the overflow
/// breaker).
pub use crate::KeyFn;
