use crate::client::breaker::permit::Permit;
use crate::client::breaker::shared::{Handles, Shared};
use crate::client::breaker::{Breaker, BreakerConfig, CallPermit, Mode, Snapshot};
use std::sync::Arc;
use tower_layer::Layer;

/// Fails calls fast while a dependency is down; see the [crate docs](crate).
///
/// Built by [`BreakerConfig::build`] (or [`BreakerLayer::new`]). Clones of the layer, and
/// every [`Breaker`] service it builds, share one breaker: one state, one window.
#[derive(Debug)]
pub struct BreakerLayer<C> {
    /// The breaker (keyed: the overflow breaker).
    pub(crate) shared: Arc<Shared<C>>,
    pub(crate) handles: Handles<C>,
    /// What it was built from, for [`named`](Self::named).
    config: Arc<BreakerConfig<C>>,
}

impl<C> Clone for BreakerLayer<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            handles: self.handles.clone(),
            config: self.config.clone(),
        }
    }
}

impl<C> BreakerLayer<C> {
    /// The layer for a configuration; same as [`BreakerConfig::build`].
    ///
    /// # Errors
    ///
    /// As [`BreakerConfig::build`].
    pub fn new(config: BreakerConfig<C>) -> Result<Self, crate::ConfigError>
    where
        C: Clone,
    {
        config.build()
    }

    pub(crate) fn from_shared(shared: Arc<Shared<C>>, config: Arc<BreakerConfig<C>>) -> Self {
        let handles = Handles::new(&shared);
        Self {
            shared,
            handles,
            config,
        }
    }

    /// This breaker's configuration for the dependency `name`: its events carry the name as
    /// `dependency`, its metrics as the `dependency` label, and a keyed layer's every key's
    /// breaker too. Naming is configuration, done before the layer serves: the layer returned
    /// is a new breaker built from the configuration (closed, an empty window, the
    /// configuration's mode), and the layers cloned before keep theirs.
    ///
    /// ```
    /// use backstop::client::breaker::BreakerConfig;
    ///
    /// let breaker = BreakerConfig::http().build()?.named("inventory");
    /// assert_eq!(breaker.name(), "inventory");
    /// # Ok::<(), backstop::ConfigError>(())
    /// ```
    #[must_use]
    pub fn named(&self, name: &str) -> Self
    where
        C: Clone,
    {
        let mut config = (*self.config).clone();
        config.name = crate::rt::DependencyName::new(name);
        config.build().expect("validated when the layer was built")
    }

    /// Whether the layer holds a breaker per key ([`BreakerConfig::per_key`]).
    pub fn is_keyed(&self) -> bool {
        self.shared.keyed.is_some()
    }

    /// What the layer keys its breakers by, and how many keys it holds at most, for a keyed
    /// layer ([`BreakerConfig::per_key`]): the client presets key their attempt layer's
    /// latency models the same way.
    pub fn key(&self) -> Option<(&crate::RouteKey, usize)> {
        self.shared
            .keyed
            .as_ref()
            .map(|k| (&k.key, k.table.max_keys()))
    }

    /// How long a keyed breaker's key goes without a call before it may make room (the
    /// client builder gives its attempt bound's table the same time).
    pub(crate) fn key_idle(&self) -> Option<std::time::Duration> {
        self.shared.keyed.as_ref().map(|k| k.table.idle())
    }

    /// For a keyed layer: how much longer a key must stay in a table keyed as this one,
    /// called or not (the open time its breaker has left). The client builder gives it to
    /// its attempt bound, so a route whose breaker is held open keeps its latency model.
    pub(crate) fn key_busy(&self) -> Option<crate::rt::table::KeyBusy>
    where
        C: Send + Sync + 'static,
    {
        self.shared.keyed.as_ref()?;
        let shared = self.shared.clone();
        Some(Arc::new(move |key: &str| {
            shared.keyed.as_ref().map_or(0, |keyed| keyed.busy_ms(key))
        }))
    }

    /// Every key's breaker now, by key (sorted), for a keyed layer; empty otherwise. The
    /// calls no key's breaker took are in [`snapshot`](Self::snapshot) (the overflow breaker).
    pub fn keys(&self) -> Vec<(String, Snapshot)> {
        self.keys_now()
            .into_iter()
            .map(|(key, layer)| (key, layer.snapshot()))
            .collect()
    }

    /// `key`'s breaker now, if a keyed layer has one for it.
    pub fn key_snapshot(&self, key: &str) -> Option<Snapshot> {
        self.shared.keyed.as_ref()?.entry_of(key).map(|entry| {
            let mut snapshot = entry.shared.snapshot();
            snapshot.shared_bytes += entry.handles.heap_bytes();
            snapshot
        })
    }

    fn keys_now(&self) -> Vec<(String, BreakerLayer<C>)> {
        let entries = self.shared.keyed.as_ref().map(|k| k.entries());
        entries
            .into_iter()
            .flatten()
            .map(|(key, entry)| {
                let layer = BreakerLayer {
                    shared: entry.shared.clone(),
                    handles: entry.handles.clone(),
                    config: self.config.clone(),
                };
                (key, layer)
            })
            .collect()
    }

    /// The dependency's name (`""` when unnamed).
    pub fn name(&self) -> &str {
        self.shared.name.get()
    }

    /// The breaker's state, rates and counts now.
    ///
    /// **A keyed layer** ([`is_keyed`](Self::is_keyed)) has one breaker per key, and this is
    /// not theirs: it is the *overflow* breaker's, which sees only the calls no key's breaker
    /// took (the key function gave none, or the table was full), so on a healthy keyed layer
    /// it reads all zeros and `Closed` whatever the routes do. Each route's breaker is in
    /// [`keys`](Self::keys) (or [`key_snapshot`](Self::key_snapshot)):
    ///
    /// ```
    /// use backstop::RouteKey;
    /// use backstop::client::breaker::{BreakerConfig, State};
    /// use http::{Request, Response};
    /// use std::convert::Infallible;
    /// use tower::{Layer, ServiceExt, service_fn};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let layer = BreakerConfig::http()
    ///     .per_key(RouteKey::Path)
    ///     .count_window(10)
    ///     .minimum_calls(5)
    ///     .build()
    ///     .unwrap();
    /// let dependency = layer.layer(service_fn(|req: Request<String>| async move {
    ///     let status = if req.uri().path() == "/report" { 503 } else { 200 };
    ///     Ok::<_, Infallible>(Response::builder().status(status).body(String::new()).unwrap())
    /// }));
    /// for path in ["/report", "/stock"].repeat(5) {
    ///     let req = Request::get(format!("http://dep{path}")).body(String::new()).unwrap();
    ///     let _ = dependency.clone().oneshot(req).await;
    /// }
    /// // The overflow breaker saw nothing: every call had a key.
    /// assert_eq!((layer.snapshot().state, layer.snapshot().calls), (State::Closed, 0));
    /// // The routes' breakers: `/report`'s is open, `/stock`'s closed.
    /// let states: Vec<(String, State)> =
    ///     layer.keys().into_iter().map(|(key, s)| (key, s.state)).collect();
    /// assert_eq!(states, [("/report".into(), State::Open), ("/stock".into(), State::Closed)]);
    /// # }
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = self.shared.snapshot();
        snapshot.shared_bytes += self.handles.heap_bytes();
        snapshot
    }

    /// Changes the [`Mode`] at run time (the state is kept); a keyed layer changes every
    /// key's, and the keys it adds later start in it (not in the config's): a
    /// [`Mode::ForcedOpen`] kill switch holds for routes first called after it was thrown.
    pub fn set_mode(&self, mode: Mode) {
        match &self.shared.keyed {
            Some(keyed) => keyed.set_mode(mode, &self.shared),
            None => self.shared.machine.set_mode(mode),
        }
    }

    /// Asks the breaker to let one call through, for code that calls its dependency without
    /// tower: a database or cache driver, a hand-written loop. The [`CallPermit`] records the
    /// call's outcome when you give it (or nothing if it is dropped, as a cancelled call);
    /// an open breaker answers [`BreakerOpen`](crate::BreakerOpen) at once, with the time
    /// left open when it is known. Same breaker, same rules, same window as the [`Breaker`]
    /// services this layer builds (a keyed layer's: the breaker of calls with no key).
    ///
    /// ```
    /// use backstop::client::breaker::{BreakerConfig, State};
    ///
    /// # fn main() -> Result<(), backstop::ConfigError> {
    /// let breaker = BreakerConfig::http().count_window(10).minimum_calls(5).build()?;
    /// // A dependency that fails every time.
    /// let query = || Err::<(), &str>("connection refused");
    /// let mut refused = 0;
    /// for _ in 0..8 {
    ///     let Ok(permit) = breaker.try_acquire() else {
    ///         refused += 1; // failed fast, the dependency was not called
    ///         continue;
    ///     };
    ///     match query() {
    ///         Ok(()) => permit.success(),
    ///         Err(_) => permit.failure(),
    ///     }
    /// }
    /// assert_eq!(breaker.snapshot().state, State::Open);
    /// assert_eq!(refused, 3);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`BreakerOpen`](crate::BreakerOpen) while the breaker refuses calls: open, half-open
    /// with every probe slot taken, in slow start, or forced open.
    pub fn try_acquire(&self) -> Result<CallPermit<C>, crate::BreakerOpen> {
        match Permit::admit(self.handles.current()) {
            Ok(permit) => Ok(CallPermit { permit }),
            Err(retry_after) => Err(crate::BreakerOpen::new(retry_after)),
        }
    }

    /// Closes the breaker and forgets its window, whatever its state, as an operator would;
    /// calls in flight from before decide nothing. Reported with [`Reason::Reset`](crate::client::breaker::Reason).
    /// A keyed layer resets every key.
    pub fn reset(&self) {
        match &self.shared.keyed {
            Some(keyed) => keyed.reset(&self.shared),
            None => self.shared.reset(),
        }
    }
}

impl<S, C> Layer<S> for BreakerLayer<C> {
    type Service = Breaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Breaker::from_handles(inner, self.handles.clone())
    }
}
