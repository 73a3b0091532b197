//! A run planned from its settings, before anything starts: the trainer's config, one
//! [`NodeSpec`] per node, where each node's batch layout comes from and its version 0
//! of the weights where it is known. Every rule about the settings of a run is checked
//! here (the frames' shares in [`Shares`], the policy against the env's specs, what a
//! frame can carry), each error naming the setting at fault; the collector's builder
//! only adds what is about launching (how many slots, which launcher, the clock's
//! seed). Pure: no thread, socket or clock.

use std::collections::BTreeMap;

use crate::config_error::ConfigError;
use crate::env::{EnvSpec, Registry};
use crate::machine::trainer::{initial_weights_for, spec_params_for, LayoutSource, TrainerConfig};
use crate::node_spec::{NodeSpec, DEFAULT_WORKER_NICE};
use crate::policy::{ExplorationType, PolicyConfig, PolicySpec, Recorded, Weights};
use crate::rollout::{batch_layout, layout_difference, BatchLayout, RolloutConfig};
use crate::shares::Shares;
use crate::space::EnvSpecs;
use crate::supervisor::RestartIntensity;
use crate::wire::{update_weights_len, DEFAULT_MAX_FRAME, WELCOME_SLACK};

/// What one node does differently from the others (torchrl's per-collector
/// `collector_kwargs`); `None` keeps the run's setting.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeOverrides {
    /// The env this node's workers step instead of the run's.
    pub env: Option<EnvSpec>,
    /// This node's envs instead of the run's `envs_per_node`.
    pub envs_per_node: Option<usize>,
    /// This node's exploration instead of the run's.
    pub exploration_type: Option<ExplorationType>,
}

/// Where the run's nodes are, which decides what the plan can know and must check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Nodes in this process, built from the registry: every env must be one it
    /// builds, and no frame crosses a socket.
    InProcess,
    /// Nodes behind a socket: an env only they know is fine (its specs come from the
    /// first node ready, or are declared), and every frame must fit `max_frame`.
    Remote,
}

/// Every setting of a run that the plan reads, torchrl's names and defaults.
#[derive(Clone, Debug)]
pub struct RunSettings {
    /// The env every node steps (unless overridden); required.
    pub env: Option<EnvSpec>,
    /// The env's specs, declared (for an env the trainer cannot build).
    pub env_specs: Option<EnvSpecs>,
    /// Per-node overrides, by node index.
    pub node_configs: BTreeMap<usize, NodeOverrides>,
    /// The policy every node runs.
    pub policy: PolicySpec,
    /// The exploration of every node (unless overridden); `None` keeps the policy's.
    pub exploration_type: Option<ExplorationType>,
    /// Whether batches carry what the policy records beside its actions; `None`: a
    /// node records when it samples its actions, not when it acts deterministically.
    pub record: Option<bool>,
    /// Envs of each node (unless overridden).
    pub envs_per_node: usize,
    /// Envs each env worker steps.
    pub envs_per_worker: usize,
    /// Frames of the run's batch; required.
    pub frames_per_batch: Option<usize>,
    /// Frames in all, `-1` for endless (torchrl's convention).
    pub total_frames: i64,
    /// Sync or async collection.
    pub sync: bool,
    /// Push the weights before each collection.
    pub update_after_each_batch: bool,
    /// Push to a node after this many batches without an update.
    pub max_weight_update_interval: Option<u64>,
    /// Push to all nodes every this many yielded batches.
    pub update_interval: Option<u64>,
    /// Async: drop (or, with `deliver_lagging`, flag) batches whose weights are more
    /// than this many versions behind the stored ones.
    pub max_policy_lag: Option<u64>,
    /// Deliver batches past `max_policy_lag` flagged instead of dropping them.
    pub deliver_lagging: bool,
    /// Async: batches each node collects ahead of the consumer.
    pub prefetch: usize,
    /// Longest trajectory before it is truncated.
    pub max_frames_per_traj: Option<u64>,
    /// Multi-agent envs: every node's episodes end once any agent is done
    /// ([`EnvSpec::done_on_any`], set on each node's env, overridden ones too).
    pub done_on_any: bool,
    /// Frames collected with the random policy first, over the whole run.
    pub init_random_frames: u64,
    /// Reset every env at the start of each batch.
    pub reset_at_each_iter: bool,
    /// A NaN in an observation fails the env worker.
    pub nan_is_failure: bool,
    /// How often an env worker may be restarted.
    pub restart: RestartIntensity,
    /// The env workers' nice increment, `0..=19`.
    pub worker_nice: i32,
    /// The largest frame a connection carries (remote nodes).
    pub max_frame: usize,
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            env: None,
            env_specs: None,
            node_configs: BTreeMap::new(),
            policy: PolicySpec::default(),
            exploration_type: None,
            record: None,
            envs_per_node: 1,
            envs_per_worker: 1,
            frames_per_batch: None,
            total_frames: -1,
            sync: false,
            update_after_each_batch: false,
            max_weight_update_interval: None,
            update_interval: None,
            max_policy_lag: None,
            deliver_lagging: false,
            prefetch: 0,
            max_frames_per_traj: None,
            done_on_any: false,
            init_random_frames: 0,
            reset_at_each_iter: false,
            nan_is_failure: false,
            restart: RestartIntensity::default(),
            worker_nice: DEFAULT_WORKER_NICE,
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}

/// A planned run.
#[derive(Clone, Debug)]
pub struct RunPlan {
    /// The trainer's config (its shares included).
    pub trainer: TrainerConfig,
    /// One spec per node, in node order.
    pub nodes: Vec<NodeSpec>,
    /// The run's seed.
    pub seed: u64,
    /// Where each node's batch layout comes from.
    pub sources: Vec<LayoutSource>,
    /// Each node's version 0 where it is known before any node is ready from specs the
    /// user declared (the others: built from the registry's env by the node spec, or
    /// from the first node's specs by the trainer).
    pub declared_initial: Vec<Option<Weights>>,
}

impl RunSettings {
    /// Plans a run of `nodes` nodes (an elastic run: its slots) seeded with `seed`, or
    /// the error naming the first setting it cannot be run with. An env the registry
    /// builds: its specs give the layout (a node's `ready` must announce it). Specs the
    /// user declared: the same, from those, and version 0 is built from them. An env
    /// neither builds (never [`Placement::InProcess`]): the first node of it to be
    /// ready sets its specs.
    pub fn plan(
        &self,
        nodes: usize,
        seed: u64,
        registry: &Registry,
        placement: Placement,
    ) -> Result<RunPlan, ConfigError> {
        fn err(field: &'static str, reason: impl Into<String>) -> ConfigError {
            ConfigError::new(field, reason)
        }
        let env = self
            .env
            .clone()
            .ok_or_else(|| err("env", "required: name a registered env"))?;
        let f = self
            .frames_per_batch
            .ok_or_else(|| err("frames_per_batch", "required"))?;
        let total_frames = match self.total_frames {
            -1 => None,
            t if t < 0 => return Err(err("total_frames", format!("{t}: use -1 for endless"))),
            t => Some(t as u64),
        };
        if !(0..=19).contains(&self.worker_nice) {
            return Err(err(
                "worker_nice",
                format!(
                    "{}: must be within 0..=19 (a thread's priority can only be lowered)",
                    self.worker_nice
                ),
            ));
        }
        if self.max_frames_per_traj == Some(0) {
            return Err(err("max_frames_per_traj", "must be at least 1"));
        }
        if self.restart.window.as_millis() == 0 {
            return Err(err("restart_window", "must be at least 1 ms"));
        }
        if let Some((&i, _)) = self.node_configs.iter().find(|(&i, _)| i >= nodes.max(1)) {
            return Err(err(
                "node_config",
                format!("node {i} does not exist: there are {nodes} nodes"),
            ));
        }
        let over = |i: usize| self.node_configs.get(&i).cloned().unwrap_or_default();
        let envs: Vec<EnvSpec> = (0..nodes)
            .map(|i| {
                let env_i = over(i).env.unwrap_or_else(|| env.clone());
                let any = env_i.done_on_any || self.done_on_any;
                env_i.with_done_on_any(any)
            })
            .collect();
        let ks: Vec<usize> = (0..nodes)
            .map(|i| over(i).envs_per_node.unwrap_or(self.envs_per_node))
            .collect();
        let shares = Shares::new(f, ks, self.envs_per_worker, self.sync, total_frames).map_err(|e| {
            // Nodes' env counts differ only by their overrides.
            if e.field == "envs_per_node" && self.node_configs.values().any(|o| o.envs_per_node.is_some()) {
                ConfigError::new("node_config", e.reason)
            } else {
                e
            }
        })?;
        let trainer = TrainerConfig {
            shares,
            update_after_each_batch: self.update_after_each_batch,
            max_weight_update_interval: self.max_weight_update_interval,
            update_interval: self.update_interval,
            max_policy_lag: self.max_policy_lag,
            deliver_lagging: self.deliver_lagging,
            prefetch: self.prefetch,
        };
        trainer.validate()?;
        let max_frame = (placement == Placement::Remote).then_some(self.max_frame);
        self.check_onnx_model(max_frame)?;
        let declared = match &self.env_specs {
            Some(d) => {
                d.validate().map_err(|e| err("env_spec", e.to_string()))?;
                Some(d)
            }
            None => None,
        };
        let share = trainer.shares.node_share();
        let mut policies = Vec::with_capacity(nodes);
        let mut layouts: Vec<Option<BatchLayout>> = Vec::with_capacity(nodes);
        let mut sources = Vec::with_capacity(nodes);
        let mut declared_initial = Vec::with_capacity(nodes);
        for (i, env_i) in envs.iter().enumerate() {
            let mut policy = self.policy.clone();
            if let Some(e) = over(i).exploration_type.or(self.exploration_type) {
                policy.exploration = e;
            }
            policy.record = self.record.unwrap_or(policy.exploration == ExplorationType::Random);
            // The declared specs are those of the run's env, not of a node's own.
            let declared = declared.filter(|_| *env_i == env);
            let (source, v0) = match registry.make(env_i) {
                Ok(probe) => {
                    let (obs, act) = (probe.observation_spec(), probe.action_spec());
                    let own = EnvSpecs::from_specs(obs, act);
                    if let Some(d) = declared {
                        if let Some(diff) =
                            EnvSpecs::difference("the declared specs", d, &format!("env {}", env_i.name), &own)
                        {
                            return Err(err("env_spec", diff));
                        }
                    }
                    // Fail at plan time, naming the policy, rather than on every node.
                    let built = policy
                        .build(obs, act, 0)
                        .map_err(|e| err("policy", format!("node {i}: {e}")))?;
                    let recorded = if policy.record {
                        built.recorded()
                    } else {
                        Recorded::None
                    };
                    let state = built.state().to_vec();
                    let mut layout = batch_layout(obs, act);
                    recorded.extend_layout(&mut layout);
                    crate::policy::extend_state_layout(&state, &mut layout);
                    if let Some(max) = max_frame {
                        check_frames_fit(i, built.weights(), &layout, share, max)?;
                    }
                    // Version 0 is built by the node spec, by the same function for every node.
                    let source = LayoutSource::Specs {
                        of: format!("env {}", env_i.name),
                        specs: Box::new(own),
                        recorded,
                        state,
                    };
                    (source, None)
                }
                Err(e) if placement == Placement::InProcess => {
                    let why = format!(
                        "{e}; the Local launcher builds its nodes' envs from the registry (an env only the nodes \
                         know needs the External, Process or Slurm launcher)"
                    );
                    let overridden = self.node_configs.get(&i).is_some_and(|o| o.env.is_some());
                    return Err(if overridden {
                        err("node_config", format!("node {i}'s env: {why}"))
                    } else {
                        err("env", why)
                    });
                }
                Err(_) => match declared {
                    Some(d) => {
                        // Counted before anything is built: declared specs may make a
                        // policy far larger than a frame can carry.
                        let params = spec_params_for(&policy, d);
                        if params.and_then(|p| p.checked_mul(4)).is_none_or(|b| b > self.max_frame) {
                            return Err(err(
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
                            .map_err(|e| err("policy", format!("node {i}: {e}")))?
                            .unwrap_or_else(|| Weights::new(Default::default()));
                        let recorded = d.recorded_by(&policy);
                        let state = policy.config.state().to_vec();
                        check_frames_fit(i, &v0, &d.batch_layout_with(recorded, &state), share, self.max_frame)?;
                        let source = LayoutSource::Specs {
                            of: "the declared specs (env_spec)".into(),
                            specs: Box::new(d.clone()),
                            recorded,
                            state,
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
            layouts.push(match &source {
                LayoutSource::Specs {
                    specs, recorded, state, ..
                } => Some(specs.batch_layout_with(*recorded, state)),
                _ => None,
            });
            policies.push(policy);
            sources.push(source);
            declared_initial.push(v0);
        }
        if self.sync {
            check_sync_layouts(&layouts)?;
        }
        let shares = &trainer.shares;
        let lanes = shares.lanes();
        let specs = envs
            .into_iter()
            .zip(policies)
            .enumerate()
            .map(|(i, (env_i, policy))| {
                let first_lane = shares.first_lane(i);
                NodeSpec {
                    index: i,
                    env: env_i,
                    policy,
                    envs_per_node: shares.envs(i),
                    envs_per_worker: shares.envs_per_worker(),
                    first_lane,
                    lanes,
                    rollout: RolloutConfig {
                        frames_per_batch: shares.env_share(i),
                        max_frames_per_traj: self.max_frames_per_traj,
                        reset_at_each_iter: self.reset_at_each_iter,
                        // Counted per env worker, whose frames are its envs' together.
                        init_random_frames: self
                            .init_random_frames
                            .div_ceil(lanes)
                            .saturating_mul(shares.envs_per_worker() as u64),
                        // Node i's workers take the seeds after those of nodes 0..i.
                        seed: seed.wrapping_add(first_lane),
                        nan_is_failure: self.nan_is_failure,
                    },
                    max_restarts: self.restart.max_restarts,
                    restart_window_ms: self.restart.window.as_millis() as u64,
                    worker_nice: self.worker_nice,
                }
            })
            .collect();
        Ok(RunPlan {
            trainer,
            nodes: specs,
            seed,
            sources,
            declared_initial,
        })
    }

    /// An ONNX policy's model is checked here, once, before any node starts: its
    /// weights are read, and a remote node's `welcome` (the model, plus version 0 of
    /// the weights) fits both `max_frame` and the node's read limit.
    fn check_onnx_model(&self, max_frame: Option<usize>) -> Result<(), ConfigError> {
        let PolicyConfig::Onnx { model, .. } = &self.policy.config else {
            return Ok(());
        };
        let weights = model
            .initial_weights()
            .map_err(|e| ConfigError::new("policy", e.to_string()))?;
        let Some(max_frame) = max_frame else {
            return Ok(());
        };
        let welcome = model
            .bytes()
            .len()
            .saturating_add(update_weights_len(&weights))
            .saturating_add(WELCOME_SLACK);
        let max = max_frame.min(DEFAULT_MAX_FRAME);
        if welcome > max {
            return Err(ConfigError::new(
                "max_frame",
                format!(
                    "the ONNX model ({} bytes) and its weights make a welcome of about {welcome} bytes, over the \
                     limit of {max} (max_frame, and the {DEFAULT_MAX_FRAME} a node reads)",
                    model.bytes().len(),
                ),
            ));
        }
        Ok(())
    }
}

/// Sync collection stacks the nodes' shares, so every layout known before the run
/// must be the same (the others are checked as their nodes are ready).
fn check_sync_layouts(layouts: &[Option<BatchLayout>]) -> Result<(), ConfigError> {
    let known: Vec<(usize, &BatchLayout)> = layouts
        .iter()
        .enumerate()
        .filter_map(|(i, l)| Some((i, l.as_ref()?)))
        .collect();
    match known
        .iter()
        .skip(1)
        .find_map(|&(i, l)| layout_difference(i, l, known[0].0, known[0].1))
    {
        Some(diff) => Err(ConfigError::new(
            "node_config",
            format!("sync collection stacks node shares, but {diff}"),
        )),
        None => Ok(()),
    }
}

/// Remote node `i`'s frames fit in `max`: its weight updates, and its batches of
/// `frames` frames (their tensors alone; headers add a few hundred bytes, which the
/// node reports at run time if they are what tips it over).
fn check_frames_fit(
    i: usize,
    weights: &Weights,
    layout: &BatchLayout,
    frames: usize,
    max: usize,
) -> Result<(), ConfigError> {
    let update = update_weights_len(weights);
    if update > max {
        return Err(ConfigError::new(
            "max_frame",
            format!(
                "node {i}'s policy has {} parameters: a weight update is a frame of {update} bytes, over max_frame \
                 ({max}); raise max_frame",
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
        return Err(ConfigError::new(
            "max_frame",
            format!(
                "node {i}'s batches of {frames} frames hold {batch} bytes of tensors, over max_frame ({max}); raise \
                 max_frame or lower frames_per_batch"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{NodeOverrides, Placement, RunSettings};
    use crate::env::{EnvSpec, Registry};
    use crate::machine::trainer::LayoutSource;

    fn settings(env: &str, f: usize) -> RunSettings {
        RunSettings {
            env: Some(EnvSpec::new(env)),
            frames_per_batch: Some(f),
            ..RunSettings::default()
        }
    }

    fn field(s: &RunSettings, nodes: usize, placement: Placement) -> Option<&'static str> {
        s.plan(nodes, 0, &Registry::with_builtins(), placement)
            .err()
            .map(|e| e.field)
    }

    #[test]
    fn node_specs_carry_each_envs_share_and_their_lanes_and_seeds() -> Result<(), super::ConfigError> {
        let mut s = settings("CartPole-v1", 48);
        s.sync = true;
        s.envs_per_node = 4;
        s.envs_per_worker = 2;
        let plan = s.plan(3, 100, &Registry::with_builtins(), Placement::InProcess)?;
        assert_eq!(plan.trainer.shares.node_share(), 16);
        for (i, spec) in plan.nodes.iter().enumerate() {
            assert_eq!(spec.env_share(), 4, "16 frames of node {i} over 4 envs");
            assert_eq!((spec.first_lane, spec.lanes), (4 * i as u64, 12));
            assert_eq!(spec.rollout.seed, 100 + 4 * i as u64);
            assert_eq!(spec.workers().ok(), Some(2));
        }
        let mut s = settings("CartPole-v1", 12);
        s.node_configs.insert(
            1,
            NodeOverrides {
                envs_per_node: Some(3),
                ..NodeOverrides::default()
            },
        );
        let plan = s.plan(2, 0, &Registry::with_builtins(), Placement::InProcess)?;
        let shares: Vec<usize> = plan.nodes.iter().map(|n| n.env_share()).collect();
        assert_eq!(shares, [12, 4], "async: a whole batch over each node's own envs");
        Ok(())
    }

    #[test]
    fn the_policy_records_when_it_samples_unless_told_and_the_layout_follows() -> Result<(), super::ConfigError> {
        use crate::policy::{ExplorationType, PolicyConfig, Recorded};
        use crate::schema::keys;
        let cases = [
            // (exploration, record setting) -> records
            (ExplorationType::Random, None, true),
            (ExplorationType::Deterministic, None, false),
            (ExplorationType::Deterministic, Some(true), true),
            (ExplorationType::Random, Some(false), false),
        ];
        for (exploration, record, records) in cases {
            let mut s = settings("CartPole-v1", 20);
            s.policy.config = PolicyConfig::Linear;
            s.exploration_type = Some(exploration);
            s.record = record;
            let plan = s.plan(2, 0, &Registry::with_builtins(), Placement::Remote)?;
            let case = format!("{exploration:?}, record {record:?}");
            for (spec, source) in plan.nodes.iter().zip(&plan.sources) {
                assert_eq!(spec.policy.record, records, "{case}");
                assert_eq!(spec.policy.withholds_records(), !records, "{case}");
                let LayoutSource::Specs {
                    specs, recorded, state, ..
                } = source
                else {
                    panic!("{case}: CartPole's layout is known")
                };
                let want = if records {
                    Recorded::Categorical { n: 2 }
                } else {
                    Recorded::None
                };
                assert_eq!(*recorded, want, "{case}");
                let layout = specs.batch_layout_with(*recorded, state);
                assert_eq!(layout.contains_key(keys::ACTION_LOG_PROB), records, "{case}");
                assert_eq!(layout.contains_key(keys::LOGITS), records, "{case}");
            }
        }
        // A policy that records nothing withholds nothing (every version serves it).
        let mut s = settings("CartPole-v1", 20);
        s.policy.config = PolicyConfig::Constant { value: 1.0 };
        s.exploration_type = Some(ExplorationType::Deterministic);
        let plan = s.plan(1, 0, &Registry::with_builtins(), Placement::Remote)?;
        assert!(!plan.nodes[0].policy.withholds_records());
        Ok(())
    }

    #[test]
    fn a_policy_spec_that_records_is_the_bytes_of_older_versions() {
        use crate::policy::{PolicyConfig, PolicySpec};
        let on = PolicySpec {
            config: PolicyConfig::Linear,
            ..PolicySpec::default()
        };
        let bytes = rmp_serde::to_vec_named(&on).expect("encode");
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("record"), "no `record` key when it records");
        let off = PolicySpec {
            record: false,
            ..on.clone()
        };
        let back: PolicySpec = rmp_serde::from_slice(&rmp_serde::to_vec_named(&off).expect("encode")).expect("decode");
        assert!(!back.record);
        let older: PolicySpec = rmp_serde::from_slice(&bytes).expect("decode");
        assert!(older.record, "absent: records");
    }

    #[test]
    fn done_on_any_reaches_every_nodes_env_and_is_absent_from_the_bytes_when_off() -> Result<(), super::ConfigError> {
        let mut s = settings("Counting", 8);
        s.done_on_any = true;
        s.node_configs.insert(
            1,
            NodeOverrides {
                env: Some(EnvSpec::new("CartPole-v1")),
                ..NodeOverrides::default()
            },
        );
        let plan = s.plan(2, 0, &Registry::with_builtins(), Placement::InProcess)?;
        let on: Vec<(&str, bool)> = plan
            .nodes
            .iter()
            .map(|n| (n.env.name.as_str(), n.env.done_on_any))
            .collect();
        assert_eq!(
            on,
            [("Counting", true), ("CartPole-v1", true)],
            "the overridden env too"
        );
        let back: EnvSpec =
            rmp_serde::from_slice(&rmp_serde::to_vec_named(&plan.nodes[1].env).expect("encode")).expect("decode");
        assert!(back.done_on_any);
        let off = rmp_serde::to_vec_named(&EnvSpec::new("Counting")).expect("encode");
        assert!(
            !String::from_utf8_lossy(&off).contains("done_on_any"),
            "older nodes' bytes when off"
        );
        let older: EnvSpec = rmp_serde::from_slice(&off).expect("decode");
        assert!(!older.done_on_any, "absent: every agent");
        Ok(())
    }

    #[test]
    fn unequal_sync_nodes_are_named_by_their_override() {
        let mut s = settings("CartPole-v1", 12);
        s.sync = true;
        s.node_configs.insert(
            1,
            NodeOverrides {
                envs_per_node: Some(3),
                ..NodeOverrides::default()
            },
        );
        assert_eq!(field(&s, 2, Placement::InProcess), Some("node_config"));
        s.node_configs.insert(5, NodeOverrides::default());
        assert_eq!(field(&s, 2, Placement::InProcess), Some("node_config"), "node 5 of 2");
    }

    #[test]
    fn an_env_only_the_nodes_know_needs_remote_nodes() {
        let s = settings("OnlyTheNodesKnow-v0", 8);
        assert_eq!(field(&s, 2, Placement::InProcess), Some("env"));
        let plan = s.plan(2, 0, &Registry::with_builtins(), Placement::Remote);
        let sources = plan.map(|p| p.sources).ok();
        assert_eq!(
            sources,
            Some(vec![
                LayoutSource::FirstReady {
                    env: "OnlyTheNodesKnow-v0".into()
                };
                2
            ])
        );
    }

    #[test]
    fn each_missing_or_invalid_setting_is_named() {
        assert_eq!(field(&RunSettings::default(), 1, Placement::InProcess), Some("env"));
        let mut s = settings("CartPole-v1", 8);
        s.frames_per_batch = None;
        assert_eq!(field(&s, 1, Placement::InProcess), Some("frames_per_batch"));
        let mut s = settings("CartPole-v1", 8);
        s.total_frames = -2;
        assert_eq!(field(&s, 1, Placement::InProcess), Some("total_frames"));
        let mut s = settings("CartPole-v1", 8);
        s.worker_nice = 20;
        assert_eq!(field(&s, 1, Placement::InProcess), Some("worker_nice"));
        let mut s = settings("CartPole-v1", 8);
        s.max_frames_per_traj = Some(0);
        assert_eq!(field(&s, 1, Placement::InProcess), Some("max_frames_per_traj"));
        let mut s = settings("CartPole-v1", 8);
        s.max_frame = 64;
        assert_eq!(
            field(&s, 1, Placement::InProcess),
            None,
            "in-process frames cross no socket"
        );
        assert_eq!(field(&s, 1, Placement::Remote), Some("max_frame"));
    }
}
