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
    /// the request, in place of a context the request may carry from another stack (a
    /// request a handler forwards in the same process carries its caller's). Outside any
    /// handler's scope (a `Buffer`'s worker) what the request carries is kept.
    pub(crate) fn begin<B>(req: &mut Request<B>) {
        if let Some(gave_up) = sink() {
            req.extensions_mut().insert(Call { gave_up });
        }
    }

    /// Where the call of `req` reports that its retries gave up, for the layer that reports
    /// it (which then takes the context off the request: nothing further in needs it, and a
    /// request that went on to another stack in the same process must not carry it there).
    /// Not `first` (the stack put a first layer outside this one): what that layer put on the
    /// request. `first`: the handler's scope, as [`begin`](Self::begin) reads it, else what the
    /// request carries.
    pub(crate) fn take_gave_up<B>(req: &mut Request<B>, first: bool) -> Option<Arc<GaveUp>> {
        let carried = req
            .extensions_mut()
            .remove::<Call>()
            .map(|call| call.gave_up);
        match first {
            true => sink().or(carried),
            false => carried,
        }
    }
}
