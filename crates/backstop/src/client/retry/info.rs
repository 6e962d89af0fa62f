//! What a call did, told to its caller: on the response as an extension, on the error inside
//! [`RetryError`](crate::client::retry::RetryError).

use crate::Rejection;
use crate::client::retry::GiveUp;
use http::{HeaderMap, HeaderName, HeaderValue};

/// What one call through a [`Retry`](crate::client::retry::Retry) did: how many attempts it sent and, when it
/// ended on a failure the layer did not retry, why.
///
/// A response carries one as an **extension**, so it survives any layer or body wrapping
/// around the retry layer and reaches a tonic generated client's
/// `tonic::Response::extensions()`; an error carries it inside its
/// [`RetryError`](crate::client::retry::RetryError) ([`RetryError::info`](crate::client::retry::RetryError::info)).
///
/// The layer puts it on every response with something to tell: a call that took more than
/// one attempt, one it gave up on ([`gave_up`](Self::gave_up) is `Some`), and a local
/// rejection (an open breaker's answer, which carries a
/// [`Rejection`](crate::Rejection)). A response of a retry layer without one is the
/// answer of the call's one and only attempt, as if it carried `CallInfo::new(1, None)`:
/// the common case keeps its path free of the extension map's allocation.
///
/// ```
/// use backstop::client::retry::{CallInfo, GiveUp, RetryError};
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
/// let err: backstop::BoxError =
///     Box::new(RetryError::new(3, Some(GiveUp::Budget), "reset".into()));
/// let info = backstop::find::<RetryError>(&*err).map(RetryError::info);
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
    /// use backstop::client::retry::{CallInfo, GiveUp};
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
            .get(crate::wire::grpc::GRPC_STATUS)
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
    /// deadline had passed before any was sent. An attempt is what the retry layer handed to
    /// the layers inside it: one that a breaker or the adaptive limit there refused without
    /// reaching the dependency counts too (its answer is the refusal, which is never retried,
    /// so it is the call's last).
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

/// Which attempt of its call a request is: a request extension the retry layer puts on
/// every attempt after the first (a retry or a hedge), for the layers between it and the
/// transport, which run once per attempt.
///
/// That is the hook to prepare an attempt: refresh a token that expired while the first
/// attempt waited, re-sign a request whose signature covers a timestamp, add a header only
/// retries carry. Put the code in a layer inside the retry layer (under a client preset:
/// between the preset and the transport); it gets `&mut Request` of every attempt, and
/// `Attempt::of` says which. tower's `Policy::retry` gets the request the same way, linkerd
/// sets headers on retries the same way; a layer keeps it out of the retry policy, so the
/// hook needs no type parameter of its own and sees hedges too.
///
/// ```
/// use backstop::client::retry::{Attempt, RetryConfig, backoff};
/// use http::{HeaderValue, Request, Response};
/// use std::{convert::Infallible, time::Duration};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), backstop::BoxError> {
/// let retry = RetryConfig::http().backoff(backoff::constant(Duration::from_millis(5))).build()?;
/// let client = ServiceBuilder::new()
///     .layer(retry)
///     // Runs once per attempt: a fresh token for each, marked with its attempt.
///     .map_request(|mut req: Request<_>| {
///         let attempt = Attempt::of(&req);
///         let token = format!("token-for-attempt-{}", attempt.number());
///         req.headers_mut().insert("authorization", HeaderValue::try_from(token).unwrap());
///         req
///     })
///     .service(service_fn(|req: Request<_>| async move {
///         // The first token is refused; the retry carries its own.
///         let status = match req.headers()["authorization"].to_str().unwrap() {
///             "token-for-attempt-1" => 503,
///             _ => 200,
///         };
///         let _: &backstop::client::retry::ReplayBody<String> = req.body();
///         Ok::<_, Infallible>(Response::builder().status(status).body(String::new()).unwrap())
///     }));
/// let response = client.oneshot(Request::new(String::new())).await?;
/// assert_eq!(response.status(), 200);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attempt {
    number: u32,
    hedge: bool,
}

impl Attempt {
    /// The first attempt of a call (what a request without the extension is).
    pub const FIRST: Self = Self {
        number: 1,
        hedge: false,
    };

    /// A retry (`hedge` false) or a hedge, the `number`th attempt of its call (from 1).
    pub const fn new(number: u32, hedge: bool) -> Self {
        Self { number, hedge }
    }

    /// Which attempt `req` is: its extension, or [`FIRST`](Self::FIRST) without one (the
    /// first attempt carries none: it costs the common case nothing).
    pub fn of<B>(req: &http::Request<B>) -> Self {
        req.extensions()
            .get::<Self>()
            .copied()
            .unwrap_or(Self::FIRST)
    }

    /// The attempt's number in its call, from 1 (hedges count).
    pub const fn number(&self) -> u32 {
        self.number
    }

    /// Whether it is a hedge (sent while an earlier attempt is still in flight), not a retry
    /// (sent after one failed). The first attempt is neither.
    pub const fn is_hedge(&self) -> bool {
        self.hedge
    }

    /// Whether it is the first attempt of its call.
    pub const fn is_first(&self) -> bool {
        self.number <= 1
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
