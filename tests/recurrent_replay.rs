//! A recurrent policy's run checked frame by frame: every env's frames replayed one
//! row at a time with the model, the state carried as a single-env loop carries it.

use std::path::Path;

use rollout::policy::{ActionsMut, OnnxHead, OnnxModel, OnnxPolicy, ParamsMut, RecordMut, StateIo};
use rollout::rollout::keys;
use rollout::{ExplorationType, Policy, Spec, Tensor};

use crate::OutputRecord;

/// Tolerance between a node's numbers and the replay's (tract and onnxruntime round
/// differently; the same kernel gives the same bits).
const TOL: f32 = 1e-5;

/// The f32 values of `key` in `r`.
fn f32s(r: &OutputRecord, key: &str) -> Vec<f32> {
    match r.data.get(key) {
        Some(Tensor::F32(a)) => a.iter().copied().collect(),
        other => panic!("`{key}` is {other:?}; keys {:?}", r.data.keys().collect::<Vec<_>>()),
    }
}

/// Asserts `got` is `want` within [`TOL`].
fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= TOL, "{what}: {got:?} vs the replay's {want:?}");
    }
}

/// Replays every env's frames of a deterministic run of the categorical LSTM in
/// `model_file` on CartPole one row at a time, carrying the state from frame to frame and
/// batch to batch (zero where `is_init`), and compares each recorded frame: `is_init` is
/// the episode's first frame, the state before and after, the logits and the action are
/// the replay's. Records must be in order, at least 12 of them (11 batch boundaries),
/// each holding every env's rows (a sync run's). Returns how many episodes started inside
/// a batch (not on its first step).
pub fn assert_recurrent_replay(records: &[OutputRecord], model_file: &Path) -> usize {
    let model = OnnxModel::parse(std::fs::read(model_file).expect("model")).expect("parse");
    let state = model.declared_state().expect("state");
    assert_eq!(
        state.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["recurrent_state_h", "recurrent_state_c"]
    );
    let obs_spec = Spec::uniform_box(4, f32::NEG_INFINITY, f32::INFINITY);
    let mut p = OnnxPolicy::recurrent(
        &model,
        OnnxHead::Categorical,
        &state,
        &obs_spec,
        &Spec::Discrete { n: 2 },
        0,
    )
    .expect("policy");
    p.set_exploration(ExplorationType::Deterministic);
    let w = state[0].numel();
    assert!(
        records.len() >= 12,
        "11 batch boundaries at least, got {} batches",
        records.len()
    );
    // A discrete action's shape is the batch's: [nodes (sync),] envs, time.
    let rows_of = |r: &OutputRecord| {
        let dims = r.data[keys::ACTION].shape();
        dims[..dims.len() - 1].iter().product::<usize>()
    };
    let rows = rows_of(&records[0]);
    let mut carried: Vec<Option<[Vec<f32>; 2]>> = vec![None; rows];
    let mut inits_inside = 0;
    for (b, r) in records.iter().enumerate() {
        let batch = r.data[keys::ACTION].shape().to_vec();
        let t_len = batch[batch.len() - 1];
        assert_eq!(rows_of(r), rows, "batch {b}: the same envs in every batch");
        let obs = f32s(r, keys::OBSERVATION);
        let logits = f32s(r, keys::LOGITS);
        let (h, c) = (f32s(r, "recurrent_state_h"), f32s(r, "recurrent_state_c"));
        let (nh, nc) = (f32s(r, "next.recurrent_state_h"), f32s(r, "next.recurrent_state_c"));
        let Tensor::Bool(is_init) = &r.data[keys::IS_INIT] else {
            panic!("is_init is not bool")
        };
        let Tensor::I64(actions) = &r.data[keys::ACTION] else {
            panic!("discrete actions")
        };
        let Tensor::I64(steps) = &r.data[keys::STEP_COUNT] else {
            panic!("step_count")
        };
        assert_eq!(r.data[keys::IS_INIT].shape(), [&batch[..], &[1]].concat());
        assert_eq!(r.data["recurrent_state_h"].shape(), [&batch[..], &[1, 8]].concat());
        let (is_init, actions, steps): (Vec<bool>, Vec<i64>, Vec<i64>) = (
            is_init.iter().copied().collect(),
            actions.iter().copied().collect(),
            steps.iter().copied().collect(),
        );
        for (e, carried) in carried.iter_mut().enumerate() {
            for t in 0..t_len {
                let i = e * t_len + t;
                let what = format!("batch {b} env {e} step {t}");
                assert_eq!(
                    is_init[i],
                    steps[i] == 0,
                    "{what}: is_init is the episode's first frame"
                );
                inits_inside += usize::from(is_init[i] && t > 0);
                let before = if is_init[i] {
                    [vec![0.0; w], vec![0.0; w]]
                } else {
                    carried
                        .clone()
                        .unwrap_or_else(|| panic!("{what}: no state carried into a running episode"))
                };
                close(
                    &h[i * w..(i + 1) * w],
                    &before[0],
                    &format!("{what}: recurrent_state_h"),
                );
                close(
                    &c[i * w..(i + 1) * w],
                    &before[1],
                    &format!("{what}: recurrent_state_c"),
                );
                let mut after = [vec![0.0; w], vec![0.0; w]];
                let mut z = [0.0f32; 2];
                let mut a = [0i64];
                let mut lp = [0.0f32];
                let io = StateIo {
                    is_init: &[is_init[i]],
                    before: &before,
                    after: &mut after,
                };
                let record = RecordMut {
                    log_prob: &mut lp,
                    params: ParamsMut::Logits(&mut z),
                };
                p.act_recurrent(&obs[i * 4..(i + 1) * 4], 1, io, ActionsMut::Discrete(&mut a), record)
                    .expect("replay");
                close(&logits[i * 2..(i + 1) * 2], &z, &format!("{what}: logits"));
                assert_eq!(actions[i], a[0], "{what}: action");
                close(
                    &nh[i * w..(i + 1) * w],
                    &after[0],
                    &format!("{what}: next.recurrent_state_h"),
                );
                close(
                    &nc[i * w..(i + 1) * w],
                    &after[1],
                    &format!("{what}: next.recurrent_state_c"),
                );
                *carried = Some([nh[i * w..(i + 1) * w].to_vec(), nc[i * w..(i + 1) * w].to_vec()]);
            }
        }
    }
    inits_inside
}
