//! Model-based test: random sequences of calls, outcomes, cancellations and time steps are
//! run through the real layer (tower-test mocks, paused time) and through a plain reference
//! model of the state machine; both must agree on every admission and every state.

use backstop::BreakerOpen;
use backstop::client::breaker::{BreakerConfig, State};
use http::{Request, Response};
use proptest::prelude::*;
use std::{collections::VecDeque, task::Poll, time::Duration};
use tokio_test::task;
use tower::{Layer, Service, ServiceExt};
use tower_test::mock;

const WINDOW: usize = 5;
const MINIMUM: usize = 3;
const PROBES: u32 = 2;
const BASE_MS: u64 = 1_000;
const MAX_MS: u64 = 8_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admission {
    Closed(u32),
    Probe(u32),
}

/// The reference: the breaker's rules written as plainly as possible, one thread.
#[derive(Debug)]
struct Model {
    state: State,
    generation: u32,
    window: VecDeque<bool>,
    taken: u32,
    succeeded: u32,
    open_until_ms: u64,
    reopens: u32,
}

impl Model {
    fn new() -> Self {
        Self {
            state: State::Closed,
            generation: 0,
            window: VecDeque::new(),
            taken: 0,
            succeeded: 0,
            open_until_ms: 0,
            reopens: 0,
        }
    }

    /// The admission, or the milliseconds until calls pass.
    fn admit(&mut self, now_ms: u64) -> Result<Admission, Option<u64>> {
        match self.state {
            State::Closed => Ok(Admission::Closed(self.generation)),
            State::Open if now_ms < self.open_until_ms => Err(Some(self.open_until_ms - now_ms)),
            State::Open => {
                self.state = State::HalfOpen;
                self.generation += 1;
                self.taken = 1;
                self.succeeded = 0;
                Ok(Admission::Probe(self.generation))
            }
            State::HalfOpen if self.taken < PROBES => {
                self.taken += 1;
                Ok(Admission::Probe(self.generation))
            }
            State::HalfOpen => Err(None),
        }
    }

    /// `failure`: `Some(true)` failed, `Some(false)` succeeded, `None` ignored or cancelled.
    fn finish(&mut self, admission: Admission, failure: Option<bool>, now_ms: u64) {
        match admission {
            Admission::Closed(g) if self.state == State::Closed && g == self.generation => {
                let Some(failed) = failure else { return };
                self.window.push_back(failed);
                if self.window.len() > WINDOW {
                    self.window.pop_front();
                }
                let failures = self.window.iter().filter(|f| **f).count();
                // Checked when a failure is recorded: a success never opens.
                if failed && self.window.len() >= MINIMUM && failures * 2 >= self.window.len() {
                    self.open(now_ms, false);
                }
            }
            Admission::Probe(g) if self.state == State::HalfOpen && g == self.generation => {
                match failure {
                    None => self.taken -= 1,
                    Some(true) => self.open(now_ms, true),
                    Some(false) if self.succeeded + 1 >= PROBES => {
                        self.state = State::Closed;
                        self.generation += 1;
                        self.window.clear();
                        self.reopens = 0;
                    }
                    Some(false) => self.succeeded += 1,
                }
            }
            _ => {}
        }
    }

    fn open(&mut self, now_ms: u64, reopen: bool) {
        self.reopens = if reopen { self.reopens + 1 } else { 0 };
        let open = (BASE_MS << self.reopens.min(10)).min(MAX_MS);
        self.state = State::Open;
        self.generation += 1;
        self.open_until_ms = now_ms + open;
    }
}

#[derive(Debug, Clone)]
enum Op {
    Call,
    Succeed(usize),
    Fail(usize),
    Ignore(usize),
    Cancel(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Call),
        3 => any::<usize>().prop_map(Op::Succeed),
        3 => any::<usize>().prop_map(Op::Fail),
        1 => any::<usize>().prop_map(Op::Ignore),
        1 => any::<usize>().prop_map(Op::Cancel),
        2 => (0u64..3_000).prop_map(Op::Advance),
    ]
}

async fn run(ops: Vec<Op>) {
    let layer = BreakerConfig::http()
        .count_window(WINDOW as u32)
        .minimum_calls(MINIMUM as u32)
        .failure_rate(0.5)
        .probes(PROBES as u16)
        .open_duration(
            Duration::from_millis(BASE_MS),
            Duration::from_millis(MAX_MS),
        )
        .jitter(false)
        .build()
        .unwrap();
    let (mock, mut handle) = mock::pair::<Request<()>, Response<()>>();
    let mut service = layer.layer(mock);
    let mut model = Model::new();
    let mut now_ms = 0;
    let mut in_flight = Vec::new();

    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Call => {
                handle.allow(1);
                let future = service.ready().await.unwrap().call(Request::new(()));
                let mut future = task::spawn(future);
                let expected = model.admit(now_ms);
                match future.poll() {
                    Poll::Ready(result) => {
                        let err = result.expect_err("only a refusal is ready at once");
                        let open = err.downcast_ref::<BreakerOpen>().expect("BreakerOpen");
                        let wait = expected
                            .expect_err("model refuses")
                            .map(Duration::from_millis);
                        assert_eq!(open.retry_after(), wait, "step {step}: retry_after");
                    }
                    Poll::Pending => {
                        let admission = expected.expect("model admits too");
                        let (_, send) = handle.next_request().await.unwrap();
                        in_flight.push((future, send, admission));
                    }
                }
            }
            Op::Advance(ms) => {
                tokio::time::advance(Duration::from_millis(ms)).await;
                now_ms += ms;
            }
            Op::Succeed(i) | Op::Fail(i) | Op::Ignore(i) | Op::Cancel(i)
                if !in_flight.is_empty() =>
            {
                let (mut future, send, admission) = in_flight.swap_remove(i % in_flight.len());
                let (status, failure) = match op {
                    Op::Succeed(_) => (200, Some(false)),
                    Op::Fail(_) => (503, Some(true)),
                    Op::Ignore(_) => (404, None),
                    _ => {
                        drop((future, send));
                        model.finish(admission, None, now_ms);
                        check(&layer, &model, step);
                        continue;
                    }
                };
                let mut response = Response::new(());
                *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
                send.send_response(response);
                match future.poll() {
                    Poll::Ready(Ok(r)) => assert_eq!(r.status(), status),
                    other => panic!("step {step}: {other:?}"),
                }
                model.finish(admission, failure, now_ms);
            }
            _ => {}
        }
        check(&layer, &model, step);
    }
}

fn check(
    layer: &backstop::client::breaker::BreakerLayer<backstop::HttpClassifier>,
    model: &Model,
    step: usize,
) {
    let snap = layer.snapshot();
    assert_eq!(snap.state, model.state, "step {step}: state");
    assert_eq!(snap.generation, model.generation, "step {step}: generation");
    assert_eq!(snap.reopens, model.reopens, "step {step}: reopens");
    if model.state == State::Closed {
        let failures = model.window.iter().filter(|f| **f).count() as u64;
        assert_eq!(
            (snap.calls, snap.failures),
            (model.window.len() as u64, failures),
            "step {step}: window"
        );
    }
    if model.state == State::HalfOpen {
        assert_eq!(
            u32::from(snap.probes_in_flight),
            model.taken - model.succeeded,
            "step {step}: probes in flight"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_layer_agrees_with_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        backstop_test_support::paused_runtime()
            .block_on(run(ops));
    }
}
