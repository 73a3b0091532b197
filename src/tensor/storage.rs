//! A tensor's elements without their shape: the storage a decode writes into and
//! a [`crate::pool::TensorPool`] keeps between decodes.

use super::DType;

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
    pub(super) fn fill_from_le(&mut self, data: &[u8]) {
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
}
