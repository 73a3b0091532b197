//! A cursor over one MessagePack body, for the frames read by hand: the login
//! frames (`login.rs`, from anyone who reaches the port) and a batch laid out as the
//! encoder writes it (`frame_decode/canonical.rs`, the trainer's hot path). What it
//! reads is borrowed from the body; every length comes from the body and is checked
//! against the bytes left before anything is taken.

/// What is left of a body.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor { buf, pos: 0 }
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

    pub(crate) fn map_len(&mut self) -> Result<u64, String> {
        match self.byte()? {
            m @ 0x80..=0x8f => Ok(u64::from(m & 0x0f)),
            0xde => self.be(2),
            0xdf => self.be(4),
            _ => Err("a frame must be a map".into()),
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
            let m = self.byte()?;
            let (skip, more) = match m {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
                0x80..=0x8f => (0, 2 * u64::from(m & 0x0f)),
                0x90..=0x9f => (0, u64::from(m & 0x0f)),
                0xa0..=0xbf => (u64::from(m & 0x1f), 0),
                0xc4 | 0xd9 => (self.be(1)?, 0),
                0xc5 | 0xda => (self.be(2)?, 0),
                0xc6 | 0xdb => (self.be(4)?, 0),
                0xc7 => (self.be(1)? + 1, 0),
                0xc8 => (self.be(2)? + 1, 0),
                0xc9 => (self.be(4)? + 1, 0),
                0xca => (4, 0),
                0xcb => (8, 0),
                0xcc | 0xd0 => (1, 0),
                0xcd | 0xd1 => (2, 0),
                0xce | 0xd2 => (4, 0),
                0xcf | 0xd3 => (8, 0),
                0xd4 => (2, 0),
                0xd5 => (3, 0),
                0xd6 => (5, 0),
                0xd7 => (9, 0),
                0xd8 => (17, 0),
                0xdc => (0, self.be(2)?),
                0xdd => (0, self.be(4)?),
                0xde => (0, 2 * self.be(2)?),
                0xdf => (0, 2 * self.be(4)?),
                _ => return Err(format!("invalid MessagePack marker 0x{m:02x}")),
            };
            self.take(skip)?;
            // Every value takes at least one byte: more than the bytes left is a lie.
            pending += more;
            if pending > self.left() as u64 {
                return Err("frame cut short".into());
            }
        }
        Ok(())
    }
}
