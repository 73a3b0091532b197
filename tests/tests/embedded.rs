//! The embedded use (as in `actors/examples/embedded.rs`): the collector started
//! with `start()` inside the user's own actix `System`, batches pushed to an actor
//! of the user's that sends weights back, and a clean stop from that actor.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use actix::prelude::*;
use rollout::postproc::MASK_KEY;
use rollout::{PolicyConfig, PolicySpec, Registry, Tensor, TensorDict, Weights};
use rollout_actors::messages::{NextBatch, PushWeights, StopNodes, StoreWeights, Subscribe, TrainerEvent};
use rollout_actors::trainer::Trainer;
use rollout_actors::{replay, CollectError, Collected, CollectorBuilder};

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
                            if let Ok(Ok(version)) = store.await {
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

// ---- Every delivery setting of the builder (`split_trajs`, `postproc`, `replay_buffer`,
// `batch_timeout`) holds on both embedded start paths, `start()` and `start_embedded()`,
// as it does for `build()`.

/// How an embedded run is started.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// `CollectorBuilder::start()`.
    Start,
    /// `CollectorBuilder::start_embedded()`.
    StartEmbedded,
}

/// What one `NextBatch` pull of a run started by `path` from `builder` answered
/// (bounded by `DEADLINE`), with the run stopped and its threads joined after it.
fn pull_one(path: Path, builder: CollectorBuilder) -> Result<Option<Collected>, CollectError> {
    pull_one_then(path, builder, || {})
}

/// [`pull_one`], calling `answered` once the pull is answered, before the run stops.
fn pull_one_then(
    path: Path,
    builder: CollectorBuilder,
    answered: impl FnOnce() + 'static,
) -> Result<Option<Collected>, CollectError> {
    let sys = System::new();
    let (answer, arbiters) = sys.block_on(async move {
        let (trainer, arbiters) = match path {
            Path::Start => {
                let s = builder.start().expect("starts");
                (s.trainer, s.arbiters)
            }
            Path::StartEmbedded => {
                let e = builder.start_embedded().await.expect("starts");
                (e.trainer, e.arbiters)
            }
        };
        let answer = actix_rt::time::timeout(DEADLINE, trainer.send(NextBatch))
            .await
            .unwrap_or_else(|_| panic!("no answer to NextBatch within {DEADLINE:?} ({path:?})"))
            .expect("the trainer answers");
        answered();
        let _ = actix_rt::time::timeout(DEADLINE, trainer.send(StopNodes)).await;
        (answer, arbiters)
    });
    for a in &arbiters {
        a.stop();
    }
    for a in arbiters {
        a.join().expect("an env worker's thread");
    }
    answer
}

/// One local node of CartPole, 50 frames a batch.
fn small_run() -> CollectorBuilder {
    CollectorBuilder::default()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .frames_per_batch(50)
        .total_frames(-1)
        .seed(5)
}

fn split_trajs_applies(path: Path) {
    let batch = pull_one(path, small_run().split_trajs(true))
        .expect("a batch")
        .expect("not the end");
    assert!(
        batch.data.contains(MASK_KEY),
        "{path:?}: a split batch carries {MASK_KEY}; keys {:?}",
        batch.data.keys().collect::<Vec<_>>()
    );
    assert_eq!(batch.data.batch_size().len(), 2, "{path:?}: [n_traj, max_len]");
    let mask = batch.data.bool(MASK_KEY).expect("a bool mask");
    assert_eq!(mask.iter().filter(|m| **m).count(), 50, "{path:?}: every frame, once");
}

#[test]
fn start_splits_trajectories_when_asked() {
    split_trajs_applies(Path::Start);
}

#[test]
fn start_embedded_splits_trajectories_when_asked() {
    split_trajs_applies(Path::StartEmbedded);
}

fn postproc_applies(path: Path) {
    let marked = |mut td: TensorDict| -> Result<TensorDict, String> {
        let shape: Vec<usize> = td.batch_size().to_vec();
        let ones = ndarray::ArrayD::<f32>::ones(ndarray::IxDyn(&shape));
        td.set("postproc.ran", Tensor::F32(ones)).map_err(|e| e.to_string())?;
        Ok(td)
    };
    let batch = pull_one(path, small_run().postproc(marked))
        .expect("a batch")
        .expect("not the end");
    assert!(
        batch.data.contains("postproc.ran"),
        "{path:?}: the postproc's entry is missing"
    );
    // A postproc that fails fails the pull, naming why.
    let failing = |_td: TensorDict| -> Result<TensorDict, String> { Err("refused by the postproc".into()) };
    match pull_one(path, small_run().postproc(failing)) {
        Err(CollectError::Postproc(e)) => assert!(e.contains("refused by the postproc"), "{e}"),
        other => panic!("{path:?}: expected the postproc's error, got {other:?}"),
    }
}

#[test]
fn start_applies_the_postproc() {
    postproc_applies(Path::Start);
}

#[test]
fn start_embedded_applies_the_postproc() {
    postproc_applies(Path::StartEmbedded);
}

fn replay_buffer_fills(path: Path) {
    let buffer = replay::shared(1000, 0).expect("buffer");
    let batch = pull_one(path, small_run().replay_buffer(buffer.clone()))
        .expect("a batch")
        .expect("not the end");
    assert_eq!(
        replay::lock(&buffer).len(),
        50,
        "{path:?}: the batch's frames are in the buffer"
    );
    assert_eq!(
        batch.data.keys().count(),
        0,
        "{path:?}: the consumer gets the metadata only"
    );
    assert_eq!(batch.data.numel(), 50, "{path:?}: the shape still counts the frames");
}

#[test]
fn start_fills_the_replay_buffer() {
    replay_buffer_fills(Path::Start);
}

#[test]
fn start_embedded_fills_the_replay_buffer() {
    replay_buffer_fills(Path::StartEmbedded);
}

/// Counting, whose steps wait (in short naps) until `release` is set: a batch that
/// does not come until the test lets it.
struct Stalled(rollout::Counting, Arc<AtomicBool>);

impl rollout::Env for Stalled {
    fn name(&self) -> &str {
        "Stalled"
    }
    fn observation_spec(&self) -> &rollout::Spec {
        self.0.observation_spec()
    }
    fn action_spec(&self) -> &rollout::Spec {
        self.0.action_spec()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), rollout::EnvError> {
        self.0.reset(seed, obs)
    }
    fn step(&mut self, a: rollout::Action<'_>, obs: &mut [f32]) -> Result<rollout::Transition, rollout::EnvError> {
        while !self.1.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(5));
        }
        self.0.step(a, obs)
    }
    fn state(&self) -> Vec<f64> {
        self.0.state()
    }
    fn set_state(&mut self, s: &[f64]) -> Result<(), rollout::EnvError> {
        self.0.set_state(s)
    }
    fn elapsed_steps(&self) -> u64 {
        self.0.elapsed_steps()
    }
    fn set_elapsed_steps(&mut self, s: u64) {
        self.0.set_elapsed_steps(s)
    }
}

fn batch_timeout_bounds_the_wait(path: Path) {
    let release = Arc::new(AtomicBool::new(false));
    let mut registry = Registry::with_builtins();
    let r = release.clone();
    registry.register("Stalled", move |_c| {
        Ok(Box::new(Stalled(
            rollout::Counting::new(rollout::CountingConfig::default())?,
            r.clone(),
        )))
    });
    let builder = CollectorBuilder::default()
        .env("Stalled")
        .registry(registry)
        .policy(PolicyConfig::Constant { value: 1.0 })
        .frames_per_batch(10)
        .total_frames(-1)
        .seed(0)
        .batch_timeout(Duration::from_millis(300));
    // The workers' threads are joined at the end: let them go once the pull answered
    // (or the test failed).
    let answer = {
        let _release_at_end = ReleaseOnDrop(release.clone());
        let started = Instant::now();
        let answer = pull_one_then(path, builder, move || release.store(true, Ordering::SeqCst));
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{path:?}: the pull took {:?}",
            started.elapsed()
        );
        answer
    };
    match answer {
        Err(CollectError::Timeout { what, seconds }) => {
            assert_eq!(what, "collecting a batch");
            assert!((seconds - 0.3).abs() < 1e-9, "{seconds}");
        }
        other => panic!("{path:?}: expected the batch_timeout to end the wait, got {other:?}"),
    }
}

/// Sets its flag when dropped (also when the test panics), so stalled envs end.
struct ReleaseOnDrop(Arc<AtomicBool>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn start_bounds_the_wait_for_a_batch_by_batch_timeout() {
    batch_timeout_bounds_the_wait(Path::Start);
}

#[test]
fn start_embedded_bounds_the_wait_for_a_batch_by_batch_timeout() {
    batch_timeout_bounds_the_wait(Path::StartEmbedded);
}

/// A subscriber of a `start()` run (push mode) receives split batches too.
#[test]
fn a_subscriber_receives_split_batches() {
    struct Probe(Addr<Trainer>, mpsc::Sender<Result<Collected, String>>);
    impl Actor for Probe {
        type Context = Context<Self>;
        fn started(&mut self, ctx: &mut Self::Context) {
            self.0.do_send(Subscribe(ctx.address().recipient()));
        }
    }
    impl Handler<TrainerEvent> for Probe {
        type Result = ();
        fn handle(&mut self, ev: TrainerEvent, ctx: &mut Self::Context) {
            let r = match ev {
                TrainerEvent::Batch(c) => Ok(c),
                TrainerEvent::Finished => Err("finished".into()),
                TrainerEvent::Failed(e) => Err(e.to_string()),
            };
            let _ = self.1.send(r);
            ctx.stop();
        }
    }
    let (tx, rx) = mpsc::channel();
    let sys = System::new();
    let arbiters = sys.block_on(async move {
        let s = small_run().split_trajs(true).start().expect("starts");
        Probe(s.trainer.clone(), tx).start();
        (s.trainer, s.arbiters)
    });
    let (trainer, arbiters) = arbiters;
    let batch = sys.block_on(async move {
        let got = actix_rt::task::spawn_blocking(move || rx.recv_timeout(DEADLINE))
            .await
            .expect("the waiting task");
        let _ = actix_rt::time::timeout(DEADLINE, trainer.send(StopNodes)).await;
        got
    });
    for a in &arbiters {
        a.stop();
    }
    for a in arbiters {
        a.join().expect("an env worker's thread");
    }
    let batch = batch.expect("a pushed batch within the deadline").expect("a batch");
    assert!(batch.data.contains(MASK_KEY), "a pushed batch is split too");
}
