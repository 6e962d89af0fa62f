//! Fuzzes the `grpc-timeout` codec: `decode` must never panic and must accept only the
//! grammar; whatever it accepts must re-encode to a value that is never longer.

#![no_main]

use backstop::wire::grpc_timeout::{decode, encode};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = decode(data) {
        // The grammar: 1-8 digits and one unit letter.
        let (unit, digits) = data.split_last().expect("accepted input is not empty");
        assert!((1..=8).contains(&digits.len()));
        assert!(digits.iter().all(u8::is_ascii_digit));
        assert!(b"HMSmun".contains(unit));
        match encode(d) {
            None => assert!(d.is_zero()),
            Some(e) => {
                assert!(e.duration() <= d);
                assert_eq!(decode(e.as_str().as_bytes()), Ok(e.duration()));
            }
        }
    }
    if data.len() >= 12 {
        let secs = u64::from_le_bytes(data[..8].try_into().unwrap());
        let nanos = u32::from_le_bytes(data[8..12].try_into().unwrap()) % 1_000_000_000;
        let d = Duration::new(secs, nanos);
        if let Some(e) = encode(d) {
            assert!(e.as_str().len() <= 9);
            assert!(e.duration() <= d && !e.duration().is_zero());
        }
    }
});
