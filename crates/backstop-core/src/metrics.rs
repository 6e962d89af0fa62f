//! The metrics backstop records through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`): names, labels, and the handles of one dependency.
//!
//! Install the exporter you already use (Prometheus, StatsD, OpenTelemetry) as the `metrics`
//! recorder **before the first call** through a stack: each layer registers its handles with
//! the recorder installed when a call first needs them, and keeps them.
//!
//! Names follow OpenTelemetry's style (dot-separated, the unit in the description, durations
//! in seconds); a Prometheus exporter writes the dots as underscores
//! (`backstop_client_requests`).
//!
//! | name | kind | labels | moves when |
//! |------|------|--------|------------|
//! | `backstop.client.requests` | counter | `dependency`, `outcome` | a call through a client stack ends: `success`, `failure`, `throttled` (429 / RESOURCE_EXHAUSTED), `rejected` (refused by backstop itself: an open breaker, a spent deadline), `ignored` (a caller error, e.g. HTTP 4xx) |
//! | `backstop.client.attempts` | counter | `dependency`, `kind` | an attempt is sent: `first`, `retry`, `hedge` |
//! | `backstop.client.attempt.duration` | histogram (s) | `dependency` | an attempt that had to wait ends (the attempt timeout layer's measurement; an attempt answered on its first poll is not timed) |
//! | `backstop.retry.give_ups` | counter | `dependency`, `reason` | a failure is returned without a retry; `reason` as `GiveUp::as_str` (backstop-retry): `not_retryable`, `attempts`, `not_idempotent`, `hint`, `deadline`, `reserve`, `budget`, `not_replayable` |
//! | `backstop.retry.budget.balance` | gauge | `dependency` | the retry budget changes (its tokens: retries it would allow now) |
//! | `backstop.breaker.state` | gauge | `dependency` | the breaker changes state: 0 closed, 1 open, 2 half-open |
//! | `backstop.breaker.transitions` | counter | `dependency`, `to` | the breaker changes state: `to` = `closed`, `open`, `half_open` |
//! | `backstop.breaker.rejections` | counter | `dependency` | the breaker refuses a call |
//! | `backstop.deadline.expired` | counter | `side`, `dependency` (client side) | a deadline expires: `side = client` for an outbound call answered DEADLINE_EXCEEDED / an error by the stack, `side = server` for a request cancelled or refused at arrival by the server's deadline layer |
//! | `backstop.deadline.malformed` | counter | — | a server's deadline layer receives a malformed `grpc-timeout` |
//! | `backstop.throttle.rejections` | counter | `dependency` | the client's adaptive throttle refuses a first attempt |
//! | `backstop.throttle.probability` | gauge | `dependency` | the throttle refuses a call: set to the rejection probability that call was drawn against (recomputed at most once per tenth of a window bucket; the gauge keeps its last value once refusals stop) |
//! | `backstop.bulkhead.rejections` | counter | `dependency`, `reason` | the client's bulkhead refuses a call; `reason` names the knob: `max_concurrency` (no permit could come before the call's deadline), `max_wait` (waited that long), `max_queue` (that many calls already waited) |
//! | `backstop.admission.rejections` | counter | — | a server's admission layer refuses a request whose remaining deadline is below the route's measured need |
//!
//! The client series of a gRPC stack built from a service config carry a `method` label
//! (the `methodConfig` entry's names that served the call). The breaker's series of a layer built [`per_key`](https://docs.rs/backstop-breaker) carry a
//! `key` label too (the host, path or route of the key's breaker). A stack left unnamed
//! records `dependency = ""`. A call its caller drops before it ends is
//! not counted in `backstop.client.requests` (it has no outcome); its attempts are.
//!
//! The calls themselves, under OpenTelemetry's semantic conventions
//! (`http.client.request.duration`, `rpc.client.duration`), are recorded by the facade's
//! `backstop::semconv::SemconvLayer`, put between a client preset and its transport.
//!
//! # Concurrency rule
//!
//! Handles are registered once per layer (a `OnceLock`) and shared by every clone; recording
//! through a handle is the recorder's business (the usual exporters use atomics).

/// `backstop.client.requests`
pub const CLIENT_REQUESTS: &str = "backstop.client.requests";
/// `backstop.client.attempts`
pub const CLIENT_ATTEMPTS: &str = "backstop.client.attempts";
/// `backstop.client.attempt.duration`
pub const CLIENT_ATTEMPT_DURATION: &str = "backstop.client.attempt.duration";
/// `backstop.retry.give_ups`
pub const RETRY_GIVE_UPS: &str = "backstop.retry.give_ups";
/// `backstop.retry.budget.balance`
pub const RETRY_BUDGET_BALANCE: &str = "backstop.retry.budget.balance";
/// `backstop.breaker.state`
pub const BREAKER_STATE: &str = "backstop.breaker.state";
/// `backstop.breaker.transitions`
pub const BREAKER_TRANSITIONS: &str = "backstop.breaker.transitions";
/// `backstop.breaker.rejections`
pub const BREAKER_REJECTIONS: &str = "backstop.breaker.rejections";
/// `backstop.deadline.expired`
pub const DEADLINE_EXPIRED: &str = "backstop.deadline.expired";
/// `backstop.deadline.malformed`
pub const DEADLINE_MALFORMED: &str = "backstop.deadline.malformed";

/// `backstop.throttle.rejections`
pub const THROTTLE_REJECTIONS: &str = "backstop.throttle.rejections";
/// `backstop.throttle.probability`
pub const THROTTLE_PROBABILITY: &str = "backstop.throttle.probability";
/// `backstop.bulkhead.rejections`
pub const BULKHEAD_REJECTIONS: &str = "backstop.bulkhead.rejections";
/// `backstop.admission.rejections`
pub const ADMISSION_REJECTIONS: &str = "backstop.admission.rejections";

/// Every name above, for exporters' allow-lists and tests.
pub const ALL: [&str; 14] = [
    CLIENT_REQUESTS,
    CLIENT_ATTEMPTS,
    CLIENT_ATTEMPT_DURATION,
    RETRY_GIVE_UPS,
    RETRY_BUDGET_BALANCE,
    BREAKER_STATE,
    BREAKER_TRANSITIONS,
    BREAKER_REJECTIONS,
    DEADLINE_EXPIRED,
    DEADLINE_MALFORMED,
    THROTTLE_REJECTIONS,
    THROTTLE_PROBABILITY,
    BULKHEAD_REJECTIONS,
    ADMISSION_REJECTIONS,
];

/// The `outcome` labels of `backstop.client.requests`, in the order of [`Outcome`](crate::Outcome)'s
/// variants: `Success`, `Failure`, `Throttled`, `Rejected`, `Ignored`.
pub const OUTCOMES: [&str; 5] = ["success", "failure", "throttled", "rejected", "ignored"];
