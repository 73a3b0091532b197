//! Test helpers shared by the policies' unit tests: weights written inline.

use ndarray::{ArrayD, IxDyn};

use super::Weights;
use crate::tensor::Tensor;

/// An f32 tensor of `shape` from `data`.
pub(crate) fn t(shape: &[usize], data: &[f32]) -> Tensor {
    Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap())
}

/// Weights from `(name, tensor)` pairs.
pub(crate) fn w(version: u64, entries: Vec<(&str, Tensor)>) -> Weights {
    Weights::new(entries.into_iter().map(|(k, v)| (k.to_string(), v)).collect()).with_version(version)
}

/// The flattened f32 tensor `name` of `w`.
pub(crate) fn vals(w: &Weights, name: &str) -> Vec<f32> {
    w.f32_slice(name).unwrap().to_vec()
}
