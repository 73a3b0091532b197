//! [`Settings`]: every setting of a collector as the builder recorded it, plain data
//! that `plan` checks and turns into a run. The builder is the only writer, `plan` and
//! `launcher` the only readers.

use std::time::Duration;

use rollout::checkpoint::Checkpoint;
use rollout::machine::NodeSupervision;
use rollout::node_spec::DEFAULT_WORKER_NICE;
use rollout::supervisor::RestartIntensity;
use rollout::wire::DEFAULT_MAX_FRAME;
use rollout::{EnvSpec, ExplorationType, PolicySpec, Registry};

use crate::delivery::Postproc;
use crate::launch::node_command::NodeCommand;
use crate::launch::{Launcher, ListeningHook};
use crate::replay::SharedReplayBuffer;

/// What one node does differently from the others (torchrl's per-collector
/// `collector_kwargs`); `None` keeps the builder's setting.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeOverrides {
    /// The env this node's workers step instead of [`CollectorBuilder::env`](crate::CollectorBuilder::env).
    pub env: Option<EnvSpec>,
    /// This node's env workers instead of [`CollectorBuilder::envs_per_node`](crate::CollectorBuilder::envs_per_node).
    pub envs_per_node: Option<usize>,
    /// This node's exploration instead of [`CollectorBuilder::exploration_type`](crate::CollectorBuilder::exploration_type).
    pub exploration_type: Option<ExplorationType>,
}

/// Every setting of a collector, torchrl's defaults where it has them (see
/// [`CollectorBuilder`](crate::CollectorBuilder) for what each means).
pub(super) struct Settings {
    pub(super) env: Option<EnvSpec>,
    /// The env's specs, declared (for an env the trainer cannot build).
    pub(super) env_specs: Option<rollout::space::EnvSpecs>,
    pub(super) node_configs: std::collections::BTreeMap<usize, NodeOverrides>,
    pub(super) registry: Registry,
    pub(super) policy: PolicySpec,
    pub(super) nodes: usize,
    /// `nodes` was called (an elastic run sizes itself by `min_nodes` and `max_nodes`).
    pub(super) nodes_set: bool,
    pub(super) min_nodes: Option<usize>,
    pub(super) max_nodes: Option<usize>,
    pub(super) envs_per_node: usize,
    pub(super) envs_per_worker: usize,
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
    pub(super) allow_nonfinite_weights: bool,
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
    pub(super) node_command: Option<NodeCommand>,
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
    pub(super) metrics: Option<String>,
    pub(super) metrics_linger: Duration,
    /// Where the run counts, once its endpoint serves (set by the builder).
    pub(super) run_metrics: Option<crate::metrics::RunMetrics>,
}

/// Default of [`CollectorBuilder::request_timeout`](crate::CollectorBuilder::request_timeout)
/// when `batch_timeout` is at least twice as long: how long a node may take to answer
/// `seed`, `update_weights`, `snapshot` or `restore`.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Default of [`CollectorBuilder::batch_timeout`](crate::CollectorBuilder::batch_timeout)
/// when no deadline set asks for more.
pub(crate) const DEFAULT_BATCH_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for Settings {
    fn default() -> Self {
        Settings {
            env: None,
            env_specs: None,
            node_configs: std::collections::BTreeMap::new(),
            registry: Registry::with_builtins(),
            policy: PolicySpec::default(),
            nodes: 1,
            nodes_set: false,
            min_nodes: None,
            max_nodes: None,
            envs_per_node: 1,
            envs_per_worker: 1,
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
            allow_nonfinite_weights: false,
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
            node_command: None,
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
            metrics: None,
            metrics_linger: Duration::ZERO,
            run_metrics: None,
        }
    }
}
