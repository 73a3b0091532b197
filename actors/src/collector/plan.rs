//! Planning a run: the builder's settings checked (every error names the setting at
//! fault) and turned into the trainer's machine and one [`NodeSpec`] per node.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rollout::machine::trainer::LayoutSource;
use rollout::machine::trainer::Membership;
use rollout::machine::{RequestDeadlines, TrainerConfig, TrainerMachine};
use rollout::node_spec::NodeSpec;
use rollout::rollout::{batch_layout, layout_difference, BatchLayout, RolloutConfig};
use rollout::{EnvSpec, Weights};

use super::settings::Settings;
use crate::delivery::Delivery;
use crate::error::CollectError;
use crate::launch::{config_error, Launch, Launcher, NodePlan};

/// A run's trainer config, node specs, seed, and where each node's layout comes from.
type PlannedRun = (TrainerConfig, Vec<NodeSpec>, u64, Vec<LayoutSource>);

/// A validated collector: what to start and how, before anything is started. Every
/// entry point (`build`, `start`, `start_embedded`) starts one.
pub(super) struct Plan {
    /// The run: trainer, node specs, seed, and what each batch goes through.
    pub(super) nodes: NodePlan,
    /// The launcher that starts its nodes.
    pub(super) launch: Box<dyn Launch>,
    /// Which launcher that is, for the entry points that take only some.
    pub(super) launcher: Launcher,
    /// The blocking collector's deadline on each of its calls to the trainer.
    pub(super) batch_timeout: Duration,
    /// The blocking collector's deadline on shutdown.
    pub(super) shutdown_timeout: Duration,
    /// Number of nodes (an elastic run: its slots).
    pub(super) node_count: usize,
}

impl Settings {
    /// The trainer's config, the node specs and the seed (see
    /// [`CollectorBuilder::plan_specs`](crate::CollectorBuilder::plan_specs)).
    pub(super) fn plan_specs(&self) -> Result<(TrainerConfig, Vec<NodeSpec>, u64), CollectError> {
        self.plan_run().map(|(cfg, specs, seed, _)| (cfg, specs, seed))
    }

    /// [`Self::plan_specs`], and where each node's layout comes from: the trainer
    /// builds every env itself, so each node's batches are checked against the layout
    /// of its env's specs, never against what the node announces.
    fn plan_run(&self) -> Result<PlannedRun, CollectError> {
        let env = self
            .env
            .clone()
            .ok_or_else(|| config_error("env", "required: name a registered env"))?;
        let f = self
            .frames_per_batch
            .ok_or_else(|| config_error("frames_per_batch", "required"))?;
        let total_frames = match self.total_frames {
            -1 => None,
            t if t < 0 => return Err(config_error("total_frames", format!("{t}: use -1 for endless"))),
            t => Some(t as u64),
        };
        if !(0..=19).contains(&self.worker_nice) {
            return Err(config_error(
                "worker_nice",
                format!(
                    "{}: must be within 0..=19 (a thread's priority can only be lowered)",
                    self.worker_nice
                ),
            ));
        }
        let n = self.node_slots()?;
        if let Some((&i, _)) = self.node_configs.iter().find(|(&i, _)| i >= n.max(1)) {
            return Err(config_error(
                "node_config",
                format!("node {i} does not exist: there are {n} nodes"),
            ));
        }
        let over = |i: usize| self.node_configs.get(&i).cloned().unwrap_or_default();
        let envs: Vec<EnvSpec> = (0..n).map(|i| over(i).env.unwrap_or_else(|| env.clone())).collect();
        let ks: Vec<usize> = (0..n)
            .map(|i| over(i).envs_per_node.unwrap_or(self.envs_per_node))
            .collect();
        let per = self.envs_per_worker;
        if per == 0 {
            return Err(config_error("envs_per_worker", "must be at least 1"));
        }
        if let Some(i) = ks.iter().position(|&k| !k.is_multiple_of(per)) {
            return Err(config_error(
                "envs_per_worker",
                format!("{per} does not divide node {i}'s {} envs", ks[i]),
            ));
        }
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
                return Err(config_error(
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
        let mut sources = Vec::with_capacity(n);
        for (i, env_i) in envs.iter().enumerate() {
            let probe = self.registry.make(env_i).map_err(|e| {
                if self.node_configs.get(&i).is_some_and(|o| o.env.is_some()) {
                    config_error("node_config", format!("node {i}'s env: {e}"))
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
                .map_err(|e| config_error("policy", format!("node {i}: {e}")))?;
            let layout = batch_layout(probe.observation_spec(), probe.action_spec());
            if self.launcher != Launcher::Local {
                self.check_frames_fit(i, built.weights(), &layout, if self.sync { f / n.max(1) } else { f })?;
            }
            policies.push(policy);
            layouts.push(layout);
            sources.push(LayoutSource::Known {
                of: format!("env {}", env_i.name),
                layout: layouts[i].clone(),
            });
        }
        if self.sync {
            if let Some(diff) = (1..n).find_map(|i| layout_difference(i, &layouts[i], 0, &layouts[0])) {
                return Err(config_error(
                    "node_config",
                    format!("sync collection stacks node shares, but {diff}"),
                ));
            }
        }
        if self.max_frames_per_traj == Some(0) {
            return Err(config_error("max_frames_per_traj", "must be at least 1"));
        }
        if self.restart.window.as_millis() == 0 {
            return Err(config_error("restart_window", "must be at least 1 ms"));
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
                envs_per_worker: per,
                first_lane,
                lanes,
                rollout: RolloutConfig {
                    frames_per_batch: worker_frames,
                    max_frames_per_traj: self.max_frames_per_traj,
                    reset_at_each_iter: self.reset_at_each_iter,
                    // Counted per env worker, whose frames are its envs' together.
                    init_random_frames: self.init_random_frames.div_ceil(lanes).saturating_mul(per as u64),
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
        Ok((cfg, specs, seed, sources))
    }

    /// The run's node slots: `nodes`, or for an elastic run `max_nodes`, the elastic
    /// settings checked (each error names the setting).
    fn node_slots(&self) -> Result<usize, CollectError> {
        let Some(max) = self.max_nodes else {
            if self.min_nodes.is_some() {
                return Err(config_error(
                    "max_nodes",
                    "required with min_nodes (elastic membership)",
                ));
            }
            return Ok(self.nodes);
        };
        if self.nodes_set {
            return Err(config_error(
                "nodes",
                "an elastic run is sized by min_nodes and max_nodes: leave nodes unset",
            ));
        }
        if max == 0 {
            return Err(config_error("max_nodes", "must be at least 1"));
        }
        if self.sync {
            return Err(config_error(
                "sync",
                "elastic membership (min_nodes, max_nodes) is for async runs: a sync batch needs a share of every node",
            ));
        }
        if self.launcher != Launcher::External {
            return Err(config_error(
                "launcher",
                "elastic membership (min_nodes, max_nodes) needs nodes that join over TCP by themselves: \
                 use Launcher::External (Local, Process and Slurm start a fixed set of nodes)",
            ));
        }
        Ok(max)
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
            return Err(config_error(
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
            .map(|(dtype, dims)| {
                let elems = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
                elems.map_or(usize::MAX, |e| e.saturating_mul(dtype.size()))
            })
            .fold(0, usize::saturating_add);
        let batch = per_frame.saturating_mul(frames);
        if batch > max {
            return Err(config_error(
                "max_frame",
                format!(
                    "node {i}'s batches of {frames} frames hold {batch} bytes of tensors, over max_frame ({max}); \
                     raise max_frame or lower frames_per_batch"
                ),
            ));
        }
        Ok(())
    }

    /// The deadlines on the nodes' answers, each longer than zero.
    fn deadlines(&self) -> Result<RequestDeadlines, CollectError> {
        let or_request = |d: Option<Duration>| d.unwrap_or(self.request_timeout);
        let d = RequestDeadlines {
            seed: Some(or_request(self.seed_timeout)),
            update_weights: Some(or_request(self.update_weights_timeout)),
            checkpoint: Some(or_request(self.snapshot_timeout)),
            batch: self.continue_timeout,
            shutdown: Some(self.shutdown_ack_timeout.unwrap_or(self.shutdown_timeout / 2)),
        };
        let named = [
            ("request_timeout", Some(self.request_timeout)),
            ("seed_timeout", self.seed_timeout),
            ("update_weights_timeout", self.update_weights_timeout),
            ("snapshot_timeout", self.snapshot_timeout),
            ("continue_timeout", self.continue_timeout),
            ("shutdown_ack_timeout", d.shutdown),
        ];
        if let Some((field, _)) = named.iter().find(|(_, t)| t.is_some_and(|t| t.is_zero())) {
            return Err(config_error(field, "must be longer than zero"));
        }
        Ok(d)
    }

    /// Checks every setting and plans the run: the trainer's machine (resumed and
    /// supervised as configured), the node specs, the launcher; nothing is started.
    pub(super) fn into_plan(self) -> Result<Plan, CollectError> {
        if self.batch_timeout.is_zero() {
            return Err(config_error("batch_timeout", "must be longer than zero"));
        }
        if self.replay_buffer.is_some() && self.split_trajs {
            return Err(config_error(
                "replay_buffer",
                "a replay buffer stores frames and split_trajs pads trajectories: use one or the other",
            ));
        }
        let (cfg, specs, seed, layouts) = self.plan_run()?;
        let n = cfg.nodes;
        // Version 0: built here, once, by the same function for every node; the
        // launchers hand it to the nodes, which never build weights of their own.
        let initial = specs
            .iter()
            .map(|spec| {
                spec.initial_weights(&self.registry)
                    .map_err(|source| CollectError::NodeBuild {
                        node: spec.index,
                        source,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut machine = TrainerMachine::new(cfg)?
            .with_initial_weights(initial)?
            .with_layout_sources(layouts);
        if let Some(c) = self.resume.clone() {
            machine = machine.with_resume(c)?;
        }
        let launch = self.launch()?;
        // Each node's layout is the trainer's own (above): a remote node's `Ready` must
        // announce it; local::start reads it off the workers it builds.
        if self.max_nodes.is_some() {
            let membership = Membership {
                min_nodes: self.min_nodes.unwrap_or(1),
                empty_timeout: self.join_timeout,
            };
            if self.node_supervision.is_some() {
                return Err(config_error(
                    "node_max_restarts",
                    "an elastic run restarts no node: one that is lost leaves, and others may join",
                ));
            }
            machine = machine.with_elastic(membership)?;
        }
        if let Some(sup) = self.node_supervision.clone() {
            if sup.intensity.window.as_millis() == 0 {
                return Err(config_error("node_restart_window", "must be at least 1 ms"));
            }
            machine = machine.with_supervision(sup);
        }
        machine = machine.with_deadlines(self.deadlines()?);
        Ok(Plan {
            nodes: NodePlan {
                machine,
                specs,
                registry: self.registry,
                seed,
                delivery: Delivery {
                    split_trajs: self.split_trajs,
                    postproc: self.postproc,
                    replay_buffer: self.replay_buffer,
                    batch_timeout: Some(self.batch_timeout),
                },
            },
            launch,
            launcher: self.launcher,
            batch_timeout: self.batch_timeout,
            shutdown_timeout: self.shutdown_timeout,
            node_count: n,
        })
    }
}
