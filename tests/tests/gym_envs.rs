//! Any gymnasium env, end to end: `rollout collect --env ID --launcher process
//! --node-command '<venv python> -m rollout_node'`, a trainer that cannot build the env
//! learning it from the Python nodes it started (their `ready` specs), sending them version
//! 0 of the weights, and writing `--output`. Every run's frames are replayed by seed
//! through a fresh gymnasium env (`rollout_node.replay --seed`: every observation, reward,
//! termination and truncation), and arrive in the env's own dtypes and shapes: Acrobot-v1,
//! MuJoCo's HalfCheetah-v5 (f64 observations kept f64), Atari's ALE/Pong-v5 (u8 frames
//! kept u8) and an env of dict observations the tests register.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rollout::DType;
use rollout_tests::{read_output, rollout_bin, run_bounded, temp_dir, venv_python, OutputRecord};
use tempfile::TempDir;

const DEADLINE: Duration = Duration::from_secs(300);
const SEED: &str = "5";

/// Where the test envs (`spaces_env`) are: on the nodes' and the replay's `PYTHONPATH`.
fn test_envs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/node/tests")
}

/// Runs `rollout collect` over `nodes` Python nodes the process launcher starts for `env`
/// (`imports`: modules each node imports first), with `flags`; returns the records.
fn collect(py: &Path, dir: &TempDir, env: &str, imports: &[&str], flags: &[&str]) -> Vec<OutputRecord> {
    let out = dir.path().join("out.msgpack");
    let mut node = format!("{} -m rollout_node", py.display());
    for m in imports {
        node.push_str(&format!(" --import {m}"));
    }
    let mut cmd = Command::new(rollout_bin());
    cmd.args([
        "collect",
        "--launcher",
        "process",
        "--env",
        env,
        "--quiet",
        "--seed",
        SEED,
    ])
    .args(["--node-command", &node])
    .arg("--output")
    .arg(&out)
    .args(flags)
    .env("PYTHONPATH", test_envs_dir());
    let f = run_bounded(&mut cmd, DEADLINE).expect("start rollout collect");
    f.assert_success(&format!("rollout collect --env {env}"));
    replay(py, &out, env, imports);
    read_output(&out)
}

/// The replay by seed of `out` through gymnasium must pass.
fn replay(py: &Path, out: &Path, env: &str, imports: &[&str]) {
    let mut cmd = Command::new(py);
    cmd.args(["-m", "rollout_node.replay"])
        .arg(out)
        .args(["--env", env, "--seed", SEED])
        .env("PYTHONPATH", test_envs_dir());
    for m in imports {
        cmd.args(["--import", m]);
    }
    let f = run_bounded(&mut cmd, DEADLINE).expect("start the replay");
    f.assert_success(&format!("the replay of {env} by seed"));
}

/// Frames over all records.
fn frames(records: &[OutputRecord]) -> usize {
    records.iter().map(|r| r.data["collector.traj_ids"].len()).sum()
}

/// `key`'s dtype and feature shape (after `batch_dims`) in every record.
fn assert_entry(records: &[OutputRecord], key: &str, dtype: DType, feature: &[usize], batch_dims: usize) {
    for r in records {
        let t = r
            .data
            .get(key)
            .unwrap_or_else(|| panic!("batch {} has no `{key}`", r.batch));
        assert_eq!(t.dtype(), dtype, "batch {}: `{key}`", r.batch);
        assert_eq!(&t.shape()[batch_dims..], feature, "batch {}: `{key}`", r.batch);
    }
}

#[test]
fn acrobot_collects_exact_frames_with_an_mlp_built_from_the_nodes_specs() {
    let Some(py) = venv_python() else { return };
    let dir = temp_dir("gym-acrobot");
    let records = collect(
        &py,
        &dir,
        "Acrobot-v1",
        &[],
        &[
            "--sync",
            "--nodes",
            "2",
            "--envs-per-node",
            "2",
            "--policy",
            "mlp",
            "--hidden",
            "16,16",
            "--exploration-type",
            "deterministic",
            "--frames-per-batch",
            "200",
            "--total-frames",
            "2000",
        ],
    );
    assert_eq!(frames(&records), 2000);
    // Sync: [nodes, envs, T].
    assert_entry(&records, "observation", DType::F32, &[6], 3);
    assert_entry(&records, "action", DType::I64, &[], 3);
    let versions: Vec<u64> = records.iter().map(|r| r.weights_version).collect();
    assert!(
        versions.iter().all(|&v| v == 0),
        "collected with version 0: {versions:?}"
    );
}

#[test]
fn halfcheetah_keeps_its_f64_observations_end_to_end() {
    let Some(py) = venv_python() else { return };
    let dir = temp_dir("gym-halfcheetah");
    let records = collect(
        &py,
        &dir,
        "HalfCheetah-v5",
        &[],
        &[
            "--nodes",
            "2",
            "--envs-per-node",
            "2",
            "--policy",
            "linear",
            "--exploration-type",
            "deterministic",
            "--frames-per-batch",
            "200",
            "--total-frames",
            "1200",
        ],
    );
    assert_eq!(frames(&records), 1200);
    assert_entry(&records, "observation", DType::F64, &[17], 2);
    assert_entry(&records, "next.observation", DType::F64, &[17], 2);
    assert_entry(&records, "action", DType::F32, &[6], 2);
}

#[test]
fn pong_frames_travel_and_arrive_as_u8() {
    let Some(py) = venv_python() else { return };
    let dir = temp_dir("gym-pong");
    let records = collect(
        &py,
        &dir,
        "ALE/Pong-v5",
        &[],
        &[
            "--nodes",
            "1",
            "--envs-per-node",
            "2",
            "--policy",
            "random",
            "--frames-per-batch",
            "64",
            "--total-frames",
            "256",
        ],
    );
    assert_eq!(frames(&records), 256);
    assert_entry(&records, "observation", DType::U8, &[210, 160, 3], 2);
    assert_entry(&records, "action", DType::I64, &[], 2);
}

#[test]
fn dict_observations_arrive_as_nested_keys_in_their_own_dtypes() {
    let Some(py) = venv_python() else { return };
    let dir = temp_dir("gym-dict");
    let records = collect(
        &py,
        &dir,
        "DictSpaces-v0",
        &["spaces_env"],
        &[
            "--sync",
            "--nodes",
            "2",
            "--envs-per-node",
            "1",
            "--policy",
            "random",
            "--frames-per-batch",
            "60",
            "--total-frames",
            "600",
        ],
    );
    assert_eq!(frames(&records), 600);
    assert_entry(&records, "observation.pos", DType::F64, &[2], 3);
    assert_entry(&records, "observation.count", DType::I64, &[], 3);
    assert_entry(&records, "observation.flags", DType::U8, &[3], 3);
    assert_entry(&records, "observation.inner.img", DType::U8, &[4, 4], 3);
    assert_entry(&records, "next.observation.inner.level", DType::I64, &[], 3);
    assert_entry(&records, "action", DType::I64, &[2], 3);
    assert!(records.iter().all(|r| !r.data.contains_key("observation")));
}

#[test]
fn an_env_the_nodes_cannot_build_fails_the_run_in_one_line_naming_the_node_and_the_env() {
    let Some(py) = venv_python() else { return };
    let mut cmd = Command::new(rollout_bin());
    cmd.args(["collect", "--launcher", "process", "--env", "NoSuchEnv-v0", "--quiet"])
        .args(["--node-command", &format!("{} -m rollout_node", py.display())])
        .args([
            "--frames-per-batch",
            "10",
            "--total-frames",
            "20",
            "--batch-timeout",
            "60",
        ]);
    let f = run_bounded(&mut cmd, DEADLINE).expect("start rollout collect");
    assert_eq!(f.code(), Some(1), "{}", f.stderr_text());
    let err = f.stderr_text();
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: "), "{err}");
    // Both nodes fail alike; whichever the trainer gives up on first is named.
    let names_a_node = last.contains("node 0") || last.contains("node 1");
    assert!(names_a_node && last.contains("NoSuchEnv-v0"), "{err}");
}
