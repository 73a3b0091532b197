//! The [`Tensor`] type and its shape operations: indexing, slicing, gathering,
//! stacking, concatenating and reshaping, each checked and refusing (never
//! wrapping) sizes near the end of `usize`.

use std::ops::Range;

use ndarray::{ArrayD, Axis, IxDyn};

use super::storage::Elements;
use super::{DType, TensorError};

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
    pub(crate) fn index_axis(&self, axis: usize, index: usize) -> Result<Tensor, TensorError> {
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
    pub(crate) fn assign_rows(&mut self, start: usize, src: &Tensor) -> Result<(), TensorError> {
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
    pub(crate) fn slice_axis(&self, axis: usize, range: Range<usize>) -> Result<Tensor, TensorError> {
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
    pub(crate) fn select(&self, axis: usize, indices: &[usize]) -> Result<Tensor, TensorError> {
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

    /// Some tensors, all of the first one's shape.
    pub(super) fn check_stackable(tensors: &[&Tensor], key: &str) -> Result<(), TensorError> {
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
    pub(crate) fn cat(tensors: &[&Tensor], key: &str) -> Result<Tensor, TensorError> {
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
    pub(super) fn join_into(
        tensors: &[&Tensor],
        key: &str,
        stack: bool,
        storage: impl FnOnce(DType, usize) -> Option<Elements>,
    ) -> Result<Tensor, TensorError> {
        let dtype = tensors[0].dtype();
        let err = |e: ndarray::ShapeError| TensorError::Invalid(format!("`{}`: {e}", crate::peer_text::Bounded(key)));
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

/// The largest element of an i64 array, `None` when it is empty. A trajectory-id
/// column is scanned on every batch: over the contiguous storage this is a
/// vectorised reduction, where ndarray's element iterator over a dynamic shape
/// takes index arithmetic per element (a quarter of the actor system's time per
/// in-process batch).
pub(crate) fn max_i64(a: &ArrayD<i64>) -> Option<i64> {
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

/// A batch shape whose element count fits a `usize` (a dict's tensors could not hold
/// more, and its [`super::TensorDict::numel`] must not wrap).
pub(super) fn check_batch_size(batch_size: &[usize]) -> Result<(), TensorError> {
    element_count(batch_size)
        .map(|_| ())
        .map_err(|_| TensorError::Invalid(format!("batch shape {batch_size:?} overflows")))
}

/// Elements of a shape, checked for overflow.
pub(super) fn element_count(shape: &[usize]) -> Result<usize, TensorError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| TensorError::Encoding(format!("shape {shape:?} overflows")))
}

/// The conversions between a tensor and its elements (storage.rs knows no tensor).
impl Elements {
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

impl Tensor {
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
        let stacked = Tensor::join(&[&a, &a], "k", true).unwrap();
        assert_eq!(stacked.shape(), &[2, 2, 3]);
        assert_eq!(
            stacked,
            Tensor::I64(ndarray::stack(Axis(0), &[t.view().reversed_axes(), t.view().reversed_axes()]).unwrap())
        );
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
