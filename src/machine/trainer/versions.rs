//! Which protocol versions can serve the run: what its nodes must send, known from
//! where each node's layout comes from and the policy they act with, before any node
//! joins, so that a node of a version that cannot is refused at `hello` instead of
//! being admitted and cut at its `ready` or first batch.

use super::layout::LayoutSource;
use super::TrainerMachine;
use crate::policy::{PolicyConfig, Recorded};
use crate::schema::keys;
use crate::wire::{AdmitVersions, Need};

impl TrainerMachine {
    /// The protocol versions that can serve this run, whose nodes act with `policy`
    /// ([`AdmitVersions`]): version 4 and up where a node's env is one only the nodes
    /// know (its specs come in `ready`); version 5 where its batches must carry
    /// recorded keys (the layout the trainer checks them against has
    /// `action_log_prob`: a policy with a distribution, [`PolicyConfig::records`]),
    /// and for an `onnx` policy; version 11 where the run prefetches (a node is sent
    /// its next `continue` while it collects); version 9 where a node's policy records but the run
    /// asked for no recording (`withholds_records`, [`PolicySpec::withholds_records`]
    /// of any node); version 12 where a node's env ends its episodes once any agent is
    /// done (`done_on_any`, [`EnvSpec::done_on_any`] of any node); version 13 where the
    /// policy explores and a node's env has several agents, or may have (its specs come
    /// only in `ready`). A node with nothing known of it ([`LayoutSource::Announced`], a
    /// machine driven without a plan) needs nothing.
    ///
    /// [`PolicySpec::withholds_records`]: crate::policy::PolicySpec::withholds_records
    /// [`EnvSpec::done_on_any`]: crate::EnvSpec::done_on_any
    pub fn admit_versions(&self, policy: &PolicyConfig, withholds_records: bool, done_on_any: bool) -> AdmitVersions {
        let recorded = || Need::Recorded {
            policy: policy.kind_name().to_string(),
        };
        let mut needs = Vec::new();
        // Whether some node's env may have several agents: its specs say so, or they come
        // only in `ready`.
        let mut agents_possible = false;
        for source in &self.layouts.sources {
            match source {
                LayoutSource::Known { layout, .. } => {
                    if layout.contains_key(keys::ACTION_LOG_PROB) {
                        needs.push(recorded());
                    }
                }
                LayoutSource::Specs { specs, recorded: r, .. } => {
                    if *r != Recorded::None {
                        needs.push(recorded());
                    }
                    if specs.is_multi_agent() {
                        needs.push(Need::Agents);
                        agents_possible = true;
                    }
                }
                LayoutSource::FirstReady { env } => {
                    needs.push(Need::Specs { env: env.clone() });
                    agents_possible = true;
                    if policy.records() && !withholds_records {
                        needs.push(recorded());
                    }
                }
                LayoutSource::Announced => {}
            }
        }
        if matches!(policy, PolicyConfig::Onnx { .. }) {
            needs.push(Need::Onnx);
        }
        if !policy.model_state().is_empty() {
            needs.push(Need::Recurrent);
        }
        if policy.exploration().is_some() {
            needs.push(Need::Exploration);
            if agents_possible {
                needs.push(Need::AgentExploration);
            }
        }
        if self.cfg.prefetch > 0 {
            needs.push(Need::Prefetch);
        }
        if done_on_any {
            needs.push(Need::DoneOnAny);
        }
        if withholds_records {
            needs.push(Need::Unrecorded {
                policy: policy.kind_name().to_string(),
            });
        }
        if matches!(
            policy,
            PolicyConfig::Onnx {
                head: crate::policy::OnnxHead::QValue,
                ..
            }
        ) {
            needs.push(Need::QValue);
        }
        AdmitVersions::serving(needs)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::space::EnvSpecs;
    use crate::spec::Spec;

    fn specs() -> EnvSpecs {
        EnvSpecs::from_specs(&Spec::uniform_box(4, -1.0, 1.0), &Spec::Discrete { n: 2 })
    }

    fn built(recorded: Recorded) -> LayoutSource {
        LayoutSource::Specs {
            of: "env Custom".into(),
            specs: Box::new(specs()),
            recorded,
            state: vec![],
        }
    }

    fn first_ready() -> LayoutSource {
        LayoutSource::FirstReady { env: "Custom".into() }
    }

    fn versions(sources: Vec<LayoutSource>, policy: &PolicyConfig) -> AdmitVersions {
        let n = sources.len();
        machine(config(n, 1, 4, None, false))
            .with_layout_sources(sources)
            .admit_versions(policy, false, false)
    }

    #[test]
    fn a_policy_that_records_needs_version_5_and_an_env_only_the_nodes_know_version_4() {
        let constant = PolicyConfig::Constant { value: 1.0 };
        let mlp = PolicyConfig::Mlp { hidden: vec![8] };
        // An env the trainer builds, acted on by a policy that records nothing: every version.
        assert_eq!(versions(vec![built(Recorded::None); 2], &constant).oldest(), 3);
        // ... by one that records: 5, the policy named.
        let v = versions(vec![built(Recorded::Categorical { n: 2 }); 2], &mlp);
        assert_eq!(v.oldest(), 5);
        assert_eq!(v.need(), Some(&Need::Recorded { policy: "mlp".into() }));
        // An env only the nodes know: 4 for its specs, 5 if the policy records.
        let v = versions(vec![first_ready(); 2], &constant);
        assert_eq!(v.need(), Some(&Need::Specs { env: "Custom".into() }));
        assert_eq!(v.oldest(), 4);
        assert_eq!(versions(vec![first_ready(); 2], &PolicyConfig::Random).oldest(), 5);
        // One node of either kind sets the run's.
        assert_eq!(
            versions(vec![built(Recorded::None), first_ready()], &constant).oldest(),
            4
        );
        // A layout the trainer was given: by whether it holds action_log_prob.
        let mut layout = specs().batch_layout();
        let known = |layout| LayoutSource::Known {
            of: "the trainer".into(),
            layout,
        };
        assert_eq!(versions(vec![known(layout.clone())], &constant).oldest(), 3);
        Recorded::LogProb.extend_layout(&mut layout);
        assert_eq!(versions(vec![known(layout)], &PolicyConfig::Random).oldest(), 5);
        // Nothing known of a node: nothing needed.
        assert_eq!(versions(vec![LayoutSource::Announced], &mlp).oldest(), 3);
    }

    #[test]
    fn a_recurrent_policy_needs_version_6_and_the_refusal_says_so() {
        let onnx = |state| PolicyConfig::Onnx {
            model: crate::policy::OnnxModel::new(Vec::new()),
            head: crate::policy::OnnxHead::Categorical,
            state,
            exploration: None,
        };
        let plain = versions(vec![built(Recorded::Categorical { n: 2 })], &onnx(vec![]));
        assert_eq!(plain.oldest(), 5);
        let lstm = vec![
            crate::policy::StateTensor::new("recurrent_state_h", [1, 64]),
            crate::policy::StateTensor::new("recurrent_state_c", [1, 64]),
        ];
        let v = versions(vec![built(Recorded::Categorical { n: 2 })], &onnx(lstm));
        assert_eq!(v.need(), Some(&Need::Recurrent));
        assert_eq!(v.oldest(), 6);
        v.check(6).expect("version 6 serves it");
        let refusal = v.check(5).expect_err("version 5 knows no state");
        assert!(
            refusal.contains("protocol version 5 cannot serve this run")
                && refusal.contains("recurrent onnx model")
                && refusal.contains("this run admits 6"),
            "{refusal}"
        );
    }

    #[test]
    fn an_exploration_module_needs_version_7_and_the_refusal_says_so() {
        let module = crate::policy::ExplorationModule::OrnsteinUhlenbeck(crate::policy::OrnsteinUhlenbeck {
            eps: "eps".into(),
            theta: 0.15,
            mu: 0.0,
            sigma: 0.2,
            sigma_min: None,
            n_steps_annealing: 1000,
            dt: 0.01,
            x0: vec![],
        });
        let ou = PolicyConfig::Onnx {
            model: crate::policy::OnnxModel::new(Vec::new()),
            head: crate::policy::OnnxHead::Deterministic,
            state: module.state(1),
            exploration: Some(module),
        };
        // Its state is the module's, not a recurrent model's: the need is the module's.
        let v = versions(vec![built(Recorded::None)], &ou);
        assert_eq!((v.oldest(), v.need()), (7, Some(&Need::Exploration)));
        v.check(7).expect("version 7 serves it");
        let refusal = v.check(6).expect_err("version 6 knows no exploration module");
        assert!(
            refusal.contains("protocol version 6 cannot serve this run") && refusal.contains("Ornstein-Uhlenbeck"),
            "{refusal}"
        );
    }

    #[test]
    fn the_qvalue_head_needs_version_8_with_or_without_epsilon_greedy() {
        for exploration in [
            None,
            Some(crate::policy::ExplorationModule::EpsilonGreedy(
                crate::policy::EpsilonGreedy { eps: "eps".into() },
            )),
        ] {
            let q = PolicyConfig::Onnx {
                model: crate::policy::OnnxModel::new(Vec::new()),
                head: crate::policy::OnnxHead::QValue,
                state: vec![],
                exploration,
            };
            let v = versions(vec![built(Recorded::QValue { n: 2 })], &q);
            assert_eq!((v.oldest(), v.need()), (8, Some(&Need::QValue)));
            v.check(8).expect("version 8 serves it");
            let refusal = v.check(7).expect_err("version 7 knows no qvalue head");
            assert!(
                refusal.contains("protocol version 7 cannot serve this run") && refusal.contains("qvalue head"),
                "{refusal}"
            );
        }
    }

    #[test]
    fn exploring_on_an_env_of_several_agents_needs_version_13() {
        let greedy = PolicyConfig::Onnx {
            model: crate::policy::OnnxModel::new(Vec::new()),
            head: crate::policy::OnnxHead::QValue,
            state: vec![],
            exploration: Some(crate::policy::ExplorationModule::EpsilonGreedy(
                crate::policy::EpsilonGreedy { eps: "eps".into() },
            )),
        };
        let marl = LayoutSource::Specs {
            of: "env spread".into(),
            specs: Box::new(crate::space::EnvSpecs {
                agents: Some(std::collections::BTreeMap::from([(
                    "agent".to_string(),
                    vec!["agent_0".to_string()],
                )])),
                ..specs()
            }),
            recorded: Recorded::QValue { n: 2 },
            state: vec![],
        };
        for sources in [vec![marl], vec![first_ready()]] {
            let v = versions(sources, &greedy);
            assert_eq!((v.oldest(), v.need()), (13, Some(&Need::AgentExploration)));
            v.check(13).expect("version 13 serves it");
            let refusal = v
                .check(12)
                .expect_err("version 12 refuses exploration on several agents");
            assert!(
                refusal.contains("protocol version 12 cannot serve this run") && refusal.contains("per agent"),
                "{refusal}"
            );
        }
        // On an env of one agent the trainer builds, version 8 still serves it.
        assert_eq!(versions(vec![built(Recorded::QValue { n: 2 })], &greedy).oldest(), 8);
    }

    #[test]
    fn episodes_that_end_at_any_agent_need_version_12() {
        let random = PolicyConfig::Random;
        let on_any = machine(config(2, 1, 4, None, false))
            .with_layout_sources(vec![built(Recorded::None); 2])
            .admit_versions(&random, false, true);
        assert_eq!((on_any.oldest(), on_any.need()), (12, Some(&Need::DoneOnAny)));
        on_any.check(12).expect("version 12 serves it");
        let refusal = on_any
            .check(11)
            .expect_err("version 11 ends episodes once every agent is done");
        assert!(
            refusal.contains("protocol version 11 cannot serve this run") && refusal.contains("done_on_any"),
            "{refusal}"
        );
        // Without it the same run admits every version.
        assert_eq!(versions(vec![built(Recorded::None); 2], &random).oldest(), 3);
    }
}
