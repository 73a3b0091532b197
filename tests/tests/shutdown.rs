//! Shutdown is prompt whatever the batch size: a node stops its env workers between
//! steps, so a batch in flight (here one that would take minutes) holds nothing back.
//! In-process nodes, node processes, and `rollout collect` interrupted by a signal.
//!
//! Each test waits for its nodes to be collecting (their threads or processes burning
//! CPU, which waiting for work does not), then stops the run and times the stop.

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rollout::PolicyConfig;
use rollout_actors::{CollectorBuilder, DistributedCollector, Launcher};
use rollout_tests::{alive, rollout_bin, signal, wait_until, wait_with_deadline};

/// How long anything before the stop may take (building, starting node processes).
const SETUP: Duration = Duration::from_secs(120);
/// How long a stop may take: a few heartbeats, far below one batch.
const PROMPT: Duration = Duration::from_secs(3);
/// CPU seconds that show env workers stepping (starting and waiting use far less).
const BUSY: f64 = 1.0;
/// Frames per node's batch: Pendulum stepped by a 256-256 MLP, minutes in a debug
/// build, tens of seconds in a release one.
const HUGE_BATCH: usize = 400_000;

/// CPU time process `pid` (`"self"` for this one) used so far, user and system, in seconds.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime is field 14, stime 15.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks = |i: usize| fields.get(i - 3).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // Linux reports in USER_HZ, 100 per second on every architecture it supports.
    (ticks(14) + ticks(15)) as f64 / 100.0
}

/// Pendulum stepped by a 256-256 MLP, two nodes, batches that take minutes.
fn huge_batches() -> CollectorBuilder {
    DistributedCollector::builder()
        .env("Pendulum-v1")
        .policy(PolicyConfig::Mlp { hidden: vec![256, 256] })
        .nodes(2)
        .frames_per_batch(HUGE_BATCH)
        .total_frames(-1)
        .batch_timeout(Duration::from_secs(600))
        .seed(1)
}

/// Starts `c` waiting for a batch on a thread, waits until the nodes burn CPU (summed
/// over `pids`, `"self"` for in-process nodes), cancels the wait and shuts down: returns
/// how long the shutdown took.
fn stop_mid_batch(c: DistributedCollector, pids: &[String]) -> Duration {
    let handle = c.handle();
    let cpu = || pids.iter().map(|p| cpu_seconds(p)).sum::<f64>();
    let before = cpu();
    let waiting = thread::spawn(move || {
        let mut c = c;
        let got = c.next_batch();
        (c, got)
    });
    wait_until(Instant::now() + SETUP, "the nodes to collect", || {
        cpu() - before >= BUSY
    });
    let stop = Instant::now();
    handle.cancel_next_batch().expect("cancel the wait");
    let (mut c, got) = waiting.join().expect("the waiting thread");
    assert!(matches!(got, Ok(None)), "a cancelled wait ends with None: {got:?}");
    let shutdown = Instant::now();
    c.shutdown().expect("shutdown");
    let took = shutdown.elapsed();
    assert!(
        stop.elapsed() < PROMPT,
        "cancel and shutdown took {:?} ({took:?} in shutdown) with a batch in flight",
        stop.elapsed()
    );
    took
}

#[test]
fn shutdown_with_a_huge_batch_in_flight_is_prompt_in_process() {
    let c = huge_batches().build().expect("valid");
    let took = stop_mid_batch(c, &["self".to_string()]);
    eprintln!("in-process shutdown with a batch in flight: {took:?}");
}

#[test]
fn shutdown_with_a_huge_batch_in_flight_is_prompt_and_node_processes_exit() {
    let c = huge_batches()
        .launcher(Launcher::Process)
        .node_program(rollout_bin())
        .build()
        .expect("valid");
    let pids = c.node_pids();
    assert_eq!(pids.len(), 2, "two node processes");
    let names: Vec<String> = pids.iter().map(u32::to_string).collect();
    let took = stop_mid_batch(c, &names);
    // The shutdown reaps them (killing only past `shutdown_timeout`, 10 s): gone by now,
    // having stopped by themselves.
    assert!(pids.iter().all(|&p| !alive(p)), "node processes left: {pids:?}");
    eprintln!("process nodes' shutdown with a batch in flight: {took:?}");
}

/// The children of process `pid`.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
fn rollout_collect_stops_promptly_on_sigint_and_sigterm_with_a_huge_batch_in_flight() {
    for (launcher, sig, code) in [("local", "INT", 130), ("process", "TERM", 143)] {
        let frames = HUGE_BATCH.to_string();
        let mut child = Command::new(rollout_bin())
            .args([
                "collect",
                "--env",
                "Pendulum-v1",
                "--policy",
                "mlp",
                "--hidden",
                "256,256",
            ])
            .args(["--nodes", "2", "--frames-per-batch", &frames, "--total-frames", "-1"])
            .args(["--batch-timeout", "600", "--launcher", launcher, "--json"])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rollout collect");
        let pid = child.id();
        // Local nodes step on the process's own threads; process nodes are its children.
        let busy = || match launcher {
            "local" => cpu_seconds(&pid.to_string()),
            _ => children(pid).iter().map(|c| cpu_seconds(&c.to_string())).sum(),
        };
        wait_until(Instant::now() + SETUP, "the nodes to collect", || busy() >= BUSY);
        let nodes = children(pid);
        let stop = Instant::now();
        signal(pid, sig);
        let status = wait_with_deadline(&mut child, SETUP);
        let took = stop.elapsed();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        assert_eq!(status.and_then(|s| s.code()), Some(code), "{launcher}, SIG{sig}: {err}");
        assert!(
            took < PROMPT,
            "{launcher}: SIG{sig} to exit took {took:?}; stderr:\n{err}"
        );
        assert!(err.contains(&format!("interrupted by SIG{sig}")), "{err}");
        assert!(
            nodes.iter().all(|&p| !alive(p)),
            "{launcher}: node processes left: {nodes:?}"
        );
        eprintln!("rollout collect ({launcher}), SIG{sig} to exit: {took:?}");
    }
}
