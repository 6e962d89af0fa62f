//! Loom models of the memory store's one promise, for one key, at most one live claim, under
//! claims, completes, releases and lock expiry racing:
//! `RUSTFLAGS="--cfg loom" cargo test -p backstop --lib loom` (run by `.ci/run`).

use crate::idempotency::memory::Shard;
use crate::idempotency::record::{Fingerprint, StoredResponse};
use crate::idempotency::store::{Claim, Record, Token};
use crate::idempotency::sync::Mutex;
use loom::{sync::Arc, thread};

fn fp() -> Fingerprint {
    Fingerprint::from_bytes([7; 32])
}

fn answer() -> std::sync::Arc<StoredResponse> {
    std::sync::Arc::new(StoredResponse {
        fingerprint: fp(),
        status: http::StatusCode::OK,
        headers: http::HeaderMap::new(),
        body: bytes::Bytes::from_static(b"done"),
    })
}

fn shard() -> Arc<Mutex<Shard>> {
    Arc::new(Mutex::new(Shard::new(8, 1 << 16)))
}

#[test]
fn loom_two_claims_of_one_key_acquire_once() {
    loom::model(|| {
        let s = shard();
        let claims: Vec<_> = (0..2)
            .map(|i| {
                let s = s.clone();
                thread::spawn(move || {
                    s.lock()
                        .unwrap()
                        .claim("k", Token::new(i, fp()), 0, 100)
                        .unwrap()
                })
            })
            .collect();
        let won = claims
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|c| matches!(c, Claim::Acquired(_)))
            .count();
        assert_eq!(won, 1);
    });
}

#[test]
fn loom_a_late_complete_and_a_takeover_of_the_expired_claim_never_both_win() {
    loom::model(|| {
        let s = shard();
        let Claim::Acquired(first) = s
            .lock()
            .unwrap()
            .claim("k", Token::new(0, fp()), 0, 10)
            .unwrap()
        else {
            panic!("the key is free");
        };
        let a = {
            let s = s.clone();
            // The original answers after its lock (10) expired...
            thread::spawn(move || {
                s.lock()
                    .unwrap()
                    .complete("k", first, answer(), 20, 1000)
                    .unwrap()
            })
        };
        let b = {
            let s = s.clone();
            // ...while a duplicate arrives after the lock expired, too.
            thread::spawn(move || {
                let claim = s
                    .lock()
                    .unwrap()
                    .claim("k", Token::new(1, fp()), 20, 10)
                    .unwrap();
                match claim {
                    Claim::Acquired(t) => {
                        assert!(
                            s.lock()
                                .unwrap()
                                .complete("k", t, answer(), 21, 1000)
                                .unwrap()
                        );
                        true
                    }
                    Claim::Held(Record::Completed(_)) => false,
                    other => panic!("an expired claim is not in flight: {other:?}"),
                }
            })
        };
        let completed = a.join().unwrap();
        let took_over = b.join().unwrap();
        // Exactly one of them stored the answer.
        assert!(completed != took_over);
        assert!(matches!(
            s.lock().unwrap().get("k", 22),
            Some(Record::Completed(_))
        ));
    });
}

#[test]
fn loom_a_release_racing_a_duplicate_leaves_at_most_one_claim() {
    loom::model(|| {
        let s = shard();
        let Claim::Acquired(first) = s
            .lock()
            .unwrap()
            .claim("k", Token::new(0, fp()), 0, 100)
            .unwrap()
        else {
            panic!("the key is free");
        };
        let a = {
            let s = s.clone();
            thread::spawn(move || s.lock().unwrap().release("k", first))
        };
        let b = {
            let s = s.clone();
            thread::spawn(move || {
                s.lock()
                    .unwrap()
                    .claim("k", Token::new(1, fp()), 1, 100)
                    .unwrap()
            })
        };
        assert!(a.join().unwrap(), "the holder's release always works");
        let claim = b.join().unwrap();
        let mut shard = s.lock().unwrap();
        match claim {
            // Claimed after the release: the key holds exactly its claim, which the first
            // holder's token can no longer touch.
            Claim::Acquired(t) => {
                assert_eq!(shard.get("k", 2), Some(Record::InFlight(fp())));
                assert!(!shard.release("k", first));
                assert!(shard.release("k", t));
            }
            // Before the release: saw the claim in flight, and the key is free now.
            Claim::Held(Record::InFlight(_)) => assert_eq!(shard.get("k", 2), None),
            other => panic!("{other:?}"),
        }
    });
}
