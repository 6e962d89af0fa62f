//! Fuzzes the `Retry-After` and `grpc-retry-pushback-ms` parsers: no input may panic, and a
//! pushback is a delay only for a plain int32 of milliseconds.

#![no_main]

use backstop::ServerHint;
use http::HeaderValue;
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, SystemTime};

fuzz_target!(|data: &[u8]| {
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let _ = ServerHint::from_retry_after(&value, now);
    if let ServerHint::Pushback(d) = ServerHint::from_pushback(&value) {
        assert!(!data.is_empty() && data.iter().all(u8::is_ascii_digit));
        assert!(d <= Duration::from_millis(i32::MAX as u64));
    }
});
