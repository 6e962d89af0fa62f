use super::service::Shared;
use crate::client::retry::{CallInfo, GiveUp, RetryError};
use crate::{BoxError, Classify, ClientThrottled, Outcome, Rejection, ResponseBody};
use http::Response;
use pin_project_lite::pin_project;
use std::{
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};
use tokio::time::Instant;

pin_project! {
    /// The response future of [`Throttle`](super::Throttle).
    #[must_use = "futures do nothing unless polled"]
    pub struct ThrottleFuture<F, C> {
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
            call: InFlight<C>,
        },
        Passed {
            #[pin]
            future: F,
        },
        Refused {
            grpc: bool,
        },
    }
}

impl<F, C> ThrottleFuture<F, C> {
    pub(crate) fn running(
        future: F,
        shared: Arc<Shared<C>>,
        sent: u64,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
            kind: Kind::Running {
                future,
                call: InFlight {
                    shared: Some(shared),
                    sent,
                    deadline,
                },
            },
        }
    }

    /// The call of an off layer: passed through, not counted.
    pub(crate) fn passed(future: F) -> Self {
        Self {
            kind: Kind::Passed { future },
        }
    }

    pub(crate) fn refused(grpc: bool) -> Self {
        Self {
            kind: Kind::Refused { grpc },
        }
    }
}

impl<F, C> fmt::Debug for ThrottleFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Running { .. } => f.write_str("ThrottleFuture::Running"),
            Kind::Passed { .. } => f.write_str("ThrottleFuture::Passed"),
            Kind::Refused { grpc } => f
                .debug_struct("ThrottleFuture::Refused")
                .field("grpc", grpc)
                .finish(),
        }
    }
}

impl<F, C, B, E> Future for ThrottleFuture<F, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    C: Classify<Response<B>>,
{
    type Output = Result<Response<ResponseBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Running { future, call } => {
                let result = ready!(future.poll(cx)).map_err(Into::into);
                let shared = call.shared.take().expect("polled after completion");
                // A sent call is counted as a request when its outcome is known, with its
                // accept: counted when sent, the calls still in flight would read as refused
                // (a slow dependency's first second, all requests and no accepts, would be
                // throttled at once).
                // A running call is one of a layer that is on: it has a classifier.
                let classifier = shared.classifier.as_ref();
                let accepted = classifier.is_some_and(|classifier| match &result {
                    Ok(response) => match classifier.classify_head(response) {
                        // A stream whose status is still to come: the server took the call.
                        None => true,
                        Some(Outcome::Rejected) => refused_inside(Ok(response)),
                        Some(outcome) => shared.throttle.accepts(&outcome),
                    },
                    Err(err) => match classifier.classify(Err(&**err)) {
                        Outcome::Rejected => refused_inside::<B>(Err(&**err)),
                        outcome => shared.throttle.accepts(&outcome),
                    },
                });
                shared.throttle.sent_ended(call.sent, accepted);
                Poll::Ready(result.map(|r| r.map(ResponseBody::new)))
            }
            KindProj::Passed { future } => Poll::Ready(match ready!(future.poll(cx)) {
                Ok(response) => Ok(response.map(ResponseBody::new)),
                Err(err) => Err(err.into()),
            }),
            KindProj::Refused { grpc } => Poll::Ready(refusal(*grpc)),
        }
    }
}

/// A sent call: when it was let through, and its deadline if it has one. Dropped before its
/// answer, it counts as a request without an accept only if its deadline had passed (the
/// dependency did not answer in time); a call its caller let go of earlier (a lost race, a
/// `select!`, a hedge) or that had no deadline says nothing about the dependency and counts as
/// nothing.
struct InFlight<C> {
    shared: Option<Arc<Shared<C>>>,
    sent: u64,
    deadline: Option<Instant>,
}

impl<C> Drop for InFlight<C> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take()
            && self.deadline.is_some_and(|d| Instant::now() >= d)
        {
            shared.throttle.sent_ended(self.sent, false);
        }
    }
}

/// Whether a locally rejected call was refused before it was sent, by a layer inside (a
/// breaker, an adaptive limit): counted as accepted, since the dependency never saw it
/// (module docs, "Counts"; the rule is [`Rejection`]'s own).
#[cold]
#[inline(never)]
fn refused_inside<B>(result: Result<&Response<B>, &(dyn std::error::Error + 'static)>) -> bool {
    let rejection = match result {
        Ok(response) => response.extensions().get::<Rejection>().copied(),
        Err(err) => Rejection::of(err),
    };
    rejection.is_some_and(Rejection::never_sent)
}

/// The answer of a refused call: nothing was sent, as its `CallInfo` says.
#[cold]
#[inline(never)]
fn refusal<B>(grpc: bool) -> Result<Response<ResponseBody<B>>, BoxError> {
    let info = CallInfo::new(0, Some(GiveUp::Throttled));
    if grpc {
        let mut response = Rejection::ClientThrottled.into_response(true);
        response.extensions_mut().insert(info);
        Ok(response)
    } else {
        Err(Box::new(RetryError::new(
            0,
            Some(GiveUp::Throttled),
            Box::new(ClientThrottled::new()),
        )))
    }
}
