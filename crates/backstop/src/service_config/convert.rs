//! What a parsed config becomes: retry policies, hedging and the throttle of backstop's own
//! layers.

use super::{HedgingPolicyConfig, RetryPolicyConfig, RetryThrottling};

impl RetryPolicyConfig {
    /// The policy's backoff: gRFC A6's formula as updated in 2024, retry `n` waits
    /// `min(initialBackoff × backoffMultiplier^(n−1), maxBackoff) × random(0.8, 1.2)`
    /// ([`exponential`](crate::client::retry::backoff::exponential) with this multiplier and
    /// [`Jitter::Proportional`](crate::client::retry::backoff::Jitter::Proportional)`(0.2)`), as
    /// grpc-js and grpcio wait (A6's 2017 text drew `random(0, …)`, which retried at once
    /// about as often as late). A `maxBackoff` below `initialBackoff` caps every envelope
    /// at `maxBackoff`; one above the retry layer's longest backoff
    /// ([`MAX_DELAY`](crate::client::retry::backoff::MAX_DELAY), 1 h) is clamped to it, a deliberate
    /// difference from A6, which sets no bound.
    pub(crate) fn backoff(&self) -> crate::client::retry::backoff::Exponential {
        let cap = self
            .max_backoff
            .min(crate::client::retry::backoff::MAX_DELAY);
        let base = self.initial_backoff.min(cap);
        crate::client::retry::backoff::exponential(base, cap)
            .multiplier(self.backoff_multiplier)
            .jitter(crate::client::retry::backoff::Jitter::Proportional(0.2))
    }

    /// The policy as a [`RetryConfig`](crate::client::retry::RetryConfig) for gRPC: its attempts, its
    /// backoff and its retryable codes (no budget: the channel's throttle is one per client,
    /// see [`RetryThrottling::throttle`]). It builds for every policy that passes
    /// [`ServiceConfig::validate`](super::ServiceConfig::validate).
    pub(crate) fn retry_policy(&self) -> crate::client::retry::RetryConfig<crate::GrpcClassifier> {
        crate::client::retry::RetryConfig::new(
            crate::GrpcClassifier::new()
                .retryable_codes(self.retryable_status_codes.iter().copied()),
        )
        .max_attempts(self.max_attempts)
        .backoff(self.backoff())
        .no_budget()
    }
}

impl HedgingPolicyConfig {
    /// The policy as [`Hedging`](crate::client::retry::hedge::Hedging): its attempts, a fixed delay
    /// (valid for every policy that passes [`ServiceConfig::validate`](super::ServiceConfig::validate)).
    pub(crate) fn hedging(&self) -> crate::client::retry::hedge::Hedging {
        crate::client::retry::hedge::Hedging::new(self.hedging_delay)
            .max_attempts(self.max_attempts)
    }
}

impl RetryThrottling {
    /// gRFC A6's throttle with these parameters.
    ///
    /// # Panics
    ///
    /// For parameters [`ServiceConfig::validate`](super::ServiceConfig::validate) refuses (never for a config read by
    /// [`ServiceConfig::from_json`](super::ServiceConfig::from_json), nor in
    /// [`ClientBuilder::service_config`](crate::ClientBuilder::service_config), which validates
    /// first).
    pub(crate) fn throttle(&self) -> crate::client::retry::GrpcThrottle {
        crate::client::retry::GrpcThrottle::builder()
            .max_tokens(self.max_tokens)
            .token_ratio(self.token_ratio)
            .build()
            .expect("validated when the config was read")
    }
}
