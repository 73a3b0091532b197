//! Storage of tensors that are done with, for decoding to write into.
//!
//! Decoding a tensor needs memory of its own. Fresh memory is expensive: a large
//! allocation comes from the operating system as untouched pages, and faulting them
//! in costs more than copying the bytes. A batch decoded from the wire every
//! millisecond, or a 40 MB weight update, would pay that every time. A
//! [`TensorPool`] keeps the storage of tensors handed back (a batch the consumer
//! recycled, weights no worker uses any more); a decode that is given the pool
//! ([`crate::frame_decode::decode_pooled`], [`crate::frame_reader::FrameReader`])
//! writes every tensor of a dtype and element count found in it into that storage
//! instead.
//!
//! One recycled dict is kept whole: a node's next batch usually has its layout (the
//! same keys, dtypes and shapes), and then decoding only overwrites its elements
//! ([`TensorPool::take_dict`]): no array, key or map is built.

use crate::policy::Weights;
use crate::tensor::{DType, Elements, Tensor, TensorDict};

/// Storage of finished tensors, for decoding to reuse.
///
/// Bounded twice: by `max_bytes`, and by use — storage that two decodes in a row
/// that took from the pool left there is surplus (a tensor the consumer added to a
/// batch, a layout that changed) and is dropped, so nothing is pinned for nothing.
#[derive(Debug, Default)]
pub struct TensorPool {
    /// Each vector with the generation it came in.
    shelf: Vec<(Elements, u64)>,
    bytes: usize,
    max_bytes: usize,
    /// Decodes that took from the pool so far.
    generation: u64,
    /// The current decode took something.
    took: bool,
    /// A recycled dict kept whole, its bytes, and the generation it came in.
    spare: Option<(TensorDict, usize, u64)>,
}

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

    /// Number of vectors held (those of the dict kept whole included).
    pub fn len(&self) -> usize {
        self.shelf.len() + self.spare.as_ref().map_or(0, |(td, _, _)| td.len())
    }

    /// Whether the pool holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps `t`'s storage if it owns it whole (standard layout from its start) and
    /// there is room; drops it otherwise.
    pub fn put(&mut self, t: Tensor) {
        if let Some(e) = t.into_elements() {
            self.put_elements(e);
        }
    }

    /// Keeps `td` whole for the next decode of a batch of its layout if no dict is
    /// kept yet, else the storage of every tensor of it.
    pub fn put_dict(&mut self, td: TensorDict) {
        let size = td.iter().try_fold(0usize, |acc, (_, t)| {
            acc.checked_add(t.len().checked_mul(t.dtype().size())?)
        });
        match size {
            Some(size) if self.spare.is_none() && !td.is_empty() && self.bytes + size <= self.max_bytes => {
                self.bytes += size;
                self.spare = Some((td, size, self.generation));
            }
            _ => self.put_tensors(td),
        }
    }

    /// Keeps the storage of every tensor of `td`, its structure dropped.
    pub(crate) fn put_tensors(&mut self, td: TensorDict) {
        for t in td.into_entries().into_values() {
            self.put(t);
        }
    }

    /// The dict kept whole, if any, for a decode to overwrite (or, should the frame's
    /// layout differ, to hand back through [`Self::put_tensors`]).
    pub(crate) fn take_dict(&mut self) -> Option<TensorDict> {
        let (td, size, _) = self.spare.take()?;
        self.bytes -= size;
        self.took = true;
        Some(td)
    }

    /// Keeps the storage of every tensor of `weights`.
    pub fn put_weights(&mut self, weights: Weights) {
        for t in weights.tensors.into_values() {
            self.put(t);
        }
    }

    /// Keeps a tensor's storage (without its shape), as [`Self::put`].
    pub(crate) fn put_elements(&mut self, e: Elements) {
        let size = e.capacity_bytes();
        if e.len() == 0 || self.bytes + size > self.max_bytes {
            return;
        }
        self.bytes += size;
        self.shelf.push((e, self.generation));
    }

    /// Storage for exactly `n` elements of `dtype` (contents unspecified), if one is held.
    pub(crate) fn take(&mut self, dtype: DType, n: usize) -> Option<Elements> {
        let fits = |(e, _): &(Elements, u64)| e.dtype() == dtype && e.len() == n;
        let i = match self.shelf.iter().position(fits) {
            Some(i) => i,
            // Storage asked for one tensor at a time (read aside, stacked): the dict
            // kept whole is taken apart for it.
            None => {
                let (td, size, _) = self.spare.take()?;
                self.bytes -= size;
                self.put_tensors(td);
                self.shelf.iter().position(fits)?
            }
        };
        let (e, _) = self.shelf.swap_remove(i);
        self.bytes -= e.capacity_bytes();
        self.took = true;
        Some(e)
    }

    /// Ends one decode given this pool: if it (or the reading of its frame) took
    /// anything, a generation has passed, and what two such generations left
    /// untouched goes.
    pub(crate) fn end_decode(&mut self) {
        if !std::mem::take(&mut self.took) {
            return;
        }
        self.generation += 1;
        let cutoff = self.generation.saturating_sub(1);
        if let Some((_, size, g)) = &self.spare {
            if *g < cutoff {
                self.bytes -= *size;
                self.spare = None;
            }
        }
        let mut freed = 0;
        self.shelf.retain(|(e, g)| {
            let keep = *g >= cutoff;
            if !keep {
                freed += e.capacity_bytes();
            }
            keep
        });
        self.bytes -= freed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ArrayD;

    fn f32s(shape: &[usize], v: f32) -> Tensor {
        Tensor::F32(ArrayD::from_elem(shape.to_vec(), v))
    }

    /// A decode of one tensor given `p`, as the frame decoders do it.
    fn decode(p: &mut TensorPool, dtype: DType, shape: &[usize], data: &[u8]) -> Result<Tensor, crate::TensorError> {
        let t = Tensor::from_le_bytes_into(dtype, shape, data, |d, n| p.take(d, n));
        p.end_decode();
        t
    }

    fn vec_of(e: Option<Elements>) -> Option<Tensor> {
        e.and_then(|e| {
            let n = e.len();
            e.into_tensor(&[n]).ok()
        })
    }

    #[test]
    fn take_matches_dtype_and_length() {
        let mut p = TensorPool::new(1 << 20);
        p.put(f32s(&[2, 3], 1.0));
        p.put(Tensor::I64(ArrayD::from_elem(vec![6], 7)));
        assert_eq!((p.len(), p.bytes()), (2, 6 * 4 + 6 * 8));
        assert!(p.take(DType::F32, 5).is_none());
        assert!(p.take(DType::F64, 6).is_none());
        assert_eq!(
            vec_of(p.take(DType::I64, 6)),
            Some(Tensor::I64(ArrayD::from_elem(vec![6], 7)))
        );
        assert_eq!(vec_of(p.take(DType::F32, 6)), Some(f32s(&[6], 1.0)));
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
        p.put(f32s(&[0], 0.0)); // nothing to reuse
        assert!(p.is_empty());
    }

    #[test]
    fn a_decode_given_the_pool_reuses_storage_and_leaves_the_rest() {
        let mut p = TensorPool::new(1 << 20);
        p.put(f32s(&[3], 9.0));
        p.put(Tensor::U8(ArrayD::from_elem(vec![2], 1)));
        let ptr = match p.shelf.iter().find(|(e, _)| e.dtype() == DType::F32) {
            Some((Elements::F32(v), _)) => v.as_ptr(),
            _ => panic!("kept"),
        };
        let data: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let t = decode(&mut p, DType::F32, &[3], &data).unwrap();
        assert_eq!(t.as_f32().unwrap().as_slice().unwrap(), &[1.0, 2.0, 3.0]);
        assert_eq!(t.as_f32().unwrap().as_ptr(), ptr, "decoded into the pooled vector");
        assert_eq!(p.len(), 1, "the unused u8 vector stays");
        assert_eq!(p.bytes(), 2);
        // Without the pool, decoding allocates; the result is the same.
        let u = Tensor::from_le_bytes(DType::F32, &[3], &data).unwrap();
        assert_eq!(u, t);
    }

    #[test]
    fn storage_two_consuming_decodes_left_untouched_is_dropped() {
        let data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut p = TensorPool::new(1 << 20);
        p.put(f32s(&[7], 0.0)); // never of a decoded length: surplus
        p.put(f32s(&[2], 0.0));
        // A decode that takes nothing (a heartbeat) ages nothing.
        p.end_decode();
        p.end_decode();
        decode(&mut p, DType::F32, &[2], &data).unwrap(); // takes the [2]; the [7] was left by one consuming decode
        assert_eq!(p.len(), 1);
        p.put(f32s(&[2], 0.0));
        decode(&mut p, DType::F32, &[2], &data).unwrap(); // the second one: the [7] goes
        assert_eq!(p.len(), 0);
        assert_eq!(p.bytes(), 0);
        // Storage put back between decodes keeps being reused.
        for _ in 0..5 {
            let t = decode(&mut p, DType::F32, &[2], &data).unwrap();
            p.put(t);
            assert_eq!(p.len(), 1);
        }
    }

    fn dict() -> TensorDict {
        TensorDict::from_entries(
            &[2],
            [
                ("a".to_string(), f32s(&[2, 3], 1.0)),
                ("b".to_string(), f32s(&[2], 2.0)),
            ],
        )
        .unwrap()
    }

    #[test]
    fn one_recycled_dict_is_kept_whole_and_counted_the_next_taken_apart() {
        let mut p = TensorPool::new(1 << 20);
        p.put_dict(dict());
        assert_eq!((p.len(), p.bytes()), (2, 8 * 4));
        p.put_dict(dict());
        assert_eq!(
            (p.len(), p.bytes()),
            (4, 16 * 4),
            "the second one's storage on the shelf"
        );
        let td = p.take_dict().expect("kept whole");
        assert_eq!(td, dict());
        assert_eq!((p.len(), p.bytes()), (2, 8 * 4));
        assert!(p.take_dict().is_none());
        // Over the bound: taken apart, and what fits is kept.
        let mut small = TensorPool::new(30);
        small.put_dict(dict());
        assert!(small.take_dict().is_none());
        assert_eq!((small.len(), small.bytes()), (1, 24));
    }

    #[test]
    fn storage_asked_one_tensor_at_a_time_takes_the_kept_dict_apart() {
        let mut p = TensorPool::new(1 << 20);
        p.put_dict(dict());
        let e = p.take(DType::F32, 6).expect("the dict's [2, 3] tensor");
        assert_eq!(e.len(), 6);
        assert!(p.take_dict().is_none(), "taken apart");
        assert_eq!((p.len(), p.bytes()), (1, 8), "the other tensor on the shelf");
        assert!(p.take(DType::I64, 2).is_none());
    }

    #[test]
    fn a_kept_dict_two_consuming_decodes_leave_untouched_is_dropped() {
        let data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut p = TensorPool::new(1 << 20);
        p.put_dict(dict());
        p.put(f32s(&[2], 0.0));
        p.put(f32s(&[2], 0.0));
        decode(&mut p, DType::F32, &[2], &data).unwrap(); // from the shelf
        assert!(p.len() >= 2, "kept one generation");
        decode(&mut p, DType::F32, &[2], &data).unwrap();
        assert_eq!((p.len(), p.bytes()), (0, 0), "the layout changed: the dict went");
    }

    #[test]
    fn a_bad_blob_takes_nothing_and_leaves_no_half_written_tensor() {
        let mut p = TensorPool::new(1 << 20);
        p.put(Tensor::Bool(ArrayD::from_elem(vec![3], true)));
        assert!(decode(&mut p, DType::Bool, &[3], &[0, 1, 2]).is_err());
        assert_eq!(p.len(), 1, "checked before the storage is taken");
        let ok = decode(&mut p, DType::Bool, &[3], &[0, 1, 0]).unwrap();
        assert_eq!(
            ok,
            Tensor::Bool(ArrayD::from_shape_vec(vec![3], vec![false, true, false]).unwrap())
        );
        assert!(p.is_empty());
    }
}
