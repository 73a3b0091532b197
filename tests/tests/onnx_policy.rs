//! The `onnx` policy end to end: models PyTorch exported (tests/fixtures/onnx, written by
//! scripts/export-test-models.py) collect through `rollout collect` with in-process and
//! process nodes, deterministically; every recorded action is what the model says for
//! the recorded observation, as onnxruntime computes it in the venv's Python, and every
//! recorded `action_log_prob`, `logits`, `loc` and `scale` is torch.distributions' for it. A weight
//! update pushed mid-run (the module's other state_dict) changes the actions from the
//! batch tagged with the new version.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rollout::policy::{ActionsMut, OnnxHead, OnnxModel, OnnxPolicy};
use rollout::rollout::keys;
use rollout::{ExplorationType, Policy, PolicyConfig, PolicySpec, Spec, Tensor, Weights};
use rollout_actors::{DistributedCollector, Launcher};
use rollout_tests::{read_output, rollout_bin, run_bounded, temp_dir, venv_python, OutputRecord};
use tempfile::TempDir;

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/onnx").join(name)
}

/// onnxruntime's outputs of `model` for `obs` (one row per observation; an output
/// without a batch dimension is broadcast to every row). `None` without the venv or
/// onnxruntime in it (the test then says it skipped).
fn onnxruntime(model: &Path, obs: &[Vec<f32>], dir: &TempDir) -> Option<Vec<Vec<Vec<f64>>>> {
    let python = venv_python()?;
    let probe = Command::new(&python).args(["-c", "import onnxruntime"]).status().ok()?;
    if !probe.success() {
        eprintln!("SKIPPED: onnxruntime is not installed in {}", python.display());
        return None;
    }
    let input = dir.path().join("obs.json");
    std::fs::write(&input, serde_json::to_vec(obs).expect("json")).expect("write obs");
    let script = "import json, sys\nimport numpy as np, onnxruntime as ort\n\
        s = ort.InferenceSession(sys.argv[1])\n\
        x = np.array(json.load(open(sys.argv[2])), dtype=np.float32)\n\
        outs = s.run(None, {s.get_inputs()[0].name: x})\n\
        print(json.dumps([np.broadcast_to(o, (x.shape[0],) + o.shape[-1:]).astype(float).tolist() for o in outs]))";
    let run = run_bounded(
        Command::new(&python).arg("-c").arg(script).arg(model).arg(&input),
        RUN_TIMEOUT,
    )
    .expect("spawn python");
    assert!(
        run.status.is_some_and(|s| s.success()),
        "onnxruntime failed: {}",
        run.stderr_text()
    );
    Some(serde_json::from_str(&run.stdout_text()).expect("onnxruntime's JSON"))
}

/// `rollout collect` with the ONNX policy; the records of its `--output`.
fn collect(env: &str, model: &str, head: &str, launcher: &str, dir: &TempDir) -> Vec<OutputRecord> {
    let out = dir.path().join(format!("{launcher}.msgpack"));
    let file = fixture(model);
    let args = [
        "collect",
        "--env",
        env,
        "--policy",
        "onnx",
        "--policy-file",
        file.to_str().expect("utf-8 path"),
        "--onnx-head",
        head,
        "--exploration-type",
        "deterministic",
        // The tests check what the policy records: recorded on request.
        "--record",
        "true",
        "--launcher",
        launcher,
        "--nodes",
        "2",
        "--envs-per-node",
        "4",
        "--envs-per-worker",
        "4",
        "--frames-per-batch",
        "200",
        "--total-frames",
        "600",
        "--seed",
        "5",
        "--output",
        out.to_str().expect("utf-8 path"),
    ];
    let run = run_bounded(
        Command::new(rollout_bin()).args(args).env_remove("RUST_LOG"),
        RUN_TIMEOUT,
    )
    .expect("spawn rollout");
    assert!(
        run.status.is_some_and(|s| s.success()),
        "`rollout {}` failed:\n{}",
        args.join(" "),
        run.stderr_text()
    );
    read_output(&out)
}

/// The records' observations, one row per frame, and their actions (as f64).
fn frames(records: &[OutputRecord]) -> (Vec<Vec<f32>>, Vec<Vec<f64>>) {
    let (mut obs, mut acts) = (Vec::new(), Vec::new());
    for r in records {
        let o = match &r.data[keys::OBSERVATION] {
            Tensor::F32(a) => a,
            other => panic!("observation is {}", other.dtype()),
        };
        let dim = *o.shape().last().expect("obs dim");
        let rows: Vec<f32> = o.iter().copied().collect();
        obs.extend(rows.chunks(dim).map(<[f32]>::to_vec));
        match &r.data[keys::ACTION] {
            Tensor::I64(a) => acts.extend(a.iter().map(|&v| vec![v as f64])),
            Tensor::F32(a) => {
                let d = if a.ndim() > 1 {
                    *a.shape().last().expect("dim")
                } else {
                    1
                };
                let v: Vec<f32> = a.iter().copied().collect();
                acts.extend(v.chunks(d).map(|c| c.iter().map(|&x| f64::from(x)).collect()));
            }
            other => panic!("action is {}", other.dtype()),
        }
    }
    assert_eq!(obs.len(), acts.len());
    (obs, acts)
}

/// The f32 tensor `key` of every record, one row of `width` values per frame.
fn column(records: &[OutputRecord], key: &str, width: usize) -> Vec<Vec<f64>> {
    let mut out = Vec::new();
    for r in records {
        let t = match r.data.get(key) {
            Some(Tensor::F32(a)) => a,
            other => panic!("`{key}` is {other:?}; keys: {:?}", r.data.keys().collect::<Vec<_>>()),
        };
        let v: Vec<f64> = t.iter().map(|&x| f64::from(x)).collect();
        out.extend(v.chunks(width).map(<[f64]>::to_vec));
    }
    out
}

/// torch's `Categorical(logits=z).log_prob(a)`, in f64.
fn categorical_log_prob(z: &[f64], a: usize) -> f64 {
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    z[a] - m - lse
}

fn first_argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

fn cartpole_actions_are_the_models(launcher: &str) {
    let dir = temp_dir(&format!("onnx-cartpole-{launcher}"));
    let records = collect(
        "CartPole-v1",
        "cartpole_categorical.onnx",
        "categorical",
        launcher,
        &dir,
    );
    assert_eq!(records.len(), 3);
    let (obs, acts) = frames(&records);
    assert_eq!(obs.len(), 600);
    let Some(outs) = onnxruntime(&fixture("cartpole_categorical.onnx"), &obs, &dir) else {
        return;
    };
    let logits = &outs[0];
    let recorded = column(&records, keys::LOGITS, 2);
    let log_probs = column(&records, keys::ACTION_LOG_PROB, 1);
    for (i, (z, a)) in logits.iter().zip(&acts).enumerate() {
        assert_eq!(
            a[0] as usize,
            first_argmax(z),
            "frame {i}: logits {z:?}, obs {:?}",
            obs[i]
        );
        for j in 0..2 {
            assert!(
                (recorded[i][j] - z[j]).abs() <= 1e-5,
                "frame {i}: logits {:?}, model {z:?}",
                recorded[i]
            );
        }
        let want = categorical_log_prob(z, a[0] as usize);
        assert!(
            (log_probs[i][0] - want).abs() <= 1e-5,
            "frame {i}: log-prob {}, torch's {want}",
            log_probs[i][0]
        );
    }
    let both = acts.iter().any(|a| a[0] == 0.0) && acts.iter().any(|a| a[0] == 1.0);
    assert!(both, "the model picks both actions over 600 frames");
}

fn pendulum_actions_are_the_models(launcher: &str) {
    let dir = temp_dir(&format!("onnx-pendulum-{launcher}"));
    let records = collect("Pendulum-v1", "pendulum_normal.onnx", "normal", launcher, &dir);
    let (obs, acts) = frames(&records);
    assert_eq!(obs.len(), 600);
    let Some(outs) = onnxruntime(&fixture("pendulum_normal.onnx"), &obs, &dir) else {
        return;
    };
    let (locs, scales) = (column(&records, keys::LOC, 1), column(&records, keys::SCALE, 1));
    let log_probs = column(&records, keys::ACTION_LOG_PROB, 1);
    for (i, (loc, a)) in outs[0].iter().zip(&acts).enumerate() {
        let want = loc[0].clamp(-2.0, 2.0);
        assert!(
            (a[0] - want).abs() <= 1e-5,
            "frame {i}: action {}, loc {}",
            a[0],
            loc[0]
        );
        // The model's second output is the log-std: scale = exp(log_std).
        let scale = outs[1][i][0].exp();
        assert!((locs[i][0] - loc[0]).abs() <= 1e-5 && (scales[i][0] - scale).abs() <= 1e-5);
        // torch's Normal(loc, scale).log_prob of the recorded (clipped) action.
        let z = (a[0] - loc[0]) / scale;
        let lp = -0.5 * z * z - scale.ln() - 0.5 * (2.0 * std::f64::consts::PI).ln();
        assert!(
            (log_probs[i][0] - lp).abs() <= 1e-5,
            "frame {i}: log-prob {}, torch's {lp}",
            log_probs[i][0]
        );
    }
}

#[test]
fn cartpole_in_process_nodes_act_as_the_model() {
    cartpole_actions_are_the_models("local");
}

#[test]
fn cartpole_process_nodes_act_as_the_model() {
    cartpole_actions_are_the_models("process");
}

#[test]
fn pendulum_in_process_nodes_act_as_the_model() {
    pendulum_actions_are_the_models("local");
}

#[test]
fn pendulum_process_nodes_act_as_the_model() {
    pendulum_actions_are_the_models("process");
}

/// The module's other state_dict (scripts/export-test-models.py), as an update.
fn update(version: u64) -> Weights {
    let text = std::fs::read_to_string(fixture("cartpole_categorical_update.json")).expect("fixture");
    let j: serde_json::Value = serde_json::from_str(&text).expect("json");
    let mut tensors = BTreeMap::new();
    for (name, t) in j["state_dict"].as_object().expect("state_dict") {
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect();
        let data: Vec<f32> = t["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|x| x.as_f64().expect("value") as f32)
            .collect();
        tensors.insert(
            name.clone(),
            Tensor::F32(ndarray::ArrayD::from_shape_vec(shape, data).expect("shape")),
        );
    }
    Weights::new(tensors).with_version(version)
}

/// The actions `weights` give for `obs`, by an ONNX policy of this process.
fn reference(model: &OnnxModel, weights: Option<&Weights>, obs: &[Vec<f32>]) -> Vec<i64> {
    let cart = Spec::uniform_box(4, f32::NEG_INFINITY, f32::INFINITY);
    let mut p = OnnxPolicy::new(model, OnnxHead::Categorical, &cart, &Spec::Discrete { n: 2 }, 0).expect("policy");
    p.set_exploration(ExplorationType::Deterministic);
    if let Some(w) = weights {
        p.set_weights(w).expect("update fits");
    }
    let flat: Vec<f32> = obs.concat();
    let mut a = vec![-1i64; obs.len()];
    p.act(&flat, obs.len(), ActionsMut::Discrete(&mut a)).expect("act");
    a
}

fn update_mid_run(launcher: Launcher) {
    let model = OnnxModel::parse(std::fs::read(fixture("cartpole_categorical.onnx")).expect("fixture")).expect("model");
    let spec = PolicySpec {
        config: PolicyConfig::Onnx {
            model: model.clone(),
            head: OnnxHead::Categorical,
            state: vec![],
            exploration: None,
        },
        exploration: ExplorationType::Deterministic,
        init_seed: 0,
        record: true,
    };
    let mut b = DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(spec)
        .nodes(2)
        .envs_per_node(2)
        .envs_per_worker(2)
        .frames_per_batch(200)
        .total_frames(1200)
        .sync(true)
        .seed(1);
    if launcher == Launcher::Process {
        b = b.launcher(Launcher::Process).node_program(rollout_bin());
    }
    let mut c = b.build().expect("valid config");
    let new = update(1);
    let (mut i, mut changed, mut new_batches) = (0, 0, 0);
    while let Some(batch) = c.next_batch().expect("batch") {
        let o = batch.data.f32(keys::OBSERVATION).expect("f32 observations");
        let flat: Vec<f32> = o.iter().copied().collect();
        let obs: Vec<Vec<f32>> = flat.chunks(4).map(<[f32]>::to_vec).collect();
        let got: Vec<i64> = batch
            .data
            .i64(keys::ACTION)
            .expect("i64 actions")
            .iter()
            .copied()
            .collect();
        let old = reference(&model, None, &obs);
        if batch.weights_version == 0 {
            assert_eq!(got, old, "batch {i} tagged v0 acts with the file's weights");
        } else {
            assert_eq!(batch.weights_version, 1);
            assert_eq!(
                got,
                reference(&model, Some(&new), &obs),
                "batch {i} tagged v1 acts with the update"
            );
            changed += got.iter().zip(&old).filter(|(a, b)| a != b).count();
            new_batches += 1;
        }
        if i == 0 {
            assert_eq!(batch.weights_version, 0);
            c.update_policy_weights(new.clone(), None).expect("push");
        }
        i += 1;
    }
    assert!(
        new_batches >= 4,
        "sync: the push reaches round 1; {new_batches} batches had it"
    );
    assert!(changed > 0, "the update changes some actions");
}

#[test]
fn a_weight_update_mid_run_changes_the_actions_from_its_batch_in_process() {
    update_mid_run(Launcher::Local);
}

#[test]
fn a_weight_update_mid_run_changes_the_actions_from_its_batch_over_tcp() {
    update_mid_run(Launcher::Process);
}

#[test]
fn bad_flags_exit_2_with_one_line() {
    let bad = fixture("bad_unknown_op.onnx");
    let good = fixture("cartpole_categorical.onnx");
    let cases: [(Vec<&str>, &str); 5] = [
        (vec!["--policy", "onnx", "--onnx-head", "categorical"], "`policy_file`"),
        (
            vec!["--policy", "onnx", "--policy-file", good.to_str().expect("path")],
            "`onnx_head`",
        ),
        (
            vec![
                "--policy",
                "onnx",
                "--policy-file",
                good.to_str().expect("path"),
                "--onnx-head",
                "beta",
            ],
            "`onnx_head`",
        ),
        (
            vec![
                "--policy",
                "onnx",
                "--policy-file",
                bad.to_str().expect("path"),
                "--onnx-head",
                "categorical",
            ],
            "FrobnicateLogits",
        ),
        (
            vec!["--policy", "linear", "--policy-file", good.to_str().expect("path")],
            "`policy_file`",
        ),
    ];
    for (flags, needle) in cases {
        let mut args = vec!["collect", "--total-frames", "10", "--frames-per-batch", "10"];
        args.extend(flags);
        let run = run_bounded(
            Command::new(rollout_bin()).args(&args).env_remove("RUST_LOG"),
            RUN_TIMEOUT,
        )
        .expect("spawn rollout");
        let err = run.stderr_text();
        assert_eq!(run.status.and_then(|s| s.code()), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // A model that does not fit the env: refused at build time, naming the policy and the tensor.
    let pend = fixture("pendulum_normal.onnx");
    let args = [
        "collect",
        "--policy",
        "onnx",
        "--policy-file",
        pend.to_str().expect("path"),
        "--onnx-head",
        "normal",
    ];
    let run = run_bounded(
        Command::new(rollout_bin()).args(args).env_remove("RUST_LOG"),
        RUN_TIMEOUT,
    )
    .expect("spawn rollout");
    let err = run.stderr_text();
    assert_eq!(run.status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(err.contains("`policy`") && err.contains("observation"), "{err}");
}

/// `rollout collect --policy onnx` on CartPole, 2 in-process nodes, sync, deterministic,
/// with extra flags; its `--output` bytes.
fn cartpole_run(dir: &TempDir, name: &str, extra: &[&str]) -> Vec<u8> {
    let out = dir.path().join(name);
    let mut args: Vec<String> = [
        "collect",
        "--env",
        "CartPole-v1",
        "--policy",
        "onnx",
        "--onnx-head",
        "categorical",
        "--exploration-type",
        "random",
        "--nodes",
        "2",
        "--sync",
        "--frames-per-batch",
        "100",
        "--seed",
        "3",
        "--quiet",
        "--output",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(out.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    let run = run_bounded(
        Command::new(rollout_bin()).args(&args).env_remove("RUST_LOG"),
        RUN_TIMEOUT,
    )
    .expect("spawn rollout");
    assert!(
        run.status.is_some_and(|s| s.success()),
        "`rollout {}` failed:\n{}",
        args.join(" "),
        run.stderr_text()
    );
    std::fs::read(&out).expect("output")
}

/// The map entry `key` of a MessagePack map value.
fn entry<'a>(v: &'a rmpv::Value, key: &str) -> &'a rmpv::Value {
    v.as_map()
        .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(key)))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no `{key}` in the checkpoint"))
}

#[test]
fn a_checkpoint_holds_the_model_and_its_weights_and_resumes_without_the_file() {
    let dir = temp_dir("onnx-checkpoint");
    let file = fixture("cartpole_categorical.onnx");
    let path = file.to_str().expect("path");
    let ck = dir.path().join("ck");
    let ck_s = ck.display().to_string();
    let whole = cartpole_run(&dir, "whole", &["--policy-file", path, "--total-frames", "600"]);
    let _ = cartpole_run(
        &dir,
        "resumed",
        &[
            "--policy-file",
            path,
            "--total-frames",
            "300",
            "--checkpoint",
            &ck_s,
            "--checkpoint-every",
            "1",
        ],
    );

    // The file: 8 magic bytes, a u32 version, then one map.
    let bytes = std::fs::read(&ck).expect("checkpoint");
    let v: rmpv::Value = rmp_serde::from_slice(&bytes[12..]).expect("a MessagePack map");
    let policy = entry(&v, "policy");
    assert_eq!(entry(policy, "kind").as_str(), Some("onnx"));
    let model = std::fs::read(&file).expect("model");
    assert_eq!(entry(policy, "model").as_slice(), Some(&model[..]), "the model's bytes");
    let nodes = entry(entry(&v, "collector"), "nodes").as_array().expect("nodes");
    let trainer = entry(entry(&v, "collector"), "trainer");
    let held: Vec<&rmpv::Value> = std::iter::once(entry(trainer, "weights"))
        .chain(nodes.iter().map(|n| entry(n, "weights")))
        .filter(|w| !w.is_nil())
        .collect();
    assert!(!held.is_empty(), "the checkpoint holds weights");
    for w in held {
        let names: Vec<&str> = entry(w, "tensors")
            .as_map()
            .expect("tensors")
            .iter()
            .filter_map(|(k, _)| k.as_str())
            .collect();
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
    }

    // Resumed without --policy-file: the checkpoint's model; the run as if never stopped.
    let resumed = cartpole_run(&dir, "resumed", &["--total-frames", "600", "--resume", &ck_s]);
    assert_eq!(resumed, whole, "the resumed run's output is the whole run's");

    // Another model given on resume is refused, naming the flag.
    let other = fixture("cartpole_tanh_mlp_64.onnx");
    let args = [
        "collect",
        "--policy",
        "onnx",
        "--onnx-head",
        "categorical",
        "--policy-file",
        other.to_str().expect("path"),
        "--resume",
        &ck_s,
    ];
    let run = run_bounded(
        Command::new(rollout_bin()).args(args).env_remove("RUST_LOG"),
        RUN_TIMEOUT,
    )
    .expect("spawn rollout");
    let err = run.stderr_text();
    assert_eq!(run.status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(err.contains("`policy_file`") && err.contains("checkpoint"), "{err}");
}

/// ONNX's protobuf, written by hand: hostile models are made at test time, not checked in.
mod pb_bytes {
    /// A varint.
    pub fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// A length-delimited field.
    pub fn ld(tag: u64, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        varint(&mut out, tag << 3 | 2);
        varint(&mut out, body.len() as u64);
        out.extend_from_slice(body);
        out
    }

    /// A varint field.
    pub fn int(tag: u64, v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        varint(&mut out, tag << 3);
        varint(&mut out, v);
        out
    }

    /// A `TensorProto` with raw data (`data_type` as in onnx.proto: 1 float, 7 int64, 8 string).
    pub fn tensor(name: &str, data_type: u64, dims: &[u64], raw: &[u8]) -> Vec<u8> {
        let mut packed = Vec::new();
        for &d in dims {
            varint(&mut packed, d);
        }
        [ld(1, &packed), int(2, data_type), ld(8, name.as_bytes()), ld(9, raw)].concat()
    }

    /// A `NodeProto`.
    pub fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for i in inputs {
            out.extend(ld(1, i.as_bytes()));
        }
        for o in outputs {
            out.extend(ld(2, o.as_bytes()));
        }
        out.extend(ld(3, name.as_bytes()));
        out.extend(ld(4, op.as_bytes()));
        out
    }

    /// A `ValueInfoProto` of f32 `[batch, width]`.
    fn value(name: &str, width: u64) -> Vec<u8> {
        let shape = [ld(1, &ld(2, b"batch")), ld(1, &int(1, width))].concat();
        let tensor_type = [int(1, 1), ld(2, &shape)].concat();
        [ld(1, name.as_bytes()), ld(2, &ld(1, &tensor_type))].concat()
    }

    /// CartPole's categorical policy (`logits = observation · W`) with `nodes` and
    /// `initializers` beside it, as a `ModelProto`.
    pub fn model(nodes: &[Vec<u8>], initializers: &[Vec<u8>]) -> Vec<u8> {
        let w: Vec<u8> = [0.5f32, -0.5, 0.25, -0.25, 1.0, -1.0, 0.0, 0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut graph = ld(1, &node("policy", "MatMul", &["observation", "W"], &["logits"]));
        for n in nodes {
            graph.extend(ld(1, n));
        }
        graph.extend(ld(5, &tensor("W", 1, &[4, 2], &w)));
        for t in initializers {
            graph.extend(ld(5, t));
        }
        graph.extend(ld(11, &value("observation", 4)));
        graph.extend(ld(12, &value("logits", 2)));
        [int(1, 8), ld(8, &int(2, 13)), ld(7, &graph)].concat()
    }
}

#[test]
fn hostile_models_exit_2_with_one_line_naming_the_tensor_or_node() {
    use pb_bytes::{ld, model, node, tensor};
    let dir = temp_dir("onnx-hostile");
    let shape = |n: u64| tensor("shape", 7, &[1], &n.to_le_bytes());
    let constant_of_shape = |n: u64| model(&[node("big", "ConstantOfShape", &["shape"], &["zeros"])], &[shape(n)]);
    // 16 MB of empty nodes, merged into the graph by a second `graph` field.
    let mut empty_nodes = model(&[], &[]);
    empty_nodes.extend(ld(7, &[0x0a, 0x00].repeat(8 << 20)));
    let cases: [(&str, Vec<u8>, &[&str]); 6] = [
        ("honest", model(&[], &[]), &[]),
        (
            "string",
            model(&[], &[tensor("names", 8, &[2], b"ab")]),
            &["`names`", "raw data"],
        ),
        ("cos40", constant_of_shape(1 << 40), &["`big`", "ConstantOfShape"]),
        ("cos28", constant_of_shape(1 << 28), &["`big`", "ConstantOfShape"]),
        ("empty_nodes", empty_nodes, &["100000 nodes"]),
        (
            "int64_2_40",
            model(&[], &[tensor("huge", 7, &[1 << 40], &7i64.to_le_bytes())]),
            &["`huge`", "8 bytes"],
        ),
    ];
    for (name, bytes, needles) in cases {
        let file = dir.path().join(format!("{name}.onnx"));
        std::fs::write(&file, &bytes).expect("write the model");
        let path = file.to_str().expect("path");
        let args = [
            "collect",
            "--total-frames",
            "10",
            "--frames-per-batch",
            "10",
            "--policy",
            "onnx",
            "--policy-file",
            path,
            "--onnx-head",
            "categorical",
        ];
        let run = run_bounded(
            Command::new(rollout_bin()).args(args).env_remove("RUST_LOG"),
            RUN_TIMEOUT,
        )
        .expect("spawn rollout");
        let err = run.stderr_text();
        let code = run.status.and_then(|s| s.code());
        if needles.is_empty() {
            // The base of every hostile model is an honest one: it collects.
            assert_eq!(code, Some(0), "{name}: {err}");
            continue;
        }
        assert_eq!(code, Some(2), "{name} ({} bytes): {err}", bytes.len());
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(!err.contains("panicked at"), "{name}: {err}");
        for needle in needles {
            assert!(err.contains(needle), "{name}: `{needle}` not in {err}");
        }
    }
}
