//! The `rollout` command line, run as a child process.
//!
//! `cargo test` builds the binaries of the package under test only, and `rollout` belongs to
//! `rollout-cli`, so the first test to need it runs `cargo build -p rollout-cli --bin rollout`
//! with this test's own target dir and profile (derived from the test executable's path,
//! `<target>/<profile>/deps/cli-<hash>`). Every child is waited for with a deadline, then killed.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rollout::DType;
use rollout_tests::{rollout_bin, run_bounded, temp_file, OutputRecord};
use serde::de::IgnoredAny;
use serde::Deserialize;

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `rollout ARGS` with a deadline; panics if it does not end in time.
fn rollout(args: &[&str]) -> Run {
    let run = run_bounded(
        Command::new(rollout_bin()).args(args).env_remove("RUST_LOG"),
        RUN_TIMEOUT,
    )
    .expect("spawn rollout");
    let (stdout, stderr) = (run.stdout_text(), run.stderr_text());
    let Some(status) = run.status else {
        panic!(
            "`rollout {}` ran longer than {RUN_TIMEOUT:?}; stderr:\n{stderr}",
            args.join(" ")
        );
    };
    Run {
        code: status.code(),
        stdout,
        stderr,
    }
}

fn assert_ok(run: &Run, args: &str) {
    assert_eq!(run.code, Some(0), "`rollout {args}` failed; stderr:\n{}", run.stderr);
}

fn json_lines(run: &Run) -> Vec<serde_json::Value> {
    run.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Checks the batch lines and summary of a `--json` run; returns the batch lines.
fn check_json(run: &Run, batches: u64, frames_per_batch: u64) -> Vec<serde_json::Value> {
    let mut lines = json_lines(run);
    assert_eq!(lines.len() as u64, batches + 1, "stdout:\n{}", run.stdout);
    let summary = lines.pop().expect("summary");
    assert_eq!(summary["frames"], batches * frames_per_batch, "{summary}");
    assert_eq!(summary["batches"], batches, "{summary}");
    assert!(summary["seconds"].as_f64().is_some_and(|s| s >= 0.0), "{summary}");
    assert!(summary["fps"].as_f64().is_some_and(|f| f >= 0.0), "{summary}");
    for (i, l) in lines.iter().enumerate() {
        let obj = l.as_object().expect("object");
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            ["batch", "frames", "node", "policy_lag", "weights_version"],
            "{l}"
        );
        assert_eq!(l["batch"], i as u64, "{l}");
        assert_eq!(l["frames"], frames_per_batch, "{l}");
        assert!(l["weights_version"].is_u64(), "{l}");
    }
    lines
}

#[test]
fn help_lists_the_collect_subcommand() {
    let run = rollout(&["--help"]);
    assert_ok(&run, "--help");
    assert!(run.stdout.contains("collect"), "{}", run.stdout);
    let run = rollout(&["collect", "--help"]);
    assert_ok(&run, "collect --help");
    for flag in [
        "--frames-per-batch",
        "--total-frames",
        "--sync",
        "--json",
        "--output",
        "--launcher",
    ] {
        assert!(run.stdout.contains(flag), "{flag} missing from:\n{}", run.stdout);
    }
}

#[test]
fn json_async_yields_every_batch_then_a_summary() {
    let args = "collect --nodes 2 --frames-per-batch 100 --total-frames 1000 --seed 3 --json --quiet";
    let run = rollout(&args.split(' ').collect::<Vec<_>>());
    assert_ok(&run, args);
    let lines = check_json(&run, 10, 100);
    for l in &lines {
        assert!(
            l["node"].as_u64().is_some_and(|n| n < 2),
            "async batches name their node: {l}"
        );
    }
}

/// `--max-policy-lag 0` (issue 39): `rollout collect` stores a new version after each batch,
/// two nodes collect meanwhile, so batches lag and are dropped and asked again: every line
/// delivered says lag 0, and the run still yields exactly its frames. `--prefetch 1` too.
#[test]
fn json_lines_of_a_capped_prefetching_run_carry_no_lag_past_the_cap() {
    let args = "collect --nodes 2 --frames-per-batch 100 --total-frames 2000 --seed 3 --json --quiet \
                --max-policy-lag 0 --prefetch 1 --update-after-each-batch";
    let run = rollout(&args.split_whitespace().collect::<Vec<_>>());
    assert_ok(&run, args);
    let lines = check_json(&run, 20, 100);
    let versions: Vec<u64> = lines
        .iter()
        .map(|l| l["weights_version"].as_u64().expect("version"))
        .collect();
    assert!(lines.iter().all(|l| l["policy_lag"] == 0), "{lines:?}");
    assert!(
        versions.windows(2).all(|w| w[1] > w[0]),
        "a fresher version each batch: {versions:?}"
    );
}

#[test]
fn json_sync_batches_have_no_node() {
    let args = "collect --sync --nodes 2 --envs-per-node 2 --frames-per-batch 200 --total-frames 1000 --json --quiet";
    let run = rollout(&args.split(' ').collect::<Vec<_>>());
    assert_ok(&run, args);
    for l in check_json(&run, 5, 200) {
        assert!(l["node"].is_null(), "sync batches have node null: {l}");
    }
}

/// `--node-max-restarts` turns node supervision on; the run is the same when nothing fails.
#[test]
fn supervised_collection_runs_and_a_bad_restart_count_is_a_usage_error() {
    let args =
        "collect --sync --nodes 2 --frames-per-batch 100 --total-frames 500 --node-max-restarts 2 --json --quiet";
    let run = rollout(&args.split(' ').collect::<Vec<_>>());
    assert_ok(&run, args);
    check_json(&run, 5, 100);
    assert_usage_error(&["collect", "--node-max-restarts", "many"], "--node-max-restarts");
}

#[test]
fn human_summary_goes_to_stderr() {
    let args = "collect --nodes 1 --frames-per-batch 50 --total-frames 100 --quiet";
    let run = rollout(&args.split(' ').collect::<Vec<_>>());
    assert_ok(&run, args);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    let last = run.stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("100 frames") && last.contains("2 batches"),
        "{}",
        run.stderr
    );
}

/// Decodes every record of an `--output` file, checking field names on the way.
fn read_records(path: &Path) -> Vec<OutputRecord> {
    let bytes = std::fs::read(path).expect("read the output file");
    // Field names: every record is a map with exactly these keys, every tensor a map too.
    let mut cur = Cursor::new(&bytes[..]);
    let mut n = 0;
    while (cur.position() as usize) < bytes.len() {
        let rec: BTreeMap<String, IgnoredAny> = rmp_serde::from_read(&mut cur).expect("a record is a named map");
        assert_eq!(
            rec.keys().collect::<Vec<_>>(),
            [
                "batch",
                "data",
                "node",
                "policy_lag",
                "weights_version",
                "weights_versions"
            ]
        );
        n += 1;
    }
    assert_eq!(cur.position() as usize, bytes.len());
    #[derive(Deserialize)]
    struct Raw {
        data: BTreeMap<String, BTreeMap<String, IgnoredAny>>,
    }
    let mut cur = Cursor::new(&bytes[..]);
    for _ in 0..n {
        let raw: Raw = rmp_serde::from_read(&mut cur).expect("raw record");
        for (key, t) in &raw.data {
            assert_eq!(t.keys().collect::<Vec<_>>(), ["data", "dtype", "shape"], "{key}");
        }
    }
    let mut cur = Cursor::new(&bytes[..]);
    (0..n)
        .map(|_| rmp_serde::from_read(&mut cur).expect("typed record"))
        .collect()
}

/// Checks the CartPole keys of one record against the leading batch shape `lead`.
fn check_cartpole(rec: &OutputRecord, lead: &[usize]) {
    let with = |tail: &[usize]| [lead, tail].concat();
    let expect: [(&str, DType, Vec<usize>); 7] = [
        ("observation", DType::F32, with(&[4])),
        ("action", DType::I64, with(&[])),
        ("next.observation", DType::F32, with(&[4])),
        ("next.reward", DType::F32, with(&[1])),
        ("next.done", DType::Bool, with(&[1])),
        ("next.terminated", DType::Bool, with(&[1])),
        ("collector.traj_ids", DType::I64, with(&[])),
    ];
    for (key, dtype, shape) in expect {
        let t = rec
            .data
            .get(key)
            .unwrap_or_else(|| panic!("batch {} lacks `{key}`: {:?}", rec.batch, rec.data.keys()));
        assert_eq!(t.dtype(), dtype, "{key}");
        assert_eq!(t.shape(), &shape[..], "{key}");
    }
    for (key, t) in &rec.data {
        assert_eq!(&t.shape()[..lead.len()], lead, "{key}");
    }
}

#[test]
fn output_file_decodes_into_the_documented_records_async() {
    let file = temp_file("async.msgpack");
    let path = file.path().to_path_buf();
    let p = path.to_str().expect("utf-8 temp path");
    let args = [
        "collect",
        "--nodes",
        "2",
        "--envs-per-node",
        "2",
        "--frames-per-batch",
        "100",
        "--total-frames",
        "300",
        "--seed",
        "7",
        "--quiet",
        "--json",
        "--output",
        p,
    ];
    let run = rollout(&args);
    assert_ok(&run, &args.join(" "));
    let lines = check_json(&run, 3, 100);
    let records = read_records(&path);
    assert_eq!(records.len(), 3);
    for (i, (rec, line)) in records.iter().zip(&lines).enumerate() {
        assert_eq!(rec.batch, i as u64);
        assert!(rec.node.is_some_and(|n| n < 2));
        assert_eq!(
            rec.node.map(|n| n as u64),
            line["node"].as_u64(),
            "the file and stdout agree"
        );
        assert_eq!(rec.weights_version, line["weights_version"].as_u64().expect("u64"));
        check_cartpole(rec, &[2, 50]);
    }
}

#[test]
fn output_file_decodes_into_the_documented_records_sync() {
    let file = temp_file("sync.msgpack");
    let path = file.path().to_path_buf();
    let p = path.to_str().expect("utf-8 temp path");
    let args = [
        "collect",
        "--sync",
        "--nodes",
        "2",
        "--frames-per-batch",
        "200",
        "--total-frames",
        "400",
        "--policy",
        "random",
        "--quiet",
        "--output",
        p,
    ];
    let run = rollout(&args);
    assert_ok(&run, &args.join(" "));
    let records = read_records(&path);
    assert_eq!(records.len(), 2);
    for (i, rec) in records.iter().enumerate() {
        assert_eq!(rec.batch, i as u64);
        assert_eq!(rec.node, None, "sync records have node nil");
        check_cartpole(rec, &[2, 1, 100]);
        let obs = rec.data["observation"].as_f32().expect("f32");
        assert!(obs.iter().all(|x| x.is_finite()));
    }
}

/// Runs a bad command line: exit 2, one stderr line `error: ...` mentioning `needle`.
fn assert_usage_error(args: &[&str], needle: &str) {
    let run = rollout(args);
    let cmd = args.join(" ");
    assert_eq!(
        run.code,
        Some(2),
        "`rollout {cmd}` should exit 2; stderr:\n{}",
        run.stderr
    );
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "`rollout {cmd}`: one stderr line expected, got:\n{}",
        run.stderr
    );
    assert!(lines[0].starts_with("error: "), "{}", lines[0]);
    assert!(lines[0].contains(needle), "`{needle}` not in: {}", lines[0]);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
}

#[test]
fn bad_flags_exit_2_with_one_line() {
    assert_usage_error(&["collect", "--frames-per-batch", "0"], "frames_per_batch");
    assert_usage_error(
        &["collect", "--nodes", "3", "--sync", "--frames-per-batch", "100"],
        "frames_per_batch",
    );
    assert_usage_error(&["collect", "--env", "Nope"], "Nope");
    assert_usage_error(&["collect", "--policy", "nope"], "--policy");
    assert_usage_error(&["collect", "--env-config", "{not json"], "env_config");
    assert_usage_error(&["collect", "--total-frames", "-5"], "total_frames");
    assert_usage_error(&["collect", "--nodes", "0"], "nodes");
    assert_usage_error(&["collect", "--hidden", "8", "--policy", "linear"], "hidden");
    assert_usage_error(&["collect", "--heartbeat", "0"], "heartbeat");
    assert_usage_error(&["collect", "--sync", "--prefetch", "1"], "prefetch");
    assert_usage_error(&["collect", "--sync", "--max-policy-lag", "1"], "max_policy_lag");
    assert_usage_error(&["collect", "--deliver-lagging"], "deliver_lagging");
    // Only remote nodes have heartbeats: checked with a remote launcher.
    assert_usage_error(
        &[
            "collect",
            "--launcher",
            "process",
            "--heartbeat",
            "2",
            "--heartbeat-timeout",
            "1",
        ],
        "heartbeat",
    );
}

/// `collect --checkpoint` stopped after 5 batches (checkpoint after 4), then `--resume` with
/// the full total: the output file is cut back to the 4 checkpointed batches and the rest is
/// appended, so it is byte for byte the file of the run that never stopped (sync, seed).
#[test]
fn collect_checkpoint_and_resume_write_the_uninterrupted_output_file() {
    let dir = rollout_tests::temp_dir("cli-collect-ckpt");
    let (whole, part, ck) = (
        dir.path().join("whole.msgpack"),
        dir.path().join("part.msgpack"),
        dir.path().join("run.ckpt"),
    );
    let s = |p: &std::path::Path| p.to_str().expect("utf-8").to_string();
    let base = "collect --sync --nodes 2 --envs-per-node 2 --frames-per-batch 100 --seed 3 --quiet";
    let with = |extra: String| -> Vec<String> { format!("{base} {extra}").split(' ').map(str::to_string).collect() };
    let go = |a: Vec<String>| rollout(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let r = go(with(format!("--total-frames 1000 --output {}", s(&whole))));
    assert_ok(&r, "whole");
    let r = go(with(format!(
        "--total-frames 500 --output {} --checkpoint {} --checkpoint-every 2",
        s(&part),
        s(&ck)
    )));
    assert_ok(&r, "stopped");
    assert!(std::fs::metadata(&part).expect("part").len() < std::fs::metadata(&whole).expect("whole").len());
    let r = go(with(format!(
        "--total-frames 1000 --output {} --resume {}",
        s(&part),
        s(&ck)
    )));
    assert_ok(&r, "resumed");
    assert!(r.stderr.contains("collected 600 frames"), "{}", r.stderr);
    assert_eq!(
        std::fs::read(&part).expect("part"),
        std::fs::read(&whole).expect("whole"),
        "the resumed output is the uninterrupted one"
    );
    // Bad resumes: one line, exit 2.
    std::fs::write(dir.path().join("junk"), b"junk").expect("write");
    assert_usage_error(&["collect", "--resume", &s(&dir.path().join("junk"))], "resume");
    assert_usage_error(&["collect", "--resume", &s(&dir.path().join("missing"))], "resume");
    assert_usage_error(&["collect", "--checkpoint-every", "0"], "checkpoint_every");
    std::fs::write(dir.path().join("short"), b"").expect("write");
    let args = with(format!(
        "--total-frames 1000 --output {} --resume {}",
        s(&dir.path().join("short")),
        s(&ck)
    ));
    assert_usage_error(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        "not the run's output file",
    );
    let other = format!(
        "collect --sync --nodes 2 --envs-per-node 2 --frames-per-batch 200 --total-frames 1000 --resume {}",
        s(&ck)
    );
    assert_usage_error(&other.split(' ').collect::<Vec<_>>(), "`frames_per_batch`");
}
