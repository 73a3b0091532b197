//! `DistributedCollector`: the facade most users touch.
//!
//! It runs an actix system on a thread of its own (trainer and nodes on its
//! arbiter, one arbiter thread per env worker) and turns the trainer's messages
//! into plain blocking calls, each with a deadline.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use rollout::checkpoint::Checkpoint;
use rollout::machine::{Collected, ConfigError, NodeSupervision, SupervisionStats, TrainerConfig, TrainerMachine};
use rollout::node_spec::{NodeSpec, DEFAULT_WORKER_NICE};
use rollout::postproc;
use rollout::rollout::{batch_layout, layout_difference, BatchLayout, RolloutConfig};
use rollout::supervisor::RestartIntensity;
use rollout::wire::DEFAULT_MAX_FRAME;
use rollout::{EnvSpec, ExplorationType, PolicyConfig, PolicySpec, Registry, TensorDict, Weights};

use crate::block::block_on_timeout;
use crate::error::CollectError;
use crate::launch::process::Children;
use crate::launch::slurm::{self, SlurmJob, SlurmOptions};
use crate::launch::{self, local, Launcher};
use crate::messages::{NextBatch, PushWeights, Recycle, SetSeed, StopNodes, StoreWeights, TakeCheckpoint};
use crate::remote::listener::DoorConfig;
use crate::remote::peer::PeerTiming;
use crate::replay::{self, SharedReplayBuffer};
use crate::trainer::{GetStats, Trainer};

/// A transformation applied to every yielded batch (torchrl's `postproc`), e.g. n-step returns.
pub trait Postproc: Send {
    /// Transforms one batch.
    fn apply(&self, batch: TensorDict) -> Result<TensorDict, String>;
}

impl<F> Postproc for F
where
    F: Fn(TensorDict) -> Result<TensorDict, String> + Send,
{
    fn apply(&self, batch: TensorDict) -> Result<TensorDict, String> {
        self(batch)
    }
}

impl Postproc for postproc::MultiStep {
    fn apply(&self, batch: TensorDict) -> Result<TensorDict, String> {
        postproc::MultiStep::apply(self, &batch).map_err(|e| e.to_string())
    }
}

fn config_err(field: &'static str, reason: impl Into<String>) -> CollectError {
    CollectError::Config(ConfigError {
        field,
        reason: reason.into(),
    })
}

/// What one node does differently from the others (torchrl's per-collector
/// `collector_kwargs`); `None` keeps the builder's setting.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeOverrides {
    /// The env this node's workers step instead of [`CollectorBuilder::env`].
    pub env: Option<EnvSpec>,
    /// This node's env workers instead of [`CollectorBuilder::envs_per_node`].
    pub envs_per_node: Option<usize>,
    /// This node's exploration instead of [`CollectorBuilder::exploration_type`].
    pub exploration_type: Option<ExplorationType>,
}

/// Builds a [`DistributedCollector`]; torchrl's argument names in snake_case.
pub struct CollectorBuilder {
    env: Option<EnvSpec>,
    node_configs: std::collections::BTreeMap<usize, NodeOverrides>,
    registry: Registry,
    policy: PolicySpec,
    nodes: usize,
    envs_per_node: usize,
    frames_per_batch: Option<usize>,
    total_frames: i64,
    sync: bool,
    seed: Option<u64>,
    launcher: Launcher,
    update_after_each_batch: bool,
    max_weight_update_interval: Option<u64>,
    update_interval: Option<u64>,
    max_frames_per_traj: Option<u64>,
    init_random_frames: u64,
    reset_at_each_iter: bool,
    nan_is_failure: bool,
    split_trajs: bool,
    exploration_type: Option<ExplorationType>,
    postproc: Option<Box<dyn Postproc>>,
    replay_buffer: Option<SharedReplayBuffer>,
    batch_timeout: Duration,
    shutdown_timeout: Duration,
    listen: String,
    token: Option<Vec<u8>>,
    join_timeout: Duration,
    heartbeat: Duration,
    heartbeat_timeout: Duration,
    handshake_timeout: Duration,
    node_program: Option<PathBuf>,
    max_frame: usize,
    advertise: Option<String>,
    restart: RestartIntensity,
    worker_nice: i32,
    node_supervision: Option<NodeSupervision>,
    resume: Option<Checkpoint>,
}

impl Default for CollectorBuilder {
    fn default() -> Self {
        CollectorBuilder {
            env: None,
            node_configs: std::collections::BTreeMap::new(),
            registry: Registry::with_builtins(),
            policy: PolicySpec::default(),
            nodes: 1,
            envs_per_node: 1,
            frames_per_batch: None,
            total_frames: -1,
            sync: false,
            seed: None,
            launcher: Launcher::Local,
            update_after_each_batch: false,
            max_weight_update_interval: None,
            update_interval: None,
            max_frames_per_traj: None,
            init_random_frames: 0,
            reset_at_each_iter: false,
            nan_is_failure: false,
            split_trajs: false,
            exploration_type: None,
            postproc: None,
            replay_buffer: None,
            batch_timeout: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(10),
            listen: "127.0.0.1:0".into(),
            token: None,
            join_timeout: Duration::from_secs(60),
            heartbeat: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            node_program: None,
            max_frame: DEFAULT_MAX_FRAME,
            advertise: None,
            restart: RestartIntensity::default(),
            worker_nice: DEFAULT_WORKER_NICE,
            node_supervision: None,
            resume: None,
        }
    }
}

impl CollectorBuilder {
    /// The env every node steps: a registered name, or an [`EnvSpec`] with a config.
    pub fn env(mut self, env: impl Into<EnvSpec>) -> Self {
        self.env = Some(env.into());
        self
    }
    /// Node `node` runs with these overrides (heterogeneous nodes, torchrl's per-node
    /// `collector_kwargs`); a later call for the same node replaces an earlier one.
    /// Async collection accepts nodes whose batches differ in layout (each batch has
    /// its node's); sync collection stacks shares, so every node's layout and env
    /// count must then agree, which [`Self::build`] checks, naming `node_config`.
    pub fn node_config(mut self, node: usize, overrides: NodeOverrides) -> Self {
        self.node_configs.insert(node, overrides);
        self
    }
    /// [`Self::node_config`] for nodes `0..overrides.len()`.
    pub fn node_configs(mut self, overrides: Vec<NodeOverrides>) -> Self {
        for (i, o) in overrides.into_iter().enumerate() {
            self.node_configs.insert(i, o);
        }
        self
    }
    /// The registry envs are built from (to use envs of your own).
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }
    /// The policy (a [`PolicyConfig`] or a full [`PolicySpec`]).
    pub fn policy(mut self, policy: impl Into<PolicySpec>) -> Self {
        self.policy = policy.into();
        self
    }
    /// Number of nodes.
    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self
    }
    /// Env workers per node (torchrl's `num_workers_per_collector`).
    pub fn envs_per_node(mut self, k: usize) -> Self {
        self.envs_per_node = k;
        self
    }
    /// Frames per yielded batch (required).
    pub fn frames_per_batch(mut self, f: usize) -> Self {
        self.frames_per_batch = Some(f);
        self
    }
    /// Frames to yield in all; `-1` (torchrl's convention) collects until shutdown.
    pub fn total_frames(mut self, t: i64) -> Self {
        self.total_frames = t;
        self
    }
    /// Collect until shutdown (same as `total_frames(-1)`).
    pub fn endless(self) -> Self {
        self.total_frames(-1)
    }
    /// Sync (every batch stacks a share of every node) or async (first ready, first served).
    pub fn sync(mut self, sync: bool) -> Self {
        self.sync = sync;
        self
    }
    /// Seed of the run; without one a seed is drawn from the clock.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    /// Where the nodes run.
    pub fn launcher(mut self, launcher: Launcher) -> Self {
        self.launcher = launcher;
        self
    }
    /// Push stored weights before each collection (sync: all; async: the node that delivered).
    pub fn update_after_each_batch(mut self, on: bool) -> Self {
        self.update_after_each_batch = on;
        self
    }
    /// Update a node that produced more than `n` batches since its last update.
    pub fn max_weight_update_interval(mut self, n: u64) -> Self {
        self.max_weight_update_interval = Some(n);
        self
    }
    /// Push stored weights to all nodes every `n` yielded batches.
    pub fn update_interval(mut self, n: u64) -> Self {
        self.update_interval = Some(n);
        self
    }
    /// Truncate trajectories longer than this.
    pub fn max_frames_per_traj(mut self, n: u64) -> Self {
        self.max_frames_per_traj = Some(n);
        self
    }
    /// Frames stepped with a random policy first (split evenly over all env workers).
    pub fn init_random_frames(mut self, n: u64) -> Self {
        self.init_random_frames = n;
        self
    }
    /// Start each batch with fresh episodes.
    pub fn reset_at_each_iter(mut self, on: bool) -> Self {
        self.reset_at_each_iter = on;
        self
    }
    /// Treat a NaN in an observation as a failure of the env worker (restarted as any
    /// other failure) instead of collecting it.
    pub fn nan_is_failure(mut self, on: bool) -> Self {
        self.nan_is_failure = on;
        self
    }
    /// Yield batches split into trajectories (`[n_traj, max_len]` with `collector.mask`).
    pub fn split_trajs(mut self, on: bool) -> Self {
        self.split_trajs = on;
        self
    }
    /// Deterministic (mode) or random (sampled) actions.
    pub fn exploration_type(mut self, e: ExplorationType) -> Self {
        self.exploration_type = Some(e);
        self
    }
    /// A transformation applied to every yielded batch (after `split_trajs`).
    pub fn postproc(mut self, p: impl Postproc + 'static) -> Self {
        self.postproc = Some(Box::new(p));
        self
    }
    /// Every batch goes into `buffer` (after `postproc`, its batch dims flattened to
    /// frames) instead of to the caller, as torchrl's collectors do with a
    /// `replay_buffer`: [`DistributedCollector::next_batch`] then returns the batch's
    /// metadata (index, node, weights versions) with `data` holding no entry, only
    /// the batch shape, so `data.numel()` still counts its frames. A learner samples
    /// from the same buffer meanwhile. Not with `split_trajs` (padding is no frame).
    /// Applies to the blocking collector of [`Self::build`]; embedded runs
    /// ([`Self::start`]) receive whole batches and extend a buffer themselves.
    pub fn replay_buffer(mut self, buffer: SharedReplayBuffer) -> Self {
        self.replay_buffer = Some(buffer);
        self
    }
    /// Longest wait for one batch before `next_batch` returns an error (default 60 s).
    pub fn batch_timeout(mut self, d: Duration) -> Self {
        self.batch_timeout = d;
        self
    }
    /// Longest wait for the nodes to go down at shutdown (default 10 s).
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }
    /// Restarts of one env worker a node allows within [`Self::restart_window`] before
    /// it fails (default 5; 0: the first failure fails the node).
    pub fn max_restarts(mut self, n: u32) -> Self {
        self.restart.max_restarts = n;
        self
    }
    /// The window [`Self::max_restarts`] counts in (default 5 s; must be longer than zero).
    pub fn restart_window(mut self, d: Duration) -> Self {
        self.restart.window = d;
        self
    }
    /// How much lower than every other thread of its process each env worker's thread
    /// runs, as a Unix nice increment in `0..=19` (default 10; 0: the same). Workers
    /// step envs flat out; the trainer, the nodes and their connections are what the
    /// workers wait on, so when the cores are all busy those should run first (see
    /// BENCHMARKS.md for what it is worth with process nodes), and heartbeats stay on
    /// time under load. Applies to every node, remote ones too.
    pub fn worker_nice(mut self, n: i32) -> Self {
        self.worker_nice = n;
        self
    }

    // ---- Node supervision by the trainer (any of these turns it on).
    /// Restarts of one node the trainer allows within [`Self::node_restart_window`]
    /// (default 5 s) before the run fails; turns node supervision on (off by default:
    /// a lost node stays lost). A restarted node gets the current weights, a seed from
    /// (seed, node, restart count) and the work its predecessor lost.
    pub fn node_max_restarts(mut self, n: u32) -> Self {
        self.node_supervision
            .get_or_insert_with(NodeSupervision::default)
            .intensity
            .max_restarts = n;
        self
    }
    /// The window [`Self::node_max_restarts`] counts in (default 5 s); turns node supervision on.
    pub fn node_restart_window(mut self, d: Duration) -> Self {
        self.node_supervision
            .get_or_insert_with(NodeSupervision::default)
            .intensity
            .window = d;
        self
    }
    /// A `Continue` a node leaves unanswered this long counts as its failure (default:
    /// no limit); turns node supervision on.
    pub fn continue_timeout(mut self, d: Duration) -> Self {
        self.node_supervision
            .get_or_insert_with(NodeSupervision::default)
            .continue_timeout = Some(d);
        self
    }
    /// When a failed node cannot be brought back: async collection goes on without it
    /// (`true`) or fails (`false`, the default); turns node supervision on.
    pub fn continue_without_lost_nodes(mut self, on: bool) -> Self {
        self.node_supervision
            .get_or_insert_with(NodeSupervision::default)
            .continue_without_lost_nodes = on;
        self
    }

    /// Starts trainer and nodes inside the actix `System` this is called from: the
    /// embedded use. Pull batches with [`NextBatch`](crate::messages::NextBatch) or
    /// [`Subscribe`](crate::messages::Subscribe) an actor of yours. Stop with
    /// [`StopNodes`](crate::messages::StopNodes), then stop and join the returned arbiters.
    pub fn start(self) -> Result<local::Started, CollectError> {
        let (plan, _) = self.prepare()?;
        plan.start()
    }

    /// Address remote nodes join (`Process` and `External` launchers); default
    /// `127.0.0.1:0` (loopback, any free port). Binding other addresses is explicit.
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = addr.into();
        self
    }
    /// The shared token remote nodes prove they hold (required for `External`;
    /// `Process` draws a random one when none is given).
    pub fn token(mut self, token: impl Into<Vec<u8>>) -> Self {
        self.token = Some(token.into());
        self
    }
    /// Longest wait for every remote node to join (default 60 s).
    pub fn join_timeout(mut self, d: Duration) -> Self {
        self.join_timeout = d;
        self
    }
    /// Heartbeat interval, and the silence after which a remote peer is gone
    /// (defaults 1 s and 5 s).
    pub fn heartbeat(mut self, interval: Duration, timeout: Duration) -> Self {
        self.heartbeat = interval;
        self.heartbeat_timeout = timeout;
        self
    }
    /// Longest a connecting node may take over its handshake (default 5 s).
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.handshake_timeout = d;
        self
    }
    /// The `rollout` binary the `Process` launcher starts (default: this executable).
    pub fn node_program(mut self, path: impl Into<PathBuf>) -> Self {
        self.node_program = Some(path.into());
        self
    }
    /// Largest frame body sent or accepted over TCP (default 256 MiB). With remote
    /// nodes, `build()` refuses a policy whose weight updates, or batches whose
    /// tensors, would not fit.
    pub fn max_frame(mut self, bytes: usize) -> Self {
        self.max_frame = bytes;
        self
    }

    /// The address remote nodes dial, `HOST:PORT` or `HOST` (the bound `listen` port is
    /// used then, as for `HOST:0`). Required by the `Slurm` launcher, whose tasks run on
    /// other machines: `listen` must then be an address they can reach (e.g. `0.0.0.0:0`).
    pub fn advertise(mut self, addr: impl Into<String>) -> Self {
        self.advertise = Some(addr.into());
        self
    }

    /// Goes on from `checkpoint` (taken with [`DistributedCollector::checkpoint`])
    /// instead of starting afresh: frames and batches yielded, weights, every env's
    /// state and generator, episodes in progress. The run must be configured as the
    /// one the checkpoint was taken from (`build` names the first setting that
    /// differs); `total_frames` may grow. The seed is not used: the generators'
    /// positions are in the checkpoint. In sync mode the batches that follow are
    /// bit for bit those the checkpointed run would have yielded next.
    pub fn resume(mut self, checkpoint: Checkpoint) -> Self {
        self.resume = Some(checkpoint);
        self
    }

    /// Validates everything, starts the nodes on threads of their own and seeds them.
    pub fn build(self) -> Result<DistributedCollector, CollectError> {
        let (plan, opts) = self.prepare()?;
        DistributedCollector::launch(plan, opts)
    }

    /// What [`Self::build`] and [`Self::start`] would run, without starting anything:
    /// the trainer's config, one [`NodeSpec`] per node (trajectory-id lanes, per-worker
    /// frames, node `i`'s workers seeded from `seed + first_lane`, overrides of
    /// [`Self::node_config`] applied) and the run's seed (drawn
    /// from the clock when none was set). Validates the config as `build` does.
    /// Feed these to [`crate::testkit::Cluster`] to replay a run in memory.
    pub fn plan_specs(&self) -> Result<(TrainerConfig, Vec<NodeSpec>, u64), CollectError> {
        let env = self
            .env
            .clone()
            .ok_or_else(|| config_err("env", "required: name a registered env"))?;
        let f = self
            .frames_per_batch
            .ok_or_else(|| config_err("frames_per_batch", "required"))?;
        let total_frames = match self.total_frames {
            -1 => None,
            t if t < 0 => return Err(config_err("total_frames", format!("{t}: use -1 for endless"))),
            t => Some(t as u64),
        };
        if !(0..=19).contains(&self.worker_nice) {
            return Err(config_err(
                "worker_nice",
                format!(
                    "{}: must be within 0..=19 (a thread's priority can only be lowered)",
                    self.worker_nice
                ),
            ));
        }
        let n = self.nodes;
        if let Some((&i, _)) = self.node_configs.iter().find(|(&i, _)| i >= n.max(1)) {
            return Err(config_err(
                "node_config",
                format!("node {i} does not exist: there are {n} nodes"),
            ));
        }
        let over = |i: usize| self.node_configs.get(&i).cloned().unwrap_or_default();
        let envs: Vec<EnvSpec> = (0..n).map(|i| over(i).env.unwrap_or_else(|| env.clone())).collect();
        let ks: Vec<usize> = (0..n)
            .map(|i| over(i).envs_per_node.unwrap_or(self.envs_per_node))
            .collect();
        let cfg = TrainerConfig {
            nodes: n,
            envs_per_node: ks.clone(),
            frames_per_batch: f,
            total_frames,
            sync: self.sync,
            update_after_each_batch: self.update_after_each_batch,
            max_weight_update_interval: self.max_weight_update_interval,
            update_interval: self.update_interval,
        };
        if self.sync && self.node_configs.values().any(|o| o.envs_per_node.is_some()) {
            if let Some(i) = ks.iter().position(|&k| k != ks[0]) {
                return Err(config_err(
                    "node_config",
                    format!(
                        "sync collection stacks node shares, but node {i} has {} envs and node 0 has {}",
                        ks[i], ks[0]
                    ),
                ));
            }
        }
        cfg.validate()?;
        let mut policies = Vec::with_capacity(n);
        let mut layouts: Vec<BatchLayout> = Vec::with_capacity(n);
        for (i, env_i) in envs.iter().enumerate() {
            let probe = self.registry.make(env_i).map_err(|e| {
                if self.node_configs.get(&i).is_some_and(|o| o.env.is_some()) {
                    config_err("node_config", format!("node {i}'s env: {e}"))
                } else {
                    CollectError::from(e)
                }
            })?;
            let mut policy = self.policy.clone();
            if let Some(e) = over(i).exploration_type.or(self.exploration_type) {
                policy.exploration = e;
            }
            // Fail at build time, naming the policy, rather than on every node.
            let built = policy
                .build(probe.observation_spec(), probe.action_spec(), 0)
                .map_err(|e| config_err("policy", format!("node {i}: {e}")))?;
            let layout = batch_layout(probe.observation_spec(), probe.action_spec());
            if self.launcher != Launcher::Local {
                self.check_frames_fit(i, built.weights(), &layout, if self.sync { f / n.max(1) } else { f })?;
            }
            policies.push(policy);
            layouts.push(layout);
        }
        if self.sync {
            if let Some(diff) = (1..n).find_map(|i| layout_difference(i, &layouts[i], 0, &layouts[0])) {
                return Err(config_err(
                    "node_config",
                    format!("sync collection stacks node shares, but {diff}"),
                ));
            }
        }
        if self.max_frames_per_traj == Some(0) {
            return Err(config_err("max_frames_per_traj", "must be at least 1"));
        }
        if self.restart.window.as_millis() == 0 {
            return Err(config_err("restart_window", "must be at least 1 ms"));
        }
        let lanes: u64 = ks.iter().map(|&k| k as u64).sum();
        let seed = self.seed.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        let mut specs = Vec::with_capacity(n);
        let mut first_lane = 0u64;
        for (i, ((env_i, policy), &k)) in envs.into_iter().zip(policies).zip(&ks).enumerate() {
            let worker_frames = if self.sync { f / n / k } else { f / k };
            specs.push(NodeSpec {
                index: i,
                env: env_i,
                policy,
                envs_per_node: k,
                first_lane,
                lanes,
                rollout: RolloutConfig {
                    frames_per_batch: worker_frames,
                    max_frames_per_traj: self.max_frames_per_traj,
                    reset_at_each_iter: self.reset_at_each_iter,
                    init_random_frames: self.init_random_frames.div_ceil(lanes),
                    // Node i's workers take the seeds after those of nodes 0..i.
                    seed: seed.wrapping_add(first_lane),
                    nan_is_failure: self.nan_is_failure,
                },
                max_restarts: self.restart.max_restarts,
                restart_window_ms: self.restart.window.as_millis() as u64,
                worker_nice: self.worker_nice,
            });
            first_lane += k as u64;
        }
        Ok((cfg, specs, seed))
    }

    /// Remote node `i`'s frames fit in `max_frame`: its weight updates, and its batches
    /// of `frames` frames (their tensors alone; headers add a few hundred bytes, which
    /// the node reports at run time if they are what tips it over).
    fn check_frames_fit(
        &self,
        i: usize,
        weights: &Weights,
        layout: &BatchLayout,
        frames: usize,
    ) -> Result<(), CollectError> {
        let max = self.max_frame;
        let update = rollout::wire::update_weights_len(weights);
        if update > max {
            return Err(config_err(
                "max_frame",
                format!(
                    "node {i}'s policy has {} parameters: a weight update is a frame of {update} bytes, over \
                     max_frame ({max}); raise max_frame",
                    weights.numel()
                ),
            ));
        }
        let per_frame: usize = layout
            .values()
            .map(|(dtype, dims)| dtype.size().saturating_mul(dims.iter().product()))
            .fold(0, usize::saturating_add);
        let batch = per_frame.saturating_mul(frames);
        if batch > max {
            return Err(config_err(
                "max_frame",
                format!(
                    "node {i}'s batches of {frames} frames hold {batch} bytes of tensors, over max_frame ({max}); \
                     raise max_frame or lower frames_per_batch"
                ),
            ));
        }
        Ok(())
    }

    fn prepare(self) -> Result<(Plan, FacadeOptions), CollectError> {
        if self.batch_timeout.is_zero() {
            return Err(config_err("batch_timeout", "must be longer than zero"));
        }
        if self.replay_buffer.is_some() && self.split_trajs {
            return Err(config_err(
                "replay_buffer",
                "a replay buffer stores frames and split_trajs pads trajectories: use one or the other",
            ));
        }
        let (cfg, specs, seed) = self.plan_specs()?;
        let n = cfg.nodes;
        let mut machine = TrainerMachine::new(cfg)?;
        if let Some(c) = self.resume.clone() {
            machine = machine.with_resume(c)?;
        }
        let remote = match self.launcher {
            Launcher::Local => None,
            Launcher::Process | Launcher::External | Launcher::Slurm(_) => {
                let token = match (&self.token, &self.launcher) {
                    (Some(t), _) if !t.is_empty() => t.clone(),
                    (_, Launcher::Process | Launcher::Slurm(_)) => random_token(),
                    _ => return Err(config_err("token", "required for nodes that join from outside")),
                };
                if self.heartbeat.is_zero() || self.heartbeat_timeout <= self.heartbeat {
                    return Err(config_err("heartbeat", "the timeout must be longer than the interval"));
                }
                if self.max_frame < 1024 {
                    return Err(config_err("max_frame", "must be at least 1024 bytes"));
                }
                let slurm = match &self.launcher {
                    Launcher::Slurm(o) => Some((o.clone(), self.slurm_advertise(o)?)),
                    _ => None,
                };
                let program = match (&self.launcher, &self.node_program) {
                    (Launcher::Process | Launcher::Slurm(_), Some(p)) => Some(p.clone()),
                    (Launcher::Process | Launcher::Slurm(_), None) => Some(
                        std::env::current_exe()
                            .map_err(|e| config_err("node_program", format!("cannot find this executable: {e}")))?,
                    ),
                    _ => None,
                };
                Some(RemotePlan {
                    listen: self.listen.clone(),
                    door: DoorConfig {
                        token,
                        timing: PeerTiming {
                            heartbeat: self.heartbeat,
                            timeout: self.heartbeat_timeout,
                            max_frame: self.max_frame,
                        },
                        handshake_timeout: self.handshake_timeout,
                    },
                    join_timeout: self.join_timeout,
                    program,
                    slurm,
                })
            }
        };
        // Each node's layout is learnt from the node: local::start reads it off the
        // workers it builds; a remote node advertises it in its `Ready`.
        if let Some(sup) = self.node_supervision.clone() {
            if sup.intensity.window.as_millis() == 0 {
                return Err(config_err("node_restart_window", "must be at least 1 ms"));
            }
            if sup.continue_timeout.is_some_and(|t| t.is_zero()) {
                return Err(config_err("continue_timeout", "must be longer than zero"));
            }
            machine = machine.with_supervision(sup);
        }
        let plan = Plan {
            machine,
            specs,
            registry: self.registry,
            seed,
            remote,
        };
        let opts = FacadeOptions {
            batch_timeout: self.batch_timeout,
            shutdown_timeout: self.shutdown_timeout,
            split_trajs: self.split_trajs,
            postproc: self.postproc,
            replay_buffer: self.replay_buffer,
            nodes: n,
        };
        Ok((plan, opts))
    }
}

impl CollectorBuilder {
    /// Checks the `Slurm` launcher's settings; returns the `advertise` address.
    fn slurm_advertise(&self, o: &SlurmOptions) -> Result<String, CollectError> {
        o.validate().map_err(|(field, reason)| config_err(field, reason))?;
        let advertise = match self.advertise.as_deref().map(str::trim) {
            Some(a) if !a.is_empty() && !a.contains(char::is_whitespace) => a.to_string(),
            Some(a) => return Err(config_err("advertise", format!("{a:?} is not HOST[:PORT]"))),
            None => {
                return Err(config_err(
                    "advertise",
                    "required for the Slurm launcher: the HOST[:PORT] its tasks dial",
                ))
            }
        };
        let host = slurm::advertise_host(&advertise);
        let listen_loopback = self.listen.parse::<SocketAddr>().is_ok_and(|l| l.ip().is_loopback());
        let host_loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if listen_loopback && !host_loopback {
            return Err(config_err(
                "listen",
                format!(
                    "{} accepts loopback only but tasks dial {advertise}: listen on 0.0.0.0:0 or that host's address",
                    self.listen
                ),
            ));
        }
        Ok(advertise)
    }
}

/// A validated collector: what to start, before anything is started.
struct Plan {
    machine: TrainerMachine,
    specs: Vec<NodeSpec>,
    registry: Registry,
    seed: u64,
    remote: Option<RemotePlan>,
}

/// How remote nodes come in.
struct RemotePlan {
    listen: String,
    door: DoorConfig,
    join_timeout: Duration,
    /// The binary to start nodes from (`Process`, `Slurm`), or `None` (`External`).
    program: Option<PathBuf>,
    /// The `Slurm` launcher's options and the address its tasks dial.
    slurm: Option<(SlurmOptions, String)>,
}

impl Plan {
    fn start(self) -> Result<local::Started, CollectError> {
        if self.remote.is_some() {
            return Err(config_err(
                "launcher",
                "start() runs local nodes only; use build() for remote nodes",
            ));
        }
        local::start(self.machine, &self.specs, &self.registry, self.seed)
    }
}

/// A random token for nodes this trainer starts itself.
fn random_token() -> Vec<u8> {
    (0..32)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect::<String>()
        .into_bytes()
}

/// What the facade itself does with batches and deadlines.
struct FacadeOptions {
    batch_timeout: Duration,
    shutdown_timeout: Duration,
    split_trajs: bool,
    postproc: Option<Box<dyn Postproc>>,
    replay_buffer: Option<SharedReplayBuffer>,
    nodes: usize,
}

impl DistributedCollector {
    fn launch(mut plan: Plan, opts: FacadeOptions) -> Result<DistributedCollector, CollectError> {
        // Remote nodes: bind here, so the address is known before anything starts.
        let mut listen_addr = None;
        let mut children = None;
        let mut slurm_job = None;
        let mut watch: Option<std::sync::Arc<dyn launch::remote::JoinWatch>> = None;
        let mut remote = None;
        let mut ready_wait = Duration::from_secs(60);
        if let Some(r) = plan.remote.take() {
            let listener = std::net::TcpListener::bind(&r.listen)
                .map_err(|e| config_err("listen", format!("cannot bind {}: {e}", r.listen)))?;
            let addr = listener
                .local_addr()
                .map_err(|e| config_err("listen", format!("cannot read the bound address: {e}")))?;
            listen_addr = Some(addr);
            if let (Some((opts, advertise)), Some(program)) = (&r.slurm, &r.program) {
                let advertise = slurm::advertise_addr(advertise, addr);
                let job = SlurmJob::submit(opts, program, &advertise, &r.door.token, plan.specs.len())
                    .map_err(|e| CollectError::Launch(e.to_string()))?;
                watch = Some(std::sync::Arc::new(job.query()));
                slurm_job = Some(job);
            } else if let Some(program) = &r.program {
                children = Some(std::sync::Arc::new(std::sync::Mutex::new(
                    Children::spawn(program, addr, &r.door.token, plan.specs.len())
                        .map_err(|e| config_err("node_program", format!("cannot start {}: {e}", program.display())))?,
                )));
            }
            ready_wait = r.join_timeout + Duration::from_secs(30);
            remote = Some((listener, r.door, r.join_timeout));
        }
        let (ready_tx, ready_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let restartable = match (&children, &slurm_job) {
            (Some(c), _) => Some(launch::remote::Respawn::Process(std::sync::Arc::clone(c))),
            (None, Some(j)) => Some(launch::remote::Respawn::Slurm(j.resubmitter())),
            _ => None,
        };
        let thread = std::thread::Builder::new()
            .name("rollout-system".into())
            .spawn(move || {
                let sys = System::new();
                let started = sys.block_on(async move {
                    match remote {
                        None => plan.start(),
                        Some((listener, door, join_timeout)) => {
                            launch::remote::start_watched(
                                plan.machine,
                                plan.specs,
                                listener,
                                door,
                                join_timeout,
                                plan.seed,
                                watch,
                                restartable,
                            )
                            .await
                        }
                    }
                });
                let arbiters = match started {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok((s.trainer, System::current())));
                        s.arbiters
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                if let Err(e) = sys.run() {
                    tracing::error!(error = %e, "actix system ended with an error");
                }
                for a in &arbiters {
                    a.stop();
                }
                for a in arbiters {
                    let _ = a.join();
                }
                let _ = done_tx.send(());
            })
            .map_err(|e| CollectError::Stopped(format!("cannot spawn the system thread: {e}")))?;
        let (trainer, system) = match ready_rx.recv_timeout(ready_wait) {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                return Err(CollectError::Timeout {
                    what: "starting the nodes",
                    seconds: ready_wait.as_secs_f64(),
                })
            }
        };
        Ok(DistributedCollector {
            trainer,
            system,
            thread: Some(thread),
            done: done_rx,
            batch_timeout: opts.batch_timeout,
            shutdown_timeout: opts.shutdown_timeout,
            split_trajs: opts.split_trajs,
            postproc: opts.postproc,
            replay_buffer: opts.replay_buffer,
            down: false,
            nodes: opts.nodes,
            listen_addr,
            children,
            slurm_job,
        })
    }
}

/// A running collection: nodes stepping envs, batches on demand.
pub struct DistributedCollector {
    trainer: Addr<Trainer>,
    system: System,
    thread: Option<JoinHandle<()>>,
    done: mpsc::Receiver<()>,
    batch_timeout: Duration,
    shutdown_timeout: Duration,
    split_trajs: bool,
    postproc: Option<Box<dyn Postproc>>,
    replay_buffer: Option<SharedReplayBuffer>,
    down: bool,
    nodes: usize,
    listen_addr: Option<SocketAddr>,
    children: Option<std::sync::Arc<std::sync::Mutex<Children>>>,
    slurm_job: Option<SlurmJob>,
}

impl std::fmt::Debug for DistributedCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedCollector")
            .field("nodes", &self.nodes)
            .field("down", &self.down)
            .finish()
    }
}

impl DistributedCollector {
    /// A builder with torchrl's defaults.
    pub fn builder() -> CollectorBuilder {
        CollectorBuilder::default()
    }

    /// The default policy config, for convenience (`linear`).
    pub fn default_policy() -> PolicyConfig {
        PolicyConfig::Linear
    }

    fn ask<M>(&self, msg: M, what: &'static str, timeout: Duration) -> Result<M::Result, CollectError>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        Trainer: Handler<M>,
    {
        if self.down {
            return Err(CollectError::Stopped("the collector was shut down".into()));
        }
        match block_on_timeout(self.trainer.send(msg), timeout) {
            Some(Ok(r)) => Ok(r),
            Some(Err(e)) => Err(CollectError::Stopped(e.to_string())),
            None => Err(CollectError::Timeout {
                what,
                seconds: timeout.as_secs_f64(),
            }),
        }
    }

    /// The next batch, or `None` once `total_frames` have been yielded. With a
    /// [`CollectorBuilder::replay_buffer`] the frames go into the buffer and the batch
    /// returned carries no entry (its `data` keeps the batch shape).
    pub fn next_batch(&mut self) -> Result<Option<Collected>, CollectError> {
        if self.down {
            return Ok(None);
        }
        let Some(mut c) = self.ask(NextBatch, "collecting a batch", self.batch_timeout)?? else {
            return Ok(None);
        };
        if self.split_trajs {
            c.data = postproc::split_trajectories(&c.data).map_err(|e| CollectError::Postproc(e.to_string()))?;
        }
        if let Some(p) = &self.postproc {
            c.data = p.apply(c.data).map_err(CollectError::Postproc)?;
        }
        if let Some(buffer) = &self.replay_buffer {
            replay::lock(buffer).extend(&c.data)?;
            c.data = TensorDict::new(c.data.batch_size());
        }
        Ok(Some(c))
    }

    /// Stores `weights` as the next version and pushes them to `nodes` (all when `None`).
    /// Returns the new version.
    pub fn update_policy_weights(&mut self, weights: Weights, nodes: Option<&[usize]>) -> Result<u64, CollectError> {
        let v = self.set_policy_weights(weights)?;
        self.push_policy_weights(nodes)?;
        Ok(v)
    }

    /// Stores `weights` as the next version without sending them; the update
    /// options (`update_interval`, ...) or [`Self::push_policy_weights`] deliver them.
    pub fn set_policy_weights(&mut self, weights: Weights) -> Result<u64, CollectError> {
        self.ask(StoreWeights(weights), "storing weights", self.batch_timeout)
    }

    /// Pushes the stored weights to `nodes` (all when `None`).
    pub fn push_policy_weights(&mut self, nodes: Option<&[usize]>) -> Result<(), CollectError> {
        self.ask(
            PushWeights(nodes.map(<[usize]>::to_vec)),
            "pushing weights",
            self.batch_timeout,
        )?
    }

    /// Takes a checkpoint of the whole run: the trainer's state and every node's
    /// (each env's state and generator, episodes in progress, weights). Call it
    /// between batches; it waits until no node has work in flight (async: batches
    /// in flight are received and kept in the checkpoint, to be yielded after a
    /// resume as they would have been). Save it with [`crate::checkpoint_file::save`]
    /// and go on from it with [`CollectorBuilder::resume`]. Fails (and collection
    /// goes on) when a node is down or restarting, or an env or policy cannot be
    /// checkpointed.
    pub fn checkpoint(&mut self) -> Result<Checkpoint, CollectError> {
        let timeout = self.batch_timeout;
        // The reply comes by the machine's own deadline; the ask's is a backstop.
        self.ask(TakeCheckpoint { timeout }, "taking a checkpoint", timeout + timeout)?
            .map(|c| *c)
    }

    /// Reseeds every node (node k gets the seed node k-1 did not use) and returns the next seed.
    pub fn set_seed(&mut self, seed: u64) -> Result<u64, CollectError> {
        self.ask(SetSeed(seed), "seeding the nodes", self.batch_timeout)?
    }

    /// Hands a batch back once you are done with it, so its storage is reused instead
    /// of fresh memory: an in-process node with one env worker collects into it again,
    /// a remote node's connection decodes that node's next batch into it. Async
    /// batches only (a sync batch is a stacked copy; the trainer recycles the nodes'
    /// shares itself). Optional: dropping a batch is fine.
    pub fn recycle(&mut self, batch: Collected) {
        if !self.down && !self.split_trajs && self.postproc.is_none() && self.replay_buffer.is_none() {
            self.trainer.do_send(Recycle {
                node: batch.node,
                data: batch.data,
            });
        }
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Node restarts, late batches dropped and frames collected so far.
    pub fn stats(&self) -> Result<SupervisionStats, CollectError> {
        self.ask(GetStats, "reading the stats", self.batch_timeout)
    }

    /// The address remote nodes join, when they do.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen_addr
    }

    /// Process ids of the node processes this collector started (`Process` launcher).
    pub fn node_pids(&self) -> Vec<u32> {
        self.children
            .as_ref()
            .and_then(|c| c.lock().ok().map(|c| c.pids()))
            .unwrap_or_default()
    }

    /// The id of the SLURM job array running the nodes (`Slurm` launcher); node `i` is
    /// array task `i` (`ID_i`).
    pub fn slurm_job_id(&self) -> Option<&str> {
        self.slurm_job.as_ref().map(SlurmJob::id)
    }

    /// Every SLURM job of the run: the job array, then each single task resubmitted to
    /// restart a node (supervised runs). Empty for other launchers.
    pub fn slurm_job_ids(&self) -> Vec<String> {
        self.slurm_job.as_ref().map(SlurmJob::job_ids).unwrap_or_default()
    }

    /// Stops every node, waits for them (bounded), joins every thread started, and
    /// ends the SLURM job (checking that no task is left). Idempotent.
    pub fn shutdown(&mut self) -> Result<(), CollectError> {
        if self.down {
            return Ok(());
        }
        let r = self.ask(StopNodes, "shutting the nodes down", self.shutdown_timeout);
        self.down = true;
        self.system.stop();
        if let Some(c) = self.children.take() {
            match c.lock() {
                Ok(mut c) => c.reap(self.shutdown_timeout),
                Err(poisoned) => poisoned.into_inner().reap(self.shutdown_timeout),
            }
        }
        let slurm = self.slurm_job.take().map(|mut j| j.shutdown(self.shutdown_timeout));
        let joined = self.done.recv_timeout(self.shutdown_timeout).is_ok();
        if let Some(t) = self.thread.take() {
            if joined {
                let _ = t.join();
            }
        }
        r??;
        if let Some(Err(e)) = slurm {
            return Err(CollectError::Launch(e.to_string()));
        }
        if !joined {
            return Err(CollectError::Timeout {
                what: "joining the collector's threads",
                seconds: self.shutdown_timeout.as_secs_f64(),
            });
        }
        Ok(())
    }
}

impl Iterator for DistributedCollector {
    type Item = Result<Collected, CollectError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch().transpose()
    }
}

impl Drop for DistributedCollector {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "shutdown on drop");
        }
    }
}

/// What [`CollectorBuilder::start_embedded`] started inside the caller's actix `System`.
pub struct Embedded {
    /// The trainer.
    pub trainer: Addr<Trainer>,
    /// One arbiter per local env worker (none for remote nodes); the owner stops and joins them.
    pub arbiters: Vec<Arbiter>,
    /// Node processes of the `Process` launcher; the owner reaps them after the nodes are stopped.
    pub children: Option<Children>,
    /// The address remote nodes joined, when they did.
    pub listen_addr: Option<SocketAddr>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
            .field("arbiters", &self.arbiters.len())
            .field("children", &self.children)
            .field("listen_addr", &self.listen_addr)
            .finish()
    }
}

impl CollectorBuilder {
    /// [`Self::start`] for every launcher: local nodes start at once; for `Process`
    /// the node processes are spawned and, as for `External`, awaited (bounded by
    /// `join_timeout`) before the trainer starts. Must run inside an actix `System`
    /// (e.g. under `System::block_on`).
    pub async fn start_embedded(self) -> Result<Embedded, CollectError> {
        let (mut plan, _) = self.prepare()?;
        let Some(r) = plan.remote.take() else {
            let started = plan.start()?;
            return Ok(Embedded {
                trainer: started.trainer,
                arbiters: started.arbiters,
                children: None,
                listen_addr: None,
            });
        };
        let listener = std::net::TcpListener::bind(&r.listen)
            .map_err(|e| config_err("listen", format!("cannot bind {}: {e}", r.listen)))?;
        let addr = listener
            .local_addr()
            .map_err(|e| config_err("listen", format!("cannot read the bound address: {e}")))?;
        let mut children = match &r.program {
            Some(program) => Some(
                Children::spawn(program, addr, &r.door.token, plan.specs.len())
                    .map_err(|e| config_err("node_program", format!("cannot start {}: {e}", program.display())))?,
            ),
            None => None,
        };
        match launch::remote::start(plan.machine, plan.specs, listener, r.door, r.join_timeout, plan.seed).await {
            Ok(started) => Ok(Embedded {
                trainer: started.trainer,
                arbiters: started.arbiters,
                children,
                listen_addr: Some(addr),
            }),
            Err(e) => {
                if let Some(c) = children.as_mut() {
                    c.reap(Duration::from_secs(1));
                }
                Err(e)
            }
        }
    }
}
