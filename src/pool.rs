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
/// Bounded twice: by `max_bytes`, and by use — storage that two decodes in a row
/// that took from the pool left there is surplus (a tensor the consumer added to a
/// batch, a layout that changed) and is dropped, so nothing is pinned for nothing.
#[derive(Debug, Default)]
pub struct TensorPool {
    f32: Shelf<f32>,
    f64: Shelf<f64>,
    i64: Shelf<i64>,
    bool: Shelf<bool>,
    u8: Shelf<u8>,
    bytes: usize,
    max_bytes: usize,
    /// Decodes that took from the pool so far.
    generation: u64,
    /// The current lend took something.
    took: bool,
}

/// Vectors of one element type, each with the generation it came in.
type Shelf<T> = Vec<(Vec<T>, u64)>;

/// An element type a pool keeps vectors of (the element types of a tensor).
pub(crate) trait Pooled: Copy + Sized + 'static {
    /// This type's shelf in `pool`.
    fn shelf(pool: &mut TensorPool) -> &mut Shelf<Self>;
}

macro_rules! pooled {
    ($t:ty, $field:ident) => {
        impl Pooled for $t {
            fn shelf(pool: &mut TensorPool) -> &mut Shelf<$t> {
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

    /// Bytes of storage held (capacity, not length).
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
        let size = v.capacity() * std::mem::size_of::<T>();
        if offset.unwrap_or(0) != 0 || self.bytes + size > self.max_bytes {
            return;
        }
        self.bytes += size;
        let generation = self.generation;
        T::shelf(self).push((v, generation));
    }

    /// Keeps a vector (a tensor's storage, without its shape), as [`Self::put`].
    pub(crate) fn put_vec<T: Pooled>(&mut self, v: Vec<T>) {
        let n = v.len();
        if let Ok(a) = ndarray::ArrayD::from_shape_vec(vec![n], v) {
            self.keep(a);
        }
    }

    /// A vector of exactly `n` elements (contents unspecified), if one is held.
    pub(crate) fn take<T: Pooled>(&mut self, n: usize) -> Option<Vec<T>> {
        let shelf = T::shelf(self);
        let i = shelf.iter().position(|(v, _)| v.len() == n)?;
        let (v, _) = shelf.swap_remove(i);
        self.bytes -= v.capacity() * std::mem::size_of::<T>();
        self.took = true;
        Some(v)
    }

    /// Ends one lend: if it took anything, a generation has passed, and what two
    /// such generations left untouched goes.
    fn end_lend(&mut self) {
        if !std::mem::take(&mut self.took) {
            return;
        }
        self.generation += 1;
        let cutoff = self.generation.saturating_sub(1);
        let mut freed = 0;
        fn evict<T>(shelf: &mut Shelf<T>, cutoff: u64, freed: &mut usize) {
            shelf.retain(|(v, g)| {
                let keep = *g >= cutoff;
                if !keep {
                    *freed += v.capacity() * std::mem::size_of::<T>();
                }
                keep
            });
        }
        evict(&mut self.f32, cutoff, &mut freed);
        evict(&mut self.f64, cutoff, &mut freed);
        evict(&mut self.i64, cutoff, &mut freed);
        evict(&mut self.bool, cutoff, &mut freed);
        evict(&mut self.u8, cutoff, &mut freed);
        self.bytes -= freed;
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
            self.pool.end_lend();
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
            Some((v, _)) => v.as_ptr(),
            None => panic!("kept"),
        };
        let data: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let t = lend(&mut p, || Tensor::from_le_bytes(crate::tensor::DType::F32, &[3], &data)).unwrap();
        assert_eq!(t.as_f32().unwrap().as_slice().unwrap(), &[1.0, 2.0, 3.0]);
        assert_eq!(t.as_f32().unwrap().as_ptr(), ptr, "decoded into the pooled vector");
        assert_eq!(p.len(), 1, "the unused u8 vector is back");
        assert_eq!(p.bytes(), 2);
        // Without the pool lent, decoding allocates.
        let u = Tensor::from_le_bytes(crate::tensor::DType::F32, &[3], &data).unwrap();
        assert_eq!(u, t);
    }

    #[test]
    fn storage_two_consuming_decodes_left_untouched_is_dropped() {
        let data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let decode =
            |p: &mut TensorPool| lend(p, || Tensor::from_le_bytes(crate::tensor::DType::F32, &[2], &data)).unwrap();
        let mut p = TensorPool::new(1 << 20);
        p.put(f32s(&[7], 0.0)); // never of a decoded length: surplus
        p.put(f32s(&[2], 0.0));
        // A lend that takes nothing (a heartbeat) ages nothing.
        lend(&mut p, || ());
        lend(&mut p, || ());
        decode(&mut p); // takes the [2]; the [7] was left by one consuming decode
        assert_eq!(p.len(), 1);
        p.put(f32s(&[2], 0.0));
        decode(&mut p); // the second one: the [7] goes
        assert_eq!(p.len(), 0);
        assert_eq!(p.bytes(), 0);
        // Storage put back between decodes keeps being reused.
        for _ in 0..5 {
            let t = decode(&mut p);
            p.put(t);
            assert_eq!(p.len(), 1);
        }
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
