//! The byte codec of a tensor: its elements as one little-endian, C-order blob,
//! and the `{dtype, shape, data}` map serde writes and reads on the wire.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ops::element_count;
use super::storage::Elements;
use super::{DType, Tensor, TensorError};

impl Tensor {
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
    pub(crate) fn from_le_bytes(dtype: DType, shape: &[usize], data: &[u8]) -> Result<Tensor, TensorError> {
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
}

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

#[cfg(test)]
mod tests {
    use ndarray::{ArrayD, IxDyn};

    use super::*;

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
    fn decoding_rejects_inconsistent_tensors() {
        assert!(Tensor::from_le_bytes(DType::F32, &[3], &[0; 8]).is_err());
        assert!(Tensor::from_le_bytes(DType::Bool, &[1], &[2]).is_err());
        assert!(Tensor::from_le_bytes(DType::F64, &[usize::MAX, 2], &[]).is_err());
        let ok = Tensor::from_le_bytes(DType::I64, &[1], &7i64.to_le_bytes()).unwrap();
        assert_eq!(ok.as_i64().unwrap()[[0]], 7);
    }
}
