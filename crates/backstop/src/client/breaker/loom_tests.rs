//! Loom models of admission, probe slots and outcomes under concurrency and cancellation:
//! `RUSTFLAGS="--cfg loom" cargo test -p backstop --lib loom` (run by `.ci/run`).

use crate::client::breaker::Mode;
use crate::client::breaker::state::{Admission, Machine, Settings, Tally};
use crate::client::breaker::transition::State;
use crate::client::breaker::window::{CountRing, Window};
use loom::{sync::Arc, thread};

const FAIL: Tally = Tally::Counted {
    failure: true,
    slow: false,
};
const OK: Tally = Tally::Counted {
    failure: false,
    slow: false,
};

fn settings(probes: u16) -> Settings {
    Settings {
        failure_ppm: 500_000,
        slow_ppm: None,
        minimum_calls: 1,
        consecutive_failures: None,
        probes,
        open_base_us: 1,
        open_max_us: 1,
        open_multiplier: 1.0,
        jitter: false,
        seed: 0,
        slow_start_us: None,
    }
}

/// A machine already half-open (its first probe not yet taken): one failure opened it for
/// 1 µs, and time 10 is past that.
fn half_open(probes: u16) -> Arc<Machine> {
    let m = Machine::new(
        settings(probes),
        Window::Count(CountRing::new(2)),
        Mode::Normal,
    );
    m.complete(Admission::Closed(0), FAIL, 0, || 0);
    assert_eq!(m.load().state, State::Open);
    Arc::new(m)
}

fn admitted(m: &Machine) -> bool {
    matches!(m.admit(|| 10).admission, Ok(Admission::Probe(_)))
}

#[test]
fn loom_half_open_admits_exactly_the_probes() {
    loom::model(|| {
        let m = half_open(2);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let m = m.clone();
                thread::spawn(move || admitted(&m))
            })
            .collect();
        let mut count = usize::from(admitted(&m));
        for t in threads {
            count += usize::from(t.join().unwrap());
        }
        assert_eq!(count, 2, "three callers, two probe slots");
        let word = m.load();
        assert_eq!((word.state, word.taken), (State::HalfOpen, 2));
    });
}

#[test]
fn loom_a_cancelled_probe_gives_its_slot_to_exactly_one_caller() {
    loom::model(|| {
        let m = half_open(1);
        let Ok(probe) = m.admit(|| 10).admission else {
            panic!("the first call after the open time is a probe");
        };
        let other = m.clone();
        // One thread cancels its probe while another asks to be let in.
        let t = thread::spawn(move || admitted(&other));
        m.complete(probe, Tally::Nothing, 0, || 10);
        let got = t.join().unwrap();
        let word = m.load();
        assert_eq!(word.state, State::HalfOpen);
        // Either the caller came first and was refused (slot now free), or after and took it.
        assert_eq!(word.taken, u16::from(got));
    });
}

#[test]
fn loom_concurrent_probe_outcomes_make_one_transition() {
    loom::model(|| {
        let m = half_open(2);
        let a = m.admit(|| 10).admission.unwrap();
        let b = m.admit(|| 10).admission.unwrap();
        let generation = m.load().generation;
        let other = m.clone();
        let t = thread::spawn(move || other.complete(b, FAIL, 0, || 10));
        let mine = m.complete(a, OK, 0, || 10);
        let theirs = t.join().unwrap();
        // The failure always re-opens; the success alone never closes (two are needed).
        assert!(mine.is_none());
        let opened = theirs.expect("a failed probe re-opens");
        assert_eq!(opened.to, State::Open);
        assert_eq!(opened.generation, generation + 1);
        assert_eq!(m.load().state, State::Open);
    });
}

#[test]
fn loom_the_last_two_probes_close_once() {
    loom::model(|| {
        let m = half_open(2);
        let a = m.admit(|| 10).admission.unwrap();
        let b = m.admit(|| 10).admission.unwrap();
        let other = m.clone();
        let t = thread::spawn(move || other.complete(b, OK, 0, || 10));
        let mine = m.complete(a, OK, 0, || 10);
        let theirs = t.join().unwrap();
        assert_eq!(
            usize::from(mine.is_some()) + usize::from(theirs.is_some()),
            1,
            "exactly one thread closes"
        );
        assert_eq!(m.load().state, State::Closed);
    });
}

#[test]
fn loom_an_old_generation_call_decides_nothing() {
    loom::model(|| {
        let m = Arc::new(Machine::new(
            settings(1),
            Window::Count(CountRing::new(2)),
            Mode::Normal,
        ));
        let late = m.admit(|| 0).admission.unwrap();
        let other = m.clone();
        // A failure opens the breaker while an older closed-state call completes.
        let t = thread::spawn(move || other.complete(Admission::Closed(0), FAIL, 0, || 0));
        let mine = m.complete(late, FAIL, 0, || 0);
        let theirs = t.join().unwrap();
        assert_eq!(
            usize::from(mine.is_some()) + usize::from(theirs.is_some()),
            1,
            "two failures of one generation open the breaker once"
        );
        assert_eq!(m.load().generation, 1);
    });
}

#[test]
fn loom_count_ring_totals_are_exact() {
    loom::model(|| {
        let ring = Arc::new(CountRing::new(2));
        ring.record(false, false);
        let other = ring.clone();
        let t = thread::spawn(move || other.record(true, false));
        ring.record(true, true);
        t.join().unwrap();
        let counts = ring.counts();
        assert_eq!((counts.calls, counts.failures), (2, 2));
        assert_eq!(counts.slow, 1);
    });
}

/// Defect found by this model: `clear` stored zeros over the slots and the totals, so a
/// record racing it could add its weight after the totals were zeroed and its slot wiped —
/// a phantom call counted until the next clear. Now the totals always equal the slots.
#[test]
fn loom_a_clear_racing_a_record_keeps_the_totals_exact() {
    loom::model(|| {
        let ring = Arc::new(CountRing::new(2));
        ring.record(true, false);
        let other = ring.clone();
        let t = thread::spawn(move || other.record(true, true));
        ring.clear();
        t.join().unwrap();
        let (totals, slots) = (ring.counts(), ring.slot_counts());
        assert_eq!(
            (totals.calls, totals.failures, totals.slow),
            (slots.calls, slots.failures, slots.slow)
        );
        assert!(slots.calls <= 1, "the clear wiped the earlier call");
    });
}

/// The generation check against a concurrent close (a reset here): a call admitted while
/// closed that fails as the breaker is being closed again. Whatever the order, the breaker
/// ends closed, the window's totals equal its slots, and the new generation's window holds at
/// most that one call — the bound the crate docs state for a call completing at the very
/// instant of a close.
#[test]
fn loom_a_close_racing_an_old_generation_failure() {
    loom::model(|| {
        let m = Arc::new(Machine::new(
            settings(1),
            Window::Count(CountRing::new(2)),
            Mode::Normal,
        ));
        let call = m.admit(|| 0).admission.unwrap();
        let other = m.clone();
        let t = thread::spawn(move || other.complete(call, FAIL, 0, || 0));
        let closed = m.reset(|| 0);
        let opened = t.join().unwrap();
        let word = m.load();
        assert_eq!(word.state, State::Closed);
        // Opened first (generation 1), then reset (2); or reset first (1) and the late call
        // decided nothing.
        match opened {
            Some(t) => assert_eq!((t.generation, word.generation), (1, 2)),
            None => assert!(closed.is_some()),
        }
        let Window::Count(ring) = &m.window else {
            unreachable!()
        };
        let (totals, slots) = (ring.counts(), ring.slot_counts());
        assert_eq!(
            (totals.calls, totals.failures),
            (slots.calls, slots.failures)
        );
        assert!(totals.calls <= 1);
    });
}

/// A keyed table with room for `max_keys`, built as a layer would build it.
fn keyed(max_keys: usize) -> Arc<crate::client::breaker::shared::Keyed<crate::HttpClassifier>> {
    keyed_idle(max_keys, std::time::Duration::from_secs(60))
}

/// A keyed table whose keys can be evicted after `idle`; a breaker opens on one failure, for
/// an hour.
fn keyed_idle(
    max_keys: usize,
    idle: std::time::Duration,
) -> Arc<crate::client::breaker::shared::Keyed<crate::HttpClassifier>> {
    let hour = std::time::Duration::from_secs(3600);
    let config = crate::client::breaker::BreakerConfig::http()
        .count_window(2)
        .minimum_calls(1)
        .open_duration(hour, hour)
        .jitter(false);
    Arc::new(crate::client::breaker::shared::Keyed::new(
        crate::RouteKey::Path,
        config.check().expect("a valid configuration"),
        max_keys,
        idle,
    ))
}

#[test]
fn loom_two_calls_racing_for_a_new_key_share_one_breaker() {
    loom::model(|| {
        let table = keyed(4);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let table = table.clone();
                thread::spawn(move || table.entry_for_test("a").expect("room for it"))
            })
            .collect();
        let entries: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(std::sync::Arc::ptr_eq(&entries[0], &entries[1]));
        assert_eq!(table.entries().len(), 1);
    });
}

#[test]
fn loom_a_full_table_never_grows_past_its_bound() {
    loom::model(|| {
        let table = keyed(1);
        let threads: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|key| {
                let table = table.clone();
                thread::spawn(move || table.entry_for_test(key).is_some())
            })
            .collect();
        let got: Vec<bool> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(
            got.iter().filter(|g| **g).count(),
            1,
            "one key got the room"
        );
        assert_eq!(table.entries().len(), 1);
    });
}

/// A mode set while a call adds a key reaches that key, whichever comes first: the new key
/// starts in the mode the layer has when it is added, or the setter finds it in the table.
#[test]
fn loom_a_mode_set_while_a_key_is_added_reaches_it() {
    loom::model(|| {
        let table = keyed(4);
        let overflow =
            crate::client::breaker::shared::Shared::from_checked(table.template.clone(), None);
        let adder = {
            let table = table.clone();
            thread::spawn(move || table.entry_for_test("a").expect("room for it"))
        };
        table.set_mode(Mode::ForcedOpen, &overflow);
        let entry = adder.join().unwrap();
        assert_eq!(entry.shared.machine.load().mode, Mode::ForcedOpen);
        assert_eq!(overflow.machine.load().mode, Mode::ForcedOpen);
        // And the next key too.
        let next = table.entry_for_test("b").expect("room for it");
        assert_eq!(next.shared.machine.load().mode, Mode::ForcedOpen);
    });
}

/// A reset racing the scan of a full table. The scan may see the key's breaker still open and
/// note that no key can be evicted for an hour; the reset's clear of that note always comes
/// after it, so once both are done, a new key takes the place of the idle, now closed, one.
#[test]
fn loom_a_reset_racing_a_full_scan_lets_the_next_key_in() {
    loom::model(|| {
        let table = keyed_idle(1, std::time::Duration::from_secs(1));
        let overflow =
            crate::client::breaker::shared::Shared::from_checked(table.template.clone(), None);
        let a = table.entry_at_for_test("a", 0).expect("room for it");
        let opened = a
            .shared
            .machine
            .complete(Admission::Closed(0), FAIL, 0, || 0);
        assert!(opened.is_some());
        let scan = {
            let table = table.clone();
            thread::spawn(move || table.entry_at_for_test("b", 2_000).is_some())
        };
        table.reset(&overflow);
        let got_b = scan.join().unwrap();
        assert_eq!(a.shared.machine.load().state, State::Closed);
        // Idle for 2 s: once reset, it makes room at once, whichever ran first.
        let b = table.entry_at_for_test("b", 2_001);
        assert!(
            got_b || b.is_some(),
            "the hint of the scan outlived the reset"
        );
        let keys: Vec<String> = table.entries().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["b"]);
    });
}
