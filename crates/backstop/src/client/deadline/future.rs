use crate::deadline::body::local;
use crate::deadline::scope::enter;
use crate::deadline::{Deadline, DeadlineBody};
use crate::rt::timer::LazySleep;
use crate::{BoxError, DeadlineExceeded, Rejection, ResponseBody};
use http::Response;
use pin_project_lite::pin_project;
use std::{
    pin::Pin,
    task::{Context, Poll, ready},
};
use tokio::time::Instant;

/// What counts a bounded outbound call's expiry: the dependency's counter with the `metrics`
/// feature, nothing otherwise.
#[cfg(feature = "metrics")]
pub(crate) type Meter = metrics::Counter;
/// What counts a bounded outbound call's expiry: nothing without the `metrics` feature.
#[cfg(not(feature = "metrics"))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meter;

pin_project! {
    /// The response future of [`PropagateDeadline`](crate::deadline::PropagateDeadline).
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct PropagateFuture<F> {
        #[pin]
        state: Outbound<F>,
    }
}

pin_project! {
    #[project = OutboundProj]
    #[project_replace = OutboundReplace]
    #[derive(Debug)]
    enum Outbound<F> {
        // `grpc`: a local failure is answered as a trailers-only response.
        Unbounded { #[pin] future: F, grpc: bool },
        Bounded {
            #[pin]
            future: F,
            // Created the first time the call is not ready: a call answered at once never
            // touches the timer.
            #[pin]
            sleep: LazySleep,
            deadline: Deadline,
            wire_deadline: Deadline,
            grpc: bool,
            meter: Meter,
        },
        Expired { grpc: bool, meter: Meter },
        Done,
    }
}

impl<F> PropagateFuture<F> {
    pub(crate) fn unbounded(future: F, grpc: bool) -> Self {
        Self {
            state: Outbound::Unbounded { future, grpc },
        }
    }

    pub(crate) fn bounded(
        future: F,
        deadline: Deadline,
        wire_deadline: Deadline,
        grpc: bool,
        meter: Meter,
    ) -> Self {
        Self {
            state: Outbound::Bounded {
                future,
                sleep: LazySleep::new(),
                deadline,
                wire_deadline,
                grpc,
                meter,
            },
        }
    }

    pub(crate) fn expired(grpc: bool, meter: Meter) -> Self {
        Self {
            state: Outbound::Expired { grpc, meter },
        }
    }
}

/// An error of the call, as its caller gets it: for a gRPC call, a local failure (backstop's
/// own error anywhere in its chain: an attempt out of its bound, an open breaker, a refusal)
/// is the trailers-only response that reports it, whether the call has a deadline or not
/// (tonic turns an `Err` into UNKNOWN); anything else, and every error of a plain HTTP call,
/// passes through.
fn local_failure<B>(e: BoxError, grpc: bool) -> Result<Response<DeadlineBody<B>>, BoxError> {
    match Rejection::of(&*e) {
        Some(rejection) if grpc => Ok(local(rejection, true)),
        _ => Err(e),
    }
}

impl<F, B, E> Future for PropagateFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<DeadlineBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        let (grpc, meter) = match state.as_mut().project() {
            OutboundProj::Unbounded { future, grpc } => {
                let result = ready!(future.poll(cx));
                let grpc = *grpc;
                state.set(Outbound::Done);
                return Poll::Ready(match result {
                    Ok(response) => {
                        Ok(response.map(|b| DeadlineBody::new(ResponseBody::new(b), None, false)))
                    }
                    Err(e) => local_failure(e.into(), grpc),
                });
            }
            OutboundProj::Bounded {
                future,
                sleep,
                deadline,
                wire_deadline,
                grpc,
                meter,
            } => {
                let polled = {
                    let _scope = enter(*deadline);
                    future.poll(cx)
                };
                match polled {
                    Poll::Ready(Ok(response)) => {
                        let (deadline, grpc) = (*deadline, *grpc);
                        state.set(Outbound::Done);
                        return Poll::Ready(Ok(response.map(|b| {
                            DeadlineBody::new(ResponseBody::new(b), Some(deadline), grpc)
                        })));
                    }
                    Poll::Ready(Err(e)) => {
                        // A failure after the time the server was given is the deadline's.
                        if Instant::now() >= wire_deadline.instant() {
                            (*grpc, meter)
                        } else {
                            // With the deadline still ahead (an attempt that ran out of its
                            // own bound, say): said as such, and not counted as an expired
                            // deadline.
                            let grpc = *grpc;
                            state.set(Outbound::Done);
                            return Poll::Ready(local_failure(e.into(), grpc));
                        }
                    }
                    Poll::Pending => {
                        // Its own timer, whatever the layers inside arm.
                        ready!(sleep.poll_until(cx, deadline.instant()));
                        (*grpc, meter)
                    }
                }
            }
            OutboundProj::Expired { grpc, meter } => (*grpc, meter),
            OutboundProj::Done => panic!("PropagateFuture polled after completion"),
        };
        #[cfg(feature = "metrics")]
        meter.increment(1);
        #[cfg(not(feature = "metrics"))]
        let Meter = *meter;
        // Drops the call's future: the request is cancelled, not left running.
        state.project_replace(Outbound::Done);
        Poll::Ready(if grpc {
            Ok(local(Rejection::DeadlineExceeded, true))
        } else {
            Err(DeadlineExceeded::new().into())
        })
    }
}
