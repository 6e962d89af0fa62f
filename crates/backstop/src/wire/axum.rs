//! `IntoResponse` for backstop's local rejections (feature `axum`): documented in
//! [`crate::axum`], whose handlers use them.

use crate::{
    AttemptTimedOut, BreakerOpen, BulkheadFull, ClientThrottled, DeadlineExceeded, Rejection,
};
use axum_core::{body::Body, response::IntoResponse, response::Response};

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        Rejection::into_response::<String>(self, false).map(Body::new)
    }
}

impl IntoResponse for DeadlineExceeded {
    fn into_response(self) -> Response {
        IntoResponse::into_response(Rejection::DeadlineExceeded)
    }
}

impl IntoResponse for AttemptTimedOut {
    fn into_response(self) -> Response {
        IntoResponse::into_response(Rejection::AttemptTimedOut)
    }
}

impl IntoResponse for BreakerOpen {
    fn into_response(self) -> Response {
        IntoResponse::into_response(Rejection::BreakerOpen {
            retry_after: self.retry_after(),
        })
    }
}

impl IntoResponse for ClientThrottled {
    fn into_response(self) -> Response {
        IntoResponse::into_response(Rejection::ClientThrottled)
    }
}

impl IntoResponse for BulkheadFull {
    fn into_response(self) -> Response {
        IntoResponse::into_response(Rejection::BulkheadFull)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::time::Duration;

    async fn text(response: Response) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn each_rejection_answers_plain_http() {
        let cases: Vec<(Response, u16, &str)> = vec![
            (
                DeadlineExceeded::new().into_response(),
                504,
                "deadline exceeded",
            ),
            (
                AttemptTimedOut::new().into_response(),
                504,
                "attempt timed out",
            ),
            (
                BreakerOpen::new(None).into_response(),
                503,
                "circuit breaker open",
            ),
            (
                ClientThrottled::new().into_response(),
                503,
                "throttled by client",
            ),
            (
                BulkheadFull::new("max_queue").into_response(),
                503,
                "bulkhead full",
            ),
        ];
        for (response, status, body) in cases {
            assert_eq!(response.status(), status);
            assert!(response.headers().get("grpc-status").is_none());
            assert!(response.headers().get("grpc-retry-pushback-ms").is_none());
            assert!(response.headers().get("retry-after").is_none());
            assert!(response.extensions().get::<Rejection>().is_some());
            assert_eq!(text(response).await, body);
        }
    }

    #[tokio::test]
    async fn an_open_breaker_says_when_to_come_back_in_whole_seconds() {
        let response = BreakerOpen::new(Some(Duration::from_millis(200))).into_response();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "1");
        let response = BreakerOpen::new(Some(Duration::from_secs(30))).into_response();
        assert_eq!(response.headers()["retry-after"], "30");
    }
}
