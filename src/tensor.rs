//! Dtype-tagged tensors over ndarray and the `TensorDict` that carries a batch.
//!
//! A [`Tensor`] is one of a few concrete element types so that batches can be
//! typed, checked and encoded without generics leaking into messages. A
//! [`TensorDict`] maps dotted paths (`next.observation`) to tensors that all
//! share a leading batch shape.
//!
//! On the wire (and in `--output` files) a tensor is a map
//! `{dtype, shape, data}` where `data` is one little-endian, C-order byte blob.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use ndarray::{ArrayD, Axis, IxDyn};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Element type of a [`Tensor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 64-bit signed integer.
    I64,
    /// Boolean, one byte per element (0 or 1) when encoded.
    Bool,
    /// Unsigned byte.
    U8,
}

impl DType {
    /// Bytes per element in the encoded form.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Bool | DType::U8 => 1,
        }
    }

    /// The name used on the wire (`"f32"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I64 => "i64",
            DType::Bool => "bool",
            DType::U8 => "u8",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What went wrong with a tensor operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TensorError {
    /// Two tensors (or a tensor and a batch) disagree on shape.
    #[error("shape mismatch for `{key}`: expected {expected:?}, got {got:?}")]
    Shape {
        /// Key (or context) of the offending tensor.
        key: String,
        /// The shape required.
        expected: Vec<usize>,
        /// The shape found.
        got: Vec<usize>,
    },
    /// A tensor has a different element type than required.
    #[error("dtype mismatch for `{key}`: expected {expected}, got {got}")]
    DType {
        /// Key (or context) of the offending tensor.
        key: String,
        /// The dtype required.
        expected: DType,
        /// The dtype found.
        got: DType,
    },
    /// A key is absent.
    #[error("no tensor under key `{0}`")]
    MissingKey(String),
    /// The dicts to stack or concatenate have different key sets.
    #[error("key sets differ: `{0}` is not in every tensordict")]
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

/// A dense n-dimensional array of one of the supported element types.
#[derive(Clone, Debug, PartialEq)]
pub enum Tensor {
    /// f32 elements.
    F32(ArrayD<f32>),
    /// f64 elements.
    F64(ArrayD<f64>),
    /// i64 elements.
    I64(ArrayD<i64>),
    /// bool elements.
    Bool(ArrayD<bool>),
    /// u8 elements.
    U8(ArrayD<u8>),
}

/// Applies the same expression to whichever array a tensor holds.
macro_rules! map_tensor {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            Tensor::F32($a) => Tensor::F32($body),
            Tensor::F64($a) => Tensor::F64($body),
            Tensor::I64($a) => Tensor::I64($body),
            Tensor::Bool($a) => Tensor::Bool($body),
            Tensor::U8($a) => Tensor::U8($body),
        }
    };
}

/// Evaluates an expression on the inner array, whatever its type.
macro_rules! with_tensor {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            Tensor::F32($a) => $body,
            Tensor::F64($a) => $body,
            Tensor::I64($a) => $body,
            Tensor::Bool($a) => $body,
            Tensor::U8($a) => $body,
        }
    };
}

/// Collects arrays of one variant from a list of tensors, or fails on a dtype mismatch.
macro_rules! same_variant {
    ($ts:expr, $variant:ident, $key:expr, $dtype:expr) => {{
        let mut out = Vec::with_capacity($ts.len());
        for t in $ts {
            match t {
                Tensor::$variant(a) => out.push(a.view()),
                other => {
                    return Err(TensorError::DType {
                        key: $key.to_string(),
                        expected: $dtype,
                        got: other.dtype(),
                    })
                }
            }
        }
        out
    }};
}

/// Stacks (`stack`) or concatenates along axis 0 views that are all contiguous in
/// C order, by copying their slices one after the other: what `ndarray::stack`
/// does, without its per-view axis and layout work (a sync round stacks one small
/// share per node and key, so that work, not the copy, was its cost). `None` where
/// a view is not contiguous or the shapes do not fit; the caller then asks ndarray,
/// which also words the error.
///
/// `storage`, when it holds exactly the joined element count, is written over
/// instead of fresh memory (a sync round's stacked batch, recycled: no allocation,
/// no fresh pages per round).
fn contiguous_join<T: Clone>(
    views: &[ndarray::ArrayViewD<'_, T>],
    stack: bool,
    storage: Option<Vec<T>>,
) -> Option<ArrayD<T>> {
    let first = views.first()?;
    let rest = first.shape().get(usize::from(!stack)..)?;
    let mut rows = 0usize;
    let mut len = 0usize;
    for v in views {
        if stack && v.shape() != first.shape() || !stack && v.shape().get(1..) != Some(rest) {
            return None;
        }
        rows = rows.checked_add(if stack { 1 } else { *v.shape().first()? })?;
        len = len.checked_add(v.len())?;
    }
    let mut data = match storage {
        Some(mut v) if v.len() == len => {
            let mut at = 0;
            for view in views {
                let part = view.as_slice()?;
                v[at..at + part.len()].clone_from_slice(part);
                at += part.len();
            }
            v
        }
        _ => Vec::with_capacity(len),
    };
    if data.len() != len {
        for v in views {
            data.extend_from_slice(v.as_slice()?);
        }
    }
    let mut shape = Vec::with_capacity(rest.len() + 1);
    shape.push(rows);
    shape.extend_from_slice(rest);
    ArrayD::from_shape_vec(IxDyn(&shape), data).ok()
}

impl Tensor {
    /// A tensor of zeros (false for bool) of the given type and shape.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let s = IxDyn(shape);
        match dtype {
            DType::F32 => Tensor::F32(ArrayD::zeros(s)),
            DType::F64 => Tensor::F64(ArrayD::zeros(s)),
            DType::I64 => Tensor::I64(ArrayD::zeros(s)),
            DType::Bool => Tensor::Bool(ArrayD::from_elem(s, false)),
            DType::U8 => Tensor::U8(ArrayD::zeros(s)),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::F32(_) => DType::F32,
            Tensor::F64(_) => DType::F64,
            Tensor::I64(_) => DType::I64,
            Tensor::Bool(_) => DType::Bool,
            Tensor::U8(_) => DType::U8,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        with_tensor!(self, a => a.shape())
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_tensor!(self, a => a.len())
    }

    /// True when the tensor has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Borrow as f32, if it is.
    pub fn as_f32(&self) -> Option<&ArrayD<f32>> {
        match self {
            Tensor::F32(a) => Some(a),
            _ => None,
        }
    }
    /// Borrow as f64, if it is.
    pub fn as_f64(&self) -> Option<&ArrayD<f64>> {
        match self {
            Tensor::F64(a) => Some(a),
            _ => None,
        }
    }
    /// Borrow as i64, if it is.
    pub fn as_i64(&self) -> Option<&ArrayD<i64>> {
        match self {
            Tensor::I64(a) => Some(a),
            _ => None,
        }
    }
    /// Borrow as bool, if it is.
    pub fn as_bool(&self) -> Option<&ArrayD<bool>> {
        match self {
            Tensor::Bool(a) => Some(a),
            _ => None,
        }
    }
    /// Borrow as u8, if it is.
    pub fn as_u8(&self) -> Option<&ArrayD<u8>> {
        match self {
            Tensor::U8(a) => Some(a),
            _ => None,
        }
    }

    /// Element `index` along `axis`, removing that axis.
    pub fn index_axis(&self, axis: usize, index: usize) -> Result<Tensor, TensorError> {
        let end = index.checked_add(1).ok_or(TensorError::OutOfRange {
            index,
            dim: axis,
            size: self.shape().get(axis).copied().unwrap_or(0),
        })?;
        self.check_axis(axis, index, end)?;
        Ok(map_tensor!(self, a => a.index_axis(Axis(axis), index).to_owned()))
    }

    /// Overwrites rows `start..start + src.shape()[0]` along axis 0 with `src` (same
    /// dtype, same shape after axis 0). Nothing is written on error.
    pub fn assign_rows(&mut self, start: usize, src: &Tensor) -> Result<(), TensorError> {
        if self.dtype() != src.dtype() {
            return Err(TensorError::DType {
                key: "assign_rows".into(),
                expected: self.dtype(),
                got: src.dtype(),
            });
        }
        let (dst_shape, src_shape) = (self.shape(), src.shape());
        if dst_shape.is_empty() || src_shape.len() != dst_shape.len() || src_shape[1..] != dst_shape[1..] {
            let mut expected = dst_shape.to_vec();
            if let Some(first) = expected.first_mut() {
                *first = src_shape.first().copied().unwrap_or(0);
            }
            return Err(TensorError::Shape {
                key: "assign_rows".into(),
                expected,
                got: src_shape.to_vec(),
            });
        }
        let end = start.checked_add(src_shape[0]).ok_or(TensorError::OutOfRange {
            index: start,
            dim: 0,
            size: dst_shape[0],
        })?;
        self.check_axis(0, start, end)?;
        let rows = ndarray::Slice::from(start..end);
        match (self, src) {
            (Tensor::F32(a), Tensor::F32(b)) => a.slice_axis_mut(Axis(0), rows).assign(b),
            (Tensor::F64(a), Tensor::F64(b)) => a.slice_axis_mut(Axis(0), rows).assign(b),
            (Tensor::I64(a), Tensor::I64(b)) => a.slice_axis_mut(Axis(0), rows).assign(b),
            (Tensor::Bool(a), Tensor::Bool(b)) => a.slice_axis_mut(Axis(0), rows).assign(b),
            (Tensor::U8(a), Tensor::U8(b)) => a.slice_axis_mut(Axis(0), rows).assign(b),
            _ => unreachable!("dtypes checked equal above"),
        }
        Ok(())
    }

    /// Elements `range` along `axis`, keeping the axis.
    pub fn slice_axis(&self, axis: usize, range: Range<usize>) -> Result<Tensor, TensorError> {
        if range.start > range.end {
            return Err(TensorError::Invalid(format!(
                "range {}..{} is reversed",
                range.start, range.end
            )));
        }
        self.check_axis(axis, range.start, range.end)?;
        let r = ndarray::Slice::from(range);
        Ok(map_tensor!(self, a => a.slice_axis(Axis(axis), r).to_owned()))
    }

    /// Gathers the elements at `indices` along `axis` (in that order, repeats
    /// allowed), keeping the axis, which gets length `indices.len()`.
    pub fn select(&self, axis: usize, indices: &[usize]) -> Result<Tensor, TensorError> {
        self.check_axis(axis, 0, 0)?;
        let size = self.shape()[axis];
        if let Some(&index) = indices.iter().find(|&&i| i >= size) {
            return Err(TensorError::OutOfRange { index, dim: axis, size });
        }
        Ok(map_tensor!(self, a => a.select(Axis(axis), indices)))
    }

    fn check_axis(&self, axis: usize, start: usize, end: usize) -> Result<(), TensorError> {
        let shape = self.shape();
        if axis >= shape.len() {
            return Err(TensorError::Invalid(format!(
                "axis {axis} out of range for a tensor of rank {}",
                shape.len()
            )));
        }
        if end > shape[axis] || start > shape[axis] {
            return Err(TensorError::OutOfRange {
                index: end.max(start),
                dim: axis,
                size: shape[axis],
            });
        }
        Ok(())
    }

    /// Stacks tensors of one dtype and shape along a new leading axis.
    pub fn stack(tensors: &[&Tensor], key: &str) -> Result<Tensor, TensorError> {
        Self::check_stackable(tensors, key)?;
        Self::join(tensors, key, true)
    }

    /// Some tensors, all of the first one's shape.
    fn check_stackable(tensors: &[&Tensor], key: &str) -> Result<(), TensorError> {
        let first = tensors.first().ok_or(TensorError::Empty("stack"))?;
        for t in tensors {
            if t.shape() != first.shape() {
                return Err(TensorError::Shape {
                    key: key.to_string(),
                    expected: first.shape().to_vec(),
                    got: t.shape().to_vec(),
                });
            }
        }
        Ok(())
    }

    /// Concatenates tensors of one dtype along axis 0.
    pub fn cat(tensors: &[&Tensor], key: &str) -> Result<Tensor, TensorError> {
        let first = tensors.first().ok_or(TensorError::Empty("cat"))?;
        for t in tensors {
            if t.shape().is_empty() || t.shape()[1..] != first.shape()[1..] {
                return Err(TensorError::Shape {
                    key: key.to_string(),
                    expected: first.shape().to_vec(),
                    got: t.shape().to_vec(),
                });
            }
        }
        Self::join(tensors, key, false)
    }

    fn join(tensors: &[&Tensor], key: &str, stack: bool) -> Result<Tensor, TensorError> {
        Self::join_into(tensors, key, stack, |_, _| None)
    }

    /// [`Self::join`], the result written into the storage `storage` gives for its
    /// dtype and element count where it has some of exactly that count.
    fn join_into(
        tensors: &[&Tensor],
        key: &str,
        stack: bool,
        storage: impl FnOnce(DType, usize) -> Option<Elements>,
    ) -> Result<Tensor, TensorError> {
        let dtype = tensors[0].dtype();
        let err = |e: ndarray::ShapeError| TensorError::Invalid(format!("`{key}`: {e}"));
        let total = tensors.iter().try_fold(0usize, |acc, t| acc.checked_add(t.len()));
        let mut storage = total.map(|n| (storage, n));
        macro_rules! go {
            ($variant:ident) => {{
                let views = same_variant!(tensors.iter().copied(), $variant, key, dtype);
                let given = match storage.take().and_then(|(s, n)| s(dtype, n)) {
                    Some(Elements::$variant(v)) => Some(v),
                    _ => None,
                };
                let out = match contiguous_join(&views, stack, given) {
                    Some(out) => out,
                    None if stack => ndarray::stack(Axis(0), &views).map_err(err)?,
                    None => ndarray::concatenate(Axis(0), &views).map_err(err)?,
                };
                Tensor::$variant(out)
            }};
        }
        Ok(match dtype {
            DType::F32 => go!(F32),
            DType::F64 => go!(F64),
            DType::I64 => go!(I64),
            DType::Bool => go!(Bool),
            DType::U8 => go!(U8),
        })
    }

    /// Reshapes (C order) without changing the element count.
    pub fn reshape(self, shape: &[usize]) -> Result<Tensor, TensorError> {
        let got = self.shape().to_vec();
        // The tensor's own count fits (it exists); a count that overflows is no match.
        if element_count(shape).ok() != Some(self.len()) {
            return Err(TensorError::Shape {
                key: "reshape".into(),
                expected: shape.to_vec(),
                got,
            });
        }
        let s = IxDyn(shape);
        Ok(map_tensor!(self, a => {
            let a = if a.is_standard_layout() { a } else { a.as_standard_layout().into_owned() };
            a.into_shape_with_order(s.clone()).map_err(|e| TensorError::Invalid(e.to_string()))?
        }))
    }

    /// Appends the little-endian C-order bytes of the elements to `out`.
    pub fn write_le_bytes(&self, out: &mut Vec<u8>) {
        out.reserve(self.len() * self.dtype().size());
        match self {
            Tensor::F32(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            Tensor::F64(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            Tensor::I64(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            Tensor::Bool(a) => a.iter().for_each(|v| out.push(u8::from(*v))),
            Tensor::U8(a) => match a.as_slice() {
                Some(s) => out.extend_from_slice(s),
                None => a.iter().for_each(|v| out.push(*v)),
            },
        }
    }

    /// The little-endian C-order bytes of the elements.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_le_bytes(&mut out);
        out
    }

    /// Builds a tensor from its encoded parts, checking that they agree.
    pub fn from_le_bytes(dtype: DType, shape: &[usize], data: &[u8]) -> Result<Tensor, TensorError> {
        Self::from_le_bytes_into(dtype, shape, data, |_, _| None)
    }

    /// [`Self::from_le_bytes`], the elements written into the storage `storage` gives
    /// for their dtype and count (asked only once the parts are found to agree), or
    /// into fresh memory if it gives none (or storage of another kind).
    pub(crate) fn from_le_bytes_into(
        dtype: DType,
        shape: &[usize],
        data: &[u8],
        storage: impl FnOnce(DType, usize) -> Option<Elements>,
    ) -> Result<Tensor, TensorError> {
        let n = element_count(shape)?;
        let want = n
            .checked_mul(dtype.size())
            .ok_or_else(|| TensorError::Encoding(format!("shape {shape:?} overflows")))?;
        if data.len() != want {
            return Err(TensorError::Encoding(format!(
                "{dtype} tensor of shape {shape:?} needs {want} bytes, got {}",
                data.len()
            )));
        }
        if dtype == DType::Bool {
            if let Some(other) = data.iter().find(|&&b| b > 1) {
                return Err(TensorError::Encoding(format!("bool byte must be 0 or 1, got {other}")));
            }
        }
        let mut elements = storage(dtype, n)
            .filter(|e| e.dtype() == dtype && e.len() == n)
            .unwrap_or_else(|| Elements::zeroed(dtype, n));
        elements.fill_from_le(data);
        elements.into_tensor(shape)
    }

    /// The tensor's storage, if it owns it whole (standard layout from its start) and
    /// holds an element: what a pool can hand to a later decode.
    pub(crate) fn into_elements(self) -> Option<Elements> {
        fn whole<T>(a: ArrayD<T>) -> Option<Vec<T>> {
            if !a.is_standard_layout() || a.is_empty() {
                return None;
            }
            let (v, offset) = a.into_raw_vec_and_offset();
            (offset.unwrap_or(0) == 0).then_some(v)
        }
        Some(match self {
            Tensor::F32(a) => Elements::F32(whole(a)?),
            Tensor::F64(a) => Elements::F64(whole(a)?),
            Tensor::I64(a) => Elements::I64(whole(a)?),
            Tensor::Bool(a) => Elements::Bool(whole(a)?),
            Tensor::U8(a) => Elements::U8(whole(a)?),
        })
    }
}

/// A batch shape whose element count fits a `usize` (a dict's tensors could not hold
/// more, and its [`TensorDict::numel`] must not wrap).
/// The largest element of an i64 array, `None` when it is empty. A trajectory-id
/// column is scanned on every batch: over the contiguous storage this is a
/// vectorised reduction, where ndarray's element iterator over a dynamic shape
/// takes index arithmetic per element (a quarter of the actor system's time per
/// in-process batch).
pub fn max_i64(a: &ArrayD<i64>) -> Option<i64> {
    match a.as_slice_memory_order() {
        Some(s) if !s.is_empty() => {
            // Eight independent running maxima: without 64-bit vector compares in the
            // baseline instruction set, one chain of compares is one element a cycle.
            let mut m = [i64::MIN; 8];
            let chunks = s.chunks_exact(8);
            let tail = chunks.remainder();
            for c in chunks {
                for (m, &x) in m.iter_mut().zip(c) {
                    *m = (*m).max(x);
                }
            }
            let head = m.into_iter().fold(i64::MIN, i64::max);
            Some(tail.iter().copied().fold(head, i64::max))
        }
        Some(_) => None,
        None => a.iter().copied().max(),
    }
}

fn check_batch_size(batch_size: &[usize]) -> Result<(), TensorError> {
    element_count(batch_size)
        .map(|_| ())
        .map_err(|_| TensorError::Invalid(format!("batch shape {batch_size:?} overflows")))
}

/// Elements of a shape, checked for overflow.
fn element_count(shape: &[usize]) -> Result<usize, TensorError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| TensorError::Encoding(format!("shape {shape:?} overflows")))
}

/// A tensor's elements in C order without its shape: storage that a decode writes
/// into and that a [`crate::pool::TensorPool`] keeps between decodes.
#[derive(Debug)]
pub(crate) enum Elements {
    /// f32 elements.
    F32(Vec<f32>),
    /// f64 elements.
    F64(Vec<f64>),
    /// i64 elements.
    I64(Vec<i64>),
    /// bool elements.
    Bool(Vec<bool>),
    /// u8 elements.
    U8(Vec<u8>),
}

impl Elements {
    /// `n` zeros (false) of `dtype`, in fresh memory.
    pub(crate) fn zeroed(dtype: DType, n: usize) -> Elements {
        match dtype {
            DType::F32 => Elements::F32(vec![0.0; n]),
            DType::F64 => Elements::F64(vec![0.0; n]),
            DType::I64 => Elements::I64(vec![0; n]),
            DType::Bool => Elements::Bool(vec![false; n]),
            DType::U8 => Elements::U8(vec![0; n]),
        }
    }

    /// The element type.
    pub(crate) fn dtype(&self) -> DType {
        match self {
            Elements::F32(_) => DType::F32,
            Elements::F64(_) => DType::F64,
            Elements::I64(_) => DType::I64,
            Elements::Bool(_) => DType::Bool,
            Elements::U8(_) => DType::U8,
        }
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        match self {
            Elements::F32(v) => v.len(),
            Elements::F64(v) => v.len(),
            Elements::I64(v) => v.len(),
            Elements::Bool(v) => v.len(),
            Elements::U8(v) => v.len(),
        }
    }

    /// Bytes of memory held (capacity, not length).
    pub(crate) fn capacity_bytes(&self) -> usize {
        fn of<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        match self {
            Elements::F32(v) => of(v),
            Elements::F64(v) => of(v),
            Elements::I64(v) => of(v),
            Elements::Bool(v) => of(v),
            Elements::U8(v) => of(v),
        }
    }

    /// The elements' memory as bytes that are their encoding, so that bytes read off
    /// a stream can land there directly: every dtype but bool (whose every byte must
    /// be checked first), on a little-endian machine. `None` otherwise.
    pub(crate) fn le_bytes_mut(&mut self) -> Option<&mut [u8]> {
        if !cfg!(target_endian = "little") {
            return None;
        }
        match self {
            Elements::F32(v) => Some(bytemuck::cast_slice_mut(v)),
            Elements::F64(v) => Some(bytemuck::cast_slice_mut(v)),
            Elements::I64(v) => Some(bytemuck::cast_slice_mut(v)),
            Elements::U8(v) => Some(v),
            Elements::Bool(_) => None,
        }
    }

    /// Overwrites the elements with the little-endian encoding `data` (exactly
    /// `len() * dtype().size()` bytes; bool bytes 0 or 1, as checked by the caller).
    fn fill_from_le(&mut self, data: &[u8]) {
        macro_rules! fill {
            ($v:expr, $t:ty, $n:expr) => {{
                if cfg!(target_endian = "little") {
                    // The blob already is the elements' memory: one alignment-safe copy.
                    bytemuck::cast_slice_mut::<$t, u8>($v).copy_from_slice(data);
                } else {
                    for (d, c) in $v.iter_mut().zip(data.chunks_exact($n)) {
                        let mut b = [0u8; $n];
                        b.copy_from_slice(c);
                        *d = <$t>::from_le_bytes(b);
                    }
                }
            }};
        }
        match self {
            Elements::F32(v) => fill!(v, f32, 4),
            Elements::F64(v) => fill!(v, f64, 8),
            Elements::I64(v) => fill!(v, i64, 8),
            Elements::U8(v) => v.copy_from_slice(data),
            Elements::Bool(v) => v.iter_mut().zip(data).for_each(|(d, &b)| *d = b == 1),
        }
    }

    /// The tensor of `shape` these are the elements of.
    pub(crate) fn into_tensor(self, shape: &[usize]) -> Result<Tensor, TensorError> {
        let s = IxDyn(shape);
        let err = |e: ndarray::ShapeError| TensorError::Encoding(e.to_string());
        Ok(match self {
            Elements::F32(v) => Tensor::F32(ArrayD::from_shape_vec(s, v).map_err(err)?),
            Elements::F64(v) => Tensor::F64(ArrayD::from_shape_vec(s, v).map_err(err)?),
            Elements::I64(v) => Tensor::I64(ArrayD::from_shape_vec(s, v).map_err(err)?),
            Elements::Bool(v) => Tensor::Bool(ArrayD::from_shape_vec(s, v).map_err(err)?),
            Elements::U8(v) => Tensor::U8(ArrayD::from_shape_vec(s, v).map_err(err)?),
        })
    }
}

macro_rules! impl_from_array {
    ($t:ty, $variant:ident) => {
        impl From<ArrayD<$t>> for Tensor {
            fn from(a: ArrayD<$t>) -> Tensor {
                Tensor::$variant(a)
            }
        }
    };
}
impl_from_array!(f32, F32);
impl_from_array!(f64, F64);
impl_from_array!(i64, I64);
impl_from_array!(bool, Bool);
impl_from_array!(u8, U8);

/// The encoded form of a tensor: header plus one byte blob, decoded but not yet
/// checked against each other (a decode given storage builds the tensor itself).
#[derive(Deserialize)]
pub(crate) struct EncodedTensor<'a> {
    /// Element type.
    pub(crate) dtype: DType,
    /// Shape.
    pub(crate) shape: Vec<usize>,
    /// The elements, little-endian, C order (borrowed from the input where it can be).
    #[serde(borrow, with = "serde_bytes")]
    pub(crate) data: std::borrow::Cow<'a, [u8]>,
}

/// The same form for encoding, borrowing everything (field order is the wire's).
#[derive(Serialize)]
struct EncodedTensorRef<'a> {
    dtype: DType,
    shape: &'a [usize],
    data: &'a serde_bytes::Bytes,
}

impl Tensor {
    /// Overwrites the elements with `data`, the little-endian encoding of a tensor of
    /// this dtype and element count, when this one's memory is its own in standard
    /// layout and `data` is exactly that long (for bool, every byte 0 or 1). `false`,
    /// nothing written, otherwise. What a decode into a recycled batch does instead
    /// of building a new array.
    pub(crate) fn refill_from_le(&mut self, data: &[u8]) -> bool {
        macro_rules! refill {
            ($a:expr, $t:ty, $n:expr) => {{
                let Some(v) = $a.as_slice_mut() else {
                    return false;
                };
                if v.len().checked_mul($n) != Some(data.len()) {
                    return false;
                }
                if cfg!(target_endian = "little") {
                    bytemuck::cast_slice_mut::<$t, u8>(v).copy_from_slice(data);
                } else {
                    for (d, c) in v.iter_mut().zip(data.chunks_exact($n)) {
                        let mut b = [0u8; $n];
                        b.copy_from_slice(c);
                        *d = <$t>::from_le_bytes(b);
                    }
                }
                true
            }};
        }
        match self {
            Tensor::F32(a) => refill!(a, f32, 4),
            Tensor::F64(a) => refill!(a, f64, 8),
            Tensor::I64(a) => refill!(a, i64, 8),
            Tensor::U8(a) => {
                let Some(v) = a.as_slice_mut() else {
                    return false;
                };
                if v.len() != data.len() {
                    return false;
                }
                v.copy_from_slice(data);
                true
            }
            Tensor::Bool(a) => {
                let Some(v) = a.as_slice_mut() else {
                    return false;
                };
                if v.len() != data.len() || data.iter().any(|&b| b > 1) {
                    return false;
                }
                v.iter_mut().zip(data).for_each(|(d, &b)| *d = b == 1);
                true
            }
        }
    }

    /// The element bytes straight from the array's memory, when that memory already is
    /// the encoded form: standard (C-order, contiguous) layout on a little-endian machine.
    /// `None` when they must be copied out (other layouts, big-endian). The encoder
    /// writes exactly this slice, which is how [`crate::wire::encode_parts`] finds it.
    pub fn le_bytes_in_place(&self) -> Option<&[u8]> {
        if !cfg!(target_endian = "little") {
            return None;
        }
        match self {
            Tensor::F32(a) => a.as_slice().map(bytemuck::cast_slice),
            Tensor::F64(a) => a.as_slice().map(bytemuck::cast_slice),
            Tensor::I64(a) => a.as_slice().map(bytemuck::cast_slice),
            Tensor::U8(a) => a.as_slice(),
            // A bool is one byte, 0 or 1: read as bytes it already is the encoding.
            Tensor::Bool(a) => a.as_slice().map(bytemuck::cast_slice),
        }
    }
}

impl Serialize for Tensor {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let copied;
        let data = match self.le_bytes_in_place() {
            Some(bytes) => bytes,
            None => {
                copied = self.to_le_bytes();
                &copied[..]
            }
        };
        EncodedTensorRef {
            dtype: self.dtype(),
            shape: self.shape(),
            data: serde_bytes::Bytes::new(data),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Tensor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Tensor, D::Error> {
        let e = EncodedTensor::deserialize(d)?;
        Tensor::from_le_bytes(e.dtype, &e.shape, &e.data).map_err(serde::de::Error::custom)
    }
}

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
    pub fn get_typed(&self, key: &str, dtype: DType) -> Result<&Tensor, TensorError> {
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
            return Err(TensorError::Invalid(format!("`{key}` is not a valid dotted key")));
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

    /// The entries under `prefix.` as a dict of their own (keys without the prefix).
    pub fn sub(&self, prefix: &str) -> TensorDict {
        let p = format!("{prefix}.");
        TensorDict {
            batch_size: self.batch_size.clone(),
            tensors: self
                .tensors
                .iter()
                .filter_map(|(k, v)| k.strip_prefix(&p).map(|s| (s.to_string(), v.clone())))
                .collect(),
        }
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
    pub fn slice(&self, dim: usize, range: Range<usize>) -> Result<TensorDict, TensorError> {
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
    use super::*;

    #[test]
    fn max_i64_is_the_largest_element_in_any_layout() {
        let a = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![4i64, -1, 9, 2, 7, -5]).unwrap();
        assert_eq!(max_i64(&a), Some(9));
        // A transposed copy keeps its elements in another order in memory.
        let t = a.t().to_owned();
        assert_eq!(max_i64(&t), Some(9));
        // A view that is not contiguous takes the element iterator.
        let every_other = a.slice_axis(Axis(1), ndarray::Slice::new(0, None, 2)).to_owned();
        assert_eq!(max_i64(&every_other), Some(9));
        let mut strided = ArrayD::from_shape_vec(IxDyn(&[2, 4]), vec![0i64, 100, 1, 100, 2, 100, 3, 100]).unwrap();
        strided.slice_axis_inplace(Axis(1), ndarray::Slice::new(0, None, 2));
        assert!(strided.as_slice_memory_order().is_none());
        assert_eq!(max_i64(&strided), Some(3));
        assert_eq!(max_i64(&ArrayD::<i64>::zeros(IxDyn(&[0, 3]))), None);
        assert_eq!(max_i64(&ArrayD::from_elem(IxDyn(&[1]), i64::MIN)), Some(i64::MIN));
    }

    fn elems(t: &Tensor) -> Vec<i64> {
        t.as_i64().unwrap().iter().copied().collect()
    }

    #[test]
    fn select_gathers_rows_in_order_with_repeats() {
        let a = ArrayD::from_shape_vec(IxDyn(&[3, 2]), vec![0i64, 1, 10, 11, 20, 21]).unwrap();
        let t = Tensor::from(a);
        let s = t.select(0, &[2, 0, 2]).unwrap();
        assert_eq!(s.shape(), &[3, 2]);
        assert_eq!(elems(&s), vec![20, 21, 0, 1, 20, 21]);
        let c = t.select(1, &[1]).unwrap();
        assert_eq!(elems(&c), vec![1, 11, 21]);
        let e = t.select(0, &[]).unwrap();
        assert_eq!(e.shape(), &[0, 2]);
    }

    #[test]
    fn select_rejects_out_of_range() {
        let t = Tensor::zeros(DType::Bool, &[2, 1]);
        let err = t.select(0, &[0, 2]).unwrap_err();
        assert_eq!(
            err,
            TensorError::OutOfRange {
                index: 2,
                dim: 0,
                size: 2
            }
        );
        assert!(matches!(t.select(2, &[0]), Err(TensorError::Invalid(_))));
    }

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
        assert_eq!(d.sub("next").keys().collect::<Vec<_>>(), vec!["reward"]);
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
    fn the_contiguous_join_gives_what_ndarray_gives() {
        let arr = |shape: &[usize], start: i64| {
            let n: usize = shape.iter().product();
            ArrayD::from_shape_vec(IxDyn(shape), (start..start + n as i64).collect()).unwrap()
        };
        let cases: [&[&[usize]]; 4] = [
            &[&[2, 3], &[2, 3], &[2, 3]],
            &[&[1, 3], &[4, 3]],
            &[&[0, 2], &[3, 2]],
            &[&[], &[]],
        ];
        for shapes in cases {
            let owned: Vec<ArrayD<i64>> = shapes.iter().enumerate().map(|(i, s)| arr(s, 100 * i as i64)).collect();
            let views: Vec<_> = owned.iter().map(|a| a.view()).collect();
            for stack in [true, false] {
                let ours = contiguous_join(&views, stack, None);
                let theirs = if stack {
                    ndarray::stack(Axis(0), &views).ok()
                } else {
                    ndarray::concatenate(Axis(0), &views).ok()
                };
                assert_eq!(ours, theirs, "{shapes:?} stack {stack}");
            }
        }
        // A view that is not contiguous in C order (a transpose) is left to ndarray.
        let t = arr(&[3, 2], 0);
        let views = [t.view().reversed_axes(), t.view().reversed_axes()];
        assert_eq!(contiguous_join(&views, true, None), None);
        let a = Tensor::I64(t.clone().reversed_axes());
        let stacked = Tensor::stack(&[&a, &a], "k").unwrap();
        assert_eq!(stacked.shape(), &[2, 2, 3]);
        assert_eq!(
            stacked,
            Tensor::I64(ndarray::stack(Axis(0), &[t.view().reversed_axes(), t.view().reversed_axes()]).unwrap())
        );
    }

    #[test]
    fn serde_is_header_plus_little_endian_blob() {
        let t = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.0f32, -2.5]).unwrap());
        let bytes = rmp_serde::to_vec_named(&t).unwrap();
        // Decode generically: a map with dtype, shape and a binary `data`.
        #[derive(serde::Deserialize)]
        struct Raw {
            dtype: String,
            shape: Vec<usize>,
            #[serde(with = "serde_bytes")]
            data: Vec<u8>,
        }
        let raw: Raw = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(raw.dtype, "f32");
        assert_eq!(raw.shape, vec![2]);
        let mut want = 1.0f32.to_le_bytes().to_vec();
        want.extend_from_slice(&(-2.5f32).to_le_bytes());
        assert_eq!(raw.data, want);
        // bin8 marker (0xc4) before the 8 data bytes: one blob, not an array of numbers.
        assert!(bytes.windows(2).any(|w| w == [0xc4, 8]));
        let back: Tensor = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back, t);
        {
            let d = td(&[2, 3], 1.5);
            let enc = rmp_serde::to_vec_named(&d).unwrap();
            let dec: TensorDict = rmp_serde::from_slice(&enc).unwrap();
            assert_eq!(dec, d);
        }
    }

    /// The raw parts of an encoded tensor.
    #[derive(serde::Deserialize)]
    struct RawParts {
        dtype: String,
        shape: Vec<usize>,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    }

    #[test]
    fn ten_million_f32_round_trip_through_the_blob() {
        let n = 10_000_000;
        let t = Tensor::F32(
            ArrayD::from_shape_vec(IxDyn(&[n / 4, 4]), (0..n).map(|i| i as f32 * 0.5 - 7.0).collect()).unwrap(),
        );
        let bytes = rmp_serde::to_vec_named(&t).unwrap();
        // Header + bin32 marker + 4-byte length + the blob: nothing per element.
        assert!(bytes.len() < 4 * n + 64, "{} bytes", bytes.len());
        let back: Tensor = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back, t);
        let raw: RawParts = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(raw.data.len(), 4 * n);
        assert_eq!(raw.data[4 * 3..4 * 4], (-5.5f32).to_le_bytes());
    }

    #[test]
    fn every_layout_and_dtype_encodes_c_order_little_endian() {
        // A transposed (non-standard layout) array takes the copying path; the bytes are the same
        // as those of its standard-layout copy.
        let a = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1i64, 2, 3, 4, 5, -6]).unwrap();
        let t = Tensor::I64(a.t().to_owned());
        let tt = Tensor::I64(a.clone().reversed_axes());
        assert!(
            tt.as_i64().unwrap().as_slice().is_none(),
            "reversed axes are not standard layout"
        );
        let enc = |t: &Tensor| rmp_serde::to_vec_named(t).unwrap();
        assert_eq!(enc(&tt), enc(&t));
        let raw: RawParts = rmp_serde::from_slice(&enc(&tt)).unwrap();
        assert_eq!(raw.shape, vec![3, 2]);
        let want: Vec<u8> = [1i64, 4, 2, 5, 3, -6].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(raw.data, want);
        assert_eq!(rmp_serde::from_slice::<Tensor>(&enc(&tt)).unwrap(), t);

        let cases = [
            Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.5f32, -0.0]).unwrap()),
            Tensor::F64(ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![f64::MAX, f64::NAN]).unwrap()),
            Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[]), vec![i64::MIN]).unwrap()),
            Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&[3]), vec![true, false, true]).unwrap()),
            Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[2, 0]), vec![]).unwrap()),
            Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[3]), vec![0, 255, 7]).unwrap()),
        ];
        for t in cases {
            let bytes = enc(&t);
            let raw: RawParts = rmp_serde::from_slice(&bytes).unwrap();
            assert_eq!(raw.dtype, t.dtype().name());
            assert_eq!(raw.shape, t.shape());
            assert_eq!(raw.data, t.to_le_bytes(), "{t:?}");
            let back: Tensor = rmp_serde::from_slice(&bytes).unwrap();
            // NaN != NaN: compare the bytes.
            assert_eq!(back.dtype(), t.dtype());
            assert_eq!(back.shape(), t.shape());
            assert_eq!(back.to_le_bytes(), t.to_le_bytes());
        }
        assert_eq!(
            Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&[2]), vec![true, false]).unwrap()).to_le_bytes(),
            vec![1, 0]
        );
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

    #[test]
    fn decoding_rejects_inconsistent_tensors() {
        assert!(Tensor::from_le_bytes(DType::F32, &[3], &[0; 8]).is_err());
        assert!(Tensor::from_le_bytes(DType::Bool, &[1], &[2]).is_err());
        assert!(Tensor::from_le_bytes(DType::F64, &[usize::MAX, 2], &[]).is_err());
        let ok = Tensor::from_le_bytes(DType::I64, &[1], &7i64.to_le_bytes()).unwrap();
        assert_eq!(ok.as_i64().unwrap()[[0]], 7);
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

    #[test]
    fn sizes_near_the_end_of_usize_are_refused_not_wrapped() {
        let t = Tensor::zeros(DType::F32, &[4, 2]);
        assert!(t.clone().reshape(&[2, (1usize << 63) + 2]).is_err(), "8 once wrapped");
        assert!(matches!(
            t.index_axis(0, usize::MAX),
            Err(TensorError::OutOfRange { .. })
        ));
        let mut dst = Tensor::zeros(DType::F32, &[4, 2]);
        let src = Tensor::zeros(DType::F32, &[1, 2]);
        assert!(matches!(
            dst.assign_rows(usize::MAX, &src),
            Err(TensorError::OutOfRange { .. })
        ));
    }
}
