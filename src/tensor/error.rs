//! What a tensor or tensordict operation can refuse.

use super::DType;
use crate::peer_text::{Bounded, BoundedDisplay};

/// What went wrong with a tensor operation. Keys and shapes may be a node's (a
/// batch off the wire): they are shown bounded and escaped ([`crate::peer_text`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TensorError {
    /// Two tensors (or a tensor and a batch) disagree on shape.
    #[error(
        "shape mismatch for `{}`: expected {}, got {}",
        Bounded(key),
        BoundedDisplay(format_args!("{expected:?}")),
        BoundedDisplay(format_args!("{got:?}"))
    )]
    Shape {
        /// Key (or context) of the offending tensor.
        key: String,
        /// The shape required.
        expected: Vec<usize>,
        /// The shape found.
        got: Vec<usize>,
    },
    /// A tensor has a different element type than required.
    #[error("dtype mismatch for `{}`: expected {expected}, got {got}", Bounded(key))]
    DType {
        /// Key (or context) of the offending tensor.
        key: String,
        /// The dtype required.
        expected: DType,
        /// The dtype found.
        got: DType,
    },
    /// A key is absent.
    #[error("no tensor under key `{}`", Bounded(.0))]
    MissingKey(String),
    /// The dicts to stack or concatenate have different key sets.
    #[error("key sets differ: `{}` is not in every tensordict", Bounded(.0))]
    KeysDiffer(String),
    /// An index or range falls outside a dimension.
    #[error("index {index} out of range for dimension {dim} of size {size}")]
    OutOfRange {
        /// The index (or range end) asked for.
        index: usize,
        /// The dimension.
        dim: usize,
        /// Its size.
        size: usize,
    },
    /// Operation needs at least one input.
    #[error("cannot {0} an empty list")]
    Empty(&'static str),
    /// Batch dims larger than a tensor's rank, or zero-dim operation.
    #[error("{0}")]
    Invalid(String),
    /// Encoded bytes do not describe a tensor.
    #[error("bad tensor encoding: {0}")]
    Encoding(String),
}
