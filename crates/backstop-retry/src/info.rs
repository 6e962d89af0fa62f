//! What a call did, told to its caller: on the response as an extension, on the error inside
//! [`RetryError`](crate::RetryError).

use crate::GiveUp;
use backstop_core::Rejection;
use http::{HeaderMap, HeaderName, HeaderValue};

/// What one call through a [`Retry`](crate::Retry) did: how many attempts it sent and, when it
/// ended on a failure the layer did not retry, why.
///
/// A response carries one as an **extension**, so it survives any layer or body wrapping
/// around the retry layer and reaches a tonic generated client's
/// `tonic::Response::extensions()`; an error carries it inside its
/// [`RetryError`](crate::RetryError) ([`RetryError::info`](crate::RetryError::info)).
///
/// The layer puts it on every response with something to tell: a call that took more than
/// one attempt, one it gave up on ([`gave_up`](Self::gave_up) is `Some`), and a local
/// rejection (an open breaker's answer, which carries a
/// [`Rejection`](backstop_core::Rejection)). A response of a retry layer without one is the
/// answer of the call's one and only attempt, as if it carried `CallInfo::new(1, None)`:
/// the common case keeps its path free of the extension map's allocation (about 800
/// instructions a call).
///
/// ```
/// use backstop_retry::{CallInfo, GiveUp, RetryError};
///
/// # let response = {
/// #     let mut r = http::Response::new(());
/// #     r.extensions_mut().insert(CallInfo::new(2, None));
/// #     r
/// # };
/// // A response of a retry layer (or of any stack with one in it):
/// assert_eq!(CallInfo::of(&response).attempts(), 2);
/// // The answer of a call's only attempt carries none:
/// assert_eq!(CallInfo::of(&http::Response::new(())), CallInfo::new(1, None));
///
/// // An error of one: the same, found anywhere in the source chain.
/// let err: backstop_core::BoxError =
///     Box::new(RetryError::new(3, Some(GiveUp::Budget), "reset".into()));
/// let info = backstop_core::find::<RetryError>(&*err).map(RetryError::info);
/// assert_eq!(info, Some(CallInfo::new(3, Some(GiveUp::Budget))));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallInfo {
    attempts: u32,
    gave_up: Option<GiveUp>,
}

impl CallInfo {
    /// The metadata entry that tells a failed gRPC call's attempts (see
    /// [`of_metadata`](Self::of_metadata)).
    pub const ATTEMPTS: HeaderName = HeaderName::from_static("backstop-attempts");
    /// The metadata entry that tells why a failed gRPC call was not retried, as
    /// [`GiveUp::as_str`] names it (see [`of_metadata`](Self::of_metadata)).
    pub const GAVE_UP: HeaderName = HeaderName::from_static("backstop-gave-up");

    /// The record of a call that sent `attempts` and gave up for `gave_up` (for tests of
    /// code that reads it; the layer makes its own).
    pub const fn new(attempts: u32, gave_up: Option<GiveUp>) -> Self {
        Self { attempts, gave_up }
    }

    /// What `response`, returned by a stack with a retry layer in it, says of its call: its
    /// extension, or, without one, the call's one attempt (`CallInfo::new(1, None)`), or no
    /// attempt at all (`CallInfo::new(0, None)`) for a local rejection made outside the retry
    /// layer (a deadline spent before the call reached it).
    pub fn of<B>(response: &http::Response<B>) -> Self {
        let extensions = response.extensions();
        match extensions.get::<Self>() {
            Some(info) => *info,
            None if extensions.get::<Rejection>().is_some() => Self::new(0, None),
            None => Self::new(1, None),
        }
    }

    /// What a failed gRPC call's status metadata says of it: a `tonic::Status` keeps the
    /// response's headers as its metadata (`status.metadata().as_ref()`, or
    /// `backstop::tonic::status_info`), and not its extensions, so for a gRPC answer that
    /// failed in its headers (trailers-only, as servers answer a unary error) the retry
    /// layer writes [`ATTEMPTS`](Self::ATTEMPTS) (`backstop-attempts: 3`) and, when it gave up,
    /// [`GAVE_UP`](Self::GAVE_UP) (`backstop-gave-up: budget`) there too, whenever it writes the extension.
    /// `None` when there is neither (the call's one attempt answered, or the failure came
    /// in trailers after a body, which the layer never retries); a value it cannot read is
    /// `None` too.
    ///
    /// The entries are this client's and go no further: a server that passes an upstream's
    /// failure headers on as its own would pass them too (tonic's servers build a new
    /// status), so read them on the client that made the call.
    ///
    /// ```
    /// use backstop_retry::{CallInfo, GiveUp};
    ///
    /// let mut headers = http::HeaderMap::new();
    /// headers.insert("backstop-attempts", "3".parse().unwrap());
    /// headers.insert("backstop-gave-up", "budget".parse().unwrap());
    /// assert_eq!(CallInfo::of_metadata(&headers), Some(CallInfo::new(3, Some(GiveUp::Budget))));
    /// assert_eq!(CallInfo::of_metadata(&http::HeaderMap::new()), None);
    /// ```
    pub fn of_metadata(headers: &HeaderMap) -> Option<Self> {
        let attempts = headers.get(Self::ATTEMPTS)?.to_str().ok()?.parse().ok()?;
        let gave_up = match headers.get(Self::GAVE_UP) {
            None => None,
            Some(value) => {
                let name = value.to_str().ok()?;
                Some(GiveUp::all().find(|why| why.as_str() == name)?)
            }
        };
        Some(Self::new(attempts, gave_up))
    }

    /// Writes [`ATTEMPTS`](Self::ATTEMPTS) and [`GAVE_UP`](Self::GAVE_UP) into a gRPC answer's headers when they carry a
    /// failure (a `grpc-status` other than 0); see [`of_metadata`](Self::of_metadata).
    pub(crate) fn write_failure_headers(&self, headers: &mut HeaderMap) {
        let failed = headers
            .get(backstop_core::grpc::GRPC_STATUS)
            .is_some_and(|status| status.as_bytes() != b"0");
        if !failed {
            return;
        }
        headers.insert(Self::ATTEMPTS, HeaderValue::from(self.attempts));
        match self.gave_up {
            Some(why) => {
                headers.insert(Self::GAVE_UP, HeaderValue::from_static(why.as_str()));
            }
            None => {
                headers.remove(Self::GAVE_UP);
            }
        }
    }

    /// Attempts the call sent, the first included (hedges count as attempts); 0 when its
    /// deadline had passed before any was sent.
    pub const fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Why no further attempt was made, when the call ended on a failure the layer could
    /// have retried or whose retry it refused ([`GiveUp`], the reason its stats and metrics
    /// count); `None` for a success, and for an answer that was never a candidate (a client
    /// error, an open breaker).
    pub const fn gave_up(&self) -> Option<GiveUp> {
        self.gave_up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc(status: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from_static(status));
        headers
    }

    #[test]
    fn only_a_failure_in_the_headers_is_told_in_the_metadata() {
        let info = CallInfo::new(2, Some(GiveUp::Budget));
        let mut failed = grpc("14");
        info.write_failure_headers(&mut failed);
        assert_eq!(CallInfo::of_metadata(&failed), Some(info));
        // A later write replaces the earlier, reason included.
        CallInfo::new(3, None).write_failure_headers(&mut failed);
        assert_eq!(CallInfo::of_metadata(&failed), Some(CallInfo::new(3, None)));
        for mut headers in [grpc("0"), HeaderMap::new()] {
            info.write_failure_headers(&mut headers);
            assert_eq!(CallInfo::of_metadata(&headers), None);
        }
    }

    #[test]
    fn unreadable_metadata_is_none() {
        for (attempts, reason) in [("x", None), ("2", Some("bored")), ("-1", None)] {
            let mut headers = HeaderMap::new();
            headers.insert(CallInfo::ATTEMPTS, HeaderValue::from_static(attempts));
            if let Some(reason) = reason {
                headers.insert(CallInfo::GAVE_UP, HeaderValue::from_static(reason));
            }
            assert_eq!(
                CallInfo::of_metadata(&headers),
                None,
                "{attempts} {reason:?}"
            );
        }
    }
}
