//! [`TensorDict`]: tensors under dotted keys that share a leading batch shape.

use std::collections::BTreeMap;
use std::ops::Range;

use ndarray::ArrayD;
use serde::{Deserialize, Deserializer, Serialize};

use super::ops::{check_batch_size, element_count};
use super::storage::Elements;
use super::{DType, Tensor, TensorError};

/// Tensors under dotted keys sharing a leading batch shape.
///
/// Every tensor's shape starts with `batch_size`; the rest is that entry's
/// feature shape. Keys are dotted paths, so `next.reward` is the `reward`
/// entry of the nested `next` dict.
///
/// Decoding checks the same invariants as [`TensorDict::set`] (every shape starts
/// with the batch shape, keys are valid dotted paths), so a dict read from
/// untrusted bytes is as consistent as one built in memory.
#[derive(Clone, Debug, PartialEq, Default, Serialize)]
pub struct TensorDict {
    batch_size: Vec<usize>,
    tensors: BTreeMap<String, Tensor>,
}

/// A decoded but not yet checked [`TensorDict`], its tensors as `M` holds them (a
/// map of tensors; or of their encoded parts, for a decode given storage).
#[derive(Deserialize)]
#[serde(rename = "RawTensorDict")]
pub(crate) struct RawTensorDict<M> {
    /// The batch shape.
    pub(crate) batch_size: Vec<usize>,
    /// The entries.
    pub(crate) tensors: M,
}

impl<'de> Deserialize<'de> for TensorDict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TensorDict, D::Error> {
        let raw = RawTensorDict::<BTreeMap<String, Tensor>>::deserialize(d)?;
        TensorDict::decoded(raw.batch_size, raw.tensors).map_err(serde::de::Error::custom)
    }
}

/// A dotted key: non-empty segments separated by single dots.
fn valid_key(key: &str) -> bool {
    !key.is_empty() && !key.split('.').any(str::is_empty)
}

impl TensorDict {
    /// An empty dict with the given batch shape.
    pub fn new(batch_size: &[usize]) -> TensorDict {
        TensorDict {
            batch_size: batch_size.to_vec(),
            tensors: BTreeMap::new(),
        }
    }

    /// Builds a dict from entries, checking each against the batch shape.
    pub fn from_entries(
        batch_size: &[usize],
        entries: impl IntoIterator<Item = (String, Tensor)>,
    ) -> Result<TensorDict, TensorError> {
        let mut td = TensorDict::new(batch_size);
        for (k, v) in entries {
            td.set(&k, v)?;
        }
        Ok(td)
    }

    /// The leading batch shape.
    pub fn batch_size(&self) -> &[usize] {
        &self.batch_size
    }

    /// Number of elements in the batch (product of batch dims). A batch shape whose
    /// product overflows, which only a dict without entries built in memory can have
    /// ([`Self::validate`] and decoding refuse it), counts `usize::MAX`: never a
    /// wrapped count.
    pub fn numel(&self) -> usize {
        element_count(&self.batch_size).unwrap_or(usize::MAX)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when there is no entry.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The dotted keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The entries, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The entries, sorted by key, each tensor mutable (its shape must not change).
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut Tensor)> {
        self.tensors.iter_mut().map(|(k, v)| (k.as_str(), v))
    }

    /// Consumes the dict into its entries.
    pub fn into_entries(self) -> BTreeMap<String, Tensor> {
        self.tensors
    }

    /// True when `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.tensors.contains_key(key)
    }

    /// The tensor under `key`.
    pub fn get(&self, key: &str) -> Result<&Tensor, TensorError> {
        self.tensors
            .get(key)
            .ok_or_else(|| TensorError::MissingKey(key.to_string()))
    }

    /// Mutable access to the tensor under `key` (its shape must not change).
    pub fn get_mut(&mut self, key: &str) -> Result<&mut Tensor, TensorError> {
        self.tensors
            .get_mut(key)
            .ok_or_else(|| TensorError::MissingKey(key.to_string()))
    }

    /// The tensor under `key`, which must be of `dtype`.
    pub(crate) fn get_typed(&self, key: &str, dtype: DType) -> Result<&Tensor, TensorError> {
        let t = self.get(key)?;
        if t.dtype() != dtype {
            return Err(TensorError::DType {
                key: key.to_string(),
                expected: dtype,
                got: t.dtype(),
            });
        }
        Ok(t)
    }

    /// The f32 array under `key`.
    pub fn f32(&self, key: &str) -> Result<&ArrayD<f32>, TensorError> {
        self.get_typed(key, DType::F32)
            .map(|t| t.as_f32().expect("checked dtype"))
    }
    /// The i64 array under `key`.
    pub fn i64(&self, key: &str) -> Result<&ArrayD<i64>, TensorError> {
        self.get_typed(key, DType::I64)
            .map(|t| t.as_i64().expect("checked dtype"))
    }
    /// The bool array under `key`.
    pub fn bool(&self, key: &str) -> Result<&ArrayD<bool>, TensorError> {
        self.get_typed(key, DType::Bool)
            .map(|t| t.as_bool().expect("checked dtype"))
    }

    /// Inserts (or replaces) `key`; its shape must start with the batch shape.
    pub fn set(&mut self, key: &str, value: Tensor) -> Result<(), TensorError> {
        if !valid_key(key) {
            return Err(TensorError::Invalid(format!(
                "`{}` is not a valid dotted key",
                crate::peer_text::Bounded(key)
            )));
        }
        let shape = value.shape();
        if shape.len() < self.batch_size.len() || shape[..self.batch_size.len()] != self.batch_size[..] {
            return Err(TensorError::Shape {
                key: key.to_string(),
                expected: self.batch_size.clone(),
                got: shape.to_vec(),
            });
        }
        if let Some(old) = self.tensors.get(key) {
            if old.dtype() != value.dtype() {
                return Err(TensorError::DType {
                    key: key.to_string(),
                    expected: old.dtype(),
                    got: value.dtype(),
                });
            }
        }
        self.tensors.insert(key.to_string(), value);
        Ok(())
    }

    /// Removes and returns `key`.
    pub fn remove(&mut self, key: &str) -> Option<Tensor> {
        self.tensors.remove(key)
    }

    /// Stacks dicts with equal batch shapes and keys along a new leading batch dim.
    pub fn stack(dicts: &[TensorDict]) -> Result<TensorDict, TensorError> {
        Self::stack_into(dicts, |_, _| None)
    }

    /// [`Self::stack`], each stacked tensor written into the storage `storage` gives
    /// for its dtype and element count, where it has some of exactly that count.
    pub(crate) fn stack_into(
        dicts: &[TensorDict],
        mut storage: impl FnMut(DType, usize) -> Option<Elements>,
    ) -> Result<TensorDict, TensorError> {
        let first = dicts.first().ok_or(TensorError::Empty("stack"))?;
        for d in dicts {
            if d.batch_size != first.batch_size {
                return Err(TensorError::Shape {
                    key: "batch_size".into(),
                    expected: first.batch_size.clone(),
                    got: d.batch_size.clone(),
                });
            }
        }
        let mut batch = vec![dicts.len()];
        batch.extend_from_slice(&first.batch_size);
        check_batch_size(&batch)?;
        Self::combine(dicts, batch, |parts, key| {
            Tensor::check_stackable(parts, key)?;
            Tensor::join_into(parts, key, true, &mut storage)
        })
    }

    /// Concatenates dicts along batch dim 0 (the other batch dims must agree).
    pub fn cat(dicts: &[TensorDict]) -> Result<TensorDict, TensorError> {
        let first = dicts.first().ok_or(TensorError::Empty("cat"))?;
        if first.batch_size.is_empty() {
            return Err(TensorError::Invalid("cannot cat dicts with no batch dim".into()));
        }
        let mut n0 = 0usize;
        for d in dicts {
            if d.batch_size.len() != first.batch_size.len() || d.batch_size[1..] != first.batch_size[1..] {
                return Err(TensorError::Shape {
                    key: "batch_size".into(),
                    expected: first.batch_size.clone(),
                    got: d.batch_size.clone(),
                });
            }
            n0 = n0
                .checked_add(d.batch_size[0])
                .ok_or_else(|| TensorError::Invalid("the batch dims to cat overflow".into()))?;
        }
        let mut batch = first.batch_size.clone();
        batch[0] = n0;
        check_batch_size(&batch)?;
        Self::combine(dicts, batch, Tensor::cat)
    }

    fn combine(
        dicts: &[TensorDict],
        batch_size: Vec<usize>,
        mut op: impl FnMut(&[&Tensor], &str) -> Result<Tensor, TensorError>,
    ) -> Result<TensorDict, TensorError> {
        let first = &dicts[0];
        for d in dicts {
            // The same keys in the same (sorted) order is the same key set: one pass,
            // and the searches below only name the key that differs.
            if d.tensors.len() == first.tensors.len() && d.tensors.keys().eq(first.tensors.keys()) {
                continue;
            }
            if let Some(k) = d.tensors.keys().find(|k| !first.tensors.contains_key(*k)) {
                return Err(TensorError::KeysDiffer(k.clone()));
            }
            if let Some(k) = first.tensors.keys().find(|k| !d.tensors.contains_key(*k)) {
                return Err(TensorError::KeysDiffer(k.clone()));
            }
        }
        // Every dict's values in key order: the k-th of each is under the same key.
        let mut columns: Vec<_> = dicts.iter().map(|d| d.tensors.values()).collect();
        let mut tensors = BTreeMap::new();
        for key in first.tensors.keys() {
            let parts = columns
                .iter_mut()
                .map(|c| c.next().ok_or_else(|| TensorError::KeysDiffer(key.clone())))
                .collect::<Result<Vec<&Tensor>, TensorError>>()?;
            tensors.insert(key.clone(), op(&parts, key)?);
        }
        Ok(TensorDict { batch_size, tensors })
    }

    /// Element `index` along batch dim `dim` (that dim is removed).
    pub fn index(&self, dim: usize, index: usize) -> Result<TensorDict, TensorError> {
        self.check_dim(dim)?;
        let size = self.batch_size[dim];
        if index >= size {
            return Err(TensorError::OutOfRange { index, dim, size });
        }
        let mut batch_size = self.batch_size.clone();
        batch_size.remove(dim);
        let tensors = self
            .tensors
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.index_axis(dim, index)?)))
            .collect::<Result<_, TensorError>>()?;
        Ok(TensorDict { batch_size, tensors })
    }

    /// Elements `range` along batch dim `dim` (that dim is kept).
    pub(crate) fn slice(&self, dim: usize, range: Range<usize>) -> Result<TensorDict, TensorError> {
        self.check_dim(dim)?;
        let size = self.batch_size[dim];
        if range.end > size || range.start > range.end {
            return Err(TensorError::OutOfRange {
                index: range.end,
                dim,
                size,
            });
        }
        let mut batch_size = self.batch_size.clone();
        batch_size[dim] = range.len();
        let tensors = self
            .tensors
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.slice_axis(dim, range.clone())?)))
            .collect::<Result<_, TensorError>>()?;
        Ok(TensorDict { batch_size, tensors })
    }

    /// Reshapes the batch dims (the element count must stay the same).
    pub fn reshape(self, batch_size: &[usize]) -> Result<TensorDict, TensorError> {
        let count = |b: &[usize]| element_count(b).ok();
        if count(batch_size).is_none() || count(batch_size) != count(&self.batch_size) {
            return Err(TensorError::Shape {
                key: "batch_size".into(),
                expected: self.batch_size.clone(),
                got: batch_size.to_vec(),
            });
        }
        let nb = self.batch_size.len();
        let mut tensors = BTreeMap::new();
        for (k, v) in self.tensors {
            let mut shape = batch_size.to_vec();
            shape.extend_from_slice(&v.shape()[nb..]);
            tensors.insert(k, v.reshape(&shape)?);
        }
        Ok(TensorDict {
            batch_size: batch_size.to_vec(),
            tensors,
        })
    }

    fn check_dim(&self, dim: usize) -> Result<(), TensorError> {
        if dim >= self.batch_size.len() {
            return Err(TensorError::Invalid(format!(
                "batch dim {dim} out of range for batch shape {:?}",
                self.batch_size
            )));
        }
        Ok(())
    }

    /// The dict of decoded entries, checked as decoding checks it: keys are dotted
    /// paths and every shape starts with the batch shape.
    pub(crate) fn decoded(
        batch_size: Vec<usize>,
        tensors: BTreeMap<String, Tensor>,
    ) -> Result<TensorDict, TensorError> {
        if let Some(bad) = tensors.keys().find(|k| !valid_key(k)) {
            return Err(TensorError::Invalid(format!("`{bad}` is not a valid dotted key")));
        }
        let td = TensorDict { batch_size, tensors };
        td.validate()?;
        Ok(td)
    }

    /// Checks the invariant after decoding from untrusted bytes: every shape starts
    /// with the batch shape, whose element count fits a `usize`.
    pub fn validate(&self) -> Result<(), TensorError> {
        check_batch_size(&self.batch_size)?;
        for (k, v) in &self.tensors {
            let shape = v.shape();
            if shape.len() < self.batch_size.len() || shape[..self.batch_size.len()] != self.batch_size[..] {
                return Err(TensorError::Shape {
                    key: k.clone(),
                    expected: self.batch_size.clone(),
                    got: shape.to_vec(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ndarray::IxDyn;

    use super::*;

    fn f32s(shape: &[usize], start: f32) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(|i| start + i as f32).collect()).unwrap())
    }

    fn td(batch: &[usize], start: f32) -> TensorDict {
        let mut obs_shape = batch.to_vec();
        obs_shape.push(2);
        TensorDict::from_entries(
            batch,
            [
                ("observation".to_string(), f32s(&obs_shape, start)),
                ("next.done".to_string(), Tensor::zeros(DType::Bool, batch)),
            ],
        )
        .unwrap()
    }

    #[test]
    fn set_checks_batch_shape_dtype_and_key() {
        let mut d = TensorDict::new(&[2, 3]);
        assert_eq!(d.numel(), 6);
        d.set("next.reward", Tensor::zeros(DType::F32, &[2, 3, 1])).unwrap();
        assert!(matches!(
            d.set("x", Tensor::zeros(DType::F32, &[3, 2])),
            Err(TensorError::Shape { .. })
        ));
        assert!(matches!(
            d.set("next.reward", Tensor::zeros(DType::I64, &[2, 3, 1])),
            Err(TensorError::DType { .. })
        ));
        assert!(matches!(
            d.set("a..b", Tensor::zeros(DType::F32, &[2, 3])),
            Err(TensorError::Invalid(_))
        ));
        assert_eq!(d.get("nope"), Err(TensorError::MissingKey("nope".into())));
        assert!(matches!(
            d.get_typed("next.reward", DType::I64),
            Err(TensorError::DType { .. })
        ));
    }

    #[test]
    fn stack_cat_index_slice() {
        let a = td(&[2], 0.0);
        let b = td(&[2], 100.0);
        let s = TensorDict::stack(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(s.batch_size(), &[2, 2]);
        assert_eq!(s.get("observation").unwrap().shape(), &[2, 2, 2]);
        assert_eq!(s.index(0, 1).unwrap(), b);
        let c = TensorDict::cat(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(c.batch_size(), &[4]);
        assert_eq!(c.slice(0, 2..4).unwrap(), b);
        assert_eq!(c.slice(0, 0..2).unwrap(), a);
        let obs = c.f32("observation").unwrap();
        assert_eq!(obs[[2, 0]], 100.0);
        assert!(matches!(c.index(0, 4), Err(TensorError::OutOfRange { .. })));
        assert!(matches!(c.slice(0, 3..5), Err(TensorError::OutOfRange { .. })));
        assert!(matches!(c.index(1, 0), Err(TensorError::Invalid(_))));
        let mut other = td(&[2], 0.0);
        other.remove("next.done");
        assert!(matches!(
            TensorDict::stack(&[a.clone(), other]),
            Err(TensorError::KeysDiffer(_))
        ));
        assert!(matches!(
            TensorDict::stack(&[a.clone(), td(&[3], 0.0)]),
            Err(TensorError::Shape { .. })
        ));
        assert!(matches!(TensorDict::stack(&[]), Err(TensorError::Empty(_))));
        let r = s.reshape(&[4]).unwrap();
        assert_eq!(r, c);
    }

    #[test]
    fn a_dict_round_trips_through_serde() {
        let d = td(&[2, 3], 1.5);
        let enc = rmp_serde::to_vec_named(&d).unwrap();
        let dec: TensorDict = rmp_serde::from_slice(&enc).unwrap();
        assert_eq!(dec, d);
    }

    #[test]
    fn decoded_tensordict_is_validated() {
        // Built by hand: a batch shape the tensors do not start with.
        #[derive(serde::Serialize)]
        struct Raw<'a> {
            batch_size: Vec<usize>,
            tensors: BTreeMap<&'a str, Tensor>,
        }
        let enc = |batch_size: Vec<usize>, key: &'static str, shape: &[usize]| {
            rmp_serde::to_vec_named(&Raw {
                batch_size,
                tensors: [(key, Tensor::zeros(DType::F32, shape))].into_iter().collect(),
            })
            .unwrap()
        };
        let ok: TensorDict = rmp_serde::from_slice(&enc(vec![2, 3], "next.reward", &[2, 3, 1])).unwrap();
        assert_eq!(ok.batch_size(), &[2, 3]);
        for (batch, key, shape) in [
            (vec![5], "observation", &[3, 4][..]),
            (vec![2, 3], "observation", &[2][..]),
            (vec![2, 3], "observation", &[3, 2][..]),
            (vec![2], "", &[2][..]),
            (vec![2], "next..reward", &[2][..]),
            (vec![2], "next.", &[2][..]),
        ] {
            let err = rmp_serde::from_slice::<TensorDict>(&enc(batch.clone(), key, shape)).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(key) || msg.contains("shape"),
                "{batch:?} {key:?} {shape:?}: {msg}"
            );
        }
    }

    /// A batch shape of `2 × (2^63 + 500)`: 1000 once wrapped.
    fn wrapping_batch() -> Vec<usize> {
        vec![2, (1usize << 63) + 500]
    }

    #[test]
    fn a_batch_shape_whose_count_overflows_is_never_a_wrapped_count() {
        let td = TensorDict::new(&wrapping_batch());
        assert_eq!(td.numel(), usize::MAX, "saturates instead of wrapping to 1000");
        assert!(
            matches!(td.validate(), Err(TensorError::Invalid(m)) if m.contains("overflows")),
            "{:?}",
            td.validate()
        );
        #[derive(serde::Serialize)]
        struct Raw {
            batch_size: Vec<usize>,
            tensors: BTreeMap<String, Tensor>,
        }
        let bytes = rmp_serde::to_vec_named(&Raw {
            batch_size: wrapping_batch(),
            tensors: BTreeMap::new(),
        })
        .unwrap();
        let err = rmp_serde::from_slice::<TensorDict>(&bytes).unwrap_err();
        assert!(err.to_string().contains("overflows"), "{err}");
        let huge = TensorDict::new(&[1usize << 62]);
        assert!(
            TensorDict::stack(&[huge.clone(), huge.clone(), huge.clone(), huge.clone()]).is_err(),
            "4 × 2^62"
        );
        assert!(TensorDict::cat(&[huge.clone(), huge.clone(), huge.clone(), huge.clone()]).is_err());
        assert!(TensorDict::new(&[usize::MAX]).reshape(&wrapping_batch()).is_err());
        assert!(TensorDict::new(&[1000]).reshape(&wrapping_batch()).is_err());
    }
}
