//! What is kept of a request so that it can be sent again: its head, packed.
//!
//! Every request that may be retried needs a copy of its head, made before the first attempt
//! takes the request, and on the success path that copy is dropped unused. Copying the
//! `http` types costs two allocations for the header map, and one per header value or URI
//! that was parsed from a string (cloning such a `Bytes` moves it to the heap; BENCHMARKS.md
//! has the count). So the head is packed
//! instead: the URI's text and each header's name, value and sensitivity, in one buffer (one
//! allocation, a few copies of bytes), and unpacked only when an attempt after the first is
//! built — where every header value becomes a slice of that one shared buffer.
//!
//! That one allocation is recycled too: a template dropped unused leaves its buffer as its
//! thread's spare (one per thread, kept only up to 4 KiB), and the next template made on that
//! thread packs into it. A thread that makes calls one after another then allocates nothing
//! for them; one with many calls in flight allocates for some. Each thread's spare is its own
//! (a thread-local, never shared): a template dropped on another thread than the one that made
//! it leaves its buffer there.

use crate::client::retry::Idempotency;
use crate::deadline::Deadline;
use bytes::Bytes;
use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};
use std::cell::Cell;

/// A request's head, kept for the attempts after the first; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Template {
    pub(crate) method: Method,
    version: Version,
    extensions: Kept,
    /// The URI's length and text, then per header nine fixed bytes (the name's length, the
    /// value's length, the sensitivity) and the name and value; lengths are `u32` in native
    /// order (the buffer never leaves the process). A `Vec`, not `Bytes`: an attempt after the
    /// first copies it into one shared `Bytes` that its header values slice.
    head: Vec<u8>,
    headers: usize,
}

/// A request's extensions, kept for its retries. Most requests carry none but the call's
/// [`Deadline`] (an outer `PropagateDeadline` puts it there): that one is kept by value, which
/// spares a copy of the map (three allocations) for every request that is never retried.
#[derive(Debug)]
enum Kept {
    /// No extension but, maybe, the deadline.
    Deadline(Option<Deadline>),
    /// Any other extensions: the whole map.
    All(Extensions),
}

impl Kept {
    fn of(extensions: &Extensions) -> Self {
        match extensions.len() {
            0 => Kept::Deadline(None),
            1 => match extensions.get::<Deadline>() {
                Some(&deadline) => Kept::Deadline(Some(deadline)),
                None => Kept::All(extensions.clone()),
            },
            _ => Kept::All(extensions.clone()),
        }
    }

    fn to_extensions(&self) -> Extensions {
        match self {
            Kept::Deadline(None) => Extensions::new(),
            Kept::Deadline(Some(deadline)) => {
                let mut extensions = Extensions::new();
                extensions.insert(*deadline);
                extensions
            }
            Kept::All(extensions) => extensions.clone(),
        }
    }
}

/// The largest buffer kept as a thread's spare: a request with a larger head allocates its
/// own, and frees it.
const KEPT_CAPACITY: usize = 4096;

thread_local! {
    /// This thread's spare head buffer; see the [module docs](self).
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

impl Drop for Template {
    fn drop(&mut self) {
        let head = std::mem::take(&mut self.head);
        if head.capacity() <= KEPT_CAPACITY {
            // During the thread's teardown the spare is gone: the buffer is freed instead.
            let _ = SPARE.try_with(|spare| spare.replace(head));
        }
    }
}

/// The `Idempotency-Key` header.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The URI's parts in the order its text has them.
fn uri_parts(uri: &Uri) -> [&str; 3] {
    let scheme = uri.scheme_str().unwrap_or("");
    let authority = uri.authority().map_or("", |a| a.as_str());
    let path = uri.path_and_query().map_or("", |p| p.as_str());
    [scheme, authority, path]
}

/// Reads the packed fields in order.
struct Reader<'a> {
    head: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn next(&mut self) -> (usize, &'a [u8]) {
        let len = u32::from_ne_bytes(
            self.head[self.at..self.at + 4]
                .try_into()
                .expect("four bytes"),
        ) as usize;
        let start = self.at + 4;
        self.at = start + len;
        (start, &self.head[start..start + len])
    }

    /// The next header: its name, where its value starts, its value, and its sensitivity.
    fn header(&mut self) -> (&'a [u8], usize, &'a [u8], bool) {
        let fixed = &self.head[self.at..self.at + 9];
        let name_len = u32::from_ne_bytes(fixed[..4].try_into().expect("four bytes")) as usize;
        let value_len = u32::from_ne_bytes(fixed[4..8].try_into().expect("four bytes")) as usize;
        let sensitive = fixed[8] == 1;
        let name_at = self.at + 9;
        let value_at = name_at + name_len;
        self.at = value_at + value_len;
        (
            &self.head[name_at..value_at],
            value_at,
            &self.head[value_at..self.at],
            sensitive,
        )
    }
}

impl Template {
    pub(crate) fn new<B>(req: &Request<B>) -> Self {
        let [scheme, authority, path] = uri_parts(req.uri());
        let headers = req.headers();
        let separator = if scheme.is_empty() { 0 } else { 3 };
        let uri_len = scheme.len() + separator + authority.len() + path.len();
        let mut head = SPARE.try_with(Cell::take).unwrap_or_default();
        head.clear();
        // Room for the URI and typical headers; a spare buffer (the common case) already has
        // it, and a larger head grows the buffer as it is written.
        head.reserve(4 + uri_len + 48 * headers.len());
        head.extend_from_slice(&(uri_len as u32).to_ne_bytes());
        head.extend_from_slice(scheme.as_bytes());
        if separator != 0 {
            head.extend_from_slice(b"://");
        }
        head.extend_from_slice(authority.as_bytes());
        head.extend_from_slice(path.as_bytes());
        for (name, value) in headers {
            let (name, bytes) = (name.as_str().as_bytes(), value.as_bytes());
            let mut fixed = [0u8; 9];
            fixed[..4].copy_from_slice(&(name.len() as u32).to_ne_bytes());
            fixed[4..8].copy_from_slice(&(bytes.len() as u32).to_ne_bytes());
            fixed[8] = u8::from(value.is_sensitive());
            head.extend_from_slice(&fixed);
            head.extend_from_slice(name);
            head.extend_from_slice(bytes);
        }
        Self {
            method: req.method().clone(),
            version: req.version(),
            extensions: Kept::of(req.extensions()),
            head,
            headers: headers.len(),
        }
    }

    /// The request again, with `body`.
    pub(crate) fn request<B>(&self, body: B) -> Request<B> {
        let shared = Bytes::copy_from_slice(&self.head);
        let mut reader = Reader {
            head: &self.head,
            at: 0,
        };
        let (start, uri) = reader.next();
        let uri = if uri.is_empty() {
            Uri::default()
        } else {
            Uri::from_maybe_shared(shared.slice(start..start + uri.len()))
                .expect("a URI that parsed once parses again")
        };
        let mut headers = HeaderMap::with_capacity(self.headers);
        for _ in 0..self.headers {
            let (name, start, value, sensitive) = reader.header();
            let name = HeaderName::from_bytes(name).expect("a valid header name");
            let mut value =
                HeaderValue::from_maybe_shared(shared.slice(start..start + value.len()))
                    .expect("a valid header value");
            value.set_sensitive(sensitive);
            headers.append(name, value);
        }
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = headers;
        *req.extensions_mut() = self.extensions.to_extensions();
        req
    }

    /// Whether the request carried a header named `name` (lowercase), scanning the packed
    /// head: only failures that may be retried, and hedged requests, ask.
    fn has_header(&self, name: &str) -> bool {
        self.header(name).is_some()
    }

    /// The first value of the header named `name` (lowercase), scanning the packed head.
    fn header(&self, name: &str) -> Option<&[u8]> {
        let mut reader = Reader {
            head: &self.head,
            at: 0,
        };
        reader.next();
        for _ in 0..self.headers {
            let (n, _, value, _) = reader.header();
            if n == name.as_bytes() {
                return Some(value);
            }
        }
        None
    }

    /// Whether the request is gRPC (its `content-type`).
    fn is_grpc(&self) -> bool {
        self.header("content-type")
            .and_then(|v| http::HeaderValue::from_bytes(v).ok())
            .is_some_and(|v| crate::wire::grpc::is_grpc_content_type(&v))
    }

    /// The request's URI (for a hedge delay or retry reserve kept per route: only hedges
    /// and retries ask).
    pub(crate) fn uri(&self) -> Uri {
        let mut reader = Reader {
            head: &self.head,
            at: 0,
        };
        let (_, uri) = reader.next();
        if uri.is_empty() {
            return Uri::default();
        }
        Uri::try_from(uri).unwrap_or_default()
    }

    /// The request's path, without the query (for events).
    pub(crate) fn path(&self) -> &str {
        let mut reader = Reader {
            head: &self.head,
            at: 0,
        };
        let (_, uri) = reader.next();
        let uri = std::str::from_utf8(uri).unwrap_or("");
        let after_authority = match uri.split_once("://") {
            Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
            None => uri,
        };
        after_authority
            .split_once('?')
            .map_or(after_authority, |(path, _)| path)
    }

    /// Whether `idempotency` lets this request be sent twice.
    pub(crate) fn idempotent(&self, idempotency: Idempotency) -> bool {
        idempotency.allows_with(&self.method, || {
            self.has_header(IDEMPOTENCY_KEY) && !self.is_grpc()
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn uri() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("http://svc/x".to_owned()),
            Just("https://svc.example:8443/a/b?c=d&e".to_owned()),
            Just("http://svc".to_owned()),
            Just("/relative/path?q=1".to_owned()),
            Just("/".to_owned()),
            Just("*".to_owned()),
            Just("svc.example:443".to_owned()),
            "/[a-z0-9/]{0,40}(\\?[a-z=&]{0,20})?",
        ]
    }

    fn header() -> impl Strategy<Value = (String, Vec<u8>, bool)> {
        (
            prop_oneof![
                Just("x-request-id".to_owned()),
                Just("content-type".to_owned()),
                Just("authorization".to_owned()),
                Just("idempotency-key".to_owned()),
                "x-[a-z]{1,12}",
            ],
            // Visible ASCII, spaces inside, and obs-text bytes.
            proptest::collection::vec(prop_oneof![0x21u8..0x7f, Just(b' '), 0x80u8..=0xff], 0..40)
                .prop_map(|mut v| {
                    // A value may not start or end with a space to round-trip unchanged; trim it
                    // as a transport would.
                    while v.first() == Some(&b' ') {
                        v.remove(0);
                    }
                    while v.last() == Some(&b' ') {
                        v.pop();
                    }
                    v
                }),
            any::<bool>(),
        )
    }

    proptest! {
        /// What a retry sends is the head the caller sent: method, URI, version, every header
        /// value in order with its sensitivity, and the extensions.
        #[test]
        fn a_packed_head_unpacks_to_the_same_request(
            method in prop_oneof![Just(Method::GET), Just(Method::POST), Just(Method::PUT),
                Just(Method::CONNECT), Just(Method::OPTIONS),
                Just(Method::from_bytes(b"PURGE").unwrap())],
            uri in uri(),
            version in prop_oneof![Just(Version::HTTP_11), Just(Version::HTTP_2)],
            headers in proptest::collection::vec(header(), 0..12),
        ) {
            let mut req = Request::new(());
            *req.method_mut() = method;
            *req.uri_mut() = uri.parse().unwrap();
            *req.version_mut() = version;
            for (name, value, sensitive) in &headers {
                let mut value = HeaderValue::from_bytes(value).unwrap();
                value.set_sensitive(*sensitive);
                req.headers_mut().append(HeaderName::from_bytes(name.as_bytes()).unwrap(), value);
            }
            req.extensions_mut().insert(7u32);
            let template = Template::new(&req);
            let again = template.request(());
            prop_assert_eq!(again.method(), req.method());
            prop_assert_eq!(again.uri(), req.uri());
            prop_assert_eq!(again.uri().to_string(), req.uri().to_string());
            prop_assert_eq!(again.version(), req.version());
            let seen = |r: &Request<()>| {
                r.headers()
                    .iter()
                    .map(|(n, v)| (n.clone(), v.clone(), v.is_sensitive()))
                    .collect::<Vec<_>>()
            };
            prop_assert_eq!(seen(&again), seen(&req));
            prop_assert_eq!(again.extensions().get::<u32>(), Some(&7));
            if req.uri().path_and_query().is_some() && req.method() != Method::CONNECT {
                prop_assert_eq!(template.path(), req.uri().path());
            }
            let keyed = headers.iter().any(|(n, ..)| n == "idempotency-key");
            prop_assert_eq!(template.has_header(IDEMPOTENCY_KEY), keyed);
            prop_assert_eq!(
                template.idempotent(Idempotency::Standard),
                Idempotency::Standard.allows(req.method(), req.headers())
            );
        }
    }

    fn with_headers(n: usize, value_len: usize) -> Request<()> {
        let mut req = Request::new(());
        *req.uri_mut() = "http://svc/x".parse().unwrap();
        for i in 0..n {
            let name = HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap();
            let value = HeaderValue::from_bytes(&vec![b'v'; value_len]).unwrap();
            req.headers_mut().append(name, value);
        }
        req
    }

    #[test]
    fn a_dropped_template_leaves_its_buffer_to_the_next_one_on_its_thread() {
        SPARE.take();
        let first = Template::new(&with_headers(3, 10));
        let buffer = first.head.as_ptr();
        drop(first);
        // A smaller head fits the spare: same buffer, and what it unpacks is its own.
        let req = with_headers(1, 4);
        let second = Template::new(&req);
        assert_eq!(second.head.as_ptr(), buffer);
        assert_eq!(second.request(()).headers(), req.headers());
        // Taken: a template made while the second is alive allocates its own.
        let third = Template::new(&req);
        assert_ne!(third.head.as_ptr(), buffer);
        assert_eq!(third.request(()).headers(), req.headers());
        drop((second, third));
        // A larger head than the spare grows it, and still unpacks whole.
        let big = with_headers(20, 30);
        assert_eq!(Template::new(&big).request(()).headers(), big.headers());
    }

    #[test]
    fn a_buffer_over_the_cap_is_not_kept() {
        SPARE.take();
        drop(Template::new(&with_headers(4, 2 * KEPT_CAPACITY)));
        assert_eq!(SPARE.take().capacity(), 0);
        drop(Template::new(&with_headers(4, 100)));
        assert!(SPARE.take().capacity() > 0);
    }

    #[test]
    fn a_template_dropped_on_another_thread_leaves_its_buffer_there() {
        SPARE.take();
        let template = Template::new(&with_headers(2, 8));
        let kept = std::thread::spawn(move || {
            drop(template);
            SPARE.take().capacity()
        })
        .join()
        .unwrap();
        assert!(kept > 0);
        assert_eq!(SPARE.take().capacity(), 0);
    }

    #[test]
    fn a_request_without_headers_or_uri_round_trips() {
        let req = Request::new(());
        let again = Template::new(&req).request(());
        assert_eq!(again.uri(), req.uri());
        assert!(again.headers().is_empty());
    }
}
