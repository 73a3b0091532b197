//! The parameter layout of a dense network `inputs -> hidden... -> outputs`, one for
//! the policies that act with it (`Linear`, `Mlp`: f32) and the learner that trains it
//! (`learn::DenseNet`: f64), so a learner's update is the policy's weights by
//! construction: one flat vector, layer by layer, weight (`[n_out, n_in]`, row-major,
//! as torch's `nn.Linear` keeps it) then bias (`[n_out]`), each tensor under its name;
//! and torch's default initialisation over it.

use std::collections::BTreeMap;
use std::ops::Range;

use ndarray::{ArrayD, IxDyn};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::Weights;
use crate::tensor::Tensor;

/// Refuse networks with more parameters than this (4 GiB of f32), so that an
/// absurd spec (say `Discrete { n: 1 << 40 }`) is an error, not an abort.
pub(crate) const MAX_PARAMS: usize = 1 << 30;

/// One dense layer: its place in the flat parameter vector and its tensors' names.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DenseLayer {
    /// Input width.
    pub(crate) n_in: usize,
    /// Output width.
    pub(crate) n_out: usize,
    /// Offset of the `[n_out, n_in]` weight in the parameters.
    pub(crate) w: usize,
    /// Offset of the `[n_out]` bias in the parameters.
    pub(crate) b: usize,
    /// The weight's tensor name.
    pub(crate) w_name: String,
    /// The bias's tensor name.
    pub(crate) b_name: String,
    /// `[n_out, n_in]`.
    w_shape: [usize; 2],
    /// `[n_out]`.
    b_shape: [usize; 1],
}

impl DenseLayer {
    /// The layer's two tensors, weight then bias: name, place in the flat parameters
    /// and shape.
    pub(crate) fn tensors(&self) -> [(&str, Range<usize>, &[usize]); 2] {
        [
            (self.w_name.as_str(), self.w..self.b, &self.w_shape),
            (self.b_name.as_str(), self.b..self.b + self.n_out, &self.b_shape),
        ]
    }
}

/// The layers of a dense network over one flat parameter vector.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DenseLayout {
    layers: Vec<DenseLayer>,
    len: usize,
}

impl DenseLayout {
    /// The layers `dims[0] -> dims[1] -> ... -> dims[last]` (at least two widths, none
    /// zero: the callers check and say which), layer `i`'s tensors named `names(i)`;
    /// `None` when the parameters overflow a `usize` or exceed [`MAX_PARAMS`].
    pub(crate) fn new(dims: &[usize], names: impl Fn(usize) -> (String, String)) -> Option<DenseLayout> {
        let mut layers = Vec::with_capacity(dims.len().saturating_sub(1));
        let mut len = 0usize;
        for (i, io) in dims.windows(2).enumerate() {
            let (n_in, n_out) = (io[0], io[1]);
            let w = len;
            let b = w.checked_add(n_in.checked_mul(n_out)?)?;
            len = b.checked_add(n_out)?;
            if len > MAX_PARAMS {
                return None;
            }
            let (w_name, b_name) = names(i);
            layers.push(DenseLayer {
                n_in,
                n_out,
                w,
                b,
                w_name,
                b_name,
                w_shape: [n_out, n_in],
                b_shape: [n_out],
            });
        }
        Some(DenseLayout { layers, len })
    }

    /// The layers, input first.
    pub(crate) fn layers(&self) -> &[DenseLayer] {
        &self.layers
    }

    /// Number of parameters.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// torch.nn.Linear's default initialisation in f32 (the policies' version 0):
    /// weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from one ChaCha8 seeded
    /// with `seed`, layer by layer, weight then bias.
    pub(crate) fn init_f32(&self, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut params = Vec::with_capacity(self.len);
        for l in &self.layers {
            let bound = 1.0 / (l.n_in as f32).sqrt();
            for _ in 0..(l.n_in * l.n_out + l.n_out) {
                params.push(bound * (2.0 * rng.random::<f32>() - 1.0));
            }
        }
        params
    }

    /// [`DenseLayout::init_f32`] drawn in f64 (the learner's value network).
    #[cfg(feature = "learn")]
    pub(crate) fn init_f64(&self, seed: u64) -> Vec<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut params = Vec::with_capacity(self.len);
        for l in &self.layers {
            let bound = 1.0 / (l.n_in as f64).sqrt();
            for _ in 0..(l.n_in * l.n_out + l.n_out) {
                params.push(bound * (2.0 * rng.random::<f64>() - 1.0));
            }
        }
        params
    }

    /// `params` (this layout) as f32 [`Weights`], version 0, each value through `to_f32`.
    pub(crate) fn to_weights<T: Copy>(&self, params: &[T], to_f32: impl Fn(T) -> f32) -> Weights {
        let mut tensors = BTreeMap::new();
        for l in &self.layers {
            for (name, range, shape) in l.tensors() {
                let values = params[range].iter().map(|&x| to_f32(x)).collect();
                let a = ArrayD::from_shape_vec(IxDyn(shape), values).expect("length matches its shape");
                tensors.insert(name.to_string(), Tensor::F32(a));
            }
        }
        Weights::new(tensors)
    }
}

/// The parameters of the dense layers `dims[0] -> ... -> dims[last]`, each a weight
/// and a bias, as [`DenseLayout::new`] lays them out, in checked arithmetic and
/// without building anything; `None` if the count overflows.
pub(crate) fn dense_params(dims: impl IntoIterator<Item = usize>) -> Option<usize> {
    let dims: Vec<usize> = dims.into_iter().collect();
    dims.windows(2).try_fold(0usize, |total, io| {
        io[0].checked_mul(io[1])?.checked_add(io[1])?.checked_add(total)
    })
}
