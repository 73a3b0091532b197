//! The `onnx` policy: a network the user exported from PyTorch (`torch.onnx.export`),
//! run on Rust nodes. The model maps observations to the parameters of an action
//! distribution (a [`OnnxHead`]); its float initializers, by name, are the policy's
//! [`Weights`](super::Weights), so a learner pushes its own `state_dict`.
//!
//! Two engines ([`OnnxEngine`]): a graph that is exactly a chain of dense layers (torch's
//! `nn.Linear`s with `tanh`, `relu` or nothing between them: the shape of the built-in
//! `mlp`) runs on the built-in networks' kernel, reading the initializers by name, so it
//! costs what `mlp` costs and an update rebuilds nothing; any other graph runs on tract.
//!
//! - [`bytes`]: the model file as it travels (cheap to clone, msgpack `bin`).
//! - [`prescan`]: the protobuf walked before it is decoded (nodes, decoded size).
//! - [`limits`]: the decoded model checked before tract evaluates anything (constants'
//!   data against their dims, sizes ops would make from constants).
//! - [`guard`]: every call into tract, a panic in it turned into an error.
//! - [`model`]: parsing once, checking against the env's specs, the initializers.
//! - [`dense_chain`]: recognising a chain of dense layers, and its forward pass.
//! - [`runner`]: the tract plan and how weight versions reach it.
//! - [`heads`]: from the model's outputs to actions and log-probabilities.
//! - [`policy`]: [`OnnxPolicy`], the [`Policy`](super::Policy) over all of it.
//!
//! All but the first two need tract, behind the cargo feature `onnx`. Without it
//! [`OnnxModel`] is [`model_without_runtime`]'s: an `onnx` config still decodes and
//! travels, and every use of the model is [`OnnxError::NoRuntime`], naming the feature.

mod bytes;
#[cfg(feature = "onnx")]
mod dense_chain;
mod error;
#[cfg(feature = "onnx")]
mod guard;
#[cfg(feature = "onnx")]
mod heads;
#[cfg(feature = "onnx")]
mod limits;
#[cfg(feature = "onnx")]
mod model;
mod model_wire;
#[cfg(not(feature = "onnx"))]
mod model_without_runtime;
#[cfg(feature = "onnx")]
mod policy;
#[cfg(feature = "onnx")]
mod prescan;
#[cfg(feature = "onnx")]
mod runner;

use serde::{Deserialize, Serialize};

pub use bytes::OnnxBytes;
pub use error::OnnxError;
#[cfg(feature = "onnx")]
pub use model::OnnxModel;
#[cfg(not(feature = "onnx"))]
pub use model_without_runtime::OnnxModel;
#[cfg(feature = "onnx")]
pub use policy::{OnnxEngine, OnnxPolicy};
#[cfg(feature = "onnx")]
pub use runner::WeightMode;

use super::Recorded;
use crate::spec::Spec;

/// The largest ONNX model accepted, in bytes: the trainer refuses a bigger file before
/// any node starts, and a node counts it against the size of the `welcome` it reads.
pub const MAX_MODEL_BYTES: usize = 128 << 20;

/// The most nodes a model may hold, counted in the file before it is decoded (the
/// graph, subgraphs and functions together): an empty node is 2 bytes in the file and
/// over 200 decoded.
pub const MAX_MODEL_NODES: usize = 100_000;

/// Decoding a model may allocate at most twice its size plus this many bytes (a bound
/// computed from the file's tags and lengths before it is decoded).
pub const DECODE_OVERHEAD_BYTES: usize = 64 << 20;

/// The most elements the ops that make a tensor of a size given by a constant
/// (`ConstantOfShape`, `Expand`, `Tile`, `Range`, `Resize`, `Upsample`, `Pad`, `OneHot`,
/// `RandomNormal`, `RandomUniform`) may make, summed over the model, checked before
/// tract folds any of them. The constant tensors themselves hold at most
/// [`MAX_MODEL_BYTES`] elements together, each exactly the data its dims declare.
pub const MAX_MODEL_CONSTANT_ELEMENTS: usize = 1 << 24;

/// How the model's outputs parameterise the action distribution (the design's heads;
/// written as snake_case strings in configs and on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnnxHead {
    /// `logits` f32 `[K, n]` of a categorical over a discrete action.
    Categorical,
    /// `loc` f32 `[K, d]` and `scale` or `log_std` (`[K, d]`, `[1, d]` or `[d]`) of a
    /// normal per action dimension; actions clipped to the box's finite bounds.
    Normal,
    /// As `Normal`, squashed by tanh and scaled to the action box.
    TanhNormal,
    /// `action` itself: f32 `[K, d]` for a box, or integers `[K]`/`[K, 1]` for a
    /// discrete action.
    Deterministic,
    /// `action_value` f32 `[K, n]` of a Q-value actor (torchrl's `QValueModule`): the
    /// greedy action, recording the values and the greedy one's (version 8).
    #[serde(rename = "qvalue")]
    QValue,
}

impl OnnxHead {
    /// The snake_case name (as in configs and on the command line).
    pub fn name(self) -> &'static str {
        match self {
            OnnxHead::Categorical => "categorical",
            OnnxHead::Normal => "normal",
            OnnxHead::TanhNormal => "tanh_normal",
            OnnxHead::Deterministic => "deterministic",
            OnnxHead::QValue => "qvalue",
        }
    }

    /// The head of that name.
    pub fn from_name(name: &str) -> Option<OnnxHead> {
        [
            OnnxHead::Categorical,
            OnnxHead::Normal,
            OnnxHead::TanhNormal,
            OnnxHead::Deterministic,
            OnnxHead::QValue,
        ]
        .into_iter()
        .find(|h| h.name() == name)
    }
}

/// What a policy of `head` records for this action spec.
pub(crate) fn recorded(head: OnnxHead, action: &Spec) -> Recorded {
    match (head, action) {
        (OnnxHead::Categorical, Spec::Discrete { n }) => Recorded::Categorical {
            n: usize::try_from(*n).unwrap_or(usize::MAX),
        },
        (OnnxHead::Normal | OnnxHead::TanhNormal, Spec::Box { low, .. }) => Recorded::Normal { d: low.len() },
        (OnnxHead::QValue, Spec::Discrete { n }) => Recorded::QValue {
            n: usize::try_from(*n).unwrap_or(usize::MAX),
        },
        _ => Recorded::None,
    }
}

impl std::fmt::Display for OnnxHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(all(test, feature = "onnx"))]
mod exploration_tests;
#[cfg(all(test, feature = "onnx"))]
mod hostile_tests;
#[cfg(all(test, feature = "onnx"))]
mod recurrent_tests;
#[cfg(all(test, feature = "onnx"))]
mod tests;
