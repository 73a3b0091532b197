//! The frame codec for tokio streams: the core's framing rules on a `BytesMut`.

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use rollout::wire::{self, PREFIX_LEN};
use tokio_util::codec::{Decoder, Encoder};

/// Splits a socket's bytes into frame bodies; writes pre-encoded frames.
///
/// A prefix over the maximum is refused as soon as it is seen, before the body is
/// buffered; the stream then ends with an `InvalidData` error naming the cause.
#[derive(Clone, Copy, Debug)]
pub struct FrameCodec {
    max: usize,
}

impl FrameCodec {
    /// A codec refusing bodies over `max` bytes.
    pub fn new(max: usize) -> FrameCodec {
        FrameCodec { max }
    }
}

impl Decoder for FrameCodec {
    type Item = BytesMut;
    type Error = io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, io::Error> {
        if src.len() < PREFIX_LEN {
            return Ok(None);
        }
        let mut prefix = [0u8; PREFIX_LEN];
        prefix.copy_from_slice(&src[..PREFIX_LEN]);
        let len = wire::body_len(prefix, self.max).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if src.len() < PREFIX_LEN + len {
            src.reserve(PREFIX_LEN + len - src.len());
            return Ok(None);
        }
        src.advance(PREFIX_LEN);
        Ok(Some(src.split_to(len)))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, io::Error> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("connection closed inside a frame ({} bytes of it received)", src.len()),
            )),
        }
    }
}

impl Encoder<Bytes> for FrameCodec {
    type Error = io::Error;

    fn encode(&mut self, frame: Bytes, dst: &mut BytesMut) -> Result<(), io::Error> {
        dst.extend_from_slice(&frame);
        Ok(())
    }
}
