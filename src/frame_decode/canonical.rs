//! A `batch` frame laid out exactly as this crate's encoder writes it, read without
//! serde: the trainer reads one per node and round, and for small batches serde's
//! visitors were most of the decode's time.
//!
//! Only one layout is read: the map of five keys `type`, `node`, `seq`,
//! `weights_version`, `data` in that order; `data` a map of `batch_size` then
//! `tensors`; each tensor a map of `dtype`, `shape`, `data`; integers in their
//! unsigned forms, strings as strings, blobs as `bin`, nothing after the frame.
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
    let mut c = Cursor(body);
    if c.map_len()? != 5 {
        return None;
    }
    c.key(b"type")?;
    c.key(b"batch")?;
    c.key(b"node")?;
    let node = usize::try_from(c.uint()?).ok()?;
    c.key(b"seq")?;
    let seq = c.uint()?;
    c.key(b"weights_version")?;
    let weights_version = c.uint()?;
    c.key(b"data")?;
    if c.map_len()? != 2 {
        return None;
    }
    c.key(b"batch_size")?;
    let batch_size = c.dims()?;
    c.key(b"tensors")?;
    let n = c.map_len()?;
    let mut tensors = Vec::with_capacity(n.min(MAX_RESERVE));
    for _ in 0..n {
        let key = std::str::from_utf8(c.str()?).ok()?;
        if c.map_len()? != 3 {
            return None;
        }
        c.key(b"dtype")?;
        let dtype = match c.str()? {
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
        let data = c.bin()?;
        tensors.push(Entry {
            key,
            dtype,
            shape,
            data,
        });
    }
    // Bytes after the frame's map: the mirror decides what they mean.
    if !c.0.is_empty() {
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

/// What is left of the frame.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    /// The next `n` bytes, if there are that many.
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }

    /// A big-endian unsigned integer of `n` (at most 8) bytes.
    fn be(&mut self, n: usize) -> Option<u64> {
        Some(self.take(n)?.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// A length of `n` bytes, as a `usize`.
    fn len(&mut self, n: usize) -> Option<usize> {
        usize::try_from(self.be(n)?).ok()
    }

    fn map_len(&mut self) -> Option<usize> {
        match self.byte()? {
            m @ 0x80..=0x8f => Some(usize::from(m & 0x0f)),
            0xde => self.len(2),
            0xdf => self.len(4),
            _ => None,
        }
    }

    fn array_len(&mut self) -> Option<usize> {
        match self.byte()? {
            m @ 0x90..=0x9f => Some(usize::from(m & 0x0f)),
            0xdc => self.len(2),
            0xdd => self.len(4),
            _ => None,
        }
    }

    fn str(&mut self) -> Option<&'a [u8]> {
        let n = match self.byte()? {
            m @ 0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => self.len(1)?,
            0xda => self.len(2)?,
            0xdb => self.len(4)?,
            _ => return None,
        };
        self.take(n)
    }

    /// The string `name`, or nothing.
    fn key(&mut self, name: &[u8]) -> Option<()> {
        (self.str()? == name).then_some(())
    }

    fn uint(&mut self) -> Option<u64> {
        match self.byte()? {
            m @ 0x00..=0x7f => Some(u64::from(m)),
            0xcc => self.be(1),
            0xcd => self.be(2),
            0xce => self.be(4),
            0xcf => self.be(8),
            _ => None,
        }
    }

    fn bin(&mut self) -> Option<&'a [u8]> {
        let n = match self.byte()? {
            0xc4 => self.len(1)?,
            0xc5 => self.len(2)?,
            0xc6 => self.len(4)?,
            _ => return None,
        };
        self.take(n)
    }

    /// An array of unsigned integers, each a `usize`, at most [`MAX_DIMS`] of them.
    fn dims(&mut self) -> Option<Dims> {
        let len = self.array_len()?;
        if len > MAX_DIMS {
            return None;
        }
        let mut d = Dims {
            len,
            dims: [0; MAX_DIMS],
        };
        for slot in &mut d.dims[..len] {
            *slot = usize::try_from(self.uint()?).ok()?;
        }
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_takes_nothing_past_the_end_whatever_length_a_header_claims() {
        // A bin claiming 4 GiB with three bytes behind it.
        let mut c = Cursor(&[0xc6, 0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
        assert_eq!(c.bin(), None);
        // A str8 of 5 with 5 bytes: taken whole, nothing left.
        let mut c = Cursor(b"\xd9\x05hello");
        assert_eq!(c.str(), Some(&b"hello"[..]));
        assert!(c.0.is_empty());
        // A 9-dimension shape is left to the mirror.
        let mut nine = vec![0x99];
        nine.extend([1u8; 9]);
        assert!(Cursor(&nine).dims().is_none());
        // Signed or float integers are left to the mirror too.
        assert_eq!(Cursor(&[0xd0, 0x05]).uint(), None);
        assert_eq!(Cursor(&[0xcf, 0, 0, 0, 0, 0, 0, 1, 0]).uint(), Some(256));
    }
}
