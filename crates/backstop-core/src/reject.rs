//! Local rejections: failures that backstop decides itself, and the responses that carry them.
//!
//! Server-side layers run inside `axum::Router::layer` and `tonic::transport::Server::layer`,
//! which want the layered service's error to stay the inner one (usually `Infallible`). So a
//! local failure is not an `Err` there: it is a response. A gRPC request (see
//! [`is_grpc`](crate::is_grpc)) gets a *trailers-only* response (HTTP 200 with `grpc-status` and
//! `grpc-message` in the headers and an empty body); any other request gets an HTTP status with
//! a short `text/plain` body.

use crate::{ResponseBody, grpc::Code};
use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header::CONTENT_TYPE};
use std::fmt;

/// A failure decided by backstop itself rather than by the dependency.
///
/// Every response built by [`Rejection::into_response`] carries the `Rejection` in its
/// extensions, so outer layers can tell a local answer from a remote one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rejection {
    /// The request's deadline passed (or too little of it was left to start).
    DeadlineExceeded,
    /// The `grpc-timeout` request header (or the configured milliseconds header) is not valid.
    MalformedTimeout,
}

impl Rejection {
    /// The gRPC status code that reports this rejection.
    pub fn grpc_code(self) -> Code {
        match self {
            Rejection::DeadlineExceeded => Code::DeadlineExceeded,
            Rejection::MalformedTimeout => Code::Internal,
        }
    }

    /// The HTTP status that reports this rejection to a non-gRPC client.
    pub fn http_status(self) -> StatusCode {
        match self {
            Rejection::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Rejection::MalformedTimeout => StatusCode::BAD_REQUEST,
        }
    }

    /// The short message sent with the rejection (`grpc-message`, or the text body).
    pub fn message(self) -> &'static str {
        match self {
            Rejection::DeadlineExceeded => "deadline exceeded",
            Rejection::MalformedTimeout => "malformed grpc-timeout",
        }
    }

    /// Builds the response that reports this rejection.
    ///
    /// With `grpc = true`: HTTP 200, `content-type: application/grpc`, `grpc-status` and
    /// `grpc-message` headers, empty body. Otherwise: [`http_status`](Self::http_status) with
    /// `content-type: text/plain; charset=utf-8` and the [`message`](Self::message) as body.
    pub fn into_response<B>(self, grpc: bool) -> Response<ResponseBody<B>> {
        let mut response = if grpc {
            let mut response = Response::new(ResponseBody::empty());
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert(crate::grpc::GRPC_STATUS, self.grpc_code().header_value());
            headers.insert(
                crate::grpc::GRPC_MESSAGE,
                HeaderValue::from_static(self.message()),
            );
            response
        } else {
            let mut response = Response::new(ResponseBody::full(Bytes::from_static(
                self.message().as_bytes(),
            )));
            *response.status_mut() = self.http_status();
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            response
        };
        response.extensions_mut().insert(self);
        response
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body_text(response: Response<ResponseBody<String>>) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn grpc_rejections_are_trailers_only() {
        for (rejection, code, message) in [
            (Rejection::DeadlineExceeded, "4", "deadline exceeded"),
            (Rejection::MalformedTimeout, "13", "malformed grpc-timeout"),
        ] {
            let response = rejection.into_response::<String>(true);
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers()["content-type"], "application/grpc");
            assert_eq!(response.headers()["grpc-status"], code);
            assert_eq!(response.headers()["grpc-message"], message);
            assert_eq!(response.extensions().get::<Rejection>(), Some(&rejection));
            assert_eq!(body_text(response).await, "");
        }
    }

    #[tokio::test]
    async fn http_rejections_have_a_status_and_a_short_text() {
        for (rejection, status, text) in [
            (Rejection::DeadlineExceeded, 504, "deadline exceeded"),
            (Rejection::MalformedTimeout, 400, "malformed grpc-timeout"),
        ] {
            let response = rejection.into_response::<String>(false);
            assert_eq!(response.status(), status);
            assert!(response.headers().get("grpc-status").is_none());
            assert_eq!(
                response.headers()["content-type"],
                "text/plain; charset=utf-8"
            );
            assert_eq!(response.extensions().get::<Rejection>(), Some(&rejection));
            assert_eq!(body_text(response).await, text);
        }
    }

    #[test]
    fn display_is_the_message() {
        assert_eq!(Rejection::DeadlineExceeded.to_string(), "deadline exceeded");
        assert_eq!(Rejection::MalformedTimeout.grpc_code(), Code::Internal);
    }
}
