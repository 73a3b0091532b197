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
//! first a mirror of the frame with the same fields whose tensors stay their
//! encoded parts, borrowed from the body; then the tensors are built from those
//! parts into the memory given, checked as their own decoding checks them. Any
//! other frame is decoded by [`wire::decode`] as it is, into fresh memory.
//!
//! The mirror's top is read by hand: the `type` first, checked to name the variant,
//! then the variant's fields straight off the decoder as they come (a field twice,
//! missing, or a key unknown, as a derived struct takes them). A derived internally
//! tagged enum would first copy the whole map into serde's buffer (`Content`, a
//! tree of allocated nodes) to find its tag anywhere in it; the mirror is used only
//! when the tag comes first, so nothing needs buffering, and that copy was most of
//! the decode of a small batch. Below the top the mirror's types are derived and
//! read through `strict::Strict`, which accepts exactly what serde's buffer, out
//! of which the frame's own decoding reads the same fields, accepts.
//!
//! Why the result is exactly [`wire::decode`]'s: the mirror is used only when the
//! frame's first key is its `type`, as a string (then serde's tag and the mirror's
//! variant are the same); it accepts what the frame's decoding accepts (above); a
//! tensor whose blob came empty takes the next tensor read aside only if that one
//! has its dtype and element count, so a peer sending such a tensor itself leaves
//! a tensor without data, and the decode fails, as the frame's own decoding fails
//! on it. A frame the mirror refuses is decoded again by [`wire::decode`] for its
//! error: without the buffer, which of two faults shows first can differ (the
//! buffer finds any fault of the MessagePack before any of meaning), and so can
//! some words (the decoder names a string where a number belongs "wrong msgpack
//! marker", or a string that is no UTF-8 by that, where the buffer hands on what it
//! holds and the field's own error names it). Refusals are rare and end the
//! connection; the second decode costs only then.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use strict::StrictSeed;

use crate::message::{Batch, FromNode, ToNode, UpdateWeights};
use crate::policy::Weights;
use crate::pool::TensorPool;
use crate::tensor::{Elements, EncodedTensor, RawTensorDict, Tensor, TensorDict, TensorError};
use crate::wire::cursor::Cursor;
use crate::wire::{self, NodeFrame, TrainerFrame, WireError};

mod canonical;
mod strict;

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
        /// The `type` of the frame the mirror reads (a batch, a weight update).
        const MIRRORED: &'static [u8];
        /// Decodes `body`, a frame whose first key is `type`, [`Self::MIRRORED`], through
        /// the mirror, its tensors taking their memory from `storage`.
        fn mirror_into(body: &[u8], storage: &mut Storage<'_>) -> Result<Self, WireError>;
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
    let whole = read.is_empty();
    let mut storage = Storage { read, pool };
    let frame = if first_type(body) == Some(T::MIRRORED) {
        match T::mirror_into(body, &mut storage) {
            // Which of two faults a frame reports first can differ: the frame's own
            // decoding buffers the frame (so any fault of its MessagePack comes first)
            // and checks each tensor as it reads it, the mirror after all the fields.
            // A frame refused is refused alike, so its error is the frame's own, when
            // `body` is the whole frame (else its blobs read aside are missing in it).
            Err(_) if whole => wire::decode(body),
            r => r,
        }
    } else {
        wire::decode(body)
    };
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

    /// The batch read by [`canonical::read`], its tensors built and checked as
    /// [`Self::dict`] builds them (in the frame's order, a later key replacing an
    /// earlier one), each into pooled storage.
    fn canonical_batch(&mut self, b: canonical::CanonicalBatch<'_>) -> Result<Batch, TensorError> {
        if let Some(td) = self.pool.take_dict() {
            match refill(td, &b) {
                Ok(data) => {
                    return Ok(Batch {
                        node: b.node,
                        seq: b.seq,
                        weights_version: b.weights_version,
                        data,
                    })
                }
                Err(td) => self.pool.put_tensors(td),
            }
        }
        let mut tensors = BTreeMap::new();
        for e in b.tensors {
            let t =
                Tensor::from_le_bytes_into(e.dtype, e.shape.as_slice(), e.data, |dtype, n| self.pool.take(dtype, n))?;
            tensors.insert(e.key.to_string(), t);
        }
        Ok(Batch {
            node: b.node,
            seq: b.seq,
            weights_version: b.weights_version,
            data: TensorDict::decoded(b.batch_size.as_slice().to_vec(), tensors)?,
        })
    }
}

/// `td`, a recycled batch, holding the batch `b` instead, if `b` has its layout:
/// its batch shape, and its keys in order (so none twice), dtypes and shapes, each
/// blob exactly the length its tensor needs (bool bytes 0 or 1). Then only elements
/// are written, and the dict is the one a decode would build (it was valid with
/// these keys and shapes). Else `td` back, to be pooled; its elements are scratch.
fn refill(mut td: TensorDict, b: &canonical::CanonicalBatch<'_>) -> Result<TensorDict, TensorDict> {
    let same = td.batch_size() == b.batch_size.as_slice()
        && td.len() == b.tensors.len()
        && td.iter_mut().zip(&b.tensors).all(|((key, t), e)| {
            key == e.key && t.dtype() == e.dtype && t.shape() == e.shape.as_slice() && t.refill_from_le(e.data)
        })
        // A consumer's dict may have been reshaped in place (`get_mut`): then it is
        // not what a decode would build.
        && td.validate().is_ok();
    if same {
        Ok(td)
    } else {
        Err(td)
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

// The mirrors: the fields of the frame, tensors left as their parts. Each read by
// hand at the top (the `type` first, then the fields as they come), and below that
// as derived, through [`Strict`], so that a value is refused as the frame's own
// decoding, which reads it out of serde's buffer, refuses it.

/// The key naming a frame's type.
const TAG: &str = "type";

/// [`NodeFrame`], as far as a `batch` goes.
enum NodeMirror<'a> {
    /// The only variant mirrored.
    Batch(BatchMirror<'a>),
}

/// [`Batch`]: its fields in the order [`BATCH_FIELDS`] names them.
struct BatchMirror<'a> {
    node: usize,
    seq: u64,
    weights_version: u64,
    data: RawTensorDict<Entries<EncodedTensor<'a>>>,
}

/// The fields of [`Batch`], in their order there (a derived decoding also takes a
/// field's index for its name).
const BATCH_FIELDS: &[&str] = &["node", "seq", "weights_version", "data"];

/// [`TrainerFrame`], as far as an `update_weights` goes.
enum TrainerMirror<'a> {
    /// The only variant mirrored.
    UpdateWeights(UpdateMirror<'a>),
}

/// [`UpdateWeights`].
struct UpdateMirror<'a> {
    weights: WeightsMirror<'a>,
}

/// The fields of [`UpdateWeights`].
const UPDATE_FIELDS: &[&str] = &["weights"];

/// [`Weights`].
#[derive(Deserialize)]
#[serde(rename = "Weights")]
struct WeightsMirror<'a> {
    version: u64,
    #[serde(borrow)]
    tensors: Entries<EncodedTensor<'a>>,
}

impl<'de> Deserialize<'de> for NodeMirror<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(MirrorVisitor(PhantomData))
    }
}

impl<'de> Deserialize<'de> for TrainerMirror<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(MirrorVisitor(PhantomData))
    }
}

/// A mirrored frame: its one variant, read field by field.
trait Mirror<'de>: Sized {
    /// The frame type's name, for errors.
    const EXPECTING: &'static str;
    /// The variant's `type` (alone in a list, as an error names the variants).
    const VARIANT: &'static [&'static str];
    /// The variant's fields, in their declared order.
    const FIELDS: &'static [&'static str];
    /// The variant, its fields read off `map` after its `type`.
    fn fields<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error>;
}

impl<'de> Mirror<'de> for NodeMirror<'de> {
    const EXPECTING: &'static str = "internally tagged enum NodeFrame";
    const VARIANT: &'static [&'static str] = &["batch"];
    const FIELDS: &'static [&'static str] = BATCH_FIELDS;

    fn fields<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let (mut node, mut seq, mut weights_version, mut data) = (None, None, None, None);
        while let Some(key) = map.next_key_seed(StrictSeed(KeySeed(BATCH_FIELDS)))? {
            match key {
                Key::Tag => return Err(de::Error::duplicate_field(TAG)),
                Key::Field(0) => field(&mut map, &mut node, "node")?,
                Key::Field(1) => field(&mut map, &mut seq, "seq")?,
                Key::Field(2) => field(&mut map, &mut weights_version, "weights_version")?,
                Key::Field(_) => field(&mut map, &mut data, "data")?,
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(NodeMirror::Batch(BatchMirror {
            node: node.ok_or_else(|| de::Error::missing_field("node"))?,
            seq: seq.ok_or_else(|| de::Error::missing_field("seq"))?,
            weights_version: weights_version.ok_or_else(|| de::Error::missing_field("weights_version"))?,
            data: data.ok_or_else(|| de::Error::missing_field("data"))?,
        }))
    }
}

impl<'de> Mirror<'de> for TrainerMirror<'de> {
    const EXPECTING: &'static str = "internally tagged enum TrainerFrame";
    const VARIANT: &'static [&'static str] = &["update_weights"];
    const FIELDS: &'static [&'static str] = UPDATE_FIELDS;

    fn fields<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut weights = None;
        while let Some(key) = map.next_key_seed(StrictSeed(KeySeed(UPDATE_FIELDS)))? {
            match key {
                Key::Tag => return Err(de::Error::duplicate_field(TAG)),
                Key::Field(_) => field(&mut map, &mut weights, "weights")?,
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(TrainerMirror::UpdateWeights(UpdateMirror {
            weights: weights.ok_or_else(|| de::Error::missing_field("weights"))?,
        }))
    }
}

/// Reads the next value into `slot`, refused as a derived struct refuses a field
/// given twice.
fn field<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    map: &mut A,
    slot: &mut Option<T>,
    name: &'static str,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(map.next_value_seed(StrictSeed(PhantomData))?);
    Ok(())
}

/// Reads a mirrored frame's map: the `type` first (the mirror is used only when it
/// comes first, as a string), then the variant's fields straight off the decoder,
/// nothing buffered.
struct MirrorVisitor<M>(PhantomData<M>);

impl<'de, M: Mirror<'de>> Visitor<'de> for MirrorVisitor<M> {
    type Value = M;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(M::EXPECTING)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<M, A::Error> {
        match map.next_key_seed(StrictSeed(KeySeed(M::FIELDS)))? {
            Some(Key::Tag) => {}
            // `first_type` let only a frame whose first key is `type` here.
            _ => {
                return Err(de::Error::custom(
                    "the mirror reads only a frame whose `type` comes first",
                ))
            }
        }
        map.next_value_seed(VariantSeed(M::VARIANT))?;
        M::fields(map)
    }
}

/// A key of a mirrored frame's map, told apart as the frame's decoding does: its
/// `type` (a string or bytes; serde's buffer takes either as the tag), a field of
/// the variant (by name, or by index as a derived struct also takes it), or another
/// key, whose value is skipped.
enum Key {
    /// `type`.
    Tag,
    /// The field of this index.
    Field(usize),
    /// Not a field: skipped.
    Other,
}

/// Reads a [`Key`] among these fields.
struct KeySeed(&'static [&'static str]);

impl KeySeed {
    /// The key named `name`.
    fn named(&self, name: &[u8]) -> Key {
        if name == TAG.as_bytes() {
            return Key::Tag;
        }
        match self.0.iter().position(|f| f.as_bytes() == name) {
            Some(i) => Key::Field(i),
            None => Key::Other,
        }
    }
}

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field identifier")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
        Ok(match usize::try_from(v) {
            Ok(i) if i < self.0.len() => Key::Field(i),
            _ => Key::Other,
        })
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(self.named(v.as_bytes()))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Key, E> {
        Ok(self.named(v))
    }
}

/// Reads the `type`'s value, which must name the mirrored variant.
struct VariantSeed(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for VariantSeed {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for VariantSeed {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("variant identifier")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        if self.0.contains(&v) {
            Ok(())
        } else {
            Err(de::Error::unknown_variant(v, self.0))
        }
    }
}

impl sealed::Sealed for NodeFrame {
    const MIRRORED: &'static [u8] = b"batch";

    fn mirror_into(body: &[u8], storage: &mut Storage<'_>) -> Result<NodeFrame, WireError> {
        // A whole batch laid out as the encoder writes it (every batch of this
        // crate's nodes), read without serde; any other, and one with tensors read
        // aside, through the mirror below.
        if storage.read.is_empty() {
            if let Some(b) = canonical::read(body) {
                let batch = storage.canonical_batch(b).map_err(tensor_error)?;
                return Ok(NodeFrame::Message(FromNode::Batch(batch)));
            }
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
    const MIRRORED: &'static [u8] = b"update_weights";

    fn mirror_into(body: &[u8], storage: &mut Storage<'_>) -> Result<TrainerFrame, WireError> {
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
    let mut c = Cursor::new(body);
    if c.map_len().ok()? == 0 || c.str_bytes(u64::MAX).ok()? != b"type" {
        return None;
    }
    c.str_bytes(u64::MAX).ok()
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

    /// The mirror alone, without the plain decode it falls back on for an error.
    fn mirrored<T: Frame>(body: &[u8]) -> Result<T, WireError> {
        assert_eq!(first_type(body), Some(T::MIRRORED), "a frame the mirror reads");
        let mut pool = TensorPool::new(1 << 20);
        T::mirror_into(
            body,
            &mut Storage {
                read: VecDeque::new(),
                pool: &mut pool,
            },
        )
    }

    /// The same answer from the plain decode, the pooled one and the mirror alone,
    /// word for word if an error.
    fn same_answer<T: Frame + PartialEq + fmt::Debug>(body: &[u8]) -> Result<T, WireError> {
        let plain = decode::<T>(body);
        let mut pool = TensorPool::new(1 << 20);
        assert_eq!(decode_pooled::<T>(body, &mut pool), plain, "pooled, {body:x?}");
        assert_eq!(mirrored::<T>(body), plain, "the mirror alone, {body:x?}");
        plain
    }

    /// The entries of a frame's map.
    type Entries = Vec<(rmpv::Value, rmpv::Value)>;

    /// `body` with the entries of its map changed by `f`, encoded again.
    fn edit(body: &[u8], f: impl FnOnce(&mut Entries)) -> Vec<u8> {
        let mut v = rmpv::decode::read_value(&mut &body[..]).unwrap();
        let rmpv::Value::Map(entries) = &mut v else {
            panic!("a map")
        };
        f(entries);
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &v).unwrap();
        out
    }

    /// The value under `key` in `entries`.
    fn at<'v>(entries: &'v mut Entries, key: &str) -> &'v mut rmpv::Value {
        entries
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
            .unwrap()
    }

    /// The entries of a map value.
    fn map(v: &mut rmpv::Value) -> &mut Entries {
        match v {
            rmpv::Value::Map(m) => m,
            other => panic!("not a map: {other}"),
        }
    }

    /// The batch frame's first tensor (`action`: `[[0, 1, 1], [0, 1, -1]]`, i64).
    fn first_tensor(entries: &mut Entries) -> &mut Entries {
        let tensors = map(at(map(at(entries, "data")), "tensors"));
        map(&mut tensors[0].1)
    }

    #[test]
    fn the_fields_after_the_type_are_read_in_any_order_and_unknown_keys_skipped() {
        let good = hand_batch("batch", true);
        let want = NodeFrame::Message(FromNode::Batch(batch()));
        let variants = [
            // data before node, seq last.
            edit(&good, |e| {
                let ty = e.remove(0);
                e.reverse();
                e.insert(0, ty);
            }),
            // Keys nobody reads, before and after the fields, with values of every kind.
            edit(&good, |e| {
                e.insert(
                    1,
                    ("extra".into(), rmpv::Value::Map(vec![(1.into(), vec![1u8, 2].into())])),
                );
                e.push((
                    "zzz".into(),
                    rmpv::Value::Array(vec![rmpv::Value::Nil, (-3).into(), 1.5.into()]),
                ));
                e.push((rmpv::Value::Binary(b"more".to_vec()), "x".into()));
                e.push((7.into(), true.into()));
            }),
            // A field named by its index (a derived struct takes that too), or as bytes.
            edit(&good, |e| {
                e[1].0 = 0.into();
                e[2].0 = rmpv::Value::Binary(b"seq".to_vec());
            }),
            // The tensors' fields by index, and in another order.
            edit(&good, |e| {
                let t = first_tensor(e);
                t.reverse();
                for (k, _) in t.iter_mut() {
                    *k = match k.as_str() {
                        Some("dtype") => 0,
                        Some("shape") => 1,
                        _ => 2,
                    }
                    .into();
                }
            }),
            // A dtype as an enum's map of one key (to nil, or to an empty map).
            edit(&good, |e| {
                *at(first_tensor(e), "dtype") = rmpv::Value::Map(vec![("i64".into(), rmpv::Value::Nil)]);
            }),
            edit(&good, |e| {
                *at(first_tensor(e), "dtype") = rmpv::Value::Map(vec![("i64".into(), rmpv::Value::Map(vec![]))]);
            }),
            // The dict and a tensor as arrays of their fields.
            edit(&good, |e| {
                let d = at(e, "data");
                let fields = map(d).drain(..).map(|(_, v)| v).collect();
                *d = rmpv::Value::Array(fields);
            }),
            edit(&good, |e| {
                let tensors = map(at(map(at(e, "data")), "tensors"));
                let t = &mut tensors[0].1;
                let fields = map(t).drain(..).map(|(_, v)| v).collect();
                *t = rmpv::Value::Array(fields);
            }),
        ];
        for body in variants {
            assert_ne!(body, good);
            assert_eq!(same_answer::<NodeFrame>(&body), Ok(want.clone()), "{body:x?}");
        }
    }

    #[test]
    fn a_field_given_twice_is_refused_as_the_frame_refuses_it() {
        let good = hand_batch("batch", true);
        for (key, value) in [
            ("seq", rmpv::Value::from(5)),
            ("node", 1.into()),
            ("weights_version", 3.into()),
            ("type", "batch".into()),
            ("type", "heartbeat".into()),
        ] {
            let body = edit(&good, |e| e.push((key.into(), value)));
            let err = same_answer::<NodeFrame>(&body).unwrap_err();
            assert_eq!(err, WireError::Decode(format!("duplicate field `{key}`")));
        }
        let data_twice = edit(&good, |e| {
            let d = e[4].clone();
            e.insert(2, d);
        });
        assert_eq!(
            same_answer::<NodeFrame>(&data_twice),
            Err(WireError::Decode("duplicate field `data`".into()))
        );
        let update = body(&update());
        let twice = edit(&update, |e| {
            let w = e[1].clone();
            e.push(w);
        });
        assert_eq!(
            same_answer::<TrainerFrame>(&twice),
            Err(WireError::Decode("duplicate field `weights`".into()))
        );
        let missing = edit(&update, |e| e[1].0 = "weight".into());
        assert_eq!(
            same_answer::<TrainerFrame>(&missing),
            Err(WireError::Decode("missing field `weights`".into()))
        );
    }

    #[test]
    fn values_serde_s_buffer_refuses_the_mirror_refuses() {
        let good = hand_batch("batch", true);
        // The decoder alone reads a blob as an array of its bytes, an integer as the
        // enum variant of that index, a two-byte integer key as a field's index: the
        // frame's decoding, which reads its fields out of serde's buffer, does not.
        let bodies = [
            edit(&good, |e| {
                *at(first_tensor(e), "shape") = rmpv::Value::Binary(vec![2, 3])
            }),
            edit(&good, |e| {
                *at(map(at(e, "data")), "batch_size") = rmpv::Value::Binary(vec![2, 3])
            }),
            edit(&good, |e| *at(first_tensor(e), "dtype") = 2.into()),
            edit(&good, |e| *at(first_tensor(e), "dtype") = rmpv::Value::Map(vec![])),
            edit(&good, |e| *at(e, "data") = rmpv::Value::Binary(vec![0x92, 0x90, 0x80])),
            edit(&good, |e| *at(e, "node") = "1".into()),
            edit(&good, |e| *at(e, "seq") = (-1).into()),
            edit(&good, |e| *at(e, "weights_version") = 1.5.into()),
            edit(&good, |e| e[1].0 = true.into()),
            edit(&good, |e| e[1].0 = (-1).into()),
            {
                // The tensor's `dtype` key as 0 in two bytes.
                let b = edit(&good, |e| first_tensor(e)[0].0 = "\u{1}".into());
                let at = b.windows(2).position(|w| w == [0xa1, 1]).unwrap();
                [&b[..at], &[0xcd, 0, 0], &b[at + 2..]].concat()
            },
        ];
        for body in bodies {
            assert!(decode::<NodeFrame>(&body).is_err(), "{body:x?}");
            let mut pool = TensorPool::new(1 << 20);
            assert_eq!(decode_pooled::<NodeFrame>(&body, &mut pool), decode::<NodeFrame>(&body));
            assert!(
                mirrored::<NodeFrame>(&body).is_err(),
                "the mirror alone refuses {body:x?}"
            );
        }
    }

    #[test]
    fn a_batch_of_the_recycled_batch_s_layout_is_written_into_its_memory() {
        let mut pool = TensorPool::new(1 << 20);
        let first = body(&NodeFrame::Message(FromNode::Batch(batch())));
        let Ok(NodeFrame::Message(FromNode::Batch(b1))) = decode_pooled::<NodeFrame>(&first, &mut pool) else {
            panic!("a batch");
        };
        let memory: Vec<*const u8> = b1.data.iter().map(|(_, t)| storage(t)).collect();
        let keys: Vec<*const u8> = b1.data.keys().map(str::as_ptr).collect();
        pool.put_dict(b1.data);
        // The next batch: same layout, other values and ids.
        let mut next = batch();
        next.seq = 10;
        for (_, t) in next.data.iter_mut() {
            if let Tensor::F32(a) = t {
                a.mapv_inplace(|x| x + 1.0);
            }
        }
        let want = NodeFrame::Message(FromNode::Batch(next.clone()));
        let got = decode_pooled::<NodeFrame>(&body(&want), &mut pool).expect("decodes");
        assert_eq!(got, want);
        let NodeFrame::Message(FromNode::Batch(b2)) = got else {
            panic!("a batch")
        };
        let again: Vec<*const u8> = b2.data.iter().map(|(_, t)| storage(t)).collect();
        assert_eq!(again, memory, "every tensor written into the recycled one");
        let again_keys: Vec<*const u8> = b2.data.keys().map(str::as_ptr).collect();
        assert_eq!(again_keys, keys, "the recycled batch itself: its keys too, none built");
        assert!(pool.is_empty(), "the recycled batch was taken whole");
        // Another layout: decoded anew, the recycled batch's storage pooled.
        pool.put_dict(b2.data);
        let mut other = batch();
        other.data.remove("action");
        let want = NodeFrame::Message(FromNode::Batch(other));
        assert_eq!(decode_pooled::<NodeFrame>(&body(&want), &mut pool), Ok(want));
    }

    #[test]
    fn the_mirror_alone_refuses_a_frame_cut_anywhere_in_the_frame_s_words() {
        for good in [hand_batch("batch", true), body(&update())] {
            for end in 1..good.len() {
                let body = &good[..end];
                if first_type(body).is_none() {
                    continue;
                }
                let plain = if first_type(&good) == Some(b"batch") {
                    same_answer::<NodeFrame>(body).map(|_| ())
                } else {
                    same_answer::<TrainerFrame>(body).map(|_| ())
                };
                assert!(plain.is_err(), "{end}");
            }
        }
    }

    /// A batch of `keys` (name, dtype, feature shape) with batch shape `batch_size`.
    fn random_batch(batch_size: &[usize], keys: &[(String, u8, Vec<usize>)], ids: (usize, u64, u64)) -> Batch {
        let lead: usize = batch_size.iter().product();
        let entries = keys.iter().map(|(name, dtype, feature)| {
            let shape: Vec<usize> = batch_size.iter().chain(feature).copied().collect();
            let n = lead * feature.iter().product::<usize>();
            let t = match dtype % 5 {
                0 => Tensor::F32(
                    ArrayD::from_shape_vec(IxDyn(&shape), (0..n).map(|i| i as f32 * 0.5).collect()).unwrap(),
                ),
                1 => Tensor::F64(ArrayD::from_elem(IxDyn(&shape), -0.5)),
                2 => Tensor::I64(ArrayD::from_shape_vec(IxDyn(&shape), (0..n as i64).collect()).unwrap()),
                3 => Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&shape), (0..n).map(|i| i % 3 == 0).collect()).unwrap()),
                _ => Tensor::U8(ArrayD::from_shape_vec(IxDyn(&shape), (0..n).map(|i| i as u8).collect()).unwrap()),
            };
            (name.clone(), t)
        });
        Batch {
            node: ids.0,
            seq: ids.1,
            weights_version: ids.2,
            data: TensorDict::from_entries(batch_size, entries).unwrap(),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

        /// Random batches, in their keys, dtypes, shapes and ids: the pooled decode and
        /// the mirror alone give the plain decode's frame, and its error once cut.
        #[test]
        fn random_batches_decode_as_the_plain_decoder_does(
            batch_size in proptest::collection::vec(0usize..4, 0..3),
            keys in proptest::collection::btree_map(
                "[a-z]{1,6}(\\.[a-z]{1,4})?",
                (0u8..5, proptest::collection::vec(1usize..4, 0..3)),
                0..12,
            ),
            ids in (0usize..300, proptest::prelude::any::<u64>(), proptest::prelude::any::<u64>()),
            cut in 0.0f64..1.0,
        ) {
            let keys: Vec<_> = keys.into_iter().map(|(k, (d, f))| (k, d, f)).collect();
            let b = random_batch(&batch_size, &keys, ids);
            let frame = NodeFrame::Message(FromNode::Batch(b));
            let body = body(&frame);
            proptest::prop_assert!(canonical::read(&body).is_some(), "the encoder's layout is read without serde");
            proptest::prop_assert_eq!(same_answer::<NodeFrame>(&body), Ok(frame));
            let end = 1 + ((body.len() - 1) as f64 * cut) as usize;
            if end < body.len() && first_type(&body[..end]).is_some() {
                proptest::prop_assert!(same_answer::<NodeFrame>(&body[..end]).is_err());
            }
        }
    }

    #[test]
    fn mutated_batches_are_refused_or_read_alike() {
        use rand::{Rng, SeedableRng};
        let good = hand_batch("batch", true);
        let update = body(&update());
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let (mut read, mut canonical_read) = (0, 0);
        for round in 0..4000 {
            let mut b = if round % 2 == 0 { good.clone() } else { update.clone() };
            for _ in 0..rng.random_range(1..3) {
                let i = rng.random_range(6..b.len());
                match rng.random_range(0..4) {
                    0 => b[i] ^= 1 << rng.random_range(0..8),
                    1 => b[i] = rng.random(),
                    2 => {
                        let v: u8 = rng.random();
                        b.insert(i, v);
                    }
                    _ => {
                        b.remove(i);
                    }
                }
            }
            // Compared by their encodings: a flipped float may be a NaN.
            let enc = |r: Result<_, WireError>| r.map(|f: NodeFrame| encode(&f, usize::MAX).unwrap());
            let enc_t = |r: Result<_, WireError>| r.map(|f: TrainerFrame| encode(&f, usize::MAX).unwrap());
            let mut pool = TensorPool::new(1 << 20);
            match first_type(&b) {
                Some(b"batch") => {
                    // The mirror alone below reads these without serde.
                    canonical_read += usize::from(canonical::read(&b).is_some());
                    let plain = enc(decode(&b));
                    assert_eq!(enc(decode_pooled(&b, &mut pool)), plain, "{b:x?}");
                    // Into the good batch, recycled: its memory overwritten when the
                    // mutated frame has its layout, else decoded anew; alike either way.
                    let mut primed = TensorPool::new(1 << 20);
                    primed.put_dict(batch().data);
                    assert_eq!(
                        enc(decode_pooled(&b, &mut primed)),
                        plain,
                        "into a recycled batch, {b:x?}"
                    );
                    let alone = enc(mirrored(&b));
                    assert_eq!(alone.is_ok(), plain.is_ok(), "{b:x?}: {alone:?} {plain:?}");
                    if plain.is_ok() {
                        assert_eq!(alone, plain);
                        read += 1;
                    }
                }
                Some(b"update_weights") => {
                    let plain = enc_t(decode(&b));
                    assert_eq!(enc_t(decode_pooled(&b, &mut pool)), plain, "{b:x?}");
                    let alone = enc_t(mirrored(&b));
                    assert_eq!(alone.is_ok(), plain.is_ok(), "{b:x?}: {alone:?} {plain:?}");
                    if plain.is_ok() {
                        assert_eq!(alone, plain);
                        read += 1;
                    }
                }
                _ => {}
            }
        }
        assert!(read > 100, "{read} mutated frames read");
        assert!(
            canonical_read > 100,
            "{canonical_read} mutated batches read without serde"
        );
    }
}
