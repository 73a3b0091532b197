//! The embedded use (as in `actors/examples/embedded.rs`): the collector started
//! with `start()` inside the user's own actix `System`, batches pushed to an actor
//! of the user's that sends weights back, and a clean stop from that actor.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use actix::prelude::*;
use rollout::{PolicyConfig, PolicySpec, Registry, Tensor, Weights};
use rollout_actors::messages::{PushWeights, StopNodes, StoreWeights, Subscribe, TrainerEvent};
use rollout_actors::trainer::Trainer;
use rollout_actors::CollectorBuilder;

const PUSH_EVERY: u64 = 3;
const DEADLINE: Duration = Duration::from_secs(60);

/// What the learner saw of one batch.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    index: u64,
    frames: usize,
    node: Option<usize>,
    weights_version: u64,
    shape: Vec<usize>,
}

/// How the run ended, as seen from the learner.
#[derive(Debug)]
enum Report {
    Batch(Seen),
    /// Weights stored after batch `after`, answered version `version`.
    Pushed {
        after: u64,
        version: u64,
    },
    Finished,
    Stopped(Result<(), String>),
    Failed(String),
}

struct Learner {
    trainer: Addr<Trainer>,
    arbiters: Vec<ArbiterHandle>,
    weights: Weights,
    batches: u64,
    report: mpsc::Sender<Report>,
}

impl Actor for Learner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.trainer.do_send(Subscribe(ctx.address().recipient()));
    }
}

impl Learner {
    fn stop_all(&mut self, ctx: &mut Context<Self>) {
        let stop = self.trainer.send(StopNodes);
        let arbiters = std::mem::take(&mut self.arbiters);
        let report = self.report.clone();
        ctx.spawn(
            async move {
                let r = match stop.await {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                let _ = report.send(Report::Stopped(r));
                for a in &arbiters {
                    a.stop();
                }
                System::current().stop();
            }
            .into_actor(self),
        );
    }
}

impl Handler<TrainerEvent> for Learner {
    type Result = ();

    fn handle(&mut self, ev: TrainerEvent, ctx: &mut Self::Context) {
        match ev {
            TrainerEvent::Batch(b) => {
                let _ = self.report.send(Report::Batch(Seen {
                    index: b.index,
                    frames: b.data.numel(),
                    node: b.node,
                    weights_version: b.weights_version,
                    shape: b.data.batch_size().to_vec(),
                }));
                self.batches += 1;
                if self.batches.is_multiple_of(PUSH_EVERY) {
                    for t in self.weights.tensors.values_mut() {
                        if let Tensor::F32(a) = t {
                            a.mapv_inplace(|x| 0.9 * x + 0.01);
                        }
                    }
                    let after = b.index;
                    let report = self.report.clone();
                    let store = self.trainer.send(StoreWeights(self.weights.clone()));
                    // Sent right away (not after the store's answer): messages to the
                    // trainer are handled in order, so the push sends what was stored.
                    self.trainer.do_send(PushWeights(None));
                    ctx.spawn(
                        async move {
                            if let Ok(version) = store.await {
                                let _ = report.send(Report::Pushed { after, version });
                            }
                        }
                        .into_actor(self),
                    );
                }
            }
            TrainerEvent::Finished => {
                let _ = self.report.send(Report::Finished);
                self.stop_all(ctx);
            }
            TrainerEvent::Failed(e) => {
                let _ = self.report.send(Report::Failed(e.to_string()));
                self.stop_all(ctx);
            }
        }
    }
}

/// Runs the embedded flow on a thread of its own; everything the learner saw, in order.
fn run(sync: bool) -> Vec<Report> {
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let system_thread = thread::spawn(move || {
        let probe = Registry::with_builtins().make(&"CartPole-v1".into()).expect("env");
        let weights = PolicySpec::from(PolicyConfig::Linear)
            .build(probe.observation_spec(), probe.action_spec(), 0)
            .expect("policy")
            .weights()
            .clone();
        let sys = System::new();
        let report = tx.clone();
        let arbiters = sys.block_on(async move {
            let started = CollectorBuilder::default()
                .env("CartPole-v1")
                .policy(PolicyConfig::Linear)
                .nodes(2)
                .frames_per_batch(1000)
                .total_frames(10_000)
                .sync(sync)
                .seed(3)
                .start()
                .expect("starts");
            Learner {
                trainer: started.trainer,
                arbiters: started.arbiters.iter().map(Arbiter::handle).collect(),
                weights,
                batches: 0,
                report,
            }
            .start();
            started.arbiters
        });
        sys.run().expect("system ran");
        for a in arbiters {
            a.join().expect("arbiter thread joined");
        }
        let _ = done_tx.send(());
    });
    if done_rx.recv_timeout(DEADLINE).is_err() {
        let seen: Vec<Report> = rx.try_iter().collect();
        panic!("the embedded run did not end within {DEADLINE:?} (sync={sync}); the learner saw {seen:?}");
    }
    system_thread.join().expect("system thread");
    rx.try_iter().collect()
}

fn check(sync: bool) {
    let reports = run(sync);
    let mut seen = Vec::new();
    let mut pushes = Vec::new();
    let mut finished = 0;
    let mut stopped = Vec::new();
    for r in reports {
        match r {
            Report::Batch(s) => {
                assert_eq!(finished, 0, "a batch after Finished: {s:?}");
                seen.push(s);
            }
            Report::Pushed { after, version } => pushes.push((after, version)),
            Report::Finished => finished += 1,
            Report::Stopped(r) => stopped.push(r),
            Report::Failed(e) => panic!("collection failed: {e}"),
        }
    }
    assert_eq!(finished, 1);
    assert_eq!(stopped, vec![Ok(())], "StopNodes answered once, all nodes down");
    assert_eq!(
        seen.iter().map(|s| s.index).collect::<Vec<_>>(),
        (0..10).collect::<Vec<u64>>()
    );
    for s in &seen {
        assert_eq!(s.frames, 1000, "{s:?}");
        if sync {
            assert_eq!((s.node, s.shape.as_slice()), (None, &[2usize, 1, 500][..]), "{s:?}");
        } else {
            assert!(matches!(s.node, Some(0 | 1)), "{s:?}");
            assert_eq!(s.shape, vec![1, 1000], "{s:?}");
        }
    }
    // Stored after batches 2, 5 and 8, as versions 1, 2, 3.
    assert_eq!(pushes, vec![(2, 1), (5, 2), (8, 3)]);
    // Weights pushed after batch p reach at most the batches asked for after p was
    // yielded, i.e. from p + 2 on (p + 1 was asked for as p was yielded).
    for s in &seen {
        let bound = pushes.iter().filter(|(after, _)| after + 2 <= s.index).count() as u64;
        assert!(
            s.weights_version <= bound,
            "batch {} uses version {} > {bound}",
            s.index,
            s.weights_version
        );
    }
    // A node never goes back to older weights.
    for node in [None, Some(0), Some(1)] {
        let v: Vec<u64> = seen
            .iter()
            .filter(|s| s.node == node)
            .map(|s| s.weights_version)
            .collect();
        assert!(v.windows(2).all(|w| w[0] <= w[1]), "node {node:?} versions {v:?}");
    }
    // The pushes after batches 2 and 5 show up in later batches.
    let versions: Vec<u64> = seen.iter().map(|s| s.weights_version).collect();
    assert_eq!(versions.iter().max(), Some(&2), "versions {versions:?}");
    assert!(versions.contains(&1), "versions {versions:?}");
}

#[test]
fn embedded_async_run_pushes_batches_and_takes_weights() {
    check(false);
}

#[test]
fn embedded_sync_run_pushes_batches_and_takes_weights() {
    check(true);
}
