//! The table of a keyed layer's breakers (the rules: the module docs, "A breaker per key").

use crate::client::breaker::Mode;
use crate::client::breaker::shared::{Entry, Handle, Handles, Keyed, Shared};
use crate::rt::table::Slot;
use http::{Method, Uri};
use std::sync::Arc;
use tokio::time::Instant;

impl<C: Clone> Keyed<C> {
    /// Milliseconds since the table was built: the clock of last uses (no `u128` arithmetic
    /// on the path of every call).
    fn now_ms(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.start);
        elapsed
            .as_secs()
            .saturating_mul(1000)
            .saturating_add(u64::from(elapsed.subsec_millis()))
    }

    /// The breaker of a request with this method and URI, added if need be; `None`: it has
    /// no key, or the table is full of keys that cannot be evicted yet (the overflow breaker
    /// takes it).
    #[inline(never)]
    pub(crate) fn handle(&self, method: &Method, uri: &Uri) -> Option<Arc<Handle<C>>> {
        let key = self.key.of(method, uri)?;
        let entry = self.entry_at(&key, self.now_ms())?;
        Some(entry.handles.current().clone())
    }

    /// `key`'s entry at `now` (milliseconds on the table's clock), added if need be.
    #[inline]
    fn entry_at(&self, key: &str, now: u64) -> Option<Arc<Slot<Entry<C>>>> {
        let make = |run_time: &super::shared::RunTime| {
            let shared = Shared::from_checked(self.template.for_key(run_time.mode), None);
            shared.keyed_as(crate::route::key_label(&self.key), key);
            Entry {
                handles: Handles::uncopied(&shared),
                shared,
            }
        };
        // An open breaker with open time left stays, called or not: a fresh breaker in its
        // place would let calls through to a route its breaker refuses.
        self.table
            .entry_at(key, now, make, |_, entry| Self::open_left_ms(entry))
    }

    #[cfg(loom)]
    pub(crate) fn entry_for_test(&self, key: &str) -> Option<Arc<Slot<Entry<C>>>> {
        self.entry_at(key, 0)
    }

    #[cfg(loom)]
    pub(crate) fn entry_at_for_test(&self, key: &str, now_ms: u64) -> Option<Arc<Slot<Entry<C>>>> {
        self.entry_at(key, now_ms)
    }
}

impl<C> Keyed<C> {
    /// How much longer `entry` must stay in the table: while its breaker is open, the open
    /// time it has left (milliseconds, rounded up).
    fn open_left_ms(entry: &Entry<C>) -> u64 {
        entry.shared.open_left_us().unwrap_or(0).div_ceil(1000)
    }

    /// How much longer `key` must stay in the table, called or not (0 when it has no breaker
    /// or its breaker is not open): the client builder gives this to its attempt bound's
    /// table, so a route whose breaker is held open keeps its latency model too.
    pub(crate) fn busy_ms(&self, key: &str) -> u64 {
        self.table
            .get(key)
            .map_or(0, |entry| Self::open_left_ms(&entry))
    }

    /// Closes every breaker: `overflow` and every key's, which can then go as soon as idle.
    pub(crate) fn reset(&self, overflow: &Shared<C>) {
        overflow.reset();
        for (_, entry) in self.table.entries() {
            entry.shared.reset();
        }
        self.table.forget_full();
    }

    /// Sets the mode of the layer's breakers: `overflow`, every key's, and those of the keys
    /// added from now on.
    pub(crate) fn set_mode(&self, mode: Mode, overflow: &Shared<C>) {
        let mut run_time = self.table.run_time();
        run_time.mode = mode;
        overflow.machine.set_mode(mode);
        for (_, entry) in self.table.entries() {
            entry.shared.machine.set_mode(mode);
        }
    }

    /// Every key's breaker now, sorted by key.
    pub(crate) fn entries(&self) -> Vec<(String, Arc<Slot<Entry<C>>>)> {
        self.table.entries()
    }

    /// `key`'s breaker, if it has one now.
    pub(crate) fn entry_of(&self, key: &str) -> Option<Arc<Slot<Entry<C>>>> {
        self.table.get(key)
    }
}
