//! What an answer that held an adaptive bulkhead's permit says of the dependency: the stack's
//! classifier decides, as it does for the breaker, the throttle and the retry layer.
//!
//! The trait is public in a private module (sealed): it is the bound of [`Bulkhead`]'s
//! `Service` impl, implemented only here.
//!
//! [`Bulkhead`]: super::Bulkhead

use crate::{Classify, Outcome, Rejection};
use http::Response;
use std::sync::Arc;

/// What ended a call that held a permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The dependency's answer (or a transport error).
    Dependency,
    /// The dependency failed (a 5xx, a trailers-only gRPC failure): how soon says nothing of
    /// how long it takes to serve (a load shedder's refusal is instant).
    Failed,
    /// A timeout: the attempt's bound or the deadline.
    TimedOut,
    /// A refusal made further in without calling the dependency.
    Local,
}

impl Answer {
    /// A local answer's meaning: refused before it was sent, or a deadline or an attempt's
    /// bound that passed while it was out.
    pub(super) fn of(rejection: Option<&Rejection>) -> Self {
        match rejection {
            Some(r) if r.never_sent() => Answer::Local,
            Some(Rejection::AttemptTimedOut | Rejection::DeadlineExceeded) => Answer::TimedOut,
            _ => Answer::Dependency,
        }
    }

    /// What a fixed bulkhead asks of a response: whether it was answered locally (its hold
    /// time is then no sample). Most answers carry no extension at all.
    pub(super) fn local_or_dependency<B>(response: &Response<B>) -> Self {
        match response.extensions().is_empty() {
            true => Answer::Dependency,
            false => Self::of(response.extensions().get::<Rejection>()),
        }
    }

    /// A deadline a server further on saw pass, by the crate's own wire rule (the deadline's
    /// answer is 504, or gRPC's DEADLINE_EXCEEDED): the caller felt the whole wait, whatever a
    /// classifier makes of the failure.
    fn deadline_answered<B>(response: &Response<B>) -> bool {
        response.status() == http::StatusCode::GATEWAY_TIMEOUT
            || response
                .headers()
                .get(crate::wire::grpc::GRPC_STATUS)
                .is_some_and(|code| code.as_bytes() == b"4")
    }
}

/// Judges an answer for an adaptive bulkhead (sealed: see the module docs).
pub trait Judge<Res> {
    /// What `response` says of the dependency.
    fn response(&self, response: &Res) -> Answer;
    /// What an error says of the dependency.
    fn error(&self, err: &(dyn std::error::Error + 'static)) -> Answer;
}

/// A bulkhead built alone ([`BulkheadLayer`](super::BulkheadLayer)): no classifier, so a
/// failure is a 5xx or a gRPC status other than OK in the head, as [`HttpClassifier`] and
/// [`GrpcClassifier`] see it by default, and every error not a local answer is the
/// dependency's.
///
/// [`HttpClassifier`]: crate::HttpClassifier
/// [`GrpcClassifier`]: crate::GrpcClassifier
impl<B> Judge<Response<B>> for () {
    fn response(&self, response: &Response<B>) -> Answer {
        let local = Answer::local_or_dependency(response);
        if local != Answer::Dependency {
            return local;
        }
        if Answer::deadline_answered(response) {
            return Answer::TimedOut;
        }
        let grpc = response
            .headers()
            .get(crate::wire::grpc::GRPC_STATUS)
            .map(http::HeaderValue::as_bytes);
        match (response.status().as_u16(), grpc) {
            (500..=599, _) => Answer::Failed,
            (_, Some(code)) if code != b"0" => Answer::Failed,
            _ => Answer::Dependency,
        }
    }

    fn error(&self, err: &(dyn std::error::Error + 'static)) -> Answer {
        Answer::of(Rejection::of(err).as_ref())
    }
}

/// A bulkhead in a client stack: the stack's classifier says what failed. A failure (or a
/// throttling answer) is [`Answer::Failed`]; a success, an ignored answer (a caller's error)
/// or a stream whose status is still to come is the dependency's answer; a local answer is
/// read off its [`Rejection`].
impl<C, B> Judge<Response<B>> for Arc<C>
where
    C: Classify<Response<B>>,
{
    fn response(&self, response: &Response<B>) -> Answer {
        if Answer::deadline_answered(response) {
            return Answer::TimedOut;
        }
        match self.classify_head(response) {
            Some(Outcome::Rejected) => Answer::of(response.extensions().get::<Rejection>()),
            Some(Outcome::Failure { .. } | Outcome::Throttled { .. }) => Answer::Failed,
            Some(Outcome::Success | Outcome::Ignored) | None => Answer::Dependency,
        }
    }

    fn error(&self, err: &(dyn std::error::Error + 'static)) -> Answer {
        if let Some(rejection) = Rejection::of(err) {
            return Answer::of(Some(&rejection));
        }
        match self.classify(Err(err)) {
            Outcome::Failure { .. } | Outcome::Throttled { .. } => Answer::Failed,
            _ => Answer::Dependency,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HttpClassifier, Retryable};

    fn status(code: u16) -> Response<()> {
        Response::builder().status(code).body(()).unwrap()
    }

    fn grpc(code: &str) -> Response<()> {
        Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", code)
            .body(())
            .unwrap()
    }

    fn local(rejection: Rejection) -> Response<()> {
        let mut response = status(rejection.http_status().as_u16());
        response.extensions_mut().insert(rejection);
        response
    }

    /// A classifier of a user's own: 503 is how this API says "try later" politely, a
    /// success; a 200 carrying `x-error` is a failure.
    #[derive(Clone)]
    struct Polite;

    impl Classify<Response<()>> for Polite {
        fn classify(
            &self,
            result: Result<&Response<()>, &(dyn std::error::Error + 'static)>,
        ) -> Outcome {
            match result {
                Ok(r) if r.extensions().get::<Rejection>().is_some() => Outcome::Rejected,
                Ok(r) if r.headers().contains_key("x-error") => Outcome::failure(Retryable::Never),
                Ok(_) => Outcome::Success,
                Err(_) => Outcome::Ignored,
            }
        }
    }

    /// In a stack, the stack's classifier says what failed, so the limit and the breaker
    /// agree; the deadline's own answers and local refusals keep their meaning.
    #[test]
    fn in_a_stack_the_classifier_says_what_failed() {
        let judge = Arc::new(Polite);
        assert_eq!(judge.response(&status(503)), Answer::Dependency);
        let mut flagged = status(200);
        flagged
            .headers_mut()
            .insert("x-error", "1".parse().unwrap());
        assert_eq!(judge.response(&flagged), Answer::Failed);
        assert_eq!(judge.response(&status(504)), Answer::TimedOut);
        assert_eq!(judge.response(&grpc("4")), Answer::TimedOut);
        let open = Rejection::BreakerOpen { retry_after: None };
        assert_eq!(judge.response(&local(open)), Answer::Local);
        assert_eq!(
            judge.response(&local(Rejection::AttemptTimedOut)),
            Answer::TimedOut
        );
        let io = std::io::Error::other("reset");
        assert_eq!(
            judge.error(&io),
            Answer::Dependency,
            "Polite ignores errors"
        );
        let timed_out = crate::AttemptTimedOut::new();
        assert_eq!(judge.error(&timed_out), Answer::TimedOut);
        // The HTTP preset's classifier: a transport error is a failure.
        let http = Arc::new(HttpClassifier::new());
        assert_eq!(Judge::<Response<()>>::error(&http, &io), Answer::Failed);
        assert_eq!(http.response(&status(503)), Answer::Failed);
        assert_eq!(http.response(&status(404)), Answer::Dependency);
    }

    /// Alone, a bulkhead has its own rule: a 5xx or a gRPC status other than OK in the head
    /// failed; a transport error is an answer.
    #[test]
    fn alone_a_bulkhead_has_its_own_rule() {
        assert_eq!(().response(&status(200)), Answer::Dependency);
        assert_eq!(().response(&status(404)), Answer::Dependency);
        assert_eq!(().response(&status(500)), Answer::Failed);
        assert_eq!(().response(&status(504)), Answer::TimedOut);
        assert_eq!(().response(&grpc("0")), Answer::Dependency);
        assert_eq!(().response(&grpc("14")), Answer::Failed);
        assert_eq!(().response(&grpc("4")), Answer::TimedOut);
        assert_eq!(
            ().response(&local(Rejection::ClientThrottled)),
            Answer::Local
        );
        let io = std::io::Error::other("reset");
        assert_eq!(Judge::<Response<()>>::error(&(), &io), Answer::Dependency);
        assert_eq!(
            Judge::<Response<()>>::error(&(), &crate::BreakerOpen::new(None)),
            Answer::Local
        );
    }
}
