//! Tests against the numbers torch wrote beside the models
//! (scripts/export-test-models.py, tests/fixtures/onnx/).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use super::*;
use crate::policy::logprob::{
    log_softmax_f64, normal_log_density as normal_log_prob, tanh_normal_log_density as tanh_normal_log_prob,
};
use crate::policy::{ActionsMut, ExplorationType, ParamsMut, Policy, PolicyError, RecordMut, Weights};
use crate::spec::Spec;
use crate::tensor::Tensor;

pub(super) const TOL: f64 = 1e-5;

pub(super) fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/onnx")
        .join(name)
}

pub(super) fn model(name: &str) -> OnnxModel {
    OnnxModel::parse(std::fs::read(fixture(&format!("{name}.onnx"))).unwrap()).unwrap()
}

pub(super) fn json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(&format!("{name}.json"))).unwrap()).unwrap()
}

fn matrix(v: &Value) -> Vec<Vec<f64>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
        .collect()
}

fn flat_obs(v: &Value) -> Vec<f32> {
    matrix(v).into_iter().flatten().map(|x| x as f32).collect()
}

fn cartpole() -> (Spec, Spec) {
    (
        Spec::uniform_box(4, f32::NEG_INFINITY, f32::INFINITY),
        Spec::Discrete { n: 2 },
    )
}

fn pendulum() -> (Spec, Spec) {
    (Spec::uniform_box(3, -8.0, 8.0), Spec::uniform_box(1, -2.0, 2.0))
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= TOL, "{what}: got {got}, torch says {want}");
}

const MODES: [WeightMode; 2] = [WeightMode::Inputs, WeightMode::Rebuild];

fn policy(name: &str, head: OnnxHead, (obs, action): (Spec, Spec), mode: WeightMode) -> OnnxPolicy {
    let mut p = OnnxPolicy::with_mode(&model(name), head, &obs, &action, 3, mode).unwrap();
    p.set_exploration(ExplorationType::Deterministic);
    p
}

/// Runs a categorical policy in mode, recording: (actions, log-probs, logits).
fn categorical_run(p: &mut OnnxPolicy, obs: &[f32], k: usize) -> (Vec<i64>, Vec<f32>, Vec<f32>) {
    let (mut a, mut lp, mut z) = (vec![-1i64; k], vec![f32::NAN; k], vec![f32::NAN; 2 * k]);
    let record = RecordMut {
        log_prob: &mut lp,
        params: ParamsMut::Logits(&mut z),
    };
    p.act_recording(obs, k, ActionsMut::Discrete(&mut a), record).unwrap();
    (a, lp, z)
}

/// Runs a box policy, recording: (actions, log-probs, locs, scales).
fn normal_run(p: &mut OnnxPolicy, obs: &[f32], k: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut a, mut lp, mut loc, mut scale) = (
        vec![f32::NAN; k],
        vec![f32::NAN; k],
        vec![f32::NAN; k],
        vec![f32::NAN; k],
    );
    let record = RecordMut {
        log_prob: &mut lp,
        params: ParamsMut::Normal {
            loc: &mut loc,
            scale: &mut scale,
        },
    };
    p.act_recording(obs, k, ActionsMut::Continuous(&mut a), record).unwrap();
    (a, lp, loc, scale)
}

/// The `qvalue` head over the outputs torch wrote (a model's one output may have any
/// name): the first argmax in both explorations, recording the values and the greedy
/// one's, on tract (both weight modes) and on the dense kernel.
#[test]
fn qvalue_takes_the_greedy_action_and_records_the_values_torch_gave() {
    let j = json("cartpole_categorical");
    let obs = flat_obs(&j["observation"]);
    let k = obs.len() / 4;
    let values = matrix(&j["logits"]);
    let (obs_spec, action) = cartpole();
    let mut runs: Vec<OnnxPolicy> = MODES
        .iter()
        .map(|&mode| {
            OnnxPolicy::with_mode(
                &model("cartpole_categorical"),
                OnnxHead::QValue,
                &obs_spec,
                &action,
                3,
                mode,
            )
            .unwrap()
        })
        .collect();
    runs.push(OnnxPolicy::new(&model("cartpole_categorical"), OnnxHead::QValue, &obs_spec, &action, 3).unwrap());
    assert_eq!(runs[0].recorded(), crate::policy::Recorded::QValue { n: 2 });
    for p in &mut runs {
        for exploration in [ExplorationType::Random, ExplorationType::Deterministic] {
            p.set_exploration(exploration);
            let (a, chosen, v) = categorical_run(p, &obs, k);
            for (i, row) in values.iter().enumerate() {
                let best = if row[1] > row[0] { 1 } else { 0 };
                assert_eq!(a[i], best as i64, "row {i} ({exploration:?}, {:?})", p.engine());
                close(f64::from(v[2 * i]), row[0], "action_value");
                close(f64::from(v[2 * i + 1]), row[1], "action_value");
                assert_eq!(chosen[i], v[2 * i + best], "chosen_action_value is the greedy one's");
            }
        }
    }
    // A box action has no Q-values to take the argmax of.
    let (obs_p, act_p) = pendulum();
    let e = OnnxPolicy::new(&model("pendulum_deterministic"), OnnxHead::QValue, &obs_p, &act_p, 3)
        .err()
        .expect("qvalue on a box");
    assert!(e.to_string().contains("qvalue head does not fit a box action"), "{e}");
}

#[test]
fn categorical_matches_torch() {
    let j = json("cartpole_categorical");
    let obs = flat_obs(&j["observation"]);
    let k = obs.len() / 4;
    let logits = matrix(&j["logits"]);
    let lps = matrix(&j["log_prob"]);
    for mode in MODES {
        let mut p = policy("cartpole_categorical", OnnxHead::Categorical, cartpole(), mode);
        let (a, lp, z) = categorical_run(&mut p, &obs, k);
        for i in 0..k {
            for c in 0..2 {
                close(f64::from(z[i * 2 + c]), logits[i][c], "logit");
                close(log_softmax_f64(&z[i * 2..i * 2 + 2], c), lps[i][c], "log_prob");
            }
            assert_eq!(a[i], j["mode"][i].as_i64().unwrap(), "{mode:?}");
            close(f64::from(lp[i]), lps[i][a[i] as usize], "recorded log_prob");
        }
        // Sampling draws both actions and records each one's log-probability.
        p.set_exploration(ExplorationType::Random);
        let many: Vec<f32> = obs[..4].repeat(200);
        let (a, lp, z) = categorical_run(&mut p, &many, 200);
        assert!(a.contains(&0) && a.contains(&1), "{a:?}");
        for i in 0..200 {
            close(f64::from(lp[i]), lps[0][a[i] as usize], "sampled log_prob");
            close(f64::from(z[i * 2]), logits[0][0], "sampled logits");
        }
    }
}

#[test]
fn normal_with_log_std_matches_torch() {
    let j = json("pendulum_normal");
    let obs = flat_obs(&j["observation"]);
    let k = obs.len() / 3;
    let (loc, scale) = (matrix(&j["loc"]), matrix(&j["scale"]));
    let actions: Vec<Vec<Vec<f64>>> = j["actions"].as_array().unwrap().iter().map(matrix).collect();
    let lps = matrix(&j["log_prob"]);
    for mode in MODES {
        let mut p = policy("pendulum_normal", OnnxHead::Normal, pendulum(), mode);
        let (a, lp, l, s) = normal_run(&mut p, &obs, k);
        for i in 0..k {
            close(f64::from(l[i]), loc[i][0], "loc");
            close(f64::from(s[i]), scale[i][0], "scale");
            close(f64::from(a[i]), loc[i][0].clamp(-2.0, 2.0), "mode action");
            // The mode, and loc -/+ a spread clipped to the box: torch's log-probs.
            for (which, acts) in actions.iter().enumerate() {
                let got = normal_log_prob(acts[i][0], f64::from(l[i]), f64::from(s[i]));
                close(got, lps[which][i], "log_prob");
            }
            if (-2.0..=2.0).contains(&loc[i][0]) {
                close(f64::from(lp[i]), lps[0][i], "recorded log_prob");
            }
        }
    }
}

#[test]
fn tanh_normal_matches_torch() {
    let j = json("pendulum_tanh_normal");
    let obs = flat_obs(&j["observation"]);
    let k = obs.len() / 3;
    let (loc, scale) = (matrix(&j["loc"]), matrix(&j["scale"]));
    let pre: Vec<Vec<Vec<f64>>> = j["pre_tanh"].as_array().unwrap().iter().map(matrix).collect();
    let actions: Vec<Vec<Vec<f64>>> = j["actions"].as_array().unwrap().iter().map(matrix).collect();
    let lps = matrix(&j["log_prob"]);
    let mut p = policy(
        "pendulum_tanh_normal",
        OnnxHead::TanhNormal,
        pendulum(),
        WeightMode::default(),
    );
    let (a, lp, l, s) = normal_run(&mut p, &obs, k);
    for i in 0..k {
        close(f64::from(l[i]), loc[i][0], "loc");
        close(f64::from(s[i]), scale[i][0], "scale");
        close(f64::from(a[i]), actions[0][i][0], "mode action");
        close(f64::from(lp[i]), lps[0][i], "recorded log_prob");
        for (which, u) in pre.iter().enumerate() {
            let got = tanh_normal_log_prob(u[i][0], f64::from(l[i]), f64::from(s[i]), 2.0);
            close(got, lps[which][i], "log_prob");
        }
    }
}

#[test]
fn deterministic_matches_torch() {
    let j = json("pendulum_deterministic");
    let obs = flat_obs(&j["observation"]);
    let k = obs.len() / 3;
    let want = matrix(&j["action"]);
    let mut p = policy(
        "pendulum_deterministic",
        OnnxHead::Deterministic,
        pendulum(),
        WeightMode::default(),
    );
    assert_eq!(p.recorded(), crate::policy::Recorded::None);
    let mut a = vec![f32::NAN; k];
    p.act(&obs, k, ActionsMut::Continuous(&mut a)).unwrap();
    for i in 0..k {
        close(f64::from(a[i]), want[i][0], "action");
    }
}

fn update_from_json(j: &Value, version: u64) -> Weights {
    let mut tensors = BTreeMap::new();
    for (name, t) in j["state_dict"].as_object().unwrap() {
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let data: Vec<f32> = t["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        tensors.insert(
            name.clone(),
            Tensor::F32(ndarray::ArrayD::from_shape_vec(shape, data).unwrap()),
        );
    }
    Weights::new(tensors).with_version(version)
}

#[test]
fn weights_are_the_initializers_and_updates_reach_the_plan() {
    let update = update_from_json(&json("cartpole_categorical_update"), 4);
    let j = json("cartpole_categorical_update");
    let obs = flat_obs(&j["observation"]);
    let k = obs.len() / 4;
    let want = matrix(&j["logits"]);
    for mode in MODES {
        let mut p = policy("cartpole_categorical", OnnxHead::Categorical, cartpole(), mode);
        let names: Vec<&str> = p.weights().tensors.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "net.0.bias",
                "net.0.weight",
                "net.2.bias",
                "net.2.weight",
                "net.4.bias",
                "net.4.weight"
            ]
        );
        assert_eq!(p.weights().version, 0);
        p.set_weights(&update).unwrap();
        assert_eq!(p.weights().version, 4);
        let (_, _, z) = categorical_run(&mut p, &obs, k);
        for i in 0..k {
            for c in 0..2 {
                close(f64::from(z[i * 2 + c]), want[i][c], "logit after the update");
            }
        }
    }
}

#[test]
fn bad_updates_name_the_tensor_and_change_nothing() {
    for mode in MODES {
        let mut p = policy("cartpole_categorical", OnnxHead::Categorical, cartpole(), mode);
        let before = p.weights().clone();
        let mut unknown = before.clone().with_version(1);
        unknown
            .tensors
            .insert("net.9.weight".into(), Tensor::F32(ndarray::ArrayD::zeros(vec![2])));
        let e = p.set_weights(&unknown).unwrap_err().to_string();
        assert!(e.contains("`net.9.weight`"), "{e}");
        let mut shape = before.clone().with_version(1);
        shape
            .tensors
            .insert("net.0.bias".into(), Tensor::F32(ndarray::ArrayD::zeros(vec![3])));
        let e = p.set_weights(&shape).unwrap_err().to_string();
        assert!(e.contains("`net.0.bias`") && e.contains("[16]"), "{e}");
        let mut dtype = before.clone().with_version(1);
        dtype
            .tensors
            .insert("net.0.bias".into(), Tensor::F64(ndarray::ArrayD::zeros(vec![16])));
        assert!(p.set_weights(&dtype).unwrap_err().to_string().contains("`net.0.bias`"));
        assert_eq!(p.weights(), &before);
    }
}

fn build_err(bytes: Vec<u8>, head: OnnxHead, specs: (Spec, Spec)) -> String {
    let m = OnnxModel::new(bytes);
    match OnnxPolicy::new(&m, head, &specs.0, &specs.1, 0) {
        Ok(_) => panic!("built"),
        Err(e) => e.to_string(),
    }
}

fn file(name: &str) -> Vec<u8> {
    std::fs::read(fixture(&format!("{name}.onnx"))).unwrap()
}

#[test]
fn bad_models_are_refused_naming_the_tensor() {
    let e = build_err(b"this is not a model".to_vec(), OnnxHead::Categorical, cartpole());
    assert!(e.starts_with("not an ONNX model"), "{e}");
    let e = build_err(file("bad_unknown_op"), OnnxHead::Categorical, cartpole());
    assert!(
        e.contains("`frobnicate`") && e.contains("`FrobnicateLogits`") && e.contains("tract"),
        "{e}"
    );
    let e = build_err(file("bad_input_shape"), OnnxHead::Categorical, cartpole());
    assert!(e.starts_with("input `observation`") && e.contains("[batch, 5]"), "{e}");
    let e = build_err(file("bad_output_shape"), OnnxHead::Categorical, cartpole());
    assert!(e.starts_with("output `logits`") && e.contains("3"), "{e}");
    // A head the outputs do not fit: `loc` is missing.
    let e = build_err(file("cartpole_categorical"), OnnxHead::Normal, pendulum());
    assert!(e.contains("input `observation`") || e.contains("output `loc`"), "{e}");
    let e = build_err(file("pendulum_deterministic"), OnnxHead::Normal, pendulum());
    assert!(e.starts_with("output `loc`"), "{e}");
    // A head that does not fit the action spec.
    let e = build_err(file("pendulum_deterministic"), OnnxHead::Categorical, pendulum());
    assert!(e.contains("categorical head does not fit a box action"), "{e}");
}

#[test]
fn a_model_over_the_limit_is_refused_before_parsing() {
    let big = vec![0u8; MAX_MODEL_BYTES + 1];
    let e = OnnxModel::parse(big).unwrap_err();
    assert!(matches!(e, OnnxError::TooLarge { .. }), "{e}");
}

#[test]
fn config_round_trips_as_msgpack_with_the_bytes_as_bin() {
    use crate::policy::{PolicyConfig, PolicySpec};
    let bytes = file("cartpole_categorical");
    let config = PolicyConfig::Onnx {
        model: OnnxModel::new(bytes.clone()),
        head: OnnxHead::TanhNormal,
        state: vec![],
        exploration: None,
    };
    let wire = rmp_serde::to_vec_named(&config).unwrap();
    let v: rmpv::Value = rmp_serde::from_slice(&wire).unwrap();
    let map: Vec<(String, rmpv::Value)> = v
        .as_map()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_string(), v.clone()))
        .collect();
    assert_eq!(map[0], ("kind".into(), rmpv::Value::from("onnx")));
    assert!(map
        .iter()
        .any(|(k, v)| k == "model" && v.as_slice() == Some(&bytes[..])));
    assert!(map
        .iter()
        .any(|(k, v)| k == "head" && v.as_str() == Some("tanh_normal")));
    let back: PolicyConfig = rmp_serde::from_slice(&wire).unwrap();
    assert_eq!(back, config);
    // PolicySpec::build gives the ONNX policy with the file's weights.
    let spec = PolicySpec::from(PolicyConfig::Onnx {
        model: OnnxModel::new(bytes),
        head: OnnxHead::Categorical,
        state: vec![],
        exploration: None,
    });
    let (obs, action) = cartpole();
    let p = spec.build(&obs, &action, 0).unwrap();
    assert_eq!(p.weights().tensors.len(), 6);
    assert!(matches!(
        spec.config.recorded(&action),
        crate::policy::Recorded::Categorical { n: 2 }
    ));
    assert!(matches!(
        PolicySpec::from(PolicyConfig::Onnx {
            model: OnnxModel::new(vec![1, 2]),
            head: OnnxHead::Categorical,
            state: vec![],
            exploration: None,
        })
        .build(&obs, &action, 0),
        Err(PolicyError::Onnx(OnnxError::NotOnnx(_)))
    ));
}

#[test]
fn sampler_state_resumes_the_same_samples() {
    let j = json("pendulum_normal");
    let obs = flat_obs(&j["observation"]);
    let k = obs.len() / 3;
    let mut p = policy("pendulum_normal", OnnxHead::Normal, pendulum(), WeightMode::default());
    p.set_exploration(ExplorationType::Random);
    let _ = normal_run(&mut p, &obs, k);
    let state = p.sampler_state().unwrap();
    let first = normal_run(&mut p, &obs, k).0;
    p.set_sampler_state(state.as_ref()).unwrap();
    assert_eq!(normal_run(&mut p, &obs, k).0, first);
}

/// The batch layout of an env only Python nodes run, as its specs give it (the
/// observation entry only: the check reads no other).
fn node_layout(dtype: crate::tensor::DType, shape: Vec<usize>) -> crate::schema::BatchLayout {
    [("observation".to_string(), (dtype, shape))].into_iter().collect()
}

#[test]
fn a_u8_image_model_fits_u8_image_specs_from_the_nodes() {
    use crate::tensor::DType;
    let m = model("image_u8_cnn");
    let three = Spec::Discrete { n: 3 };
    m.check_node_specs(
        &node_layout(DType::U8, vec![12, 12, 3]),
        &three,
        OnnxHead::Categorical,
        &[],
    )
    .unwrap();
    // Its weights are the model's own: the conv's and the linear head's.
    let w = m.initial_weights().unwrap();
    assert_eq!(w.tensors["conv.weight"].shape(), &[4, 3, 3, 3]);
    assert_eq!(w.tensors["head.weight"].shape(), &[3, 100]);
}

#[test]
fn specs_from_the_nodes_that_do_not_fit_the_model_are_refused_by_name() {
    use crate::tensor::DType;
    let m = model("image_u8_cnn");
    let three = Spec::Discrete { n: 3 };
    let cat = OnnxHead::Categorical;
    // An f32 image: the model's u8 input is no float a node could cast to.
    let e = m
        .check_node_specs(&node_layout(DType::F32, vec![12, 12, 3]), &three, cat, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("observation") && e.contains("f32"), "{e}");
    // Another image size.
    let e = m
        .check_node_specs(&node_layout(DType::U8, vec![10, 12, 3]), &three, cat, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("observation"), "{e}");
    // Four actions where the model has three logits.
    let e = m
        .check_node_specs(
            &node_layout(DType::U8, vec![12, 12, 3]),
            &Spec::Discrete { n: 4 },
            cat,
            &[],
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("logits"), "{e}");
    // A float model over a u8 observation is fine: the node casts.
    let cartpole = model("cartpole_categorical");
    cartpole
        .check_node_specs(&node_layout(DType::U8, vec![4]), &Spec::Discrete { n: 2 }, cat, &[])
        .unwrap();
}

/// The fixtures whose graphs are chains of dense layers, their heads and specs.
fn chains() -> Vec<(&'static str, OnnxHead, (Spec, Spec))> {
    vec![
        ("cartpole_categorical", OnnxHead::Categorical, cartpole()),
        ("cartpole_categorical", OnnxHead::QValue, cartpole()),
        ("cartpole_tanh_mlp_64", OnnxHead::Categorical, cartpole()),
        ("cartpole_matmul_add", OnnxHead::Categorical, cartpole()),
        ("pendulum_normal", OnnxHead::Normal, pendulum()),
        ("pendulum_deterministic", OnnxHead::Deterministic, pendulum()),
    ]
}

/// The policy as `OnnxPolicy::new` makes it, deterministic.
fn auto(name: &str, head: OnnxHead, (obs, action): (Spec, Spec)) -> OnnxPolicy {
    let mut p = OnnxPolicy::new(&model(name), head, &obs, &action, 3).unwrap();
    p.set_exploration(ExplorationType::Deterministic);
    p
}

/// What a run gave: actions (discrete as f32), log-probs, and the head's parameters
/// (logits, or loc then scale).
fn outputs(p: &mut OnnxPolicy, obs: &[f32], k: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    match p.head() {
        OnnxHead::Categorical | OnnxHead::QValue => {
            let (a, lp, z) = categorical_run(p, obs, k);
            (a.iter().map(|&v| v as f32).collect(), lp, z)
        }
        OnnxHead::Deterministic => {
            let mut a = vec![f32::NAN; k];
            p.act(obs, k, ActionsMut::Continuous(&mut a)).unwrap();
            (a, Vec::new(), Vec::new())
        }
        OnnxHead::Normal | OnnxHead::TanhNormal => {
            let (a, lp, mut loc, scale) = normal_run(p, obs, k);
            loc.extend(scale);
            (a, lp, loc)
        }
    }
}

fn all_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        close(f64::from(*g), f64::from(*w), what);
    }
}

#[test]
fn chains_of_dense_layers_run_on_the_built_in_kernel_as_torch_and_tract_compute() {
    for (name, head, specs) in chains() {
        let j = json(name);
        let obs = flat_obs(&j["observation"]);
        let k = obs.len() / specs.0.dim();
        let mut fast = auto(name, head, specs.clone());
        assert_eq!(fast.engine(), OnnxEngine::DenseChain, "{name}");
        let mut tract = policy(name, head, specs, WeightMode::Rebuild);
        assert_eq!(tract.engine(), OnnxEngine::Tract(WeightMode::Rebuild), "{name}");
        let (a, lp, params) = outputs(&mut fast, &obs, k);
        let (ta, tlp, tparams) = outputs(&mut tract, &obs, k);
        // The same actions, log-probabilities and parameters as tract's, within rounding.
        all_close(&a, &ta, &format!("{name}: actions against tract"));
        all_close(&lp, &tlp, &format!("{name}: log-probs against tract"));
        all_close(&params, &tparams, &format!("{name}: parameters against tract"));
        // And as torch's numbers.
        match head {
            OnnxHead::Categorical => {
                let logits = matrix(&j["logits"]);
                for i in 0..k {
                    let z: Vec<f32> = logits[i].iter().map(|&v| v as f32).collect();
                    for c in 0..2 {
                        close(f64::from(params[i * 2 + c]), logits[i][c], &format!("{name}: logit"));
                    }
                    assert_eq!(a[i] as usize, crate::policy::sampler::argmax(&z), "{name}: mode");
                    let want = log_softmax_f64(&z, a[i] as usize);
                    close(f64::from(lp[i]), want, &format!("{name}: log_prob"));
                }
            }
            OnnxHead::Normal => {
                let (loc, scale) = (matrix(&j["loc"]), matrix(&j["scale"]));
                let lps = matrix(&j["log_prob"]);
                for i in 0..k {
                    close(f64::from(params[i]), loc[i][0], &format!("{name}: loc"));
                    close(f64::from(params[k + i]), scale[i][0], &format!("{name}: scale"));
                    close(f64::from(a[i]), loc[i][0].clamp(-2.0, 2.0), &format!("{name}: mode"));
                    if (-2.0..=2.0).contains(&loc[i][0]) {
                        close(f64::from(lp[i]), lps[0][i], &format!("{name}: log_prob"));
                    }
                }
            }
            OnnxHead::Deterministic => {
                let want = matrix(&j["action"]);
                for i in 0..k {
                    close(f64::from(a[i]), want[i][0], &format!("{name}: action"));
                }
            }
            OnnxHead::QValue => {
                // The values torch gave, the greedy action and its value.
                let values = matrix(&j["logits"]);
                for i in 0..k {
                    let z: Vec<f32> = values[i].iter().map(|&v| v as f32).collect();
                    for c in 0..2 {
                        close(
                            f64::from(params[i * 2 + c]),
                            values[i][c],
                            &format!("{name}: action_value"),
                        );
                    }
                    let best = crate::policy::sampler::argmax(&z);
                    assert_eq!(a[i] as usize, best, "{name}: greedy");
                    close(
                        f64::from(lp[i]),
                        values[i][best],
                        &format!("{name}: chosen_action_value"),
                    );
                }
            }
            OnnxHead::TanhNormal => unreachable!("no tanh-normal chain among the fixtures"),
        }
    }
}

/// The fixture `cartpole_categorical` with its output renamed `action_value` and an f32
/// initializer `greedy.eps` (0.25, shape `[]`) beside it, with an `Identity` from `from`
/// to a second output `egreedy_eps`: the exporter's DQN actor with epsilon-greedy.
fn q_model_with_side_output(from: &str) -> OnnxModel {
    use prost::Message;
    use tract_onnx::pb::{self, tensor_proto::DataType};
    let bytes = std::fs::read(fixture("cartpole_categorical.onnx")).unwrap();
    let mut m = pb::ModelProto::decode(&bytes[..]).unwrap();
    let g = m.graph.as_mut().unwrap();
    let old = g.output[0].name.clone();
    for n in &mut g.node {
        for o in &mut n.output {
            if *o == old {
                *o = "action_value".into();
            }
        }
    }
    g.output[0].name = "action_value".into();
    g.initializer.push(pb::TensorProto {
        name: "greedy.eps".into(),
        data_type: DataType::Float as i32,
        dims: vec![],
        raw_data: 0.25f32.to_le_bytes().to_vec(),
        ..Default::default()
    });
    g.node.push(pb::NodeProto {
        name: "eps_copy".into(),
        op_type: "Identity".into(),
        input: vec![from.into()],
        output: vec!["egreedy_eps".into()],
        ..Default::default()
    });
    let mut out = g.output[0].clone();
    out.name = "egreedy_eps".into();
    if let Some(pb::type_proto::Value::TensorType(t)) = out.r#type.as_mut().and_then(|t| t.value.as_mut()) {
        t.shape = Some(pb::TensorShapeProto { dim: vec![] });
    }
    g.output.push(out);
    OnnxModel::parse(m.encode_to_vec()).unwrap()
}

#[test]
fn an_initializer_copied_to_a_side_output_keeps_the_dense_kernel() {
    let (obs, action) = cartpole();
    let j = json("cartpole_categorical");
    let o = flat_obs(&j["observation"]);
    let k = o.len() / 4;
    let mut plain = auto("cartpole_categorical", OnnxHead::QValue, cartpole());
    let side = q_model_with_side_output("greedy.eps");
    let mut p = OnnxPolicy::new(&side, OnnxHead::QValue, &obs, &action, 3).unwrap();
    assert_eq!(p.engine(), OnnxEngine::DenseChain, "eps's copy is no part of the head");
    assert!(p.weights().tensors.contains_key("greedy.eps"));
    p.set_exploration(ExplorationType::Deterministic);
    assert_eq!(outputs(&mut p, &o, k), outputs(&mut plain, &o, k));
    // The config the exporter writes builds on it, its eps read from the weights.
    let spec = crate::policy::PolicySpec {
        config: crate::policy::PolicyConfig::Onnx {
            model: side.clone(),
            head: OnnxHead::QValue,
            state: vec![],
            exploration: Some(crate::policy::ExplorationModule::EpsilonGreedy(
                crate::policy::EpsilonGreedy {
                    eps: "greedy.eps".into(),
                },
            )),
        },
        exploration: ExplorationType::Deterministic,
        init_seed: 0,
        record: true,
    };
    let mut built = spec.build(&obs, &action, 3).unwrap();
    let mut a = vec![-1i64; k];
    built.act(&o, k, ActionsMut::Discrete(&mut a)).unwrap();
    assert_eq!(
        a.iter().map(|&v| v as f32).collect::<Vec<_>>(),
        outputs(&mut plain, &o, k).0,
        "deterministic: greedy"
    );
    // A side output copying anything but an initializer is a graph the kernel does not
    // know: tract runs it.
    let other = q_model_with_side_output("action_value");
    let p = OnnxPolicy::new(&other, OnnxHead::QValue, &obs, &action, 3).unwrap();
    assert!(matches!(p.engine(), OnnxEngine::Tract(_)), "{:?}", p.engine());
}

#[test]
fn sampling_on_the_built_in_kernel_draws_as_on_tract() {
    // The same sampler seed and the same head: the same draws, the same actions
    // (discrete) or within rounding (a box).
    for (name, head, specs) in chains() {
        let j = json(name);
        let obs = flat_obs(&j["observation"]);
        let k = obs.len() / specs.0.dim();
        let mut fast = auto(name, head, specs.clone());
        let mut tract = policy(name, head, specs, WeightMode::Rebuild);
        fast.set_exploration(ExplorationType::Random);
        tract.set_exploration(ExplorationType::Random);
        for _ in 0..5 {
            let (a, lp, _) = outputs(&mut fast, &obs, k);
            let (ta, tlp, _) = outputs(&mut tract, &obs, k);
            all_close(&a, &ta, &format!("{name}: sampled actions"));
            all_close(&lp, &tlp, &format!("{name}: sampled log-probs"));
        }
    }
}

#[test]
fn graphs_that_are_not_a_chain_run_on_tract() {
    // A skip connection (an `Add` of two activations).
    let j = json("cartpole_residual");
    let obs = flat_obs(&j["observation"]);
    let k = obs.len() / 4;
    let mut p = auto("cartpole_residual", OnnxHead::Categorical, cartpole());
    assert_eq!(p.engine(), OnnxEngine::Tract(WeightMode::Rebuild));
    let (_, _, z) = categorical_run(&mut p, &obs, k);
    let logits = matrix(&j["logits"]);
    for i in 0..k {
        for c in 0..2 {
            close(f64::from(z[i * 2 + c]), logits[i][c], "residual logit");
        }
    }
    // Two heads from one body, a softplus scale: a state-dependent spread.
    let p = auto("pendulum_tanh_normal", OnnxHead::TanhNormal, pendulum());
    assert_eq!(p.engine(), OnnxEngine::Tract(WeightMode::Rebuild));
}

#[test]
fn a_cnn_is_no_chain() {
    // The u8 image CNN (a convolution, a transpose, a cast): its graph is refused by
    // the recognition whatever the observation it is shown.
    let m = model("image_u8_cnn");
    let w = m.initial_weights().unwrap();
    let roles = super::model::Roles::Categorical { logits: 0 };
    let parsed = m.parsed().unwrap();
    for shape in [vec![12, 12, 3], vec![432]] {
        assert!(
            super::dense_chain::DenseChain::recognise(parsed, OnnxHead::Categorical, roles, &shape, 3, &w).is_none()
        );
    }
}

#[test]
fn an_update_changes_the_built_in_kernel_s_outputs_as_tract_s() {
    let j = json("cartpole_categorical_update");
    let update = update_from_json(&j, 7);
    let obs = flat_obs(&j["observation"]);
    let k = obs.len() / 4;
    let want = matrix(&j["logits"]);
    let mut fast = auto("cartpole_categorical", OnnxHead::Categorical, cartpole());
    let mut tract = policy(
        "cartpole_categorical",
        OnnxHead::Categorical,
        cartpole(),
        WeightMode::Rebuild,
    );
    let before = categorical_run(&mut fast, &obs, k);
    fast.set_shared_weights(&std::sync::Arc::new(update.clone())).unwrap();
    tract.set_weights(&update).unwrap();
    assert_eq!(fast.weights().version, 7);
    let (a, lp, z) = categorical_run(&mut fast, &obs, k);
    let (ta, tlp, tz) = categorical_run(&mut tract, &obs, k);
    assert_ne!(before.0, a, "the update changes the actions");
    assert_eq!(a, ta);
    all_close(&lp, &tlp, "log-probs after the update");
    all_close(&z, &tz, "logits after the update");
    for i in 0..k {
        for c in 0..2 {
            close(f64::from(z[i * 2 + c]), want[i][c], "logit after the update, torch");
        }
    }
    // A bad update names the tensor and changes nothing.
    let mut bad = update.clone().with_version(8);
    bad.tensors
        .insert("net.2.weight".into(), Tensor::F32(ndarray::ArrayD::zeros(vec![16, 15])));
    let e = fast.set_weights(&bad).unwrap_err().to_string();
    assert!(e.contains("`net.2.weight`"), "{e}");
    assert_eq!(fast.weights().version, 7);
    assert_eq!(categorical_run(&mut fast, &obs, k), (a, lp, z));
}

#[test]
fn a_transposed_view_updates_as_its_standard_layout() {
    // Tensors handed over as views in another memory order are read as their values.
    let j = json("cartpole_categorical_update");
    let update = update_from_json(&j, 2);
    let obs = flat_obs(&j["observation"]);
    let k = obs.len() / 4;
    let mut viewed = update.clone();
    for t in viewed.tensors.values_mut() {
        if let Tensor::F32(a) = t {
            if a.ndim() == 2 {
                // The same values, stored column-major.
                let mut f = ndarray::ArrayD::<f32>::zeros(ndarray::ShapeBuilder::f(ndarray::IxDyn(a.shape())));
                f.assign(a);
                *a = f;
            }
        }
    }
    let mut p = auto("cartpole_categorical", OnnxHead::Categorical, cartpole());
    let mut q = auto("cartpole_categorical", OnnxHead::Categorical, cartpole());
    p.set_weights(&update).unwrap();
    q.set_shared_weights(&std::sync::Arc::new(viewed)).unwrap();
    assert_eq!(categorical_run(&mut p, &obs, k), categorical_run(&mut q, &obs, k));
}

#[test]
fn a_large_chain_read_from_the_named_tensors_computes_as_from_its_copy() {
    // Large networks read the update's tensors themselves; small ones a copy: the
    // same numbers either way, bit for bit.
    for (name, head, specs) in chains() {
        let j = json(name);
        let obs = flat_obs(&j["observation"]);
        let k = obs.len() / specs.0.dim();
        let mut flat = auto(name, head, specs.clone());
        let mut named = auto(name, head, specs);
        named.read_named_tensors();
        let (a, lp, params) = outputs(&mut flat, &obs, k);
        let (na, nlp, nparams) = outputs(&mut named, &obs, k);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&na), "{name}");
        assert_eq!(bits(&lp), bits(&nlp), "{name}");
        assert_eq!(bits(&params), bits(&nparams), "{name}");
    }
}

#[test]
fn a_tanh_normal_chain_runs_on_the_built_in_kernel_as_on_tract() {
    // The Gaussian actor (a chain, its log-std an initializer) read as a tanh-normal.
    let j = json("pendulum_normal");
    let obs = flat_obs(&j["observation"]);
    let k = obs.len() / 3;
    let mut fast = auto("pendulum_normal", OnnxHead::TanhNormal, pendulum());
    assert_eq!(fast.engine(), OnnxEngine::DenseChain);
    let mut tract = policy("pendulum_normal", OnnxHead::TanhNormal, pendulum(), WeightMode::Rebuild);
    for exploration in [ExplorationType::Deterministic, ExplorationType::Random] {
        fast.set_exploration(exploration);
        tract.set_exploration(exploration);
        let (a, lp, params) = outputs(&mut fast, &obs, k);
        let (ta, tlp, tparams) = outputs(&mut tract, &obs, k);
        all_close(&a, &ta, "tanh-normal actions");
        all_close(&lp, &tlp, "tanh-normal log-probs");
        all_close(&params, &tparams, "tanh-normal loc and scale");
    }
}
