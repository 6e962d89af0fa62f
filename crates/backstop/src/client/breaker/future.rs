use crate::client::breaker::BreakerBody;
use crate::client::breaker::permit::Permit;
use crate::{BoxError, BreakerOpen, Classify, Rejection};
use http::Response;
use pin_project_lite::pin_project;
use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

pin_project! {
    /// The response future of [`Breaker`](crate::client::breaker::Breaker).
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
