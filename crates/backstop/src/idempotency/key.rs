//! The `Idempotency-Key` header: a structured-field string (`"8e03978e-..."`,
//! draft-ietf-httpapi-idempotency-key-header §2.1), or the bare token many clients send.

use http::HeaderValue;
use std::fmt;

/// The request header that carries the key.
pub const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// Why an `Idempotency-Key` header was refused (answered 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum KeyError {
    /// The key is empty (`""` or a blank header).
    Empty,
    /// The key is longer than 255 bytes.
    TooLong,
    /// The key has a byte that is not printable ASCII, or is a malformed string (an
    /// unterminated quote, a backslash not before `"` or `\`).
    Malformed,
    /// The request carries more than one `Idempotency-Key` header.
    Repeated,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyError::Empty => "the Idempotency-Key is empty",
            KeyError::TooLong => "the Idempotency-Key is too long",
            KeyError::Malformed => {
                "the Idempotency-Key is not a structured-field string of printable ASCII"
            }
            KeyError::Repeated => "the request has more than one Idempotency-Key header",
        })
    }
}

impl std::error::Error for KeyError {}

/// The key in a header value: the content of a structured-field string (escapes undone), or
/// the value itself when it is not quoted (a bare token, surrounding spaces dropped).
pub(crate) fn parse_key(value: &HeaderValue, max_len: usize) -> Result<String, KeyError> {
    let raw = value.as_bytes().trim_ascii();
    let key = if let Some(inner) = raw.strip_prefix(b"\"") {
        let mut key = Vec::with_capacity(inner.len());
        let mut bytes = inner.iter();
        loop {
            match bytes.next() {
                None => return Err(KeyError::Malformed),
                Some(b'"') => break,
                Some(b'\\') => match bytes.next() {
                    Some(c @ (b'"' | b'\\')) => key.push(*c),
                    _ => return Err(KeyError::Malformed),
                },
                Some(c @ 0x20..=0x7e) => key.push(*c),
                Some(_) => return Err(KeyError::Malformed),
            }
        }
        // Parameters after the string (`;a=1`) are allowed by structured fields and ignored;
        // anything else is not a string.
        let rest = bytes.as_slice().trim_ascii_start();
        if !rest.is_empty() && !rest.starts_with(b";") {
            return Err(KeyError::Malformed);
        }
        key
    } else {
        if raw.iter().any(|c| !(0x21..=0x7e).contains(c) || *c == b'"') {
            return Err(KeyError::Malformed);
        }
        raw.to_vec()
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > max_len {
        return Err(KeyError::TooLong);
    }
    // Printable ASCII only, so always UTF-8.
    String::from_utf8(key).map_err(|_| KeyError::Malformed)
}

/// A key as a structured-field string: `"` + the key + `"` (the key is hex, so nothing to
/// escape).
pub(crate) fn format_key(bits: u128) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{bits:032x}\"")).expect("hex is a valid header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[u8]) -> Result<String, KeyError> {
        match HeaderValue::from_bytes(v) {
            Ok(value) => parse_key(&value, 16),
            Err(_) => panic!("not a header value: {v:?}"),
        }
    }

    #[test]
    fn keys_as_clients_send_them() {
        let cases: &[(&[u8], Result<&str, KeyError>)] = &[
            (b"\"8e03978e-40d5\"", Ok("8e03978e-40d5")),
            (b"8e03978e-40d5", Ok("8e03978e-40d5")),
            (b"  abc  ", Ok("abc")),
            (b"\"a b\"", Ok("a b")),
            (b"\"a\\\"b\\\\\"", Ok("a\"b\\")),
            (b"\"abc\";p=1", Ok("abc")),
            (b"\"\"", Err(KeyError::Empty)),
            (b"", Err(KeyError::Empty)),
            (b"\"abc", Err(KeyError::Malformed)),
            (b"\"a\\b\"", Err(KeyError::Malformed)),
            (b"\"abc\"x", Err(KeyError::Malformed)),
            (b"a b", Err(KeyError::Malformed)),
            (b"a\"b", Err(KeyError::Malformed)),
            ("\"caf\u{e9}\"".as_bytes(), Err(KeyError::Malformed)),
            (b"\"\t\"", Err(KeyError::Malformed)),
            (b"0123456789abcdef", Ok("0123456789abcdef")),
            (b"0123456789abcdefg", Err(KeyError::TooLong)),
            (b"\"0123456789abcdefg\"", Err(KeyError::TooLong)),
        ];
        for (raw, want) in cases {
            assert_eq!(
                parse(raw).as_deref(),
                want.as_deref(),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn a_formatted_key_parses_back() {
        let v = format_key(0xdead_beef);
        assert_eq!(v, "\"000000000000000000000000deadbeef\"");
        assert_eq!(
            parse_key(&v, 255).unwrap(),
            "000000000000000000000000deadbeef"
        );
    }
}
