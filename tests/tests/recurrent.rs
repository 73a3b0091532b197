//! A recurrent `onnx` policy end to end (PROTOCOL.md §8, Recurrent): an LSTM actor
//! exported from torch (tests/fixtures/onnx/cartpole_lstm.onnx, checked against torch
//! step by step in the core's tests) collects through `rollout collect` on in-process
//! and process nodes, two envs per worker, episodes cut inside batches. Every recorded
//! frame is replayed env by env, one row at a time, carrying the state as a single-env
//! loop would: `is_init`, the state before and after, the logits and the action must be
//! the replay's, across 11 batch boundaries. A checkpointed and resumed run writes the
//! same bytes as the run left alone.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rollout_tests::{
    assert_recurrent_replay, children, node_with_index, read_output, rollout_bin, run_bounded, signal, temp_dir,
    wait_for, wait_with_deadline,
};
use tempfile::TempDir;

const RUN_TIMEOUT: Duration = Duration::from_secs(180);

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

#[test]
fn in_process_nodes_carry_each_envs_lstm_state_as_a_single_env_loop() {
    let dir = temp_dir("recurrent-local");
    let out = run(&dir, "local", "local", &["--total-frames", "960"]);
    let inside = assert_recurrent_replay(&read_output(&out), &model_file());
    assert!(inside > 0, "episodes of 15 frames start inside batches of 10 steps");
}

#[test]
fn process_nodes_carry_each_envs_lstm_state_as_a_single_env_loop() {
    let dir = temp_dir("recurrent-process");
    let out = run(&dir, "process", "process", &["--total-frames", "960"]);
    let inside = assert_recurrent_replay(&read_output(&out), &model_file());
    assert!(inside > 0, "episodes of 15 frames start inside batches of 10 steps");
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
        &[
            "--total-frames",
            "480",
            "--checkpoint",
            &ck_s,
            "--checkpoint-every",
            "1",
        ],
    );
    let resumed = std::fs::read(run(
        &dir,
        "resumed",
        "local",
        &["--total-frames", "960", "--resume", &ck_s],
    ))
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
    assert!(
        stderr.contains("restarting"),
        "the replacement was not reported; stderr:\n{stderr}"
    );
    // Node 1's envs start over in the replacement (new episodes, zero state); node 0's
    // go on: the replay holds for every row.
    assert_recurrent_replay(&read_output(&out), &model_file());
}
