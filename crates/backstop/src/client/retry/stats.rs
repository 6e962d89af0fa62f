use crate::rt::stripe::Padded;
use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

/// Why a retry layer returned a failure instead of retrying it.
///
/// Adding a reason: its variant here, its place in `ALL` and its name in `as_str`; the
/// counters, the stats and the metrics follow from those.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUp {
    /// The classifier says the failure is final.
    NotRetryable,
    /// `max_attempts` reached.
    Attempts,
    /// The request is not idempotent and may have been processed.
    NotIdempotent,
    /// The server asked for no retry (`grpc-retry-pushback-ms` negative or malformed), or
    /// for a wait (`Retry-After`, a pushback) longer than the 30 s the layer holds a call for.
    Hint,
    /// The wait plus 1 ms does not fit in the remaining deadline.
    Deadline,
    /// The wait plus the reserve ([`RetryConfig::reserve`](crate::client::retry::RetryConfig::reserve): in
    /// the client presets, the dependency's measured p50) does not fit in the remaining
    /// deadline: the retry could fit on the wire, but the dependency's usual call could not
    /// finish in it, so it would most likely time out and count as one more failure.
    Reserve,
    /// The budget has no token.
    Budget,
    /// The request body is longer than `max_replay_bytes`, or failed, so no copy of it can be
    /// sent again.
    NotReplayable,
    /// The adaptive throttle refused the first attempt (see [`throttle`](crate::client::overload::throttle)):
    /// nothing was sent. Reported by the throttle layer, not by a retry layer's counters.
    Throttled,
}

impl GiveUp {
    /// Every reason, in declaration order (`why as usize` indexes it).
    pub(crate) const ALL: [GiveUp; 9] = [
        GiveUp::NotRetryable,
        GiveUp::Attempts,
        GiveUp::NotIdempotent,
        GiveUp::Hint,
        GiveUp::Deadline,
        GiveUp::Reserve,
        GiveUp::Budget,
        GiveUp::NotReplayable,
        GiveUp::Throttled,
    ];

    /// How many reasons there are.
    pub(crate) const COUNT: usize = Self::ALL.len();

    /// Every reason.
    pub fn all() -> impl Iterator<Item = GiveUp> {
        Self::ALL.into_iter()
    }

    /// A short name, as in tracing events and the `reason` label of the metrics:
    /// `attempts`, `budget`, `deadline`, `not_idempotent` …
    pub fn as_str(self) -> &'static str {
        match self {
            GiveUp::NotRetryable => "not_retryable",
            GiveUp::Attempts => "attempts",
            GiveUp::NotIdempotent => "not_idempotent",
            GiveUp::Hint => "hint",
            GiveUp::Deadline => "deadline",
            GiveUp::Reserve => "reserve",
            GiveUp::Budget => "budget",
            GiveUp::NotReplayable => "not_replayable",
            GiveUp::Throttled => "throttled",
        }
    }

    /// Whether giving up for this reason leaves a failure that could have been retried: the
    /// callers upstream are told not to retry it either (see [`PushbackLayer`](crate::server::pushback::PushbackLayer)).
    pub fn exhausts_retries(self) -> bool {
        matches!(
            self,
            GiveUp::Attempts | GiveUp::Hint | GiveUp::Deadline | GiveUp::Reserve | GiveUp::Budget
        )
    }
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug)]
pub(crate) struct Stats {
    /// Requests, counted per stripe (every request writes here).
    requests: Box<[Padded<AtomicU64>]>,
    /// The next request number, for seeded policies only.
    sequence: AtomicU64,
    retries: AtomicU64,
    hedges: AtomicU64,
    gave_up: [AtomicU64; GiveUp::COUNT],
}

impl Stats {
    pub(crate) fn new(stripes: usize) -> Self {
        Self {
            requests: (0..stripes.max(1)).map(|_| Padded::default()).collect(),
            sequence: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            hedges: AtomicU64::new(0),
            gave_up: Default::default(),
        }
    }

    /// Counts a request, on the caller's stripe.
    pub(crate) fn request(&self, stripe: usize) {
        self.requests[stripe % self.requests.len()].fetch_add(1, Relaxed);
    }

    /// The next request number (from 0), in the order requests asked for one.
    pub(crate) fn number(&self) -> u64 {
        self.sequence.fetch_add(1, Relaxed)
    }

    pub(crate) fn retry(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    pub(crate) fn hedge(&self) {
        self.hedges.fetch_add(1, Relaxed);
    }

    pub(crate) fn give_up(&self, why: GiveUp) {
        self.gave_up[why as usize].fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> RetryStats {
        RetryStats {
            requests: self.requests.iter().map(|r| r.load(Relaxed)).sum(),
            retries: self.retries.load(Relaxed),
            hedges: self.hedges.load(Relaxed),
            gave_up: std::array::from_fn(|i| self.gave_up[i].load(Relaxed)),
        }
    }
}

/// A snapshot of a retry layer's counters.
///
/// Its `Debug` output names the reasons (only those that happened), as a log line should:
///
/// ```
/// # use backstop::client::retry::{RetryConfig, RetryStats};
/// let stats: RetryStats = RetryConfig::http().build().unwrap().stats();
/// assert_eq!(
///     format!("{stats:?}"),
///     "RetryStats { requests: 0, retries: 0, hedges: 0, amplification: 0.0, gave_up: {} }"
/// );
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryStats {
    /// Logical requests seen.
    pub requests: u64,
    /// Retries sent (attempts after the first that followed a failure).
    pub retries: u64,
    /// Hedges sent (attempts after the first sent while another was in flight).
    pub hedges: u64,
    /// Failures returned without a retry, by reason (`why as usize`).
    gave_up: [u64; GiveUp::COUNT],
}

impl fmt::Debug for RetryStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        /// The reasons that happened, by name: `{budget: 25, not_replayable: 1}`.
        struct Reasons<'a>(&'a RetryStats);
        impl fmt::Debug for Reasons<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut map = f.debug_map();
                for (why, n) in self.0.gave_ups().filter(|&(_, n)| n > 0) {
                    map.entry(&format_args!("{why}"), &n);
                }
                map.finish()
            }
        }
        f.debug_struct("RetryStats")
            .field("requests", &self.requests)
            .field("retries", &self.retries)
            .field("hedges", &self.hedges)
            .field("amplification", &self.amplification())
            .field("gave_up", &Reasons(self))
            .finish()
    }
}

impl RetryStats {
    /// Failures returned without a retry for this reason.
    pub fn gave_up(&self, why: GiveUp) -> u64 {
        self.gave_up[why as usize]
    }

    /// Failures returned without a retry, for every reason.
    pub fn gave_ups(&self) -> impl Iterator<Item = (GiveUp, u64)> + '_ {
        GiveUp::all().map(|why| (why, self.gave_up(why)))
    }

    /// Downstream attempts per logical request.
    pub fn amplification(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        (self.requests + self.retries + self.hedges) as f64 / self.requests as f64
    }
}

#[cfg(test)]
mod reason_tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_counter_and_name() {
        let stats = Stats::new(1);
        for (i, why) in GiveUp::all().enumerate() {
            assert_eq!(why as usize, i, "ALL is in declaration order");
            for _ in 0..=i {
                stats.give_up(why);
            }
        }
        let snapshot = stats.snapshot();
        let counts: Vec<u64> = snapshot.gave_ups().map(|(_, n)| n).collect();
        assert_eq!(counts, (1..=GiveUp::COUNT as u64).collect::<Vec<_>>());
        let mut names: Vec<&str> = GiveUp::all().map(GiveUp::as_str).collect();
        assert!(
            names
                .iter()
                .all(|n| n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        );
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), GiveUp::COUNT, "names are unique");
    }

    #[test]
    fn debug_names_the_reasons_that_happened() {
        let stats = Stats::new(2);
        for stripe in 0..4 {
            stats.request(stripe);
        }
        stats.retry();
        for _ in 0..25 {
            stats.give_up(GiveUp::Budget);
        }
        stats.give_up(GiveUp::NotReplayable);
        assert_eq!(
            format!("{:?}", stats.snapshot()),
            "RetryStats { requests: 4, retries: 1, hedges: 0, amplification: 1.25, \
             gave_up: {budget: 25, not_replayable: 1} }"
        );
    }
}
