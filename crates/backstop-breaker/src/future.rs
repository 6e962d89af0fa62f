use crate::{
    BreakerBody,
    shared::Handle,
    state::{Admission, Verdict},
};
use backstop_core::{BoxError, BreakerOpen, Classify, Outcome, Rejection};
use http::Response;
use pin_project_lite::pin_project;
use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};
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
    /// A permit, or none for a call that is not counted.
    pub(crate) fn new(
        handle: &Arc<Handle<C>>,
        admission: Admission,
        start: Option<Instant>,
    ) -> Option<Self> {
        (admission != Admission::Passive).then(|| Self {
            handle: handle.clone(),
            admission,
            start,
            armed: true,
        })
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
        let verdict = match outcome {
            Outcome::Success => Verdict::Counted {
                failure: false,
                slow,
            },
            Outcome::Failure { .. } => Verdict::Counted {
                failure: true,
                slow,
            },
            Outcome::Throttled { .. } if self.handle.count_throttled => Verdict::Counted {
                failure: true,
                slow,
            },
            Outcome::Throttled { .. } | Outcome::Rejected | Outcome::Ignored => Verdict::Nothing,
        };
        self.handle
            .complete(self.admission, verdict, self.handle.stripe());
    }

    /// The breaker's classifier.
    pub(crate) fn classifier(&self) -> &C {
        &self.handle.classifier
    }

    /// Classifies the response and records it now, or hands the permit to the body when the
    /// outcome is in the trailers.
    pub(crate) fn watch<B>(self, response: Response<B>) -> Response<BreakerBody<B, C>>
    where
        C: Classify<Response<B>>,
    {
        let classifier = self.classifier();
        let outcome = classifier.classify(Ok(&response));
        if outcome == Outcome::Success && classifier.awaits_trailers(&response) {
            return response.map(|body| BreakerBody::watching(body, self, outcome));
        }
        self.finish(outcome);
        response.map(BreakerBody::new)
    }
}

impl<C> Drop for Permit<C> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let verdict = if self.slow() {
            Verdict::Counted {
                failure: false,
                slow: true,
            }
        } else if matches!(self.admission, Admission::Probe(_)) {
            Verdict::Nothing
        } else {
            return; // a closed-state call that ends as nothing: no shared state to touch
        };
        self.handle
            .complete(self.admission, verdict, self.handle.stripe());
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

pin_project! {
    /// The response future of [`Breaker`](crate::Breaker).
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F, C>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, C> {
        Running {
            #[pin]
            future: F,
            permit: Option<Permit<C>>,
        },
        Open {
            retry_after: Option<Duration>,
            grpc: bool,
        },
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn running(future: F, permit: Option<Permit<C>>) -> Self {
        Self {
            kind: Kind::Running { future, permit },
        }
    }

    pub(crate) fn open(retry_after: Option<Duration>, grpc: bool) -> Self {
        Self {
            kind: Kind::Open { retry_after, grpc },
        }
    }
}

impl<F, C> fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Running { permit, .. } => f
                .debug_struct("ResponseFuture::Running")
                .field("permit", permit)
                .finish_non_exhaustive(),
            Kind::Open { retry_after, grpc } => f
                .debug_struct("ResponseFuture::Open")
                .field("retry_after", retry_after)
                .field("grpc", grpc)
                .finish(),
        }
    }
}

impl<F, C, B, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    C: Classify<Response<B>>,
{
    type Output = Result<Response<BreakerBody<B, C>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Running { future, permit } => {
                let result = ready!(future.poll(cx)).map_err(Into::into);
                let permit = permit.take();
                Poll::Ready(match (result, permit) {
                    (Ok(response), Some(permit)) => Ok(permit.watch(response)),
                    (Ok(response), None) => Ok(response.map(BreakerBody::new)),
                    (Err(err), permit) => {
                        if let Some(permit) = permit {
                            let outcome = permit.classifier().classify(Err(&*err));
                            permit.finish(outcome);
                        }
                        Err(err)
                    }
                })
            }
            // A gRPC caller gets UNAVAILABLE as a response, as a gRPC client library reports
            // it (tonic would turn an error into UNKNOWN); others get the error.
            KindProj::Open { retry_after, grpc } => Poll::Ready(if *grpc {
                let rejection = Rejection::BreakerOpen {
                    retry_after: *retry_after,
                };
                Ok(rejection.into_response(true).map(BreakerBody::local))
            } else {
                Err(Box::new(BreakerOpen::new(*retry_after)))
            }),
        }
    }
}
