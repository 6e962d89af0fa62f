//! The behavioural suite against the Redis store and a real redis-server (started by the
//! tests themselves, see `common/redis_server.rs`), then Redis's own faults: killed while a
//! handler runs, restarted, slow. In each: no duplicate side effect, a clear error (503),
//! nothing stored half.
#![cfg(feature = "redis")]

mod common;

use backstop_idempotency::RedisStore;

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

fn tuned(
    c: backstop_idempotency::IdempotencyConfig<RedisStore>,
) -> backstop_idempotency::IdempotencyConfig<RedisStore> {
    c.store_timeout(Duration::from_millis(300))
}

#[tokio::test]
async fn redis_killed_while_the_handler_runs_no_duplicate_and_a_clear_503() {
    if !redis_server::available() {
        return;
    }
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let h = Harness::with(
        backstop_idempotency::IdempotencyLayer::builder(store),
        tuned,
    );
    let key = fresh_key("killed");
    let original = tokio::spawn(h.send(post("/slow", Some(&key), "")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.kill();
    // The handler did its work: its answer is sent, though it could not be stored.
    assert_eq!(original.await.unwrap().unwrap().status(), 201);
    // With Redis down a retry is refused, not run a second time.
    let retry = h.post("/slow", Some(&key), "").await;
    assert_problem(&retry, 503);
    assert!(retry.headers().contains_key("retry-after"));
    assert_eq!(h.runs(), 1);
}

#[tokio::test]
async fn redis_restarted_the_store_reconnects() {
    if !redis_server::available() {
        return;
    }
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let h = Harness::with(
        backstop_idempotency::IdempotencyLayer::builder(store),
        tuned,
    );
    let key = fresh_key("restart");
    assert_eq!(h.post("/ok", Some(&key), "").await.status(), 201);
    server.restart();
    // The first command after the restart may meet the dead connection: a 503 the handler
    // never sees. Within a few tries the store is back, scripts reloaded.
    let mut answered = None;
    for _ in 0..20 {
        let r = h.post("/ok", Some(&fresh_key("after")), "").await;
        if r.status() == 201 {
            answered = Some(r);
            break;
        }
        assert_problem(&r, 503);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered.is_some(), "the store reconnected");
    assert_eq!(h.runs(), 2, "no refused request ran the handler");
}

#[tokio::test]
async fn a_slow_redis_is_a_503_within_the_store_timeout() {
    if !redis_server::available() {
        return;
    }
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let h = Harness::with(
        backstop_idempotency::IdempotencyLayer::builder(store),
        tuned,
    );
    let admin = redis::Client::open(server.url()).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1000)
        .arg("WRITE")
        .query_async(&mut admin)
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let key = fresh_key("slow");
    assert_problem(&h.post("/ok", Some(&key), "").await, 503);
    assert!(started.elapsed() < Duration::from_millis(900));
    assert_eq!(h.runs(), 0);
    // Once Redis answers again, the key was never claimed: the request runs, once.
    tokio::time::sleep(Duration::from_millis(1100)).await;
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
    let admin = redis::Client::open(server.url()).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("t:{key}"))
        .arg("not ours")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_problem(&h.post("/ok", Some(&key), "").await, 503);
    assert_eq!(h.runs(), 0);
}

#[tokio::test]
async fn redis_killed_after_the_claim_and_restarted_from_its_log_keeps_the_claim() {
    if !redis_server::available() {
        return;
    }
    let mut server = RedisServer::start_persistent();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let h = Harness::with(
        backstop_idempotency::IdempotencyLayer::builder(store.clone()),
        |c| tuned(c).lock_timeout(Duration::from_secs(30)),
    );
    let key = fresh_key("persisted");
    let original = tokio::spawn(h.send(post("/slow", Some(&key), "")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Killed after the claim, before the answer; back from its append-only file.
    server.restart();
    assert_eq!(original.await.unwrap().unwrap().status(), 201);
    // The claim survived the kill: a retry is refused (503 while reconnecting, then 409),
    // never run a second time.
    let mut conflict = false;
    for _ in 0..20 {
        let r = h.post("/slow", Some(&key), "").await;
        if r.status() == 409 {
            conflict = true;
            break;
        }
        assert_problem(&r, 503);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(conflict, "the claim came back with the restarted Redis");
    assert_eq!(h.runs(), 1);
    // Nothing half: the key holds the claim, readable, not a torn answer.
    use backstop_idempotency::{Record, Store};
    assert!(matches!(
        store.get(&key).await.unwrap(),
        Some(Record::InFlight(_))
    ));
}

#[tokio::test]
async fn redis_killed_after_the_claim_and_restarted_empty_holds_nothing_half() {
    if !redis_server::available() {
        return;
    }
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let h = Harness::with(
        backstop_idempotency::IdempotencyLayer::builder(store.clone()),
        tuned,
    );
    let key = fresh_key("empty");
    let original = tokio::spawn(h.send(post("/slow", Some(&key), "")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.restart();
    // The answer is sent; its complete met a Redis that had forgotten the claim, so it wrote
    // nothing (complete writes only over its own claim).
    assert_eq!(original.await.unwrap().unwrap().status(), 201);
    use backstop_idempotency::Store;
    let mut read = None;
    for _ in 0..20 {
        if let Ok(r) = store.get(&key).await {
            read = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(read, Some(None), "nothing stored, not half an answer");
    assert_eq!(h.runs(), 1);
}

#[tokio::test]
async fn fail_open_runs_the_handler_while_redis_is_down() {
    if !redis_server::available() {
        return;
    }
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let h = Harness::with(
        backstop_idempotency::IdempotencyLayer::builder(store),
        |c| tuned(c).fail_open(true),
    );
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
