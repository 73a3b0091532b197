//! Recurrent models against torch: scripts/export-test-models.py stepped an LSTM (one and
//! two layers) and a two-layer GRU over 8 steps of 3 rows, carrying the state and
//! zeroing it where `is_init`; the policy, stepped the same way on tract, must give the
//! same outputs and the same state after every step.

use serde_json::Value;

use super::tests::{fixture, json, model, TOL};
use super::*;
use crate::policy::{ActionsMut, ExplorationType, ParamsMut, Policy, RecordMut, StateIo, StateTensor};
use crate::schema::keys;
use crate::spec::Spec;

/// A matrix of the fixture as one row-major f32 vector.
fn flat(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32))
        .collect()
}

fn state_of(fixture: &Value) -> Vec<StateTensor> {
    fixture["state"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let shape = s["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize);
            StateTensor::new(s["name"].as_str().unwrap(), shape.collect::<Vec<_>>())
        })
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(*g) - f64::from(*w)).abs() <= TOL,
            "{what}[{i}]: {g} vs torch {w}"
        );
    }
}

/// Steps `name`'s policy over the fixture's steps, feeding its own state back (zeroed
/// where `is_init`, as the rollout does), and compares with torch at every step.
fn steps_like_torch(name: &str, obs: Spec, action: Spec) {
    let f = json(name);
    let state = state_of(&f);
    assert_eq!(
        model(name).declared_state().unwrap(),
        state,
        "the model's inputs declare its state"
    );
    let head = OnnxHead::from_name(f["head"].as_str().unwrap()).unwrap();
    let mut p = OnnxPolicy::recurrent(&model(name), head, &state, &obs, &action, 0).unwrap();
    p.set_exploration(ExplorationType::Deterministic);
    assert_eq!(p.state(), state.as_slice());
    assert_eq!(p.engine(), OnnxEngine::Tract(WeightMode::Rebuild));
    let k = 3;
    let mut cur: Vec<Vec<f32>> = state.iter().map(|s| vec![0.0; k * s.numel()]).collect();
    let mut next = cur.clone();
    for (t, step) in f["steps"].as_array().unwrap().iter().enumerate() {
        let is_init: Vec<bool> = step["is_init"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_bool().unwrap())
            .collect();
        for (rows, s) in cur.iter_mut().zip(&state) {
            for (r, &init) in is_init.iter().enumerate() {
                if init {
                    rows[r * s.numel()..(r + 1) * s.numel()].fill(0.0);
                }
            }
        }
        for (j, (mine, torch)) in cur.iter().zip(step["state"].as_array().unwrap()).enumerate() {
            // Torch's rows where is_init are the previous state (its step zeroes them).
            for (r, &init) in is_init.iter().enumerate() {
                let w = state[j].numel();
                if !init {
                    assert_close(
                        &mine[r * w..(r + 1) * w],
                        &flat(torch)[r * w..(r + 1) * w],
                        &format!("step {t} state {j}"),
                    );
                }
            }
        }
        let o = flat(&step["observation"]);
        let mut lp = vec![0.0f32; k];
        match head {
            OnnxHead::Categorical => {
                let mut logits = vec![0.0f32; k * 2];
                let mut a = vec![0i64; k];
                let io = StateIo {
                    is_init: &is_init,
                    before: &cur,
                    after: &mut next,
                };
                let record = RecordMut {
                    log_prob: &mut lp,
                    params: ParamsMut::Logits(&mut logits),
                };
                p.act_recurrent(&o, k, io, ActionsMut::Discrete(&mut a), record)
                    .unwrap();
                assert_close(&logits, &flat(&step["outputs"]["logits"]), &format!("step {t} logits"));
            }
            _ => {
                let mut loc = vec![0.0f32; k];
                let mut scale = vec![0.0f32; k];
                let mut a = vec![0.0f32; k];
                let io = StateIo {
                    is_init: &is_init,
                    before: &cur,
                    after: &mut next,
                };
                let record = RecordMut {
                    log_prob: &mut lp,
                    params: ParamsMut::Normal {
                        loc: &mut loc,
                        scale: &mut scale,
                    },
                };
                p.act_recurrent(&o, k, io, ActionsMut::Continuous(&mut a), record)
                    .unwrap();
                assert_close(&loc, &flat(&step["outputs"]["loc"]), &format!("step {t} loc"));
                let log_std = flat(&step["outputs"]["log_std"]);
                let torch_scale: Vec<f32> = log_std.iter().map(|v| v.exp()).collect();
                assert_close(&scale, &torch_scale, &format!("step {t} scale"));
            }
        }
        for (j, (mine, torch)) in next.iter().zip(step["next_state"].as_array().unwrap()).enumerate() {
            assert_close(mine, &flat(torch), &format!("step {t} next state {j}"));
        }
        std::mem::swap(&mut cur, &mut next);
    }
}

fn cartpole() -> (Spec, Spec) {
    (
        Spec::uniform_box(4, f32::NEG_INFINITY, f32::INFINITY),
        Spec::Discrete { n: 2 },
    )
}

#[test]
fn an_lstm_steps_as_torch_does_state_and_logits() {
    let (obs, action) = cartpole();
    steps_like_torch("cartpole_lstm", obs, action);
}

#[test]
fn a_two_layer_lstm_steps_as_torch_does() {
    let (obs, action) = cartpole();
    steps_like_torch("cartpole_lstm_2", obs, action);
}

#[test]
fn a_two_layer_gru_with_a_normal_head_steps_as_torch_does() {
    steps_like_torch(
        "pendulum_gru_2",
        Spec::uniform_box(3, -8.0, 8.0),
        Spec::uniform_box(1, -2.0, 2.0),
    );
}

#[test]
fn a_recurrent_model_is_refused_without_its_state_and_with_a_wrong_one() {
    let (obs, action) = cartpole();
    let m = model("cartpole_lstm");
    let err = OnnxPolicy::new(&m, OnnxHead::Categorical, &obs, &action, 0)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("is_init") && err.to_string().contains("declares no state"),
        "{err}"
    );

    let wrong_name = [
        StateTensor::new("recurrent_state_h", [1, 8]),
        StateTensor::new("hidden", [1, 8]),
    ];
    let err = OnnxPolicy::recurrent(&m, OnnxHead::Categorical, &wrong_name, &obs, &action, 0)
        .err()
        .unwrap();
    assert!(err.to_string().contains("`hidden`"), "{err}");

    let wrong_shape = [
        StateTensor::new("recurrent_state_h", [1, 9]),
        StateTensor::new("recurrent_state_c", [1, 9]),
    ];
    let err = OnnxPolicy::recurrent(&m, OnnxHead::Categorical, &wrong_shape, &obs, &action, 0)
        .err()
        .unwrap();
    assert!(err.to_string().contains("recurrent_state"), "{err}");

    // A model without state given one: no is_init input.
    let plain = OnnxModel::parse(std::fs::read(fixture("cartpole_categorical.onnx")).unwrap()).unwrap();
    assert!(plain.declared_state().unwrap().is_empty());
    let state = [StateTensor::new("recurrent_state", [1, 8])];
    let err = OnnxPolicy::recurrent(&plain, OnnxHead::Categorical, &state, &obs, &action, 0)
        .err()
        .unwrap();
    assert!(err.to_string().contains(keys::IS_INIT), "{err}");
}

#[test]
fn a_recurrent_policy_acts_only_with_its_state() {
    let (obs, action) = cartpole();
    let f = json("cartpole_lstm");
    let mut p = OnnxPolicy::recurrent(
        &model("cartpole_lstm"),
        OnnxHead::Categorical,
        &state_of(&f),
        &obs,
        &action,
        0,
    )
    .unwrap();
    let mut a = [0i64; 2];
    let err = p.act(&[0.0; 8], 2, ActionsMut::Discrete(&mut a)).unwrap_err();
    assert!(err.to_string().contains("act_recurrent"), "{err}");
    // Rows that do not fit the call are refused before the model runs.
    let before = vec![vec![0.0; 8], vec![0.0; 8]];
    let mut after = before.clone();
    let io = StateIo {
        is_init: &[true, true],
        before: &before,
        after: &mut after,
    };
    let err = p
        .act_recurrent(&[0.0; 8], 2, io, ActionsMut::Discrete(&mut a), RecordMut::nothing())
        .unwrap_err();
    assert!(err.to_string().contains("needs 16 values"), "{err}");
}

#[test]
fn an_update_keeps_working_on_the_carried_state() {
    // New weights take effect at the next call; the state the caller carries is theirs.
    let (obs, action) = cartpole();
    let f = json("cartpole_lstm");
    let state = state_of(&f);
    let mut p =
        OnnxPolicy::recurrent(&model("cartpole_lstm"), OnnxHead::Categorical, &state, &obs, &action, 0).unwrap();
    p.set_exploration(ExplorationType::Deterministic);
    let run = |p: &mut OnnxPolicy, before: &[Vec<f32>], init: bool| {
        let mut after: Vec<Vec<f32>> = before.to_vec();
        let mut a = [0i64; 1];
        let io = StateIo {
            is_init: &[init],
            before,
            after: &mut after,
        };
        p.act_recurrent(
            &[0.1, -0.2, 0.03, 0.4],
            1,
            io,
            ActionsMut::Discrete(&mut a),
            RecordMut::nothing(),
        )
        .unwrap();
        after
    };
    let zero: Vec<Vec<f32>> = state.iter().map(|s| vec![0.0; s.numel()]).collect();
    let s1 = run(&mut p, &zero, true);
    let s2 = run(&mut p, &s1, false);
    assert_ne!(s1, s2, "the state moves step to step");
    let mut w = p.weights().clone().with_version(1);
    for t in w.tensors.values_mut() {
        if let crate::tensor::Tensor::F32(a) = t {
            a.mapv_inplace(|v| v * 0.5);
        }
    }
    p.set_weights(&w).unwrap();
    let s2_new = run(&mut p, &s1, false);
    assert_ne!(s2_new, s2, "the new weights are used");
    assert_eq!(
        run(&mut p, &s1, false),
        s2_new,
        "one state, one weight version, one result"
    );
}

#[test]
fn the_benchmarks_64_unit_lstm_steps_as_torch_does() {
    let (obs, action) = cartpole();
    steps_like_torch("cartpole_lstm_64", obs, action);
}
