//! Storage of tensors that are done with, for decoding to write into.
//!
//! Decoding a tensor needs memory of its own. Fresh memory is expensive: a large
//! allocation comes from the operating system as untouched pages, and faulting them
//! in costs more than copying the bytes. A batch decoded from the wire every
//! millisecond, or a 40 MB weight update, would pay that every time. A
//! [`TensorPool`] keeps the storage of tensors handed back (a batch the consumer
//! recycled, weights no worker uses any more); while it is lent to a thread with
//! [`lend`], every tensor decoded on that thread with a dtype and element count
//! found in the pool is written into that storage instead.

use std::cell::RefCell;

use crate::policy::Weights;
use crate::tensor::{Tensor, TensorDict};

/// Vectors of finished tensors by element type, for decoding to reuse.
///
/// Bounded by `max_bytes`: storage handed in beyond that is dropped.
#[derive(Debug, Default)]
pub struct TensorPool {
    f32: Vec<Vec<f32>>,
    f64: Vec<Vec<f64>>,
    i64: Vec<Vec<i64>>,
    bool: Vec<Vec<bool>>,
    u8: Vec<Vec<u8>>,
    bytes: usize,
    max_bytes: usize,
}

/// An element type a pool keeps vectors of.
pub trait Pooled: Copy + Sized + 'static {
    /// This type's shelf in `pool`.
    fn shelf(pool: &mut TensorPool) -> &mut Vec<Vec<Self>>;
}

macro_rules! pooled {
    ($t:ty, $field:ident) => {
        impl Pooled for $t {
            fn shelf(pool: &mut TensorPool) -> &mut Vec<Vec<$t>> {
                &mut pool.$field
            }
        }
    };
}
pooled!(f32, f32);
pooled!(f64, f64);
pooled!(i64, i64);
pooled!(bool, bool);
pooled!(u8, u8);

impl TensorPool {
    /// An empty pool keeping at most `max_bytes` of storage.
    pub fn new(max_bytes: usize) -> TensorPool {
        TensorPool {
            max_bytes,
            ..TensorPool::default()
        }
    }

    /// Bytes of storage held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of vectors held.
    pub fn len(&self) -> usize {
        self.f32.len() + self.f64.len() + self.i64.len() + self.bool.len() + self.u8.len()
    }

    /// Whether the pool holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps `t`'s storage if it owns it whole (standard layout from its start) and
    /// there is room; drops it otherwise.
    pub fn put(&mut self, t: Tensor) {
        match t {
            Tensor::F32(a) => self.keep(a),
            Tensor::F64(a) => self.keep(a),
            Tensor::I64(a) => self.keep(a),
            Tensor::Bool(a) => self.keep(a),
            Tensor::U8(a) => self.keep(a),
        }
    }

    /// Keeps the storage of every tensor of `td`.
    pub fn put_dict(&mut self, td: TensorDict) {
        for t in td.into_entries().into_values() {
            self.put(t);
        }
    }

    /// Keeps the storage of every tensor of `weights`.
    pub fn put_weights(&mut self, weights: Weights) {
        for t in weights.tensors.into_values() {
            self.put(t);
        }
    }

    fn keep<T: Pooled>(&mut self, a: ndarray::ArrayD<T>) {
        if !a.is_standard_layout() || a.is_empty() {
            return;
        }
        let (v, offset) = a.into_raw_vec_and_offset();
        let size = v.len() * std::mem::size_of::<T>();
        if offset.unwrap_or(0) != 0 || self.bytes + size > self.max_bytes {
            return;
        }
        self.bytes += size;
        T::shelf(self).push(v);
    }

    /// A vector of exactly `n` elements (contents unspecified), if one is held.
    pub fn take<T: Pooled>(&mut self, n: usize) -> Option<Vec<T>> {
        let shelf = T::shelf(self);
        let i = shelf.iter().position(|v| v.len() == n)?;
        let v = shelf.swap_remove(i);
        self.bytes -= n * std::mem::size_of::<T>();
        Some(v)
    }
}

thread_local! {
    /// The pool lent to this thread, if any.
    static LENT: RefCell<Option<TensorPool>> = const { RefCell::new(None) };
}

/// Runs `f` with `pool` lent to this thread: tensors decoded meanwhile take their
/// storage from it. What `f` did not use is back in `pool` afterwards, even if `f`
/// panics.
pub fn lend<R>(pool: &mut TensorPool, f: impl FnOnce() -> R) -> R {
    struct Return<'a> {
        pool: &'a mut TensorPool,
        outer: Option<TensorPool>,
    }
    impl Drop for Return<'_> {
        fn drop(&mut self) {
            let outer = self.outer.take();
            *self.pool = LENT.with(|l| l.replace(outer)).unwrap_or_default();
        }
    }
    let outer = LENT.with(|l| l.replace(Some(std::mem::take(pool))));
    let _back = Return { pool, outer };
    f()
}

/// A vector of `n` elements from the pool lent to this thread, if it has one.
pub(crate) fn take_lent<T: Pooled>(n: usize) -> Option<Vec<T>> {
    LENT.with(|l| l.borrow_mut().as_mut().and_then(|p| p.take(n)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ArrayD;

    fn f32s(shape: &[usize], v: f32) -> Tensor {
        Tensor::F32(ArrayD::from_elem(shape.to_vec(), v))
    }

    #[test]
    fn take_matches_dtype_and_length() {
        let mut p = TensorPool::new(1 << 20);
        p.put(f32s(&[2, 3], 1.0));
        p.put(Tensor::I64(ArrayD::from_elem(vec![6], 7)));
        assert_eq!((p.len(), p.bytes()), (2, 6 * 4 + 6 * 8));
        assert!(p.take::<f32>(5).is_none());
        assert!(p.take::<f64>(6).is_none());
        assert_eq!(p.take::<i64>(6), Some(vec![7; 6]));
        assert_eq!(p.take::<f32>(6), Some(vec![1.0; 6]));
        assert!(p.is_empty());
        assert_eq!(p.bytes(), 0);
    }

    #[test]
    fn bounded_and_only_whole_storage() {
        let mut p = TensorPool::new(100);
        p.put(f32s(&[20], 0.0)); // 80 bytes: kept
        p.put(f32s(&[10], 0.0)); // 40 more: over the bound, dropped
        assert_eq!((p.len(), p.bytes()), (1, 80));
        let mut p = TensorPool::new(1 << 20);
        let t = ArrayD::from_elem(vec![4, 4], 1.0f32);
        p.put(Tensor::F32(t.clone().reversed_axes())); // not standard layout
        p.put(Tensor::F32(t.slice_move(ndarray::s![1.., ..]).into_dyn())); // not from its start
        assert!(p.is_empty());
    }

    #[test]
    fn decoding_while_lent_reuses_storage_and_returns_the_rest() {
        let mut p = TensorPool::new(1 << 20);
        p.put(f32s(&[3], 9.0));
        p.put(Tensor::U8(ArrayD::from_elem(vec![2], 1)));
        let ptr = match p.f32.first() {
            Some(v) => v.as_ptr(),
            None => panic!("kept"),
        };
        let data: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let t = lend(&mut p, || Tensor::from_le_bytes(crate::tensor::DType::F32, &[3], &data)).unwrap();
        assert_eq!(t.as_f32().unwrap().as_slice().unwrap(), &[1.0, 2.0, 3.0]);
        assert_eq!(t.as_f32().unwrap().as_ptr(), ptr, "decoded into the pooled vector");
        assert_eq!(p.len(), 1, "the unused u8 vector is back");
        // Without the pool lent, decoding allocates.
        let u = Tensor::from_le_bytes(crate::tensor::DType::F32, &[3], &data).unwrap();
        assert_eq!(u, t);
    }

    #[test]
    fn a_bad_blob_leaves_no_half_written_tensor() {
        let mut p = TensorPool::new(1 << 20);
        p.put(Tensor::Bool(ArrayD::from_elem(vec![3], true)));
        let r = lend(&mut p, || {
            Tensor::from_le_bytes(crate::tensor::DType::Bool, &[3], &[0, 1, 2])
        });
        assert!(r.is_err());
        let ok = lend(&mut p, || {
            Tensor::from_le_bytes(crate::tensor::DType::Bool, &[3], &[0, 1, 0])
        })
        .unwrap();
        assert_eq!(
            ok,
            Tensor::Bool(ArrayD::from_shape_vec(vec![3], vec![false, true, false]).unwrap())
        );
    }

    #[test]
    fn lending_nests_and_survives_a_panic() {
        let mut outer = TensorPool::new(1 << 20);
        let mut inner = TensorPool::new(1 << 20);
        inner.put(f32s(&[1], 0.0));
        lend(&mut outer, || {
            lend(&mut inner, || assert!(take_lent::<f32>(1).is_some()));
            assert!(take_lent::<f32>(1).is_none(), "the outer pool is lent again");
        });
        inner.put(f32s(&[1], 0.0));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lend(&mut inner, || panic!("boom"))));
        assert!(r.is_err());
        assert_eq!(inner.len(), 1, "given back on unwind");
        assert!(take_lent::<f32>(1).is_none(), "nothing left lent");
    }
}
