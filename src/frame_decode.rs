//! Decoding a frame with the memory its tensors go to given explicitly.
//!
//! A batch or a weight update is mostly tensor bytes, and where those land decides
//! what the decode costs (see [`crate::pool`]). Two kinds of memory can be handed
//! to a decode: tensors a [`crate::frame_reader::FrameReader`] already read off
//! the stream into storage of their own, and a [`TensorPool`]'s storage of
//! finished tensors.
//!
//! serde's derived decoding of the frames cannot be handed either: a `Deserialize`
//! impl sees no context, and the frames, internally tagged enums, are decoded
//! through serde's own buffer on the way to their tensors. So the two frames that
//! carry tensors in bulk, `batch` and `update_weights`, are decoded in two steps:
//! first a mirror of the frame with the same serde shape (derived, so it accepts
//! and refuses exactly what the frame's own decoding does) whose tensors stay
//! their encoded parts, borrowed from the body; then the tensors are built from
//! those parts into the memory given, checked as their own decoding checks them.
//! Any other frame is decoded by [`wire::decode`] as it is, into fresh memory.
//!
//! Why the result is exactly [`wire::decode`]'s: the mirror is used only when the
//! frame's first key is its `type`, as a string (then serde's tag and the mirror's
//! variant are the same); a tensor whose blob came empty takes the next tensor read
//! aside only if that one has its dtype and element count, so a peer sending such a
//! tensor itself leaves a tensor without data, and the decode fails, as the frame's
//! own decoding fails on it.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::message::{Batch, FromNode, ToNode, UpdateWeights};
use crate::policy::Weights;
use crate::pool::TensorPool;
use crate::tensor::{Elements, EncodedTensor, RawTensorDict, Tensor, TensorDict, TensorError};
use crate::wire::{self, NodeFrame, TrainerFrame, WireError};

/// A frame type whose tensors can be decoded into memory given to the decode.
///
/// Decoding one builds each tensor once, in the order of the bytes, and never
/// drops a tensor's error to try something else (no untagged enums, no flattening
/// around tensors): what lets the tensors a `FrameReader` read aside be handed to
/// the tensors whose blob came empty, in order. Sealed: the wire's two frame types.
pub trait Frame: DeserializeOwned + sealed::Sealed {}

impl Frame for NodeFrame {}
impl Frame for TrainerFrame {}

mod sealed {
    use std::collections::VecDeque;

    use super::{Elements, TensorPool, WireError};

    /// Where the tensors of one decode find their memory (in here, so that it is
    /// part of no public interface).
    pub struct Storage<'a> {
        /// Tensors a `FrameReader` read into storage of their own, in the frame's
        /// order: each holds the data of the next tensor whose blob came empty.
        pub(super) read: VecDeque<Elements>,
        /// Storage for the others.
        pub(super) pool: &'a mut TensorPool,
    }

    /// Only the frame types this module mirrors.
    pub trait Sealed: Sized {
        /// Decodes `body`, the tensors of a batch or weight update taking their
        /// memory from `storage`.
        fn decode_into(body: &[u8], storage: &mut Storage<'_>) -> Result<Self, WireError>;
    }
}

use sealed::Storage;

/// [`wire::decode`], writing the tensors of a batch or a weight update into storage
/// from `pool` where it has storage of their dtype and length: into memory already
/// mapped instead of fresh pages. The same frame as [`wire::decode`], or its error.
pub fn decode_pooled<T: Frame>(body: &[u8], pool: &mut TensorPool) -> Result<T, WireError> {
    decode_read(body, VecDeque::new(), pool)
}

/// [`decode_pooled`] of a frame body whose tensors in `read` were read aside (each
/// left an empty blob in `body`, in this order); what no tensor takes goes to `pool`.
pub(crate) fn decode_read<T: Frame>(
    body: &[u8],
    read: VecDeque<Elements>,
    pool: &mut TensorPool,
) -> Result<T, WireError> {
    let mut storage = Storage { read, pool };
    let frame = T::decode_into(body, &mut storage);
    let Storage { read, pool } = storage;
    pool.end_decode();
    for e in read {
        pool.put_elements(e);
    }
    frame
}

impl Storage<'_> {
    /// The tensor of `e`: the next tensor read aside if its blob came empty and that
    /// one has its dtype and element count, else decoded into pooled (or fresh) storage.
    fn tensor(&mut self, e: EncodedTensor<'_>) -> Result<Tensor, TensorError> {
        let elems = e.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        let read_aside = e.data.is_empty()
            && self
                .read
                .front()
                .is_some_and(|r| r.dtype() == e.dtype && Some(r.len()) == elems);
        if read_aside {
            if let Some(r) = self.read.pop_front() {
                return r.into_tensor(&e.shape);
            }
        }
        Tensor::from_le_bytes_into(e.dtype, &e.shape, &e.data, |dtype, n| self.pool.take(dtype, n))
    }

    /// The entries' tensors, in order, as a map (a later entry replaces an earlier
    /// one of the same key, as decoding a map does).
    fn tensors(&mut self, entries: Entries<EncodedTensor<'_>>) -> Result<BTreeMap<String, Tensor>, TensorError> {
        let mut out = BTreeMap::new();
        for (key, e) in entries.0 {
            let t = self.tensor(e)?;
            out.insert(key, t);
        }
        Ok(out)
    }

    fn dict(&mut self, raw: RawTensorDict<Entries<EncodedTensor<'_>>>) -> Result<TensorDict, TensorError> {
        let tensors = self.tensors(raw.tensors)?;
        TensorDict::decoded(raw.batch_size, tensors)
    }
}

/// A map's entries in the order they came, read as a `BTreeMap<String, V>` reads
/// them (the order tells which tensor read aside belongs to which).
struct Entries<V>(Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Entries<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EntriesVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for EntriesVisitor<V> {
            type Value = Entries<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries<V>, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(1024));
                while let Some(entry) = map.next_entry::<String, V>()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(EntriesVisitor(PhantomData))
    }
}

// The mirrors: the serde shape of the frame, tensors left as their parts. Each
// renamed to what it mirrors, so that an error reads as the frame's own would.

/// [`NodeFrame`], as far as a `batch` goes.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", rename = "NodeFrame")]
enum NodeMirror<'a> {
    Batch(#[serde(borrow)] BatchMirror<'a>),
}

/// [`Batch`].
#[derive(Deserialize)]
#[serde(rename = "Batch")]
struct BatchMirror<'a> {
    node: usize,
    seq: u64,
    weights_version: u64,
    #[serde(borrow)]
    data: RawTensorDict<Entries<EncodedTensor<'a>>>,
}

/// [`TrainerFrame`], as far as an `update_weights` goes.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", rename = "TrainerFrame")]
enum TrainerMirror<'a> {
    UpdateWeights(#[serde(borrow)] UpdateMirror<'a>),
}

/// [`UpdateWeights`].
#[derive(Deserialize)]
#[serde(rename = "UpdateWeights")]
struct UpdateMirror<'a> {
    #[serde(borrow)]
    weights: WeightsMirror<'a>,
}

/// [`Weights`].
#[derive(Deserialize)]
#[serde(rename = "Weights")]
struct WeightsMirror<'a> {
    version: u64,
    #[serde(borrow)]
    tensors: Entries<EncodedTensor<'a>>,
}

impl sealed::Sealed for NodeFrame {
    fn decode_into(body: &[u8], storage: &mut Storage<'_>) -> Result<NodeFrame, WireError> {
        if first_type(body) != Some(b"batch") {
            return wire::decode(body);
        }
        let NodeMirror::Batch(b) = mirror(body)?;
        Ok(NodeFrame::Message(FromNode::Batch(Batch {
            node: b.node,
            seq: b.seq,
            weights_version: b.weights_version,
            data: storage.dict(b.data).map_err(tensor_error)?,
        })))
    }
}

impl sealed::Sealed for TrainerFrame {
    fn decode_into(body: &[u8], storage: &mut Storage<'_>) -> Result<TrainerFrame, WireError> {
        if first_type(body) != Some(b"update_weights") {
            return wire::decode(body);
        }
        let TrainerMirror::UpdateWeights(u) = mirror(body)?;
        let tensors = storage.tensors(u.weights.tensors).map_err(tensor_error)?;
        Ok(TrainerFrame::Message(ToNode::UpdateWeights(UpdateWeights {
            weights: std::sync::Arc::new(Weights {
                version: u.weights.version,
                tensors,
            }),
        })))
    }
}

/// Decodes a mirror of the frame in `body`, borrowing its blobs.
fn mirror<'de, M: Deserialize<'de>>(body: &'de [u8]) -> Result<M, WireError> {
    rmp_serde::from_slice(body).map_err(|e| WireError::Decode(e.to_string()))
}

/// A tensor that does not decode, as the frame's own decoding reports it.
fn tensor_error(e: TensorError) -> WireError {
    WireError::Decode(e.to_string())
}

/// The frame's `type` if it is its first key, a string, as the encoder writes it
/// (and a `FrameReader` reads tensors aside only then). Only then is the mirror
/// used: a `type` elsewhere, or given as a variant's index, is left to the frame's
/// own decoding, which reads those too.
fn first_type(body: &[u8]) -> Option<&[u8]> {
    let (&marker, rest) = body.split_first()?;
    let (entries, rest) = match marker {
        0x80..=0x8f => (usize::from(marker & 0x0f), rest),
        0xde => be_len(rest, 2)?,
        0xdf => be_len(rest, 4)?,
        _ => return None,
    };
    if entries == 0 {
        return None;
    }
    let (key, rest) = str_at(rest)?;
    if key != b"type" {
        return None;
    }
    str_at(rest).map(|(value, _)| value)
}

/// The MessagePack string at the start of `b`, and what follows it.
fn str_at(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (&marker, rest) = b.split_first()?;
    let (len, rest) = match marker {
        0xa0..=0xbf => (usize::from(marker & 0x1f), rest),
        0xd9 => be_len(rest, 1)?,
        0xda => be_len(rest, 2)?,
        0xdb => be_len(rest, 4)?,
        _ => return None,
    };
    Some((rest.get(..len)?, rest.get(len..)?))
}

/// The big-endian length of `n` bytes at the start of `b`, and what follows it.
fn be_len(b: &[u8], n: usize) -> Option<(usize, &[u8])> {
    let (len, rest) = (b.get(..n)?, b.get(n..)?);
    Some((len.iter().fold(0usize, |acc, &x| (acc << 8) | usize::from(x)), rest))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ndarray::{ArrayD, IxDyn};
    use serde::Serialize;

    use super::*;
    use crate::wire::{decode, encode, DEFAULT_MAX_FRAME, PREFIX_LEN};

    fn batch() -> Batch {
        let f = |shape: &[usize]| {
            let n = shape.iter().product();
            Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(|i| i as f32 * 0.25).collect()).unwrap())
        };
        let data = TensorDict::from_entries(
            &[2, 3],
            [
                ("observation".to_string(), f(&[2, 3, 4])),
                (
                    "action".to_string(),
                    Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![0, 1, 1, 0, 1, -1]).unwrap()),
                ),
                (
                    "next.done".to_string(),
                    Tensor::Bool(
                        ArrayD::from_shape_vec(IxDyn(&[2, 3, 1]), vec![false, false, true, false, true, false])
                            .unwrap(),
                    ),
                ),
            ],
        )
        .unwrap();
        Batch {
            node: 1,
            seq: 9,
            weights_version: 3,
            data,
        }
    }

    fn update() -> TrainerFrame {
        let tensors = [
            ("w".to_string(), Tensor::F64(ArrayD::from_elem(IxDyn(&[4, 2]), 0.5))),
            ("b".to_string(), Tensor::U8(ArrayD::from_elem(IxDyn(&[2]), 7))),
        ];
        TrainerFrame::Message(ToNode::UpdateWeights(UpdateWeights {
            weights: Arc::new(Weights::new(tensors.into_iter().collect()).with_version(4)),
        }))
    }

    fn body<T: Serialize>(frame: &T) -> Vec<u8> {
        encode(frame, DEFAULT_MAX_FRAME).unwrap()[PREFIX_LEN..].to_vec()
    }

    fn storage(t: &Tensor) -> *const u8 {
        match t {
            Tensor::F32(a) => a.as_ptr().cast(),
            Tensor::F64(a) => a.as_ptr().cast(),
            Tensor::I64(a) => a.as_ptr().cast(),
            Tensor::Bool(a) => a.as_ptr().cast(),
            Tensor::U8(a) => a.as_ptr(),
        }
    }

    #[test]
    fn a_pooled_decode_writes_into_recycled_storage_and_decodes_the_same() {
        let b = batch();
        let body = body(&NodeFrame::Message(FromNode::Batch(b.clone())));
        // A batch the consumer is done with, of the same layout: every tensor has a slot.
        let NodeFrame::Message(FromNode::Batch(old)) = decode::<NodeFrame>(&body).unwrap() else {
            panic!("a batch")
        };
        let slots: Vec<*const u8> = old.data.iter().map(|(_, t)| storage(t)).collect();
        let mut pool = TensorPool::new(1 << 20);
        pool.put_dict(old.data);
        assert_eq!(pool.len(), 3);
        let got = decode_pooled::<NodeFrame>(&body, &mut pool).unwrap();
        assert_eq!(
            got,
            NodeFrame::Message(FromNode::Batch(b.clone())),
            "same frame as a plain decode"
        );
        let NodeFrame::Message(FromNode::Batch(got)) = got else {
            panic!("a batch")
        };
        let used: Vec<*const u8> = got.data.iter().map(|(_, t)| storage(t)).collect();
        assert_eq!(used, slots, "every tensor decoded into the recycled storage");
        assert!(pool.is_empty());
        // A frame that does not decode takes nothing it keeps, and the pool goes on serving.
        pool.put_dict(got.data);
        assert!(decode_pooled::<NodeFrame>(&body[..body.len() - 1], &mut pool).is_err());
        let again = decode_pooled::<NodeFrame>(&body, &mut pool).unwrap();
        assert_eq!(again, NodeFrame::Message(FromNode::Batch(b)));
    }

    #[test]
    fn a_pooled_weight_update_lands_in_retired_weights() {
        let frame = update();
        let body = body(&frame);
        let TrainerFrame::Message(ToNode::UpdateWeights(old)) = decode::<TrainerFrame>(&body).unwrap() else {
            panic!("an update")
        };
        let old = Arc::try_unwrap(old.weights).unwrap();
        let slots: Vec<*const u8> = old.tensors.values().map(storage).collect();
        let mut pool = TensorPool::new(1 << 20);
        pool.put_weights(old);
        let got = decode_pooled::<TrainerFrame>(&body, &mut pool).unwrap();
        assert_eq!(got, frame);
        let TrainerFrame::Message(ToNode::UpdateWeights(u)) = got else {
            panic!("an update")
        };
        let used: Vec<*const u8> = u.weights.tensors.values().map(storage).collect();
        assert_eq!(used, slots);
        assert!(pool.is_empty());
    }

    /// A batch frame written by hand: `type` where `type_at` says, as `tag`.
    fn hand_batch<Tag: Serialize>(tag: Tag, type_first: bool) -> Vec<u8> {
        #[derive(Serialize)]
        struct Rest {
            node: usize,
            seq: u64,
            weights_version: u64,
            data: TensorDict,
        }
        #[derive(Serialize)]
        struct First<T> {
            r#type: T,
            #[serde(flatten)]
            rest: Rest,
        }
        #[derive(Serialize)]
        struct Last<T> {
            #[serde(flatten)]
            rest: Rest,
            r#type: T,
        }
        let b = batch();
        let rest = Rest {
            node: b.node,
            seq: b.seq,
            weights_version: b.weights_version,
            data: b.data,
        };
        if type_first {
            rmp_serde::to_vec_named(&First { r#type: tag, rest }).unwrap()
        } else {
            rmp_serde::to_vec_named(&Last { rest, r#type: tag }).unwrap()
        }
    }

    #[test]
    fn frames_the_mirror_does_not_read_decode_as_the_plain_decoder_does() {
        assert_eq!(
            hand_batch("batch", true),
            body(&NodeFrame::Message(FromNode::Batch(batch())))
        );
        let mut pool = TensorPool::new(1 << 20);
        pool.put_dict(batch().data);
        for body in [
            hand_batch("batch", false),
            // A variant index in place of the name (serde's derive once took it; the
            // wire's frames take names only): refused alike.
            hand_batch(4u8, true),
            hand_batch(0u8, true),
            body(&NodeFrame::Heartbeat),
            body(&update()),
        ] {
            let plain = decode::<NodeFrame>(&body);
            let pooled = decode_pooled::<NodeFrame>(&body, &mut pool);
            assert_eq!(plain, pooled, "{body:x?}");
        }
        assert!(decode::<NodeFrame>(&hand_batch(4u8, true)).is_err());
        assert!(decode::<NodeFrame>(&hand_batch(0u8, true)).is_err());
    }

    #[test]
    fn a_batch_the_mirror_refuses_reads_as_the_frame_would_refuse_it() {
        let good = hand_batch("batch", true);
        let mut pool = TensorPool::new(1 << 20);
        // Cut anywhere: the same error, word for word.
        for end in (1..good.len()).step_by(7) {
            let body = &good[..end];
            assert_eq!(
                decode_pooled::<NodeFrame>(body, &mut pool),
                decode::<NodeFrame>(body),
                "{end}"
            );
        }
        // A bool byte that is not 0 or 1, a key that is no dotted path, a field missing.
        let bad_bool = {
            let mut b = good.clone();
            let done = b.windows(9).position(|w| w == b"next.done").unwrap();
            let blob = done + b[done..].windows(2).position(|w| w == [0xc4, 6]).unwrap() + 2;
            b[blob] = 2;
            b
        };
        let bad_key = {
            let mut b = good.clone();
            let at = b.windows(9).position(|w| w == b"next.done").unwrap();
            b[at + 4] = b'.';
            b[at + 5] = b'.';
            b
        };
        let missing = {
            let mut b = good.clone();
            let at = b.windows(3).position(|w| w == b"seq").unwrap();
            b[at] = b'x';
            b
        };
        for body in [bad_bool, bad_key, missing] {
            let plain = decode::<NodeFrame>(&body);
            assert!(plain.is_err());
            assert_eq!(decode_pooled::<NodeFrame>(&body, &mut pool), plain);
        }
    }

    #[test]
    fn the_type_is_read_only_as_a_first_string_key() {
        assert_eq!(
            first_type(&body(&NodeFrame::Message(FromNode::Batch(batch())))),
            Some(&b"batch"[..])
        );
        assert_eq!(first_type(&body(&update())), Some(&b"update_weights"[..]));
        assert_eq!(first_type(&hand_batch("batch", false)), None);
        assert_eq!(first_type(&hand_batch(4u8, true)), None);
        for cut in [
            &[][..],
            &[0x80],
            &[0x81],
            &[0x81, 0xa4, b't', b'y'],
            &[0xde, 0, 0, 0xa4],
        ] {
            assert_eq!(first_type(cut), None, "{cut:x?}");
        }
        // Every string width.
        let mut long = vec![0xdf, 0, 0, 0, 1, 0xd9, 4];
        long.extend_from_slice(b"type");
        long.extend_from_slice(&[0xdb, 0, 0, 0, 5]);
        long.extend_from_slice(b"batch");
        assert_eq!(first_type(&long), Some(&b"batch"[..]));
    }
}
