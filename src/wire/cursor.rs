//! The one MessagePack reader of the crate: [`header`] reads the header of one value
//! (what the [`FrameReader`](crate::frame_reader::FrameReader) follows as bytes come
//! in), and a [`Cursor`] reads the values of a whole body (every frame's decoder:
//! `login.rs` for the frames before `welcome`, `read.rs` for the rest). What it reads
//! is borrowed from the body; every length comes from the body and is checked against
//! the bytes left before anything is taken.

/// One MessagePack header, as far as a reader needs it.
#[derive(Debug)]
pub(crate) enum Token {
    /// A non-negative integer.
    Uint(u64),
    /// A string of this many bytes.
    Str(usize),
    /// A binary blob of this many bytes.
    Bin(usize),
    /// An extension of this many payload bytes (its type byte is in the header).
    Ext(usize),
    /// An array of this many values.
    Array(u64),
    /// A map of this many entries.
    Map(u64),
    /// A value of no payload of interest (nil, bool, float, negative integer).
    Scalar,
    /// Not MessagePack (0xc1).
    Invalid,
}

/// The header at the start of `b` and its length (a scalar's bytes included), or
/// `None` if `b` holds less than the header.
pub(crate) fn header(b: &[u8]) -> Option<(usize, Token)> {
    let m = *b.first()?;
    let be = |n: usize| -> Option<u64> {
        let s = b.get(1..1 + n)?;
        Some(s.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    };
    let len = |n: usize| be(n).map(|v| v as usize);
    let (h, tok) = match m {
        0x00..=0x7f => (1, Token::Uint(u64::from(m))),
        0x80..=0x8f => (1, Token::Map(u64::from(m & 0x0f))),
        0x90..=0x9f => (1, Token::Array(u64::from(m & 0x0f))),
        0xa0..=0xbf => (1, Token::Str(usize::from(m & 0x1f))),
        0xc0 | 0xc2 | 0xc3 => (1, Token::Scalar),
        0xc1 => (1, Token::Invalid),
        0xc4 => (2, Token::Bin(len(1)?)),
        0xc5 => (3, Token::Bin(len(2)?)),
        0xc6 => (5, Token::Bin(len(4)?)),
        0xc7 => (3, Token::Ext(len(1)?)),
        0xc8 => (4, Token::Ext(len(2)?)),
        0xc9 => (6, Token::Ext(len(4)?)),
        0xca => (5, Token::Scalar),
        0xcb => (9, Token::Scalar),
        0xcc => (2, Token::Uint(be(1)?)),
        0xcd => (3, Token::Uint(be(2)?)),
        0xce => (5, Token::Uint(be(4)?)),
        0xcf => (9, Token::Uint(be(8)?)),
        0xd0 => (2, Token::Scalar),
        0xd1 => (3, Token::Scalar),
        0xd2 => (5, Token::Scalar),
        0xd3 => (9, Token::Scalar),
        0xd4 => (2, Token::Ext(1)),
        0xd5 => (2, Token::Ext(2)),
        0xd6 => (2, Token::Ext(4)),
        0xd7 => (2, Token::Ext(8)),
        0xd8 => (2, Token::Ext(16)),
        0xd9 => (2, Token::Str(len(1)?)),
        0xda => (3, Token::Str(len(2)?)),
        0xdb => (5, Token::Str(len(4)?)),
        0xdc => (3, Token::Array(be(2)?)),
        0xdd => (5, Token::Array(be(4)?)),
        0xde => (3, Token::Map(be(2)?)),
        0xdf => (5, Token::Map(be(4)?)),
        0xe0..=0xff => (1, Token::Scalar),
    };
    (b.len() >= h).then_some((h, tok))
}

/// What is left of a body.
#[derive(Clone, Copy)]
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor { buf, pos: 0 }
    }

    /// The whole body, read or not.
    pub(crate) fn whole(&self) -> &'a [u8] {
        self.buf
    }

    /// Bytes not read yet.
    pub(crate) fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Everything was read.
    pub(crate) fn is_empty(&self) -> bool {
        self.left() == 0
    }

    /// The next byte, not taken.
    pub(crate) fn peek(&self) -> Result<u8, String> {
        self.buf
            .get(self.pos)
            .copied()
            .ok_or_else(|| "frame cut short".to_string())
    }

    pub(crate) fn byte(&mut self) -> Result<u8, String> {
        let b = self.peek()?;
        self.pos += 1;
        Ok(b)
    }

    /// The next `n` bytes, if there are that many.
    pub(crate) fn take(&mut self, n: u64) -> Result<&'a [u8], String> {
        if n > self.left() as u64 {
            return Err("frame cut short".into());
        }
        let (start, buf) = (self.pos, self.buf);
        self.pos += n as usize;
        Ok(&buf[start..self.pos])
    }

    /// A big-endian unsigned integer of `n` bytes (1, 2, 4 or 8).
    pub(crate) fn be(&mut self, n: u64) -> Result<u64, String> {
        Ok(self.take(n)?.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    /// A frame's map: its number of entries.
    pub(crate) fn frame_len(&mut self) -> Result<u64, String> {
        match self.peek()? {
            0x80..=0x8f | 0xde | 0xdf => self.map_len(),
            _ => Err("a frame must be a map".into()),
        }
    }

    /// A map's number of entries.
    pub(crate) fn map_len(&mut self) -> Result<u64, String> {
        match self.byte()? {
            m @ 0x80..=0x8f => Ok(u64::from(m & 0x0f)),
            0xde => self.be(2),
            0xdf => self.be(4),
            _ => Err("expected a map".into()),
        }
    }

    pub(crate) fn array_len(&mut self) -> Result<u64, String> {
        match self.byte()? {
            m @ 0x90..=0x9f => Ok(u64::from(m & 0x0f)),
            0xdc => self.be(2),
            0xdd => self.be(4),
            _ => Err("expected an array".into()),
        }
    }

    /// A `str`'s bytes (not checked as UTF-8), at most `max` of them.
    pub(crate) fn str_bytes(&mut self, max: u64) -> Result<&'a [u8], String> {
        let len = match self.byte()? {
            m @ 0xa0..=0xbf => u64::from(m & 0x1f),
            0xd9 => self.be(1)?,
            0xda => self.be(2)?,
            0xdb => self.be(4)?,
            _ => return Err("expected a string".into()),
        };
        if len > max {
            return Err(format!("a string of {len} bytes (at most {max})"));
        }
        self.take(len)
    }

    pub(crate) fn bin(&mut self) -> Result<&'a [u8], String> {
        let len = match self.byte()? {
            0xc4 => self.be(1)?,
            0xc5 => self.be(2)?,
            0xc6 => self.be(4)?,
            _ => return Err("expected bin".into()),
        };
        self.take(len)
    }

    /// A non-negative integer in any MessagePack integer form.
    pub(crate) fn uint(&mut self) -> Result<u64, String> {
        let negative = || Err("expected a non-negative integer".to_string());
        match self.byte()? {
            b @ 0x00..=0x7f => Ok(u64::from(b)),
            0xcc => self.be(1),
            0xcd => self.be(2),
            0xce => self.be(4),
            0xcf => self.be(8),
            m @ 0xd0..=0xd3 => {
                let n = 1u64 << (m - 0xd0);
                let raw = self.be(n)?;
                let bits = 8 * n as u32;
                // Sign bit of an `n`-byte two's complement integer.
                if raw >> (bits - 1) & 1 == 1 {
                    negative()
                } else {
                    Ok(raw)
                }
            }
            0xe0..=0xff => negative(),
            _ => Err("expected an integer".into()),
        }
    }

    /// Skips one value, nested ones included, without building it: a count of the
    /// values still to skip, not recursion, so no nesting depth costs stack.
    pub(crate) fn skip_value(&mut self) -> Result<(), String> {
        let mut pending: u64 = 1;
        while pending > 0 {
            pending -= 1;
            let (h, tok) = header(&self.buf[self.pos..]).ok_or("frame cut short")?;
            let (skip, more) = match tok {
                Token::Uint(_) | Token::Scalar => (0, 0),
                Token::Str(n) | Token::Bin(n) | Token::Ext(n) => (n as u64, 0),
                Token::Array(n) => (0, n),
                Token::Map(n) => (0, 2 * n),
                Token::Invalid => return Err(format!("invalid MessagePack marker 0x{:02x}", self.buf[self.pos])),
            };
            self.pos += h;
            self.take(skip)?;
            // Every value takes at least one byte: more than the bytes left is a lie.
            pending += more;
            if pending > self.left() as u64 {
                return Err("frame cut short".into());
            }
        }
        Ok(())
    }

    /// The bytes of the next value, whole (skipped, not built).
    pub(crate) fn value_bytes(&mut self) -> Result<&'a [u8], String> {
        let start = self.pos;
        self.skip_value()?;
        Ok(&self.buf[start..self.pos])
    }

    /// The next value is `nil`: taken if so.
    pub(crate) fn nil(&mut self) -> Result<bool, String> {
        let nil = self.peek()? == 0xc0;
        if nil {
            self.pos += 1;
        }
        Ok(nil)
    }

    /// A `str`, valid UTF-8, borrowed.
    pub(crate) fn text(&mut self) -> Result<&'a str, String> {
        std::str::from_utf8(self.str_bytes(u64::MAX)?).map_err(|_| "a string that is not UTF-8".into())
    }
}
