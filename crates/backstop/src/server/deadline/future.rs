use crate::deadline::body::local;
use crate::deadline::scope::enter;
use crate::deadline::{Deadline, DeadlineBody};
use crate::rt::timer::LazySleep;
use crate::{NotExecuted, Rejection, ResponseBody};
use http::Response;
use pin_project_lite::pin_project;
use std::{
    pin::Pin,
    task::{Context, Poll, ready},
};

pub(crate) use super::Meter;

pin_project! {
    /// The response future of [`DeadlineService`](crate::deadline::DeadlineService).
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F> {
        #[pin]
        state: Inbound<F>,
    }
}

pin_project! {
    #[project = InboundProj]
    #[project_replace = InboundReplace]
    #[derive(Debug)]
    enum Inbound<F> {
        Running {
            #[pin]
            future: F,
            // Created the first time the handler is not ready.
            #[pin]
            sleep: LazySleep,
            deadline: Option<Deadline>,
            grpc: bool,
            meter: Meter,
        },
        Rejected { rejection: Rejection, grpc: bool },
        Done,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn running(future: F, deadline: Option<Deadline>, grpc: bool, meter: Meter) -> Self {
        Self {
            state: Inbound::Running {
                future,
                sleep: LazySleep::new(),
                deadline,
                grpc,
                meter,
            },
        }
    }

    pub(crate) fn rejected(rejection: Rejection, grpc: bool) -> Self {
        Self {
            state: Inbound::Rejected { rejection, grpc },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<DeadlineBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        let (rejection, grpc, executed) = match state.as_mut().project() {
            InboundProj::Running {
                future,
                sleep,
                deadline,
                grpc,
                meter,
            } => {
                let scope = deadline.map(enter);
                let polled = future.poll(cx);
                drop(scope);
                if let Poll::Ready(result) = polled {
                    let (deadline, grpc, meter) = (*deadline, *grpc, std::mem::take(meter));
                    state.set(Inbound::Done);
                    return Poll::Ready(result.map(|response| {
                        response.map(|b| {
                            DeadlineBody::new(ResponseBody::new(b), deadline, grpc).metered(meter)
                        })
                    }));
                }
                let Some(d) = *deadline else {
                    return Poll::Pending;
                };
                // Its own timer, whatever the handler arms or hands to other tasks.
                ready!(sleep.poll_until(cx, d.instant()));
                tracing::debug!(grpc = *grpc, "deadline expired: the handler is cancelled");
                super::count_expired(meter);
                // The handler started: it may have done its work, so no `NotExecuted`.
                (Rejection::DeadlineExceeded, *grpc, true)
            }
            InboundProj::Rejected { rejection, grpc } => (*rejection, *grpc, false),
            InboundProj::Done => panic!("ResponseFuture polled after completion"),
        };
        // Dropping the handler's future here is what cancels its work.
        state.project_replace(Inbound::Done);
        let mut response = local(rejection, grpc);
        if !executed {
            // Refused on arrival: the handler never ran (an idempotency layer releases the key).
            response.extensions_mut().insert(NotExecuted);
        }
        Poll::Ready(Ok(response))
    }
}
