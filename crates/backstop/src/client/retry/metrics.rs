//! The retry layer's metric handles (feature `metrics`; names and labels in
//! `backstop::metrics`).
//!
//! # Concurrency rule
//!
//! Registered once per layer, on the first call that records (a `OnceLock` in the layer's
//! shared state), then shared by every clone.

use crate::client::retry::stats::GiveUp;
use crate::{Outcome, metrics as names};
use metrics::{Counter, Gauge};

/// Which attempt was sent.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AttemptKind {
    First = 0,
    Retry = 1,
    Hedge = 2,
}

pub(crate) use crate::client::retry::error_type::ErrorType;

#[derive(Debug)]
pub(crate) struct RetryMetrics {
    /// By outcome; a failure's slot is unused (`failures` counts them).
    requests: [Counter; 5],
    /// Failures, by [`ErrorType`].
    failures: [Counter; 3],
    attempts: [Counter; 3],
    give_ups: [Counter; GiveUp::COUNT],
    balance: Gauge,
    /// The attempts' durations under the layer's `route`, for the attempt layer inside.
    duration: Option<crate::rt::metrics::AttemptDuration>,
}

impl RetryMetrics {
    /// The handles, with a `route` label when the layer serves some of the dependency's
    /// routes (a service config entry's methods).
    pub(crate) fn new(dependency: &str, method: Option<&str>) -> Self {
        use metrics::Label;
        crate::rt::metrics::describe();
        let labels = |key: &'static str, value: &'static str| {
            let mut labels = vec![Label::new("dependency", dependency.to_owned())];
            if let Some(method) = method {
                labels.push(Label::new("route", method.to_owned()));
            }
            labels.push(Label::new(key, value));
            labels
        };
        Self {
            // A failure is counted under its `error_type` only.
            requests: names::OUTCOMES.map(|o| match o {
                "failure" => Counter::noop(),
                _ => metrics::counter!(names::CLIENT_REQUESTS, labels("outcome", o)),
            }),
            failures: names::ERROR_TYPES.map(|e| {
                let mut labels = labels("outcome", "failure");
                labels.push(Label::new("error_type", e));
                metrics::counter!(names::CLIENT_REQUESTS, labels)
            }),
            attempts: ["first", "retry", "hedge"]
                .map(|k| metrics::counter!(names::CLIENT_ATTEMPTS, labels("kind", k))),
            give_ups: GiveUp::ALL.map(|why| {
                metrics::counter!(names::RETRY_GIVE_UPS, labels("reason", why.as_str()))
            }),
            // One budget per dependency, whatever the method.
            balance: metrics::gauge!(
                names::RETRY_BUDGET_BALANCE,
                "dependency" => dependency.to_owned()
            ),
            duration: method.map(|route| {
                crate::rt::metrics::AttemptDuration(metrics::histogram!(
                    names::CLIENT_ATTEMPT_DURATION,
                    "dependency" => dependency.to_owned(),
                    "route" => route.to_owned()
                ))
            }),
        }
    }
}

impl RetryMetrics {
    /// Whether metrics are recorded (the feature is on).
    pub(crate) const ON: bool = true;

    pub(crate) fn outcome(&self, outcome: Outcome, error: impl FnOnce() -> ErrorType) {
        match outcome {
            Outcome::Failure { .. } => self.failures[error() as usize].increment(1),
            _ => self.requests[outcome_index(outcome)].increment(1),
        }
    }

    pub(crate) fn attempt(&self, kind: AttemptKind) {
        self.attempts[kind as usize].increment(1);
    }

    pub(crate) fn give_up(&self, why: GiveUp) {
        self.give_ups[why as usize].increment(1);
    }

    pub(crate) fn balance(&self, balance: f64) {
        self.balance.set(balance);
    }

    /// gRFC A96's per-call series of a gRPC call that could be retried: `grpc.method` is the
    /// call's path, `grpc.target` the dependency's name.
    pub(crate) fn call(
        &self,
        dependency: &str,
        method: &str,
        retries: u32,
        hedges: u32,
        delay: std::time::Duration,
    ) {
        let labels = [
            metrics::Label::new("grpc.method", method.to_owned()),
            metrics::Label::new("grpc.target", dependency.to_owned()),
        ];
        // A96: "If there were no retries, 0 is not reported" (and none for no hedges): a
        // call sent once is in neither histogram, as in gRPC's own.
        if retries > 0 {
            metrics::histogram!(names::GRPC_CALL_RETRIES, labels.to_vec())
                .record(f64::from(retries));
        }
        if hedges > 0 {
            metrics::histogram!(names::GRPC_CALL_HEDGES, labels.to_vec()).record(f64::from(hedges));
        }
        metrics::histogram!(names::GRPC_CALL_RETRY_DELAY, labels.to_vec())
            .record(delay.as_secs_f64());
    }

    /// Puts the layer's attempt-duration handle, if it has a route, on `req`: an attempt
    /// layer inside records the attempts under it.
    pub(crate) fn route_attempts<B>(&self, req: &mut http::Request<B>) {
        if let Some(duration) = &self.duration {
            req.extensions_mut().insert(duration.clone());
        }
    }
}

/// Where an outcome's label sits in [`OUTCOMES`](crate::metrics::OUTCOMES).
pub(crate) fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Outcome::Success => 0,
        Outcome::Failure { .. } => 1,
        Outcome::Throttled { .. } => 2,
        Outcome::Rejected => 3,
        Outcome::Ignored => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::OUTCOMES;
    use crate::{Outcome, Retryable};

    #[test]
    fn each_outcome_has_its_label() {
        let cases = [
            (Outcome::Success, "success"),
            (Outcome::failure(Retryable::Always), "failure"),
            (
                Outcome::Throttled {
                    retryable: Retryable::Always,
                    hint: None,
                },
                "throttled",
            ),
            (Outcome::Rejected, "rejected"),
            (Outcome::Ignored, "ignored"),
        ];
        for (outcome, label) in cases {
            assert_eq!(OUTCOMES[outcome_index(outcome)], label);
        }
    }
}
