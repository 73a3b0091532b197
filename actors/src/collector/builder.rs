//! [`CollectorBuilder`]: every setting of a collector, with torchrl's names and
//! defaults, and the two entry points that validate them and start a run.

use std::path::PathBuf;
use std::time::Duration;

use rollout::checkpoint::Checkpoint;
use rollout::machine::{NodeSupervision, TrainerConfig};
use rollout::node_spec::NodeSpec;
use rollout::{EnvSpec, ExplorationType, PolicySpec, Registry};

use super::embedded::{self, Embedded};
use super::facade::DistributedCollector;
use super::plan::Plan;
use super::settings::{NodeOverrides, Settings};
use crate::delivery::Postproc;
use crate::error::CollectError;
use crate::launch::local::{self, Started};
use crate::launch::{config_error, Launcher};
use crate::metrics::{MetricsServer, RunMetrics};
use crate::replay::SharedReplayBuffer;

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
#[derive(Default)]
pub struct CollectorBuilder {
    settings: Settings,
}

impl CollectorBuilder {
    /// What the builder recorded, for the plan's unit tests.
    #[cfg(test)]
    pub(super) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The env every node steps: a registered name, or an [`EnvSpec`] with a config.
    /// With the External, Process or Slurm launcher it may be an env only the nodes
    /// know (not in this builder's registry): the first node to be ready reports its
    /// specs, every other node must report the same, and the policy's version 0 is
    /// built from them then (or from [`Self::env_spec`], when declared).
    pub fn env(mut self, env: impl Into<EnvSpec>) -> Self {
        self.settings.run.env = Some(env.into());
        self
    }
    /// Declares the env's observation and action spaces: the layout of every batch and
    /// the policy's version 0 are built from them up front, and every node's `ready`
    /// must report equal specs. For an env the registry builds, they must be its own.
    /// Refused by [`Self::build`] naming `env_spec` and the key when they cannot be
    /// collected.
    pub fn env_spec(mut self, specs: rollout::space::EnvSpecs) -> Self {
        self.settings.run.env_specs = Some(specs);
        self
    }
    /// Node `node` runs with these overrides (heterogeneous nodes, torchrl's per-node
    /// `collector_kwargs`); a later call for the same node replaces an earlier one.
    /// Async collection accepts nodes whose batches differ in layout (each batch has
    /// its node's); sync collection stacks shares, so every node's layout and env
    /// count must then agree, which [`Self::build`] checks, naming `node_config`.
    pub fn node_config(mut self, node: usize, overrides: NodeOverrides) -> Self {
        self.settings.run.node_configs.insert(node, overrides);
        self
    }
    /// [`Self::node_config`] for nodes `0..overrides.len()`.
    pub fn node_configs(mut self, overrides: Vec<NodeOverrides>) -> Self {
        for (i, o) in overrides.into_iter().enumerate() {
            self.settings.run.node_configs.insert(i, o);
        }
        self
    }
    /// The registry envs are built from (to use envs of your own).
    pub fn registry(mut self, registry: Registry) -> Self {
        self.settings.registry = registry;
        self
    }
    /// The policy (a [`PolicyConfig`](rollout::PolicyConfig) or a full [`PolicySpec`]).
    pub fn policy(mut self, policy: impl Into<PolicySpec>) -> Self {
        self.settings.run.policy = policy.into();
        self
    }
    /// Number of nodes (a fixed set; see [`Self::max_nodes`] for nodes that come and go).
    pub fn nodes(mut self, n: usize) -> Self {
        self.settings.nodes = n;
        self.settings.nodes_set = true;
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
        self.settings.max_nodes = Some(n);
        self
    }
    /// Elastic membership: nodes that must have joined before the run starts (default 1;
    /// needs [`Self::max_nodes`]).
    pub fn min_nodes(mut self, n: usize) -> Self {
        self.settings.min_nodes = Some(n);
        self
    }
    /// Envs per node (torchrl's `num_workers_per_collector`): the rows of each node's
    /// batches.
    pub fn envs_per_node(mut self, k: usize) -> Self {
        self.settings.run.envs_per_node = k;
        self
    }
    /// Envs each env worker (a thread) steps together, with one policy call per step on
    /// their observations: a network is evaluated on a batch, which is what makes a
    /// real-sized policy fast (default 1; must divide every node's envs). torchrl's
    /// equivalent is a batched env per worker. Frames are the same for any value with a
    /// deterministic policy; a sampling policy draws from one stream per worker.
    pub fn envs_per_worker(mut self, k: usize) -> Self {
        self.settings.run.envs_per_worker = k;
        self
    }
    /// Frames per yielded batch (required).
    pub fn frames_per_batch(mut self, f: usize) -> Self {
        self.settings.run.frames_per_batch = Some(f);
        self
    }
    /// Frames to yield in all; `-1` (torchrl's convention) collects until shutdown.
    pub fn total_frames(mut self, t: i64) -> Self {
        self.settings.run.total_frames = t;
        self
    }
    /// Collect until shutdown (same as `total_frames(-1)`).
    pub fn endless(self) -> Self {
        self.total_frames(-1)
    }
    /// Sync (every batch stacks a share of every node) or async (first ready, first served).
    pub fn sync(mut self, sync: bool) -> Self {
        self.settings.run.sync = sync;
        self
    }
    /// Seed of the run; without one a seed is drawn from the clock.
    pub fn seed(mut self, seed: u64) -> Self {
        self.settings.seed = Some(seed);
        self
    }
    /// Where the nodes run.
    pub fn launcher(mut self, launcher: Launcher) -> Self {
        self.settings.launcher = launcher;
        self
    }
    /// Push stored weights before each collection (sync: all; async: the node that delivered).
    pub fn update_after_each_batch(mut self, on: bool) -> Self {
        self.settings.run.update_after_each_batch = on;
        self
    }
    /// Update a node that produced more than `n` batches since its last update.
    pub fn max_weight_update_interval(mut self, n: u64) -> Self {
        self.settings.run.max_weight_update_interval = Some(n);
        self
    }
    /// Push stored weights to all nodes every `n` yielded batches.
    pub fn update_interval(mut self, n: u64) -> Self {
        self.settings.run.update_interval = Some(n);
        self
    }
    /// Async: a batch whose weights are more than `n` versions behind the stored ones
    /// when it would be yielded is dropped (counted in the stats and the metrics), and
    /// its node is sent the stored weights and asked again (unless it is collecting its
    /// next batch already, or the run is shutting down); `total_frames` counts
    /// delivered frames only. Sync runs refuse it.
    pub fn max_policy_lag(mut self, n: u64) -> Self {
        self.settings.run.max_policy_lag = Some(n);
        self
    }
    /// Deliver batches past [`Self::max_policy_lag`] flagged
    /// ([`Collected::lagging`](rollout::machine::Collected::lagging)) instead of dropping them.
    pub fn deliver_lagging(mut self, on: bool) -> Self {
        self.settings.run.deliver_lagging = on;
        self
    }
    /// Async: each node collects up to `n` batches ahead of the consumer (0, the
    /// default, is torchrl's semantics: a node goes on once its batch is taken), at
    /// most [`MAX_PREFETCH`](rollout::machine::MAX_PREFETCH). Ahead, a batch is
    /// collected with older weights: its `policy_lag` says by how much.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.settings.run.prefetch = n;
        self
    }
    /// Multi-agent envs: end an episode once any agent is done (torchrl's
    /// `PettingZooWrapper(done_on_any=True)`), not once every agent is (the default);
    /// the env's flags follow the same rule. Needs nodes of protocol version 12.
    pub fn done_on_any(mut self, on: bool) -> Self {
        self.settings.run.done_on_any = on;
        self
    }
    /// Truncate trajectories longer than this.
    pub fn max_frames_per_traj(mut self, n: u64) -> Self {
        self.settings.run.max_frames_per_traj = Some(n);
        self
    }
    /// Frames stepped with a random policy first (split evenly over all env workers).
    pub fn init_random_frames(mut self, n: u64) -> Self {
        self.settings.run.init_random_frames = n;
        self
    }
    /// Start each batch with fresh episodes.
    pub fn reset_at_each_iter(mut self, on: bool) -> Self {
        self.settings.run.reset_at_each_iter = on;
        self
    }
    /// Treat a NaN in an observation as a failure of the env worker (restarted as any
    /// other failure) instead of collecting it.
    pub fn nan_is_failure(mut self, on: bool) -> Self {
        self.settings.run.nan_is_failure = on;
        self
    }
    /// Store (and push) weights holding NaN or infinity. Off by default: such weights
    /// are refused before they are stored, a [`CollectError::Config`](crate::CollectError::Config)
    /// on `weights` naming the tensor and its first bad element, and the run goes on
    /// with the weights it has.
    pub fn allow_nonfinite_weights(mut self, on: bool) -> Self {
        self.settings.allow_nonfinite_weights = on;
        self
    }
    /// Yield batches split into trajectories (`[n_traj, max_len]` with `collector.mask`),
    /// on every start path (`build`, `start`, `start_embedded`; pulled or pushed).
    pub fn split_trajs(mut self, on: bool) -> Self {
        self.settings.split_trajs = on;
        self
    }
    /// Deterministic (mode) or random (sampled) actions.
    pub fn exploration_type(mut self, e: ExplorationType) -> Self {
        self.settings.run.exploration_type = Some(e);
        self
    }
    /// Whether batches carry what the policy records beside its actions
    /// (`action_log_prob` and its distribution's parameters: `logits`, `loc` and
    /// `scale`, or a Q-value actor's `action_value` and `chosen_action_value`). Unset:
    /// recorded when a node samples its actions (`ExplorationType::Random`), left out
    /// when it acts deterministically, which costs the loop nothing for them.
    pub fn record(mut self, on: bool) -> Self {
        self.settings.run.record = Some(on);
        self
    }
    /// A transformation applied to every yielded batch (after `split_trajs`), on every
    /// start path; when it fails, the consumer gets [`CollectError::Postproc`] instead.
    pub fn postproc(mut self, p: impl Postproc + 'static) -> Self {
        self.settings.postproc = Some(Box::new(p));
        self
    }
    /// Every batch goes into `buffer` (after `postproc`, its batch dims flattened to
    /// frames) instead of to the caller, as torchrl's collectors do with a
    /// `replay_buffer`: [`DistributedCollector::next_batch`] then returns the batch's
    /// metadata (index, node, weights versions) with `data` holding no entry, only
    /// the batch shape, so `data.numel()` still counts its frames. A learner samples
    /// from the same buffer meanwhile. Not with `split_trajs` (padding is no frame).
    /// Applies on every start path: an embedded run's `NextBatch` answers and its
    /// subscriber's batches are such metadata too.
    pub fn replay_buffer(mut self, buffer: SharedReplayBuffer) -> Self {
        self.settings.replay_buffer = Some(buffer);
        self
    }
    /// Longest wait for one batch (default 60 s, or twice the longest deadline on a
    /// node's answer set, if more): past it `next_batch`, an embedded run's `NextBatch`,
    /// or (push mode) the subscriber's next event is an error (collection goes on): the
    /// failure of a node cut off from the run and not back, naming it, the cause and how
    /// long it was waited for, or else [`CollectError::Timeout`]. Every deadline on a
    /// node's answer set must be at most half of it (see [`Self::request_timeout`]).
    pub fn batch_timeout(mut self, d: Duration) -> Self {
        self.settings.batch_timeout = Some(d);
        self
    }
    /// Longest wait for the nodes to go down at shutdown (default 10 s).
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.settings.shutdown_timeout = d;
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
        self.settings.request_timeout = Some(d);
        self
    }
    /// How long a node may take to answer `seed` with `seeded` (default: [`Self::request_timeout`]).
    pub fn seed_timeout(mut self, d: Duration) -> Self {
        self.settings.seed_timeout = Some(d);
        self
    }
    /// How long a node may take to answer `update_weights` with `weights_updated`
    /// (default: [`Self::request_timeout`]).
    pub fn update_weights_timeout(mut self, d: Duration) -> Self {
        self.settings.update_weights_timeout = Some(d);
        self
    }
    /// How long a node may take to answer `snapshot` or `restore` (default: [`Self::request_timeout`]).
    pub fn snapshot_timeout(mut self, d: Duration) -> Self {
        self.settings.snapshot_timeout = Some(d);
        self
    }
    /// How long a node may leave a `Continue` unanswered (default: no limit, since how
    /// long a batch takes depends on the env; `batch_timeout` bounds the consumer's wait).
    pub fn continue_timeout(mut self, d: Duration) -> Self {
        self.settings.continue_timeout = Some(d);
        self
    }
    /// How long a node may take to acknowledge `shutdown` with `down` (default: half of
    /// [`Self::shutdown_timeout`]). Past it the node is closed with a warning and
    /// counts as down: every frame was yielded already, so the shutdown succeeds.
    pub fn shutdown_ack_timeout(mut self, d: Duration) -> Self {
        self.settings.shutdown_ack_timeout = Some(d);
        self
    }
    /// Restarts of one env worker a node allows within [`Self::restart_window`] before
    /// it fails (default 5; 0: the first failure fails the node).
    pub fn max_restarts(mut self, n: u32) -> Self {
        self.settings.run.restart.max_restarts = n;
        self
    }
    /// The window [`Self::max_restarts`] counts in (default 5 s; must be longer than zero).
    pub fn restart_window(mut self, d: Duration) -> Self {
        self.settings.run.restart.window = d;
        self
    }
    /// How much lower than every other thread of its process each env worker's thread
    /// runs, as a Unix nice increment in `0..=19` (default 10; 0: the same). Workers
    /// step envs flat out; the trainer, the nodes and their connections are what the
    /// workers wait on, so when the cores are all busy those should run first (see
    /// BENCHMARKS.md for what it is worth with process nodes), and heartbeats stay on
    /// time under load. Applies to every node, remote ones too.
    pub fn worker_nice(mut self, n: i32) -> Self {
        self.settings.run.worker_nice = n;
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
        self.settings
            .node_supervision
            .get_or_insert_with(NodeSupervision::default)
            .intensity
            .max_restarts = n;
        self
    }
    /// The window [`Self::node_max_restarts`] counts in (default 5 s); turns node supervision on.
    pub fn node_restart_window(mut self, d: Duration) -> Self {
        self.settings
            .node_supervision
            .get_or_insert_with(NodeSupervision::default)
            .intensity
            .window = d;
        self
    }
    /// When a failed node cannot be brought back: async collection goes on without it
    /// (`true`) or fails (`false`, the default); turns node supervision on.
    pub fn continue_without_lost_nodes(mut self, on: bool) -> Self {
        self.settings
            .node_supervision
            .get_or_insert_with(NodeSupervision::default)
            .continue_without_lost_nodes = on;
        self
    }

    /// Serves the run's metrics in Prometheus' text format at `http://ADDR/metrics`
    /// (`HOST:PORT`; port 0 picks a free one, see
    /// [`DistributedCollector::metrics_addr`]). Off by default; bind `127.0.0.1`
    /// unless the scraper is on another host. See [`crate::metrics`] for what is served.
    pub fn metrics(mut self, addr: impl Into<String>) -> Self {
        self.settings.metrics = Some(addr.into());
        self
    }

    /// At shutdown, waits up to `limit` for one more scrape of [`Self::metrics`], so
    /// the scraper records the run's final values (default 0: no wait).
    pub fn metrics_linger(mut self, limit: Duration) -> Self {
        self.settings.metrics_linger = limit;
        self
    }

    /// Address remote nodes join (`Process` and `External` launchers); default
    /// `127.0.0.1:0` (loopback, any free port). Binding other addresses is explicit.
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.settings.listen = addr.into();
        self
    }
    /// Called with the bound address as soon as the listening socket is bound, before
    /// any node joins (`build` returns only once every node joined): how the CLI says
    /// "listening on ADDR" in time for nodes to learn the port of `--listen HOST:0`.
    pub fn on_listening(mut self, f: impl Fn(std::net::SocketAddr) + Send + Sync + 'static) -> Self {
        self.settings.on_listening = Some(std::sync::Arc::new(f));
        self
    }
    /// The shared token remote nodes prove they hold (required for `External`;
    /// `Process` draws a random one when none is given).
    pub fn token(mut self, token: impl Into<Vec<u8>>) -> Self {
        self.settings.token = Some(token.into());
        self
    }
    /// TLS on every node's link: the trainer's certificate chain (PEM, leaf first).
    /// With [`Self::tls_key`]; nodes then verify it (`rollout node --tls-ca`), and the
    /// token login runs inside the encrypted link. Files are read when the run is built.
    pub fn tls_cert(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.settings.tls.cert = Some(path.into());
        self
    }
    /// The private key (PEM) of [`Self::tls_cert`].
    pub fn tls_key(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.settings.tls.key = Some(path.into());
        self
    }
    /// Mutual TLS: nodes must show a certificate signed by one of these CAs (PEM).
    pub fn tls_client_ca(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.settings.tls.client_ca = Some(path.into());
        self
    }
    /// For the nodes this trainer starts (`Process`, `Slurm`): the CA (PEM) they check
    /// the trainer's certificate against (`--tls-ca`); required with `tls_cert` there.
    pub fn tls_ca(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.settings.tls.ca = Some(path.into());
        self
    }
    /// For the nodes this trainer starts: the name the trainer's certificate must
    /// hold (`--tls-server-name`; default: the host they dial).
    pub fn tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.settings.tls.server_name = Some(name.into());
        self
    }
    /// For the nodes this trainer starts, under mutual TLS: their certificate (PEM).
    pub fn node_tls_cert(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.settings.tls.node_cert = Some(path.into());
        self
    }
    /// For the nodes this trainer starts, under mutual TLS: their private key (PEM).
    pub fn node_tls_key(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.settings.tls.node_key = Some(path.into());
        self
    }
    /// Longest wait for every remote node to join (default 60 s); in an elastic run, for
    /// `min_nodes` to join, and, once no node is left, for one to join.
    pub fn join_timeout(mut self, d: Duration) -> Self {
        self.settings.join_timeout = d;
        self
    }
    /// Heartbeat interval, and the silence after which a remote peer is gone
    /// (defaults 1 s and 5 s).
    pub fn heartbeat(mut self, interval: Duration, timeout: Duration) -> Self {
        self.settings.heartbeat = interval;
        self.settings.heartbeat_timeout = timeout;
        self
    }
    /// Longest a connecting node may take over its handshake (default 5 s).
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.settings.handshake_timeout = d;
        self
    }
    /// The `rollout` binary (or one serving `node --join` as it does) whose `node`
    /// subcommand the `Process` and `Slurm` launchers run (default: this executable).
    /// The same as `node_command([path, "node"])`; the last of the two set wins.
    pub fn node_program(mut self, path: impl Into<PathBuf>) -> Self {
        self.settings.node_command = Some(crate::launch::node_command::NodeCommand::rollout(path));
        self
    }
    /// The command the `Process` and `Slurm` launchers run to start a node: the program,
    /// then its arguments, e.g. `["python", "-m", "rollout_node"]`; run as given (no
    /// shell), then `--join ADDR --index I --name NAME` and, for SLURM tasks,
    /// `--token-file PATH` are appended (child processes get the token in
    /// `ROLLOUT_TOKEN`). Default: `rollout node` (see `node_program`). A command that
    /// cannot be started is a config error naming `node_command`.
    pub fn node_command<I, S>(mut self, argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString>,
    {
        self.settings.node_command = Some(crate::launch::node_command::NodeCommand::new(
            argv.into_iter().map(Into::into).collect(),
        ));
        self
    }
    /// Largest frame body sent or accepted over TCP (default 256 MiB). With remote
    /// nodes, `build()` refuses a policy whose weight updates, or batches whose
    /// tensors, would not fit.
    pub fn max_frame(mut self, bytes: usize) -> Self {
        self.settings.run.max_frame = bytes;
        self
    }

    /// The address remote nodes dial, `HOST:PORT` or `HOST` (the bound `listen` port is
    /// used then, as for `HOST:0`). Required by the `Slurm` launcher, whose tasks run on
    /// other machines: `listen` must then be an address they can reach (e.g. `0.0.0.0:0`).
    pub fn advertise(mut self, addr: impl Into<String>) -> Self {
        self.settings.advertise = Some(addr.into());
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
        self.settings.resume = Some(checkpoint);
        self
    }

    /// What [`Self::build`] and [`Self::start`] would run, without starting anything:
    /// the trainer's config, one [`NodeSpec`] per node (trajectory-id lanes, per-worker
    /// frames, node `i`'s workers seeded from `seed + first_lane`, overrides of
    /// [`Self::node_config`] applied) and the run's seed (drawn
    /// from the clock when none was set). Validates the config as `build` does.
    /// Feed these to [`crate::testkit::Cluster`] to replay a run in memory.
    pub fn plan_specs(&self) -> Result<(TrainerConfig, Vec<NodeSpec>, u64), CollectError> {
        self.settings.plan_specs()
    }

    /// Every setting checked and turned into the run every entry point starts, with
    /// its metrics endpoint serving when one was asked for.
    fn into_plan(mut self) -> Result<(Plan, Option<MetricsServer>), CollectError> {
        let served = match self.settings.metrics.take() {
            Some(addr) => Some(
                MetricsServer::start(&addr, RunMetrics::new()).map_err(|e| config_error("metrics", e.to_string()))?,
            ),
            None => None,
        };
        self.settings.run_metrics = served.as_ref().map(|s| s.metrics().clone());
        let mut plan = self.settings.into_plan()?;
        plan.nodes.delivery.metrics = served.as_ref().map(|s| s.metrics().clone());
        Ok((plan, served))
    }

    /// Validates everything, starts the nodes on threads of their own and seeds them.
    pub fn build(self) -> Result<DistributedCollector, CollectError> {
        let linger = self.settings.metrics_linger;
        let (plan, served) = self.into_plan()?;
        let mut c = DistributedCollector::launch(plan)?;
        c.serve_metrics(served, linger);
        Ok(c)
    }

    /// Starts trainer and nodes inside the actix `System` this is called from: the
    /// embedded use. Pull batches with [`NextBatch`](crate::messages::NextBatch) or
    /// [`Subscribe`](crate::messages::Subscribe) an actor of yours. Stop with
    /// [`StopNodes`](crate::messages::StopNodes), then stop and join the returned arbiters.
    pub fn start(self) -> Result<Started, CollectError> {
        if self.settings.metrics.is_some() {
            return Err(config_error(
                "metrics",
                "served by build() and start_embedded(), not start()",
            ));
        }
        let (plan, _) = self.into_plan()?;
        if plan.launcher != Launcher::Local {
            return Err(config_error(
                "launcher",
                "start() runs local nodes only; use build() for remote nodes",
            ));
        }
        local::start(plan.nodes)
    }

    /// [`Self::start`] for the launchers whose nodes the caller can own: local nodes
    /// start at once; for `Process` the node processes are spawned and, as for
    /// `External`, awaited (bounded by `join_timeout`) before the trainer starts.
    /// `Slurm` is refused: its job needs the [`DistributedCollector`]
    /// that ends it. Must run inside an actix `System` (e.g. under `System::block_on`).
    ///
    /// # Examples
    ///
    /// ```
    /// use actix::prelude::*;
    /// use rollout_actors::messages::{NextBatch, StopNodes};
    /// use rollout_actors::CollectorBuilder;
    ///
    /// let arbiters = System::new().block_on(async {
    ///     let run = CollectorBuilder::default()
    ///         .env("CartPole-v1")
    ///         .frames_per_batch(50)
    ///         .total_frames(50)
    ///         .seed(3)
    ///         .start_embedded()
    ///         .await?;
    ///     let batch = run.trainer.send(NextBatch).await??.expect("one batch");
    ///     assert_eq!(batch.data.numel(), 50);
    ///     assert!(run.trainer.send(NextBatch).await??.is_none(), "total_frames reached");
    ///     run.trainer.send(StopNodes).await??;
    ///     Ok::<_, Box<dyn std::error::Error>>(run.arbiters)
    /// })?;
    /// // The owner stops and joins the env workers' threads.
    /// for a in &arbiters {
    ///     a.stop();
    /// }
    /// for a in arbiters {
    ///     a.join().expect("an env worker's thread");
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn start_embedded(self) -> Result<Embedded, CollectError> {
        let (plan, served) = self.into_plan()?;
        let mut run = embedded::start(plan).await?;
        run.metrics = served;
        Ok(run)
    }
}

impl DistributedCollector {
    /// A builder with torchrl's defaults.
    pub fn builder() -> CollectorBuilder {
        CollectorBuilder::default()
    }
}
