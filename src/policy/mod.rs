//! Policies: map a batch of observations to actions, parameterised by [`Weights`].
//!
//! A policy reads `k` observations laid out row-major in one `&[f32]` and writes
//! `k` actions into an [`ActionsMut`], so the collection loop can hand it scratch
//! buffers it reuses for the whole run: no allocation per step.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::spec::{Spec, SpecError};
use crate::tensor::{Tensor, TensorError};

mod constant;
mod linear;
mod mlp;
mod random;

pub use constant::Constant;
pub use linear::Linear;
pub use mlp::Mlp;
pub use random::RandomPolicy;

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
            Some(other) => Err(PolicyError::Weights(format!("`{name}` must be f32, got {}", other.dtype()))),
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
}

/// Maps observations to actions.
pub trait Policy: Send {
    /// Writes `k` actions for the `k` observations in `obs` (row-major, `k * obs_dim`).
    fn act(&mut self, obs: &[f32], k: usize, actions: ActionsMut<'_>) -> Result<(), PolicyError>;
    /// The current weights.
    fn weights(&self) -> &Weights;
    /// Replaces the weights; names, shapes and dtypes must match the current ones.
    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError>;
    /// Switches between mode and sampling.
    fn set_exploration(&mut self, exploration: ExplorationType);
    /// Reseeds the sampling generator.
    fn reseed(&mut self, seed: u64);
}

/// Which policy to build; travels in configs and over the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PolicyConfig {
    /// Uniform samples of the action spec; no weights.
    Random,
    /// One linear layer: logits (discrete) or tanh-squashed means (continuous).
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
}

fn one() -> f32 {
    1.0
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig::Linear
    }
}

/// Everything needed to build a policy on a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicySpec {
    /// Which policy.
    pub config: PolicyConfig,
    /// Mode or sampling.
    #[serde(default)]
    pub exploration: ExplorationType,
    /// Seed of the initial weights (every node must start from the same ones).
    #[serde(default)]
    pub init_seed: u64,
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
        };
        p.set_exploration(self.exploration);
        Ok(p)
    }
}
