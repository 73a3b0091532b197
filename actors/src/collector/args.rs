//! [`CollectorArgs`]: the collector's plain settings as the two front ends give them,
//! written once. `rollout collect` parses them as flags (the `clap` feature derives
//! [`clap::Args`]: a field's doc comment is its `--help`), the Python module reads them
//! from the keyword arguments of `DistributedCollector` (serde), and
//! [`CollectorArgs::apply`] hands them to the builder, which checks what they mean.
//! A setting a front end spells its own way (the policy, the launcher and its options,
//! the token, the node command, a checkpoint to resume) stays with that front end.
//!
//! A new plain setting is a field here, one line in `apply`, the builder's setter, the
//! Python signature, and the code that uses it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use rollout::space::EnvSpecs;
use rollout::{EnvSpec, ExplorationType};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::builder::CollectorBuilder;
use super::settings::DEFAULT_HEARTBEAT;
use crate::bounded_file::{read_bounded, ENV_SPEC_FILE};
use rollout::machine::ConfigError;

/// The plain settings of a collector; `None` (or `false`) leaves the builder's default.
/// Names are the builder's (torchrl's where torchrl has one), as flags in kebab case.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct CollectorArgs {
    /// Env name: one this binary builds (CartPole-v1, Pendulum-v1, MountainCarContinuous-v0,
    /// Counting), or, with nodes that join over TCP, any env the nodes build.
    #[cfg_attr(feature = "clap", arg(long, default_value = "CartPole-v1"))]
    pub env: Option<String>,
    /// Env config as a JSON object, e.g. '{"max_episode_steps": 200}'.
    #[cfg_attr(feature = "clap", arg(long, value_name = "JSON"))]
    pub env_config: Option<String>,
    /// The env's observation and action spaces, as JSON or @FILE holding JSON, e.g.
    /// '{"observation": {"kind": "box", "dtype": "f64", "shape": [17]}, "action": {"kind":
    /// "discrete", "n": 6}}': batches and the policy's weights are built from them up
    /// front, and every node must report the same. Without it, an env this trainer
    /// cannot build takes the specs of the first node to be ready (not with the local
    /// launcher).
    #[cfg_attr(feature = "clap", arg(long, value_name = "JSON|@FILE"))]
    pub env_spec: Option<String>,
    /// Number of nodes (a fixed set) [default: 1; `rollout collect`: 2].
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub nodes: Option<usize>,
    /// Elastic membership (async, nodes that join over TCP): at most N nodes at once;
    /// nodes join and leave while the run goes on (replaces `nodes`).
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub max_nodes: Option<usize>,
    /// Elastic membership: nodes that must have joined before the run starts
    /// [default: 1]; needs `max_nodes`.
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub min_nodes: Option<usize>,
    /// Envs per node (the rows of its batches) [default: 1].
    #[cfg_attr(feature = "clap", arg(long, value_name = "E"))]
    pub envs_per_node: Option<usize>,
    /// Envs each env worker (a thread) steps together, one policy call per step on their
    /// observations; must divide `envs_per_node` [default: 1].
    #[cfg_attr(feature = "clap", arg(long, value_name = "K"))]
    pub envs_per_worker: Option<usize>,
    /// Frames per yielded batch.
    #[cfg_attr(feature = "clap", arg(long, value_name = "F", default_value = "1000"))]
    pub frames_per_batch: Option<usize>,
    /// Frames to collect in all; -1 collects until stopped.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "T", default_value = "10000", allow_negative_numbers = true)
    )]
    pub total_frames: Option<i64>,
    /// Sync collection (every batch stacks a share of every node); default async.
    #[cfg_attr(feature = "clap", arg(long))]
    pub sync: bool,
    /// Seed of the run (drawn from the clock when absent).
    #[cfg_attr(feature = "clap", arg(long, value_name = "S"))]
    pub seed: Option<u64>,
    /// Deterministic (the mode; torchrl's `mode` and `mean` too) or random (sampled)
    /// actions [default: random].
    #[cfg_attr(feature = "clap", arg(long, value_name = "TYPE"))]
    pub exploration_type: Option<ExplorationName>,
    /// Whether batches carry what the policy records beside its actions
    /// (`action_log_prob`, its distribution's parameters) [default: when the actions
    /// are sampled (`random`), not when deterministic].
    #[cfg_attr(feature = "clap", arg(long, value_name = "BOOL"))]
    pub record: Option<bool>,
    /// Push stored weights before each collection.
    #[cfg_attr(feature = "clap", arg(long))]
    pub update_after_each_batch: bool,
    /// Update a node that produced more than N batches since its last update.
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub max_weight_update_interval: Option<u64>,
    /// Push stored weights to all nodes every N yielded batches.
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub update_interval: Option<u64>,
    /// Async: drop a batch whose weights are more than N versions behind the stored
    /// ones (its node gets them and collects it again), or flag it with
    /// `--deliver-lagging`.
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub max_policy_lag: Option<u64>,
    /// Deliver batches past `--max-policy-lag` flagged instead of dropping them.
    #[cfg_attr(feature = "clap", arg(long))]
    pub deliver_lagging: bool,
    /// Async: batches each node collects ahead of the consumer [default: 0].
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub prefetch: Option<usize>,
    /// Truncate trajectories longer than N frames.
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub max_frames_per_traj: Option<u64>,
    /// Multi-agent envs: end an episode once any agent is done (torchrl's
    /// `PettingZooWrapper(done_on_any=True)`); default: once every agent is.
    #[cfg_attr(feature = "clap", arg(long))]
    pub done_on_any: bool,
    /// Frames stepped with a random policy first [default: 0].
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub init_random_frames: Option<u64>,
    /// Start each batch with fresh episodes.
    #[cfg_attr(feature = "clap", arg(long))]
    pub reset_at_each_iter: bool,
    /// Yield batches split into trajectories ([n_traj, max_len] with `collector.mask`).
    #[cfg_attr(feature = "clap", arg(long))]
    pub split_trajs: bool,
    /// A NaN in an observation fails its env worker (restarted as any other failure)
    /// instead of being collected.
    #[cfg_attr(feature = "clap", arg(long))]
    pub nan_is_failure: bool,
    /// Store (and push) weights holding NaN or infinity (refused by default, naming the
    /// tensor, and the run goes on with the weights it has).
    #[cfg_attr(feature = "clap", arg(long))]
    pub allow_nonfinite_weights: bool,
    /// Restarts of one env worker a node allows within `restart_window` before it
    /// fails [default: 5; 0: the first failure fails the node].
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub max_restarts: Option<u32>,
    /// The window `max_restarts` counts in, in seconds [default: 5].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub restart_window: Option<Secs>,
    /// Run env worker threads N nice levels below the rest of their process (0..=19;
    /// 0: the same), so the trainer and the nodes' connections run first on busy cores
    /// [default: 10].
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub worker_nice: Option<i32>,
    /// Supervise the nodes: restart a failed node (local: rebuilt; process: respawned;
    /// slurm: its task resubmitted; external: its slot waits for a rejoin) up to N times
    /// within `node_restart_window`; 0 turns supervision off (a lost node stays lost).
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub node_max_restarts: Option<u32>,
    /// The window `node_max_restarts` counts in, in seconds.
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub node_restart_window: Option<Secs>,
    /// When a failed node cannot be brought back, async collection goes on without it
    /// instead of failing.
    #[cfg_attr(feature = "clap", arg(long))]
    pub continue_without_lost_nodes: bool,
    /// Longest wait for one batch, in seconds [default: 60, or twice the longest deadline
    /// on a node's answer set below, if more]; each of those must be at most half of it.
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS", allow_negative_numbers = true))]
    pub batch_timeout: Option<Secs>,
    /// How long a node may take to answer `seed`, `update_weights`, `snapshot` and
    /// `restore`, in seconds; past it the node fails (restarted under supervision,
    /// else dropped). The settings below set one apart [default: 30, or half of
    /// `batch_timeout` if shorter].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub request_timeout: Option<Secs>,
    /// How long a node may take to answer `seed` [default: `request_timeout`].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub seed_timeout: Option<Secs>,
    /// How long a node may take to answer `update_weights` [default: `request_timeout`].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub update_weights_timeout: Option<Secs>,
    /// How long a node may take to answer `snapshot` or `restore` [default:
    /// `request_timeout`].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub snapshot_timeout: Option<Secs>,
    /// How long a node may leave a `continue` unanswered [default: no limit;
    /// `batch_timeout` bounds the wait for a batch].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub continue_timeout: Option<Secs>,
    /// How long the nodes may take to stop at shutdown, in seconds [default: 10].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub shutdown_timeout: Option<Secs>,
    /// How long a node may take to acknowledge `shutdown` once every frame is yielded;
    /// past it the node is closed with a warning and the run still succeeds [default:
    /// half of `shutdown_timeout`].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub shutdown_ack_timeout: Option<Secs>,
    /// Address remote nodes join [default: 127.0.0.1:0].
    #[cfg_attr(feature = "clap", arg(long, value_name = "ADDR"))]
    pub listen: Option<String>,
    /// The address SLURM tasks dial, HOST[:PORT] (without a port, the one `listen`
    /// bound); `listen` must be reachable from the compute nodes, e.g. 0.0.0.0:0.
    #[cfg_attr(feature = "clap", arg(long, value_name = "ADDR"))]
    pub advertise: Option<String>,
    /// Longest wait for remote nodes to join, in seconds (elastic: for `min_nodes`, and
    /// for a joiner once no node is left) [default: 60].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub join_timeout: Option<Secs>,
    /// Seconds between heartbeats on a remote node's connection (both ways) [default: 1].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub heartbeat: Option<Secs>,
    /// Seconds of silence after which a remote node (or, on its side, the trainer) is
    /// gone; above `heartbeat` [default: 5].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub heartbeat_timeout: Option<Secs>,
    /// Longest a connecting node may take over its handshake, in seconds [default: 5].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub handshake_timeout: Option<Secs>,
    /// The largest message on a remote node's connection, in bytes (at least 1024)
    /// [default: 256 MiB].
    #[cfg_attr(feature = "clap", arg(long, value_name = "BYTES"))]
    pub max_frame: Option<usize>,
    /// The `rollout` binary the process and SLURM launchers start as a node (`rollout
    /// node`) [default: this program].
    #[cfg_attr(feature = "clap", arg(long, value_name = "PATH"))]
    pub node_program: Option<PathBuf>,
    /// TLS: the trainer's certificate chain, PEM (with `tls_key`). Nodes then join over
    /// TLS only, checking it against their `--tls-ca`; the token login runs inside.
    #[cfg_attr(feature = "clap", arg(long, value_name = "PEM"))]
    pub tls_cert: Option<PathBuf>,
    /// TLS: the trainer's private key, PEM.
    #[cfg_attr(feature = "clap", arg(long, value_name = "PEM"))]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: nodes must show a certificate signed by a CA of this PEM file.
    #[cfg_attr(feature = "clap", arg(long, value_name = "PEM"))]
    pub tls_client_ca: Option<PathBuf>,
    /// The CA (PEM) the nodes this trainer starts (process, SLURM) check its
    /// certificate against; passed to them as `--tls-ca`.
    #[cfg_attr(feature = "clap", arg(long, value_name = "PEM"))]
    pub tls_ca: Option<PathBuf>,
    /// The name the trainer's certificate holds, for the nodes it starts [default: the
    /// host they dial].
    #[cfg_attr(feature = "clap", arg(long, value_name = "NAME"))]
    pub tls_server_name: Option<String>,
    /// Mutual TLS: the certificate (PEM) of the nodes this trainer starts.
    #[cfg_attr(feature = "clap", arg(long, value_name = "PEM"))]
    pub node_tls_cert: Option<PathBuf>,
    /// Mutual TLS: the private key (PEM) of the nodes this trainer starts.
    #[cfg_attr(feature = "clap", arg(long, value_name = "PEM"))]
    pub node_tls_key: Option<PathBuf>,
    /// Serve the run's metrics for Prometheus at http://ADDR/metrics (e.g.
    /// 127.0.0.1:9464; port 0 picks one).
    #[cfg_attr(feature = "clap", arg(long, value_name = "ADDR"))]
    pub metrics: Option<String>,
    /// At the end, wait up to SECS for one more scrape of `metrics`, so the scraper
    /// records the final values [default: 0].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECS"))]
    pub metrics_linger: Option<Secs>,
}

impl CollectorArgs {
    /// The builder with these settings on it; a value no setting can take (JSON that is
    /// not JSON, specs that are not specs) is an error naming its setting. What the values
    /// mean together is checked by [`CollectorBuilder::build`].
    pub fn apply(self, mut b: CollectorBuilder) -> Result<CollectorBuilder, ConfigError> {
        let env = self
            .env
            .ok_or_else(|| ConfigError::new("env", "required: the name of an env"))?;
        b = b.env(env_spec(env, self.env_config.as_deref())?);
        if let Some(s) = &self.env_spec {
            b = b.env_spec(env_specs(s)?);
        }
        if self.done_on_any {
            b = b.done_on_any(true);
        }
        let frames_per_batch = self
            .frames_per_batch
            .ok_or_else(|| ConfigError::new("frames_per_batch", "required"))?;
        b = b.frames_per_batch(frames_per_batch);
        if let Some(t) = self.total_frames {
            b = b.total_frames(t);
        }
        if let Some(n) = self.nodes {
            b = b.nodes(n);
        }
        if let Some(n) = self.max_nodes {
            b = b.max_nodes(n);
        }
        if let Some(n) = self.min_nodes {
            b = b.min_nodes(n);
        }
        if let Some(k) = self.envs_per_node {
            b = b.envs_per_node(k);
        }
        if let Some(k) = self.envs_per_worker {
            b = b.envs_per_worker(k);
        }
        b = b.sync(self.sync);
        if let Some(s) = self.seed {
            b = b.seed(s);
        }
        if let Some(e) = self.exploration_type {
            b = b.exploration_type(e.0);
        }
        if let Some(r) = self.record {
            b = b.record(r);
        }
        b = b.update_after_each_batch(self.update_after_each_batch);
        if let Some(n) = self.max_weight_update_interval {
            b = b.max_weight_update_interval(n);
        }
        if let Some(n) = self.update_interval {
            b = b.update_interval(n);
        }
        if let Some(n) = self.max_policy_lag {
            b = b.max_policy_lag(n);
        }
        b = b.deliver_lagging(self.deliver_lagging);
        if let Some(n) = self.prefetch {
            b = b.prefetch(n);
        }
        if let Some(n) = self.max_frames_per_traj {
            b = b.max_frames_per_traj(n);
        }
        if let Some(n) = self.init_random_frames {
            b = b.init_random_frames(n);
        }
        b = b
            .reset_at_each_iter(self.reset_at_each_iter)
            .split_trajs(self.split_trajs)
            .nan_is_failure(self.nan_is_failure)
            .allow_nonfinite_weights(self.allow_nonfinite_weights);
        if self.continue_without_lost_nodes {
            // Only when asked: the setter turns node supervision on.
            b = b.continue_without_lost_nodes(true);
        }
        if let Some(n) = self.max_restarts {
            b = b.max_restarts(n);
        }
        if let Some(d) = self.restart_window {
            b = b.restart_window(d.0);
        }
        if let Some(n) = self.worker_nice {
            b = b.worker_nice(n);
        }
        if let Some(n) = self.node_max_restarts {
            b = b.node_max_restarts(n);
        }
        if let Some(d) = self.node_restart_window {
            b = b.node_restart_window(d.0);
        }
        let durations: [(Option<Secs>, SetDuration); 10] = [
            (self.batch_timeout, CollectorBuilder::batch_timeout),
            (self.request_timeout, CollectorBuilder::request_timeout),
            (self.seed_timeout, CollectorBuilder::seed_timeout),
            (self.update_weights_timeout, CollectorBuilder::update_weights_timeout),
            (self.snapshot_timeout, CollectorBuilder::snapshot_timeout),
            (self.continue_timeout, CollectorBuilder::continue_timeout),
            (self.shutdown_timeout, CollectorBuilder::shutdown_timeout),
            (self.shutdown_ack_timeout, CollectorBuilder::shutdown_ack_timeout),
            (self.join_timeout, CollectorBuilder::join_timeout),
            (self.handshake_timeout, CollectorBuilder::handshake_timeout),
        ];
        for (d, set) in durations {
            if let Some(d) = d {
                b = set(b, d.0);
            }
        }
        if self.heartbeat.is_some() || self.heartbeat_timeout.is_some() {
            let (interval, timeout) = DEFAULT_HEARTBEAT;
            b = b.heartbeat(
                self.heartbeat.map_or(interval, |s| s.0),
                self.heartbeat_timeout.map_or(timeout, |s| s.0),
            );
        }
        if let Some(a) = self.listen {
            b = b.listen(a);
        }
        if let Some(a) = self.advertise {
            b = b.advertise(a);
        }
        if let Some(n) = self.max_frame {
            b = b.max_frame(n);
        }
        if let Some(p) = self.node_program {
            b = b.node_program(p);
        }
        if let Some(p) = self.tls_cert {
            b = b.tls_cert(p);
        }
        if let Some(p) = self.tls_key {
            b = b.tls_key(p);
        }
        if let Some(p) = self.tls_client_ca {
            b = b.tls_client_ca(p);
        }
        if let Some(p) = self.tls_ca {
            b = b.tls_ca(p);
        }
        if let Some(n) = self.tls_server_name {
            b = b.tls_server_name(n);
        }
        if let Some(p) = self.node_tls_cert {
            b = b.node_tls_cert(p);
        }
        if let Some(p) = self.node_tls_key {
            b = b.node_tls_key(p);
        }
        if let Some(a) = self.metrics {
            b = b.metrics(a);
        }
        if let Some(d) = self.metrics_linger {
            b = b.metrics_linger(d.0);
        }
        Ok(b)
    }
}

/// A builder setter that takes a duration.
type SetDuration = fn(CollectorBuilder, Duration) -> CollectorBuilder;

/// The env `name`, with its config when given as JSON text.
fn env_spec(name: String, config: Option<&str>) -> Result<EnvSpec, ConfigError> {
    let spec = EnvSpec::new(name);
    Ok(match config {
        None => spec,
        Some(json) => spec.with_config(
            serde_json::from_str(json).map_err(|e| ConfigError::new("env_config", format!("not valid JSON: {e}")))?,
        ),
    })
}

/// `env_spec`: JSON, or `@FILE` holding JSON, of the env's specs (a regular file of at
/// most 1 MiB); a bad one names the key at fault, a key given twice included.
fn env_specs(arg: &str) -> Result<EnvSpecs, ConfigError> {
    let err = |e: &dyn fmt::Display| ConfigError::new("env_spec", e.to_string());
    let text = match arg.strip_prefix('@') {
        Some(path) => {
            let bytes = read_bounded(Path::new(path), ENV_SPEC_FILE).map_err(|e| err(&e))?;
            String::from_utf8(bytes).map_err(|e| err(&format!("{path} is not UTF-8 text: {e}")))?
        }
        None => arg.to_string(),
    };
    EnvSpecs::from_json(&text).map_err(|e| err(&e))
}

/// A duration given in seconds: a finite number, zero or more (the builder refuses a
/// zero where a deadline needs time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Secs(pub Duration);

impl Secs {
    fn from_f64(s: f64) -> Result<Secs, String> {
        Duration::try_from_secs_f64(s)
            .map(Secs)
            .map_err(|_| format!("{s} is not a number of seconds"))
    }
}

impl FromStr for Secs {
    type Err = String;

    fn from_str(s: &str) -> Result<Secs, String> {
        let n: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a number of seconds"))?;
        Secs::from_f64(n)
    }
}

impl<'de> Deserialize<'de> for Secs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Secs, D::Error> {
        struct Seconds;
        impl Visitor<'_> for Seconds {
            type Value = Secs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of seconds")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Secs, E> {
                Secs::from_f64(v).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Secs, E> {
                // Seconds as an integer: exact as an f64 far past any deadline's length.
                self.visit_f64(v as f64)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Secs, E> {
                self.visit_f64(v as f64)
            }
        }
        d.deserialize_f64(Seconds)
    }
}

/// An exploration type by one of torchrl's names (see [`ExplorationType::from_name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExplorationName(pub ExplorationType);

impl FromStr for ExplorationName {
    type Err = String;

    fn from_str(s: &str) -> Result<ExplorationName, String> {
        ExplorationType::from_name(s)
            .map(ExplorationName)
            .ok_or_else(|| format!("`{s}` is not one of random, deterministic, mode, mean"))
    }
}

impl<'de> Deserialize<'de> for ExplorationName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ExplorationName, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(json: serde_json::Value) -> Result<CollectorArgs, serde_json::Error> {
        serde_json::from_value(json)
    }

    #[test]
    fn seconds_take_numbers_of_either_kind_and_refuse_the_rest() {
        assert_eq!(
            args(serde_json::json!({"batch_timeout": 2}))
                .ok()
                .map(|a| a.batch_timeout),
            Some(Some(Secs(Duration::from_secs(2))))
        );
        assert_eq!(
            args(serde_json::json!({"batch_timeout": 0.25}))
                .ok()
                .map(|a| a.batch_timeout),
            Some(Some(Secs(Duration::from_millis(250))))
        );
        for bad in [serde_json::json!(-1.0), serde_json::json!("1"), serde_json::json!([1])] {
            let e = args(serde_json::json!({ "batch_timeout": bad })).expect_err("refused");
            assert!(e.to_string().contains("seconds"), "{e}");
        }
        assert_eq!("1.5".parse::<Secs>(), Ok(Secs(Duration::from_millis(1500))));
        assert!("-1".parse::<Secs>().is_err() && "NaN".parse::<Secs>().is_err() && "x".parse::<Secs>().is_err());
    }

    #[test]
    fn an_unknown_setting_is_refused_by_name() {
        let e = args(serde_json::json!({"frames_per_batchh": 10})).expect_err("refused");
        assert!(e.to_string().contains("frames_per_batchh"), "{e}");
    }

    #[test]
    fn exploration_takes_torchrl_names() {
        for (name, want) in [
            ("random", ExplorationType::Random),
            ("MODE", ExplorationType::Deterministic),
            ("mean", ExplorationType::Deterministic),
            ("deterministic", ExplorationType::Deterministic),
        ] {
            assert_eq!(name.parse::<ExplorationName>(), Ok(ExplorationName(want)));
        }
        assert!("greedy".parse::<ExplorationName>().is_err());
    }

    #[test]
    fn settings_left_unset_leave_the_builder_s_defaults() {
        let plain = CollectorArgs {
            env: Some("CartPole-v1".into()),
            frames_per_batch: Some(10),
            ..CollectorArgs::default()
        };
        let b = plain.clone().apply(CollectorBuilder::default()).expect("applied");
        // `false` is not "asked": node supervision stays off unless a setting turns it on.
        assert!(b.settings().node_supervision.is_none());
        let asked = CollectorArgs {
            continue_without_lost_nodes: true,
            ..plain
        };
        let b = asked.apply(CollectorBuilder::default()).expect("applied");
        assert!(b
            .settings()
            .node_supervision
            .as_ref()
            .is_some_and(|s| s.continue_without_lost_nodes));
    }

    #[test]
    fn done_on_any_reaches_the_run_from_either_front_end() {
        let from_python = args(
            serde_json::json!({"env": "pettingzoo:mpe2.simple_spread_v3", "frames_per_batch": 10,
            "done_on_any": true}),
        )
        .expect("parsed");
        let b = from_python.apply(CollectorBuilder::default()).expect("applied");
        assert!(b.settings().run.done_on_any);
        assert!(
            args(serde_json::json!({"done_on_any": "yes"})).is_err(),
            "a bool, not anything truthy"
        );
        let unset = CollectorArgs {
            env: Some("CartPole-v1".into()),
            frames_per_batch: Some(10),
            ..CollectorArgs::default()
        };
        assert!(
            !unset
                .apply(CollectorBuilder::default())
                .expect("applied")
                .settings()
                .run
                .done_on_any
        );
    }

    #[test]
    fn apply_requires_the_env_and_the_batch_size_and_names_bad_json() {
        let field = |a: CollectorArgs| a.apply(CollectorBuilder::default()).err().map(|e| e.field);
        let good = CollectorArgs {
            env: Some("CartPole-v1".into()),
            frames_per_batch: Some(10),
            ..CollectorArgs::default()
        };
        assert_eq!(field(good.clone()), None);
        assert_eq!(
            field(CollectorArgs {
                env: None,
                ..good.clone()
            }),
            Some("env")
        );
        assert_eq!(
            field(CollectorArgs {
                frames_per_batch: None,
                ..good.clone()
            }),
            Some("frames_per_batch")
        );
        assert_eq!(
            field(CollectorArgs {
                env_config: Some("{not json".into()),
                ..good.clone()
            }),
            Some("env_config")
        );
        assert_eq!(
            field(CollectorArgs {
                env_spec: Some("{}".into()),
                ..good
            }),
            Some("env_spec")
        );
    }
}
