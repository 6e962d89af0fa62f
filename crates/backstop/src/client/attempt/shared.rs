//! What every clone of one attempt layer shares: the latency model and the cached bound.

use super::AttemptBound;
use crate::latency::LatencyModel;
use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};
use tokio::time::Instant;

/// `d` rounded down to three significant digits of microseconds.
pub(super) fn three_digits(d: Duration) -> Duration {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let mut scale = 1;
    while us / scale >= 1_000 {
        scale *= 10;
    }
    Duration::from_micros(us / scale * scale)
}

/// How often a cached adaptive bound is read again from the model.
pub(super) const REFRESH: Duration = Duration::from_millis(100);

/// What a retry after an attempt would need, for the deadline's share: `Final` when none
/// follows (the attempt takes all that is left), else the least time a retry waits before it
/// is sent (the median call it needs is the model's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Room {
    /// No retry follows this attempt ([`FinalAttempt`](crate::FinalAttempt)).
    Final,
    /// A retry may follow, after at least this wait.
    Retry(Duration),
}

impl Room {
    /// The room of `req`'s attempt, for a retry layer whose retries wait at least `wait`.
    pub(super) fn of<B>(req: &http::Request<B>, wait: Duration) -> Self {
        if crate::FinalAttempt::is_on(req) {
            Room::Final
        } else {
            Room::Retry(wait)
        }
    }
}

/// What every clone of one layer shares: the model and the cached bound.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) model: LatencyModel,
    pub(super) origin: Instant,
    pub(super) bound: AttemptBound,
    /// `refresh at (ms since origin) << 32 | bound (µs)`; zero: never computed.
    pub(super) cached: AtomicU64,
    /// The model's p50 (the upper edge of its bucket, as the presets' retry reserve reads
    /// it) in µs plus one, refreshed with `cached`; zero: not trusted.
    pub(super) median: AtomicU64,
    /// The dependency's name, one for the layer and every key's model.
    pub(super) name: crate::rt::DependencyName,
    /// `backstop.client.attempt.duration`, registered on the first attempt that waited.
    #[cfg(feature = "metrics")]
    pub(super) duration: std::sync::OnceLock<metrics::Histogram>,
    /// A key's model: the label and value its series carry the key under (`route`, as the
    /// breaker's of the same key; `authority` for a host key).
    #[cfg(feature = "metrics")]
    pub(super) key: Option<(&'static str, Box<str>)>,
}

impl Shared {
    /// A model and cached bound like this one (same bound and window), empty, with its own
    /// clock and the name `name`: what [`named`](super::AttemptTimeoutLayer::named) starts
    /// from.
    pub(super) fn renamed(&self, name: crate::rt::DependencyName) -> Shared {
        Shared {
            model: self.model.fresh(),
            origin: Instant::now(),
            bound: self.bound,
            cached: AtomicU64::new(0),
            median: AtomicU64::new(0),
            name,
            #[cfg(feature = "metrics")]
            duration: std::sync::OnceLock::new(),
            #[cfg(feature = "metrics")]
            key: None,
        }
    }

    /// A key's model and cached bound, built from the layer's (same bound, window, origin
    /// and name), empty; its series carry `key` under `label`.
    pub(super) fn for_key(&self, label: &'static str, key: &str) -> Shared {
        #[cfg(not(feature = "metrics"))]
        let _ = (label, key);
        Shared {
            model: self.model.fresh(),
            origin: self.origin,
            bound: self.bound,
            cached: AtomicU64::new(0),
            median: AtomicU64::new(0),
            name: self.name.clone(),
            #[cfg(feature = "metrics")]
            duration: std::sync::OnceLock::new(),
            #[cfg(feature = "metrics")]
            key: Some((label, key.into())),
        }
    }

    /// An attempt that waited ended after `took` (feature `metrics`; otherwise nothing): in
    /// `routed`, a routed retry layer's series, when this model has no key of its own (a key
    /// is the model's, and labels its series already), else in this model's series.
    #[inline(always)]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn meter_duration(&self, took: Duration, routed: &Routed) {
        #[cfg(feature = "metrics")]
        if self.key.is_none()
            && let Some(routed) = routed
        {
            routed.0.record(took.as_secs_f64());
            return;
        }
        #[cfg(feature = "metrics")]
        self.duration
            .get_or_init(|| {
                use crate::metrics as names;
                crate::rt::metrics::describe();
                let mut labels = vec![metrics::Label::new(
                    "dependency",
                    self.name.get().to_owned(),
                )];
                if let Some((label, key)) = &self.key {
                    labels.push(metrics::Label::new(*label, key.to_string()));
                }
                metrics::histogram!(names::CLIENT_ATTEMPT_DURATION, labels)
            })
            .record(took.as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = took;
    }

    pub(super) fn now_us(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.origin).as_micros()).unwrap_or(u64::MAX)
    }

    /// `bound`, at most the adaptive bound's share of what is left of the request's deadline
    /// at `now` (a fixed bound is taken as given). A share is rounded down to three
    /// significant digits (at most 1 % shorter): calls a few microseconds apart then get the
    /// same bound, so its header value is reused rather than encoded and allocated again (and
    /// HPACK can index it).
    pub(super) fn capped(
        &self,
        bound: Duration,
        now: Instant,
        deadline: Option<Instant>,
        room: Room,
    ) -> Duration {
        if let AttemptBound::Adaptive(a) = self.bound
            && let Some(deadline) = deadline
        {
            let left = deadline.saturating_duration_since(now);
            // Integer arithmetic: Duration::mul_f64 goes through floating-point seconds.
            let left_us = u64::try_from(left.as_micros()).unwrap_or(u64::MAX);
            // A final attempt may take all that is left: its share was room for a retry.
            let share_ppm = match room {
                Room::Final => 1_000_000,
                Room::Retry(_) => (a.deadline_share * 1e6) as u64,
            };
            let share = Duration::from_micros(
                u64::try_from(u128::from(left_us) * u128::from(share_ppm) / 1_000_000)
                    .unwrap_or(u64::MAX),
            );
            if share < bound {
                // The share is room for a retry. When what it leaves is less than a retry
                // needs (its least wait, then the measured median call), no retry could
                // finish there (the presets' reserve refuses it): this attempt is the last
                // that can succeed, and takes it all. A model not trusted (cold, or emptied
                // by an idle spell) has no median, and the retry layer's reserve then asks
                // for none: the least wait alone decides, as it decides the retry.
                let rest = left.saturating_sub(share);
                let median = self.median.load(Ordering::Relaxed).saturating_sub(1);
                if let Room::Retry(wait) = room
                    && rest < Duration::from_micros(median).saturating_add(wait)
                {
                    return if left < bound {
                        three_digits(left)
                    } else {
                        bound
                    };
                }
                return three_digits(share);
            }
        }
        bound
    }

    pub(super) fn capped_by_deadline(&self) -> bool {
        matches!(self.bound, AttemptBound::Adaptive(_))
    }

    /// The bound of an attempt that starts at `now` under `deadline` (the request's): the
    /// fixed one, or the adaptive one from the model, capped by the deadline's share.
    pub(super) fn bound_at(
        &self,
        now: Instant,
        deadline: Option<Instant>,
        room: Room,
    ) -> Option<Duration> {
        self.model_bound(now)
            .map(|bound| self.capped(bound, now, deadline, room))
    }

    /// The fixed bound, or the adaptive one from the model (cached for 100 ms), uncapped.
    pub(super) fn model_bound(&self, now: Instant) -> Option<Duration> {
        let adaptive = match self.bound {
            AttemptBound::None => return None,
            AttemptBound::Fixed(d) => return Some(d),
            AttemptBound::Adaptive(a) => a,
        };
        let now_us = self.now_us(now);
        let now_ms = now_us / 1_000;
        let word = self.cached.load(Ordering::Acquire);
        if word != 0 && now_ms < word >> 32 {
            return Some(Duration::from_micros(word & u64::from(u32::MAX)));
        }
        let measured = self.model.quantile_aged(adaptive.quantile, now_us);
        let bound = adaptive.bound(measured);
        let median = self.model.quantile_ceiling(0.5, now_us).map_or(0, |d| {
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX - 1) + 1
        });
        self.median.store(median, Ordering::Relaxed);
        let us = u64::try_from(bound.as_micros())
            .unwrap_or(u64::MAX)
            .min(u64::from(u32::MAX));
        let until = (now_ms + REFRESH.as_millis() as u64).min(u64::from(u32::MAX));
        self.cached.store((until << 32) | us, Ordering::Release);
        Some(Duration::from_micros(us))
    }
}

/// A routed retry layer's attempt-duration handle, taken off the request (feature `metrics`).
#[cfg(feature = "metrics")]
pub(super) type Routed = Option<crate::rt::metrics::AttemptDuration>;
/// Without the feature, nothing.
#[cfg(not(feature = "metrics"))]
#[derive(Debug, Default)]
pub(super) struct Routed(());
