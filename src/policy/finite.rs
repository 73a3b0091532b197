//! Weights that hold a NaN or an infinity: found before they are stored, so that such
//! weights from a user (Python's `update_policy_weights_`, the builder's handle) never
//! reach a node unless the run allows them (`allow_nonfinite_weights`).

use std::fmt;

use super::Weights;
use crate::tensor::Tensor;

/// The first element of a float tensor that is NaN or infinite.
#[derive(Clone, Debug, PartialEq)]
pub struct NonFinite {
    /// The tensor's name.
    pub tensor: String,
    /// The element's index (one per dimension, C order).
    pub index: Vec<usize>,
    /// The value: NaN, `inf` or `-inf`.
    pub value: f64,
}

impl fmt::Display for NonFinite {
    /// `tensor `layers.0.weight` holds NaN at [2, 5]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor `{}` holds {} at {:?}", self.tensor, self.value, self.index)
    }
}

/// Elements looked at per pass: a block is scanned without a branch per element (so the
/// loop vectorises), and searched element by element only once it holds a bad one.
const BLOCK: usize = 1024;

/// Position and value of the first non-finite element of `values`, in memory order.
fn first_in<T: Copy + Into<f64>>(values: &[T]) -> Option<(usize, f64)> {
    let bad = |v: T| !v.into().is_finite();
    values.chunks(BLOCK).enumerate().find_map(|(b, chunk)| {
        if !chunk.iter().fold(false, |any, &v| any | bad(v)) {
            return None;
        }
        let i = chunk.iter().position(|&v| bad(v))?;
        Some((b * BLOCK + i, chunk[i].into()))
    })
}

/// Position (C order) and value of the first non-finite element of `a`.
fn first_in_array<T: Copy + Into<f64>>(a: &ndarray::ArrayD<T>) -> Option<(usize, f64)> {
    match a.as_slice() {
        Some(s) => first_in(s),
        None => a
            .iter()
            .position(|&v| !v.into().is_finite())
            .and_then(|i| a.iter().nth(i).map(|&v| (i, v.into()))),
    }
}

/// The index of element `flat` (C order) of an array of `shape`.
fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            index[d] = flat % n;
            flat /= n;
        }
    }
    index
}

impl Weights {
    /// The first element of the first float tensor (by name) that is NaN or infinite, if
    /// any; integer and boolean tensors hold no such value.
    pub fn first_non_finite(&self) -> Option<NonFinite> {
        self.tensors.iter().find_map(|(name, t)| {
            let (flat, value) = match t {
                Tensor::F32(a) => first_in_array(a)?,
                Tensor::F64(a) => first_in_array(a)?,
                Tensor::I64(_) | Tensor::Bool(_) | Tensor::U8(_) => return None,
            };
            Some(NonFinite {
                tensor: name.clone(),
                index: unravel(flat, t.shape()),
                value,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ndarray::{ArrayD, IxDyn};

    use super::*;

    fn weights(tensors: Vec<(&str, Tensor)>) -> Weights {
        Weights::new(
            tensors
                .into_iter()
                .map(|(n, t)| (n.to_string(), t))
                .collect::<BTreeMap<_, _>>(),
        )
    }

    #[test]
    fn finite_weights_and_integer_tensors_hold_nothing_to_refuse() {
        let w = weights(vec![
            ("a", Tensor::F32(ArrayD::from_elem(vec![3, 700], 1.5))),
            ("b", Tensor::F64(ArrayD::from_elem(vec![2], f64::MAX))),
            ("c", Tensor::I64(ArrayD::from_elem(vec![2], i64::MIN))),
            ("d", Tensor::F32(ArrayD::from_elem(vec![0], 0.0))),
        ]);
        assert_eq!(w.first_non_finite(), None);
    }

    #[test]
    fn the_first_nan_or_infinity_is_named_by_tensor_and_index() {
        let mut a = ArrayD::from_elem(vec![3, 700], 0.5f32);
        a[IxDyn(&[2, 5])] = f32::NAN;
        a[IxDyn(&[2, 600])] = f32::INFINITY;
        let mut b = ArrayD::from_elem(vec![4], 0.0f64);
        b[IxDyn(&[1])] = f64::NEG_INFINITY;
        let w = weights(vec![
            ("layers.0.weight", Tensor::F32(a.clone())),
            ("z", Tensor::F64(b.clone())),
        ]);
        let bad = w.first_non_finite().expect("a NaN");
        assert_eq!(
            (bad.tensor.as_str(), bad.index.as_slice()),
            ("layers.0.weight", &[2, 5][..])
        );
        assert!(bad.value.is_nan());
        assert_eq!(bad.to_string(), "tensor `layers.0.weight` holds NaN at [2, 5]");
        a[IxDyn(&[2, 5])] = 0.0;
        let w = weights(vec![
            ("layers.0.weight", Tensor::F32(a.clone())),
            ("z", Tensor::F64(b.clone())),
        ]);
        assert_eq!(
            w.first_non_finite().expect("inf").to_string(),
            "tensor `layers.0.weight` holds inf at [2, 600]"
        );
        a[IxDyn(&[2, 600])] = 0.0;
        let w = weights(vec![("layers.0.weight", Tensor::F32(a.clone())), ("z", Tensor::F64(b))]);
        assert_eq!(
            w.first_non_finite().expect("-inf").to_string(),
            "tensor `z` holds -inf at [1]"
        );
        // A view in other than C order (transposed) is searched in C order too.
        let mut t = ArrayD::from_elem(vec![3, 2], 0.0f32);
        t[IxDyn(&[0, 1])] = f32::NAN;
        t[IxDyn(&[1, 0])] = f32::NAN;
        let transposed = t.reversed_axes();
        assert!(transposed.as_slice().is_none());
        let w = weights(vec![("t", Tensor::F32(transposed))]);
        assert_eq!(w.first_non_finite().expect("NaN").index, vec![0, 1]);
    }
}
