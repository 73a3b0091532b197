//! Decoding a frame with the memory its tensors go to given explicitly.
//!
//! A batch or a weight update is mostly tensor bytes, and where those land decides
//! what the decode costs (see [`crate::pool`]). Two kinds of memory can be handed
//! to a decode: tensors a [`crate::frame_reader::FrameReader`] already read off
//! the stream into storage of their own, and a [`TensorPool`]'s storage of
//! finished tensors (a recycled batch among them: a batch of its layout is written
//! into its memory, keys and all). The decoder is the wire's one (`wire/read.rs`):
//! [`wire::decode`] is the same decode given no memory.

use std::collections::VecDeque;

pub use crate::wire::Frame;

use crate::pool::TensorPool;
use crate::tensor::Elements;
use crate::wire::{self, Storage, WireError};

/// [`wire::decode`], writing the tensors of the frame into storage from `pool`
/// where it has storage of their dtype and length (or a recycled batch of the
/// frame's layout): into memory already mapped instead of fresh pages. The same
/// frame as [`wire::decode`], or its error.
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
    let frame = wire::decode_into(body, &mut storage);
    let Storage { read, pool } = storage;
    pool.end_decode();
    for e in read {
        pool.put_elements(e);
    }
    frame
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ndarray::{ArrayD, IxDyn};
    use serde::Serialize;

    use super::*;
    use crate::message::{Batch, FromNode, ToNode, UpdateWeights};
    use crate::policy::Weights;
    use crate::tensor::{Tensor, TensorDict};
    use crate::wire::{decode, encode, NodeFrame, TrainerFrame, DEFAULT_MAX_FRAME, PREFIX_LEN};

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
    fn a_type_after_the_fields_decodes_the_same() {
        assert_eq!(
            hand_batch("batch", true),
            body(&NodeFrame::Message(FromNode::Batch(batch())))
        );
        let want = NodeFrame::Message(FromNode::Batch(batch()));
        assert_eq!(same_answer::<NodeFrame>(&hand_batch("batch", false)), Ok(want));
        // A `type` that is no string (a variant's index, as serde's derive once took
        // it) is refused wherever it is, and so is none at all.
        for body in [hand_batch(4u8, true), hand_batch(0u8, false)] {
            let err = same_answer::<NodeFrame>(&body).unwrap_err();
            assert!(
                matches!(&err, WireError::Decode(m) if m.contains("`type` must be a string")),
                "{err}"
            );
        }
        let none = edit(&hand_batch("batch", true), |e| {
            e.remove(0);
        });
        assert_eq!(
            same_answer::<NodeFrame>(&none),
            Err(WireError::Decode("missing field `type`".into()))
        );
        // Frames of the other direction, or of no direction, are refused by name.
        assert_eq!(
            same_answer::<NodeFrame>(&body(&update())),
            Err(WireError::Decode("unknown frame type `update_weights`".into()))
        );
    }

    #[test]
    fn a_batch_refused_is_refused_alike_into_pooled_storage() {
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

    /// The same answer from the plain decode and the pooled one, word for word if an error.
    fn same_answer<T: Frame + PartialEq + std::fmt::Debug>(body: &[u8]) -> Result<T, WireError> {
        let plain = decode::<T>(body);
        let mut pool = TensorPool::new(1 << 20);
        assert_eq!(decode_pooled::<T>(body, &mut pool), plain, "pooled, {body:x?}");
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
            }),
            // The tensors' fields in another order.
            edit(&good, |e| first_tensor(e).reverse()),
            // The dict's fields in another order.
            edit(&good, |e| map(at(e, "data")).reverse()),
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
    fn a_value_of_the_wrong_form_is_refused() {
        let good = hand_batch("batch", true);
        // Each value in its one form: a shape is an array, a dtype its name, a key a string.
        let bodies = [
            edit(&good, |e| {
                *at(first_tensor(e), "shape") = rmpv::Value::Binary(vec![2, 3])
            }),
            edit(&good, |e| {
                *at(map(at(e, "data")), "batch_size") = rmpv::Value::Binary(vec![2, 3])
            }),
            edit(&good, |e| *at(first_tensor(e), "dtype") = 2.into()),
            edit(&good, |e| *at(first_tensor(e), "dtype") = "f16".into()),
            edit(&good, |e| {
                *at(first_tensor(e), "data") = rmpv::Value::Array(vec![1.into()])
            }),
            edit(&good, |e| *at(e, "data") = rmpv::Value::Binary(vec![0x92, 0x90, 0x80])),
            edit(&good, |e| *at(e, "node") = "1".into()),
            edit(&good, |e| *at(e, "seq") = (-1).into()),
            edit(&good, |e| *at(e, "weights_version") = 1.5.into()),
            edit(&good, |e| e[1].0 = true.into()),
            edit(&good, |e| e[1].0 = 0.into()),
        ];
        for body in bodies {
            assert!(same_answer::<NodeFrame>(&body).is_err(), "{body:x?}");
        }
        let err = same_answer::<NodeFrame>(&edit(&good, |e| *at(first_tensor(e), "dtype") = "f16".into()));
        assert!(
            matches!(&err, Err(WireError::Decode(m)) if m.contains("`data`: `tensors`: `action`: `dtype`: unknown dtype `f16`")),
            "{err:?}"
        );
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
    fn a_frame_cut_anywhere_is_refused() {
        for end in 0..hand_batch("batch", true).len() {
            assert!(
                same_answer::<NodeFrame>(&hand_batch("batch", true)[..end]).is_err(),
                "{end}"
            );
        }
        let update = body(&update());
        for end in 0..update.len() {
            assert!(same_answer::<TrainerFrame>(&update[..end]).is_err(), "{end}");
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

        /// Random batches, in their keys, dtypes, shapes and ids: what the encoder
        /// writes decodes to an equal frame, plain or pooled (into a recycled batch of
        /// its layout too), and is refused once cut.
        #[test]
        fn random_batches_decode_to_what_was_encoded(
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
            proptest::prop_assert_eq!(same_answer::<NodeFrame>(&body), Ok(frame.clone()));
            let mut pool = TensorPool::new(1 << 20);
            if let NodeFrame::Message(FromNode::Batch(b)) = &frame {
                pool.put_dict(b.data.clone());
            }
            proptest::prop_assert_eq!(decode_pooled::<NodeFrame>(&body, &mut pool), Ok(frame));
            let end = ((body.len() - 1) as f64 * cut) as usize;
            proptest::prop_assert!(same_answer::<NodeFrame>(&body[..end]).is_err());
        }
    }

    #[test]
    fn mutated_frames_are_refused_or_read_alike_into_any_memory() {
        use rand::{Rng, SeedableRng};
        let good = hand_batch("batch", true);
        let update = body(&update());
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut read = 0;
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
            if round % 2 == 0 {
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
                read += usize::from(plain.is_ok());
            } else {
                let plain = enc_t(decode(&b));
                assert_eq!(enc_t(decode_pooled(&b, &mut pool)), plain, "{b:x?}");
                read += usize::from(plain.is_ok());
            }
        }
        assert!(read > 100, "{read} mutated frames read");
    }

    // A batch sent with each observation once (`wire/ends.rs`), through both receive paths.
    use crate::frame_reader::FrameReader;
    use crate::wire::ends_tests::{batch as obs_batch, compact_body, decoded};
    use crate::wire::BatchFrame;

    #[test]
    fn a_compact_batch_lands_in_the_storage_of_a_recycled_one() {
        let b = obs_batch(2, 5, &[8], &[(0, 1)]);
        let body = compact_body(&b);
        let old = decoded(&body).unwrap();
        let ptr = |t: &Tensor| t.le_bytes_in_place().unwrap().as_ptr();
        let slots: Vec<*const u8> = old.data.iter().map(|(_, t)| ptr(t)).collect();
        let mut pool = TensorPool::new(1 << 20);
        pool.put_dict(old.data);
        let NodeFrame::Message(FromNode::Batch(got)) = decode_pooled::<NodeFrame>(&body, &mut pool).unwrap() else {
            panic!("a batch")
        };
        assert_eq!(got, b);
        let used: Vec<*const u8> = got.data.iter().map(|(_, t)| ptr(t)).collect();
        assert_eq!(
            used, slots,
            "every tensor, the rebuilt `next.` ones too, in the recycled storage"
        );
    }

    #[test]
    fn a_compact_batch_read_off_a_stream_in_pieces_is_the_batch() {
        // Pixels large enough to be read aside into their own storage.
        let b = obs_batch(2, 40, &[32, 32, 3], &[(1, 7)]);
        let mut stream = encode(&BatchFrame::new(&b), usize::MAX).unwrap();
        stream.extend(encode(&BatchFrame::new(&b), usize::MAX).unwrap());
        for chunk in [3, 4096, usize::MAX] {
            let mut r = FrameReader::new(usize::MAX);
            let mut pool = TensorPool::new(usize::MAX);
            let mut pos = 0;
            let mut got = vec![];
            while pos < stream.len() {
                let buf = r.buf();
                let n = buf.len().min(chunk).min(stream.len() - pos);
                buf[..n].copy_from_slice(&stream[pos..pos + n]);
                pos += n;
                if r.filled(n, &mut pool).unwrap() {
                    let NodeFrame::Message(FromNode::Batch(x)) = r.decode::<NodeFrame>(&mut pool).unwrap() else {
                        panic!("a batch")
                    };
                    got.push(x.clone());
                    pool.put_dict(x.data);
                }
            }
            assert_eq!(got, vec![b.clone(), b.clone()], "pieces of {chunk}");
        }
    }
}
