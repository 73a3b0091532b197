//! A recurrent `onnx` policy end to end (PROTOCOL.md §8, Recurrent): an LSTM actor
//! exported from torch (tests/fixtures/onnx/cartpole_lstm.onnx, checked against torch
//! step by step in the core's tests) collects through `rollout collect` on in-process
//! and process nodes, two envs per worker, episodes cut inside batches. Every recorded
//! frame is replayed env by env, one row at a time, carrying the state as a single-env
//! loop would: `is_init`, the state before and after, the logits and the action must be
//! the replay's, across 11 batch boundaries. A checkpointed and resumed run writes the
//! same bytes as the run left alone.

use std::path::{Path, PathBuf};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rollout::policy::{ActionsMut, OnnxHead, OnnxModel, OnnxPolicy, ParamsMut, RecordMut, StateIo};
use rollout::rollout::keys;
use rollout::{ExplorationType, Policy, Spec, Tensor};
use rollout_tests::{
    children, node_with_index, read_output, rollout_bin, run_bounded, signal, temp_dir, wait_for, wait_with_deadline,
    OutputRecord,
};
use tempfile::TempDir;

const RUN_TIMEOUT: Duration = Duration::from_secs(180);
const TOL: f32 = 1e-5;

fn model_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/onnx/cartpole_lstm.onnx")
}

/// `rollout collect`'s arguments for the LSTM on CartPole, 2 nodes of 4 envs in workers
/// of 2, sync, deterministic, episodes cut at 15 frames, written to `out`.
fn args(out: &Path, launcher: &str, extra: &[&str]) -> Vec<String> {
    let file = model_file();
    let mut args: Vec<String> = [
        "collect",
        "--env",
        "CartPole-v1",
        "--policy",
        "onnx",
        "--policy-file",
        file.to_str().expect("utf-8 path"),
        "--onnx-head",
        "categorical",
        "--exploration-type",
        "deterministic",
        "--launcher",
        launcher,
        "--nodes",
        "2",
        "--envs-per-node",
        "4",
        "--envs-per-worker",
        "2",
        "--sync",
        "--max-frames-per-traj",
        "15",
        "--frames-per-batch",
        "80",
        "--seed",
        "7",
        "--quiet",
        "--output",
        out.to_str().expect("utf-8 path"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The run of [`args`] into `dir/name`, which must succeed; the output file.
fn run(dir: &TempDir, name: &str, launcher: &str, extra: &[&str]) -> PathBuf {
    let out = dir.path().join(name);
    let args = args(&out, launcher, extra);
    let done = run_bounded(
        Command::new(rollout_bin()).args(&args).env_remove("RUST_LOG"),
        RUN_TIMEOUT,
    )
    .expect("spawn rollout");
    assert!(
        done.status.is_some_and(|s| s.success()),
        "`rollout {}` failed:\n{}",
        args.join(" "),
        done.stderr_text()
    );
    out
}

fn f32s<'a>(r: &'a OutputRecord, key: &str) -> Vec<f32> {
    match r.data.get(key) {
        Some(Tensor::F32(a)) => a.iter().copied().collect(),
        other => panic!("`{key}` is {other:?}; keys {:?}", r.data.keys().collect::<Vec<_>>()),
    }
}

fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= TOL, "{what}: {got:?} vs the replay's {want:?}");
    }
}

/// Replays every env's frames one row at a time with the model, carrying the state
/// from frame to frame and batch to batch, and compares each recorded frame.
fn replays_env_by_env(records: &[OutputRecord]) {
    let model = OnnxModel::parse(std::fs::read(model_file()).expect("model")).expect("parse");
    let state = model.declared_state().expect("state");
    assert_eq!(state.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["recurrent_state_h", "recurrent_state_c"]);
    let obs_spec = Spec::uniform_box(4, f32::NEG_INFINITY, f32::INFINITY);
    let mut p = OnnxPolicy::recurrent(&model, OnnxHead::Categorical, &state, &obs_spec, &Spec::Discrete { n: 2 }, 0)
        .expect("policy");
    p.set_exploration(ExplorationType::Deterministic);
    let w = state[0].numel();
    assert!(records.len() >= 12, "11 batch boundaries at least, got {} batches", records.len());
    let rows = records[0].data[keys::ACTION].shape()[0];
    let mut carried: Vec<Option<[Vec<f32>; 2]>> = vec![None; rows];
    let mut inits_inside = 0;
    for (b, r) in records.iter().enumerate() {
        let t_len = r.data[keys::ACTION].shape()[1];
        let obs = f32s(r, keys::OBSERVATION);
        let logits = f32s(r, keys::LOGITS);
        let (h, c) = (f32s(r, "recurrent_state_h"), f32s(r, "recurrent_state_c"));
        let (nh, nc) = (f32s(r, "next.recurrent_state_h"), f32s(r, "next.recurrent_state_c"));
        let Tensor::Bool(is_init) = &r.data[keys::IS_INIT] else { panic!("is_init is not bool") };
        let Tensor::I64(actions) = &r.data[keys::ACTION] else { panic!("discrete actions") };
        let Tensor::I64(steps) = &r.data[keys::STEP_COUNT] else { panic!("step_count") };
        assert_eq!(r.data[keys::IS_INIT].shape(), &[rows, t_len, 1]);
        assert_eq!(r.data["recurrent_state_h"].shape(), &[rows, t_len, 1, 8]);
        let (is_init, actions, steps): (Vec<bool>, Vec<i64>, Vec<i64>) = (
            is_init.iter().copied().collect(),
            actions.iter().copied().collect(),
            steps.iter().copied().collect(),
        );
        for e in 0..rows {
            for t in 0..t_len {
                let i = e * t_len + t;
                let what = format!("batch {b} env {e} step {t}");
                assert_eq!(is_init[i], steps[i] == 0, "{what}: is_init is the episode's first frame");
                inits_inside += usize::from(is_init[i] && t > 0);
                let before = if is_init[i] {
                    [vec![0.0; w], vec![0.0; w]]
                } else {
                    carried[e].clone().unwrap_or_else(|| panic!("{what}: no state carried into a running episode"))
                };
                close(&h[i * w..(i + 1) * w], &before[0], &format!("{what}: recurrent_state_h"));
                close(&c[i * w..(i + 1) * w], &before[1], &format!("{what}: recurrent_state_c"));
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
                close(&nh[i * w..(i + 1) * w], &after[0], &format!("{what}: next.recurrent_state_h"));
                close(&nc[i * w..(i + 1) * w], &after[1], &format!("{what}: next.recurrent_state_c"));
                carried[e] = Some([nh[i * w..(i + 1) * w].to_vec(), nc[i * w..(i + 1) * w].to_vec()]);
            }
        }
    }
    assert!(inits_inside > 0, "episodes of 15 frames start inside batches of 10 steps");
}

#[test]
fn in_process_nodes_carry_each_envs_lstm_state_as_a_single_env_loop() {
    let dir = temp_dir("recurrent-local");
    let out = run(&dir, "local", "local", &["--total-frames", "960"]);
    replays_env_by_env(&read_output(&out));
}

#[test]
fn process_nodes_carry_each_envs_lstm_state_as_a_single_env_loop() {
    let dir = temp_dir("recurrent-process");
    let out = run(&dir, "process", "process", &["--total-frames", "960"]);
    replays_env_by_env(&read_output(&out));
}

#[test]
fn a_resumed_recurrent_run_writes_the_bytes_of_the_run_left_alone() {
    let dir = temp_dir("recurrent-resume");
    let ck = dir.path().join("ck");
    let ck_s = ck.display().to_string();
    let whole = std::fs::read(run(&dir, "whole", "local", &["--total-frames", "960"])).expect("whole");
    // The resumed run goes on writing the first one's output file.
    run(
        &dir,
        "resumed",
        "local",
        &["--total-frames", "480", "--checkpoint", &ck_s, "--checkpoint-every", "1"],
    );
    let resumed = std::fs::read(run(&dir, "resumed", "local", &["--total-frames", "960", "--resume", &ck_s]))
        .expect("resumed");
    assert_eq!(resumed, whole, "the resumed run's output is the whole run's");
}

#[test]
fn a_process_node_killed_mid_run_is_replaced_and_every_envs_state_stays_exact() {
    // Batches of one step per env, 2,000 of them: the `--json` lines outgrow the pipe,
    // so the run cannot end before the kill while the test does not read them.
    let dir = temp_dir("recurrent-kill");
    let out = dir.path().join("killed");
    let mut args = args(&out, "process", &["--total-frames", "16000", "--json"]);
    let at = args.iter().position(|a| a == "--frames-per-batch").expect("flag") + 1;
    args[at] = "8".into();
    let mut child = Command::new(rollout_bin())
        .args(&args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rollout collect");
    let pid = child.id();
    let stderr = child.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut s);
        s
    });
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(first.contains("\"batch\":0"), "first line: {first}");
    let nodes = wait_for(Instant::now() + RUN_TIMEOUT, "two node processes", || {
        Some(children(pid)).filter(|c| c.len() == 2)
    });
    signal(node_with_index(&nodes, 1).expect("node 1's process"), "KILL");
    let batches = lines.map_while(Result::ok).filter(|l| l.contains("\"batch\"")).count() + 1;
    let status = wait_with_deadline(&mut child, RUN_TIMEOUT);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stderr = err.join().unwrap_or_default();
    assert!(status.is_some_and(|s| s.success()), "{status:?}; stderr:\n{stderr}");
    assert_eq!(batches, 2000, "every batch once; stderr:\n{stderr}");
    assert!(stderr.contains("restarting"), "the replacement was not reported; stderr:\n{stderr}");
    // Node 1's envs start over in the replacement (new episodes, zero state); node 0's
    // go on: the replay holds for every row.
    replays_env_by_env(&read_output(&out));
}
