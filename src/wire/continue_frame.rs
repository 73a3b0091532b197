//! The `continue` frame, encoded by hand: the trainer sends one per node per round,
//! and it is a constant map but for two integers, so its bytes are the constant
//! parts around those integers in MessagePack's shortest form — the very bytes
//! [`super::encode`] gives for `ToNode::Continue`, without serde's walk over it.

use super::{WireError, PREFIX_LEN};
use crate::message::Continue;

/// The map's header, its `type` entry and the key `seq`.
const HEAD: &[u8] = b"\x83\xa4type\xa8continue\xa3seq";
/// The key `frames`.
const FRAMES: &[u8] = b"\xa6frames";

/// The whole `continue` frame for `c` (prefix and body), as
/// `encode(&ToNode::Continue(c), max)` encodes it.
pub fn encode_continue(c: &Continue, max: usize) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(PREFIX_LEN + HEAD.len() + FRAMES.len() + 18);
    out.extend_from_slice(&[0; PREFIX_LEN]);
    out.extend_from_slice(HEAD);
    push_uint(&mut out, c.seq);
    out.extend_from_slice(FRAMES);
    // usize is at most 64 bits on every target this builds for.
    push_uint(&mut out, c.frames as u64);
    let len = out.len() - PREFIX_LEN;
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    // At most a few dozen bytes: the cast cannot truncate.
    out[..PREFIX_LEN].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(out)
}

/// `v` as MessagePack's shortest unsigned integer (as rmp-serde writes it).
fn push_uint(out: &mut Vec<u8>, v: u64) {
    match v {
        0..=0x7f => out.push(v as u8),
        0x80..=0xff => out.extend_from_slice(&[0xcc, v as u8]),
        0x100..=0xffff => {
            out.push(0xcd);
            out.extend_from_slice(&(v as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(0xce);
            out.extend_from_slice(&(v as u32).to_be_bytes());
        }
        _ => {
            out.push(0xcf);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToNode;
    use crate::wire::{encode, DEFAULT_MAX_FRAME};

    #[test]
    fn the_bytes_are_serdes_for_every_integer_width() {
        let edges = [
            0u64,
            1,
            0x7f,
            0x80,
            0xff,
            0x100,
            0xffff,
            0x1_0000,
            0xffff_ffff,
            0x1_0000_0000,
            u64::MAX,
        ];
        for &seq in &edges {
            for &frames in &edges {
                let c = Continue {
                    seq,
                    frames: frames as usize,
                };
                let want = encode(&ToNode::Continue(c), DEFAULT_MAX_FRAME).unwrap();
                assert_eq!(
                    encode_continue(&c, DEFAULT_MAX_FRAME).unwrap(),
                    want,
                    "seq {seq}, frames {frames}"
                );
            }
        }
    }

    #[test]
    fn a_maximum_below_the_frame_refuses_it() {
        let c = Continue { seq: 1, frames: 10 };
        assert!(matches!(
            encode_continue(&c, 4),
            Err(WireError::TooLarge { max: 4, .. })
        ));
    }
}
