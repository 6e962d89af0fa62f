//! What a store keeps for a key: the request's fingerprint, and once the handler answered, the
//! answer to replay.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use sha2::{Digest, Sha256};
use std::fmt;

/// A SHA-256 digest of what makes two requests "the same request": method, path and query,
/// the caller's identity (when configured) and the body.
///
/// Two requests with one key and different fingerprints are a client bug (a key reused for
/// another operation): the second is answered 422.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a request (`identity` is `None` when no identity is configured).
    pub(crate) fn of(
        method: &http::Method,
        path_and_query: &str,
        identity: Option<&str>,
        body: &[u8],
    ) -> Self {
        let mut h = Sha256::new();
        // Each part is length-prefixed, so no two different requests hash the same input.
        for part in [
            method.as_str().as_bytes(),
            path_and_query.as_bytes(),
            identity.map_or(&[][..], str::as_bytes),
        ] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        h.update([u8::from(identity.is_some())]);
        h.update(body);
        Self(h.finalize().into())
    }

    /// A fingerprint from its 32 bytes (for stores that keep it elsewhere).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The digest's 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint(")?;
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

/// The answer of a handler, kept to be replayed to every later request with the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The fingerprint of the request that produced it.
    pub fingerprint: Fingerprint,
    /// The response status.
    pub status: StatusCode,
    /// The response headers, as the handler sent them.
    pub headers: HeaderMap,
    /// The whole response body.
    pub body: Bytes,
}

impl StoredResponse {
    /// Bytes this record takes in a store (body, headers and a fixed overhead), the measure
    /// of the memory store's byte bound.
    pub fn size(&self) -> usize {
        head_size(&self.headers) + self.body.len()
    }

    /// Encodes the record for a store that keeps bytes (the Redis store): `C`, the
    /// fingerprint, the status, the headers (each name and value length-prefixed), the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size());
        out.push(b'C');
        out.extend_from_slice(&self.fingerprint.0);
        out.extend_from_slice(&self.status.as_u16().to_be_bytes());
        out.extend_from_slice(&(self.headers.len() as u32).to_be_bytes());
        for (name, value) in &self.headers {
            out.extend_from_slice(&(name.as_str().len() as u32).to_be_bytes());
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(&self.body);
        out
    }

    /// Decodes what [`encode`](Self::encode) wrote; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        if r.take(1)? != b"C" {
            return None;
        }
        let fingerprint = Fingerprint(r.take(32)?.try_into().ok()?);
        let status = StatusCode::from_u16(u16::from_be_bytes(r.take(2)?.try_into().ok()?)).ok()?;
        let count = r.u32()?;
        let mut headers = HeaderMap::new();
        for _ in 0..count {
            let n = r.u32()? as usize;
            let name = HeaderName::from_bytes(r.take(n)?).ok()?;
            let n = r.u32()? as usize;
            let value = HeaderValue::from_bytes(r.take(n)?).ok()?;
            headers.append(name, value);
        }
        Some(Self {
            fingerprint,
            status,
            headers,
            body: Bytes::copy_from_slice(r.0),
        })
    }
}

/// What a record takes besides its body: its headers and a fixed overhead.
pub(crate) fn head_size(headers: &HeaderMap) -> usize {
    let headers: usize = headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 8)
        .sum();
    64 + headers
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_encoding() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        let record = StoredResponse {
            fingerprint: Fingerprint::of(&http::Method::POST, "/orders", None, b"{}"),
            status: StatusCode::CREATED,
            headers,
            body: Bytes::from_static(b"{\"id\":7}"),
        };
        assert_eq!(
            StoredResponse::decode(&record.encode()),
            Some(record.clone())
        );
        let encoded = record.encode();
        for cut in 0..70 {
            // A truncated record never decodes into something else (the body is the tail,
            // so only cuts inside the head are checked).
            assert!(
                StoredResponse::decode(&encoded[..cut]).is_none(),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn every_part_of_a_request_moves_its_fingerprint() {
        let base = Fingerprint::of(&http::Method::POST, "/a", None, b"x");
        assert_eq!(base, Fingerprint::of(&http::Method::POST, "/a", None, b"x"));
        assert_ne!(
            base,
            Fingerprint::of(&http::Method::PATCH, "/a", None, b"x")
        );
        assert_ne!(base, Fingerprint::of(&http::Method::POST, "/b", None, b"x"));
        assert_ne!(
            base,
            Fingerprint::of(&http::Method::POST, "/a", Some(""), b"x")
        );
        assert_ne!(base, Fingerprint::of(&http::Method::POST, "/a", None, b"y"));
        assert_ne!(
            Fingerprint::of(&http::Method::POST, "/a", Some("u1"), b"x"),
            Fingerprint::of(&http::Method::POST, "/a", Some("u2"), b"x")
        );
    }
}
