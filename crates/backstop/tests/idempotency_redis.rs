//! The behavioural suite against the Redis store and a real redis-server (started by the
//! tests themselves, see `common/redis_server.rs`), then Redis's own faults: killed while a
//! handler runs, restarted, slow. In each: no duplicate side effect, a clear error (503),
//! nothing stored half.
#![cfg(feature = "redis")]

mod common;

use backstop::idempotency::RedisStore;

async fn shared_store() -> RedisStore {
    RedisStore::connect(&common::redis_server::RedisServer::shared().url())
        .await
        .expect("the shared redis-server answers")
}

mod suite {
    // Real time: a paused clock would jump while the runtime waits on Redis's socket.
    crate::behaviour!(false, {
        if !crate::common::redis_server::available() {
            return;
        }
        crate::shared_store().await
    });
}

use common::{redis_server::RedisServer, *};
use std::time::Duration;

type Config = backstop::idempotency::IdempotencyConfig<RedisStore>;

/// A redis-server of this test's own (it is killed or paused), or `None` on a machine
/// without one, where the test passes without checking anything.
fn own_server(start: fn() -> RedisServer) -> Option<RedisServer> {
    redis_server::available().then(start)
}

/// A harness over a fresh store on `server`, tuned by `tune`; the store too, for tests that
/// read what it holds.
async fn harness_on(
    server: &RedisServer,
    tune: impl FnOnce(Config) -> Config,
) -> (RedisStore, Harness) {
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let h = Harness::with(
        backstop::idempotency::IdempotencyLayer::builder(store.clone()),
        tune,
    );
    (store, h)
}

/// The first `Some` of up to 20 tries 100 ms apart: Redis, restarted, takes a moment to
/// answer again.
async fn within_two_seconds<T, F: Future<Output = Option<T>>>(
    mut attempt: impl FnMut() -> F,
) -> Option<T> {
    for _ in 0..20 {
        if let Some(t) = attempt().await {
            return Some(t);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Runs `cmd` on `server` over a connection of its own, as an operator would.
async fn admin(server: &RedisServer, cmd: &redis::Cmd) {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = cmd.query_async(&mut conn).await.unwrap();
}

/// Sends a slow request under `key`, does `fault` to Redis once the handler runs (the claim
/// made, the answer not yet stored), and checks the handler's answer still reaches its caller.
async fn fault_while_the_handler_runs(h: &Harness, key: &str, fault: impl FnOnce()) {
    let original = tokio::spawn(h.send(post("/slow", Some(key), "")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    fault();
    assert_eq!(
        original.await.unwrap().unwrap().status(),
        201,
        "the original's answer is sent whatever Redis did"
    );
}

#[tokio::test]
async fn redis_killed_while_the_handler_runs_no_duplicate_and_a_clear_503() {
    let Some(mut server) = own_server(RedisServer::start) else {
        return;
    };
    let (_, h) = harness_on(&server, |c| c).await;
    let key = fresh_key("killed");
    // The handler did its work: its answer is sent, though it could not be stored.
    fault_while_the_handler_runs(&h, &key, || server.kill()).await;
    // With Redis down a retry is refused, not run a second time.
    let retry = h.post("/slow", Some(&key), "").await;
    assert_problem(&retry, 503);
    assert!(retry.headers().contains_key("retry-after"));
    assert_eq!(h.runs(), 1);
}

#[tokio::test]
async fn redis_restarted_the_store_reconnects() {
    let Some(mut server) = own_server(RedisServer::start) else {
        return;
    };
    let (_, h) = harness_on(&server, |c| c).await;
    let key = fresh_key("restart");
    assert_eq!(h.post("/ok", Some(&key), "").await.status(), 201);
    server.restart();
    // The first command after the restart may meet the dead connection: a 503 the handler
    // never sees. Within a few tries the store is back, scripts reloaded.
    let h = &h;
    let answered = within_two_seconds(move || async move {
        let r = h.post("/ok", Some(&fresh_key("after")), "").await;
        if r.status() == 201 {
            return Some(r);
        }
        assert_problem(&r, 503);
        None
    })
    .await;
    assert!(answered.is_some(), "the store reconnected");
    assert_eq!(h.runs(), 2, "no refused request ran the handler");
}

#[tokio::test]
async fn a_slow_redis_is_a_503_within_the_store_timeout() {
    let Some(server) = own_server(RedisServer::start) else {
        return;
    };
    let (_, h) = harness_on(&server, |c| c).await;
    // Writes wait 3 s: longer than the layer's fixed 1 s.
    admin(
        &server,
        redis::cmd("CLIENT").arg("PAUSE").arg(3000).arg("WRITE"),
    )
    .await;
    let started = tokio::time::Instant::now();
    let key = fresh_key("slow");
    assert_problem(&h.post("/ok", Some(&key), "").await, 503);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_millis(2500),
        "about the 1 s store timeout: {waited:?}"
    );
    assert_eq!(h.runs(), 0);
    // Once Redis answers again, the key was never claimed: the request runs, once.
    tokio::time::sleep(Duration::from_millis(3200) - waited).await;
    assert_eq!(h.post("/ok", Some(&key), "").await.status(), 201);
    assert!(replayed(&h.post("/ok", Some(&key), "").await));
    assert_eq!(h.runs(), 1);
}

#[tokio::test]
async fn a_foreign_value_under_a_key_is_an_error_not_a_replay() {
    if !redis_server::available() {
        return;
    }
    let server = RedisServer::shared();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .prefix("t:");
    let h = Harness::new(store);
    let key = fresh_key("foreign");
    admin(
        server,
        redis::cmd("SET").arg(format!("t:{key}")).arg("not ours"),
    )
    .await;
    assert_problem(&h.post("/ok", Some(&key), "").await, 503);
    assert_eq!(h.runs(), 0);
}

#[tokio::test]
async fn redis_killed_after_the_claim_and_restarted_from_its_log_keeps_the_claim() {
    let Some(mut server) = own_server(RedisServer::start_persistent) else {
        return;
    };
    let (store, h) = harness_on(&server, |c| c.lock_timeout(Duration::from_secs(30))).await;
    let key = fresh_key("persisted");
    // Killed after the claim, before the answer; back from its append-only file.
    fault_while_the_handler_runs(&h, &key, || server.restart()).await;
    // The claim survived the kill: a retry is refused (503 while reconnecting, then 409),
    // never run a second time.
    let (h, retried) = (&h, &key);
    let conflict = within_two_seconds(move || async move {
        let r = h.post("/slow", Some(retried), "").await;
        if r.status() == 409 {
            return Some(());
        }
        assert_problem(&r, 503);
        None
    })
    .await;
    assert!(
        conflict.is_some(),
        "the claim came back with the restarted Redis"
    );
    assert_eq!(h.runs(), 1);
    // Nothing half: the key holds the claim, or (the answer's complete failed, the second
    // one reached the restarted Redis) the record that the request ran; never a torn answer.
    use backstop::idempotency::{Record, Store};
    match store.get(&key).await.unwrap() {
        Some(Record::InFlight(_)) => {}
        Some(Record::Completed(r)) => assert_eq!(r.status, 409, "{r:?}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn redis_killed_after_the_claim_and_restarted_empty_holds_nothing_half() {
    let Some(mut server) = own_server(RedisServer::start) else {
        return;
    };
    let (store, h) = harness_on(&server, |c| c).await;
    let key = fresh_key("empty");
    // The answer is sent; its complete met a Redis that had forgotten the claim, so it wrote
    // nothing (complete writes only over its own claim).
    fault_while_the_handler_runs(&h, &key, || server.restart()).await;
    use backstop::idempotency::Store;
    let (store, read_key) = (&store, &key);
    let read = within_two_seconds(move || async move { store.get(read_key).await.ok() }).await;
    assert_eq!(read, Some(None), "nothing stored, not half an answer");
    assert_eq!(h.runs(), 1);
}

#[tokio::test]
async fn fail_open_runs_the_handler_while_redis_is_down() {
    let Some(mut server) = own_server(RedisServer::start) else {
        return;
    };
    let (_, h) = harness_on(&server, |c| c.fail_open(true)).await;
    server.kill();
    let key = fresh_key("open");
    assert_eq!(h.post("/ok", Some(&key), "").await.status(), 201);
    assert_eq!(h.post("/ok", Some(&key), "").await.status(), 201);
    assert_eq!(
        h.runs(),
        2,
        "fail open: no de-duplication while the store is down"
    );
}

#[tokio::test]
async fn every_duration_knob_is_refused_by_build_or_honoured_by_redis() {
    if !redis_server::available() {
        return;
    }
    let store = shared_store().await;
    every_duration_knob_is_refused_or_honoured(|| store.clone()).await;
}
