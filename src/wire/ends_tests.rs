use ndarray::{ArrayD, IxDyn};

use super::*;
use crate::message::FromNode;
use crate::tensor::DType;
use crate::wire::{decode, encode, NodeFrame, PREFIX_LEN};

/// An env's observation at its `n`-th state: every byte differs from its neighbours'.
fn pixels_of(n: u64, feature: &[usize]) -> Vec<u8> {
    let len: usize = feature.iter().product();
    (0..len as u64)
        .map(|i| (n.wrapping_mul(31).wrapping_add(i * 7) % 251) as u8)
        .collect()
}

/// A batch of `lanes` envs × `steps` frames as a rollout writes it: `next.*` is the
/// next frame's observation but where the env's episode ends (`ends`, lane and step),
/// after which the env is reset to a state of its own. Pixels (u8) and a state (f32)
/// under an observation dict, and the keys every batch has.
pub(crate) fn batch(lanes: usize, steps: usize, feature: &[usize], ends: &[(usize, usize)]) -> Batch {
    let frames = lanes * steps;
    let (mut px, mut next_px, mut st, mut next_st, mut done) = (vec![], vec![], vec![], vec![], vec![]);
    for lane in 0..lanes {
        // Each env's states are numbered apart from every other env's.
        let mut state = 1_000_000 * lane as u64;
        for step in 0..steps {
            px.extend(pixels_of(state, feature));
            st.extend([state as f32, -(state as f32)]);
            let ended = ends.contains(&(lane, step));
            // The state after the step; after an end the env is reset elsewhere.
            let after = state + 1;
            next_px.extend(pixels_of(after, feature));
            next_st.extend([after as f32, -(after as f32)]);
            done.push(ended);
            state = if ended { after + 500_000 } else { after };
        }
    }
    let shape = |f: &[usize]| [lanes, steps].iter().chain(f).copied().collect::<Vec<_>>();
    let data = TensorDict::from_entries(
        &[lanes, steps],
        [
            (
                "observation.pixels",
                Tensor::U8(ArrayD::from_shape_vec(IxDyn(&shape(feature)), px).unwrap()),
            ),
            (
                "next.observation.pixels",
                Tensor::U8(ArrayD::from_shape_vec(IxDyn(&shape(feature)), next_px).unwrap()),
            ),
            (
                "observation.state",
                Tensor::F32(ArrayD::from_shape_vec(IxDyn(&shape(&[2])), st).unwrap()),
            ),
            (
                "next.observation.state",
                Tensor::F32(ArrayD::from_shape_vec(IxDyn(&shape(&[2])), next_st).unwrap()),
            ),
            (
                "action",
                Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[lanes, steps]), (0..frames as i64).collect()).unwrap()),
            ),
            ("next.reward", Tensor::F32(ArrayD::from_elem(IxDyn(&shape(&[1])), 1.0))),
            (
                "next.done",
                Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&shape(&[1])), done).unwrap()),
            ),
            ("logits", Tensor::F32(ArrayD::from_elem(IxDyn(&shape(&[6])), 0.5))),
            (
                "action_log_prob",
                Tensor::F32(ArrayD::from_elem(IxDyn(&[lanes, steps]), -1.5)),
            ),
        ]
        .into_iter()
        .map(|(k, t)| (k.to_string(), t)),
    )
    .unwrap();
    Batch {
        node: 2,
        seq: 11,
        weights_version: 4,
        data,
    }
}

/// `batch` with each observation sent once, however few bytes that saves.
pub(crate) fn compact(batch: &Batch) -> BatchFrame<'_> {
    BatchFrame {
        batch,
        ends: Ends::saving(&batch.data, 0),
    }
}

/// The body of `batch` with each observation sent once.
pub(crate) fn compact_body(batch: &Batch) -> Vec<u8> {
    encode(&compact(batch), usize::MAX).unwrap()[PREFIX_LEN..].to_vec()
}

pub(crate) fn decoded(body: &[u8]) -> Result<Batch, String> {
    match decode::<NodeFrame>(body) {
        Ok(NodeFrame::Message(FromNode::Batch(b))) => Ok(b),
        Ok(other) => panic!("not a batch: {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn a_batch_sent_with_its_observations_once_decodes_to_the_batch_itself() {
    let b = batch(3, 9, &[4, 5, 3], &[(0, 2), (1, 8), (2, 0), (2, 3), (2, 4)]);
    let ends = Ends::saving(&b.data, 0).expect("two observation entries");
    // Rows: the three episode ends inside envs, and each env's last frame.
    assert_eq!(ends.rows, vec![2, 8, 17, 18, 21, 22, 26]);
    assert_eq!(ends.tensors.len(), 2);
    assert_eq!(ends.tensors["next.observation.pixels"].shape(), &[7, 4, 5, 3]);
    let body = compact_body(&b);
    assert_eq!(decoded(&body).unwrap(), b);
}

#[test]
fn rows_are_where_next_differs_whatever_done_says() {
    let mut b = batch(2, 6, &[3], &[(0, 1), (1, 4)]);
    // Env 0's frame 3 is followed by a frame that is not its `next` (a node that
    // rebuilt the env, say) without `done`; env 1's `done` at 4 is a lie: its next
    // frame is where the step went. Bytes decide, and the batch comes back as it was.
    let Tensor::U8(px) = b.data.get_mut("observation.pixels").unwrap() else {
        unreachable!()
    };
    px[[0, 4, 0]] ^= 0xff;
    use ndarray::Axis;
    let next = b.data.get("next.observation.pixels").unwrap().clone();
    let Tensor::U8(obs) = b.data.get_mut("observation.pixels").unwrap() else {
        unreachable!()
    };
    let from = next.as_u8().unwrap().index_axis(Axis(0), 1);
    obs.index_axis_mut(Axis(0), 1)
        .index_axis_mut(Axis(0), 5)
        .assign(&from.index_axis(Axis(0), 4));
    let next = b.data.get("next.observation.state").unwrap().clone();
    let Tensor::F32(obs) = b.data.get_mut("observation.state").unwrap() else {
        unreachable!()
    };
    let from = next.as_f32().unwrap().index_axis(Axis(0), 1);
    obs.index_axis_mut(Axis(0), 1)
        .index_axis_mut(Axis(0), 5)
        .assign(&from.index_axis(Axis(0), 4));
    let rows = Ends::saving(&b.data, 0).unwrap().rows;
    assert!(rows.contains(&3), "env 0's frame 3 differs from its next: {rows:?}");
    assert!(!rows.contains(&10), "env 1's frame 4 does not, done or not: {rows:?}");
    assert_eq!(decoded(&compact_body(&b)).unwrap(), b);
}

#[test]
fn a_node_sends_each_observation_once_where_that_saves_16_kib_or_more() {
    // CartPole-sized: 2 envs x 50 frames of 9 bytes of observations save 882 bytes.
    let small = batch(2, 50, &[1], &[]);
    assert!(Ends::of(&small.data).is_none() && BatchFrame::new(&small).ends.is_none());
    let sent = encode(&BatchFrame::new(&small), usize::MAX).unwrap();
    assert_eq!(
        sent,
        encode(&NodeFrame::Message(FromNode::Batch(small.clone())), usize::MAX).unwrap()
    );
    // 2 x 400 frames of 20 bytes: 15,960 saved, still whole; 2 x 500: 19,960, sent once.
    assert!(Ends::of(&batch(2, 400, &[12], &[]).data).is_none());
    assert!(Ends::of(&batch(2, 500, &[12], &[]).data).is_some());
}

#[test]
fn a_pixel_frame_costs_at_most_five_percent_over_its_observation_on_the_wire() {
    // Pong at 84x84 with a stack of 4 (u8), 8 envs x 128 frames, an episode ending in
    // one env, and everything a sampling policy records.
    let feature = [4, 84, 84];
    let b = batch(8, 128, &feature, &[(3, 40)]);
    let frames = 8 * 128;
    let obs_bytes = frames * feature.iter().product::<usize>();
    let compact = compact_body(&b).len() as f64 / obs_bytes as f64;
    let full = encode(&NodeFrame::Message(FromNode::Batch(b.clone())), usize::MAX)
        .unwrap()
        .len() as f64
        / obs_bytes as f64;
    assert!(compact <= 1.05, "compact batch: {compact:.4} x its observations");
    assert!(full >= 1.95, "the full form sends each twice: {full:.4}");
}

/// The body of `b` sent with `ends` as given.
fn body_with(b: &Batch, ends: Ends) -> Vec<u8> {
    let frame = BatchFrame {
        batch: b,
        ends: Some(ends),
    };
    encode(&frame, usize::MAX).unwrap()[PREFIX_LEN..].to_vec()
}

#[test]
fn ends_that_do_not_fit_the_batch_are_refused_naming_what() {
    let b = batch(2, 4, &[3], &[(0, 1)]);
    let good = Ends::saving(&b.data, 0).unwrap();
    assert_eq!(good.rows, vec![1, 3, 7]);
    let with = |f: &dyn Fn(&mut Ends)| {
        let mut e = good.clone();
        f(&mut e);
        decoded(&body_with(&b, e)).expect_err("refused")
    };
    let refusals: Vec<(String, &str)> = vec![
        (with(&|e| e.rows = vec![3, 1, 7]), "not strictly increasing (3 then 1)"),
        (with(&|e| e.rows = vec![1, 1, 7]), "not strictly increasing (1 then 1)"),
        (with(&|e| e.rows = vec![1, 3, 8]), "holds 8, past the batch's 8 frames"),
        (with(&|e| e.rows = vec![1, 2, 7]), "lacks 3, an env's last frame"),
        (with(&|e| e.rows = vec![1, 3]), "lacks 7, an env's last frame"),
        (
            with(&|e| e.rows = vec![0, 1, 3, 7]),
            "`next.observation.pixels`: shape [3, 3], not [4, 3]",
        ),
        (
            with(&|e| {
                let t = e.tensors.remove("next.observation.state").unwrap();
                e.tensors.insert("next.observation.other".into(), t);
            }),
            "`next.observation.other` without `observation.other` in `data`",
        ),
        (
            with(&|e| {
                let t = e.tensors["next.observation.state"].clone();
                e.tensors.insert("observation.other".into(), t);
            }),
            "`observation.other` is not a `next.` key",
        ),
        (
            with(&|e| {
                let t = e.tensors["next.observation.state"].clone();
                e.tensors.insert("next.action".into(), t);
            }),
            "`next.action`: shape [3, 2], not [3]",
        ),
        (
            with(&|e| {
                e.tensors
                    .insert("next.observation.pixels".into(), Tensor::zeros(DType::F32, &[3, 3]));
            }),
            "`next.observation.pixels`: dtype f32, not the observation's u8",
        ),
    ];
    for (got, want) in refusals {
        assert!(got.contains(want), "{got:?} should say {want:?}");
        assert!(got.contains("`ends`"), "{got:?} names the field");
    }
    // `next.K` both in `data` and in `ends`.
    let twice = BatchFrame {
        batch: &b,
        ends: Some(good.clone()),
    };
    #[derive(serde::Serialize)]
    struct Raw<'a> {
        r#type: &'a str,
        node: usize,
        seq: u64,
        weights_version: u64,
        data: &'a TensorDict,
        ends: &'a Ends,
    }
    let raw = Raw {
        r#type: "batch",
        node: b.node,
        seq: b.seq,
        weights_version: b.weights_version,
        data: &b.data,
        ends: twice.ends.as_ref().unwrap(),
    };
    let body = rmp_serde::to_vec_named(&raw).unwrap();
    let e = decoded(&body).expect_err("refused");
    assert!(e.contains("`next.observation.pixels` given twice"), "{e}");
    // And a batch whose shape is not [envs, steps].
    let flat = Batch {
        data: b.data.clone().reshape(&[8]).unwrap(),
        ..b.clone()
    };
    let e = decoded(&body_with(&flat, good)).expect_err("refused");
    assert!(e.contains("a batch of shape [8], not [envs, steps]"), "{e}");
}

#[test]
fn rows_are_checked_in_time_of_the_rows_not_of_the_shape_a_peer_claims() {
    // An env count of 2^40 with three rows: refused at once, not after 2^40 steps.
    let e = Ends::check_rows(&[0, 1, 2], 1 << 40, 3).unwrap_err();
    assert!(e.contains("lacks 5"), "{e}");
    assert!(Ends::check_rows(&[], 5, 0).is_ok(), "no frames, no rows");
    assert!(Ends::check_rows(&[0], 5, 0).is_err());
    assert!(Ends::check_rows(&[0], usize::MAX, 2).unwrap_err().contains("overflows"));
}
