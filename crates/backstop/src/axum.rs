//! Errors of outbound calls as axum responses (feature `axum`): `?` in a handler.
//!
//! A handler that calls a dependency through a client preset gets a [`BoxError`] when the
//! call fails. Return `Result<_, CallError>` and `?` turns that error into the answer a
//! gateway owes its caller:
//!
//! | the call's error | the handler's response |
//! |---|---|
//! | its deadline passed ([`DeadlineExceeded`](crate::DeadlineExceeded)) or its last attempt timed out | 504 |
//! | an open breaker ([`BreakerOpen`](crate::BreakerOpen)) | 503, `Retry-After` when the breaker knows when it lets calls through |
//! | the client's throttle or bulkhead refused it | 503 |
//! | anything else (the transport's error, the dependency's failure) | 502 "dependency failed" |
//!
//! The body is a short `text/plain` message and never the error's text (which may name
//! internal hosts); log [`CallError::error`] for that. With the `axum` feature the local
//! errors themselves ([`BreakerOpen`](crate::BreakerOpen) and the others) are
//! `IntoResponse` too (below).
//!
//! ```
//! use axum::{routing::get, Router};
//! use backstop::axum::CallError;
//! use http::{Request, Response};
//! use tower::{service_fn, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), backstop::BoxError> {
//! // A dependency whose breaker is open: every call is refused locally.
//! let inventory = service_fn(|_req: Request<String>| async {
//!     Err::<Response<String>, backstop::BoxError>(Box::new(backstop::BreakerOpen::new(Some(
//!         std::time::Duration::from_secs(5),
//!     ))))
//! });
//!
//! let app = Router::new().route(
//!     "/stock",
//!     get(move || async move {
//!         let response = inventory.oneshot(Request::new(String::new())).await?;
//!         Ok::<_, CallError>(response.into_body())
//!     }),
//! );
//! let response = app.oneshot(Request::get("/stock").body(axum::body::Body::empty())?).await?;
//! assert_eq!(response.status(), 503);
//! assert_eq!(response.headers()["retry-after"], "5");
//! # Ok(())
//! # }
//! ```
//!
//! # The local errors as responses
//!
//! `IntoResponse` for backstop's local rejections (feature `axum`), so an axum handler can
//! return them, or use `?` on a `Result` holding one, and answer as backstop's own layers do.
//!
//! A handler answers plain HTTP: each rejection becomes [`Rejection::http_status`] with its
//! short text body, and [`BreakerOpen`](crate::BreakerOpen) adds `Retry-After` (seconds, rounded up) when it knows
//! when the breaker lets calls through again — the response of
//! [`Rejection::into_response`] with `grpc = false`, its [`Rejection`] in the extensions.
//!
//! | error | status |
//! |-------|--------|
//! | [`DeadlineExceeded`](crate::DeadlineExceeded) | 504 |
//! | [`AttemptTimedOut`](crate::AttemptTimedOut) | 504 |
//! | [`BreakerOpen`](crate::BreakerOpen) | 503, `Retry-After` when known |
//! | [`ClientThrottled`](crate::ClientThrottled) | 503 |
//! | [`BulkheadFull`](crate::BulkheadFull) | 503 |
//!
//! ```
//! use axum_core::response::IntoResponse;
//! use backstop::BreakerOpen;
//! use std::time::Duration;
//!
//! async fn handler() -> Result<&'static str, BreakerOpen> {
//!     Err(BreakerOpen::new(Some(Duration::from_millis(1500))))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let response = handler().await.into_response();
//! assert_eq!(response.status(), 503);
//! assert_eq!(response.headers()["retry-after"], "2");
//! # }
//! ```
//!
//! An error of the whole stack (a `BoxError` that may or may not hold one of these) goes
//! through [`Rejection::of`]; [`CallError`] wraps that for `?`.

use crate::{BoxError, Rejection};
use axum_core::{
    body::Body,
    response::{IntoResponse, Response},
};
use http::{HeaderValue, StatusCode, header::CONTENT_TYPE};

/// The error of a call a handler made, as the response its own caller gets (the rules: the
/// [module docs](self)).
///
/// Made from any error by `?` (`From<E: Into<BoxError>>`); for that blanket conversion it is
/// not itself a [`std::error::Error`] (as `anyhow::Error` is not).
pub struct CallError(BoxError);

impl CallError {
    /// The call's error, for logging.
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// The call's error, taken back.
    pub fn into_error(self) -> BoxError {
        self.0
    }

    /// The local rejection the error stands for, if backstop refused the call itself
    /// ([`Rejection::of`]); `None` when the dependency or the transport failed.
    pub fn rejection(&self) -> Option<Rejection> {
        Rejection::of(&*self.0)
    }
}

impl<E: Into<BoxError>> From<E> for CallError {
    fn from(err: E) -> Self {
        Self(err.into())
    }
}

impl std::fmt::Debug for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CallError").field(&self.0).finish()
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl IntoResponse for CallError {
    fn into_response(self) -> Response {
        if let Some(rejection) = self.rejection() {
            return IntoResponse::into_response(rejection);
        }
        let mut response = Response::new(Body::from("dependency failed"));
        *response.status_mut() = StatusCode::BAD_GATEWAY;
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttemptTimedOut, BulkheadFull, ClientThrottled, DeadlineExceeded};
    use std::{error::Error, fmt, time::Duration};

    /// An error that holds another as its source, as the retry layer's `RetryError` does.
    #[derive(Debug)]
    struct Wrapped(BoxError);
    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("gave up")
        }
    }
    impl Error for Wrapped {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&*self.0)
        }
    }

    fn status_of(err: BoxError) -> (u16, Option<String>) {
        let response = CallError::from(err).into_response();
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        (response.status().as_u16(), retry_after)
    }

    #[test]
    fn a_local_rejection_anywhere_in_the_chain_answers_for_itself() {
        let open = || Box::new(crate::BreakerOpen::new(Some(Duration::from_secs(3))));
        assert_eq!(status_of(open()), (503, Some("3".into())));
        assert_eq!(
            status_of(Box::new(Wrapped(open()))),
            (503, Some("3".into()))
        );
        assert_eq!(
            status_of(Box::new(Wrapped(Box::new(DeadlineExceeded::new())))),
            (504, None)
        );
        assert_eq!(status_of(Box::new(AttemptTimedOut::new())), (504, None));
        assert_eq!(status_of(Box::new(ClientThrottled::new())), (503, None));
        assert_eq!(
            status_of(Box::new(BulkheadFull::new("max_wait"))),
            (503, None)
        );
    }

    #[tokio::test]
    async fn any_other_failure_is_a_bad_gateway_that_names_nothing_internal() {
        use http_body_util::BodyExt;
        let err: BoxError = "connect to 10.0.0.7:8080 refused".into();
        let call = CallError::from(err);
        assert_eq!(call.rejection(), None);
        assert_eq!(call.to_string(), "connect to 10.0.0.7:8080 refused");
        let response = call.into_response();
        assert_eq!(response.status(), 502);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"dependency failed");
    }
}
