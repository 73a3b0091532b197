//! [`CollectorBuilder`]: every setting of a collector, with torchrl's names and
//! defaults, and the two entry points that validate them and start a run.

use std::path::PathBuf;
use std::time::Duration;

use rollout::checkpoint::Checkpoint;
use rollout::machine::NodeSupervision;
use rollout::node_spec::DEFAULT_WORKER_NICE;
use rollout::supervisor::RestartIntensity;
use rollout::wire::DEFAULT_MAX_FRAME;
use rollout::{EnvSpec, ExplorationType, PolicySpec, Registry};

use super::facade::DistributedCollector;
use super::postproc::Postproc;
use crate::error::CollectError;
use crate::launch::local::{self, Started};
use crate::launch::{config_error, Launcher};
use crate::replay::SharedReplayBuffer;

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

/// What [`CollectorBuilder::on_listening`] calls.
pub type ListeningHook = std::sync::Arc<dyn Fn(std::net::SocketAddr) + Send + Sync>;

/// Builds a [`DistributedCollector`]; torchrl's argument names in snake_case.
///
/// Every setting has a default but `env` and `frames_per_batch`; [`Self::build`] checks
/// them all before anything starts, and a config error names the setting at fault.
///
/// # Examples
///
/// One local node stepping CartPole, two batches of 100 frames:
///
/// ```
/// use rollout_actors::{CollectError, DistributedCollector};
///
/// let mut collector = DistributedCollector::builder()
///     .env("CartPole-v1")
///     .nodes(1)
///     .frames_per_batch(100)
///     .total_frames(200)
///     .seed(7)
///     .build()?;
/// let batch = collector.next_batch()?.expect("the first of two batches");
/// assert_eq!(batch.data.numel(), 100);
/// collector.shutdown()?;
///
/// // A setting that cannot work is refused by name, before any thread starts.
/// let refused = DistributedCollector::builder()
///     .env("CartPole-v1")
///     .frames_per_batch(100)
///     .total_frames(-5)
///     .build();
/// match refused {
///     Err(CollectError::Config(e)) => assert_eq!(e.field, "total_frames"),
///     other => panic!("expected a config error, got {other:?}"),
/// }
/// # Ok::<(), CollectError>(())
/// ```
pub struct CollectorBuilder {
    pub(super) env: Option<EnvSpec>,
    pub(super) node_configs: std::collections::BTreeMap<usize, NodeOverrides>,
    pub(super) registry: Registry,
    pub(super) policy: PolicySpec,
    pub(super) nodes: usize,
    /// `nodes` was called (an elastic run sizes itself by `min_nodes` and `max_nodes`).
    pub(super) nodes_set: bool,
    pub(super) min_nodes: Option<usize>,
    pub(super) max_nodes: Option<usize>,
    pub(super) envs_per_node: usize,
    pub(super) frames_per_batch: Option<usize>,
    pub(super) total_frames: i64,
    pub(super) sync: bool,
    pub(super) seed: Option<u64>,
    pub(super) launcher: Launcher,
    pub(super) update_after_each_batch: bool,
    pub(super) max_weight_update_interval: Option<u64>,
    pub(super) update_interval: Option<u64>,
    pub(super) max_frames_per_traj: Option<u64>,
    pub(super) init_random_frames: u64,
    pub(super) reset_at_each_iter: bool,
    pub(super) nan_is_failure: bool,
    pub(super) split_trajs: bool,
    pub(super) exploration_type: Option<ExplorationType>,
    pub(super) postproc: Option<Box<dyn Postproc>>,
    pub(super) replay_buffer: Option<SharedReplayBuffer>,
    pub(super) batch_timeout: Option<Duration>,
    pub(super) shutdown_timeout: Duration,
    pub(super) listen: String,
    pub(super) on_listening: Option<ListeningHook>,
    pub(super) token: Option<Vec<u8>>,
    pub(super) join_timeout: Duration,
    pub(super) heartbeat: Duration,
    pub(super) heartbeat_timeout: Duration,
    pub(super) handshake_timeout: Duration,
    pub(super) node_program: Option<PathBuf>,
    pub(super) max_frame: usize,
    pub(super) advertise: Option<String>,
    pub(super) restart: RestartIntensity,
    pub(super) worker_nice: i32,
    pub(super) node_supervision: Option<NodeSupervision>,
    pub(super) resume: Option<Checkpoint>,
    pub(super) request_timeout: Option<Duration>,
    pub(super) seed_timeout: Option<Duration>,
    pub(super) update_weights_timeout: Option<Duration>,
    pub(super) snapshot_timeout: Option<Duration>,
    pub(super) continue_timeout: Option<Duration>,
    pub(super) shutdown_ack_timeout: Option<Duration>,
}

/// Default of [`CollectorBuilder::request_timeout`] when `batch_timeout` is at least
/// twice as long: how long a node may take to answer `seed`, `update_weights`,
/// `snapshot` or `restore`.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Default of [`CollectorBuilder::batch_timeout`] when no deadline set asks for more.
pub(crate) const DEFAULT_BATCH_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for CollectorBuilder {
    fn default() -> Self {
        CollectorBuilder {
            env: None,
            node_configs: std::collections::BTreeMap::new(),
            registry: Registry::with_builtins(),
            policy: PolicySpec::default(),
            nodes: 1,
            nodes_set: false,
            min_nodes: None,
            max_nodes: None,
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
            batch_timeout: None,
            shutdown_timeout: Duration::from_secs(10),
            listen: "127.0.0.1:0".into(),
            on_listening: None,
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
            request_timeout: None,
            seed_timeout: None,
            update_weights_timeout: None,
            snapshot_timeout: None,
            continue_timeout: None,
            shutdown_ack_timeout: None,
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
    /// The policy (a [`PolicyConfig`](rollout::PolicyConfig) or a full [`PolicySpec`]).
    pub fn policy(mut self, policy: impl Into<PolicySpec>) -> Self {
        self.policy = policy.into();
        self
    }
    /// Number of nodes (a fixed set; see [`Self::max_nodes`] for nodes that come and go).
    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self.nodes_set = true;
        self
    }
    /// Elastic membership (async, `External` launcher): at most `n` nodes at once. The
    /// run starts once [`Self::min_nodes`] have joined; more join while it runs (each
    /// gets the stored weights, the next seed of the chain and its first `continue` at
    /// once), and nodes leave (`leave`, e.g. `rollout node` stopped by SIGTERM) or are
    /// lost without failing the run: none is restarted or waited for, the others
    /// collect its frames, `total_frames` stays exact and trajectory ids unique. With
    /// no node left the run waits [`Self::join_timeout`] for one, then fails. Replaces
    /// [`Self::nodes`]; node `i`'s settings ([`Self::node_config`]) are slot `i`'s.
    /// No checkpoints: [`DistributedCollector::checkpoint`] and [`Self::resume`] are refused.
    pub fn max_nodes(mut self, n: usize) -> Self {
        self.max_nodes = Some(n);
        self
    }
    /// Elastic membership: nodes that must have joined before the run starts (default 1;
    /// needs [`Self::max_nodes`]).
    pub fn min_nodes(mut self, n: usize) -> Self {
        self.min_nodes = Some(n);
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
    /// Longest wait for one batch before `next_batch` returns an error (default 60 s,
    /// or twice the longest deadline on a node's answer set, if more). Every such
    /// deadline set must be at most half of it (see [`Self::request_timeout`]).
    pub fn batch_timeout(mut self, d: Duration) -> Self {
        self.batch_timeout = Some(d);
        self
    }
    /// Longest wait for the nodes to go down at shutdown (default 10 s).
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }

    // ---- Deadlines on the nodes' answers: past one a node fails as any other node
    // failure (restarted under node supervision, else dropped with the reason: async
    // collection goes on with the others, sync collection fails). Each is at most half
    // of `batch_timeout`, so that a node cut off at its deadline leaves the other half
    // to replace it before the batch is due: unset, it is derived so; set together
    // with a `batch_timeout` it does not fit, `build` refuses the pair.
    /// How long a node may take to answer `seed`, `update_weights`, `snapshot` and
    /// `restore` (default 30 s, or half of [`Self::batch_timeout`] if that is shorter);
    /// [`Self::seed_timeout`], [`Self::update_weights_timeout`] and
    /// [`Self::snapshot_timeout`] set one of them apart.
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = Some(d);
        self
    }
    /// How long a node may take to answer `seed` with `seeded` (default: [`Self::request_timeout`]).
    pub fn seed_timeout(mut self, d: Duration) -> Self {
        self.seed_timeout = Some(d);
        self
    }
    /// How long a node may take to answer `update_weights` with `weights_updated`
    /// (default: [`Self::request_timeout`]).
    pub fn update_weights_timeout(mut self, d: Duration) -> Self {
        self.update_weights_timeout = Some(d);
        self
    }
    /// How long a node may take to answer `snapshot` or `restore` (default: [`Self::request_timeout`]).
    pub fn snapshot_timeout(mut self, d: Duration) -> Self {
        self.snapshot_timeout = Some(d);
        self
    }
    /// How long a node may leave a `Continue` unanswered (default: no limit, since how
    /// long a batch takes depends on the env; `batch_timeout` bounds the consumer's wait).
    pub fn continue_timeout(mut self, d: Duration) -> Self {
        self.continue_timeout = Some(d);
        self
    }
    /// How long a node may take to acknowledge `shutdown` with `down` (default: half of
    /// [`Self::shutdown_timeout`]). Past it the node is closed with a warning and
    /// counts as down: every frame was yielded already, so the shutdown succeeds.
    pub fn shutdown_ack_timeout(mut self, d: Duration) -> Self {
        self.shutdown_ack_timeout = Some(d);
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

    // ---- Node supervision by the trainer (any of these turns it on; the library
    // keeps it off by default: a lost node stays lost. The `rollout` CLI turns it on
    // for remote launchers, 3 restarts within 60 s.)
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
    /// When a failed node cannot be brought back: async collection goes on without it
    /// (`true`) or fails (`false`, the default); turns node supervision on.
    pub fn continue_without_lost_nodes(mut self, on: bool) -> Self {
        self.node_supervision
            .get_or_insert_with(NodeSupervision::default)
            .continue_without_lost_nodes = on;
        self
    }

    /// Address remote nodes join (`Process` and `External` launchers); default
    /// `127.0.0.1:0` (loopback, any free port). Binding other addresses is explicit.
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = addr.into();
        self
    }
    /// Called with the bound address as soon as the listening socket is bound, before
    /// any node joins (`build` returns only once every node joined): how the CLI says
    /// "listening on ADDR" in time for nodes to learn the port of `--listen HOST:0`.
    pub fn on_listening(mut self, f: impl Fn(std::net::SocketAddr) + Send + Sync + 'static) -> Self {
        self.on_listening = Some(std::sync::Arc::new(f));
        self
    }
    /// The shared token remote nodes prove they hold (required for `External`;
    /// `Process` draws a random one when none is given).
    pub fn token(mut self, token: impl Into<Vec<u8>>) -> Self {
        self.token = Some(token.into());
        self
    }
    /// Longest wait for every remote node to join (default 60 s); in an elastic run, for
    /// `min_nodes` to join, and, once no node is left, for one to join.
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
        DistributedCollector::launch(self.prepare()?)
    }

    /// Starts trainer and nodes inside the actix `System` this is called from: the
    /// embedded use. Pull batches with [`NextBatch`](crate::messages::NextBatch) or
    /// [`Subscribe`](crate::messages::Subscribe) an actor of yours. Stop with
    /// [`StopNodes`](crate::messages::StopNodes), then stop and join the returned arbiters.
    pub fn start(self) -> Result<Started, CollectError> {
        let prepared = self.prepare()?;
        if prepared.launcher != Launcher::Local {
            return Err(config_error(
                "launcher",
                "start() runs local nodes only; use build() for remote nodes",
            ));
        }
        let p = prepared.plan;
        local::start(p.machine, &p.specs, &p.registry, p.seed)
    }
}
