//! Policies: map a batch of observations to actions, parameterised by [`Weights`].
//!
//! A policy reads `k` observations laid out row-major in one `&[f32]` and writes
//! `k` actions into an [`ActionsMut`], so the collection loop can hand it scratch
//! buffers it reuses for the whole run: no allocation per step.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::rng::RngState;
use crate::spec::{Spec, SpecError};
use crate::tensor::{Tensor, TensorError};

mod action_head;
mod buffer_checks;
mod constant;
mod contiguous;
mod dense;
pub(crate) mod dense_layout;
mod dense_policy;
mod egreedy;
mod exploration;
mod finite;
mod fixed_width;
mod linear;
mod logprob;
mod mlp;
mod net;
mod onnx;
mod random;
mod record;
mod sampler;
mod state;
mod tanh;
#[cfg(test)]
mod test_util;

pub use constant::Constant;
pub use dense_policy::{DenseKind, DensePolicy, LinearKind, MlpKind};
pub use egreedy::EpsilonGreedy;
pub use exploration::{ExplorationModule, ExploringPolicy, OrnsteinUhlenbeck, OU_NOISE, OU_STEPS};
pub use finite::NonFinite;
pub(crate) use fixed_width::Argmax2;
pub use linear::Linear;
pub use mlp::Mlp;
pub use onnx::{
    OnnxBytes, OnnxError, OnnxHead, OnnxModel, DECODE_OVERHEAD_BYTES, MAX_MODEL_BYTES, MAX_MODEL_CONSTANT_ELEMENTS,
    MAX_MODEL_NODES,
};
#[cfg(feature = "onnx")]
pub use onnx::{OnnxEngine, OnnxPolicy, WeightMode};
pub use random::RandomPolicy;
pub use record::{ParamsMut, RecordMut, Recorded};
pub use state::{
    check_state, extend_layout as extend_state_layout, StateIo, StateTensor, MAX_STATE_ELEMENTS, MAX_STATE_NAME_BYTES,
    MAX_STATE_RANK, MAX_STATE_TENSORS,
};
/// The built-in networks' `tanh` (docs/policies.md), vectorised, in place: for
/// benchmarks that pair it with another matrix kernel.
#[doc(hidden)]
pub use tanh::tanh_in_place;

/// How actions are chosen, as torchrl's `exploration_type`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExplorationType {
    /// The mode of the action distribution (argmax, or the mean).
    Deterministic,
    /// A sample of the action distribution.
    #[default]
    Random,
}

impl ExplorationType {
    /// The type of one of torchrl's names, in any case: `random`, or `deterministic`
    /// and its synonyms `mode` and `mean` (a node's deterministic action is the
    /// distribution's mode, which is its mean for the normal heads).
    pub fn from_name(name: &str) -> Option<ExplorationType> {
        match name.to_ascii_lowercase().as_str() {
            "random" => Some(ExplorationType::Random),
            "deterministic" | "mode" | "mean" => Some(ExplorationType::Deterministic),
            _ => None,
        }
    }
}

/// Named tensors with a version: what a learner sends to the nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    /// Bumped by the trainer at every update; batches carry the version they used.
    pub version: u64,
    /// Parameters by name (e.g. `weight`, `bias`, `layers.0.weight`).
    pub tensors: BTreeMap<String, Tensor>,
}

impl Weights {
    /// Weights with version 0.
    pub fn new(tensors: BTreeMap<String, Tensor>) -> Weights {
        Weights { version: 0, tensors }
    }

    /// The same tensors under another version.
    pub fn with_version(mut self, version: u64) -> Weights {
        self.version = version;
        self
    }

    /// Total number of parameters.
    pub fn numel(&self) -> usize {
        self.tensors.values().map(Tensor::len).sum()
    }

    /// Checks that `other` has exactly the same names, dtypes and shapes as `self`.
    pub fn check_layout(&self, other: &Weights) -> Result<(), PolicyError> {
        for (name, t) in &self.tensors {
            let o = other
                .tensors
                .get(name)
                .ok_or_else(|| PolicyError::Weights(format!("missing tensor `{name}`")))?;
            if o.dtype() != t.dtype() || o.shape() != t.shape() {
                return Err(PolicyError::Weights(format!(
                    "`{name}` must be {} {:?}, got {} {:?}",
                    t.dtype(),
                    t.shape(),
                    o.dtype(),
                    o.shape()
                )));
            }
        }
        if let Some(extra) = other.tensors.keys().find(|k| !self.tensors.contains_key(*k)) {
            return Err(PolicyError::Weights(format!("unexpected tensor `{extra}`")));
        }
        Ok(())
    }

    /// The f32 tensor `name`, flattened (C order).
    pub fn f32_slice(&self, name: &str) -> Result<&[f32], PolicyError> {
        match self.tensors.get(name) {
            Some(Tensor::F32(a)) => a
                .as_slice()
                .ok_or_else(|| PolicyError::Weights(format!("`{name}` is not contiguous"))),
            Some(other) => Err(PolicyError::Weights(format!(
                "`{name}` must be f32, got {}",
                other.dtype()
            ))),
            None => Err(PolicyError::Weights(format!("missing tensor `{name}`"))),
        }
    }
}

/// Output buffer for `k` actions.
#[derive(Debug)]
pub enum ActionsMut<'a> {
    /// One choice per env.
    Discrete(&'a mut [i64]),
    /// `k * dim` values, row-major.
    Continuous(&'a mut [f32]),
}

/// What went wrong in a policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// Weights of the wrong names, shapes or dtypes.
    #[error("bad weights: {0}")]
    Weights(String),
    /// The observation or action buffer does not fit the specs.
    #[error("bad buffer: {0}")]
    Buffer(String),
    /// The policy cannot serve these specs.
    #[error("unsupported spec: {0}")]
    Spec(String),
    /// A spec error.
    #[error(transparent)]
    SpecError(#[from] SpecError),
    /// A tensor error.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// A user policy failed in a way of its own.
    #[error("policy failed: {0}")]
    Failed(String),
    /// The policy does not implement the checkpoint hooks; names its type.
    #[error("policy `{0}` cannot be checkpointed: implement Policy::sampler_state and Policy::set_sampler_state")]
    NotCheckpointable(&'static str),
    /// A sampler state that does not fit this policy.
    #[error("bad sampler state: {0}")]
    Checkpoint(String),
    /// An ONNX model that cannot serve, or what it produced; names the tensor.
    #[error(transparent)]
    Onnx(#[from] OnnxError),
}

/// Where a policy's sampling generator stands, for a checkpoint: the ChaCha8 position
/// plus the second normal Box–Muller produced but not used yet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplerState {
    /// The generator.
    pub rng: RngState,
    /// The pending normal, if any.
    pub spare: Option<f32>,
}

/// Maps observations to actions.
///
/// # Examples
///
/// A built-in policy from its [`PolicySpec`], acting for a batch of observations at once
/// (row-major, `k * obs_dim` values) and taking new weights, as a node's worker does:
///
/// ```
/// use rollout::policy::ActionsMut;
/// use rollout::{ExplorationType, PolicyConfig, PolicySpec, Registry, Tensor};
///
/// let env = Registry::with_builtins().make(&"CartPole-v1".into())?;
/// let spec = PolicySpec {
///     config: PolicyConfig::Linear,
///     exploration: ExplorationType::Deterministic, // argmax of the logits
///     init_seed: 0,
///     record: true, // batches carry its log-probabilities and logits
/// };
/// let mut policy = spec.build(env.observation_spec(), env.action_spec(), 7)?;
///
/// // Two observations of CartPole (4 values each), two actions in 0..2.
/// let obs = [0.0f32, 0.1, -0.02, 0.3, 0.01, -0.2, 0.04, -0.5];
/// let mut actions = [-1i64; 2];
/// policy.act(&obs, 2, ActionsMut::Discrete(&mut actions))?;
/// assert!(actions.iter().all(|a| (0..2).contains(a)));
///
/// // An update must keep every name, dtype and shape (`weight` [2, 4], `bias` [2]).
/// let mut update = policy.weights().clone().with_version(1);
/// if let Some(Tensor::F32(bias)) = update.tensors.get_mut("bias") {
///     bias[[1]] += 100.0; // action 1 wins everywhere now
/// }
/// policy.set_weights(&update)?;
/// policy.act(&obs, 2, ActionsMut::Discrete(&mut actions))?;
/// assert_eq!(actions, [1, 1]);
/// assert_eq!(policy.weights().version, 1);
///
/// let mut wrong = update.clone();
/// wrong.tensors.remove("bias");
/// assert!(policy.set_weights(&wrong).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A policy of your own implements the four required methods; the checkpoint hooks
/// (`sampler_state`, `set_sampler_state`) default to a refusal naming the type:
///
/// ```
/// use rollout::policy::ActionsMut;
/// use rollout::{ExplorationType, Policy, PolicyError, Weights};
///
/// /// Always the same discrete action; no weights.
/// struct Always(i64, Weights);
///
/// impl Policy for Always {
///     fn act(&mut self, _obs: &[f32], k: usize, actions: ActionsMut<'_>) -> Result<(), PolicyError> {
///         let ActionsMut::Discrete(a) = actions else {
///             return Err(PolicyError::Buffer("a discrete policy writes discrete actions".into()));
///         };
///         a[..k].fill(self.0);
///         Ok(())
///     }
///     fn weights(&self) -> &Weights {
///         &self.1
///     }
///     fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
///         self.1.check_layout(weights)?;
///         self.1 = weights.clone();
///         Ok(())
///     }
///     fn set_exploration(&mut self, _exploration: ExplorationType) {}
///     fn reseed(&mut self, _seed: u64) {}
/// }
///
/// let mut p = Always(1, Weights::default());
/// let mut actions = [0i64; 3];
/// p.act(&[0.0; 12], 3, ActionsMut::Discrete(&mut actions))?;
/// assert_eq!(actions, [1, 1, 1]);
/// assert!(matches!(p.sampler_state(), Err(PolicyError::NotCheckpointable(_))));
/// # Ok::<(), PolicyError>(())
/// ```
pub trait Policy: Send {
    /// Writes `k` actions for the `k` observations in `obs` (row-major, `k * obs_dim`).
    fn act(&mut self, obs: &[f32], k: usize, actions: ActionsMut<'_>) -> Result<(), PolicyError>;
    /// The current weights.
    fn weights(&self) -> &Weights;
    /// Replaces the weights; names, shapes and dtypes must match the current ones.
    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError>;
    /// As [`Policy::set_weights`], for weights others hold too (a node's workers all
    /// get the same decoded update): a policy may keep the `Arc` as its own copy
    /// instead of copying every tensor, which for a large network is the cost of
    /// an update. The default copies.
    fn set_shared_weights(&mut self, weights: &Arc<Weights>) -> Result<(), PolicyError> {
        self.set_weights(weights)
    }
    /// Switches between mode and sampling.
    fn set_exploration(&mut self, exploration: ExplorationType);
    /// Reseeds the sampling generator.
    fn reseed(&mut self, seed: u64);
    /// The sampling generator's state for a checkpoint; `None` for a policy without one.
    /// Weights and the exploration type are not part of it. Policies that do not
    /// implement it refuse, so that a resumed run never silently diverges.
    fn sampler_state(&self) -> Result<Option<SamplerState>, PolicyError> {
        Err(PolicyError::NotCheckpointable(std::any::type_name::<Self>()))
    }
    /// Continues sampling from `state` (as `sampler_state` returned it). A state that
    /// does not fit is an error and leaves the policy as it was.
    fn set_sampler_state(&mut self, state: Option<&SamplerState>) -> Result<(), PolicyError> {
        let _ = state;
        Err(PolicyError::NotCheckpointable(std::any::type_name::<Self>()))
    }
    /// What this policy records beside its actions (see [`Recorded`]); the default,
    /// nothing, for a policy without a distribution.
    fn recorded(&self) -> Recorded {
        Recorded::None
    }
    /// As [`Policy::act`], also writing what [`Policy::recorded`] says into `record`
    /// (its buffers sized for `k` rows). The default ignores `record`: right for a
    /// policy that records nothing.
    fn act_recording(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        let _ = record;
        self.act(obs, k, actions)
    }
    /// A recurrent policy's state tensors (PROTOCOL.md §8, Recurrent), which the
    /// collection loop keeps per env and hands to [`Policy::act_recurrent`]; empty, the
    /// default, for a policy without state.
    fn state(&self) -> &[StateTensor] {
        &[]
    }
    /// As [`Policy::act_recording`] for a policy with [`Policy::state`]: reads each env's
    /// state from `state.before` (zero where `state.is_init`) and writes the state after
    /// the step into `state.after`. The default refuses: a policy without state is
    /// never called this way.
    fn act_recurrent(
        &mut self,
        obs: &[f32],
        k: usize,
        state: StateIo<'_>,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        let _ = (obs, k, state, actions, record);
        Err(PolicyError::Spec(format!(
            "policy `{}` keeps no recurrent state",
            std::any::type_name::<Self>()
        )))
    }
    /// Which built-in policy this is, if it is one: the collection loop then calls a
    /// copy of it by its concrete type, with no dynamic call per step. Policies of your
    /// own keep the default, `None`, and are called through the trait.
    #[doc(hidden)]
    fn builtin(&self) -> Option<BuiltinPolicy<'_>> {
        None
    }
}

/// A built-in policy behind a trait object (see [`Policy::builtin`]).
#[doc(hidden)]
pub enum BuiltinPolicy<'a> {
    /// [`Linear`].
    Linear(&'a Linear),
    /// [`Mlp`].
    Mlp(&'a Mlp),
}

/// Which policy to build; travels in configs and over the wire.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PolicyConfig {
    /// Uniform samples of the action spec; no weights.
    Random,
    /// One linear layer: logits (discrete) or tanh-squashed means (continuous).
    #[default]
    Linear,
    /// Tanh hidden layers, then a linear output as for `Linear`.
    Mlp {
        /// Hidden layer widths.
        hidden: Vec<usize>,
    },
    /// Action = the weight `value` everywhere (torchrl's CountingPolicy).
    Constant {
        /// Initial value of the `value` weight.
        #[serde(default = "one")]
        value: f32,
    },
    /// A network exported as ONNX (e.g. from PyTorch), run with tract; its weights are
    /// the model's f32 initializers by name. See docs/policies.md. Running one needs
    /// the cargo feature `onnx`; without it the config still travels (and decodes),
    /// and building the policy is an error naming the feature.
    Onnx {
        /// The `.onnx` file (a msgpack `bin` on the wire).
        model: OnnxModel,
        /// How its outputs parameterise the action distribution.
        head: OnnxHead,
        /// A recurrent model's state tensors (PROTOCOL.md §8, Recurrent): the model
        /// takes `is_init` and one input per tensor, and returns `next.<name>` for
        /// each. Empty (and not written on the wire) for a model without state.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        state: Vec<StateTensor>,
        /// An exploration module the node runs after the model (PROTOCOL.md §8,
        /// Exploration modules), its state the last tensors of `state`. Absent (and not
        /// written on the wire) for none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exploration: Option<ExplorationModule>,
    },
}

impl PolicyConfig {
    /// The number of f32 parameters a policy of this kind builds for observations of
    /// `obs_dim` values and an action head of `outputs` raw outputs (`n` logits, or one
    /// per action element), in checked arithmetic and without building anything; `None`
    /// when it overflows a `usize`. A policy whose parameters do not follow from the
    /// specs counts what they add: `random` none, `constant` its one value, `onnx` none
    /// (its weights are the model's, checked when the run is planned).
    pub fn spec_params(&self, obs_dim: usize, outputs: usize) -> Option<usize> {
        match self {
            PolicyConfig::Random | PolicyConfig::Onnx { .. } => Some(0),
            PolicyConfig::Constant { .. } => Some(1),
            PolicyConfig::Linear => dense_layout::dense_params([obs_dim, outputs]),
            PolicyConfig::Mlp { hidden } => {
                dense_layout::dense_params(std::iter::once(obs_dim).chain(hidden.iter().copied()).chain([outputs]))
            }
        }
    }

    /// The kind's name, as in configs and on the command line (`mlp`, `onnx`, ...).
    pub fn kind_name(&self) -> &'static str {
        match self {
            PolicyConfig::Random => "random",
            PolicyConfig::Linear => "linear",
            PolicyConfig::Mlp { .. } => "mlp",
            PolicyConfig::Constant { .. } => "constant",
            PolicyConfig::Onnx { .. } => "onnx",
        }
    }

    /// Whether a policy of this kind records anything beside its actions on every
    /// action it can take ([`Self::recorded`] is never [`Recorded::None`] for them):
    /// every policy with a distribution, `random`, `linear`, `mlp` and an `onnx` model
    /// with a categorical, normal, tanh-normal or qvalue head; not `constant` nor a
    /// deterministic `onnx` head. Known before the env's specs are.
    pub fn records(&self) -> bool {
        match self {
            PolicyConfig::Random | PolicyConfig::Linear | PolicyConfig::Mlp { .. } => true,
            PolicyConfig::Constant { .. } => false,
            PolicyConfig::Onnx { head, .. } => *head != OnnxHead::Deterministic,
        }
    }

    /// The state a policy of this config carries per env: a recurrent `onnx` model's
    /// tensors and its exploration module's, else none.
    pub fn state(&self) -> &[StateTensor] {
        match self {
            PolicyConfig::Onnx { state, .. } => state,
            _ => &[],
        }
    }

    /// The state the model itself takes and gives: [`Self::state`] less an exploration
    /// module's tensors (the last ones: OU's two), which the model never sees.
    pub fn model_state(&self) -> &[StateTensor] {
        match self {
            PolicyConfig::Onnx {
                state,
                exploration: Some(e),
                ..
            } => &state[..state.len().saturating_sub(e.state_len())],
            PolicyConfig::Onnx { state, .. } => state,
            _ => &[],
        }
    }

    /// The exploration module an `onnx` policy runs after its model, if any.
    pub fn exploration(&self) -> Option<&ExplorationModule> {
        match self {
            PolicyConfig::Onnx { exploration, .. } => exploration.as_ref(),
            _ => None,
        }
    }

    /// The model's own state after checking an exploration module against the head,
    /// the action and the state list (see [`ExplorationModule::model_state`]).
    pub fn checked_model_state(&self, action: &Spec) -> Result<&[StateTensor], PolicyError> {
        match self {
            PolicyConfig::Onnx {
                state,
                head,
                exploration: Some(e),
                ..
            } => e.model_state(*head, action, state),
            _ => Ok(self.state()),
        }
    }

    /// What a policy of this kind records beside its actions for this action spec:
    /// the batch layout's extra keys, known to the trainer before any node runs.
    pub fn recorded(&self, action: &Spec) -> Recorded {
        match (self, action) {
            (PolicyConfig::Random, _) => Recorded::LogProb,
            (PolicyConfig::Constant { .. }, _) => Recorded::None,
            (PolicyConfig::Linear | PolicyConfig::Mlp { .. }, Spec::Discrete { n }) => Recorded::Categorical {
                n: usize::try_from(*n).unwrap_or(usize::MAX),
            },
            (PolicyConfig::Linear | PolicyConfig::Mlp { .. }, Spec::Box { low, .. }) => {
                Recorded::Normal { d: low.len() }
            }
            (PolicyConfig::Onnx { head, .. }, action) => onnx::recorded(*head, action),
        }
    }
}

fn one() -> f32 {
    1.0
}

/// Everything needed to build a policy on a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicySpec {
    /// Which policy.
    pub config: PolicyConfig,
    /// Mode or sampling.
    #[serde(default)]
    pub exploration: ExplorationType,
    /// Seed of the initial weights (every node must start from the same ones).
    #[serde(default)]
    pub init_seed: u64,
    /// Whether batches carry what the policy records beside its actions
    /// ([`Recorded`]: `action_log_prob`, its distribution's parameters); `false`
    /// leaves them out (protocol version 9). Absent on the wire: `true`, so the bytes
    /// of a spec that records are those of older versions.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub record: bool,
}

impl Default for PolicySpec {
    fn default() -> PolicySpec {
        PolicySpec {
            config: PolicyConfig::default(),
            exploration: ExplorationType::default(),
            init_seed: 0,
            record: true,
        }
    }
}

fn yes() -> bool {
    true
}

fn is_yes(b: &bool) -> bool {
    *b
}

impl From<PolicyConfig> for PolicySpec {
    fn from(config: PolicyConfig) -> PolicySpec {
        PolicySpec {
            config,
            ..PolicySpec::default()
        }
    }
}

impl PolicySpec {
    /// What batches of this policy carry beside its actions for this action spec: what
    /// its kind records ([`PolicyConfig::recorded`]), or nothing when `record` is off.
    pub fn recorded(&self, action: &Spec) -> Recorded {
        if self.record {
            self.config.recorded(action)
        } else {
            Recorded::None
        }
    }

    /// Whether the nodes leave out what the policy would record
    /// ([`PolicyConfig::records`] but not `record`): protocol version 9.
    pub fn withholds_records(&self) -> bool {
        !self.record && self.config.records()
    }

    /// Builds the policy for these specs, with initial weights from `init_seed`
    /// and its sampling generator seeded with `seed`.
    pub fn build(&self, obs: &Spec, action: &Spec, seed: u64) -> Result<Box<dyn Policy>, PolicyError> {
        obs.validate()?;
        action.validate()?;
        let mut p: Box<dyn Policy> = match &self.config {
            PolicyConfig::Random => Box::new(RandomPolicy::new(action.clone(), seed)),
            PolicyConfig::Linear => Box::new(Linear::new(obs, action, self.init_seed, seed)?),
            PolicyConfig::Mlp { hidden } => Box::new(Mlp::new(obs, action, hidden, self.init_seed, seed)?),
            PolicyConfig::Constant { value } => Box::new(Constant::new(action, *value)?),
            #[cfg(feature = "onnx")]
            PolicyConfig::Onnx {
                model,
                head,
                exploration,
                ..
            } => {
                let model_state = self.config.checked_model_state(action)?;
                let inner = Box::new(OnnxPolicy::recurrent(model, *head, model_state, obs, action, seed)?);
                match exploration {
                    None => inner,
                    Some(module) => Box::new(ExploringPolicy::new(inner, module.clone(), action, seed)?),
                }
            }
            #[cfg(not(feature = "onnx"))]
            PolicyConfig::Onnx { .. } => return Err(OnnxError::NoRuntime.into()),
        };
        p.set_exploration(self.exploration);
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cartpole() -> (Spec, Spec) {
        (
            Spec::uniform_box(4, f32::NEG_INFINITY, f32::INFINITY),
            Spec::Discrete { n: 2 },
        )
    }

    fn pendulum() -> (Spec, Spec) {
        (Spec::uniform_box(3, -8.0, 8.0), Spec::uniform_box(1, -2.0, 2.0))
    }

    fn names(p: &dyn Policy) -> Vec<&str> {
        p.weights().tensors.keys().map(String::as_str).collect()
    }

    #[test]
    fn records_says_whether_a_kind_records_on_every_action_it_takes() {
        let kinds = [
            PolicyConfig::Random,
            PolicyConfig::Linear,
            PolicyConfig::Mlp { hidden: vec![3] },
            PolicyConfig::Constant { value: 1.0 },
        ];
        for kind in &kinds {
            for (_, action) in [cartpole(), pendulum()] {
                assert_eq!(
                    kind.recorded(&action) != Recorded::None,
                    kind.records(),
                    "{} on {action:?}",
                    kind.kind_name()
                );
            }
        }
        assert!(!PolicyConfig::Constant { value: 1.0 }.records());
    }

    #[test]
    fn build_every_config() {
        let configs = [
            (PolicyConfig::Random, vec![]),
            (PolicyConfig::Linear, vec!["bias", "weight"]),
            (
                PolicyConfig::Mlp { hidden: vec![8] },
                vec!["layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight"],
            ),
            (PolicyConfig::Constant { value: 1.0 }, vec!["value"]),
        ];
        for (config, expected) in configs {
            for (obs, action) in [cartpole(), pendulum()] {
                let spec = PolicySpec::from(config.clone());
                let mut p = spec.build(&obs, &action, 0).unwrap();
                assert_eq!(names(p.as_ref()), expected, "{config:?}");
                let k = 3;
                let o = vec![0.1f32; k * obs.dim()];
                if action.is_discrete() {
                    let mut a = vec![-1i64; k];
                    p.act(&o, k, ActionsMut::Discrete(&mut a)).unwrap();
                    assert!(a.iter().all(|&x| action.check_discrete(x).is_ok()), "{config:?} {a:?}");
                } else {
                    let mut a = vec![f32::NAN; k * action.dim()];
                    p.act(&o, k, ActionsMut::Continuous(&mut a)).unwrap();
                    for row in a.chunks(action.dim()) {
                        action.check_continuous(row).unwrap();
                    }
                }
            }
        }
    }

    #[test]
    fn spec_params_counts_what_build_makes_without_building() {
        let configs = [
            PolicyConfig::Random,
            PolicyConfig::Linear,
            PolicyConfig::Mlp { hidden: vec![8, 3] },
            PolicyConfig::Constant { value: 1.0 },
        ];
        for config in configs {
            for (obs, action) in [
                cartpole(),
                pendulum(),
                (Spec::uniform_box(7, -1.0, 1.0), Spec::Discrete { n: 5 }),
            ] {
                let p = PolicySpec::from(config.clone()).build(&obs, &action, 0).unwrap();
                let outputs = if let Spec::Discrete { n } = action {
                    n as usize
                } else {
                    action.dim()
                };
                assert_eq!(
                    config.spec_params(obs.dim(), outputs),
                    Some(p.weights().numel()),
                    "{config:?}"
                );
            }
        }
        let mlp = PolicyConfig::Mlp { hidden: vec![64, 64] };
        // A discrete action of 2^21 choices: 320 + 4,160 + 136,314,880 parameters.
        assert_eq!(
            mlp.spec_params(4, 1 << 21),
            Some(4 * 64 + 64 + 64 * 64 + 64 + 64 * (1 << 21) + (1 << 21))
        );
        assert_eq!(mlp.spec_params(4, usize::MAX), None, "overflow");
    }

    #[test]
    fn build_uses_init_seed_and_exploration() {
        let (obs, action) = cartpole();
        let spec = |init_seed, exploration| PolicySpec {
            config: PolicyConfig::Mlp { hidden: vec![4] },
            exploration,
            init_seed,
            record: true,
        };
        let a = spec(1, ExplorationType::Random).build(&obs, &action, 0).unwrap();
        let b = spec(1, ExplorationType::Random).build(&obs, &action, 9).unwrap();
        let c = spec(2, ExplorationType::Random).build(&obs, &action, 0).unwrap();
        assert_eq!(a.weights(), b.weights());
        assert_ne!(a.weights(), c.weights());

        // Deterministic: the same observation always gives the same action.
        let mut d = spec(1, ExplorationType::Deterministic).build(&obs, &action, 0).unwrap();
        let o = [0.3f32, -0.1, 0.2, 0.05];
        let mut first = [0i64];
        d.act(&o, 1, ActionsMut::Discrete(&mut first)).unwrap();
        for _ in 0..100 {
            let mut x = [0i64];
            d.act(&o, 1, ActionsMut::Discrete(&mut x)).unwrap();
            assert_eq!(x, first);
        }
    }

    #[test]
    fn build_rejects_bad_specs() {
        let (obs, action) = cartpole();
        let bad_box = Spec::Box {
            low: vec![0.0, 1.0],
            high: vec![1.0],
        };
        for config in [
            PolicyConfig::Random,
            PolicyConfig::Linear,
            PolicyConfig::Constant { value: 0.0 },
        ] {
            let spec = PolicySpec::from(config);
            assert!(spec.build(&obs, &Spec::Discrete { n: 0 }, 0).is_err());
            assert!(spec.build(&bad_box, &action, 0).is_err());
        }
        let spec = PolicySpec::from(PolicyConfig::Mlp { hidden: vec![0] });
        assert!(matches!(spec.build(&obs, &action, 0), Err(PolicyError::Spec(_))));
    }

    #[test]
    fn weights_round_trip_between_policies() {
        let (obs, action) = pendulum();
        let spec = PolicySpec::from(PolicyConfig::Linear);
        let src = PolicySpec {
            init_seed: 5,
            ..spec.clone()
        }
        .build(&obs, &action, 0)
        .unwrap();
        let mut dst = spec.build(&obs, &action, 0).unwrap();
        assert_ne!(dst.weights(), src.weights());
        let update = src.weights().clone().with_version(3);
        let bytes = rmp_serde::to_vec(&update).unwrap();
        let decoded: Weights = rmp_serde::from_slice(&bytes).unwrap();
        dst.set_weights(&decoded).unwrap();
        assert_eq!(dst.weights(), &update);
    }
}

#[cfg(test)]
mod record_tests;
