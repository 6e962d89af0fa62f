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
//! The names and labels below are the contract, kept across releases like any public item.
//! They are plain strings, not constants to import: a dashboard, an alert or an exporter's
//! allow-list holds the same strings, and the crate's tests assert them as written here.
//!
//! | name | kind | labels | moves when |
//! |------|------|--------|------------|
//! | `backstop.client.requests` | counter | `dependency`, `route`, `outcome`, `error_type` | a call through a client stack ends: `success`, `failure`, `throttled` (429 / RESOURCE_EXHAUSTED), `rejected` (refused by backstop itself: an open breaker, a spent deadline), `ignored` (a caller error, e.g. HTTP 4xx); a `failure` only carries `error_type` (OpenTelemetry's `error.type` idea, three values: `status` a failing status in the head or trailers, `timeout` an attempt's bound or the deadline, `transport` no status at all), the other outcomes none |
//! | `backstop.client.attempts` | counter | `dependency`, `route`, `kind` | an attempt is sent: `first`, `retry`, `hedge` |
//! | `backstop.client.attempt.duration` | histogram (s) | `dependency`, `route`, `authority` | an attempt that had to wait ends (the attempt timeout layer's measurement; an attempt answered on its first poll is not timed) |
//! | `backstop.retry.give_ups` | counter | `dependency`, `route`, `reason` | a failure is returned without a retry; `reason` as `GiveUp::as_str` (`backstop::client::retry`): `not_retryable`, `attempts`, `not_idempotent`, `hint`, `deadline`, `reserve`, `budget`, `not_replayable` |
//! | `backstop.retry.budget.balance` | gauge | `dependency` | the retry budget changes (its tokens: retries it would allow now) |
//! | `backstop.breaker.state` | gauge | `dependency`, `route`, `authority` | the breaker changes state: 0 closed, 1 open, 2 half-open (the state at the transition's report, so reports racing on two threads leave the newest) |
//! | `backstop.breaker.transitions` | counter | `dependency`, `route`, `authority`, `to` | the breaker changes state: `to` = `closed`, `open`, `half_open` (every transition, once: a half-open shorter than a scrape shows here, not in the gauge) |
//! | `backstop.breaker.rejections` | counter | `dependency`, `route`, `authority` | the breaker refuses a call |
//! | `backstop.deadline.expired` | counter | `side`, `dependency`, `route` | a deadline expires (`dependency` on the client side only, `route` on the server side only): `side = client` for an outbound call answered DEADLINE_EXCEEDED / an error by the stack, `side = server` for a request refused at arrival, its handler cancelled or its response body cut short by the server's deadline layer |
//! | `backstop.deadline.malformed` | counter | — | a server's deadline layer receives a malformed `grpc-timeout` |
//! | `backstop.throttle.rejections` | counter | `dependency` | the client's adaptive throttle refuses a first attempt |
//! | `backstop.throttle.probability` | gauge | `dependency` | from the throttle's first refusal on, its rejection probability at each recompute (at most once per tenth of a window bucket), so it falls back to 0 when the throttle lets go |
//! | `backstop.bulkhead.rejections` | counter | `dependency`, `reason` | the client's bulkhead refuses a call; `reason` names the knob: `max_concurrency` (no permit could come before the call's deadline), `max_wait` (waited that long), `max_queue` (that many calls already waited), `adaptive_limit` (an adaptive bulkhead's: no permit under the learnt limit could come before the call's deadline) |
//! | `backstop.bulkhead.limit` | gauge | `dependency`, `route`, `authority` | an adaptive bulkhead (the presets' attempt limit) ends a 100 ms bucket: its learnt limit |
//! | `backstop.bulkhead.in_flight` | gauge | `dependency`, `route`, `authority` | an adaptive bulkhead ends a 100 ms bucket: the attempts holding a permit then |
//! | `backstop.admission.rejections` | counter | `route` | a server's admission layer refuses a request whose remaining deadline is below the route's measured need |
//! | `backstop.idempotency.requests` | counter | `outcome` | a keyed request through a server's `IdempotencyLayer` ends: `executed` (the handler ran, its answer kept for replay), `replayed` (a stored answer, or the record that the request ran, answered again), `in_flight` (409: the key's request still runs), `mismatch` (422: the key was used for another request), `bad_key` (400), `bad_body` (413, or an unreadable body), `store_error` (503: the store failed, the handler not run), `fail_open` (the store failed, the handler ran without de-duplication), `released` (the handler's answer says nothing happened: the key is free), `not_kept` (the handler ran and left no answer to replay: an error, a panic, an answer too large or with trailers) |
//!
//! `route` and `authority` are there only where a stack has routes: the client series of a
//! gRPC stack built from a service config carry `route` (the `methodConfig` entry's names that
//! served the call, as paths: `/pkg.Service/Method`, `/pkg.Service/*`), its attempt durations
//! too (the entry's retry layer hands its handle to the attempt layer, which records there
//! unless it is keyed, when its key is the route); the breaker's series
//! of a layer built [`per_key`](crate::client::breaker::BreakerConfig::per_key), and the attempt durations of
//! an attempt layer and the limit gauges of an adaptive limit keyed with it (the presets key
//! them together), carry the key, as `route`
//! (a path or custom key) or `authority` (a host key). An entry naming one method carries
//! that method's path, the value a breaker keyed by path gives the same calls, so an operator
//! joins a route's breaker, latency and client series on `dependency` and `route`. An entry
//! naming a whole service (`/pkg.Service/*`), several names (comma-joined: `/a.S/M,/a.S/N`),
//! the default entry (`*`) or no entry (`(none)`) carries those names, which a query matches
//! with a regular expression (`route=~"/pkg.Service/.*"`), not by equality. A stack without
//! routes (no keyed breaker, no service config) and a keyed layer's overflow carry none.
//! `backstop.deadline.expired` stays per dependency: it is counted by the outermost client
//! layer, which bounds the whole call and keeps no route (keeping one would cost every call
//! for a rare event; a retry the deadline left no room for is the route's
//! `retry.give_ups{reason="deadline"}`). Throttle series, the bulkhead's refusals and a fixed
//! bulkhead's gauges are per dependency too: one throttle and one bulkhead guard the whole
//! dependency (a keyed adaptive limit's refusals are counted per dependency, its gauges per
//! key).
//!
//! A breaker moves from open to half-open at the first call after its open time (its probe),
//! not when the time ends: an idle breaker reads open until a call comes. Half-open lasts
//! as long as its probes (often milliseconds), so a gauge scraped every few seconds rarely
//! reads 2: count it with `increase(backstop_breaker_transitions{to="half_open"}[5m])`.
//!
//! A server's series (`deadline.expired{side="server"}`, `admission.rejections`) carry the
//! request's `route`: its path (for gRPC, `/pkg.Service/Method`), bounded as the admission
//! layer keys its latency models, because an HTTP path is whatever clients send. Each layer
//! hashes the path into one of its `routes` slots (default 16, at most 1024: the knob of
//! `AdmissionLayerBuilder` and of `DeadlineLayerBuilder`); the first path to arrive holds the
//! slot and is its `route` for good, and a path whose slot another holds is counted without
//! `route`. So a layer makes at most `routes` + 1 series per name; raise `routes` for a
//! service with many routes (a path counted without `route` is the sign). The admission
//! layer's `route` is the path its refusing model measures; the deadline layer claims its
//! slots when a deadline expires, so they go to the routes whose deadlines do. A malformed
//! `grpc-timeout` is the caller's bug, counted without a route. A stack left
//! unnamed records `dependency = ""`. A call its caller drops before it ends is
//! not counted in `backstop.client.requests` (it has no outcome); its attempts are.
//!
//! # gRFC A96's names
//!
//! For a gRPC call the retry layer may retry (its policy allows more than one attempt and its
//! body can be replayed), the retry layer also records, when the call ends, gRPC's own
//! per-call retry series (gRFC A96), so an operator who reads grpc-java's or grpc-go's
//! dashboards reads these the same way:
//!
//! | name | kind | labels | records |
//! |------|------|--------|---------|
//! | `grpc.client.call.retries` | histogram (`{retry}`) | `grpc.method`, `grpc.target` | the call's retries, the first attempt and hedges not counted; a call with none records nothing (A96: "0 is not reported") |
//! | `grpc.client.call.hedges` | histogram (`{hedge}`) | `grpc.method`, `grpc.target` | the call's hedged attempts; a call with none records nothing, as for retries |
//! | `grpc.client.call.retry_delay` | histogram (s) | `grpc.method`, `grpc.target` | the backoff the call waited with no attempt in flight |
//!
//! `grpc.method` is the call's path (`/pkg.Service/Method`; a gRPC client's methods are its
//! generated code's, a bounded set), `grpc.target` the stack's dependency name (gRPC puts the
//! channel's target URI there; a backstop stack is named after its dependency). Deliberate
//! differences: `grpc.client.call.transparent_retries` is not recorded, because backstop makes
//! no transparent retry (a request the server never processed, HTTP/2 REFUSED_STREAM
//! included, is an ordinary retry under the budget); a call its policy sends once (one
//! attempt, or a body too long to replay) records none of them; `retry_delay` is the sum of
//! the backoffs decided, not of the time the retry then waited for the service to be ready.
//! Plain HTTP calls record only backstop's own series.
//!
//! The calls themselves, under OpenTelemetry's semantic conventions
//! (`http.client.request.duration`, `rpc.client.duration`), are recorded by the
//! `backstop::semconv::SemconvLayer`, put between a client preset and its transport.
//!
//! # Concurrency rule
//!
//! Handles are registered once per layer (a `OnceLock`) and shared by every clone; recording
//! through a handle is the recorder's business (the usual exporters use atomics).

/// `backstop.client.requests`
pub(crate) const CLIENT_REQUESTS: &str = "backstop.client.requests";
/// `backstop.client.attempts`
pub(crate) const CLIENT_ATTEMPTS: &str = "backstop.client.attempts";
/// `backstop.client.attempt.duration`
pub(crate) const CLIENT_ATTEMPT_DURATION: &str = "backstop.client.attempt.duration";
/// `backstop.retry.give_ups`
pub(crate) const RETRY_GIVE_UPS: &str = "backstop.retry.give_ups";
/// `backstop.retry.budget.balance`
pub(crate) const RETRY_BUDGET_BALANCE: &str = "backstop.retry.budget.balance";
/// `backstop.breaker.state`
pub(crate) const BREAKER_STATE: &str = "backstop.breaker.state";
/// `backstop.breaker.transitions`
pub(crate) const BREAKER_TRANSITIONS: &str = "backstop.breaker.transitions";
/// `backstop.breaker.rejections`
pub(crate) const BREAKER_REJECTIONS: &str = "backstop.breaker.rejections";
/// `backstop.deadline.expired`
pub(crate) const DEADLINE_EXPIRED: &str = "backstop.deadline.expired";
/// `backstop.deadline.malformed`
pub(crate) const DEADLINE_MALFORMED: &str = "backstop.deadline.malformed";

/// `backstop.throttle.rejections`
pub(crate) const THROTTLE_REJECTIONS: &str = "backstop.throttle.rejections";
/// `backstop.throttle.probability`
pub(crate) const THROTTLE_PROBABILITY: &str = "backstop.throttle.probability";
/// `backstop.bulkhead.rejections`
pub(crate) const BULKHEAD_REJECTIONS: &str = "backstop.bulkhead.rejections";
/// `backstop.bulkhead.limit`
pub(crate) const BULKHEAD_LIMIT: &str = "backstop.bulkhead.limit";
/// `backstop.bulkhead.in_flight`
pub(crate) const BULKHEAD_IN_FLIGHT: &str = "backstop.bulkhead.in_flight";
/// `backstop.admission.rejections`
pub(crate) const ADMISSION_REJECTIONS: &str = "backstop.admission.rejections";
/// `backstop.idempotency.requests`
pub(crate) const IDEMPOTENCY_REQUESTS: &str = "backstop.idempotency.requests";

/// `grpc.client.call.retries` (gRFC A96)
pub(crate) const GRPC_CALL_RETRIES: &str = "grpc.client.call.retries";
/// `grpc.client.call.hedges` (gRFC A96)
pub(crate) const GRPC_CALL_HEDGES: &str = "grpc.client.call.hedges";
/// `grpc.client.call.retry_delay` (gRFC A96)
pub(crate) const GRPC_CALL_RETRY_DELAY: &str = "grpc.client.call.retry_delay";

/// Every name above but gRFC A96's, for the tests (an exporter's allow-list is the table
/// above).
#[cfg(test)]
const ALL: [&str; 17] = [
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
    BULKHEAD_LIMIT,
    BULKHEAD_IN_FLIGHT,
    ADMISSION_REJECTIONS,
    IDEMPOTENCY_REQUESTS,
];

/// What a metric is, as the `metrics` facade registers it.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A count that only grows.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// A distribution of samples (durations in seconds).
    Histogram,
}

/// One metric backstop records: its name, its kind and every label it may carry (`route` and
/// `authority` only where the module docs say).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Metric {
    /// The name, one of [`ALL`].
    name: &'static str,
    /// Counter, gauge or histogram.
    kind: Kind,
    /// Every label the series may carry.
    labels: &'static [&'static str],
}

/// Every metric with its kind and labels, in the order of the table above: the one list the
/// docs' tables (these module docs and the README's) are checked against.
#[cfg(test)]
const CATALOG: [Metric; 17] = {
    use Kind::{Counter, Gauge, Histogram};
    const fn m(name: &'static str, kind: Kind, labels: &'static [&'static str]) -> Metric {
        Metric { name, kind, labels }
    }
    [
        m(
            CLIENT_REQUESTS,
            Counter,
            &["dependency", "route", "outcome", "error_type"],
        ),
        m(CLIENT_ATTEMPTS, Counter, &["dependency", "route", "kind"]),
        m(
            CLIENT_ATTEMPT_DURATION,
            Histogram,
            &["dependency", "route", "authority"],
        ),
        m(RETRY_GIVE_UPS, Counter, &["dependency", "route", "reason"]),
        m(RETRY_BUDGET_BALANCE, Gauge, &["dependency"]),
        m(BREAKER_STATE, Gauge, &["dependency", "route", "authority"]),
        m(
            BREAKER_TRANSITIONS,
            Counter,
            &["dependency", "route", "authority", "to"],
        ),
        m(
            BREAKER_REJECTIONS,
            Counter,
            &["dependency", "route", "authority"],
        ),
        m(DEADLINE_EXPIRED, Counter, &["side", "dependency", "route"]),
        m(DEADLINE_MALFORMED, Counter, &[]),
        m(THROTTLE_REJECTIONS, Counter, &["dependency"]),
        m(THROTTLE_PROBABILITY, Gauge, &["dependency"]),
        m(BULKHEAD_REJECTIONS, Counter, &["dependency", "reason"]),
        m(BULKHEAD_LIMIT, Gauge, &["dependency", "route", "authority"]),
        m(
            BULKHEAD_IN_FLIGHT,
            Gauge,
            &["dependency", "route", "authority"],
        ),
        m(ADMISSION_REJECTIONS, Counter, &["route"]),
        m(IDEMPOTENCY_REQUESTS, Counter, &["outcome"]),
    ]
};

/// The `outcome` labels of `backstop.client.requests`, in the order of [`Outcome`](crate::Outcome)'s
/// variants: `Success`, `Failure`, `Throttled`, `Rejected`, `Ignored`.
pub(crate) const OUTCOMES: [&str; 5] = ["success", "failure", "throttled", "rejected", "ignored"];

/// The `error_type` labels of `backstop.client.requests{outcome="failure"}`: `status` (the
/// dependency answered a failing status), `timeout` (an attempt's bound or the deadline ended
/// it), `transport` (no status: a connection or protocol error, a body that broke off).
pub(crate) const ERROR_TYPES: [&str; 3] = ["status", "timeout", "transport"];

/// The check of a docs table against [`CATALOG`], for this module's tests (the module docs'
/// table and the README's).
#[cfg(test)]
mod doc_table {
    use super::{CATALOG, Kind};

    /// Panics unless the rows of `markdown` that document a metric (a table row whose first
    /// cell is a backstop metric's name) are the catalog's, in its order, each with its kind
    /// and exactly its labels (`—` for none). `what` names the document in the message.
    pub(super) fn check(markdown: &str, what: &str) {
        let rows: Vec<Vec<&str>> = markdown
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with("| `backstop."))
            .map(|l| l.split('|').map(str::trim).collect())
            .collect();
        let names: Vec<&str> = rows.iter().map(|r| r[1].trim_matches('`')).collect();
        let want: Vec<&str> = CATALOG.iter().map(|m| m.name).collect();
        assert_eq!(names, want, "{what}: the table's metrics");
        for (row, metric) in rows.iter().zip(CATALOG) {
            let kind = match metric.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            assert!(
                row[2].starts_with(kind),
                "{what}: {} is a {kind}",
                metric.name
            );
            let labels: Vec<&str> = row[3]
                .split(',')
                .map(|l| l.trim().trim_matches('`'))
                .filter(|l| !l.is_empty() && *l != "—")
                .collect();
            assert_eq!(
                labels, metric.labels,
                "{what}: the labels of {}",
                metric.name
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ALL, CATALOG};

    /// The catalog and the list of names agree, in order.
    #[test]
    fn the_catalog_names_every_metric_once() {
        let names: Vec<&str> = CATALOG.iter().map(|m| m.name).collect();
        assert_eq!(names, ALL);
    }

    /// The table in these module docs says what the catalog says, row by row.
    #[test]
    fn the_module_docs_table_is_the_catalog() {
        let docs: String = include_str!("metrics.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .map(|l| format!("{}\n", l.trim_start()))
            .collect();
        super::doc_table::check(&docs, "the metrics module docs");
    }

    /// The README's metrics table lists what backstop records: every metric of the catalog,
    /// in its order, with its kind and exactly its labels.
    #[test]
    fn the_readme_table_is_the_catalog() {
        let readme = include_str!("../../../README.md");
        super::doc_table::check(readme, "README.md");
    }
}
