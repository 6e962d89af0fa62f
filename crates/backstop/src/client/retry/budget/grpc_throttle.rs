//! [`GrpcThrottle`]: gRPC A6's retry throttling, one atomic word; see the
//! [module docs](super).

use super::Budget;
use crate::ConfigError;
#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

/// gRPC's retry throttling (gRPC A6): a token bucket of `max_tokens`; every failed attempt
/// takes one token, every success adds `token_ratio`; retries are allowed only while more
/// than half the bucket is full.
///
/// ```
/// use backstop::client::retry::{Budget, GrpcThrottle};
///
/// let throttle = GrpcThrottle::builder().max_tokens(10).token_ratio(0.1).build().unwrap();
/// assert!(throttle.try_withdraw()); // starts full
/// for _ in 0..5 {
///     throttle.record_failure();
/// }
/// assert!(!throttle.try_withdraw()); // 5 of 10 left: not more than half
/// ```
#[derive(Debug)]
pub struct GrpcThrottle {
    /// Thousandths of a token.
    tokens: AtomicU64,
    max: u64,
    ratio: u64,
}

/// Builds a [`GrpcThrottle`]: the setters take any value, [`build`](Self::build) checks them.
#[derive(Debug, Clone, Copy)]
pub struct GrpcThrottleBuilder {
    max_tokens: u32,
    token_ratio: f64,
}

impl GrpcThrottle {
    /// A builder with A6's example values: 10 tokens, 0.1 per success.
    pub fn builder() -> GrpcThrottleBuilder {
        GrpcThrottleBuilder {
            max_tokens: 10,
            token_ratio: 0.1,
        }
    }
}

impl GrpcThrottleBuilder {
    /// The bucket's size, 1–1000 (A6's `maxTokens`; default 10). The bucket starts full.
    #[must_use]
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Tokens a success adds (A6's `tokenRatio`; default 0.1), kept to 3 decimals as A6
    /// specifies.
    #[must_use]
    pub fn token_ratio(mut self, token_ratio: f64) -> Self {
        self.token_ratio = token_ratio;
        self
    }

    /// Checks the knobs and builds the throttle.
    ///
    /// # Errors
    ///
    /// When `max_tokens` is 0 or over 1000, or `token_ratio` is not a number that rounds to at
    /// least 0.001 (A6 keeps 3 decimals; a smaller ratio would round to 0 and never refill the
    /// bucket; A6: "typically between 0 and 1", a larger one refills faster) and at most
    /// `max_tokens`.
    pub fn build(self) -> Result<GrpcThrottle, ConfigError> {
        let Self {
            max_tokens,
            token_ratio,
        } = self;
        if max_tokens == 0 || max_tokens > 1000 {
            return Err(ConfigError::new(
                "max_tokens",
                format!("must be in 1..=1000, got {max_tokens}"),
            ));
        }
        // Kept to 3 decimals (A6), in thousandths of a token: a ratio that rounds to 0 would
        // never refill the bucket (NaN fails the check too).
        let thousandths = (token_ratio * 1000.0).round();
        if !(thousandths >= 1.0 && token_ratio <= f64::from(max_tokens)) {
            return Err(ConfigError::new(
                "token_ratio",
                format!(
                    "must round to at least 0.001 (A6 keeps 3 decimals: a smaller ratio \
                     rounds to 0, and the bucket would never refill) and be at most \
                     max_tokens = {max_tokens}, got {token_ratio}"
                ),
            ));
        }
        let max = u64::from(max_tokens) * 1000;
        Ok(GrpcThrottle {
            tokens: AtomicU64::new(max),
            max,
            ratio: thousandths as u64,
        })
    }
}

impl Budget for GrpcThrottle {
    fn record_success(&self) {
        let _ = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some((t + self.ratio).min(self.max))
            });
    }

    fn record_failure(&self) {
        let _ = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_sub(1000))
            });
    }

    fn try_withdraw(&self) -> bool {
        self.tokens.load(Ordering::Acquire) > self.max / 2
    }

    fn balance(&self) -> f64 {
        self.tokens.load(Ordering::Acquire) as f64 / 1000.0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn configuration_is_validated() {
        for (max_tokens, token_ratio, knob) in [
            (0, 0.1, "max_tokens"),
            (1001, 0.1, "max_tokens"),
            (10, 0.0, "token_ratio"),
            (10, -0.5, "token_ratio"),
            (10, f64::NAN, "token_ratio"),
            (10, f64::INFINITY, "token_ratio"),
            (10, 10.5, "token_ratio"),
            // Rounds to 0 at A6's 3 decimals: the bucket would never refill.
            (10, 0.0004, "token_ratio"),
            (10, f64::MIN_POSITIVE, "token_ratio"),
        ] {
            let throttle = GrpcThrottle::builder()
                .max_tokens(max_tokens)
                .token_ratio(token_ratio)
                .build();
            assert_eq!(throttle.unwrap_err().knob(), knob);
        }
    }

    /// The least ratio kept, 0.001 (and 0.0005, which rounds to it), refills the bucket.
    #[test]
    fn the_least_ratio_refills() {
        for ratio in [0.0005, 0.001] {
            let t = GrpcThrottle::builder()
                .max_tokens(1)
                .token_ratio(ratio)
                .build()
                .unwrap();
            t.record_failure();
            assert_eq!(t.balance(), 0.0);
            t.record_success();
            assert_eq!(t.balance(), 0.001, "{ratio}");
        }
    }

    #[test]
    fn grpc_throttle_follows_a6() {
        let t = GrpcThrottle::builder()
            .max_tokens(4)
            .token_ratio(0.5)
            .build()
            .unwrap();
        assert_eq!(t.balance(), 4.0);
        t.record_failure();
        assert!(t.try_withdraw()); // 3 > 2
        t.record_failure();
        assert!(!t.try_withdraw()); // 2 is not > 2
        t.record_success();
        assert!(t.try_withdraw()); // 2.5 > 2
        for _ in 0..10 {
            t.record_success();
        }
        assert_eq!(t.balance(), 4.0);
        for _ in 0..10 {
            t.record_failure();
        }
        assert_eq!(t.balance(), 0.0);
    }
}
