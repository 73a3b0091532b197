//! Planning a run: the builder's settings checked (every error names the setting at
//! fault) and turned into the trainer's machine and one [`NodeSpec`] per node.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rollout::machine::trainer::{LayoutSource, Membership};
use rollout::machine::{RequestDeadlines, TrainerConfig, TrainerMachine};
use rollout::node_spec::NodeSpec;
use rollout::run_plan::{Placement, RunPlan};
use rollout::PolicySpec;

use super::settings::{Settings, DEFAULT_BATCH_TIMEOUT, DEFAULT_REQUEST_TIMEOUT};
use crate::delivery::Delivery;
use crate::error::CollectError;
use crate::launch::{config_error, Launch, Launcher, NodePlan};

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
        self.plan_run().map(|p| (p.trainer, p.nodes, p.seed))
    }

    /// The run planned by the core ([`RunSettings::plan`]) for this launcher's
    /// placement of its nodes, with its slots and seed.
    fn plan_run(&self) -> Result<RunPlan, CollectError> {
        let nodes = self.node_slots()?;
        let seed = self.seed.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        let placement = match self.launcher {
            Launcher::Local => Placement::InProcess,
            _ => Placement::Remote,
        };
        Ok(self.run.plan(nodes, seed, &self.registry, placement)?)
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
        if self.run.sync {
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

    /// The wait for a batch and the deadlines on the nodes' answers: each longer than
    /// zero (the heartbeat's and the node restart window too), and coherent. A node cut off at a deadline must leave time to replace it
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
        let window = self.node_supervision.as_ref().map(|s| s.intensity.window);
        let named = named.chain([("node_restart_window", window)]);
        if let Some((field, _)) = named.into_iter().find(|(_, t)| t.is_some_and(|t| t.is_zero())) {
            return Err(config_error(field, "must be longer than zero"));
        }
        // Checked whatever the launcher, so a bad value is refused before a run that
        // does not use it is taken as a test of it.
        if self.heartbeat.is_zero() || self.heartbeat_timeout <= self.heartbeat {
            return Err(config_error(
                "heartbeat",
                "the interval must be longer than zero, and the timeout longer than the interval",
            ));
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
        let RunPlan {
            trainer: cfg,
            nodes: specs,
            seed,
            sources: layouts,
            declared_initial: declared,
        } = self.plan_run()?;
        let n = cfg.nodes();
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
            machine = machine.with_max_frame(self.run.max_frame);
        }
        if let Some(c) = self.resume.clone() {
            machine = machine.with_resume(c)?;
        }
        // The protocol versions that can serve this run, from its plan: a node of any
        // other is refused at `hello`.
        let withholds = specs.iter().any(|s| s.policy.withholds_records());
        let on_any = specs.iter().any(|s| s.env.done_on_any);
        let launch = self.launch(machine.admit_versions(&self.run.policy.config, withholds, on_any))?;
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

    use rollout::machine::trainer::initial_weights_for;
    use rollout::space::EnvSpecs;

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
            agents: None,
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
        let RunPlan {
            sources,
            declared_initial: initial,
            ..
        } = builder("Atari-v0", Launcher::External)
            .settings()
            .plan_run()
            .expect("a plan");
        assert_eq!(sources, vec![LayoutSource::FirstReady { env: "Atari-v0".into() }; 2]);
        assert_eq!(initial, vec![None, None], "built once the specs are known");
        let RunPlan { sources, .. } = builder("CartPole-v1", Launcher::External)
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
        let RunPlan {
            sources,
            declared_initial: initial,
            ..
        } = builder("Custom-v0", Launcher::External)
            .env_spec(d.clone())
            .settings()
            .plan_run()
            .expect("a plan");
        assert_eq!(
            sources[1],
            LayoutSource::Specs {
                of: "the declared specs (env_spec)".into(),
                specs: Box::new(d.clone()),
                recorded: rollout::policy::Recorded::Categorical { n: 2 },
                state: vec![],
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
            state: vec![],
            exploration: None,
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
