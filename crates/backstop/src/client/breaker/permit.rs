//! The one owner of a call's cancellation rules: an admitted call's [`Permit`], which a
//! response hands to its body when the outcome is in the trailers, and [`CallPermit`], the
//! same claim for calls made outside tower.

use crate::client::breaker::BreakerBody;
use crate::client::breaker::shared::Handle;
use crate::client::breaker::state::{Admission, Tally};
use crate::{Classify, Outcome, Retryable};
use http::Response;
use std::{fmt, sync::Arc, time::Duration};
use tokio::time::Instant;

/// An admitted call's claim on the breaker, held until its outcome is known.
///
/// Dropped without an outcome (the call was cancelled, or its body dropped before the end),
/// it records nothing and gives a half-open probe slot back, unless slow calls are detected
/// and the call had already run for the slow-call duration: then it was slow, whoever gave
/// up on it, and it counts as a slow call. (Otherwise a dependency that hangs until the
/// caller's deadline cancels every call would never be seen as slow.)
pub(crate) struct Permit<C> {
    handle: Arc<Handle<C>>,
    admission: Admission,
    start: Option<Instant>,
    armed: bool,
}

impl<C> Permit<C> {
    /// Asks `handle`'s breaker to let a call in: its permit (none for a call that is not
    /// counted), or how long until calls pass again (`None`: no time can be promised). The
    /// clock is read only with slow-call detection on. The one admission of the `Breaker`
    /// service and of `BreakerLayer::try_acquire`.
    pub(crate) fn admit(handle: &Arc<Handle<C>>) -> Result<Option<Self>, Option<Duration>> {
        let admission = handle.admit()?;
        let start = handle.slow.map(|_| Instant::now());
        Ok((admission != Admission::Passive).then(|| Self {
            handle: handle.clone(),
            admission,
            start,
            armed: true,
        }))
    }

    /// Whether the call has run for at least the slow-call duration.
    fn slow(&self) -> bool {
        match (self.start, self.handle.slow) {
            (Some(start), Some(limit)) => start.elapsed() >= limit,
            _ => false,
        }
    }

    /// Records the call's outcome.
    pub(crate) fn finish(mut self, outcome: Outcome) {
        self.armed = false;
        let slow = self.slow();
        let tally = match outcome {
            Outcome::Success => Tally::Counted {
                failure: false,
                slow,
            },
            Outcome::Failure { .. } => Tally::Counted {
                failure: true,
                slow,
            },
            Outcome::Throttled { .. } | Outcome::Rejected | Outcome::Ignored => Tally::Nothing,
        };
        self.handle
            .complete(self.admission, tally, self.handle.stripe());
    }

    /// The breaker's classifier.
    pub(crate) fn classifier(&self) -> &C {
        &self.handle.classifier
    }
}

impl<C> Drop for Permit<C> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let tally = if self.slow() {
            Tally::Counted {
                failure: false,
                slow: true,
            }
        } else if matches!(self.admission, Admission::Probe(_)) {
            Tally::Nothing
        } else {
            return; // a closed-state call that ends as nothing: no shared state to touch
        };
        self.handle
            .complete(self.admission, tally, self.handle.stripe());
    }
}

impl<C> fmt::Debug for Permit<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("admission", &self.admission)
            .field("armed", &self.armed)
            .finish()
    }
}

impl<C> Permit<C> {
    /// Classifies the response and records it now, or hands the permit to the body when the
    /// outcome is in the trailers.
    #[inline(always)]
    pub(crate) fn watch<B>(self, response: Response<B>) -> Response<BreakerBody<B, C>>
    where
        C: Classify<Response<B>>,
    {
        match self.classifier().classify_head(&response) {
            Some(outcome) => {
                self.finish(outcome);
                response.map(BreakerBody::new)
            }
            None => response.map(|body| BreakerBody::watching(body, self)),
        }
    }
}

/// A call the breaker let through, made outside tower; see
/// [`BreakerLayer::try_acquire`](crate::client::breaker::BreakerLayer::try_acquire).
///
/// Give it the call's outcome with [`success`](Self::success), [`failure`](Self::failure) or
/// [`record`](Self::record) (any [`Outcome`]: a [throttled](Outcome::Throttled) or an
/// [ignored](Outcome::Ignored) one counts for nothing; record a rate limit you want counted as
/// a failure). Dropped without an outcome, it counts as a cancelled call: nothing, a probe
/// slot given back, or a slow call when slow-call detection is on and the call had run that
/// long.
#[must_use = "a permit records nothing until it is given the call's outcome"]
pub struct CallPermit<C> {
    /// `None` when the breaker records nothing (`Mode::Disabled`).
    pub(crate) permit: Option<Permit<C>>,
}

impl<C> CallPermit<C> {
    /// Records the call's outcome.
    pub fn record(self, outcome: Outcome) {
        if let Some(permit) = self.permit {
            permit.finish(outcome);
        }
    }

    /// Records a success.
    pub fn success(self) {
        self.record(Outcome::Success);
    }

    /// Records a failure of the dependency.
    pub fn failure(self) {
        self.record(Outcome::failure(Retryable::Never));
    }
}

impl<C> std::fmt::Debug for CallPermit<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallPermit")
            .field("permit", &self.permit)
            .finish()
    }
}
