//! The rules for errors: what a transport or a local failure means, by its source chain.

use super::{Outcome, Retryable};
use crate::{AttemptTimedOut, BreakerOpen, BulkheadFull, ClientThrottled, DeadlineExceeded};
use std::{error::Error, io};

/// Classifies an error by its source chain:
///
/// - our own [`DeadlineExceeded`], [`BreakerOpen`], [`ClientThrottled`] and [`BulkheadFull`]
///   → [`Outcome::Rejected`];
/// - [`AttemptTimedOut`] → failure, [`Retryable::IfIdempotent`];
/// - `std::io` `ConnectionRefused` / `AddrNotAvailable` (nothing was sent) → failure,
///   [`Retryable::Always`];
/// - with the `h2` feature: HTTP/2 `REFUSED_STREAM` (RFC 9113 §8.7: the server did not
///   process the stream) and a graceful `GOAWAY` (`NO_ERROR`: h2 fails only the streams above
///   the server's last processed id) → failure, [`Retryable::Always`];
/// - any other error (reset, broken pipe, end of stream, timeouts, unknown) → failure,
///   [`Retryable::IfIdempotent`]: the request may have been processed.
pub fn classify_error(err: &(dyn Error + 'static)) -> Outcome {
    let mut next = Some(err);
    while let Some(err) = next {
        if err.is::<DeadlineExceeded>()
            || err.is::<BreakerOpen>()
            || err.is::<ClientThrottled>()
            || err.is::<BulkheadFull>()
        {
            return Outcome::Rejected;
        }
        if err.is::<AttemptTimedOut>() {
            return Outcome::failure(Retryable::IfIdempotent);
        }
        #[cfg(feature = "h2")]
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            let not_processed = h2.reason() == Some(h2::Reason::REFUSED_STREAM)
                || (h2.is_go_away() && h2.is_remote() && h2.reason() == Some(h2::Reason::NO_ERROR));
            return Outcome::failure(if not_processed {
                Retryable::Always
            } else {
                Retryable::IfIdempotent
            });
        }
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return match io.kind() {
                io::ErrorKind::ConnectionRefused | io::ErrorKind::AddrNotAvailable => {
                    Outcome::failure(Retryable::Always)
                }
                _ => Outcome::failure(Retryable::IfIdempotent),
            };
        }
        next = err.source();
    }
    Outcome::failure(Retryable::IfIdempotent)
}
