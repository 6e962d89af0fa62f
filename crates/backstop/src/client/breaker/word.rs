//! The packing of the breaker's two words.
//!
//! The admission word, everything a call needs to be let in:
//!
//! ```text
//! mode:2 | state:2 | generation:28 | probes taken:16 | probes succeeded:16
//! ```
//!
//! The timer word, when the current generation's open time or slow start ends:
//!
//! ```text
//! generation tag:16 | microseconds since the breaker started:48
//! ```

use crate::client::breaker::transition::{Mode, State};

const MODE_SHIFT: u32 = 62;
const STATE_SHIFT: u32 = 60;
const GENERATION_SHIFT: u32 = 32;
const TAKEN_SHIFT: u32 = 16;
const SUCCEEDED_SHIFT: u32 = 0;

const STATE_CLOSED: u64 = 0;
const STATE_OPEN: u64 = 1;
const STATE_HALF_OPEN: u64 = 2;
const GENERATION_BITS: u32 = 28;
pub(crate) const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;

const TIMER_TAG_SHIFT: u32 = 48;
const TIMER_MASK: u64 = (1 << TIMER_TAG_SHIFT) - 1;
const TIMER_TAG_MASK: u64 = 0xFFFF;

/// The decoded admission word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word {
    pub(crate) mode: Mode,
    pub(crate) state: State,
    pub(crate) generation: u32,
    pub(crate) taken: u16,
    pub(crate) succeeded: u16,
}

impl Word {
    /// The generation of a raw word whose state is closed (any mode); the closed state's
    /// checks read this, not the decoded word, on every call.
    #[inline]
    pub(crate) fn closed_generation(word: u64) -> Option<u32> {
        ((word >> STATE_SHIFT) & 0b11 == STATE_CLOSED)
            .then_some(((word >> GENERATION_SHIFT) & GENERATION_MASK) as u32)
    }

    /// Whether a raw word's mode lets the state machine decide (normal or metrics-only).
    #[inline]
    pub(crate) fn machine_decides(word: u64) -> bool {
        matches!(word >> MODE_SHIFT, 0 | 3)
    }

    /// Whether a raw word's mode is disabled.
    #[inline]
    pub(crate) fn disabled(word: u64) -> bool {
        word >> MODE_SHIFT == 2
    }

    pub(crate) fn decode(word: u64) -> Self {
        let mode = match word >> MODE_SHIFT {
            0 => Mode::Normal,
            1 => Mode::ForcedOpen,
            2 => Mode::Disabled,
            _ => Mode::MetricsOnly,
        };
        let state = match (word >> STATE_SHIFT) & 0b11 {
            STATE_CLOSED => State::Closed,
            STATE_OPEN => State::Open,
            _ => State::HalfOpen,
        };
        Self {
            mode,
            state,
            generation: ((word >> GENERATION_SHIFT) & GENERATION_MASK) as u32,
            taken: (word >> TAKEN_SHIFT) as u16,
            succeeded: (word >> SUCCEEDED_SHIFT) as u16,
        }
    }

    pub(crate) fn encode(self) -> u64 {
        let mode = match self.mode {
            Mode::Normal => 0,
            Mode::ForcedOpen => 1,
            Mode::Disabled => 2,
            Mode::MetricsOnly => 3,
        };
        let state = match self.state {
            State::Closed => STATE_CLOSED,
            State::Open => STATE_OPEN,
            State::HalfOpen => STATE_HALF_OPEN,
        };
        (mode << MODE_SHIFT)
            | (state << STATE_SHIFT)
            | ((u64::from(self.generation) & GENERATION_MASK) << GENERATION_SHIFT)
            | (u64::from(self.taken) << TAKEN_SHIFT)
            | (u64::from(self.succeeded) << SUCCEEDED_SHIFT)
    }

    /// The first word of the next generation, in `state`.
    pub(crate) fn next(self, state: State) -> Self {
        Self {
            mode: self.mode,
            state,
            generation: ((u64::from(self.generation) + 1) & GENERATION_MASK) as u32,
            taken: 0,
            succeeded: 0,
        }
    }
}

/// The timer word: `generation tag:16 | microseconds:48`.
pub(crate) fn timer_word(generation: u32, at_us: u64) -> u64 {
    ((u64::from(generation) & TIMER_TAG_MASK) << TIMER_TAG_SHIFT) | at_us.min(TIMER_MASK)
}

/// The instant of a timer word, if it belongs to `generation`.
pub(crate) fn timer_instant(word: u64, generation: u32) -> Option<u64> {
    (word >> TIMER_TAG_SHIFT == u64::from(generation) & TIMER_TAG_MASK).then_some(word & TIMER_MASK)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Every mode and state: the word round-trips, its generation wraps, and the raw reads of
    /// the closed state's fast path agree with the decoded word.
    #[test]
    fn words_round_trip_and_raw_reads_agree() {
        for mode in [
            Mode::Normal,
            Mode::ForcedOpen,
            Mode::Disabled,
            Mode::MetricsOnly,
        ] {
            for state in [State::Closed, State::Open, State::HalfOpen] {
                for generation in [12_345, GENERATION_MASK as u32] {
                    let w = Word {
                        mode,
                        state,
                        generation,
                        taken: u16::MAX,
                        succeeded: 7,
                    };
                    let raw = w.encode();
                    assert_eq!(Word::decode(raw), w);
                    let closed = (state == State::Closed).then_some(generation);
                    assert_eq!(Word::closed_generation(raw), closed, "{mode:?} {state:?}");
                    let decides = matches!(mode, Mode::Normal | Mode::MetricsOnly);
                    assert_eq!(Word::machine_decides(raw), decides);
                    assert_eq!(Word::disabled(raw), mode == Mode::Disabled);
                }
                let last = Word {
                    mode,
                    state,
                    generation: GENERATION_MASK as u32,
                    taken: 0,
                    succeeded: 0,
                };
                assert_eq!(last.next(State::Open).generation, 0, "generations wrap");
            }
        }
    }

    #[test]
    fn a_timer_belongs_to_its_generation() {
        let word = timer_word(3, 1_000);
        assert_eq!(timer_instant(word, 3), Some(1_000));
        assert_eq!(timer_instant(word, 4), None);
        assert_eq!(
            timer_instant(word, 3 + (1 << 16)),
            Some(1_000),
            "tags are 16 bits"
        );
        assert_eq!(timer_instant(timer_word(0, u64::MAX), 0), Some(TIMER_MASK));
    }
}
