//! A breaker per key: a route or host that is down fails fast alone, the table stays within
//! `max_keys` (idle keys make room, the rest share the overflow breaker), and every key's
//! breaker reports under its key.

use backstop::RouteKey;
use backstop::client::breaker::{BreakerConfig, BreakerLayer, Mode, State};
use backstop::{BreakerOpen, HttpClassifier};
use http::{Request, Response};
use std::{borrow::Cow, convert::Infallible, time::Duration};
use tower::{Layer, Service, ServiceExt, service_fn};

/// 503 for every request whose URI contains `down`, 200 otherwise.
fn dependency()
-> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future = impl Send>
+ Clone {
    service_fn(|req: Request<String>| async move {
        let status = if req.uri().to_string().contains("down") {
            503
        } else {
            200
        };
        Ok::<_, Infallible>(
            Response::builder()
                .status(status)
                .body(String::new())
                .unwrap(),
        )
    })
}

/// Opens after 3 failures in a row, no jitter.
fn config() -> BreakerConfig<HttpClassifier> {
    BreakerConfig::http()
        .consecutive_failures(3)
        .jitter(false)
        .seed(7)
}

/// Sends a GET to `uri`: the status, or `None` when the breaker refused it.
async fn send<S, B>(service: &mut S, uri: &str) -> Option<u16>
where
    S: Service<Request<String>, Response = Response<B>, Error = backstop::BoxError>,
{
    let req = Request::get(uri).body(String::new()).unwrap();
    match service.ready().await.unwrap().call(req).await {
        Ok(response) => Some(response.status().as_u16()),
        Err(e) if e.is::<BreakerOpen>() => None,
        Err(e) => panic!("{e}"),
    }
}

/// Fails `uri` 3 times in a row: its breaker (or the one breaker) opens.
async fn open<S, B>(service: &mut S, uri: &str)
where
    S: Service<Request<String>, Response = Response<B>, Error = backstop::BoxError>,
{
    for _ in 0..3 {
        send(service, uri).await;
    }
}

/// How long a key goes without a call before it can make room (fixed, 5 min: the
/// `client::breaker` docs, "A breaker per key").
const IDLE: Duration = Duration::from_secs(300);

/// A table of one key by path.
fn one_key() -> BreakerConfig<HttpClassifier> {
    config().per_key(RouteKey::Path).max_keys(1)
}

/// The keys the layer holds, in order.
fn key_names(layer: &BreakerLayer<HttpClassifier>) -> Vec<String> {
    layer.keys().into_iter().map(|(k, _)| k).collect()
}

#[tokio::test(start_paused = true)]
async fn a_host_that_is_down_fails_fast_alone() {
    let layer = config().per_key(RouteKey::Authority).build().unwrap();
    let mut service = layer.layer(dependency());
    for _ in 0..3 {
        assert_eq!(
            send(&mut service, "http://down.example:80/item").await,
            Some(503)
        );
    }
    assert_eq!(
        send(&mut service, "http://down.example:80/item").await,
        None,
        "open"
    );
    for _ in 0..10 {
        assert_eq!(
            send(&mut service, "http://up.example:80/item").await,
            Some(200)
        );
    }
    let keys = layer.keys();
    let states: Vec<(&str, State)> = keys.iter().map(|(k, s)| (k.as_str(), s.state)).collect();
    assert_eq!(
        states,
        [
            ("down.example:80", State::Open),
            ("up.example:80", State::Closed)
        ]
    );
    assert_eq!(
        layer.snapshot().calls,
        0,
        "no call went to the overflow breaker"
    );
}

#[tokio::test(start_paused = true)]
async fn a_single_breaker_fails_every_route_with_the_bad_one() {
    // The behaviour keyed breakers exist to avoid, for contrast.
    let mut service = config().build().unwrap().layer(dependency());
    open(&mut service, "http://svc/item/down").await;
    assert_eq!(send(&mut service, "http://svc/item/ok").await, None);
}

#[tokio::test(start_paused = true)]
async fn a_route_key_groups_paths_and_no_key_goes_to_the_overflow_breaker() {
    // `/item/{id}/…` by its shape; health checks have no key.
    let route = RouteKey::custom(|_, uri| {
        let path = uri.path();
        if path == "/health" {
            return None;
        }
        let shape: Vec<&str> = path
            .split('/')
            .map(|s| {
                if s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty() {
                    "{id}"
                } else {
                    s
                }
            })
            .collect();
        Some(Cow::Owned(shape.join("/")))
    });
    let layer = config().per_key(route).build().unwrap();
    let mut service = layer.layer(dependency());
    for id in 1..=3 {
        send(&mut service, &format!("http://svc/item/{id}/down")).await;
    }
    assert_eq!(send(&mut service, "http://svc/item/4/down").await, None);
    assert_eq!(
        send(&mut service, "http://svc/item/4/stock").await,
        Some(200)
    );
    assert_eq!(send(&mut service, "http://svc/health").await, Some(200));
    let keys = key_names(&layer);
    assert_eq!(keys, ["/item/{id}/down", "/item/{id}/stock"]);
    assert_eq!(
        layer.key_snapshot("/item/{id}/down").unwrap().state,
        State::Open
    );
    assert_eq!(
        layer.snapshot().calls,
        1,
        "the health check, on the overflow breaker"
    );
}

#[tokio::test(start_paused = true)]
async fn the_table_is_bounded_and_idle_keys_make_room() {
    let layer: BreakerLayer<HttpClassifier> = config()
        .per_key(RouteKey::Path)
        .max_keys(2)
        .build()
        .unwrap();
    let mut service = layer.layer(dependency());
    send(&mut service, "http://svc/a").await;
    send(&mut service, "http://svc/b").await;
    // Full, and neither key idle: `/c` shares the overflow breaker.
    send(&mut service, "http://svc/c").await;
    assert_eq!(layer.keys().len(), 2);
    assert_eq!(layer.snapshot().calls, 1);
    assert!(layer.key_snapshot("/c").is_none());
    // However many keys come while the table is full and none is idle (ids in paths, say),
    // they share the overflow breaker and the table keeps its bound.
    for id in 0..100 {
        send(&mut service, &format!("http://svc/item/{id}")).await;
    }
    assert_eq!(layer.keys().len(), 2);
    assert_eq!(layer.snapshot().calls, 101);

    // `/a` stays in use; `/b` goes idle.
    for _ in 0..2 {
        tokio::time::advance(IDLE * 2 / 3).await;
        send(&mut service, "http://svc/a").await;
    }
    send(&mut service, "http://svc/c").await;
    let keys = key_names(&layer);
    assert_eq!(keys, ["/a", "/c"], "the idle key made room");
}

#[tokio::test(start_paused = true)]
async fn a_key_that_is_still_called_while_open_is_never_evicted() {
    // Open for an hour: the calls below span twice the idle time, all while open.
    let hour = Duration::from_secs(3600);
    let layer = one_key().open_duration(hour, hour).build().unwrap();
    let mut service = layer.layer(dependency());
    open(&mut service, "http://svc/down").await;
    for _ in 0..5 {
        tokio::time::advance(IDLE * 2 / 5).await;
        assert_eq!(
            send(&mut service, "http://svc/down").await,
            None,
            "still open"
        );
        send(&mut service, "http://svc/other").await;
    }
    assert_eq!(layer.key_snapshot("/down").unwrap().state, State::Open);
    assert!(layer.key_snapshot("/other").is_none());
}

/// Idleness is counted in milliseconds: a key used 200 ms ago is not idle, though a second
/// boundary passed in between (at the idle time since the start); its open breaker keeps
/// refusing.
#[tokio::test(start_paused = true)]
async fn a_key_used_less_than_the_idle_time_ago_is_never_evicted() {
    let layer = one_key().build().unwrap();
    let mut service = layer.layer(dependency());
    tokio::time::advance(IDLE - Duration::from_millis(100)).await;
    open(&mut service, "http://svc/down").await;
    tokio::time::advance(Duration::from_millis(200)).await;
    assert_eq!(
        send(&mut service, "http://svc/other").await,
        Some(200),
        "on the overflow breaker"
    );
    assert!(layer.key_snapshot("/other").is_none());
    assert_eq!(layer.key_snapshot("/down").unwrap().state, State::Open);
    assert_eq!(
        send(&mut service, "http://svc/down").await,
        None,
        "still open"
    );

    // Its open time (5 s) over, but idle for 1 ms less than the idle time: it stays.
    tokio::time::advance(IDLE - Duration::from_millis(1)).await;
    send(&mut service, "http://svc/other").await;
    assert!(
        layer.key_snapshot("/other").is_none(),
        "idle for 1 ms less than the idle time only"
    );
    // Really idle: it makes room.
    tokio::time::advance(Duration::from_secs(5)).await;
    send(&mut service, "http://svc/other").await;
    let keys = key_names(&layer);
    assert_eq!(keys, ["/other"]);
}

/// An open breaker is never evicted before its open time has run out, called or not: a fresh
/// breaker in its place would let calls through to a route that is down. A reset closes it,
/// and then it makes room as soon as it is idle.
#[tokio::test(start_paused = true)]
async fn an_open_breaker_is_kept_until_its_open_time_is_over() {
    let open_time = Duration::from_secs(7200);
    let layer = one_key()
        .open_duration(open_time, open_time)
        .build()
        .unwrap();
    let mut service = layer.layer(dependency());
    open(&mut service, "http://svc/down").await;
    // Idle for longer than the idle time, but open for two hours.
    tokio::time::advance(IDLE + Duration::from_secs(10)).await;
    assert_eq!(send(&mut service, "http://svc/other").await, Some(200));
    assert!(layer.key_snapshot("/other").is_none());
    assert_eq!(
        send(&mut service, "http://svc/down").await,
        None,
        "still open"
    );
    // Idle for far longer than the idle time since that call; 390 s of open time left.
    tokio::time::advance(open_time - IDLE - Duration::from_secs(400)).await;
    send(&mut service, "http://svc/other").await;
    assert!(
        layer.key_snapshot("/other").is_none(),
        "390 s of open time left"
    );
    assert_eq!(send(&mut service, "http://svc/down").await, None);

    // Closed by hand: it makes room once idle, without waiting out the 390 s it had left.
    tokio::time::advance(IDLE / 2).await;
    layer.reset();
    tokio::time::advance(IDLE / 2 + Duration::from_millis(1)).await;
    send(&mut service, "http://svc/other").await;
    let keys = key_names(&layer);
    assert_eq!(keys, ["/other"]);
}

/// An operator's kill switch holds for every route: a mode set at run time applies to the
/// keys the layer has and to every key it adds later, whatever mode the config started in.
#[tokio::test(start_paused = true)]
async fn a_mode_set_at_run_time_applies_to_keys_added_later() {
    let layer = config().per_key(RouteKey::Path).build().unwrap();
    let mut service = layer.layer(dependency());
    assert_eq!(send(&mut service, "http://svc/a").await, Some(200));
    layer.set_mode(Mode::ForcedOpen);
    assert_eq!(send(&mut service, "http://svc/a").await, None);
    assert_eq!(
        send(&mut service, "http://svc/new").await,
        None,
        "a key added after the kill switch is forced open too"
    );
    assert_eq!(layer.key_snapshot("/new").unwrap().mode, Mode::ForcedOpen);
    assert_eq!(
        layer.snapshot().mode,
        Mode::ForcedOpen,
        "the overflow breaker too"
    );

    layer.set_mode(Mode::Disabled);
    for _ in 0..5 {
        assert_eq!(send(&mut service, "http://svc/down").await, Some(503));
    }
    let down = layer.key_snapshot("/down").unwrap();
    assert_eq!(
        (down.mode, down.state, down.calls),
        (Mode::Disabled, State::Closed, 0)
    );

    layer.set_mode(Mode::Normal);
    assert_eq!(send(&mut service, "http://svc/later").await, Some(200));
    let modes: Vec<Mode> = layer.keys().into_iter().map(|(_, s)| s.mode).collect();
    assert_eq!(modes, [Mode::Normal; 4]);

    // A layer built forced open and switched to normal: new keys are normal.
    let layer = config().per_key(RouteKey::Path).build().unwrap();
    layer.set_mode(Mode::ForcedOpen);
    let mut service = layer.layer(dependency());
    assert_eq!(send(&mut service, "http://svc/a").await, None);
    layer.set_mode(Mode::Normal);
    assert_eq!(send(&mut service, "http://svc/a").await, Some(200));
    assert_eq!(send(&mut service, "http://svc/b").await, Some(200));
}

/// Naming is configuration: a keyed layer named after it served is a new layer, its keys
/// still to come, and the layer that served keeps its keys and its (empty) name.
#[tokio::test(start_paused = true)]
async fn naming_a_keyed_layer_builds_a_new_one_and_leaves_the_served_one_as_it_was() {
    let layer = config().per_key(RouteKey::Path).build().unwrap();
    let mut service = layer.layer(dependency());
    send(&mut service, "http://svc/a").await;
    let named = layer.named("inventory");
    assert_eq!(named.name(), "inventory");
    assert!(named.is_keyed());
    assert!(named.keys().is_empty(), "a new layer: no key yet");
    assert_eq!(layer.name(), "");
    assert_eq!(layer.keys().len(), 1);
}

#[test]
fn each_key_costs_one_breaker() {
    let layer = config()
        .per_key(RouteKey::Path)
        .build()
        .unwrap()
        .named("inventory");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut service = layer.clone().layer(dependency());
        send(&mut service, "http://svc/a").await;
    });
    let (key, snapshot) = &layer.keys()[0];
    assert_eq!(key, "/a");
    // Memory per key: one breaker's shared state, at most the unkeyed layer's (a key's
    // handles are looked up, never copied per call, so they keep one set of them, not one per
    // stripe; the keyed module's docs state the figure).
    let unkeyed = config().build().unwrap().snapshot().shared_bytes;
    assert!(
        snapshot.shared_bytes <= unkeyed,
        "{} > {unkeyed}",
        snapshot.shared_bytes
    );
    println!("shared bytes per key: {}", snapshot.shared_bytes);
    assert!(
        snapshot.shared_bytes < 16 * 1024,
        "{} bytes",
        snapshot.shared_bytes
    );
}

/// A probe whose inner `call` panics gives its slot back (the permit owns it before
/// `inner.call` runs): the next call is probed and closes the breaker, keyed or not. Found
/// checking the class of the bulkhead's leaked permit (outside audit).
#[tokio::test(start_paused = true)]
async fn a_probe_whose_call_panics_gives_its_slot_back() {
    use std::sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
    };
    const FAIL: u8 = 0;
    const PANIC: u8 = 1;
    const ANSWER: u8 = 2;
    for keyed in [false, true] {
        let mode = Arc::new(AtomicU8::new(FAIL));
        let seen = mode.clone();
        let dependency = service_fn(move |_req: Request<String>| {
            let status = match seen.load(Ordering::SeqCst) {
                FAIL => 503,
                PANIC => panic!("the inner call panicked"),
                _ => 200,
            };
            let response = Response::builder().status(status).body(String::new());
            std::future::ready(Ok::<_, Infallible>(response.unwrap()))
        });
        let config = config().probes(1);
        let config = if keyed {
            config.per_key(RouteKey::Path)
        } else {
            config
        };
        let layer = config.build().unwrap();
        let mut service = layer.layer(dependency);
        open(&mut service, "http://a/down").await;
        assert_eq!(send(&mut service, "http://a/down").await, None, "open");
        tokio::time::advance(Duration::from_secs(600)).await;
        mode.store(PANIC, Ordering::SeqCst);
        let req = Request::get("http://a/down").body(String::new()).unwrap();
        let panicked = backstop_test_support::call_catching(&mut service, req);
        assert!(panicked.is_err(), "keyed {keyed}");
        mode.store(ANSWER, Ordering::SeqCst);
        assert_eq!(
            send(&mut service, "http://a/down").await,
            Some(200),
            "keyed {keyed}: the probe slot came back"
        );
        let state = if keyed {
            layer.keys()[0].1.state
        } else {
            layer.snapshot().state
        };
        assert_eq!(state, State::Closed, "keyed {keyed}");
    }
}
