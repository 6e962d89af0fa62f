//! What both deadline layers read from a request's headers.

use crate::is_grpc;
use crate::wire::grpc::GRPC_TIMEOUT;
use crate::wire::grpc_timeout;
use http::{HeaderMap, HeaderValue};
use std::time::Duration;

/// The shorter of two optional durations.
pub(crate) fn min_opt(a: Option<Duration>, b: Duration) -> Duration {
    a.map_or(b, |a| a.min(b))
}

/// What the deadline layers read from a request's headers.
#[derive(Debug, Default)]
pub(crate) struct Head {
    /// A gRPC request (its first `content-type`).
    pub(crate) grpc: bool,
    /// The shortest valid `grpc-timeout`.
    pub(crate) timeout: Option<Duration>,
    /// A `grpc-timeout` value did not parse.
    pub(crate) malformed: bool,
}

impl Head {
    /// The request's `content-type` and `grpc-timeout` values.
    pub(crate) fn read(headers: &HeaderMap) -> Self {
        let mut head = Head {
            grpc: is_grpc(headers),
            ..Head::default()
        };
        for value in headers.get_all(GRPC_TIMEOUT) {
            head.timeout_value(value);
        }
        head
    }

    fn timeout_value(&mut self, value: &HeaderValue) {
        match grpc_timeout::decode_header(value) {
            Ok(t) => self.timeout = Some(min_opt(self.timeout, t)),
            Err(_) => self.malformed = true,
        }
    }
}
