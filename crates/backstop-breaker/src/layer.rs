use crate::{
    Breaker, BreakerConfig, Mode, Snapshot,
    shared::{Handles, Shared},
    state::{Machine, Settings},
    window::Window,
};
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
}

impl<C> Clone for BreakerLayer<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            handles: self.handles.clone(),
        }
    }
}

impl<C> BreakerLayer<C> {
    /// The layer for a configuration; same as [`BreakerConfig::build`].
    ///
    /// # Errors
    ///
    /// As [`BreakerConfig::build`].
    pub fn new(config: BreakerConfig<C>) -> Result<Self, backstop_core::ConfigError>
    where
        C: Clone,
    {
        config.build()
    }

    pub(crate) fn from_parts(
        config: BreakerConfig<C>,
        settings: Settings,
        window: Window,
        keyed: Option<Arc<crate::keyed::Keyed<C>>>,
    ) -> Self {
        let slow = config.slow_duration();
        let machine = Machine::new(settings, window, config.mode);
        let shared = Arc::new(Shared::new(
            machine,
            config.classifier,
            slow,
            config.count_throttled,
            config.hook,
            keyed,
        ));
        let handles = Handles::new(&shared);
        Self { shared, handles }
    }

    /// Names the dependency: every event this breaker emits carries it as `dependency`
    /// (unnamed: `""`).
    ///
    /// # Errors
    ///
    /// When the breaker already has another name.
    pub fn set_name(&self, name: &str) -> Result<(), backstop_core::ConfigError> {
        self.shared.name.set(name)?;
        for (_, layer) in self.keys_now() {
            layer.shared.name.set(name)?;
        }
        Ok(())
    }

    /// Whether the layer holds a breaker per key ([`BreakerConfig::per_key`]).
    pub fn is_keyed(&self) -> bool {
        self.shared.keyed.is_some()
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
        self.shared
            .keyed
            .as_ref()?
            .layer(key)
            .map(|layer| layer.snapshot())
    }

    fn keys_now(&self) -> Vec<(String, BreakerLayer<C>)> {
        self.shared
            .keyed
            .as_ref()
            .map_or_else(Vec::new, |k| k.layers())
    }

    /// The dependency's name (`""` when unnamed).
    pub fn name(&self) -> &str {
        self.shared.name.get()
    }

    /// The breaker's state, rates and counts now.
    pub fn snapshot(&self) -> Snapshot {
        self.shared.snapshot()
    }

    /// Changes the [`Mode`] at run time (the state is kept); a keyed layer changes every
    /// key's, and the keys added later start in it.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.machine.set_mode(mode);
        for (_, layer) in self.keys_now() {
            layer.shared.machine.set_mode(mode);
        }
    }

    /// Closes the breaker and forgets its window, whatever its state, as an operator would;
    /// calls in flight from before decide nothing. Reported with [`Reason::Reset`](crate::Reason).
    /// A keyed layer resets every key.
    pub fn reset(&self) {
        let transition = self.shared.machine.reset(|| self.shared.now_us());
        self.shared.emit(transition);
        for (_, layer) in self.keys_now() {
            layer.reset();
        }
    }
}

impl<S, C> Layer<S> for BreakerLayer<C> {
    type Service = Breaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Breaker::from_handles(inner, self.handles.clone())
    }
}
