//! A server's routes as a bounded set: a request's path (for gRPC, `/package.Service/Method`)
//! hashed into one of a fixed number of slots, each held by the first path to claim it. The
//! admission layer keys its latency models so, and both server layers label their metrics
//! with the path that holds the slot: at most one `route` value per slot, whatever paths
//! clients send (an HTTP path is theirs to choose).

use crate::rt::sync::{AtomicU64, Ordering};

/// `routes` slots of path hashes (0: free).
#[derive(Debug)]
pub(crate) struct RouteSlots {
    owners: Box<[AtomicU64]>,
}

impl RouteSlots {
    pub(crate) fn new(routes: usize) -> Self {
        Self {
            owners: (0..routes).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[cfg(feature = "metrics")]
    pub(crate) fn len(&self) -> usize {
        self.owners.len()
    }

    /// The slot of `path`: the one its hash (FNV-1a of its bytes) falls in, if `path` holds it
    /// (the first to arrive claims it); `None` when another path holds it (or there are no
    /// slots).
    pub(crate) fn slot(&self, path: &str) -> Option<usize> {
        if self.owners.is_empty() {
            return None;
        }
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in path.bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let hash = hash.max(1); // 0 marks a free slot
        let slot = (hash % self.owners.len() as u64) as usize;
        claims(&self.owners[slot], hash).then_some(slot)
    }
}

/// Whether the slot whose owner word is `owner` is the route hashed `hash` (non-zero): it is
/// if that route holds it, or claims it now, free (0), with a compare-and-swap. Of routes
/// racing for a free slot one wins for good.
pub(crate) fn claims(owner: &AtomicU64, hash: u64) -> bool {
    match owner.load(Ordering::Relaxed) {
        h if h == hash => true,
        0 => match owner.compare_exchange(0, hash, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => true,
            Err(h) => h == hash,
        },
        _ => false,
    }
}

/// One counter per slot, labelled `route` with the path that holds it, and one without the
/// label for the paths that hold none: the server's per-route series, registered when first
/// needed.
#[cfg(feature = "metrics")]
#[derive(Debug)]
pub(crate) struct RouteCounters {
    counters: Box<[std::sync::OnceLock<metrics::Counter>]>,
    unrouted: std::sync::OnceLock<metrics::Counter>,
}

#[cfg(feature = "metrics")]
impl RouteCounters {
    pub(crate) fn new(routes: usize) -> Self {
        Self {
            counters: (0..routes).map(|_| std::sync::OnceLock::new()).collect(),
            unrouted: std::sync::OnceLock::new(),
        }
    }

    /// Counts one event of `path`, in `slot` (the path holds it) or unrouted; `register`
    /// builds the handle from the `route` label, if any.
    pub(crate) fn increment(
        &self,
        slot: Option<usize>,
        path: &str,
        register: impl FnOnce(Option<String>) -> metrics::Counter,
    ) {
        let counter = match slot.and_then(|s| self.counters.get(s)) {
            // The first path to count here holds the slot: its path is the label for good.
            Some(cell) => cell.get_or_init(|| register(Some(path.to_owned()))),
            None => self.unrouted.get_or_init(|| register(None)),
        };
        counter.increment(1);
    }
}

/// Loom models of the claim: `RUSTFLAGS="--cfg loom" cargo test -p backstop --lib
/// loom` (what `.ci/run` does).
#[cfg(all(test, loom))]
mod loom_tests {
    use super::{AtomicU64, claims};
    use loom::sync::Arc;

    /// Two routes racing for a free slot: exactly one holds it, for good.
    #[test]
    fn loom_one_of_two_routes_claims_a_model() {
        loom::model(|| {
            let owner = Arc::new(AtomicU64::new(0));
            let other = owner.clone();
            let b = loom::thread::spawn(move || claims(&other, 2));
            let a = claims(&owner, 1);
            let b = b.join().unwrap();
            assert!(a ^ b, "one wins: {a} {b}");
            // Whoever won keeps it; the loser stays out.
            assert_eq!(claims(&owner, 1), a);
            assert_eq!(claims(&owner, 2), b);
        });
    }

    /// Two calls of one route racing: both hold it.
    #[test]
    fn loom_calls_of_one_route_share_its_model() {
        loom::model(|| {
            let owner = Arc::new(AtomicU64::new(0));
            let other = owner.clone();
            let b = loom::thread::spawn(move || claims(&other, 7));
            assert!(claims(&owner, 7));
            assert!(b.join().unwrap());
        });
    }
}
