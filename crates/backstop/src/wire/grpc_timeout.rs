//! The `grpc-timeout` wire format: `TimeoutValue TimeoutUnit`, 1–8 ASCII digits followed by one
//! of `H` (hours), `M` (minutes), `S` (seconds), `m` (milliseconds), `u` (microseconds) or `n`
//! (nanoseconds), as the gRPC over HTTP/2 specification defines it.
//!
//! [`decode`] is strict: anything but that grammar is [`MalformedTimeout`]; leading zeros are
//! fine (`00000001S` is one second) and `0n` means the caller's deadline has already passed.
//! No input panics or overflows: the largest value, `99999999H`, is about 11 400 years and fits
//! a [`Duration`].
//!
//! [`encode`] writes a duration in the finest unit whose value fits in 8 digits, rounding
//! **down**, so a receiver's deadline is never later than the sender's. It never writes zero:
//! a caller with nothing left must fail locally instead of asking a server to start work that
//! cannot finish. Durations of 99 999 999 seconds (about 3.17 years) and more are all written as
//! `99999999S`: switching to minutes there would send *less* time for a longer duration
//! (10⁸ s is not a whole number of minutes), and an encoding that is not monotone would let a
//! longer budget look shorter than a shorter one on the wire.
//!
//! [`encode_coarse`] (what `PropagateDeadline` and the attempt bound send) first rounds down to
//! three significant digits: a value that repeats from call to call, so those layers share
//! one header value between the calls that send it instead of formatting and allocating one
//! per call, and HPACK can index it. It is never later than the time left and
//! at most 1 % earlier.
//!
//! ```
//! use backstop::wire::grpc_timeout::{decode, encode};
//! use std::time::Duration;
//!
//! assert_eq!(decode(b"250m"), Ok(Duration::from_millis(250)));
//! assert!(decode(b"250").is_err());
//! assert!(decode(b"123456789n").is_err()); // nine digits
//!
//! let encoded = encode(Duration::from_millis(1500)).unwrap();
//! assert_eq!(encoded.as_str(), "1500000u");
//! assert_eq!(encoded.duration(), Duration::from_millis(1500));
//! assert!(encode(Duration::ZERO).is_none());
//! ```

use bytes::Bytes;
use http::HeaderValue;
use std::{cell::RefCell, fmt, time::Duration};

/// The largest value the grammar allows: 8 digits.
const MAX_VALUE: u64 = 99_999_999;

/// The `grpc-timeout` header (or another timeout header) does not follow its grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MalformedTimeout(());

impl fmt::Display for MalformedTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed grpc-timeout")
    }
}

impl std::error::Error for MalformedTimeout {}

impl MalformedTimeout {
    pub(crate) fn new() -> Self {
        Self(())
    }
}

/// Decodes a `grpc-timeout` value.
///
/// # Errors
///
/// [`MalformedTimeout`] unless the input is 1–8 ASCII digits followed by exactly one of
/// `H M S m u n`. Signs, spaces, decimal points and empty input are all malformed.
pub fn decode(value: &[u8]) -> Result<Duration, MalformedTimeout> {
    let (unit, digits) = match value.split_last() {
        Some((unit, digits)) if (1..=8).contains(&digits.len()) => (*unit, digits),
        _ => return Err(MalformedTimeout::new()),
    };
    let mut n: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(MalformedTimeout::new());
        }
        n = n * 10 + u64::from(d - b'0');
    }
    // n <= 99_999_999, so n * 3600 <= 3.6e11 seconds: no unit can overflow.
    Ok(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return Err(MalformedTimeout::new()),
    })
}

/// Decodes a `grpc-timeout` header value; see [`decode`].
///
/// # Errors
///
/// As [`decode`].
pub fn decode_header(value: &HeaderValue) -> Result<Duration, MalformedTimeout> {
    decode(value.as_bytes())
}

/// A `grpc-timeout` value ready to be sent: at most 8 digits and a unit, never zero.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    buf: [u8; 9],
    len: u8,
    duration: Duration,
}

impl Encoded {
    /// The value as text, e.g. `"250000u"`.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits and a unit letter are ever written.
        std::str::from_utf8(&self.buf[..usize::from(self.len)]).unwrap_or_default()
    }

    /// The duration a receiver will decode: at most the encoded duration, and less than one
    /// unit below it (up to 99 999 999 seconds; see the [module docs](self)).
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// The value as a header value.
    pub fn to_header_value(&self) -> HeaderValue {
        HeaderValue::from_str(self.as_str()).unwrap_or_else(|_| HeaderValue::from_static("1n"))
    }
}

impl fmt::Debug for Encoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Encoded").field(&self.as_str()).finish()
    }
}

impl fmt::Display for Encoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Encodes `timeout` rounded down to three significant digits, in the coarsest of `S`, `m`,
/// `u`, `n` that holds them exactly (`999m` for 999.9 ms, `1230m` for 1.2345 s, `50m`, `2S`):
/// never later than `timeout` and at most 1 % earlier. A deadline sent this way repeats from
/// call to call, so the attempt layer shares one header value between the calls that send
/// it, and HPACK can index it. Returns `None` when `timeout` is zero.
///
/// ```
/// use backstop::wire::grpc_timeout::encode_coarse;
/// use std::time::Duration;
///
/// assert_eq!(encode_coarse(Duration::from_micros(999_999)).unwrap().as_str(), "999m");
/// assert_eq!(encode_coarse(Duration::from_millis(1_234)).unwrap().as_str(), "1230m");
/// assert_eq!(encode_coarse(Duration::from_secs(2)).unwrap().as_str(), "2S");
/// assert_eq!(encode_coarse(Duration::from_nanos(7)).unwrap().as_str(), "7n");
/// ```
pub fn encode_coarse(timeout: Duration) -> Option<Encoded> {
    let (digits, exponent) = quantize(timeout)?;
    Some(
        coarse(digits, exponent)
            .unwrap_or_else(|| encode(timeout).expect("not zero: quantize returned digits")),
    )
}

/// What [`encode_coarse`] would send for `timeout`, as the duration the receiver decodes,
/// without writing it: `None` for zero. The propagate layer's cheap way to know what a
/// caller's coarse header promises; a property test keeps it equal to `encode_coarse`.
pub(crate) fn coarse_duration(timeout: Duration) -> Option<Duration> {
    // Below 10^8 s, three digits in the coarsest unit always fit in eight; from there on
    // `encode_coarse` falls back to the fine encoding (which saturates).
    if timeout.as_secs() >= 100_000_000 {
        return encode(timeout).map(|e| e.duration());
    }
    let (digits, exponent) = quantize(timeout)?;
    Some(Duration::from_nanos(digits * POW10[exponent as usize]))
}

/// Powers of ten that fit in a `u64`.
const POW10: [u64; 20] = {
    let mut table = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        table[i] = table[i - 1] * 10;
        i += 1;
    }
    table
};

/// `timeout` in nanoseconds as `digits × 10^exponent`, `digits` < 1000, rounded down; `None`
/// for zero. No u128 arithmetic and no loop: this runs on every call.
fn quantize(timeout: Duration) -> Option<(u64, u32)> {
    let ns = timeout
        .as_secs()
        .checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(u64::from(timeout.subsec_nanos())))
        .unwrap_or(u64::MAX);
    if ns == 0 {
        return None;
    }
    // log10 from log2 (1233 / 4096 ≈ log10 2), corrected by one comparison: cheaper than
    // `ilog10`'s cascade of comparisons on this path.
    let approx = ((64 - ns.leading_zeros()) * 1233) >> 12;
    let log10 = approx - u32::from(ns < POW10[approx as usize]);
    let exponent = log10.saturating_sub(2);
    Some((ns / POW10[exponent as usize], exponent))
}

/// `digits × 10^exponent` ns in the coarsest unit that holds it, or `None` past 8 digits of
/// seconds.
fn coarse(mut digits: u64, mut exponent: u32) -> Option<Encoded> {
    while digits.is_multiple_of(10) {
        digits /= 10;
        exponent += 1;
    }
    let (unit, shift) = match exponent {
        9.. => (b'S', exponent - 9),
        6.. => (b'm', exponent - 6),
        3.. => (b'u', exponent - 3),
        _ => (b'n', exponent),
    };
    let value = digits.checked_mul(10u64.checked_pow(shift)?)?;
    if value > MAX_VALUE {
        return None;
    }
    let ns = digits * 10u64.pow(exponent);
    Some(write(value, unit, Duration::from_nanos(ns)))
}

/// What [`encode_coarse`] sends for `timeout`, as a header value shared with the last calls on
/// this thread that sent the same one, and the duration the receiver will decode. Calls in a
/// row send the same value, so the common case is a lookup and a reference count: no
/// formatting and no allocation.
pub(crate) fn coarse_header_value(timeout: Duration) -> Option<(HeaderValue, Duration)> {
    const KEPT: usize = 4;
    /// A rounded duration's key, its header value, and the duration it says.
    type Entry = ((u64, u32), HeaderValue, Duration);
    struct Kept {
        values: [Option<Entry>; KEPT],
        next: usize,
        /// The last `timeout` asked for and the value it got: a call whose time left is its
        /// layer's own timeout asks for the same duration every time, and skips the rounding.
        last: Option<(Duration, usize)>,
    }
    thread_local! {
        static KEPT_VALUES: RefCell<Kept> = const {
            RefCell::new(Kept { values: [const { None }; KEPT], next: 0, last: None })
        };
    }
    KEPT_VALUES.with(|kept| {
        let kept = &mut *kept.borrow_mut();
        if let Some((asked, i)) = kept.last
            && asked == timeout
            && let Some((_, value, duration)) = &kept.values[i]
        {
            return Some((value.clone(), *duration));
        }
        let key = quantize(timeout)?;
        // The value written last is the likeliest (calls in a row), then the others.
        let newest = (kept.next + KEPT - 1) % KEPT;
        let found = std::iter::once(newest)
            .chain(0..KEPT)
            .find(|&i| kept.values[i].as_ref().is_some_and(|(k, ..)| *k == key));
        let i = match found {
            Some(i) => i,
            None => {
                let encoded = encode_coarse(timeout)?;
                let text = Bytes::copy_from_slice(encoded.as_str().as_bytes());
                let value = HeaderValue::from_maybe_shared(text).ok()?;
                let i = kept.next;
                kept.values[i] = Some((key, value, encoded.duration()));
                kept.next = (i + 1) % KEPT;
                i
            }
        };
        kept.last = Some((timeout, i));
        let (_, value, duration) = kept.values[i].as_ref().expect("found or written above");
        Some((value.clone(), *duration))
    })
}

/// Encodes `timeout` for the `grpc-timeout` header: the finest unit that fits in 8 digits,
/// rounding down. Returns `None` when `timeout` is zero, which must never be sent.
pub fn encode(timeout: Duration) -> Option<Encoded> {
    if timeout.is_zero() {
        return None;
    }
    // In u64 from seconds and the sub-second part: no u128 division on the request path.
    // Each branch's bound on `secs` keeps its value within 8 digits without overflow.
    let secs = timeout.as_secs();
    let sub = u64::from(timeout.subsec_nanos());
    let (value, unit, duration) = if secs == 0 && sub <= MAX_VALUE {
        (sub, b'n', Duration::from_nanos(sub))
    } else if secs < 100 && secs * 1_000_000 + sub / 1_000 <= MAX_VALUE {
        let v = secs * 1_000_000 + sub / 1_000;
        (v, b'u', Duration::from_micros(v))
    } else if secs < 100_000 && secs * 1_000 + sub / 1_000_000 <= MAX_VALUE {
        let v = secs * 1_000 + sub / 1_000_000;
        (v, b'm', Duration::from_millis(v))
    } else {
        let v = secs.min(MAX_VALUE);
        (v, b'S', Duration::from_secs(v))
    };
    Some(write(value, unit, duration))
}

/// `value` and `unit` as text; `duration` is what it decodes to.
fn write(value: u64, unit: u8, duration: Duration) -> Encoded {
    let mut buf = [0u8; 9];
    let mut digits = [0u8; 8];
    let mut n = value;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[i] = digits[len - 1 - i];
    }
    buf[len] = unit;
    Encoded {
        buf,
        len: (len + 1) as u8,
        duration,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The shortcut to log10 agrees with `ilog10` at every power of ten, either side of it,
    /// and at the extremes.
    #[test]
    fn quantize_finds_three_digits_everywhere() {
        let mut values = vec![1u64, 9, u64::MAX];
        let mut p = 1u64;
        while let Some(next) = p.checked_mul(10) {
            values.extend([p - 1, p, p + 1, next - 1]);
            p = next;
        }
        for ns in values.into_iter().filter(|&n| n > 0) {
            let (digits, exponent) = quantize(Duration::from_nanos(ns)).unwrap();
            assert_eq!(exponent, ns.ilog10().saturating_sub(2), "{ns}");
            assert_eq!(digits, ns / 10u64.pow(exponent), "{ns}");
            assert!(digits < 1000, "{ns}");
        }
    }

    const NS: u64 = 1;
    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    #[test]
    fn encode_vectors() {
        // grpc-go's TestEncodeTimeout vectors where its round-up and our round-down agree
        // (exact multiples), then our own for the rounding direction and the ceiling.
        let cases: &[(Duration, &str)] = &[
            (Duration::from_nanos(1), "1n"),
            (Duration::from_nanos(10), "10n"),
            (Duration::from_nanos(100), "100n"),
            (Duration::from_nanos(1_000), "1000n"),
            (Duration::from_nanos(10_000), "10000n"),
            (Duration::from_nanos(100_000), "100000n"),
            (Duration::from_nanos(1_000_000), "1000000n"),
            (Duration::from_nanos(10_000_000), "10000000n"),
            (Duration::from_nanos(100_000_000), "100000u"),
            (Duration::from_nanos(1_000_000_000), "1000000u"),
            (Duration::from_nanos(10_000_000_000), "10000000u"),
            (Duration::from_nanos(100_000_000_000), "100000m"),
            (Duration::from_nanos(1_000_000_000_000), "1000000m"),
            (Duration::from_nanos(10_000_000_000_000), "10000000m"),
            (Duration::from_nanos(100_000_000_000_000), "100000S"),
            (Duration::from_nanos(1_000_000_000_000_000), "1000000S"),
            (Duration::from_nanos(10_000_000_000_000_000), "10000000S"),
            (Duration::from_secs(2), "2000000u"),
            (Duration::from_secs(100), "100000m"),
            (Duration::from_secs(3600), "3600000m"),
            (Duration::from_secs(3601), "3601000m"),
            (Duration::from_secs(40 * 3600), "144000S"),
            // Round down, never up.
            (Duration::from_nanos(99_999_999), "99999999n"),
            (Duration::from_nanos(100_000_999), "100000u"),
            (Duration::from_nanos(123_456_789_123), "123456m"),
            (
                Duration::from_millis(99_999_999) + Duration::from_nanos(999_999),
                "99999999m",
            ),
            (Duration::from_secs(MAX_VALUE), "99999999S"),
            // Past 99 999 999 s everything saturates (monotone; see the module docs).
            (Duration::from_secs(MAX_VALUE + 1), "99999999S"),
            (Duration::MAX, "99999999S"),
        ];
        for &(d, want) in cases {
            let got = encode(d).unwrap();
            assert_eq!(got.as_str(), want, "{d:?}");
            assert_eq!(decode(want.as_bytes()).unwrap(), got.duration(), "{d:?}");
            assert_eq!(got.to_header_value(), want);
        }
    }

    /// Seconds up to 99 with a sub-second part: the finest unit that fits is `u`, since
    /// 99 s + 999 999 µs is 99 999 999 µs, 8 digits (the spec's TimeoutValue is at most 8
    /// digits); one more second does not fit and falls to `m`, rounded down.
    #[test]
    fn encode_fractions_of_seconds() {
        let cases: &[(Duration, &str)] = &[
            (Duration::from_millis(1_500), "1500000u"),
            (Duration::new(1, 999), "1000000u"),
            (Duration::new(99, 999_999_999), "99999999u"),
            (Duration::new(100, 999_999_999), "100999m"),
            (Duration::new(99_999, 999_999_999), "99999999m"),
            (Duration::new(100_000, 999_999_999), "100000S"),
        ];
        for &(d, want) in cases {
            let got = encode(d).unwrap();
            assert_eq!(got.as_str(), want, "{d:?}");
            assert_eq!(decode(want.as_bytes()).unwrap(), got.duration(), "{d:?}");
        }
    }

    /// The text forms of an encoded value and of the error, and the header decoder.
    #[test]
    fn text_forms_and_header_decoding() {
        let e = encode(Duration::from_millis(250)).unwrap();
        assert_eq!(e.to_string(), "250000u");
        assert_eq!(format!("{e:?}"), "Encoded(\"250000u\")");
        assert_eq!(
            decode_header(&HeaderValue::from_static("250m")),
            Ok(Duration::from_millis(250))
        );
        assert_eq!(
            decode_header(&HeaderValue::from_static("250")),
            Err(MalformedTimeout::new())
        );
    }

    /// `encode_coarse`: three significant digits, rounded down, written in the coarsest unit
    /// that holds them exactly. Each value is derived by hand: the duration in nanoseconds,
    /// cut to its three leading digits, then trailing zeros moved into the unit (10^9 ns = S,
    /// 10^6 = m, 10^3 = u, else n) while the value stays an integer.
    #[test]
    fn coarse_vectors() {
        let cases: &[(Duration, &str)] = &[
            // 7 ns: one digit, no unit above n holds it.
            (Duration::from_nanos(7), "7n"),
            // 1 234 ns → 123 × 10^1 ns = 1230n (u would need 1.23).
            (Duration::from_nanos(1_234), "1230n"),
            // 1 µs = 1 × 10^3 ns.
            (Duration::from_micros(1), "1u"),
            // 999 999 µs → 999 × 10^6 ns = 999m.
            (Duration::from_micros(999_999), "999m"),
            // 1 ms, 50 ms, 500 ms: 1, 5 × 10^7, 5 × 10^8 ns: m with shifts 0, 1 and 2.
            (Duration::from_millis(1), "1m"),
            (Duration::from_millis(50), "50m"),
            (Duration::from_millis(500), "500m"),
            // 1.2345 s → 123 × 10^7 ns = 1230m (S would need 1.23).
            (Duration::from_micros(1_234_500), "1230m"),
            // 1 s and 2 s: 1 and 2 × 10^9 ns.
            (Duration::from_secs(1), "1S"),
            (Duration::from_secs(2), "2S"),
            // 12 345 s → 123 × 10^11 ns = 12300S.
            (Duration::from_secs(12_345), "12300S"),
            // 99 999 999 s → 999 × 10^14 ns = 99900000S, 8 digits.
            (Duration::from_secs(99_999_999), "99900000S"),
            // 10^8 s would be 100000000S, 9 digits: the fine encoding's saturation instead.
            (Duration::from_secs(100_000_000), "99999999S"),
            (Duration::MAX, "99999999S"),
        ];
        for &(d, want) in cases {
            let got = encode_coarse(d).unwrap();
            assert_eq!(got.as_str(), want, "{d:?}");
            assert_eq!(decode(want.as_bytes()).unwrap(), got.duration(), "{d:?}");
            assert_eq!(coarse_duration(d), Some(got.duration()), "{d:?}");
        }
        assert!(encode_coarse(Duration::ZERO).is_none());
    }

    /// The values kept per thread: a repeat, a new value, one more than are kept, and a
    /// return to an older one all give what a fresh encoding writes, in any order.
    #[test]
    fn kept_values_in_a_fixed_order() {
        let ms = Duration::from_millis;
        let asked = [
            ms(1),
            ms(1),
            ms(2),
            ms(1),
            ms(3),
            ms(4),
            ms(5),
            ms(2),
            ms(5),
            Duration::from_micros(5_001),
            ms(6),
            Duration::ZERO,
            ms(6),
        ];
        for d in asked {
            let want = encode_coarse(d).map(|e| (e.to_header_value(), e.duration()));
            assert_eq!(coarse_header_value(d), want, "{d:?}");
        }
    }

    #[test]
    fn zero_is_never_encoded() {
        assert_eq!(encode(Duration::ZERO), None);
    }

    #[test]
    fn decode_vectors() {
        let ok: &[(&str, Duration)] = &[
            ("1H", Duration::from_secs(3600)),
            ("1M", Duration::from_secs(60)),
            ("1S", Duration::from_secs(1)),
            ("1m", Duration::from_millis(1)),
            ("1u", Duration::from_micros(1)),
            ("1n", Duration::from_nanos(1)),
            ("45S", Duration::from_secs(45)),
            ("1234S", Duration::from_secs(1234)),
            ("0n", Duration::ZERO),
            ("0S", Duration::ZERO),
            ("00000001S", Duration::from_secs(1)),
            ("00000000H", Duration::ZERO),
            ("99999999S", Duration::from_secs(99_999_999)),
            ("99999999H", Duration::from_secs(99_999_999 * 3600)),
            ("99999999n", Duration::from_nanos(99_999_999)),
        ];
        for &(s, want) in ok {
            assert_eq!(decode(s.as_bytes()), Ok(want), "{s}");
        }
        let malformed: &[&[u8]] = &[
            b"",
            b"H",
            b"1",
            b"12",
            b"123456789n",
            b"000000001S",
            b"1234567890123",
            b"#####",
            b"1x",
            b"10X",
            b"abS",
            b"12xS",
            b"9a1S",
            b"-1S",
            b"+1S",
            b" 1S",
            b"1S ",
            b"1.5S",
            b"1s",
            b"1h",
            b"1SS",
            b"\xff1S",
            b"1\x00",
        ];
        for &s in malformed {
            assert_eq!(decode(s), Err(MalformedTimeout::new()), "{s:?}");
        }
    }

    #[test]
    fn malformed_display() {
        assert_eq!(
            MalformedTimeout::new().to_string(),
            "malformed grpc-timeout"
        );
    }

    fn unit_of(e: &Encoded) -> Duration {
        match e.as_str().as_bytes().last() {
            Some(b'n') => Duration::from_nanos(NS),
            Some(b'u') => Duration::from_nanos(US),
            Some(b'm') => Duration::from_nanos(MS),
            Some(b'S') => Duration::from_nanos(S),
            other => panic!("unexpected unit {other:?}"),
        }
    }

    fn any_duration() -> impl Strategy<Value = Duration> {
        prop_oneof![
            (1u64..=u64::MAX).prop_map(Duration::from_nanos),
            (1u64..=10 * S).prop_map(Duration::from_nanos),
            (0u64..=u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        ]
    }

    #[test]
    fn coarse_duration_agrees_at_the_edges() {
        for t in [
            Duration::from_micros(999_999),
            Duration::from_millis(1_234),
            Duration::from_nanos(7),
            Duration::from_secs(99_999_999),
            Duration::from_secs(100_000_000),
            Duration::MAX,
        ] {
            assert_eq!(
                coarse_duration(t),
                encode_coarse(t).map(|e| e.duration()),
                "{t:?}"
            );
        }
        assert_eq!(coarse_duration(Duration::ZERO), None);
    }

    proptest! {
        #[test]
        fn round_trip_never_exceeds_and_loses_less_than_one_unit(d in any_duration()) {
            let e = encode(d).unwrap();
            let back = decode(e.as_str().as_bytes()).unwrap();
            prop_assert_eq!(back, e.duration());
            prop_assert!(back <= d);
            prop_assert!(!back.is_zero());
            if d < Duration::from_secs(MAX_VALUE + 1) {
                prop_assert!(d - back < unit_of(&e), "{:?} -> {} loses too much", d, e);
            }
        }

        #[test]
        fn at_most_eight_digits(d in any_duration()) {
            let e = encode(d).unwrap();
            let s = e.as_str();
            prop_assert!(s.len() >= 2 && s.len() <= 9);
            prop_assert!(s[..s.len() - 1].bytes().all(|b| b.is_ascii_digit()));
        }

        #[test]
        fn monotone(a in any_duration(), b in any_duration()) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(encode(lo).unwrap().duration() <= encode(hi).unwrap().duration());
        }

        /// The duration alone is the one the coarse header decodes to.
        #[test]
        fn coarse_duration_is_what_the_coarse_header_says(d in any_duration()) {
            prop_assert_eq!(coarse_duration(d), encode_coarse(d).map(|e| e.duration()));
        }

        /// The coarse encoding: never later than the time left, at most 1 % earlier (below
        /// 99 999 999 s), three significant digits at most, and monotone.
        #[test]
        fn coarse_is_never_late_and_at_most_one_percent_early(
            d in any_duration(),
            other in any_duration(),
        ) {
            let e = encode_coarse(d).unwrap();
            let back = decode(e.as_str().as_bytes()).unwrap();
            prop_assert_eq!(back, e.duration());
            prop_assert!(back <= d && !back.is_zero());
            if d < Duration::from_secs(MAX_VALUE) {
                prop_assert!(
                    (d - back).as_nanos() * 100 <= d.as_nanos(),
                    "{:?} -> {} loses more than 1 %", d, e
                );
                let digits = e.as_str()[..e.as_str().len() - 1].trim_end_matches('0').len();
                prop_assert!(digits <= 3, "{}", e);
            }
            let (lo, hi) = if d <= other { (d, other) } else { (other, d) };
            prop_assert!(
                encode_coarse(lo).unwrap().duration() <= encode_coarse(hi).unwrap().duration()
            );
            // A shared header value says the same as a fresh one, twice.
            for _ in 0..2 {
                let (value, decoded) = coarse_header_value(d).unwrap();
                prop_assert_eq!(&value, &e.to_header_value());
                prop_assert_eq!(decoded, e.duration());
            }
        }

        /// Whatever the order of the durations asked for (repeats, more distinct values than
        /// are kept, zero), the shared value is the one a fresh encoding writes.
        #[test]
        fn the_kept_values_always_say_what_a_fresh_encoding_would(
            asked in proptest::collection::vec(
                prop_oneof![
                    Just(Duration::ZERO),
                    (0u64..8).prop_map(|i| Duration::from_millis(100 * i + 1)),
                    any_duration(),
                ],
                1..40,
            ),
        ) {
            for d in asked {
                match encode_coarse(d) {
                    Some(e) => {
                        let (value, decoded) = coarse_header_value(d).unwrap();
                        prop_assert_eq!(&value, &e.to_header_value());
                        prop_assert_eq!(decoded, e.duration());
                    }
                    None => prop_assert!(coarse_header_value(d).is_none()),
                }
            }
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_accepts_exactly_the_grammar(
            digits in "[0-9]{1,8}",
            unit in prop::sample::select(vec!['H', 'M', 'S', 'm', 'u', 'n']),
        ) {
            let s = format!("{digits}{unit}");
            prop_assert!(decode(s.as_bytes()).is_ok());
        }
    }
}
