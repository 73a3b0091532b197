//! Shutdown is prompt whatever the batch size: a node stops its env workers between
//! steps, so a batch in flight (here one that would take minutes) holds nothing back.
//! In-process nodes, node processes, and `rollout collect` interrupted by a signal:
//! also Ctrl-C as a terminal sends it, SIGINT to the whole foreground process group,
//! which the node processes (groups of their own) must not take; and a trainer killed,
//! whose node processes must not outlive it.
//!
//! Each test waits for its nodes to be collecting (their threads or processes burning
//! CPU, which waiting for work does not), then stops the run and times the stop.

use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rollout::PolicyConfig;
use rollout_actors::{CollectorBuilder, DistributedCollector, Launcher};
use rollout_tests::{
    alive, process_group, rollout_bin, signal, signal_group, temp_dir, venv_python, wait_for, wait_until,
    wait_with_deadline, Running,
};

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

/// Kills the processes it holds (SIGKILL) when dropped, so that a failing test leaves no
/// node process behind; those already gone are skipped.
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if alive(pid) {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            }
        }
    }
}

/// `rollout collect --launcher process` leading a process group of its own (as a shell
/// makes a foreground job), collecting Pendulum with an endless run of 4,000-frame
/// batches on two nodes started by `node_command` (`None`: `rollout node`), with
/// `--json` batch lines on stdout.
fn collect_in_own_group(node_command: Option<&str>) -> Running {
    let mut cmd = Command::new(rollout_bin());
    cmd.args([
        "collect",
        "--env",
        "Pendulum-v1",
        "--policy",
        "mlp",
        "--hidden",
        "64,64",
    ])
    .args(["--nodes", "2", "--frames-per-batch", "4000", "--total-frames", "-1"])
    .args(["--batch-timeout", "600", "--launcher", "process", "--json"])
    .env_remove("RUST_LOG")
    .process_group(0);
    if let Some(c) = node_command {
        cmd.args(["--node-command", c]);
    }
    Running::spawn(&mut cmd).expect("spawn rollout collect")
}

/// `rollout collect` in a group of its own, once it printed a batch: it, its pid, and its
/// two node processes.
fn collecting_with_two_node_processes(node_command: Option<&str>) -> (Running, u32, Vec<u32>) {
    let mut cli = collect_in_own_group(node_command);
    let pid = cli.id();
    cli.wait_stdout("a first batch line", SETUP, |l| {
        l.starts_with("{\"batch\":").then_some(())
    });
    let nodes = children(pid);
    if nodes.len() != 2 {
        drop(KillOnDrop(nodes.clone()));
        panic!("two node processes expected: {nodes:?}");
    }
    (cli, pid, nodes)
}

/// Ctrl-C in a terminal is SIGINT to its whole foreground group: `rollout collect` and,
/// unless they are in a group of their own, its node processes. The nodes must not take
/// it (each would leave the run first); `rollout collect` stops them itself, exits 130,
/// and leaves none behind.
fn sigint_to_the_group_stops_the_run_and_its_node_processes(node_command: Option<&str>) {
    let (cli, pid, nodes) = collecting_with_two_node_processes(node_command);
    let _guard = KillOnDrop(nodes.clone());
    for &n in &nodes {
        assert_ne!(
            process_group(n),
            Some(pid),
            "node process {n} is in the terminal's group"
        );
    }
    let stop = Instant::now();
    signal_group(pid, "INT");
    let run = cli.finish(SETUP);
    let took = stop.elapsed();
    let err = run.stderr_text();
    assert_eq!(run.code(), Some(130), "stderr:\n{err}");
    assert!(err.contains("interrupted by SIGINT"), "{err}");
    assert!(!err.contains("the node left"), "no node left the run on its own: {err}");
    wait_until(Instant::now() + PROMPT, "the node processes to exit", || {
        nodes.iter().all(|&n| !alive(n))
    });
    eprintln!("rollout collect, SIGINT to its group to exit: {took:?}");
}

#[test]
fn sigint_to_the_terminals_group_stops_rollout_collect_and_its_rollout_node_processes() {
    sigint_to_the_group_stops_the_run_and_its_node_processes(None);
}

#[test]
fn sigint_to_the_terminals_group_stops_rollout_collect_and_its_python_node_processes() {
    let Some(python) = venv_python() else { return };
    let command = format!("{} -m rollout_node", python.display());
    sigint_to_the_group_stops_the_run_and_its_node_processes(Some(&command));
}

/// SIGKILL to `rollout collect`: nothing of the trainer's runs after it, no shutdown is
/// sent. Its node processes see the connection close (their heartbeat deadline is the
/// backstop) and exit.
fn a_killed_trainer_leaves_no_node_process_behind(node_command: Option<&str>) {
    let (cli, pid, nodes) = collecting_with_two_node_processes(node_command);
    let _guard = KillOnDrop(nodes.clone());
    let kill = Instant::now();
    signal(pid, "KILL");
    let run = cli.finish(SETUP);
    assert_eq!(run.status.and_then(|s| s.code()), None, "killed");
    wait_until(Instant::now() + PROMPT, "the node processes to exit", || {
        nodes.iter().all(|&n| !alive(n))
    });
    eprintln!(
        "node processes gone {:?} after their trainer was killed",
        kill.elapsed()
    );
}

#[test]
fn a_killed_rollout_collect_leaves_no_rollout_node_process_behind() {
    a_killed_trainer_leaves_no_node_process_behind(None);
}

#[test]
fn a_killed_rollout_collect_leaves_no_python_node_process_behind() {
    let Some(python) = venv_python() else { return };
    let command = format!("{} -m rollout_node", python.display());
    a_killed_trainer_leaves_no_node_process_behind(Some(&command));
}

#[test]
fn sigint_while_the_node_processes_start_ends_the_run_once_they_joined() {
    // Each node is a shell that notes its pid, waits for the file `go`, then becomes
    // `rollout node`: the test signals while `rollout collect` waits for them to join,
    // then lets them join. Dying there (SIGINT's default) would leave them retrying to
    // reach a trainer that is gone.
    let dir = temp_dir("sigint-at-start");
    let (marks, go) = (dir.path().join("marks"), dir.path().join("go"));
    std::fs::create_dir_all(&marks).expect("make the marks folder");
    let script = format!(
        "echo $$ > {marks}/$$; while [ ! -e {go} ]; do sleep 0.02; done; exec {bin} node \"$@\"",
        marks = marks.display(),
        go = go.display(),
        bin = rollout_bin().display(),
    );
    let command = format!("sh -c '{script}' node");
    let mut cli = collect_in_own_group(Some(&command));
    let pid = cli.id();
    let nodes: Vec<u32> = wait_for(Instant::now() + SETUP, "both nodes to start", || {
        let pids: Vec<u32> = std::fs::read_dir(&marks)
            .ok()?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        (pids.len() == 2).then_some(pids)
    });
    let _guard = KillOnDrop(nodes.clone());
    signal_group(pid, "INT");
    cli.wait_stderr("the signal caught", SETUP, |l| {
        l.starts_with("SIGINT: stopping").then_some(())
    });
    std::fs::write(&go, b"").expect("write go");
    let run = cli.finish(SETUP);
    let err = run.stderr_text();
    assert_eq!(run.code(), Some(130), "stderr:\n{err}");
    assert!(err.contains("interrupted by SIGINT"), "{err}");
    assert!(!run.stdout_text().contains("\"batch\""), "no batch after the signal");
    wait_until(Instant::now() + PROMPT, "the node processes to exit", || {
        nodes.iter().all(|&n| !alive(n))
    });
}
