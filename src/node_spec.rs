//! What a node needs to build its env workers: the same value for a local node
//! (handed over in memory) and a remote one (sent in the join handshake).

use serde::{Deserialize, Serialize};

use crate::env::{EnvSpec, Registry};
use crate::policy::{PolicySpec, Weights};
use crate::rollout::{Rollout, RolloutConfig, RolloutError, TrajIds};
use crate::shares::worker_frames;
use crate::supervisor::{RestartIntensity, DEFAULT_MAX_RESTARTS, DEFAULT_RESTART_WINDOW};

fn default_max_restarts() -> u32 {
    DEFAULT_MAX_RESTARTS
}

fn default_restart_window_ms() -> u64 {
    DEFAULT_RESTART_WINDOW_MS
}

/// Everything that defines one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    /// The node's index, `0..nodes`.
    pub index: usize,
    /// The env every worker of the node builds.
    pub env: EnvSpec,
    /// The policy every worker of the node builds.
    pub policy: PolicySpec,
    /// Envs on this node (torchrl's `num_workers_per_collector`): rows of its batches.
    pub envs_per_node: usize,
    /// Envs each env worker steps, with one policy call per step for all of them (the
    /// network evaluated on a batch of observations); the node has
    /// `envs_per_node / envs_per_worker` workers, each a thread. Absent on the wire: 1
    /// (and not written when 1).
    #[serde(default = "default_envs_per_worker", skip_serializing_if = "is_one")]
    pub envs_per_worker: usize,
    /// The trajectory-id lane of this node's first worker.
    pub first_lane: u64,
    /// Lanes in the whole run (total env workers over all nodes).
    pub lanes: u64,
    /// Collection-loop settings; its `frames_per_batch` (the wire's name) is an env's
    /// share, [`Shares::env_share`](crate::shares::Shares::env_share), the most one env
    /// is asked for at once ([`NodeSpec::env_share`]).
    pub rollout: RolloutConfig,
    /// Restarts of one env worker allowed within `restart_window_ms` before the node
    /// fails (absent on the wire: 5).
    #[serde(default = "default_max_restarts")]
    pub max_restarts: u32,
    /// The window of `max_restarts`, in milliseconds (absent on the wire: 5000; 0 is
    /// read as 1 ms).
    #[serde(default = "default_restart_window_ms")]
    pub restart_window_ms: u64,
    /// How much lower than the node's other threads its env workers' threads run,
    /// as a Unix nice increment, `0..=19` (absent on the wire: 10). Env stepping is
    /// CPU-bound and never waits; the node's connection and the trainer are what
    /// the workers wait on, so on a busy machine they should get the CPU first.
    #[serde(default = "default_worker_nice")]
    pub worker_nice: i32,
}

fn default_envs_per_worker() -> usize {
    1
}

fn is_one(k: &usize) -> bool {
    *k == 1
}

/// The default [`NodeSpec::worker_nice`]: 10.
pub const DEFAULT_WORKER_NICE: i32 = 10;

fn default_worker_nice() -> i32 {
    DEFAULT_WORKER_NICE
}

/// The default [`NodeSpec::restart_window_ms`]: 5000 (5 s, as in OTP).
pub const DEFAULT_RESTART_WINDOW_MS: u64 = DEFAULT_RESTART_WINDOW.as_millis() as u64;

impl NodeSpec {
    /// An env's share of a batch: the most frames one env of this node is asked for
    /// at once (`rollout.frames_per_batch` on the wire).
    pub fn env_share(&self) -> usize {
        self.rollout.frames_per_batch
    }

    /// Node 0 of a run of this node alone: `envs_per_node` envs of `env`, each its own
    /// env worker and trajectory-id lane (lanes `0..envs_per_node`), acting with
    /// `policy`, with [`RolloutConfig::default`] and the default supervision and
    /// worker priority. The trainer plans the specs of a run; this is for a spec
    /// written by hand (tests, a node driven directly): the `with_*` methods set the
    /// rest, e.g. a node of a larger run is `with_index` and `with_lanes`.
    ///
    /// ```
    /// use rollout::node_spec::NodeSpec;
    /// use rollout::{PolicyConfig, Registry};
    ///
    /// // Node 1 of a run of two nodes of two envs each.
    /// let spec = NodeSpec::new("CartPole-v1", PolicyConfig::Random, 2)
    ///     .with_index(1)
    ///     .with_lanes(2, 4)
    ///     .with_env_share(10);
    /// assert_eq!(spec.build_workers(&Registry::with_builtins())?.len(), 2);
    /// # Ok::<(), rollout::rollout::RolloutError>(())
    /// ```
    pub fn new(env: impl Into<EnvSpec>, policy: impl Into<PolicySpec>, envs_per_node: usize) -> NodeSpec {
        NodeSpec {
            index: 0,
            env: env.into(),
            policy: policy.into(),
            envs_per_node,
            envs_per_worker: 1,
            first_lane: 0,
            lanes: envs_per_node as u64,
            rollout: RolloutConfig::default(),
            max_restarts: DEFAULT_MAX_RESTARTS,
            restart_window_ms: DEFAULT_RESTART_WINDOW_MS,
            worker_nice: DEFAULT_WORKER_NICE,
        }
    }

    /// This spec as node `index` of its run.
    pub fn with_index(mut self, index: usize) -> NodeSpec {
        self.index = index;
        self
    }

    /// The node's first trajectory-id lane, and the lanes of the whole run.
    pub fn with_lanes(mut self, first_lane: u64, lanes: u64) -> NodeSpec {
        self.first_lane = first_lane;
        self.lanes = lanes;
        self
    }

    /// `k` envs to each env worker (see [`NodeSpec::envs_per_worker`]).
    pub fn with_envs_per_worker(mut self, k: usize) -> NodeSpec {
        self.envs_per_worker = k;
        self
    }

    /// The frames each env is asked for at most per batch, its share (see [`NodeSpec::env_share`]).
    pub fn with_env_share(mut self, frames: usize) -> NodeSpec {
        self.rollout.frames_per_batch = frames;
        self
    }

    /// The node's base seed (see [`RolloutConfig::seed`]).
    pub fn with_seed(mut self, seed: u64) -> NodeSpec {
        self.rollout.seed = seed;
        self
    }

    /// Trajectories cut after `frames` frames (see [`RolloutConfig::max_frames_per_traj`]).
    pub fn with_max_frames_per_traj(mut self, frames: u64) -> NodeSpec {
        self.rollout.max_frames_per_traj = Some(frames);
        self
    }

    /// `max_restarts` restarts of one env worker within `window_ms` milliseconds.
    pub fn with_restarts(mut self, max_restarts: u32, window_ms: u64) -> NodeSpec {
        self.max_restarts = max_restarts;
        self.restart_window_ms = window_ms;
        self
    }

    /// The env workers' nice increment (see [`NodeSpec::worker_nice`]).
    pub fn with_worker_nice(mut self, nice: i32) -> NodeSpec {
        self.worker_nice = nice;
        self
    }

    /// How often each of the node's env workers may be restarted.
    pub fn restart_intensity(&self) -> RestartIntensity {
        RestartIntensity {
            max_restarts: self.max_restarts,
            window: std::time::Duration::from_millis(self.restart_window_ms.max(1)),
        }
    }

    /// The node's env workers: `envs_per_node / envs_per_worker`, or the error naming
    /// the field when that does not divide evenly.
    pub fn workers(&self) -> Result<usize, RolloutError> {
        let (e, k) = (self.envs_per_node, self.envs_per_worker);
        if e == 0 || k == 0 || !e.is_multiple_of(k) {
            return Err(RolloutError::Config {
                field: "envs_per_worker",
                reason: format!("{e} envs per node cannot be split into workers of {k} envs"),
            });
        }
        Ok(e / k)
    }

    /// Builds the rollout of worker `worker`: envs `worker * K .. (worker + 1) * K` of
    /// the node (`K = envs_per_worker`), env `i` first reset with seed `rollout.seed + i`
    /// and handing out the ids of lane `first_lane + i`, so that an env's frames are the
    /// same whatever `K` (and, for a deterministic policy, its actions too); the policy
    /// samples from the worker's own stream, seeded from `rollout.seed + worker * K`.
    pub fn build_worker(&self, registry: &Registry, worker: usize) -> Result<Rollout, RolloutError> {
        let workers = self.workers()?;
        if worker >= workers {
            return Err(RolloutError::Config {
                field: "worker",
                reason: format!("worker {worker} of a node of {workers}"),
            });
        }
        let k = self.envs_per_worker;
        let first = worker * k;
        let envs = (first..first + k)
            .map(|i| {
                registry
                    .make(&self.env)
                    .map_err(|source| RolloutError::Env { env: i, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let seed = self.rollout.seed.wrapping_add(first as u64);
        let policy = self.policy.build(
            envs[0].observation_spec(),
            envs[0].action_spec(),
            seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 1,
        )?;
        let ids = (first..first + k)
            .map(|i| TrajIds::new(self.first_lane + i as u64, self.lanes))
            .collect::<Result<Vec<_>, _>>()?;
        let mut cfg = self.rollout.clone();
        cfg.seed = seed;
        // The spec's share is an env's; the worker steps K envs.
        cfg.frames_per_batch = worker_frames(self.env_share(), k).ok_or_else(|| RolloutError::Config {
            field: "frames_per_batch",
            reason: format!("{} frames for each of {k} envs overflow", self.rollout.frames_per_batch),
        })?;
        Ok(Rollout::new(envs, policy, ids, cfg)?.recording(self.policy.record))
    }

    /// Builds worker `worker`'s rollout anew after a failure (see
    /// [`NodeOutput::Replace`](crate::machine::NodeOutput::Replace)): built
    /// as at the start, then reseeded with `seed`, its trajectory ids moved to
    /// `skip_traj_ids_below` or beyond, its frame count resumed at `frames`, and
    /// `weights` loaded when given.
    pub fn rebuild_worker(
        &self,
        registry: &Registry,
        worker: usize,
        seed: u64,
        skip_traj_ids_below: u64,
        frames: u64,
        weights: Option<&Weights>,
    ) -> Result<Rollout, RolloutError> {
        let mut r = self.build_worker(registry, worker)?;
        r.set_seed(seed);
        r.skip_traj_ids_below(skip_traj_ids_below);
        r.resume_frames(frames);
        if let Some(w) = weights {
            r.set_weights(w)?;
        }
        Ok(r)
    }

    /// Version 0 of this node's weights: the initial weights of its policy for its
    /// env's observation and action specs, drawn from `policy.init_seed` (the
    /// sampling seed plays no part in them). The trainer builds them and hands them
    /// to every node, so that no node invents weights of its own.
    pub fn initial_weights(&self, registry: &Registry) -> Result<Weights, RolloutError> {
        let env = registry
            .make(&self.env)
            .map_err(|source| RolloutError::Env { env: 0, source })?;
        let policy = self.policy.build(env.observation_spec(), env.action_spec(), 0)?;
        Ok(policy.weights().clone().with_version(0))
    }

    /// Builds the rollouts of all the node's workers.
    pub fn build_workers(&self, registry: &Registry) -> Result<Vec<Rollout>, RolloutError> {
        (0..self.workers()?).map(|w| self.build_worker(registry, w)).collect()
    }
}
