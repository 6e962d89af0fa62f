//! What both deadline layers read from a request's headers, in one pass.

use crate::is_grpc;
use crate::wire::grpc::GRPC_TIMEOUT;
use crate::wire::grpc::is_grpc_content_type;
use crate::wire::grpc_timeout;
use http::{HeaderMap, HeaderValue, header::CONTENT_TYPE};
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
    /// One pass over a small header map (most requests carry a handful of headers): comparing
    /// names is cheaper than hashing them for two lookups. A large map is looked up.
    pub(crate) fn read(headers: &HeaderMap) -> Self {
        let mut head = Head::default();
        if headers.keys_len() > 8 {
            head.grpc = is_grpc(headers);
            for value in headers.get_all(GRPC_TIMEOUT) {
                head.timeout_value(value);
            }
            return head;
        }
        let mut typed = false;
        for (name, value) in headers {
            if *name == CONTENT_TYPE {
                if !typed {
                    head.grpc = is_grpc_content_type(value);
                    typed = true;
                }
            } else if *name == GRPC_TIMEOUT {
                head.timeout_value(value);
            }
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
