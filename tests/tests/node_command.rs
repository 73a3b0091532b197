//! The `Process` launcher starting any node command: Python nodes (`python -m
//! rollout_node`, from the venv scripts/test.sh makes) started by `rollout collect
//! --node-command` and by the builder's `node_command`, with the flags and token the
//! launcher gives `rollout node`; a Python node killed mid-run is replaced; no node
//! process outlives the run; a command that cannot start is a config error.
//!
//! The nodes run through `env` with a space and a quote in two of the command's words
//! (see [`MarkedPythonNodes`]): the words reach the node as they were given.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rollout::PolicyConfig;
use rollout_actors::{DistributedCollector, Launcher};
use rollout_tests::{
    alive, read_output, rollout_bin, run_bounded, signal, temp_dir, venv_python, wait_until, MarkedPythonNodes,
};

const DEADLINE: Duration = Duration::from_secs(120);

/// `rollout collect --launcher process --node-command ...` with `extra` flags.
fn collect(command: &str, extra: &[&str]) -> rollout_tests::Finished {
    let mut c = Command::new(rollout_bin());
    c.args(["collect", "--launcher", "process", "--node-command", command, "--quiet"])
        .args(extra);
    run_bounded(&mut c, DEADLINE).expect("run rollout collect")
}

/// Asserts each of `pids` is gone (not running, not a zombie).
fn assert_reaped(pids: impl IntoIterator<Item = u32>) {
    for pid in pids {
        assert!(!alive(pid), "node process {pid} outlived the run");
    }
}

#[test]
fn cli_collects_exact_frames_from_python_nodes_it_started() {
    let Some(py) = venv_python() else { return };
    let dir = temp_dir("node-command-cli");
    let nodes = MarkedPythonNodes::new(&dir.path().join("root"));
    let out = dir.path().join("out.msgpack");
    let run = collect(
        &nodes.shell_command(&py),
        &[
            "--env",
            "CartPole-v1",
            "--nodes",
            "2",
            "--envs-per-node",
            "2",
            "--frames-per-batch",
            "200",
            "--total-frames",
            "3000",
            "--seed",
            "5",
            "--output",
            out.to_str().expect("utf-8 path"),
        ],
    );
    assert_eq!(run.code(), Some(0), "rollout collect failed:\n{}", run.stderr_text());
    let records = read_output(&out);
    let frames: usize = records
        .iter()
        // `collector.traj_ids` has the batch's shape: one id per frame.
        .map(|r| {
            r.data
                .get("collector.traj_ids")
                .expect("traj ids")
                .shape()
                .iter()
                .product::<usize>()
        })
        .sum();
    assert_eq!(frames, 3000, "exact frames");
    assert!(records.iter().any(|r| r.node == Some(0)) && records.iter().any(|r| r.node == Some(1)));
    // Both nodes were the marked Python nodes, given the flags `rollout node` gets.
    let marks = nodes.marks();
    assert_eq!(marks.len(), 2, "one Python process per node: {marks:?}");
    let mut indices: Vec<&str> = marks.iter().filter_map(|m| m.flag("--index")).collect();
    indices.sort_unstable();
    assert_eq!(indices, ["0", "1"], "{marks:?}");
    for m in &marks {
        assert_eq!(m.flag("--import"), Some("rollout_mark"), "{m:?}");
        assert!(m.flag("--join").is_some_and(|a| a.starts_with("127.0.0.1:")), "{m:?}");
        assert_eq!(
            m.flag("--name").map(str::to_string),
            m.flag("--index").map(|i| format!("process-{i}")),
            "{m:?}"
        );
        assert!(
            !m.args.iter().any(|a| a.contains("token")),
            "no token on the command line: {m:?}"
        );
    }
    assert_reaped(marks.iter().map(|m| m.pid));
}

#[test]
fn cli_a_command_that_cannot_start_is_exit_2_naming_node_command() {
    for (command, why) in [
        ("/nonexistent/python -m rollout_node", "No such file"),
        ("python -m 'rollout_node", "unclosed quote"),
        ("''", "empty"),
    ] {
        let run = collect(command, &["--env", "CartPole-v1", "--total-frames", "100"]);
        let err = run.stderr_text();
        assert_eq!(run.code(), Some(2), "{command:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(
            err.contains("`node_command`") && err.contains(why),
            "{command:?}: {err}"
        );
    }
    let run = Command::new(rollout_bin())
        .args(["collect", "--node-command", "python -m rollout_node", "--quiet"])
        .output()
        .expect("run rollout collect");
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(err.contains("`node_command`") && err.contains("only used by"), "{err}");
}

#[test]
fn cli_a_node_command_that_exits_before_joining_ends_the_wait_at_once() {
    let Some(py) = venv_python() else { return };
    let t = Instant::now();
    let command = format!("'{}' -m no_such_node_module", py.display());
    let run = collect(&command, &["--env", "CartPole-v1", "--join-timeout", "60"]);
    let err = run.stderr_text();
    assert_eq!(run.code(), Some(1), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "seen early, not at the deadline: {:?}",
        t.elapsed()
    );
    assert!(
        err.contains("No module named no_such_node_module"),
        "the node's stderr: {err}"
    );
    assert!(
        err.contains("node process 0") && err.contains("exited") && err.contains("before joining"),
        "{err}"
    );
}

fn python_builder(py: &Path, nodes: &MarkedPythonNodes, sync: bool, total: i64) -> rollout_actors::CollectorBuilder {
    DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .nodes(2)
        .frames_per_batch(100)
        .total_frames(total)
        .sync(sync)
        .seed(3)
        .launcher(Launcher::Process)
        .node_command(nodes.command(py))
        .heartbeat(Duration::from_millis(200), Duration::from_secs(2))
        .node_max_restarts(3)
        .node_restart_window(Duration::from_secs(60))
        .join_timeout(DEADLINE)
        .batch_timeout(DEADLINE)
}

/// Sync (every batch needs both nodes): node 1's Python process is SIGKILLed after the
/// second batch; the run completes with exact frames only if supervision started a new one.
#[test]
fn a_python_node_killed_mid_run_is_replaced_and_the_run_completes_exactly() {
    let Some(py) = venv_python() else { return };
    let dir = temp_dir("node-command-kill");
    let nodes = MarkedPythonNodes::new(&dir.path().join("root"));
    let mut c = python_builder(&py, &nodes, true, 2000).build().expect("collector");
    let pids = c.node_pids();
    assert_eq!(pids.len(), 2);
    for p in &pids {
        assert!(
            nodes.marks().iter().any(|m| m.pid == *p),
            "node {p} is a marked Python node"
        );
    }
    let mut frames = 0;
    let mut batches = 0;
    while let Some(b) = c.next_batch().expect("batch") {
        frames += b.data.numel();
        batches += 1;
        if batches == 2 {
            signal(pids[1], "KILL");
        }
    }
    assert_eq!(frames, 2000, "exact frames");
    let stats = c.stats().expect("stats");
    assert_eq!(stats.restarts, [0, 1], "{stats:?}");
    let now = c.node_pids();
    assert_eq!(now[0], pids[0]);
    assert_ne!(now[1], pids[1], "node 1 runs in a new process");
    let new = nodes
        .marks()
        .into_iter()
        .find(|m| m.pid == now[1])
        .expect("the new node is a marked Python node");
    assert_eq!(new.flag("--index"), Some("1"), "it rejoins node 1's slot: {new:?}");
    c.shutdown().expect("shutdown");
    assert_reaped(nodes.marks().iter().map(|m| m.pid));
}

/// Dropping a collector mid-run (no shutdown) still reaps its Python node processes.
#[test]
fn dropping_a_collector_of_python_nodes_reaps_them() {
    let Some(py) = venv_python() else { return };
    let dir = temp_dir("node-command-drop");
    let nodes = MarkedPythonNodes::new(&dir.path().join("root"));
    let mut c = python_builder(&py, &nodes, false, -1).build().expect("collector");
    c.next_batch().expect("batch").expect("endless");
    let pids = c.node_pids();
    drop(c);
    let end = Instant::now() + Duration::from_secs(30);
    wait_until(end, "the node processes are gone", || pids.iter().all(|p| !alive(*p)));
    assert_reaped(pids);
}

#[test]
fn an_empty_node_command_is_a_config_error() {
    let err = DistributedCollector::builder()
        .env("CartPole-v1")
        .frames_per_batch(10)
        .launcher(Launcher::Process)
        .node_command(Vec::<String>::new())
        .build()
        .expect_err("nothing to run")
        .to_string();
    assert!(err.contains("`node_command`") && err.contains("empty"), "{err}");
}
