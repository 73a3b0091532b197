//! Planning a run: the builder's settings checked (every error names the setting at
//! fault) and turned into the trainer's machine and one [`NodeSpec`] per node.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rollout::machine::trainer::{initial_weights_for, spec_params_for, LayoutSource, Membership};
use rollout::machine::{RequestDeadlines, TrainerConfig, TrainerMachine};
use rollout::node_spec::NodeSpec;
use rollout::rollout::{batch_layout, layout_difference, BatchLayout, RolloutConfig};
use rollout::space::EnvSpecs;
use rollout::{EnvSpec, PolicyConfig, PolicySpec, Weights};

use super::settings::{Settings, DEFAULT_BATCH_TIMEOUT, DEFAULT_REQUEST_TIMEOUT};
use crate::delivery::Delivery;
use crate::error::CollectError;
use crate::launch::{config_error, Launch, Launcher, NodePlan};

/// A run's trainer config, node specs, seed, where each node's layout comes from,
/// and each node's version 0 where it is known before any node is ready.
type PlannedRun = (
    TrainerConfig,
    Vec<NodeSpec>,
    u64,
    Vec<LayoutSource>,
    Vec<Option<Weights>>,
);

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
        self.plan_run().map(|(cfg, specs, seed, _, _)| (cfg, specs, seed))
    }

    /// [`Self::plan_specs`], where each node's layout comes from, and its version 0.
    /// An env the registry builds: its specs give the layout (a node's `ready` must
    /// announce it), and version 0 is built from them. Specs the user declared
    /// (`env_spec`): the same, from those. An env neither builds (one only the nodes
    /// know; never with the Local launcher, which builds its nodes from the registry):
    /// the first node of it to be ready sets its specs, and version 0 is built from
    /// them then (the machine's deferred policy).
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
        self.check_onnx_model()?;
        let mut policies = Vec::with_capacity(n);
        let mut layouts: Vec<Option<BatchLayout>> = Vec::with_capacity(n);
        let mut sources = Vec::with_capacity(n);
        let mut initial = Vec::with_capacity(n);
        let declared = match &self.env_specs {
            Some(d) => {
                d.validate().map_err(|e| config_error("env_spec", e.to_string()))?;
                Some(d)
            }
            None => None,
        };
        for (i, env_i) in envs.iter().enumerate() {
            let overridden = self.node_configs.get(&i).is_some_and(|o| o.env.is_some());
            let mut policy = self.policy.clone();
            if let Some(e) = over(i).exploration_type.or(self.exploration_type) {
                policy.exploration = e;
            }
            let frames = if self.sync { f / n.max(1) } else { f };
            // The declared specs are those of the run's env, not of a node's own.
            let declared = declared.filter(|_| *env_i == env);
            let (source, v0) = match self.registry.make(env_i) {
                Ok(probe) => {
                    let (obs, act) = (probe.observation_spec(), probe.action_spec());
                    let own = EnvSpecs::from_specs(obs, act);
                    if let Some(d) = declared {
                        if let Some(diff) =
                            EnvSpecs::difference("the declared specs", d, &format!("env {}", env_i.name), &own)
                        {
                            return Err(config_error("env_spec", diff));
                        }
                    }
                    // Fail at build time, naming the policy, rather than on every node.
                    let built = policy
                        .build(obs, act, 0)
                        .map_err(|e| config_error("policy", format!("node {i}: {e}")))?;
                    let recorded = built.recorded();
                    let mut layout = batch_layout(obs, act);
                    recorded.extend_layout(&mut layout);
                    if self.launcher != Launcher::Local {
                        self.check_frames_fit(i, built.weights(), &layout, frames)?;
                    }
                    // Built by the node spec, by the same function for every node (into_plan).
                    let source = LayoutSource::Specs {
                        of: format!("env {}", env_i.name),
                        specs: own,
                        recorded,
                    };
                    (source, None)
                }
                Err(e) if self.launcher == Launcher::Local => {
                    let why = format!(
                        "{e}; the Local launcher builds its nodes' envs from the registry (an env only the nodes \
                         know needs the External, Process or Slurm launcher)"
                    );
                    return Err(if overridden {
                        config_error("node_config", format!("node {i}'s env: {why}"))
                    } else {
                        config_error("env", why)
                    });
                }
                Err(_) => match declared {
                    Some(d) => {
                        // Counted before anything is built: declared specs may make a
                        // policy far larger than a frame can carry.
                        let params = spec_params_for(&policy, d);
                        if params.and_then(|p| p.checked_mul(4)).is_none_or(|b| b > self.max_frame) {
                            return Err(config_error(
                                "env_spec",
                                format!(
                                    "node {i}: policy {} would have {} parameters for these specs, more than a \
                                     weight update of max_frame ({}) can carry",
                                    policy.config.kind_name(),
                                    params.map_or_else(|| "more than usize::MAX".to_string(), |p| p.to_string()),
                                    self.max_frame
                                ),
                            ));
                        }
                        let v0 = initial_weights_for(&policy, d)
                            .map_err(|e| config_error("policy", format!("node {i}: {e}")))?
                            .unwrap_or_else(|| Weights::new(Default::default()));
                        let recorded = d.recorded(&policy.config);
                        self.check_frames_fit(i, &v0, &d.batch_layout_recording(recorded), frames)?;
                        let source = LayoutSource::Specs {
                            of: "the declared specs (env_spec)".into(),
                            specs: d.clone(),
                            recorded,
                        };
                        (source, Some(v0))
                    }
                    None => (
                        LayoutSource::FirstReady {
                            env: env_i.name.clone(),
                        },
                        None,
                    ),
                },
            };
            let layout = match &source {
                LayoutSource::Specs { specs, recorded, .. } => Some(specs.batch_layout_recording(*recorded)),
                _ => None,
            };
            policies.push(policy);
            layouts.push(layout);
            sources.push(source);
            initial.push(v0);
        }
        if self.sync {
            let known: Vec<(usize, &BatchLayout)> = layouts
                .iter()
                .enumerate()
                .filter_map(|(i, l)| Some((i, l.as_ref()?)))
                .collect();
            if let Some(diff) = known
                .iter()
                .skip(1)
                .find_map(|&(i, l)| layout_difference(i, l, known[0].0, known[0].1))
            {
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
        Ok((cfg, specs, seed, sources, initial))
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

    /// An ONNX policy's model is read and checked here, once, before any node starts:
    /// it parses, tract runs its ops, and a remote node's `welcome` (the model, plus
    /// version 0 of the weights) fits both `max_frame` and the node's read limit.
    fn check_onnx_model(&self) -> Result<(), CollectError> {
        let PolicyConfig::Onnx { model, .. } = &self.policy.config else {
            return Ok(());
        };
        let weights = model
            .initial_weights()
            .map_err(|e| config_error("policy", e.to_string()))?;
        if self.launcher == Launcher::Local {
            return Ok(());
        }
        let welcome = model
            .bytes()
            .len()
            .saturating_add(rollout::wire::update_weights_len(&weights))
            .saturating_add(rollout::wire::WELCOME_SLACK);
        let max = self.max_frame.min(rollout::wire::DEFAULT_MAX_FRAME);
        if welcome > max {
            return Err(config_error(
                "max_frame",
                format!(
                    "the ONNX model ({} bytes) and its weights make a welcome of about {welcome} bytes, over the \
                     limit of {max} (max_frame, and the {} a node reads)",
                    model.bytes().len(),
                    rollout::wire::DEFAULT_MAX_FRAME
                ),
            ));
        }
        Ok(())
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

    /// The wait for a batch and the deadlines on the nodes' answers: each longer than
    /// zero, and coherent. A node cut off at a deadline must leave time to replace it
    /// before the batch is due, or the run fails where cutting the node would have
    /// saved it: every deadline on an answer a batch waits for is at most half of
    /// `batch_timeout`. What is unset is derived from what is set (a request deadline:
    /// 30 s or half of `batch_timeout`, the shorter; `batch_timeout`: 60 s or twice the
    /// longest deadline set, the longer); a pair set both that does not fit is refused,
    /// naming both.
    fn timeouts(&self) -> Result<(Duration, RequestDeadlines), CollectError> {
        let answers = [
            ("request_timeout", self.request_timeout),
            ("seed_timeout", self.seed_timeout),
            ("update_weights_timeout", self.update_weights_timeout),
            ("snapshot_timeout", self.snapshot_timeout),
            ("continue_timeout", self.continue_timeout),
        ];
        let shutdown = self.shutdown_ack_timeout.unwrap_or(self.shutdown_timeout / 2);
        let named = answers.iter().copied().chain([
            ("shutdown_ack_timeout", Some(shutdown)),
            ("batch_timeout", self.batch_timeout),
        ]);
        if let Some((field, _)) = named.into_iter().find(|(_, t)| t.is_some_and(|t| t.is_zero())) {
            return Err(config_error(field, "must be longer than zero"));
        }
        let batch = match self.batch_timeout {
            Some(batch) => {
                let too_long = answers
                    .iter()
                    .find_map(|&(f, d)| d.filter(|&d| d > batch / 2).map(|d| (f, d)));
                if let Some((field, d)) = too_long {
                    return Err(config_error(
                        field,
                        format!(
                            "{:.1} s is more than half of batch_timeout ({:.1} s): a node cut off at this deadline \
                             would leave too little time to replace it before the batch is due, and the run would \
                             fail instead; lower {field} or raise batch_timeout",
                            d.as_secs_f64(),
                            batch.as_secs_f64()
                        ),
                    ));
                }
                batch
            }
            None => answers
                .iter()
                .filter_map(|&(_, d)| d)
                .map(|d| d.saturating_mul(2))
                .fold(DEFAULT_BATCH_TIMEOUT, Duration::max),
        };
        let request = self.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT.min(batch / 2));
        let or_request = |d: Option<Duration>| Some(d.unwrap_or(request));
        let deadlines = RequestDeadlines {
            seed: or_request(self.seed_timeout),
            update_weights: or_request(self.update_weights_timeout),
            checkpoint: or_request(self.snapshot_timeout),
            batch: self.continue_timeout,
            shutdown: Some(shutdown),
        };
        Ok((batch, deadlines))
    }

    /// Checks every setting and plans the run: the trainer's machine (resumed and
    /// supervised as configured), the node specs, the launcher; nothing is started.
    pub(super) fn into_plan(self) -> Result<Plan, CollectError> {
        let (batch_timeout, deadlines) = self.timeouts()?;
        if self.replay_buffer.is_some() && self.split_trajs {
            return Err(config_error(
                "replay_buffer",
                "a replay buffer stores frames and split_trajs pads trajectories: use one or the other",
            ));
        }
        let (cfg, specs, seed, layouts, declared) = self.plan_run()?;
        let n = cfg.nodes;
        // Version 0: built here, once, by the same function for every node (from the
        // env's specs, or the declared ones); the launchers hand it to the nodes, which
        // never build weights of their own. For an env only the nodes know it is built
        // by the machine once the first of them reported the specs.
        let mut initial = Vec::with_capacity(n);
        let mut deferred: Vec<(String, PolicySpec)> = Vec::new();
        for ((spec, source), v0) in specs.iter().zip(&layouts).zip(declared) {
            initial.push(match (source, v0) {
                (_, Some(v0)) => Some(v0),
                (LayoutSource::FirstReady { env }, None) => {
                    if !deferred.iter().any(|(e, _)| e == env) {
                        deferred.push((env.clone(), spec.policy.clone()));
                    }
                    None
                }
                (_, None) => Some(
                    spec.initial_weights(&self.registry)
                        .map_err(|source| CollectError::NodeBuild {
                            node: spec.index,
                            source,
                        })?,
                ),
            });
        }
        let mut machine = TrainerMachine::new(cfg)?
            .with_initial_weights_where_known(initial)?
            .with_layout_sources(layouts)
            .with_nonfinite_weights_allowed(self.allow_nonfinite_weights);
        for (env, policy) in deferred {
            machine = machine.with_deferred_policy(env, policy);
        }
        if self.launcher != Launcher::Local {
            machine = machine.with_max_frame(self.max_frame);
        }
        if let Some(c) = self.resume.clone() {
            machine = machine.with_resume(c)?;
        }
        // The protocol versions that can serve this run, from its plan: a node of any
        // other is refused at `hello`.
        let launch = self.launch(machine.admit_versions(&self.policy.config))?;
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
        if let Some(mut sup) = self.node_supervision.clone() {
            if sup.intensity.window.as_millis() == 0 {
                return Err(config_error("node_restart_window", "must be at least 1 ms"));
            }
            // Nodes that join on their own are peers, not children of this trainer: a
            // failure frees the slot for the next joiner instead of counting against the
            // intensity, and a sync run waits for one at most the join timeout.
            if self.launcher == Launcher::External {
                sup.open_slot_wait = Some(self.join_timeout);
            }
            machine = machine.with_supervision(sup);
        }
        machine = machine.with_deadlines(deadlines);
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
                    batch_timeout: Some(batch_timeout),
                    // Set by the builder once the endpoint is up.
                    metrics: None,
                },
            },
            launch,
            launcher: self.launcher,
            batch_timeout,
            shutdown_timeout: self.shutdown_timeout,
            node_count: n,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::CollectorBuilder;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn unset_request_deadlines_are_at_most_half_of_the_batch_timeout() {
        let (batch, d) = CollectorBuilder::default().settings().timeouts().expect("defaults");
        assert_eq!(
            (batch, d.seed, d.update_weights, d.checkpoint),
            (secs(60), Some(secs(30)), Some(secs(30)), Some(secs(30)))
        );
        let (batch, d) = CollectorBuilder::default()
            .batch_timeout(secs(20))
            .settings()
            .timeouts()
            .expect("20 s");
        assert_eq!(batch, secs(20));
        assert_eq!(
            (d.seed, d.update_weights, d.checkpoint),
            (Some(secs(10)), Some(secs(10)), Some(secs(10)))
        );
        assert_eq!(d.batch, None, "no Continue deadline unless set");
        let (_, d) = CollectorBuilder::default()
            .batch_timeout(secs(20))
            .seed_timeout(secs(2))
            .settings()
            .timeouts()
            .expect("a shorter seed deadline");
        assert_eq!((d.seed, d.update_weights), (Some(secs(2)), Some(secs(10))));
    }

    #[test]
    fn an_unset_batch_timeout_is_at_least_twice_every_deadline_set() {
        let (batch, d) = CollectorBuilder::default()
            .request_timeout(secs(45))
            .settings()
            .timeouts()
            .expect("45 s");
        assert_eq!((batch, d.seed), (secs(90), Some(secs(45))));
        let (batch, _) = CollectorBuilder::default()
            .continue_timeout(secs(100))
            .settings()
            .timeouts()
            .expect("continue");
        assert_eq!(batch, secs(200));
        let (batch, _) = CollectorBuilder::default()
            .seed_timeout(secs(5))
            .settings()
            .timeouts()
            .expect("short");
        assert_eq!(batch, secs(60));
    }

    #[test]
    fn a_deadline_set_over_half_of_a_batch_timeout_set_is_refused_naming_both() {
        for (field, b) in [
            ("request_timeout", CollectorBuilder::default().request_timeout(secs(30))),
            ("seed_timeout", CollectorBuilder::default().seed_timeout(secs(11))),
            (
                "update_weights_timeout",
                CollectorBuilder::default().update_weights_timeout(secs(11)),
            ),
            (
                "snapshot_timeout",
                CollectorBuilder::default().snapshot_timeout(secs(20)),
            ),
            (
                "continue_timeout",
                CollectorBuilder::default().continue_timeout(secs(25)),
            ),
        ] {
            match b.batch_timeout(secs(20)).settings().timeouts() {
                Err(CollectError::Config(e)) => {
                    assert_eq!(e.field, field);
                    assert!(e.reason.contains("batch_timeout (20.0 s)"), "{}", e.reason);
                }
                other => panic!("{field}: {other:?}"),
            }
        }
        let exactly_half = CollectorBuilder::default()
            .batch_timeout(secs(20))
            .request_timeout(secs(10));
        assert!(exactly_half.settings().timeouts().is_ok());
    }

    fn builder(env: &str, launcher: Launcher) -> CollectorBuilder {
        CollectorBuilder::default()
            .env(env)
            .frames_per_batch(8)
            .nodes(2)
            .launcher(launcher)
    }

    fn config_error_of(b: CollectorBuilder) -> rollout::machine::ConfigError {
        match b.settings().plan_run() {
            Err(CollectError::Config(e)) => e,
            Err(other) => panic!("expected a config error, got {other}"),
            Ok(_) => panic!("expected a config error, got a plan"),
        }
    }

    fn image() -> EnvSpecs {
        EnvSpecs {
            observation: rollout::space::Space::Box {
                dtype: rollout::tensor::DType::U8,
                shape: vec![4, 4],
                low: None,
                high: None,
            },
            action: rollout::space::Space::Discrete { n: 3, start: 0 },
        }
    }

    #[test]
    fn an_env_only_the_nodes_know_is_taken_from_the_first_ready_except_by_the_local_launcher() {
        let e = config_error_of(builder("Atari-v0", Launcher::Local));
        assert_eq!(e.field, "env");
        assert!(e.reason.starts_with("unknown env `Atari-v0`"), "{}", e.reason);
        assert!(
            e.reason
                .contains("the Local launcher builds its nodes' envs from the registry"),
            "{}",
            e.reason
        );
        let (_, _, _, sources, initial) = builder("Atari-v0", Launcher::External)
            .settings()
            .plan_run()
            .expect("a plan");
        assert_eq!(sources, vec![LayoutSource::FirstReady { env: "Atari-v0".into() }; 2]);
        assert_eq!(initial, vec![None, None], "built once the specs are known");
        let (_, _, _, sources, _) = builder("CartPole-v1", Launcher::External)
            .settings()
            .plan_run()
            .expect("a plan");
        assert!(
            matches!(&sources[0], LayoutSource::Specs { of, .. } if of == "env CartPole-v1"),
            "{sources:?}"
        );
    }

    #[test]
    fn declared_specs_give_the_layout_and_version_0_up_front_and_bad_ones_are_named() {
        let d = EnvSpecs::from_specs(
            &rollout::Spec::uniform_box(3, -1.0, 1.0),
            &rollout::Spec::Discrete { n: 2 },
        );
        let (_, _, _, sources, initial) = builder("Custom-v0", Launcher::External)
            .env_spec(d.clone())
            .settings()
            .plan_run()
            .expect("a plan");
        assert_eq!(
            sources[1],
            LayoutSource::Specs {
                of: "the declared specs (env_spec)".into(),
                specs: d.clone(),
                recorded: rollout::policy::Recorded::Categorical { n: 2 },
            }
        );
        let want = initial_weights_for(&PolicySpec::default(), &d).unwrap();
        assert_eq!(
            initial[0], want,
            "version 0 of the default policy (linear) for the declared specs"
        );
        // A policy that cannot take them: named, with the key.
        let e = config_error_of(builder("Custom-v0", Launcher::External).env_spec(image()));
        assert_eq!(e.field, "policy");
        assert!(
            e.reason.contains("cannot take observation: u8 box [4, 4]"),
            "{}",
            e.reason
        );
        // Specs that cannot be collected, and specs other than the registry's env's.
        let mut empty = image();
        empty.observation = rollout::space::Space::Dict {
            spaces: Default::default(),
        };
        let e = config_error_of(builder("Custom-v0", Launcher::External).env_spec(empty));
        assert_eq!((e.field, e.reason.as_str()), ("env_spec", "observation: an empty dict"));
        let e = config_error_of(builder("CartPole-v1", Launcher::External).env_spec(d));
        assert_eq!(e.field, "env_spec");
        assert!(
            e.reason
                .starts_with("the declared specs's observation is f32 [3], env CartPole-v1's is f32 [4]"),
            "{}",
            e.reason
        );
    }

    #[test]
    fn declared_specs_that_make_a_policy_too_large_for_a_frame_are_refused_before_it_is_built() {
        // 2^40 choices: an MLP of 64 x 2^40 parameters, counted, never allocated.
        let huge = EnvSpecs::from_specs(
            &rollout::Spec::uniform_box(3, -1.0, 1.0),
            &rollout::Spec::Discrete { n: 1 << 40 },
        );
        let e = config_error_of(
            builder("Custom-v0", Launcher::External)
                .policy(rollout::PolicyConfig::Mlp { hidden: vec![64] })
                .env_spec(huge),
        );
        assert_eq!(e.field, "env_spec");
        assert!(
            e.reason.contains(&format!(
                "policy mlp would have {} parameters",
                3 * 64 + 64 + 64 * (1u64 << 40) + (1u64 << 40)
            )),
            "{}",
            e.reason
        );
    }

    #[cfg(feature = "onnx")]
    fn onnx(bytes: Vec<u8>) -> rollout::PolicyConfig {
        rollout::PolicyConfig::Onnx {
            model: rollout::policy::OnnxModel::new(bytes),
            head: rollout::policy::OnnxHead::Categorical,
        }
    }

    #[cfg(feature = "onnx")]
    fn fixture(name: &str) -> Vec<u8> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx");
        std::fs::read(dir.join(name)).expect("fixture")
    }

    #[cfg(feature = "onnx")]
    #[test]
    fn an_onnx_model_is_checked_before_any_node_starts() {
        // Not ONNX: refused naming the policy, for an env only the nodes know too.
        for env in ["CartPole-v1", "OnlyTheNodesKnow-v0"] {
            let e = config_error_of(builder(env, Launcher::Process).policy(onnx(b"not a model".to_vec())));
            assert_eq!(e.field, "policy", "{env}: {}", e.reason);
            assert!(e.reason.contains("not an ONNX model"), "{}", e.reason);
        }
        // Another env's model: refused naming the tensor.
        let e = config_error_of(builder("CartPole-v1", Launcher::Local).policy(onnx(fixture("pendulum_normal.onnx"))));
        assert_eq!(e.field, "policy");
        assert!(e.reason.contains("input `observation`"), "{}", e.reason);
        // A welcome (model and weights) over max_frame.
        let b = builder("CartPole-v1", Launcher::Process)
            .policy(onnx(fixture("cartpole_categorical.onnx")))
            .max_frame(32 << 10);
        let e = config_error_of(b);
        assert_eq!(e.field, "max_frame");
        assert!(e.reason.contains("welcome"), "{}", e.reason);
        // The same model fits the default limit.
        let b = builder("CartPole-v1", Launcher::Process).policy(onnx(fixture("cartpole_categorical.onnx")));
        assert!(b.settings().plan_run().is_ok());
    }
}
