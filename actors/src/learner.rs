//! Training in the embedded use: a [`Learner`] actor next to the trainer takes
//! every batch, runs a PPO update ([`rollout::learn::Ppo`]) and sends the new
//! weights back (`StoreWeights` + `PushWeights`), until the mean return of the
//! last episodes reaches a target or a frame budget runs out.
//!
//! [`train`] runs the whole thing in an actix `System` of its own, on a thread
//! of its own, and reports progress to a callback on the caller's thread. Every
//! wait is bounded.
//!
//! # Flow
//!
//! * [`Flow::Lockstep`] (the default): the learner asks for each batch
//!   ([`NextBatch`]) after it sent the weights of the previous update, so every
//!   batch is collected with the newest weights. Messages from one actor reach the
//!   trainer in order, so the push always precedes the next `Continue`: a sync run
//!   with a fixed seed is reproducible, whatever the thread timing.
//! * [`Flow::Subscribe`]: the learner [`Subscribe`]s and the trainer starts the
//!   next batch as soon as it yields one, overlapping collection and learning.
//!   Each batch then uses weights one or two updates old (the learner corrects its
//!   probability ratios with the weights that collected the batch), and which
//!   ones depends on timing: faster, not reproducible.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use rollout::checkpoint::{decode_file, encode_file, Checkpoint};
use rollout::learn::{EpisodeTracker, LearnError, Ppo, PpoConfig, PpoState, UpdateStats};
use rollout::{EnvSpec, ExplorationType, PolicyConfig, PolicySpec, Registry, Weights};
use serde::{Deserialize, Serialize};

use crate::checkpoint_file::write_atomic;
use crate::error::CollectError;
use crate::launch::Launcher;
use crate::messages::{NextBatch, PushWeights, StopNodes, StoreWeights, Subscribe, TakeCheckpoint, TrainerEvent};
use crate::trainer::Trainer;
use crate::CollectorBuilder;

/// How batches reach the learner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Flow {
    /// Ask for each batch after pushing the previous update's weights (reproducible in sync mode).
    #[default]
    Lockstep,
    /// Subscribe and overlap collection with learning (weights lag; not reproducible).
    Subscribe,
}

/// Everything [`train`] needs. The defaults reach a mean return of 475 over the
/// last 20 episodes of CartPole-v1.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// The env every node steps.
    pub env: EnvSpec,
    /// The policy: `Linear` or `Mlp` (softmax over discrete actions).
    pub policy: PolicyConfig,
    /// Seed of the run: env seeds, initial policy weights, value network, minibatches.
    pub seed: u64,
    /// Number of nodes.
    pub nodes: usize,
    /// Env workers per node.
    pub envs_per_node: usize,
    /// Frames per batch (one update per batch).
    pub frames_per_batch: usize,
    /// Sync collection (each batch holds a share of every node).
    pub sync: bool,
    /// Where the nodes run.
    pub launcher: Launcher,
    /// The `rollout` binary node processes are started from (`Process`; default: this executable).
    pub node_program: Option<PathBuf>,
    /// How batches reach the learner.
    pub flow: Flow,
    /// PPO's hyper-parameters (its `seed` is replaced by [`Self::seed`]).
    pub ppo: PpoConfig,
    /// Stop once the mean return of the last `window` episodes is at least this.
    pub target: f64,
    /// Episodes the mean covers.
    pub window: usize,
    /// Stop (target not reached) once this many frames were collected.
    pub max_frames: u64,
    /// Longest wait for one batch (and for the nodes to start or stop).
    pub batch_timeout: Duration,
    /// Save a [`TrainCheckpoint`] here every `checkpoint_every` batches (lockstep only).
    pub checkpoint: Option<PathBuf>,
    /// Batches between two checkpoints.
    pub checkpoint_every: u64,
    /// Go on from this [`TrainCheckpoint`] (the rest of the config must be the one
    /// it was taken with); a sync run then continues bit for bit.
    pub resume: Option<PathBuf>,
    /// Serve the run's metrics for Prometheus at `http://ADDR/metrics` (see
    /// [`CollectorBuilder::metrics`]); `None`: off.
    pub metrics: Option<String>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            env: "CartPole-v1".into(),
            policy: PolicyConfig::Mlp { hidden: vec![32, 32] },
            seed: 0,
            nodes: 2,
            envs_per_node: 2,
            frames_per_batch: 2048,
            sync: true,
            launcher: Launcher::Local,
            node_program: None,
            flow: Flow::Lockstep,
            ppo: PpoConfig::default(),
            target: 475.0,
            window: 20,
            max_frames: 500_000,
            batch_timeout: Duration::from_secs(60),
            checkpoint: None,
            checkpoint_every: 10,
            resume: None,
            metrics: None,
        }
    }
}

/// First bytes of a training checkpoint file.
const TRAIN_MAGIC: &[u8; 8] = b"ROLLTRAN";
/// Version of the training checkpoint format.
const TRAIN_FORMAT: u32 = 1;

/// Everything `rollout train --resume` needs: the collector's checkpoint and the
/// learner's own state, taken together between an update and the next batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainCheckpoint {
    /// The collection run.
    pub collector: Checkpoint,
    /// Networks, optimisers and generator of the learner.
    pub ppo: PpoState,
    /// Episode returns so far, with the episodes in progress.
    pub episodes: EpisodeTracker,
    /// Every finished episode's return.
    pub returns: Vec<f64>,
    /// Frames seen.
    pub frames: u64,
    /// Batches seen.
    pub batches: u64,
}

impl TrainCheckpoint {
    /// Writes the checkpoint to `path` atomically (`ROLLTRAN`, format version, MessagePack).
    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        let bytes =
            encode_file(TRAIN_MAGIC, TRAIN_FORMAT, self).map_err(|e| TrainError::CheckpointSave(e.to_string()))?;
        write_atomic(path, &bytes).map_err(|e| TrainError::CheckpointSave(e.to_string()))
    }

    /// Reads a checkpoint [`Self::save`] wrote (a regular file of at most
    /// [`CHECKPOINT_FILE`](crate::bounded_file::CHECKPOINT_FILE)'s limit); every error
    /// names the path.
    pub fn load(path: &Path) -> Result<TrainCheckpoint, TrainError> {
        let err = |why: String| TrainError::Checkpoint(format!("{}: {why}", path.display()));
        let bytes = crate::bounded_file::read_bounded(path, crate::bounded_file::CHECKPOINT_FILE)
            .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        decode_file(TRAIN_MAGIC, TRAIN_FORMAT, &bytes).map_err(|e| err(e.to_string()))
    }
}

/// One progress report, after each batch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Progress {
    /// Batches seen.
    pub batches: u64,
    /// Frames seen.
    pub frames: u64,
    /// Seconds since the first batch was asked for.
    pub seconds: f64,
    /// Frames per second.
    pub fps: f64,
    /// Episodes finished.
    pub episodes: u64,
    /// Mean return of the last `window` episodes (`None` before the first).
    pub mean_return: Option<f64>,
    /// Version of the newest weights sent to the nodes.
    pub weights_version: u64,
    /// The update made on this batch (`None` for the batch that ended the run).
    pub update: Option<UpdateStats>,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrainSummary {
    /// True when the target was reached (false: the frame budget ran out).
    pub reached: bool,
    /// Episodes finished.
    pub episodes: u64,
    /// Frames collected.
    pub frames: u64,
    /// Batches collected.
    pub batches: u64,
    /// Wall-clock seconds of the run (nodes started to nodes stopped).
    pub seconds: f64,
    /// Mean return of the last `window` episodes at the end.
    pub mean_return: Option<f64>,
    /// Best episode return.
    pub best_return: Option<f64>,
    /// Version of the last weights sent.
    pub weights_version: u64,
    /// Every finished episode's return, in order.
    pub returns: Vec<f64>,
    /// The final policy weights.
    #[serde(skip)]
    pub weights: Weights,
}

/// Why training could not run or went wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TrainError {
    /// A bad config, naming the field.
    #[error("invalid `{field}`: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// Collection failed (or could not start).
    #[error(transparent)]
    Collect(#[from] CollectError),
    /// The learner failed.
    #[error(transparent)]
    Learn(#[from] LearnError),
    /// Nothing happened within a deadline.
    #[error("{0}")]
    Timeout(String),
    /// The actor system ended without a result.
    #[error("the training system stopped: {0}")]
    Stopped(String),
    /// A checkpoint to resume from could not be read or does not fit the config.
    #[error("checkpoint {0}")]
    Checkpoint(String),
    /// A checkpoint could not be saved mid-run.
    #[error("saving the checkpoint failed: {0}")]
    CheckpointSave(String),
}

impl TrainError {
    /// True for errors in the config (nothing ran): the CLI's exit status 2.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            TrainError::Config { .. }
                | TrainError::Checkpoint(_)
                | TrainError::Learn(LearnError::Config(_) | LearnError::Unsupported(_) | LearnError::Checkpoint(_))
                | TrainError::Collect(CollectError::Config(_) | CollectError::Env(_) | CollectError::NodeBuild { .. })
        )
    }
}

/// What the learner reports to [`train`]'s caller.
#[derive(Debug)]
enum Report {
    Progress(Progress),
    Done(Result<TrainSummary, TrainError>),
}

/// The learner actor: updates on every batch and sends the weights back.
pub struct Learner {
    trainer: Addr<Trainer>,
    arbiters: Vec<ArbiterHandle>,
    ppo: Ppo,
    episodes: EpisodeTracker,
    returns: Vec<f64>,
    flow: Flow,
    target: f64,
    max_frames: u64,
    batch_timeout: Duration,
    frames: u64,
    batches: u64,
    /// Frames seen before this process (a resumed run), left out of the fps.
    frames_before: u64,
    checkpoint: Option<(PathBuf, u64)>,
    start: Instant,
    last_batch: Instant,
    done: bool,
    report: mpsc::Sender<Report>,
}

impl Learner {
    fn progress(&self, update: Option<UpdateStats>) -> Progress {
        let seconds = self.start.elapsed().as_secs_f64();
        Progress {
            batches: self.batches,
            frames: self.frames,
            seconds,
            fps: if seconds > 0.0 {
                (self.frames - self.frames_before) as f64 / seconds
            } else {
                0.0
            },
            episodes: self.episodes.episodes(),
            mean_return: self.episodes.mean(),
            weights_version: self.ppo.version(),
            update,
        }
    }

    fn ask_next(&mut self, ctx: &mut Context<Self>) {
        let ask = tokio::time::timeout(self.batch_timeout, self.trainer.send(NextBatch));
        let timeout = self.batch_timeout;
        ctx.spawn(actix::fut::wrap_future::<_, Self>(ask).map(move |r, act, ctx| match r {
            Ok(Ok(Ok(Some(c)))) => act.on_batch(c, ctx),
            Ok(Ok(Ok(None))) => act.finish(Err(TrainError::Stopped("the collection ended".into())), ctx),
            Ok(Ok(Err(e))) => act.finish(Err(e.into()), ctx),
            Ok(Err(e)) => act.finish(Err(CollectError::Stopped(e.to_string()).into()), ctx),
            Err(_) => act.finish(
                Err(TrainError::Timeout(format!(
                    "no batch within {:.1} s",
                    timeout.as_secs_f64()
                ))),
                ctx,
            ),
        }));
    }

    fn on_batch(&mut self, c: rollout::machine::Collected, ctx: &mut Context<Self>) {
        if self.done {
            return;
        }
        self.last_batch = Instant::now();
        self.batches += 1;
        self.frames += c.data.numel() as u64;
        match self.episodes.observe(&c.data) {
            Ok(ended) => self.returns.extend(ended),
            Err(e) => return self.finish(Err(e.into()), ctx),
        }
        let reached = self.episodes.window_full() && self.episodes.mean().is_some_and(|m| m >= self.target);
        if reached || self.frames >= self.max_frames {
            let _ = self.report.send(Report::Progress(self.progress(None)));
            return self.finish(Ok(reached), ctx);
        }
        let stats = match self.ppo.update(&c.data, &c.weights_versions) {
            Ok(s) => s,
            Err(e) => return self.finish(Err(e.into()), ctx),
        };
        // One actor's messages reach the trainer in order: the push sends what was
        // stored, and (lockstep) the next request comes after the push.
        self.trainer.do_send(StoreWeights(self.ppo.weights()));
        self.trainer.do_send(PushWeights(None));
        let _ = self.report.send(Report::Progress(self.progress(Some(stats))));
        if let Some((path, every)) = self.checkpoint.clone() {
            if self.batches.is_multiple_of(every) {
                return self.save_checkpoint(path, ctx);
            }
        }
        if self.flow == Flow::Lockstep {
            self.ask_next(ctx);
        }
    }

    /// Takes the collector's checkpoint (after the push, which it therefore holds),
    /// adds the learner's state, writes the file, then asks for the next batch.
    fn save_checkpoint(&mut self, path: PathBuf, ctx: &mut Context<Self>) {
        let timeout = self.batch_timeout;
        let ask = tokio::time::timeout(timeout + timeout, self.trainer.send(TakeCheckpoint { timeout }));
        ctx.spawn(actix::fut::wrap_future::<_, Self>(ask).map(move |r, act, ctx| {
            let collector = match r {
                Ok(Ok(Ok(c))) => *c,
                Ok(Ok(Err(e))) => return act.finish(Err(e.into()), ctx),
                Ok(Err(e)) => return act.finish(Err(TrainError::Stopped(e.to_string())), ctx),
                Err(_) => return act.finish(Err(TrainError::Timeout("the checkpoint did not complete".into())), ctx),
            };
            let c = TrainCheckpoint {
                collector,
                ppo: act.ppo.state(),
                episodes: act.episodes.clone(),
                returns: act.returns.clone(),
                frames: act.frames,
                batches: act.batches,
            };
            if let Err(e) = c.save(&path) {
                return act.finish(Err(e), ctx);
            }
            tracing::info!(path = %path.display(), batches = act.batches, "training checkpoint saved");
            act.ask_next(ctx);
        }));
    }

    /// Ends the run: stops the nodes (bounded), reports, stops the system.
    fn finish(&mut self, outcome: Result<bool, TrainError>, ctx: &mut Context<Self>) {
        if self.done {
            return;
        }
        self.done = true;
        let summary = outcome.map(|reached| TrainSummary {
            reached,
            episodes: self.episodes.episodes(),
            frames: self.frames,
            batches: self.batches,
            seconds: self.start.elapsed().as_secs_f64(),
            mean_return: self.episodes.mean(),
            best_return: self.episodes.best(),
            weights_version: self.ppo.version(),
            returns: std::mem::take(&mut self.returns),
            weights: self.ppo.weights(),
        });
        let stop = tokio::time::timeout(self.batch_timeout, self.trainer.send(StopNodes));
        let arbiters = std::mem::take(&mut self.arbiters);
        let report = self.report.clone();
        ctx.spawn(
            async move {
                let stopped = match stop.await {
                    Ok(Ok(Ok(()))) => Ok(()),
                    Ok(Ok(Err(e))) => Err(TrainError::Collect(e)),
                    Ok(Err(e)) => Err(TrainError::Stopped(e.to_string())),
                    Err(_) => Err(TrainError::Timeout("the nodes did not stop in time".into())),
                };
                if let Err(e) = &stopped {
                    tracing::warn!(error = %e, "stopping the nodes");
                }
                let _ = report.send(Report::Done(summary));
                for a in &arbiters {
                    a.stop();
                }
                System::current().stop();
            }
            .into_actor(self),
        );
    }
}

impl Actor for Learner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.start = Instant::now();
        self.last_batch = self.start;
        match self.flow {
            Flow::Lockstep => self.ask_next(ctx),
            Flow::Subscribe => {
                self.trainer.do_send(Subscribe(ctx.address().recipient()));
                let timeout = self.batch_timeout;
                ctx.run_interval(Duration::from_millis(200), move |act, ctx| {
                    if !act.done && act.last_batch.elapsed() > timeout {
                        let e = TrainError::Timeout(format!("no batch within {:.1} s", timeout.as_secs_f64()));
                        act.finish(Err(e), ctx);
                    }
                });
            }
        }
    }
}

impl Handler<TrainerEvent> for Learner {
    type Result = ();

    fn handle(&mut self, ev: TrainerEvent, ctx: &mut Self::Context) {
        match ev {
            TrainerEvent::Batch(c) => self.on_batch(c, ctx),
            TrainerEvent::Finished => self.finish(Err(TrainError::Stopped("the collection ended".into())), ctx),
            TrainerEvent::Failed(e) => self.finish(Err(e.into()), ctx),
        }
    }
}

fn check(config: &TrainConfig) -> Result<(), TrainError> {
    let bad = |field, reason: String| Err(TrainError::Config { field, reason });
    if !config.target.is_finite() {
        return bad("target", format!("{} is not a number", config.target));
    }
    if config.window == 0 {
        return bad("window", "must be at least 1".into());
    }
    if config.max_frames == 0 {
        return bad("max_frames", "must be at least 1".into());
    }
    if config.batch_timeout.is_zero() {
        return bad("batch_timeout", "must be longer than zero".into());
    }
    if config.checkpoint.is_some() && config.flow != Flow::Lockstep {
        return bad(
            "checkpoint",
            "needs the lockstep flow (sync): a subscribed learner has the next batch in flight".into(),
        );
    }
    if config.checkpoint_every == 0 {
        return bad("checkpoint_every", "must be at least 1".into());
    }
    Ok(())
}

/// Trains until the mean return of the last `window` episodes reaches `target`
/// (`Ok` with `reached: true`) or `max_frames` were collected (`reached: false`).
/// Calls `progress` on this thread after every batch. Blocks; every wait is bounded
/// by `batch_timeout` (plus the join timeout of remote nodes at the start).
pub fn train(config: TrainConfig, mut progress: impl FnMut(&Progress)) -> Result<TrainSummary, TrainError> {
    check(&config)?;
    let registry = Registry::with_builtins();
    let probe = registry.make(&config.env).map_err(CollectError::from)?;
    let policy = PolicySpec {
        config: config.policy.clone(),
        exploration: ExplorationType::Random,
        init_seed: config.seed,
        record: true,
    };
    let ppo_cfg = PpoConfig {
        seed: config.seed,
        ..config.ppo.clone()
    };
    // Fails here, on this thread, for a policy or env the learner cannot train.
    let mut ppo = Ppo::new(probe.observation_spec(), probe.action_spec(), &policy, ppo_cfg)?;
    let resumed = match &config.resume {
        Some(path) => {
            let c = TrainCheckpoint::load(path)?;
            ppo.restore(c.ppo.clone())?;
            Some(c)
        }
        None => None,
    };
    let mut builder = CollectorBuilder::default()
        .env(config.env.clone())
        .policy(policy)
        .nodes(config.nodes)
        .envs_per_node(config.envs_per_node)
        .frames_per_batch(config.frames_per_batch)
        .endless()
        .sync(config.sync)
        .seed(config.seed)
        .launcher(config.launcher.clone())
        .batch_timeout(config.batch_timeout)
        .join_timeout(config.batch_timeout);
    if let Some(p) = &config.node_program {
        builder = builder.node_program(p.clone());
    }
    if let Some(addr) = &config.metrics {
        builder = builder.metrics(addr.clone());
    }
    let (episodes, returns, frames, batches) = match resumed {
        Some(c) => {
            // Checked here, on this thread: a checkpoint of another run is bad input.
            let envs = vec![config.envs_per_node; config.nodes];
            c.collector
                .check_fits(config.sync, config.frames_per_batch, &envs, None)
                .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
            builder = builder.resume(c.collector);
            if c.episodes.window_len() != config.window {
                return Err(TrainError::Config {
                    field: "window",
                    reason: format!("is {}, the checkpoint has {}", config.window, c.episodes.window_len()),
                });
            }
            (c.episodes, c.returns, c.frames, c.batches)
        }
        None => (EpisodeTracker::new(config.window), Vec::new(), 0, 0),
    };
    let checkpoint = config.checkpoint.clone().map(|p| (p, config.checkpoint_every));
    // Validate on this thread too: a bad config is an error before any thread starts.
    builder.plan_specs()?;

    let (tx, rx) = mpsc::channel::<Report>();
    let (sys_tx, sys_rx) = mpsc::channel::<System>();
    let timeout = config.batch_timeout;
    let (flow, target, max_frames) = (config.flow, config.target, config.max_frames);
    let thread = std::thread::Builder::new()
        .name("rollout-train".into())
        .spawn(move || {
            let sys = System::new();
            let _ = sys_tx.send(System::current());
            let report = tx.clone();
            let started = sys.block_on(async move {
                let e = builder.start_embedded().await?;
                let now = Instant::now();
                Learner {
                    trainer: e.trainer,
                    arbiters: e.arbiters.iter().map(Arbiter::handle).collect(),
                    ppo,
                    episodes,
                    returns,
                    flow,
                    target,
                    max_frames,
                    batch_timeout: timeout,
                    frames,
                    batches,
                    frames_before: frames,
                    checkpoint,
                    start: now,
                    last_batch: now,
                    done: false,
                    report,
                }
                .start();
                Ok::<_, CollectError>((e.arbiters, e.children, e.metrics))
            });
            // The metrics endpoint serves until the run's system ends.
            let (arbiters, children, _metrics) = match started {
                Ok(v) => v,
                Err(e) => {
                    let _ = tx.send(Report::Done(Err(e.into())));
                    return;
                }
            };
            if let Err(e) = sys.run() {
                tracing::error!(error = %e, "the training system ended with an error");
            }
            for a in &arbiters {
                a.stop();
            }
            for a in arbiters {
                let _ = a.join();
            }
            if let Some(mut c) = children {
                c.reap(Duration::from_secs(5));
            }
        })
        .map_err(|e| TrainError::Stopped(format!("cannot spawn the training thread: {e}")))?;
    let system = sys_rx.recv_timeout(timeout).ok();
    // Remote nodes may take the join timeout to come, then each batch its own.
    let mut wait = timeout + timeout + Duration::from_secs(5);
    let result = loop {
        match rx.recv_timeout(wait) {
            Ok(Report::Progress(p)) => {
                progress(&p);
                wait = timeout + Duration::from_secs(5);
            }
            Ok(Report::Done(r)) => break r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(s) = &system {
                    s.stop();
                }
                break Err(TrainError::Timeout(format!(
                    "the learner reported nothing for {:.1} s",
                    wait.as_secs_f64()
                )));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break Err(TrainError::Stopped("the training thread ended without a result".into()))
            }
        }
    };
    // The system stops right after its last report; join it (bounded by the
    // arbiters' and children's own deadlines).
    let (jtx, jrx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = thread.join();
        let _ = jtx.send(());
    });
    if jrx.recv_timeout(timeout).is_err() {
        tracing::warn!("the training thread did not end in time");
    }
    result
}
