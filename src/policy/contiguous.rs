//! Weights in standard layout: what a network that reads its layers from the named
//! tensors (a large built-in network, an ONNX dense chain) needs them to be.

use super::Weights;
use crate::tensor::Tensor;

/// f32 in standard layout: what a large network reads its layers from.
pub(super) fn is_contiguous(t: &Tensor) -> bool {
    matches!(t, Tensor::F32(a) if a.is_standard_layout())
}

/// `w` with every tensor in standard layout (a transposed view is laid out anew).
pub(super) fn contiguous_copy(w: &Weights) -> Weights {
    let tensors = w
        .tensors
        .iter()
        .map(|(k, t)| {
            let t = match t {
                Tensor::F32(a) if !a.is_standard_layout() => Tensor::F32(a.as_standard_layout().into_owned()),
                other => other.clone(),
            };
            (k.clone(), t)
        })
        .collect();
    Weights {
        version: w.version,
        tensors,
    }
}
