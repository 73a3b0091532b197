//! A `batch` frame laid out exactly as this crate's encoder writes it, read without
//! serde: the trainer reads one per node and round, and for small batches serde's
//! visitors were most of the decode's time.
//!
//! Only one layout is read: the map of five keys `type`, `node`, `seq`,
//! `weights_version`, `data` in that order; `data` a map of `batch_size` then
//! `tensors`; each tensor a map of `dtype`, `shape`, `data`; integers in their
//! non-negative forms, strings as strings, blobs as `bin`, nothing after the frame.
//! Anything else (another order, another form of a value, more dimensions than
//! [`MAX_DIMS`], a frame cut short) is not an error here: [`read`] answers `None` and
//! the frame goes to the serde mirror, which decides. So for every frame this reads,
//! the values are those the frame's own decoding would give; a frame it does not
//! read costs one failed pass over its headers.
//!
//! Every length comes from the frame and is checked against the bytes there are
//! before anything is taken; nothing is reserved from a count in the frame beyond
//! [`MAX_RESERVE`] entries.

use crate::tensor::DType;
use crate::wire::cursor::Cursor;

/// Most dimensions of a shape read here (more: left to the mirror).
pub(super) const MAX_DIMS: usize = 8;

/// Most tensor entries reserved for at once, whatever count the frame gives.
const MAX_RESERVE: usize = 64;

/// A shape, without an allocation.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Dims {
    len: usize,
    dims: [usize; MAX_DIMS],
}

impl Dims {
    /// The dimensions.
    pub(super) fn as_slice(&self) -> &[usize] {
        &self.dims[..self.len]
    }
}

/// One tensor entry of the batch: its key, and its parts not yet checked against
/// each other.
pub(super) struct Entry<'a> {
    pub(super) key: &'a str,
    pub(super) dtype: DType,
    pub(super) shape: Dims,
    pub(super) data: &'a [u8],
}

/// The fields of a batch frame read here.
pub(super) struct CanonicalBatch<'a> {
    pub(super) node: usize,
    pub(super) seq: u64,
    pub(super) weights_version: u64,
    pub(super) batch_size: Dims,
    /// In the frame's order.
    pub(super) tensors: Vec<Entry<'a>>,
}

/// The batch frame in `body`, if it is laid out as the encoder writes it.
pub(super) fn read(body: &[u8]) -> Option<CanonicalBatch<'_>> {
    let mut c = Cursor::new(body);
    if c.count()? != 5 {
        return None;
    }
    c.key(b"type")?;
    c.key(b"batch")?;
    c.key(b"node")?;
    let node = usize::try_from(c.uint().ok()?).ok()?;
    c.key(b"seq")?;
    let seq = c.uint().ok()?;
    c.key(b"weights_version")?;
    let weights_version = c.uint().ok()?;
    c.key(b"data")?;
    if c.count()? != 2 {
        return None;
    }
    c.key(b"batch_size")?;
    let batch_size = c.dims()?;
    c.key(b"tensors")?;
    let n = c.count()?;
    let mut tensors = Vec::with_capacity(n.min(MAX_RESERVE));
    for _ in 0..n {
        let key = std::str::from_utf8(c.text()?).ok()?;
        if c.count()? != 3 {
            return None;
        }
        c.key(b"dtype")?;
        let dtype = match c.text()? {
            b"f32" => DType::F32,
            b"f64" => DType::F64,
            b"i64" => DType::I64,
            b"bool" => DType::Bool,
            b"u8" => DType::U8,
            _ => return None,
        };
        c.key(b"shape")?;
        let shape = c.dims()?;
        c.key(b"data")?;
        let data = c.bin().ok()?;
        tensors.push(Entry {
            key,
            dtype,
            shape,
            data,
        });
    }
    // Bytes after the frame's map: the mirror decides what they mean.
    if !c.is_empty() {
        return None;
    }
    Some(CanonicalBatch {
        node,
        seq,
        weights_version,
        batch_size,
        tensors,
    })
}

/// The reads of this layout, on the shared cursor; any refusal is `None`.
trait CanonicalReads<'a> {
    fn key(&mut self, name: &[u8]) -> Option<()>;
    fn text(&mut self) -> Option<&'a [u8]>;
    fn count(&mut self) -> Option<usize>;
    fn dims(&mut self) -> Option<Dims>;
}

impl<'a> CanonicalReads<'a> for Cursor<'a> {
    /// The string `name`, or nothing.
    fn key(&mut self, name: &[u8]) -> Option<()> {
        (self.text()? == name).then_some(())
    }

    fn text(&mut self) -> Option<&'a [u8]> {
        self.str_bytes(u64::MAX).ok()
    }

    /// A map's number of entries.
    fn count(&mut self) -> Option<usize> {
        usize::try_from(self.map_len().ok()?).ok()
    }

    /// An array of unsigned integers, each a `usize`, at most [`MAX_DIMS`] of them.
    fn dims(&mut self) -> Option<Dims> {
        let len = usize::try_from(self.array_len().ok()?).ok()?;
        if len > MAX_DIMS {
            return None;
        }
        let mut d = Dims {
            len,
            dims: [0; MAX_DIMS],
        };
        for slot in &mut d.dims[..len] {
            *slot = usize::try_from(self.uint().ok()?).ok()?;
        }
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_taken_past_the_end_whatever_length_a_header_claims() {
        // A bin claiming 4 GiB with three bytes behind it.
        assert!(Cursor::new(&[0xc6, 0xff, 0xff, 0xff, 0xff, 1, 2, 3]).bin().is_err());
        // A str8 of 5 with 5 bytes: taken whole, nothing left.
        let mut c = Cursor::new(b"\xd9\x05hello");
        assert_eq!(c.text(), Some(&b"hello"[..]));
        assert!(c.is_empty());
        // A 9-dimension shape is left to the mirror.
        let mut nine = vec![0x99];
        nine.extend([1u8; 9]);
        assert!(Cursor::new(&nine).dims().is_none());
        assert_eq!(
            Cursor::new(&[0x92, 0xcd, 1, 0, 3])
                .dims()
                .map(|d| d.as_slice().to_vec()),
            Some(vec![256, 3])
        );
        // A negative dimension or a float is no dimension.
        assert!(Cursor::new(&[0x91, 0xff]).dims().is_none());
        assert!(Cursor::new(&[0x91, 0xca, 0, 0, 0, 0]).dims().is_none());
    }
}
