//! The per-call context: what the first client layer a call meets decides for the whole call,
//! carried on its request to the layers inside.
//!
//! A layer inside reads the context off the request, wherever it is called (behind a `Buffer`,
//! on another task), never from a thread-local: only the first layer of a call looks at the
//! handler's scope (which it inherits, as user code does with
//! [`current()`](crate::deadline::current)), and what it found travels with the request. A
//! layer knows it is not the first when the stack that built it said so (the presets), or when
//! the request already carries a context.
//!
//! **Concurrency rule.** A `Call` belongs to its request; what it points to says its own rule
//! ([`GaveUp`]).

use crate::server::pushback::{GaveUp, sink};
use http::Request;
use std::sync::Arc;

/// The context of one call, as a request extension (crate-private: users neither see nor set
/// it). Put on the request only when it says something: a call without one has nothing to
/// report to.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// Where the call reports that its retries gave up: the request of the server handler that
    /// made it, under a [`PushbackLayer`](crate::server::pushback::PushbackLayer).
    gave_up: Arc<GaveUp>,
}

impl Call {
    /// As the first layer of a call: picks up what the handler's scope offers and puts it on
    /// the request.
    pub(crate) fn begin<B>(req: &mut Request<B>) {
        if req.extensions().get::<Call>().is_none()
            && let Some(gave_up) = sink()
        {
            req.extensions_mut().insert(Call { gave_up });
        }
    }

    /// Where the call of `req` reports that its retries gave up: what an outer layer put on
    /// the request, else (when `first`, the stack put nothing outside this layer) what the
    /// handler's scope offers.
    pub(crate) fn gave_up<B>(req: &Request<B>, first: bool) -> Option<Arc<GaveUp>> {
        match req.extensions().get::<Call>() {
            Some(call) => Some(call.gave_up.clone()),
            None if first => sink(),
            None => None,
        }
    }
}
