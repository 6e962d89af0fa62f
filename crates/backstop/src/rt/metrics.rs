//! The helpers every layer calls when it registers and records its metric handles (the names
//! and labels themselves are public, in [`crate::metrics`]).

use crate::metrics::{
    ADMISSION_REJECTIONS, BREAKER_REJECTIONS, BREAKER_STATE, BREAKER_TRANSITIONS,
    BULKHEAD_IN_FLIGHT, BULKHEAD_LIMIT, BULKHEAD_REJECTIONS, CLIENT_ATTEMPT_DURATION,
    CLIENT_ATTEMPTS, CLIENT_REQUESTS, DEADLINE_EXPIRED, DEADLINE_MALFORMED, IDEMPOTENCY_REQUESTS,
    RETRY_BUDGET_BALANCE, RETRY_GIVE_UPS, THROTTLE_PROBABILITY, THROTTLE_REJECTIONS,
};

/// The `backstop.client.attempt.duration` handle of a retry layer that serves some of a
/// dependency's routes (a service config's entry, labelled `route`): the layer puts it on each
/// attempt it sends, and an attempt layer inside without a key of its own records the
/// attempt's duration there, so the durations carry the route the request series carry.
#[derive(Debug, Clone)]
pub(crate) struct AttemptDuration(pub metrics::Histogram);

/// Describes every name to the installed recorder (the help text a Prometheus exporter prints);
/// each layer calls it when it registers its handles.
pub(crate) fn describe() {
    metrics::describe_counter!(CLIENT_REQUESTS, "Calls through a client stack, by outcome");
    metrics::describe_counter!(
        CLIENT_ATTEMPTS,
        "Attempts sent, by kind (first, retry, hedge)"
    );
    metrics::describe_histogram!(
        CLIENT_ATTEMPT_DURATION,
        metrics::Unit::Seconds,
        "Duration of attempts that waited for their answer"
    );
    metrics::describe_counter!(
        RETRY_GIVE_UPS,
        "Failures returned without a retry, by reason"
    );
    metrics::describe_gauge!(RETRY_BUDGET_BALANCE, "Retries the budget would allow now");
    metrics::describe_gauge!(
        BREAKER_STATE,
        "Breaker state: 0 closed, 1 open, 2 half-open"
    );
    metrics::describe_counter!(BREAKER_TRANSITIONS, "Breaker state changes, by new state");
    metrics::describe_counter!(BREAKER_REJECTIONS, "Calls refused by an open breaker");
    metrics::describe_counter!(DEADLINE_EXPIRED, "Deadlines expired, by side");
    metrics::describe_counter!(
        DEADLINE_MALFORMED,
        "Malformed grpc-timeout headers received"
    );
    metrics::describe_counter!(
        THROTTLE_REJECTIONS,
        "First attempts refused by the client's adaptive throttle"
    );
    metrics::describe_gauge!(
        THROTTLE_PROBABILITY,
        "The adaptive throttle's rejection probability"
    );
    metrics::describe_counter!(
        BULKHEAD_REJECTIONS,
        "Calls refused by a bulkhead, by reason"
    );
    metrics::describe_gauge!(BULKHEAD_LIMIT, "An adaptive bulkhead's learnt limit");
    metrics::describe_gauge!(
        BULKHEAD_IN_FLIGHT,
        "Calls holding an adaptive bulkhead's permit"
    );
    metrics::describe_counter!(
        ADMISSION_REJECTIONS,
        "Requests refused on arrival: too little deadline left for the route"
    );
    metrics::describe_counter!(
        IDEMPOTENCY_REQUESTS,
        "Keyed requests through an idempotency layer, by outcome"
    );
}
