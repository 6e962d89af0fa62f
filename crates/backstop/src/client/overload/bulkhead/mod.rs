//! A bulkhead per dependency (clients): at most `max_concurrency` calls in flight, and a
//! wait for a permit bounded by the call's deadline.
//!
//! # Why
//!
//! A slow dependency holds every call made to it; with no bound, it takes the caller's
//! connections, memory and tasks with it, and the callers of the caller next (the cascade of
//! Google SRE's "Addressing Cascading Failures"). A bulkhead caps what one dependency can hold.
//! A plain concurrency limit (tower's `ConcurrencyLimit`) then makes the excess wait, with no
//! bound: a call that waits past its deadline still goes out, or times out at the deadline
//! having never been sent. This one refuses such a call **at once**, when it cannot get a
//! permit in time, so the caller answers (or falls back) while its own caller still listens.
//!
//! # Semantics
//!
//! For each call, in order:
//!
//! 1. **A free permit** (fewer than [`max_concurrency`](BulkheadLayer::new) calls in flight,
//!    nobody queued): the call goes on at once.
//! 2. **The wait's end**: the call's deadline less the time a call holds its permit (the
//!    mean, measured: an exponentially weighted average of every permit's hold, 0 until the
//!    first answer; an answer a layer further in made without calling the dependency, an open
//!    breaker's or a throttle's, is not a sample), and at most [`max_wait`](BulkheadLayerBuilder::max_wait) (default 1 s)
//!    from now. The deadline is the request's [`Deadline`](crate::deadline::Deadline) extension (an
//!    outer [`PropagateDeadlineLayer`](crate::deadline::PropagateDeadlineLayer), the retry layer, or
//!    your handler put it there), else [`current()`](crate::deadline::current); a call without one
//!    waits up to `max_wait`.
//! 3. **Fails fast**: when the wait's end has passed, or the measured wait of the calls
//!    already queued (the hold time × (queued + 1) / `max_concurrency`) ends after it, the call
//!    is refused at once, the knob `max_concurrency` named.
//! 4. **Queued** (FIFO) unless [`max_queue`](BulkheadLayerBuilder::max_queue) calls already
//!    wait (default `max_concurrency`): then refused at once, the knob `max_queue` named.
//! 5. **Waits** for a permit until the wait's end, then is refused, naming `max_concurrency`
//!    (a deadline bounded the wait) or `max_wait`.
//!
//! A permit is held from the grant until the response future ends: it is given back the
//! moment the response (headers; a streamed body is not held, as with tower's
//! `ConcurrencyLimit`) or the error arrives, or when the future is dropped before.
//! A call dropped while it waits leaves the queue (or, granted at that instant, gives its
//! permit on); nothing waits for a dropped call.
//!
//! **What the caller sees.** A refused call is never sent: an HTTP caller gets the error
//! [`BulkheadFull`](crate::BulkheadFull) (its [`knob`](crate::BulkheadFull::knob) says which rule), a gRPC caller
//! UNAVAILABLE "bulkhead full" with `grpc-retry-pushback-ms: -1` (trailers-only), carrying
//! [`Rejection::BulkheadFull`](crate::Rejection) in its extensions. Classifiers report
//! it as [`Outcome::Rejected`](crate::Outcome): never retried, never a breaker failure. One
//! exception: a wait that ran to the call's deadline itself (no hold time measured yet to end
//! it sooner) ends when the deadline has passed, and the answer is then the deadline's, as
//! every layer gives it: [`DeadlineExceeded`](crate::DeadlineExceeded) over HTTP, a
//! trailers-only DEADLINE_EXCEEDED over gRPC (counted under `max_concurrency` still).
//! Metric (feature `metrics`): `backstop.bulkhead.rejections`, labelled `dependency` and
//! `reason` (the knob).
//!
//! **Readiness.** `poll_ready` is the inner service's: the bulkhead never makes a caller
//! wait there. tower's `ConcurrencyLimit` takes its permit in `poll_ready` and holds it until
//! `call`; this layer takes it in `call`, because the wait is bounded by the *request's*
//! deadline, which `poll_ready` cannot see, and because a refusal must answer a request. A
//! call that must wait takes the inner service the caller just readied into its future (a
//! clone stays in its place, to be readied next) and calls it once granted; a call it
//! refuses gives the readied instance up for a fresh clone, so what `poll_ready` reserved
//! inside (a `ConcurrencyLimit` permit, a `Buffer` slot) is free at once. A ready instance is
//! called once or let go, as tower's contract asks. So `S: Clone`. A queued call keeps what
//! its caller reserved inside while it waits, for at most its wait (`max_wait`, its
//! deadline): once granted it is sent at once. Letting that go and readying again once
//! granted was tried and undone: a granted call then waited for the service inside with no
//! bound, holding the permit, and queued a second time behind later callers.
//!
//! # The adaptive limit
//!
//! Users seldom know how many calls their dependency can take at once, and it changes (a
//! replica dies, a cache goes cold). An adaptive bulkhead
//! ([`adaptive`](BulkheadLayerBuilder::adaptive)) learns its limit instead, under
//! `max_concurrency` as a cap; every rule above (the wait bounded by the deadline, the
//! refusals) holds with the learnt limit in place of `max_concurrency`, and a refusal because
//! of it names `adaptive_limit`. The client presets put one on every attempt, inside the
//! retry layer and the breaker (what the dependency holds is attempts, hedges included), cap
//! 10 000 ([`adaptive_limit`](crate::client::ClientBuilder::adaptive_limit)), keyed as their
//! breaker: with a breaker per route, each route learns a limit of its own
//! ([`key_limit`](BulkheadLayer::key_limit)), so one slow route's queue does not cut the
//! others' calls.
//!
//! **Buckets.** Answers are looked at in buckets of at least 100 ms and 10 answers (a bucket
//! waits up to 1 s for its 10; one that ends with fewer only grows the limit). Only the
//! dependency's answers measure its latency: a refusal made before the call was sent (an open
//! breaker's) is no answer; a failure says nothing of how long it takes to serve (a load
//! shedder refuses at once); a timeout (the attempt's bound or a deadline, here or at a
//! server further on: a 504, DEADLINE_EXCEEDED, the deadline's own answers) says the call
//! used all its time. What failed is the stack's classifier's to say, as for the breaker and
//! the retry layer (in a preset: [`ClientBuilder`](crate::client::ClientBuilder)'s one
//! classifier), so with a classifier of your own the limit and the breaker agree on what a
//! failure is. A bulkhead built alone has no classifier: a 5xx, or a gRPC status other than OK
//! in the head, is a failure, and a transport error is an answer.
//!
//! **The baseline** is the dependency's latency at rest: the least one-second mean latency of
//! the last 30 s, counting only the buckets in which no call waited for the limit, no cut was
//! on trial, and the mean was at most twice the baseline (a queue building before the limit
//! reacted is not rest). When 30 s pass with no such second, the last baseline is kept. It
//! rises only when a trial says so (below).
//!
//! **A cut** halves the limit (of the attempts in flight, or of the limit if lower; at least
//! 1) when a bucket shows both:
//! - the dependency queueing: a mean latency more than **twice the baseline**; and
//! - callers feeling it: the answers (timeouts counting as all of it) took on average more
//!   than **a twentieth of the time their call had left** when they were sent, over the
//!   answers whose call has a deadline (below that, even a doubled latency leaves every caller
//!   its room for a retry: 30 ms instead of 10 ms of a 1 s deadline is not worth refusing
//!   calls for; above it, the queue grows into the room the attempt bound and a retry need:
//!   in the lab's `overload`, a tenth let the queue reach 100 ms, the users' p99 493 ms, and
//!   the second after the fault 2 % over its bound with the queue it left).
//!
//! **The trial.** A cut is then on trial: it stands if the attempts sent after it answer (10
//! of them) at least a quarter faster than those sent in the 100 ms before it (which met the
//! queue as it was); otherwise it is **undone**, and their latency is the new baseline. No
//! other cut and no growth meanwhile; a trial not judged within 5 s is undone. While a cut is
//! on trial, as many calls may wait for a permit as the limit before the cut, each as long as
//! its deadline (less the hold time) and `max_wait` (1 s) allow, since the permits may come
//! back.
//!
//! **Growth.** Otherwise, after a bucket in which a call found the limit reached, it grows by
//! an eighth (at least 1); after a bucket in which none did, it doubles (what it learnt binds
//! nothing now: a later burst must find nothing held back until the dependency queues
//! again); never past the cap. It starts at the cap. A limit that ended no bucket for 5 s (no
//! answer came) has nothing to go on: the first call to find it reached puts it back to the
//! cap. Outside a trial, at most as many calls wait for a permit as the limit (a longer queue
//! would only be waited out to the deadline: better refused at once).
//!
//! **Refusals** of an adaptive bulkhead name `adaptive_limit`, whichever bound ended the wait,
//! but two: a full queue while the limit is at its cap names `max_queue`, and a wait that ran
//! to the deadline itself is the deadline's answer (as above).
//!
//! **Why this rule.** The latency's rise over its baseline says the dependency queues;
//! Vegas and Gradient2 stop there, and so take any slowdown for queueing: a dependency whose
//! latency steps from 50 ms to 800 ms without being any busier would be held to a sixteenth
//! of the calls it takes. The trial tells the two apart: only a queue this limit causes
//! drains when it cuts. It also keeps the client of a server whose own dependency is
//! overloaded from starving that server: it sees the server slow down, and halving its calls
//! would not speed it up. The deadline share keeps the limit out of rises no caller feels; a
//! halving (not the tenth AIMD usually takes) drains a queue within one trial. The storm lab's
//! `overload`, `overload-chain` and `capacity-drop` scenarios measure it against a fixed
//! bulkhead and tower-resilience's adaptive limiter; `drift` and `brownout` show what it
//! leaves alone.
//!
//! A call without a deadline adds to the latency and the baseline, not to the deadline share:
//! a stack whose calls carry no deadline is never cut (it has no deadline to protect).
//!
//! Gauges (feature `metrics`): `backstop.bulkhead.limit` and `backstop.bulkhead.in_flight`
//! (the attempts holding a permit, the one whose answer ended the bucket not counted), set
//! when a bucket ends: an idle stack keeps its last reading.
//!
//! # Example
//!
//! ```
//! use backstop::{BoxError, BulkheadFull};
//! use backstop::client::overload::bulkhead::BulkheadLayer;
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let bulkhead = BulkheadLayer::builder(1).max_wait(Duration::from_millis(50)).build().unwrap();
//! let slow = ServiceBuilder::new().layer(bulkhead).service(service_fn(|_req: http::Request<()>| async {
//!     tokio::time::sleep(Duration::from_secs(1)).await;
//!     Ok::<_, BoxError>(http::Response::new(()))
//! }));
//! // The first call holds the one permit for a second…
//! let first = tokio::spawn(slow.clone().oneshot(http::Request::new(())));
//! tokio::task::yield_now().await;
//! // …so the second, with no deadline, waits 50 ms and is refused.
//! let err = slow.oneshot(http::Request::new(())).await.unwrap_err();
//! assert_eq!(err.downcast_ref::<BulkheadFull>().unwrap().knob(), "max_wait");
//! assert!(first.await.unwrap().is_ok());
//! # }
//! ```
//!
//! # Ordering
//!
//! Outside the retry layer, inside the deadline: `PropagateDeadline → Bulkhead → Throttle →
//! Retry → Breaker → attempt timeout` (the [`bulkhead`] knob on its client
//! presets puts it there). The deadline layer gives it the deadline; a user call holds one
//! permit across its retries, so the limit is of calls, not attempts.
//!
//! # Concurrency rule
//!
//! Clones of a layer share one set of permits. A permit is a compare-and-swap on one word (held
//! and waiting counts) while the bulkhead is not full; a full bulkhead queues its waiters under
//! one lock, and a release hands its permit straight to the first waiter. Under any
//! interleaving at most `max_concurrency` permits are held, none is lost when a waiter is
//! dropped at the instant it is granted one, and no waiter sleeps while a permit is free
//! (loom models in `semaphore.rs`). The measured hold time is one relaxed word, an estimate:
//! racing updates may each miss the other's sample.
//!
//! [`bulkhead`]: https://docs.rs/backstop/latest/backstop/client/struct.ClientLayer.html#method.bulkhead

mod adaptive;
mod future;
mod judge;
mod keyed;
mod semaphore;
mod service;

pub(crate) use future::BulkheadFuture;
pub use service::Bulkhead;

use crate::ConfigError;
use crate::rt::DependencyName;
use semaphore::Semaphore;
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tower_layer::Layer;

/// Caps the calls in flight to a dependency; a call that cannot get a permit before its
/// deadline is refused at once (see the [module docs](self)).
///
/// Clones share one set of permits: build one per dependency.
#[derive(Debug, Clone)]
pub struct BulkheadLayer {
    shared: Arc<Shared>,
    /// A limit per key (the client builder's, keyed as its breaker).
    keyed: Option<Arc<keyed::Keyed>>,
}

/// Builds a [`BulkheadLayer`]: setters take any value, [`build`](Self::build) checks.
#[derive(Debug, Clone)]
pub struct BulkheadLayerBuilder {
    max_concurrency: u32,
    max_wait: Duration,
    max_queue: Option<u32>,
    adaptive: bool,
}

/// What a bulkhead's clones share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// `false`: the layer is off (every call passes, no permit is taken).
    pub(crate) on: bool,
    pub(crate) permits: Semaphore,
    pub(crate) max_concurrency: u32,
    pub(crate) max_wait: Duration,
    pub(crate) max_queue: u32,
    /// The mean time a permit is held, in µs (an exponentially weighted average, 1/8 per
    /// sample; 0 until the first).
    hold_us: AtomicU64,
    /// The learnt limit (an adaptive bulkhead's).
    pub(crate) adaptive: Option<adaptive::Adaptive>,
    pub(crate) name: DependencyName,
    /// A keyed layer's key's label and value (`route`, `/a`), which its gauges carry.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    route: Option<(&'static str, Box<str>)>,
    #[cfg(feature = "metrics")]
    metrics: std::sync::OnceLock<[metrics::Counter; 4]>,
    #[cfg(feature = "metrics")]
    gauges: std::sync::OnceLock<[metrics::Gauge; 2]>,
}

impl BulkheadLayer {
    /// A bulkhead of `max_concurrency` permits with the other defaults (`max_wait` 1 s,
    /// `max_queue` = `max_concurrency`).
    ///
    /// # Errors
    ///
    /// As [`BulkheadLayerBuilder::build`].
    pub fn new(max_concurrency: u32) -> Result<Self, ConfigError> {
        Self::builder(max_concurrency).build()
    }

    /// A builder for a bulkhead of `max_concurrency` permits.
    pub fn builder(max_concurrency: u32) -> BulkheadLayerBuilder {
        BulkheadLayerBuilder {
            max_concurrency,
            max_wait: Duration::from_secs(1),
            max_queue: None,
            adaptive: false,
        }
    }

    /// A bulkhead that limits nothing: every call passes to the inner service at once, no
    /// permit taken (its response body wrapped, so the stack's type stays the same). For a
    /// stack whose type has a bulkhead in it, such as the client presets, where it is
    /// the default.
    ///
    /// ```
    /// use backstop::client::overload::bulkhead::BulkheadLayer;
    ///
    /// assert!(!BulkheadLayer::off().is_on());
    /// assert!(BulkheadLayer::new(64).unwrap().is_on());
    /// ```
    pub fn off() -> Self {
        let mut layer = Self::new(1).expect("a valid limit");
        Arc::get_mut(&mut layer.shared).expect("not shared yet").on = false;
        layer
    }

    /// Whether the layer limits calls (`false` for [`off`](Self::off)).
    pub fn is_on(&self) -> bool {
        self.shared.on
    }

    /// The most calls in flight at once (1 for an [`off`](Self::off) layer, which takes
    /// no permit); an adaptive bulkhead's cap.
    pub fn max_concurrency(&self) -> u32 {
        self.shared.max_concurrency
    }

    /// What the limit is keyed by, if it is: the client presets key their adaptive limit as
    /// their breaker ([`BreakerConfig::per_key`](crate::client::breaker::BreakerConfig::per_key)).
    pub fn key(&self) -> Option<&crate::RouteKey> {
        self.keyed.as_ref().map(|k| &k.routes.key)
    }

    /// A keyed layer's limit for `key` now (`None`: the key has no limit of its own yet, or
    /// the layer is not keyed; its calls share [`limit`](Self::limit)).
    ///
    /// ```
    /// use backstop::RouteKey;
    ///
    /// let client = backstop::client::http()
    ///     .breaker(backstop::client::http_breaker().per_key(RouteKey::Path))
    ///     .build()?;
    /// let limit = client.adaptive_limit_layer();
    /// assert!(matches!(limit.key(), Some(RouteKey::Path)));
    /// assert_eq!(limit.key_limit("/search"), None, "no call yet");
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    pub fn key_limit(&self, key: &str) -> Option<u32> {
        let keyed = self.keyed.as_ref()?;
        keyed.get(key).map(|shared| shared.permits.limit())
    }

    /// A keyed layer's keys now, sorted (empty when it is not keyed).
    pub fn keys(&self) -> Vec<String> {
        self.keyed.as_ref().map(|k| k.keys()).unwrap_or_default()
    }

    /// This layer keyed by `key`, with at most `max_keys` limits, each going after `idle`
    /// without a call unless `busy` says its key must stay (the client builder's, from its
    /// breaker).
    pub(crate) fn per_key_idle(
        &self,
        key: crate::RouteKey,
        max_keys: usize,
        idle: Duration,
        busy: Option<crate::rt::table::KeyBusy>,
    ) -> Self {
        Self {
            shared: self.shared.clone(),
            keyed: Some(Arc::new(keyed::Keyed::new(
                crate::rt::table::Keyed::new(key, max_keys, idle, busy),
                self.shared.clone(),
            ))),
        }
    }

    /// The limit now: an adaptive bulkhead's learnt one (at most
    /// [`max_concurrency`](Self::max_concurrency)), a fixed one's `max_concurrency`.
    ///
    /// ```
    /// use backstop::client::overload::bulkhead::BulkheadLayer;
    ///
    /// let learnt = BulkheadLayer::builder(500).adaptive(true).build()?;
    /// assert!(learnt.is_adaptive());
    /// assert_eq!(learnt.limit(), 500, "it starts at the cap");
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    pub fn limit(&self) -> u32 {
        self.shared.permits.limit()
    }

    /// Whether the limit is learnt ([`adaptive`](BulkheadLayerBuilder::adaptive)).
    pub fn is_adaptive(&self) -> bool {
        self.shared.adaptive.is_some()
    }

    /// Calls holding a permit now.
    pub fn in_flight(&self) -> u32 {
        self.shared.permits.load().0
    }

    /// Calls waiting for a permit now.
    pub fn waiting(&self) -> u32 {
        self.shared.permits.load().1
    }

    /// The measured mean time a call holds its permit (zero until one answered).
    pub fn hold_time(&self) -> Duration {
        Duration::from_micros(self.shared.hold_us())
    }

    /// This bulkhead's configuration for the dependency `name`: its events and metrics
    /// carry the name as `dependency`. Naming is configuration, done before the layer
    /// serves: the layer returned has permits of its own (same limits), and the layers cloned
    /// before keep theirs.
    ///
    /// ```
    /// use backstop::client::overload::bulkhead::BulkheadLayer;
    ///
    /// let layer = BulkheadLayer::new(64)?.named("inventory");
    /// assert_eq!(layer.name(), "inventory");
    /// assert_eq!(layer.max_concurrency(), 64);
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn named(&self, name: &str) -> Self {
        let shared = &self.shared;
        Self {
            shared: Arc::new(Shared::new(
                shared.on,
                shared.max_concurrency,
                shared.max_wait,
                shared.max_queue,
                shared.adaptive.is_some(),
                DependencyName::new(name),
            )),
            keyed: None,
        }
    }

    /// The dependency's name (`""` when unnamed).
    pub fn name(&self) -> &str {
        self.shared.name.get()
    }
}

impl Shared {
    fn new(
        on: bool,
        max_concurrency: u32,
        max_wait: Duration,
        max_queue: u32,
        adaptive: bool,
        name: DependencyName,
    ) -> Self {
        Self {
            on,
            permits: Semaphore::new(max_concurrency),
            max_concurrency,
            max_wait,
            max_queue,
            hold_us: AtomicU64::new(0),
            adaptive: adaptive.then(|| adaptive::Adaptive::new(max_concurrency)),
            name,
            route: None,
            #[cfg(feature = "metrics")]
            metrics: std::sync::OnceLock::new(),
            #[cfg(feature = "metrics")]
            gauges: std::sync::OnceLock::new(),
        }
    }
}

impl BulkheadLayerBuilder {
    /// How long a call without a deadline waits for a permit, and the most any call waits
    /// (default 1 s; zero: never wait, refuse when full).
    #[must_use]
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// How many calls may wait for a permit at once (default `max_concurrency`; 0: none
    /// waits).
    #[must_use]
    pub fn max_queue(mut self, max_queue: u32) -> Self {
        self.max_queue = Some(max_queue);
        self
    }

    /// Learns the limit from the dependency's answers instead of holding it at
    /// `max_concurrency`, which becomes its cap (default `false`: a fixed limit). The limit
    /// starts at the cap, is halved when the dependency is queueing enough to threaten the
    /// calls' deadlines, and grows back by an eighth per 100 ms while calls find it reached.
    /// The whole rule, and why, is in the [module docs](self#the-adaptive-limit). The
    /// client presets put such a limit on every attempt ([`adaptive_limit`]).
    ///
    /// [`adaptive_limit`]: crate::client::ClientBuilder::adaptive_limit
    #[must_use]
    pub fn adaptive(mut self, adaptive: bool) -> Self {
        self.adaptive = adaptive;
        self
    }

    /// Checks the knobs and builds the layer.
    ///
    /// # Errors
    ///
    /// When `max_concurrency` is not in 1..=1 000 000, `max_wait` exceeds an hour, or
    /// `max_queue` exceeds 1 000 000.
    pub fn build(self) -> Result<BulkheadLayer, ConfigError> {
        const MAX: u32 = 1_000_000;
        if !(1..=MAX).contains(&self.max_concurrency) {
            return Err(ConfigError::new(
                "max_concurrency",
                format!("must be in 1..=1000000, got {}", self.max_concurrency),
            ));
        }
        if self.max_wait > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "max_wait",
                format!("must be at most 1 hour, got {:?}", self.max_wait),
            ));
        }
        let max_queue = self.max_queue.unwrap_or(self.max_concurrency);
        if max_queue > MAX {
            return Err(ConfigError::new(
                "max_queue",
                format!("must be at most 1000000, got {max_queue}"),
            ));
        }
        Ok(BulkheadLayer {
            shared: Arc::new(Shared::new(
                true,
                self.max_concurrency,
                self.max_wait,
                max_queue,
                self.adaptive,
                DependencyName::default(),
            )),
            keyed: None,
        })
    }
}

impl<S> Layer<S> for BulkheadLayer {
    type Service = Bulkhead<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Bulkhead::from_shared(inner, self.shared.clone(), self.keyed.clone(), ())
    }
}

impl BulkheadLayer {
    /// This layer around `inner` in a client stack: `classifier`, the stack's, says which
    /// answers failed (an adaptive limit learns from the others).
    pub(crate) fn layer_classified<S, C>(
        &self,
        inner: S,
        classifier: &Arc<C>,
    ) -> Bulkhead<S, Arc<C>> {
        Bulkhead::from_shared(
            inner,
            self.shared.clone(),
            self.keyed.clone(),
            classifier.clone(),
        )
    }
}

/// Why a call was refused: the knob that refused it, also the metric's `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No permit could come before the deadline.
    Deadline,
    /// The wait ran to the call's deadline itself (no hold time measured to end it sooner):
    /// counted as `Deadline`, answered as the deadline (the call's one answer on expiry).
    Expired,
    /// A call without a deadline (or a longer one) waited `max_wait`.
    MaxWait,
    /// `max_queue` calls already waited.
    MaxQueue,
    /// An adaptive bulkhead: no permit under the learnt limit could come before the deadline.
    Limit,
}

impl Refusal {
    pub(crate) fn knob(self) -> &'static str {
        match self {
            Refusal::Deadline | Refusal::Expired => "max_concurrency",
            Refusal::MaxWait => "max_wait",
            Refusal::MaxQueue => "max_queue",
            Refusal::Limit => "adaptive_limit",
        }
    }
}

impl Shared {
    /// A key's limit: made like this one (its knobs, a limit of its own), its gauges
    /// labelled `label = key`.
    fn for_key(&self, label: &'static str, key: &str) -> Self {
        let mut shared = Self::new(
            self.on,
            self.max_concurrency,
            self.max_wait,
            self.max_queue,
            self.adaptive.is_some(),
            self.name.clone(),
        );
        shared.route = Some((label, key.into()));
        shared
    }

    pub(crate) fn hold_us(&self) -> u64 {
        self.hold_us.load(Ordering::Relaxed)
    }

    /// A permit was held for `held`.
    pub(crate) fn record_hold(&self, held: Duration) {
        let sample = u64::try_from(held.as_micros()).unwrap_or(u64::MAX / 8);
        let old = self.hold_us.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample.max(1)
        } else {
            (old * 7 + sample) / 8
        }
        .max(1);
        // A racing sample may be lost: the mean is an estimate (module docs).
        self.hold_us.store(new, Ordering::Relaxed);
    }

    /// How long the calls already queued are expected to hold the permits before one is
    /// free for a new waiter.
    pub(crate) fn expected_wait(&self) -> Duration {
        let queued = u64::from(self.permits.load().1);
        let per_permit = self.hold_us() * (queued + 1) / u64::from(self.permits.limit().max(1));
        Duration::from_micros(per_permit)
    }

    /// An adaptive bulkhead's answer: a sample of its limit, and the gauges when a bucket
    /// ended.
    pub(crate) fn learn(
        &self,
        sent: tokio::time::Instant,
        now: tokio::time::Instant,
        budget: Option<Duration>,
        timed_out: bool,
    ) {
        let Some(adaptive) = &self.adaptive else {
            return;
        };
        let Some(rolled) = adaptive.answered(&self.permits, sent, now, budget, timed_out) else {
            return;
        };
        #[cfg(feature = "metrics")]
        {
            let [limit, in_flight] = self.gauges.get_or_init(|| {
                crate::rt::metrics::describe();
                let mut labels = vec![metrics::Label::new(
                    "dependency",
                    self.name.get().to_owned(),
                )];
                if let Some((label, key)) = &self.route {
                    labels.push(metrics::Label::new(*label, key.to_string()));
                }
                [
                    metrics::gauge!(crate::metrics::BULKHEAD_LIMIT, labels.clone()),
                    metrics::gauge!(crate::metrics::BULKHEAD_IN_FLIGHT, labels),
                ]
            });
            limit.set(f64::from(rolled.limit));
            in_flight.set(f64::from(rolled.in_flight));
        }
        #[cfg(not(feature = "metrics"))]
        let _ = rolled;
    }

    /// A call was refused.
    #[cold]
    #[inline(never)]
    pub(crate) fn refused(&self, why: Refusal) {
        tracing::debug!(
            dependency = self.name.get(),
            reason = why.knob(),
            "bulkhead full: not sent"
        );
        #[cfg(feature = "metrics")]
        {
            let counters = self.metrics.get_or_init(|| {
                crate::rt::metrics::describe();
                let counter = |reason: &'static str| {
                    metrics::counter!(
                        crate::metrics::BULKHEAD_REJECTIONS,
                        "dependency" => self.name.get().to_owned(),
                        "reason" => reason
                    )
                };
                [
                    counter(Refusal::Deadline.knob()),
                    counter(Refusal::MaxWait.knob()),
                    counter(Refusal::MaxQueue.knob()),
                    counter(Refusal::Limit.knob()),
                ]
            });
            let index = match why {
                Refusal::Deadline | Refusal::Expired => 0,
                Refusal::MaxWait => 1,
                Refusal::MaxQueue => 2,
                Refusal::Limit => 3,
            };
            counters[index].increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_names_its_knob() {
        let knob = |r: Result<BulkheadLayer, ConfigError>| r.unwrap_err().knob().to_owned();
        assert_eq!(knob(BulkheadLayer::new(0)), "max_concurrency");
        assert_eq!(knob(BulkheadLayer::new(2_000_000)), "max_concurrency");
        let b = || BulkheadLayer::builder(4);
        assert_eq!(
            knob(b().max_wait(Duration::from_secs(4000)).build()),
            "max_wait"
        );
        assert_eq!(knob(b().max_queue(2_000_000).build()), "max_queue");
        assert!(b().max_queue(0).max_wait(Duration::ZERO).build().is_ok());
    }

    #[test]
    fn the_hold_time_is_a_weighted_mean() {
        let layer = BulkheadLayer::new(4).unwrap();
        assert_eq!(layer.hold_time(), Duration::ZERO);
        layer.shared.record_hold(Duration::from_millis(80));
        assert_eq!(layer.hold_time(), Duration::from_millis(80));
        layer.shared.record_hold(Duration::from_millis(160));
        assert_eq!(layer.hold_time(), Duration::from_millis(90));
        // 90 ms × (0 queued + 1) / 4 permits.
        assert_eq!(layer.shared.expected_wait(), Duration::from_micros(22_500));
    }
}
