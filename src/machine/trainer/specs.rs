//! The env specs a node reports in `ready`, checked against where its layout comes
//! from, and version 0 of the weights for an env only the nodes know: built once the
//! first node of that env reported its specs, and sent to each of its nodes before
//! that node's first `Continue` (which waits for it).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::layout::LayoutSource;
use super::{Output, TrainerError, TrainerMachine};
use crate::message::{Continue, ToNode, UpdateWeights};
use crate::policy::{PolicyConfig, PolicySpec, Weights};
use crate::schema::{keys, BatchLayout};
use crate::space::{EnvSpecs, Space};

/// Per env the trainer cannot build: the specs in force and the policy built from them.
#[derive(Debug, Default)]
pub(super) struct NodeSpecs {
    /// Env → the first node of it whose `ready` was accepted, and its specs.
    first: BTreeMap<String, (usize, EnvSpecs)>,
    /// Env → the policy whose version 0 is built once its specs are known.
    deferred: BTreeMap<String, PolicySpec>,
    /// Env → its version 0, once built (`None` inside: a policy without weights).
    built: BTreeMap<String, Option<Arc<Weights>>>,
    /// By node: this incarnation was sent weights (an update, or a restore with them).
    has_weights: Vec<bool>,
    /// By node: the `Continue` asked of it while it waited for weights, not sent yet.
    held: Vec<Option<(u64, usize)>>,
    /// The largest frame body (a node whose batches exceed it is refused).
    max_frame: Option<usize>,
}

impl NodeSpecs {
    /// `nodes` nodes, none sent weights yet.
    pub(super) fn new(nodes: usize) -> NodeSpecs {
        NodeSpecs {
            has_weights: vec![false; nodes],
            held: vec![None; nodes],
            ..NodeSpecs::default()
        }
    }
}

/// Version 0 of `policy` for an env of `specs` (`None`: a policy without weights), or
/// why it cannot take them, naming the key.
pub fn initial_weights_for(policy: &PolicySpec, specs: &EnvSpecs) -> Result<Option<Weights>, String> {
    let name = policy.config.kind_name();
    if matches!(policy.config, PolicyConfig::Random) {
        return Ok(None);
    }
    if let PolicyConfig::Onnx { model, head, .. } = &policy.config {
        // The model's weights are its own; the specs only have to fit it.
        let fail = |e: crate::policy::PolicyError| format!("policy onnx cannot take these specs: {e}");
        if specs.is_multi_agent() {
            // One model for every group (PROTOCOL.md §8, Multi-agent `onnx` policies): its
            // inputs and outputs are the nodes' to check against each group (the Rust node
            // serves no multi-agent env); what the trainer owns, its weights, is checked here.
            if !policy.config.state().is_empty() {
                return Err(
                    "policy onnx cannot take these specs: a recurrent state or an exploration module on a \
                            multi-agent env is not served"
                        .to_string(),
                );
            }
            let w = model.initial_weights().map_err(|e| fail(e.into()))?;
            return Ok(Some(w.as_ref().clone().with_version(0)));
        }
        let action = specs
            .action
            .as_spec()
            .map_err(|why| format!("policy onnx cannot take action: {why}"))?;
        // The state's naming rules (PROTOCOL.md §8, Recurrent) hold for a config made by
        // hand too. An exploration module's state is not the model's; its numbers, head
        // and action are checked here too, before any node acts.
        crate::policy::check_state(policy.config.state()).map_err(fail)?;
        let state = policy.config.checked_model_state(&action).map_err(fail)?;
        model
            .check_node_specs(&specs.batch_layout(), &action, *head, state)
            .map_err(|e| fail(e.into()))?;
        let w = model.initial_weights().map_err(|e| fail(e.into()))?;
        if let Some(module) = policy.config.exploration() {
            module.check_weights(&w).map_err(fail)?;
        }
        return Ok(Some(w.as_ref().clone().with_version(0)));
    }
    let (obs, act) = specs
        .policy_specs()
        .map_err(|e| format!("policy {name} cannot take {e}"))?;
    let built = policy
        .build(&obs, &act, 0)
        .map_err(|e| format!("policy {name} cannot take these specs: {e}"))?;
    Ok(Some(built.weights().clone().with_version(0)))
}

/// The parameters `policy` builds for an env of `specs` (see
/// [`PolicyConfig::spec_params`]), counted without building anything: what a trainer
/// checks against its frame limit before it builds version 0 from a node's specs.
/// `Some(0)` when the built-in networks cannot take the specs (their build says why,
/// and builds nothing); `None` when the count overflows.
pub fn spec_params_for(policy: &PolicySpec, specs: &EnvSpecs) -> Option<usize> {
    let width = |s: &Space| match s {
        Space::Box { shape, .. } if shape.len() == 1 => Some(shape[0]),
        _ => None,
    };
    let outputs = match &specs.action {
        Space::Discrete { n, .. } => Some(usize::try_from(*n).unwrap_or(usize::MAX)),
        other => width(other),
    };
    match (width(&specs.observation), outputs) {
        (Some(obs), Some(outputs)) => policy.config.spec_params(obs, outputs),
        _ => Some(0),
    }
}

/// What a refusal for specs other than the first node's tells the operator: the
/// first node's specs are the env's unless they are pinned.
const PIN_HINT: &str = "pin the env's specs with --env-spec (or env_spec=...) to refuse the odd node instead";

/// Why version 0 was not built: the node's specs (it is refused) or the run's policy
/// (the run fails).
enum Refusal {
    /// The node's specs make more than the run can carry: the reason.
    Node(String),
    /// The run cannot go on.
    Run(TrainerError),
}

impl TrainerMachine {
    /// The nodes of env `env`, which the trainer cannot build (their layout source is
    /// [`LayoutSource::FirstReady`]), act with `policy`: its version 0 is built from
    /// the specs of the first of them to be ready, and each of them gets it (as an
    /// `update_weights` of version 0) before its first `Continue`, which waits for it.
    pub fn with_deferred_policy(mut self, env: impl Into<String>, policy: PolicySpec) -> TrainerMachine {
        self.specs.deferred.insert(env.into(), policy);
        self
    }

    /// Node `node`'s batches (of its frames per batch) are refused at its `ready` when
    /// they would exceed `max_frame` bytes of tensors.
    pub fn with_max_frame(mut self, max_frame: usize) -> TrainerMachine {
        self.specs.max_frame = Some(max_frame);
        self
    }

    /// The specs in force for env `env` the trainer cannot build, once a node of it
    /// reported them.
    pub fn env_specs(&self, env: &str) -> Option<&EnvSpecs> {
        self.specs.first.get(env).map(|(_, s)| s)
    }

    /// The env of node `node` when its version 0 is still to be built: an env only the
    /// nodes know (with a policy of [`Self::with_deferred_policy`]) none of whose nodes
    /// reported its specs yet.
    pub(super) fn version_0_pending(&self, node: usize) -> Option<&str> {
        self.first_ready_env(node)
            .filter(|env| self.specs.deferred.contains_key(*env) && !self.specs.built.contains_key(*env))
    }

    /// The env of node `node`, when the trainer cannot build it.
    fn first_ready_env(&self, node: usize) -> Option<&str> {
        match self.layouts.sources.get(node) {
            Some(LayoutSource::FirstReady { env }) => Some(env),
            _ => None,
        }
    }

    /// Node `node` gets no `Continue` yet: its env's policy has weights, built from
    /// specs a node reports, and this incarnation of it was sent none.
    pub(super) fn awaits_weights(&self, node: usize) -> bool {
        if self.specs.has_weights.get(node).copied().unwrap_or(true) {
            return false;
        }
        self.first_ready_env(node)
            .and_then(|env| self.specs.deferred.get(env))
            .is_some_and(|p| !matches!(p.config, PolicyConfig::Random))
    }

    /// A `Continue` (seq, frames) asked of node `node` while it waits for weights:
    /// sent once it has them.
    pub(super) fn hold_continue(&mut self, node: usize, seq: u64, frames: usize) {
        self.specs.held[node] = Some((seq, frames));
    }

    /// A new incarnation of node `node` (a restart, a joiner): it has no weights and
    /// owes nothing held.
    pub(super) fn specs_new_incarnation(&mut self, node: usize) {
        self.specs.has_weights[node] = false;
        self.specs.held[node] = None;
    }

    /// `msg` was just sent to `node`: weights in it let the node collect, and the
    /// `Continue` held for it goes out (if it is still the one it owes).
    pub(super) fn sent(&mut self, node: usize, msg_has_weights: bool, out: &mut Vec<Output>) {
        if !msg_has_weights {
            return;
        }
        self.specs.has_weights[node] = true;
        if let Some((seq, frames)) = self.specs.held[node].take() {
            if self.nodes[node].state.outstanding() == Some((seq, frames)) {
                // Weights stored meanwhile may have gone out with this message.
                let version = self.nodes[node].book.pushed_version;
                self.nodes[node].state.sent_with(seq, version);
                out.push(Output::Send {
                    node,
                    msg: ToNode::Continue(Continue { seq, frames }),
                });
            }
        }
    }

    /// Node `node`'s `ready`: its `specs` (absent from a version-3 node) checked
    /// against where its layout comes from, then its `layout`. For an env the trainer
    /// cannot build, the first accepted node's specs become the env's, its version 0
    /// is built from them (a policy that cannot take them fails the run:
    /// [`TrainerError::Policy`]), and the node gets it. A refused `ready` is
    /// [`TrainerError::BadLayout`], naming why: among the reasons, specs whose version
    /// 0 would not fit a frame, found from the parameter count before anything is
    /// built (then the node is refused, not the run failed: a later node may serve).
    pub(super) fn on_ready(
        &mut self,
        node: usize,
        layout: BatchLayout,
        specs: Option<EnvSpecs>,
        out: &mut Vec<Output>,
    ) -> Result<(), TrainerError> {
        if node >= self.nodes.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        if let Some(reason) = self.specs_refusal(node, &layout, specs.as_ref()) {
            self.layouts.refused[node] = true;
            return Err(TrainerError::BadLayout { node, reason });
        }
        let env = self.first_ready_env(node).map(str::to_owned);
        // The first specs of an env only the nodes know: version 0 is built from them
        // before the node is accepted, so a node whose specs the run cannot afford is
        // refused with nothing of it kept.
        let first = match (&env, &specs) {
            (Some(env), Some(specs)) if !self.specs.first.contains_key(env) => {
                let v0 = match self.specs.deferred.get(env).cloned() {
                    Some(policy) => match self.build_initial(env, &policy, specs) {
                        Ok(v0) => Some(v0),
                        Err(Refusal::Node(reason)) => {
                            self.layouts.refused[node] = true;
                            return Err(TrainerError::BadLayout { node, reason });
                        }
                        Err(Refusal::Run(e)) => return Err(e),
                    },
                    None => None,
                };
                Some((env.clone(), specs.clone(), v0))
            }
            _ => None,
        };
        self.accept_layout(node, layout, specs.is_some())?;
        let Some(env) = env else {
            return Ok(());
        };
        if let Some((env, specs, v0)) = first {
            self.specs.first.insert(env.clone(), (node, specs));
            if let Some(v0) = v0 {
                for i in 0..self.nodes.len() {
                    if self.first_ready_env(i) == Some(env.as_str()) {
                        self.initial[i] = v0.clone();
                    }
                }
                self.specs.built.insert(env, v0);
            }
        }
        if self.awaits_weights(node) {
            if let Some(Some(v0)) = self.specs.built.get(&env).cloned() {
                self.send(node, ToNode::UpdateWeights(UpdateWeights { weights: v0 }), out);
            }
        }
        Ok(())
    }

    /// Version 0 for env `env` from `specs`: its parameters counted from the specs and
    /// checked to fit in a frame before it is built (4 bytes each, a lower bound of the
    /// update's length), then the update's exact length once built. Over `max_frame`
    /// it is the node's refusal; a policy that cannot take the specs fails the run.
    fn build_initial(&self, env: &str, policy: &PolicySpec, specs: &EnvSpecs) -> Result<Option<Arc<Weights>>, Refusal> {
        let name = policy.config.kind_name();
        if let Some(max) = self.specs.max_frame {
            let params = spec_params_for(policy, specs);
            if params.and_then(|p| p.checked_mul(4)).is_none_or(|bytes| bytes > max) {
                let params = params.map_or_else(|| format!("more than {}", usize::MAX), |p| p.to_string());
                return Err(Refusal::Node(format!(
                    "policy {name} would have {params} parameters for its specs: a weight update over max_frame \
                     ({max}); nothing was built"
                )));
            }
        }
        let fail = |reason: String| Refusal::Run(TrainerError::Policy(format!("env {env}: {reason}")));
        let Some(w) = initial_weights_for(policy, specs).map_err(fail)? else {
            return Ok(None);
        };
        if let Some(max) = self.specs.max_frame {
            let len = crate::wire::update_weights_len(&w);
            if len > max {
                return Err(Refusal::Node(format!(
                    "policy {name} has {} parameters for its specs: a weight update is a frame of {len} bytes, \
                     over max_frame ({max})",
                    w.numel()
                )));
            }
        }
        Ok(Some(Arc::new(w)))
    }

    /// The layout of a node's batches for its `specs`: with what the policy of its
    /// env records ([`EnvSpecs::recorded`]); for an env with no policy known here (a
    /// machine driven without a plan), with the recorded keys the node announced.
    fn specs_layout(&self, source: &LayoutSource, specs: &EnvSpecs, announced: &BatchLayout) -> BatchLayout {
        let policy = match source {
            LayoutSource::FirstReady { env } => self.specs.deferred.get(env),
            _ => None,
        };
        match policy {
            Some(p) => specs.batch_layout_for(p),
            None => {
                let mut own = specs.batch_layout();
                for key in keys::RECORDED {
                    if let Some(entry) = announced.get(key) {
                        own.insert(key.to_string(), entry.clone());
                    }
                }
                own
            }
        }
    }

    /// Why a node's batches of `per_frame` bytes of tensors a frame (`None`: more than
    /// a `usize` counts) cannot be carried, if `max_frame` is set and they cannot.
    fn batch_refusal(&self, per_frame: Option<usize>) -> Option<String> {
        let max = self.specs.max_frame?;
        let frames = self.cfg.shares.node_share();
        let per_frame = per_frame.unwrap_or(usize::MAX);
        let batch = per_frame.saturating_mul(frames);
        (batch > max).then(|| {
            format!(
                "its batches of {frames} frames would hold {batch} bytes of tensors ({per_frame} a frame), over \
                 max_frame ({max})"
            )
        })
    }

    /// Why node `node`'s `specs` (and the `layout` it announced with them) are
    /// refused, if they are.
    fn specs_refusal(&self, node: usize, layout: &BatchLayout, specs: Option<&EnvSpecs>) -> Option<String> {
        let me = format!("node {node}");
        match (&self.layouts.sources[node], specs) {
            (LayoutSource::FirstReady { env }, None) => Some(format!(
                "sends no specs (protocol version 3?) for env {env}, which the trainer cannot build"
            )),
            (_, None) => None,
            (LayoutSource::Specs { of, specs: known, .. }, Some(s)) => EnvSpecs::difference(&me, s, of, known),
            (source, Some(s)) => {
                if let Err(e) = s.validate() {
                    return Some(format!("its specs cannot be collected: {e}"));
                }
                // Sized before anything is built from the specs (the policy's specs
                // hold a bound per element), then with what the policy records.
                if let Some(why) = self.batch_refusal(s.bytes_per_frame()) {
                    return Some(why);
                }
                let own = self.specs_layout(source, s, layout);
                if let Some(why) = self.batch_refusal(layout_bytes(&own)) {
                    return Some(why);
                }
                if let Some(d) = crate::schema::named_difference("the layout", layout, "the specs' layout", &own) {
                    return Some(format!("its layout is not that of its specs: {d}"));
                }
                let LayoutSource::FirstReady { env } = source else {
                    return None;
                };
                let (first, theirs) = self.specs.first.get(env)?;
                EnvSpecs::difference(&me, s, &format!("node {first}"), theirs)
                    .map(|d| format!("{d} (the first of env {env} to be ready); {PIN_HINT}"))
            }
        }
    }
}

/// Bytes of tensors one frame of `layout` takes, if it does not overflow.
fn layout_bytes(layout: &BatchLayout) -> Option<usize> {
    layout.values().try_fold(0usize, |acc, (dtype, shape)| {
        shape
            .iter()
            .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
            .and_then(|b| acc.checked_add(b))
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::message::FromNode;
    use crate::space::{Bounds, Space};
    use crate::spec::Spec;
    use crate::tensor::DType;

    fn specs(obs: usize) -> EnvSpecs {
        EnvSpecs::from_specs(&Spec::uniform_box(obs, -1.0, 1.0), &Spec::Discrete { n: 2 })
    }

    fn image() -> EnvSpecs {
        EnvSpecs {
            observation: Space::Box {
                dtype: DType::U8,
                shape: vec![8, 8, 3],
                low: Some(Bounds::Uniform(0.0)),
                high: Some(Bounds::Uniform(255.0)),
            },
            action: Space::Discrete { n: 6, start: 0 },
            agents: None,
        }
    }

    /// A node's `ready` for specs `s` (none: `specs(4)`'s layout) acting with `linear()`.
    fn ready(node: usize, s: Option<&EnvSpecs>) -> FromNode {
        ready_of(node, s, &PolicyConfig::Linear)
    }

    /// A node's `ready` for specs `s`, its layout with what `policy` records.
    fn ready_of(node: usize, s: Option<&EnvSpecs>, policy: &PolicyConfig) -> FromNode {
        let of = s.cloned().unwrap_or_else(|| specs(4));
        FromNode::Ready {
            node,
            layout: of.batch_layout_recording(of.recorded(policy)),
            specs: s.cloned().map(Box::new),
        }
    }

    fn first_ready(n: usize, env: &str) -> Vec<LayoutSource> {
        vec![LayoutSource::FirstReady { env: env.into() }; n]
    }

    fn refusal(m: &mut TrainerMachine, msg: FromNode) -> String {
        match m.on_node(msg, &mut Vec::new()) {
            Err(TrainerError::BadLayout { reason, .. }) => reason,
            other => panic!("expected BadLayout, got {other:?}"),
        }
    }

    fn linear() -> PolicySpec {
        PolicySpec::from(PolicyConfig::Linear)
    }

    #[test]
    fn the_first_nodes_specs_hold_the_others_and_a_ready_without_specs_is_refused() {
        let mut m = machine(config(3, 1, 4, None, false)).with_layout_sources(first_ready(3, "Custom"));
        let reason = refusal(&mut m, ready(0, None));
        assert_eq!(
            reason,
            "sends no specs (protocol version 3?) for env Custom, which the trainer cannot build"
        );
        feed(&mut m, ready(1, Some(&specs(4))));
        assert_eq!(m.env_specs("Custom"), Some(&specs(4)));
        let reason = refusal(&mut m, ready(2, Some(&specs(3))));
        assert_eq!(
            reason,
            format!("node 2's observation is f32 [3], node 1's is f32 [4] (the first of env Custom to be ready); {PIN_HINT}")
        );
        assert!(PIN_HINT.starts_with("pin the env's specs with --env-spec (or env_spec=...)"));
        let mut other_bounds = specs(4);
        other_bounds.action = Space::Discrete { n: 2, start: 1 };
        let reason = refusal(&mut m, ready(2, Some(&other_bounds)));
        assert!(
            reason.contains("node 2's action is discrete 2 from 1, node 1's is discrete 2"),
            "{reason}"
        );
        feed(&mut m, ready(2, Some(&specs(4))));
        let linear = specs(4).batch_layout_recording(crate::policy::Recorded::Categorical { n: 2 });
        assert_eq!(m.layout(2), Some(&linear));
    }

    /// simple_spread's specs: one group `agent` of three (PROTOCOL.md §3, Multi-agent envs).
    fn spread(agents: [&str; 3]) -> EnvSpecs {
        let one = |s: Space| Space::Dict {
            spaces: std::collections::BTreeMap::from([("agent".to_string(), s)]),
        };
        EnvSpecs {
            observation: one(Space::Box {
                dtype: DType::F32,
                shape: vec![18],
                low: None,
                high: None,
            }),
            action: one(Space::Discrete { n: 5, start: 0 }),
            agents: Some(std::collections::BTreeMap::from([(
                "agent".to_string(),
                agents.iter().map(|a| a.to_string()).collect(),
            )])),
        }
    }

    #[test]
    fn a_multi_agent_nodes_specs_set_the_per_group_layout_and_other_agents_are_refused() {
        let random = PolicySpec::from(PolicyConfig::Random);
        let mut m = machine(config(3, 1, 4, None, false))
            .with_layout_sources(first_ready(3, "Zoo"))
            .with_deferred_policy("Zoo", random);
        let ma = spread(["agent_0", "agent_1", "agent_2"]);
        feed(&mut m, ready_of(0, Some(&ma), &PolicyConfig::Random));
        let layout = m.layout(0).expect("accepted");
        assert_eq!(layout["agent.action_log_prob"], (DType::F32, vec![3]));
        assert_eq!(layout["next.agent.reward"], (DType::F32, vec![3, 1]));
        assert!(!layout.contains_key("next.reward"));
        let other = spread(["agent_0", "agent_1", "agent_9"]);
        let reason = refusal(&mut m, ready_of(1, Some(&other), &PolicyConfig::Random));
        assert!(reason.contains("node 1's agents are"), "{reason}");
        // A policy of one agent cannot act for it: refused naming `agents`.
        let mut m = machine(config(1, 1, 4, None, false))
            .with_layout_sources(first_ready(1, "Zoo"))
            .with_deferred_policy("Zoo", linear());
        match m.on_node(ready_of(0, Some(&ma), &PolicyConfig::Linear), &mut Vec::new()) {
            Err(TrainerError::Policy(reason)) => {
                assert!(
                    reason.contains("policy linear cannot take agents: a multi-agent env"),
                    "{reason}"
                )
            }
            other => panic!("expected the policy refused, got {other:?}"),
        }
    }

    #[test]
    fn a_layout_other_than_its_specs_or_specs_that_cannot_be_collected_are_refused() {
        let mut m = machine(config(1, 1, 4, None, false)).with_layout_sources(first_ready(1, "Custom"));
        let reason = refusal(
            &mut m,
            FromNode::Ready {
                node: 0,
                layout: specs(3).batch_layout(),
                specs: Some(Box::new(specs(4))),
            },
        );
        assert_eq!(
            reason,
            "its layout is not that of its specs: the layout's observation is f32 [3], the specs' layout's is f32 [4]"
        );
        let mut huge = image();
        huge.observation = Space::Box {
            dtype: DType::U8,
            shape: vec![1 << 40, 1 << 40],
            low: None,
            high: None,
        };
        let reason = refusal(
            &mut m,
            FromNode::Ready {
                node: 0,
                layout: BatchLayout::new(),
                specs: Some(Box::new(huge)),
            },
        );
        assert!(
            reason.starts_with("its specs cannot be collected: observation: a box of shape"),
            "{reason}"
        );
        assert_eq!(m.env_specs("Custom"), None, "refused specs set nothing");
    }

    #[test]
    fn a_layout_without_what_the_policy_records_or_with_it_wrong_is_refused() {
        let known = LayoutSource::Specs {
            of: "env E".into(),
            specs: Box::new(specs(4)),
            recorded: crate::policy::Recorded::Categorical { n: 2 },
            state: vec![],
        };
        let sources = vec![known, LayoutSource::FirstReady { env: "Custom".into() }];
        let mut m = machine(config(2, 1, 4, None, false))
            .with_layout_sources(sources)
            .with_deferred_policy("Custom", linear());
        for node in 0..2 {
            let want = if node == 0 { "env E" } else { "the specs' layout" };
            let mut without = specs(4).batch_layout();
            let reason = refusal(
                &mut m,
                FromNode::Ready {
                    node,
                    layout: without.clone(),
                    specs: Some(Box::new(specs(4))),
                },
            );
            assert!(
                reason.contains(&format!("action_log_prob is absent, {want}'s is f32 []")),
                "{reason}"
            );
            without.insert(keys::ACTION_LOG_PROB.into(), (DType::F32, vec![]));
            without.insert(keys::LOGITS.into(), (DType::F32, vec![3]));
            let reason = refusal(
                &mut m,
                FromNode::Ready {
                    node,
                    layout: without,
                    specs: Some(Box::new(specs(4))),
                },
            );
            assert!(
                reason.contains(&format!("logits is f32 [3], {want}'s is f32 [2]")),
                "{reason}"
            );
            feed(&mut m, ready(node, Some(&specs(4))));
            assert_eq!(
                m.layout(node),
                Some(&specs(4).batch_layout_recording(crate::policy::Recorded::Categorical { n: 2 }))
            );
        }
    }

    #[test]
    fn batches_over_max_frame_refuse_the_ready_naming_the_sizes() {
        // An 8x8x3 u8 frame twice (observation, next) plus the fixed keys: 4 frames.
        let per = image().bytes_per_frame().unwrap();
        let mut m = machine(config(1, 1, 4, None, false))
            .with_layout_sources(first_ready(1, "Atari"))
            .with_max_frame(4 * per - 1);
        let reason = refusal(&mut m, ready(0, Some(&image())));
        assert_eq!(
            reason,
            format!(
                "its batches of 4 frames would hold {} bytes of tensors ({per} a frame), over max_frame ({})",
                4 * per,
                4 * per - 1
            )
        );
        let mut m = machine(config(1, 1, 4, None, false))
            .with_layout_sources(first_ready(1, "Atari"))
            .with_max_frame(4 * per);
        feed(&mut m, ready(0, Some(&image())));
    }

    #[test]
    fn weights_are_refused_until_version_0_is_built_then_checked_against_it() {
        let mut m = machine(config(2, 1, 4, None, false))
            .with_layout_sources(first_ready(2, "Custom"))
            .with_deferred_policy("Custom", linear());
        let want = initial_weights_for(&linear(), &specs(4)).unwrap().unwrap();
        let e = m.check_weights(&want).unwrap_err();
        assert_eq!(e.field, "weights");
        assert!(e.reason.contains("env Custom is not known yet"), "{}", e.reason);
        feed(&mut m, ready(1, Some(&specs(4))));
        assert_eq!(m.check_weights(&want), Ok(()));
        let narrower = initial_weights_for(&linear(), &specs(3)).unwrap().unwrap();
        assert!(m.check_weights(&narrower).unwrap_err().reason.contains("must be f32"));
    }

    #[test]
    fn version_0_goes_to_each_node_before_its_first_continue() {
        let mut m = machine(config(2, 1, 4, None, false))
            .with_layout_sources(first_ready(2, "Custom"))
            .with_deferred_policy("Custom", linear());
        assert!(m.initial_weights(0).is_none(), "unknown before the specs");
        let out = request(&mut m);
        assert!(continues(&out).is_empty(), "no node has weights: {out:?}");
        let out = feed(&mut m, ready(1, Some(&specs(4))));
        assert_eq!(sends(&out), vec![(1, "update_weights"), (1, "continue")]);
        let v0 = m.initial_weights(0).cloned().expect("built for every node of the env");
        let want = initial_weights_for(&linear(), &specs(4)).unwrap().unwrap();
        assert_eq!(*v0, want);
        assert_eq!(v0.version, 0);
        match &out[0] {
            Output::Send {
                msg: ToNode::UpdateWeights(u),
                ..
            } => assert!(Arc::ptr_eq(&u.weights, &v0)),
            other => panic!("{other:?}"),
        }
        let out = feed(&mut m, ready(0, Some(&specs(4))));
        assert_eq!(sends(&out), vec![(0, "update_weights"), (0, "continue")]);
        // A second ready of an incarnation that has its weights sends nothing.
        assert!(feed(&mut m, ready(0, Some(&specs(4)))).is_empty());
    }

    #[test]
    fn a_held_continue_sent_behind_newer_weights_expects_their_version() {
        let mut m = machine(config(2, 1, 4, None, false))
            .with_layout_sources(first_ready(2, "Custom"))
            .with_deferred_policy("Custom", linear());
        request(&mut m);
        feed(&mut m, ready(1, Some(&specs(4))));
        // Node 0 has not sent `ready`: its `Continue` is held. The learner stores weights
        // and pushes them to it; the held `Continue` goes out right behind them.
        let want = initial_weights_for(&linear(), &specs(4)).unwrap().unwrap();
        let v = m.set_weights(want);
        let mut out = Vec::new();
        m.push_weights(Some(&[0]), &mut out).unwrap();
        assert_eq!(sends(&out), vec![(0, "update_weights"), (0, "continue")]);
        assert_eq!(
            m.nodes[0].state.expected().map(|a| a.version),
            Some(v),
            "its batch is collected with the weights sent just before it, not version 0"
        );
    }

    #[test]
    fn a_random_policy_needs_no_weights_and_nothing_waits() {
        let mut m = machine(config(1, 1, 4, None, false))
            .with_layout_sources(first_ready(1, "Custom"))
            .with_deferred_policy("Custom", PolicySpec::from(PolicyConfig::Random));
        assert_eq!(continues(&request(&mut m)), vec![(0, 0, 4)]);
        // Its batches carry the uniform log-density: a layout without it is refused.
        let r = m.on_node(ready(0, Some(&image())), &mut Vec::new());
        assert!(
            matches!(&r, Err(TrainerError::BadLayout { reason, .. }) if reason.contains("action_log_prob is absent")),
            "{r:?}"
        );
        assert!(feed(&mut m, ready_of(0, Some(&image()), &PolicyConfig::Random)).is_empty());
        assert!(m.initial_weights(0).is_none());
    }

    #[test]
    fn a_policy_that_cannot_take_the_specs_fails_the_run_naming_the_key() {
        let mut m = machine(config(1, 1, 4, None, false))
            .with_layout_sources(first_ready(1, "Atari"))
            .with_deferred_policy("Atari", linear());
        let r = m.on_node(ready(0, Some(&image())), &mut Vec::new());
        assert_eq!(
            r,
            Err(TrainerError::Policy(
                "env Atari: policy linear cannot take observation: u8 box [8, 8, 3]: built-in policies take a 1-D \
                 f32 or f64 box or a discrete space"
                    .into()
            ))
        );
    }

    #[test]
    fn a_weight_update_over_max_frame_refuses_the_node_and_a_later_node_serves() {
        // 1,010 parameters (4,040 bytes at least) against a frame of 2,000.
        let wide = EnvSpecs::from_specs(&Spec::uniform_box(100, -1.0, 1.0), &Spec::Discrete { n: 10 });
        let mut m = machine(config(2, 1, 1, None, false))
            .with_layout_sources(first_ready(2, "Wide"))
            .with_deferred_policy("Wide", linear())
            .with_max_frame(2000);
        let reason = refusal(&mut m, ready(0, Some(&wide)));
        assert_eq!(
            reason,
            "policy linear would have 1010 parameters for its specs: a weight update over max_frame (2000); nothing \
             was built"
        );
        assert_eq!(m.env_specs("Wide"), None, "the refused node's specs are not the env's");
        assert!(m.initial_weights(1).is_none());
        let out = feed(&mut m, ready(1, Some(&specs(4))));
        assert_eq!(sends(&out), vec![(1, "update_weights")]);
        assert_eq!(m.env_specs("Wide"), Some(&specs(4)));
        // And its batches are refused: its ready was.
        assert!(m.layout(0).is_none());
    }

    #[test]
    fn a_weight_update_over_max_frame_by_its_headers_refuses_the_node() {
        let w = initial_weights_for(&linear(), &specs(4)).unwrap().unwrap();
        let len = crate::wire::update_weights_len(&w);
        let layout = specs(4).batch_layout_recording(crate::policy::Recorded::Categorical { n: 2 });
        let per_frame = layout_bytes(&layout).unwrap();
        assert!(
            4 * w.numel() < len - 1 && per_frame < len - 1,
            "only the exact length is over"
        );
        let mut m = machine(config(1, 1, 1, None, false))
            .with_layout_sources(first_ready(1, "Custom"))
            .with_deferred_policy("Custom", linear())
            .with_max_frame(len - 1);
        let reason = refusal(&mut m, ready(0, Some(&specs(4))));
        assert_eq!(
            reason,
            format!(
                "policy linear has 10 parameters for its specs: a weight update is a frame of {len} bytes, over \
                 max_frame ({})",
                len - 1
            )
        );
        assert_eq!(m.env_specs("Custom"), None);
    }

    #[test]
    fn a_node_whose_specs_make_an_mlp_too_big_for_a_frame_is_refused_by_name_before_anything_is_built() {
        // The case: a discrete action of 2^21 choices makes a 64-64 MLP of 136 M
        // parameters (545 MB of f32) against the default 256 MiB frame.
        let mlp = PolicySpec::from(PolicyConfig::Mlp { hidden: vec![64, 64] });
        let n = 1u64 << 21;
        let hostile = EnvSpecs::from_specs(&Spec::uniform_box(4, -1.0, 1.0), &Spec::Discrete { n });
        let max = crate::wire::DEFAULT_MAX_FRAME;
        let mut m = machine(config(2, 1, 4, None, false))
            .with_layout_sources(first_ready(2, "Custom"))
            .with_deferred_policy("Custom", mlp.clone())
            .with_max_frame(max);
        let started = std::time::Instant::now();
        let r = m.on_node(ready_of(0, Some(&hostile), &mlp.config), &mut Vec::new());
        let params = mlp.config.spec_params(4, 1 << 21).unwrap();
        assert_eq!(params, 136_319_360);
        assert_eq!(
            r,
            Err(TrainerError::BadLayout {
                node: 0,
                reason: format!(
                    "policy mlp would have {params} parameters for its specs: a weight update over max_frame \
                     ({max}); nothing was built"
                ),
            })
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "refused from the count, not after building 545 MB: {:?}",
            started.elapsed()
        );
        assert!(m.initial_weights(0).is_none() && m.initial_weights(1).is_none());
        assert_eq!(m.env_specs("Custom"), None);
        // The honest node that comes next sets the env's specs and gets version 0.
        let out = feed(&mut m, ready_of(1, Some(&specs(4)), &mlp.config));
        assert_eq!(sends(&out), vec![(1, "update_weights")]);
        assert_eq!(m.env_specs("Custom"), Some(&specs(4)));
        assert_eq!(
            m.initial_weights(1).map(|w| w.numel()),
            mlp.config.spec_params(4, 2),
            "built, and counted as spec_params said"
        );
    }

    #[test]
    fn known_specs_hold_every_node_that_sends_specs() {
        let known = LayoutSource::Specs {
            of: "env E".into(),
            specs: Box::new(specs(4)),
            recorded: crate::policy::Recorded::Categorical { n: 2 },
            state: vec![],
        };
        let mut m = machine(config(2, 1, 4, None, false)).with_layout_sources(vec![known.clone(), known]);
        let layout = specs(4).batch_layout_recording(crate::policy::Recorded::Categorical { n: 2 });
        assert_eq!(m.layout(0), Some(&layout), "known before any ready");
        let mut other = specs(4);
        other.action = Space::Discrete { n: 3, start: 0 };
        let reason = refusal(&mut m, ready(0, Some(&other)));
        assert_eq!(
            reason,
            "node 0's action is discrete 3, env E's is discrete 2 (the same layout, other bounds or choices)"
        );
        feed(&mut m, ready(0, Some(&specs(4))));
        feed(&mut m, ready(1, None));
    }

    #[test]
    fn a_restarted_node_waits_for_version_0_again() {
        let mut m = machine(config(1, 1, 4, None, false))
            .with_layout_sources(first_ready(1, "Custom"))
            .with_deferred_policy("Custom", linear());
        feed(&mut m, ready(0, Some(&specs(4))));
        m.new_incarnation(0);
        assert!(m.awaits_weights(0));
        let out = feed(&mut m, ready(0, Some(&specs(4))));
        assert_eq!(sends(&out), vec![(0, "update_weights")]);
        assert!(!m.awaits_weights(0));
    }
}
