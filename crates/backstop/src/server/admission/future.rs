use super::Shared;
use crate::{NotExecuted, Rejection, ResponseBody};
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
    /// The response future of [`Admission`](super::Admission).
    #[must_use = "futures do nothing unless polled"]
    pub struct AdmissionFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Passed {
            #[pin]
            future: F,
        },
        Measured {
            #[pin]
            future: F,
            shared: Arc<Shared>,
            route: usize,
            started: Instant,
        },
        Refused {
            grpc: bool,
        },
    }
}

impl<F> AdmissionFuture<F> {
    pub(crate) fn passed(future: F) -> Self {
        Self {
            kind: Kind::Passed { future },
        }
    }

    pub(crate) fn measured(future: F, shared: Arc<Shared>, route: usize, started: Instant) -> Self {
        Self {
            kind: Kind::Measured {
                future,
                shared,
                route,
                started,
            },
        }
    }

    pub(crate) fn refused(grpc: bool) -> Self {
        Self {
            kind: Kind::Refused { grpc },
        }
    }
}

impl<F> fmt::Debug for AdmissionFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Passed { .. } => f.write_str("AdmissionFuture::Passed"),
            Kind::Measured { route, .. } => f
                .debug_struct("AdmissionFuture::Measured")
                .field("route", route)
                .finish_non_exhaustive(),
            Kind::Refused { grpc } => f
                .debug_struct("AdmissionFuture::Refused")
                .field("grpc", grpc)
                .finish(),
        }
    }
}

impl<F, B, E> Future for AdmissionFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passed { future } => {
                Poll::Ready(ready!(future.poll(cx)).map(|r| r.map(ResponseBody::new)))
            }
            KindProj::Measured {
                future,
                shared,
                route,
                started,
            } => {
                let result = ready!(future.poll(cx));
                let now = Instant::now();
                shared.record(*route, now.saturating_duration_since(*started), now);
                Poll::Ready(result.map(|r| r.map(ResponseBody::new)))
            }
            KindProj::Refused { grpc } => {
                let mut response = Rejection::DeadlineExceeded.into_response(*grpc);
                // The handler never ran: an idempotency layer releases the key.
                response.extensions_mut().insert(NotExecuted);
                Poll::Ready(Ok(response))
            }
        }
    }
}
