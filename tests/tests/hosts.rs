//! A trainer and its nodes on different hosts: network namespaces on one bridge made by
//! `scripts/hosts.sh` (host 0 at 10.77.0.1 runs `rollout collect`, hosts 1 and 2 at
//! 10.77.0.2 and .3 run `rollout node`), with faults between them: a host cut off for
//! longer and for shorter than the heartbeat timeout (sync, and async where the other node
//! must carry on meanwhile), a slow link, random packet loss,
//! and with SLURM across the hosts, a node host that dies mid-run. Every run ends with
//! exact frames and unique trajectory ids, and exits 0.
//!
//! Real processes, sockets, packets and SLURM daemons; the hosts share this machine's file
//! system (the token file is on it, as on a cluster's shared file system). Needs root
//! (CI runs as root, `scripts/test.sh` installs nftables, iproute2 and SLURM): otherwise
//! these tests FAIL saying so. They share the hosts, so they take turns: under `cargo test`
//! (threads of one process) the [`Hosts`] guard holds the process's turn, under nextest
//! (a process per test) the test group `hosts` of .config/nextest.toml runs one at a time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rollout::rollout::keys;
use rollout_tests::{
    assert_unique_traj_ids_in_records, hosts_sh, read_output, rollout_bin, run_bounded, temp_dir, wait_until,
    HostProcess, Hosts, HostsTurn, HOSTS_SLURM_CONF,
};
use tempfile::TempDir;

/// Bound on joins, on a whole run, on a process's exit.
const DEADLINE: Duration = Duration::from_secs(60);
/// The trainer's port on host 0 (the namespace is this test's own).
const PORT: u16 = 7700;
/// Frames per batch: a sync batch is 100 frames of each of the 2 nodes.
const FRAMES_PER_BATCH: u64 = 200;
/// Packets a short cut drops before it is undone: heartbeats both ways every 0.25 s and
/// their retransmissions, about a second and a half of silence.
const SHORT_CUT_DROPS: u64 = 10;
/// A short cut is undone by then at the latest, well inside its 5 s heartbeat timeout.
const SHORT_CUT_MAX: Duration = Duration::from_secs(4);
/// How late the test may read a line the trainer printed: a line is timed when the test's
/// reader takes it from the pipe, so on a loaded machine batches that arrived just before
/// a cut are read (and timed) after it. What a cut must show is counted from this long after
/// it.
const READ_LAG: Duration = Duration::from_millis(300);

/// A token file in `dir`: mode 0600, 33 bytes.
fn token_file(dir: &TempDir) -> PathBuf {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.path().join("token");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .expect("token file");
    f.write_all(b"hosts-test-token-0123456789abcdef")
        .expect("write the token");
    path
}

/// How a test's run is collected.
struct RunSpec {
    /// Sync rounds (a batch is both nodes' shares) or async batches (one node's each).
    sync: bool,
    total_frames: u64,
    heartbeat: &'static str,
    heartbeat_timeout: &'static str,
}

/// `rollout collect` on host 0: CartPole on 2 nodes (sync unless `spec` says async),
/// `--json` lines on stdout, every batch in `dir/out.msgpack`, info logs on stderr;
/// `launcher` flags appended.
fn trainer(hosts: &Hosts, dir: &TempDir, spec: &RunSpec, launcher: &[String]) -> HostProcess {
    let out = dir.path().join("out.msgpack");
    let total = spec.total_frames.to_string();
    let fpb = FRAMES_PER_BATCH.to_string();
    let mut c = hosts.command(0, rollout_bin());
    c.args(["collect", "--env", "CartPole-v1", "--nodes", "2", "--seed", "0"])
        .args(spec.sync.then_some("--sync"))
        .args(["--frames-per-batch", &fpb, "--total-frames", &total])
        .args([
            "--heartbeat",
            spec.heartbeat,
            "--heartbeat-timeout",
            spec.heartbeat_timeout,
        ])
        .args(["--join-timeout", "30", "--batch-timeout", "60", "--json", "-q"])
        .arg("--output")
        .arg(&out)
        .args(launcher)
        .env("RUST_LOG", "info")
        // The SLURM commands of the `slurm` launcher: the cluster across the hosts, not
        // the machine's one-node cluster of scripts/slurm-local.sh.
        .env("SLURM_CONF", HOSTS_SLURM_CONF);
    HostProcess::spawn("the trainer on host 0", &mut c)
}

/// `--launcher external` on host 0's address, with the token file.
fn external(token: &Path) -> Vec<String> {
    vec![
        "--launcher".into(),
        "external".into(),
        "--listen".into(),
        format!("10.77.0.1:{PORT}"),
        "--token-file".into(),
        token.display().to_string(),
    ]
}

/// `rollout node --join 10.77.0.1:PORT --index index` on host `host`.
fn node(hosts: &Hosts, host: usize, index: usize, token: &Path) -> HostProcess {
    let mut c = hosts.command(host, rollout_bin());
    c.args(["node", "--join", &format!("{}:{PORT}", hosts.addr(0))])
        .arg("--token-file")
        .arg(token)
        .args(["--index", &index.to_string()]);
    HostProcess::spawn(&format!("node {index} on host {host}"), &mut c)
}

/// The `--json` batch lines of the trainer so far, with when each arrived.
fn batch_lines(t: &HostProcess) -> Vec<Instant> {
    node_batches(t).into_iter().map(|(at, _)| at).collect()
}

/// The trainer's `--json` batch lines so far: when each arrived, and the node it came
/// from (async; `None` for a sync batch, which is every node's).
fn node_batches(t: &HostProcess) -> Vec<(Instant, Option<usize>)> {
    t.stdout_lines()
        .into_iter()
        .filter(|(_, l)| l.starts_with("{\"batch\""))
        .map(|(at, l)| {
            let node = l
                .split("\"node\":")
                .nth(1)
                .and_then(|rest| rest.split([',', '}']).next())
                .and_then(|n| n.trim().parse().ok());
            (at, node)
        })
        .collect()
}

/// Waits for the trainer's first batch: every node joined and the run is under way.
fn wait_first_batch(t: &mut HostProcess) {
    t.wait_stdout("first batch", DEADLINE, |lines| {
        lines.iter().any(|(_, l)| l.starts_with("{\"batch\""))
    });
}

/// The end of every run: the trainer exits 0, its summary and its output file hold
/// exactly `total` frames, every trajectory id is one lane's consecutive steps.
fn assert_exact_run(t: &mut HostProcess, dir: &TempDir, total: u64) {
    let code = t.exit_code(DEADLINE);
    assert_eq!(code, Some(0), "the trainer failed; stderr:\n{}", t.stderr_text());
    let lines = t.stdout_lines();
    let summary = &lines.last().expect("a summary line").1;
    assert!(summary.contains(&format!("\"frames\":{total},")), "summary {summary}");
    let records = read_output(&dir.path().join("out.msgpack"));
    let frames: usize = records.iter().map(|r| r.data[keys::TRAJ_IDS].len()).sum();
    assert_eq!(
        frames as u64, total,
        "the output file holds exactly the frames asked for"
    );
    assert_eq!(records.len() as u64, total / FRAMES_PER_BATCH, "whole batches");
    assert_unique_traj_ids_in_records(&records);
}

/// How many lines of `text` contain every one of `parts`.
fn count_lines(text: &str, parts: &[&str]) -> usize {
    text.lines().filter(|l| parts.iter().all(|p| l.contains(p))).count()
}

#[test]
fn a_host_cut_off_past_the_heartbeat_timeout_rejoins_and_the_run_completes_exactly() {
    let hosts = Hosts::up(3);
    let dir = temp_dir("hosts-long-cut");
    let token = token_file(&dir);
    let spec = RunSpec {
        sync: true,
        total_frames: 300 * FRAMES_PER_BATCH,
        heartbeat: "0.25",
        heartbeat_timeout: "3",
    };
    let mut t = trainer(&hosts, &dir, &spec, &external(&token));
    let mut n1 = node(&hosts, 1, 1, &token);
    let mut n2 = node(&hosts, 2, 0, &token);
    wait_first_batch(&mut t);

    hosts.cut(1);
    let cut_at = Instant::now();
    let before = batch_lines(&t).len();
    assert!(
        (before as u64) < spec.total_frames / FRAMES_PER_BATCH,
        "the run ended before the cut"
    );
    // Both sides see the silence past 3 s: the node gives up on the trainer (its
    // supervisor, here the test, starts it again), the trainer waits for it to rejoin.
    let code = n1.exit_code(Duration::from_secs(20));
    assert_ne!(code, Some(0), "node 1 cut off does not exit as if shut down");
    assert!(n1.stderr_text().contains("lost the trainer"), "{}", n1.stderr_text());
    t.wait_stderr("node 1 restarting", DEADLINE, &["restarting node", "node=1"]);
    let silent = cut_at.elapsed();
    assert!(
        silent >= Duration::from_secs(3),
        "lost after {silent:?}, before the timeout"
    );
    let mut n1 = node(&hosts, 1, 1, &token);
    let during = batch_lines(&t).len() - before;
    // A sync round needs node 1's share: at most the round in flight at the cut completes
    // (and a line written just before the cut, read just after).
    assert!(during <= 2, "{during} sync batches while node 1 was cut off");
    assert!(hosts.dropped(1) > 0, "the cut dropped nothing");
    hosts.restore(1);
    let restored_at = Instant::now();

    assert_exact_run(&mut t, &dir, spec.total_frames);
    let after = batch_lines(&t).iter().filter(|at| **at > restored_at).count();
    assert!(after > 0, "no batch after node 1 came back");
    let log = t.stderr_text();
    assert_eq!(
        count_lines(&log, &["restarting node", "node=1"]),
        1,
        "one restart of node 1:\n{log}"
    );
    assert_eq!(
        count_lines(&log, &["restarting node"]),
        1,
        "node 0 never restarted:\n{log}"
    );
    assert_eq!(count_lines(&log, &["node rejoined", "node=1"]), 1, "{log}");
    assert_eq!(n1.exit_code(DEADLINE), Some(0), "{}", n1.stderr_text());
    assert_eq!(n2.exit_code(DEADLINE), Some(0), "{}", n2.stderr_text());
}

#[test]
fn a_host_cut_off_for_less_than_the_heartbeat_timeout_loses_nothing_and_restarts_nothing() {
    let hosts = Hosts::up(3);
    let dir = temp_dir("hosts-short-cut");
    let token = token_file(&dir);
    let spec = RunSpec {
        sync: true,
        total_frames: 300 * FRAMES_PER_BATCH,
        heartbeat: "0.25",
        heartbeat_timeout: "5",
    };
    let mut t = trainer(&hosts, &dir, &spec, &external(&token));
    let mut n1 = node(&hosts, 1, 1, &token);
    let mut n2 = node(&hosts, 2, 0, &token);
    wait_first_batch(&mut t);

    hosts.cut(1);
    let cut_at = Instant::now();
    let before = batch_lines(&t).len();
    assert!(
        (before as u64) < spec.total_frames / FRAMES_PER_BATCH,
        "the run ended before the cut"
    );
    // The fault itself: silence until the cut has dropped a second and a half of
    // packets, well inside the 5 s timeout.
    wait_until(cut_at + SHORT_CUT_MAX, "packets of host 1 dropped by the cut", || {
        hosts.dropped(1) >= SHORT_CUT_DROPS
    });
    let during = batch_lines(&t).len() - before;
    // As above: the run stalls for the cut.
    assert!(during <= 2, "{during} sync batches while node 1 was cut off");
    hosts.restore(1);
    let restored_at = Instant::now();

    assert_exact_run(&mut t, &dir, spec.total_frames);
    let after = batch_lines(&t).iter().filter(|at| **at > restored_at).count();
    assert!(after > 0, "no batch after the cut: the run did not go on across it");
    let log = t.stderr_text();
    for quiet in ["restarting node", "closing connection", "waiting for node to rejoin"] {
        assert_eq!(
            count_lines(&log, &[quiet]),
            0,
            "`{quiet}` logged:\n{log}\nnode 0:\n{}\nnode 1:\n{}",
            n2.stderr_text(),
            n1.stderr_text()
        );
    }
    assert_eq!(n1.exit_code(DEADLINE), Some(0), "{}", n1.stderr_text());
    assert_eq!(n2.exit_code(DEADLINE), Some(0), "{}", n2.stderr_text());
}

/// Async batches of `node` among `batches` that arrived after `from` (and before
/// `until`, if given).
fn batches_of(batches: &[(Instant, Option<usize>)], node: usize, from: Instant, until: Option<Instant>) -> usize {
    batches
        .iter()
        .filter(|(at, n)| *n == Some(node) && *at > from && until.is_none_or(|u| *at < u))
        .count()
}

/// Async nodes on this machine collect a run of thousands of batches in seconds: both
/// node hosts' links at 8 Mbit/s (about 12 ms per 200-frame batch) keep a run going
/// for a fault of several seconds without an output file of hundreds of megabytes.
fn paced(hosts: &Hosts) {
    hosts.slow(1, "8mbit");
    hosts.slow(2, "8mbit");
}

#[test]
fn async_a_host_cut_off_for_less_than_the_heartbeat_timeout_the_other_node_carries_on_and_nothing_is_lost() {
    let hosts = Hosts::up(3);
    paced(&hosts);
    let dir = temp_dir("hosts-async-short-cut");
    let token = token_file(&dir);
    let spec = RunSpec {
        sync: false,
        total_frames: 600 * FRAMES_PER_BATCH,
        heartbeat: "0.25",
        heartbeat_timeout: "5",
    };
    let mut t = trainer(&hosts, &dir, &spec, &external(&token));
    let mut n1 = node(&hosts, 1, 1, &token);
    let mut n2 = node(&hosts, 2, 0, &token);
    // Both nodes deliver before the fault.
    t.wait_stdout("a batch of each node", DEADLINE, |lines| {
        let has = |k: &str| lines.iter().any(|(_, l)| l.starts_with("{\"batch\"") && l.contains(k));
        has("\"node\":0") && has("\"node\":1")
    });

    hosts.cut(1);
    let cut_at = Instant::now();
    // Silence from host 1 (a second and a half of its packets dropped), well inside the
    // 5 s timeout, while node 0 is not held up: it delivers 10 batches meanwhile.
    wait_until(
        cut_at + SHORT_CUT_MAX,
        "10 batches of node 0 and the packets of host 1 dropped by the cut",
        || batches_of(&node_batches(&t), 0, cut_at + READ_LAG, None) >= 10 && hosts.dropped(1) >= SHORT_CUT_DROPS,
    );
    let restored_at = Instant::now();
    hosts.restore(1);
    let during = node_batches(&t);
    assert!(
        (during.len() as u64) < spec.total_frames / FRAMES_PER_BATCH,
        "the run ended during the cut"
    );
    // A batch of node 1 on its way at the cut may come in late; nothing else of it can
    // (counted from `READ_LAG` on: what it sent before the cut may be read after it).
    assert!(
        batches_of(&during, 1, cut_at + READ_LAG, Some(restored_at)) <= 1,
        "node 1 delivered through the cut"
    );

    // Node 1 comes back as the same connection: its outstanding batch arrives and it
    // goes on.
    t.wait_stdout("a batch of node 1 after the cut", DEADLINE, |lines| {
        lines
            .iter()
            .any(|(at, l)| *at > restored_at && l.starts_with("{\"batch\"") && l.contains("\"node\":1"))
    });
    assert_exact_run(&mut t, &dir, spec.total_frames);
    let log = t.stderr_text();
    for quiet in ["restarting node", "closing connection", "waiting for node to rejoin"] {
        assert_eq!(
            count_lines(&log, &[quiet]),
            0,
            "`{quiet}` logged:\n{log}\nnode 0:\n{}\nnode 1:\n{}",
            n2.stderr_text(),
            n1.stderr_text()
        );
    }
    assert_eq!(n1.exit_code(DEADLINE), Some(0), "{}", n1.stderr_text());
    assert_eq!(n2.exit_code(DEADLINE), Some(0), "{}", n2.stderr_text());
}

#[test]
fn async_a_host_cut_off_past_the_heartbeat_timeout_the_other_node_carries_on_and_the_lost_node_rejoins() {
    let hosts = Hosts::up(3);
    paced(&hosts);
    let dir = temp_dir("hosts-async-long-cut");
    let token = token_file(&dir);
    let spec = RunSpec {
        sync: false,
        total_frames: 1200 * FRAMES_PER_BATCH,
        heartbeat: "0.25",
        heartbeat_timeout: "3",
    };
    let mut t = trainer(&hosts, &dir, &spec, &external(&token));
    let mut n1 = node(&hosts, 1, 1, &token);
    let mut n2 = node(&hosts, 2, 0, &token);
    t.wait_stdout("a batch of each node", DEADLINE, |lines| {
        let has = |k: &str| lines.iter().any(|(_, l)| l.starts_with("{\"batch\"") && l.contains(k));
        has("\"node\":0") && has("\"node\":1")
    });

    hosts.cut(1);
    let cut_at = Instant::now();
    // Past 3 s of silence the node gives up on the trainer (the test, its supervisor,
    // starts it again) and the trainer marks it lost and waits for it to rejoin.
    let code = n1.exit_code(Duration::from_secs(20));
    assert_ne!(code, Some(0), "node 1 cut off does not exit as if shut down");
    assert!(n1.stderr_text().contains("lost the trainer"), "{}", n1.stderr_text());
    t.wait_stderr("node 1 restarting", DEADLINE, &["restarting node", "node=1"]);
    let lost_at = Instant::now();
    assert!(
        cut_at.elapsed() >= Duration::from_secs(3),
        "lost after {:?}, before the timeout",
        cut_at.elapsed()
    );
    let during = node_batches(&t);
    assert!(
        (during.len() as u64) < spec.total_frames / FRAMES_PER_BATCH,
        "the run ended during the cut"
    );
    let of_node_0 = batches_of(&during, 0, cut_at, Some(lost_at));
    assert!(
        of_node_0 >= 10,
        "node 0 delivered {of_node_0} batches while node 1 was cut off"
    );
    assert!(
        batches_of(&during, 1, cut_at + READ_LAG, None) <= 1,
        "node 1 delivered through the cut"
    );

    let mut n1 = node(&hosts, 1, 1, &token);
    hosts.restore(1);
    let restored_at = Instant::now();
    t.wait_stdout("a batch of node 1 after it rejoined", DEADLINE, |lines| {
        lines
            .iter()
            .any(|(at, l)| *at > restored_at && l.starts_with("{\"batch\"") && l.contains("\"node\":1"))
    });
    // Exact frames: the batch node 1 lost in the cut was asked again, not counted twice.
    assert_exact_run(&mut t, &dir, spec.total_frames);
    let log = t.stderr_text();
    assert_eq!(
        count_lines(&log, &["restarting node"]),
        1,
        "one restart, node 1's:\n{log}"
    );
    assert_eq!(count_lines(&log, &["node rejoined", "node=1"]), 1, "{log}");
    assert_eq!(n1.exit_code(DEADLINE), Some(0), "{}", n1.stderr_text());
    assert_eq!(n2.exit_code(DEADLINE), Some(0), "{}", n2.stderr_text());
}

/// A run with `fault` applied to host 1 before anything starts, expected to go through
/// untouched (no restart); returns the hosts for the fault's own checks.
fn run_through(name: &str, batches: u64, fault: impl Fn(&Hosts)) -> Hosts {
    let hosts = Hosts::up(3);
    fault(&hosts);
    let dir = temp_dir(name);
    let token = token_file(&dir);
    let spec = RunSpec {
        sync: true,
        total_frames: batches * FRAMES_PER_BATCH,
        heartbeat: "0.25",
        heartbeat_timeout: "5",
    };
    let mut t = trainer(&hosts, &dir, &spec, &external(&token));
    let mut n1 = node(&hosts, 1, 1, &token);
    let mut n2 = node(&hosts, 2, 0, &token);
    assert_exact_run(&mut t, &dir, spec.total_frames);
    let log = t.stderr_text();
    assert_eq!(count_lines(&log, &["restarting node"]), 0, "{log}");
    assert_eq!(n1.exit_code(DEADLINE), Some(0), "{}", n1.stderr_text());
    assert_eq!(n2.exit_code(DEADLINE), Some(0), "{}", n2.stderr_text());
    hosts
}

#[test]
fn a_slow_link_to_one_host_loses_nothing() {
    // 2 Mbit/s both ways: every share of node 1 (100 CartPole frames, about 10 KB) waits
    // behind tbf's 4 KB burst.
    let hosts = run_through("hosts-slow", 60, |h| h.slow(1, "2mbit"));
    assert!(hosts.overlimits(1) > 0, "tbf never held a packet back");
}

#[test]
fn random_packet_loss_on_one_host_loses_no_frame() {
    let hosts = run_through("hosts-loss", 100, |h| h.loss(1, 3));
    assert!(hosts.dropped(1) > 0, "no packet was dropped");
}

/// The peer addresses of the trainer's `node joined` lines.
fn joined_from(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("node joined"))
        .filter_map(|l| l.split("peer=").nth(1))
        .filter_map(|p| p.split(':').next())
        .map(str::to_string)
        .collect()
}

/// A SLURM run across the hosts (a task on each node host, asserted) in which `lose_host_1`
/// makes the trainer lose the node on host 1 mid-run: its task is resubmitted away from host 1,
/// the new task joins from host 2 and the run completes exactly.
fn slurm_run_losing_host_1(name: &str, lose_host_1: impl Fn(&Hosts)) -> Hosts {
    let hosts = Hosts::up(3);
    hosts.slurm_up();
    let dir = temp_dir(name);
    let spec = RunSpec {
        sync: true,
        total_frames: 300 * FRAMES_PER_BATCH,
        heartbeat: "0.25",
        heartbeat_timeout: "3",
    };
    let out_dir = dir.path().join("slurm").display().to_string();
    let listen = format!("10.77.0.1:{PORT}");
    let launcher = [
        "--launcher",
        "slurm",
        "--listen",
        &listen,
        "--advertise",
        "10.77.0.1",
        "--job-name",
        "rollout-hosts-test",
        "--output-dir",
        &out_dir,
    ]
    .map(String::from);
    let mut t = trainer(&hosts, &dir, &spec, &launcher);
    wait_first_batch(&mut t);
    let mut from = joined_from(&t.stderr_text());
    from.sort();
    assert_eq!(from, ["10.77.0.2", "10.77.0.3"], "one task on each node host");
    let queue = hosts.slurm("squeue", &["-h", "-o", "%N"]).stdout_text();
    assert!(
        queue.contains("rollout-h1") && queue.contains("rollout-h2"),
        "SLURM runs a task on each node host: {queue:?}"
    );

    lose_host_1(&hosts);
    t.wait_stderr(
        "the task resubmitted away from host 1",
        DEADLINE,
        &["away from the host it was lost on", "host=rollout-h1"],
    );
    t.wait_stderr("the node rejoined", DEADLINE, &["node rejoined"]);
    assert_exact_run(&mut t, &dir, spec.total_frames);
    let log = t.stderr_text();
    let from = joined_from(&log);
    assert_eq!(from.len(), 3, "two joins and one rejoin:\n{log}");
    assert_eq!(from[2], "10.77.0.3", "the resubmitted task runs on host 2:\n{log}");
    assert_eq!(count_lines(&log, &["restarting node"]), 1, "{log}");
    let left = hosts.slurm("squeue", &["-h", "-n", "rollout-hosts-test"]).stdout_text();
    assert!(left.trim().is_empty(), "tasks of the run left in the queue: {left}");
    hosts
}

#[test]
fn with_slurm_a_dead_node_host_has_its_task_resubmitted_onto_the_other_host() {
    slurm_run_losing_host_1("hosts-slurm-dead", |hosts| {
        // Host 1 dies: its slurmd, the task's slurmstepd and the node, all at once.
        let killed = hosts.kill_all(1);
        assert!(killed >= 3, "only {killed} processes on host 1");
    });
}

/// A partial partition: host 1 cannot reach the trainer's port any more, SLURM still reaches
/// it and sees it healthy, so only the launcher knows to keep the new task off it.
#[test]
fn with_slurm_a_node_host_cut_off_from_the_trainer_alone_has_its_task_resubmitted_onto_the_other_host() {
    let hosts = slurm_run_losing_host_1("hosts-slurm-partial", |hosts| hosts.cut_port(1, PORT));
    let state = hosts
        .slurm("sinfo", &["-h", "-n", "rollout-h1", "-o", "%T"])
        .stdout_text();
    assert!(
        state.starts_with("idle") || state.starts_with("mix"),
        "SLURM kept host 1 up all along: {state:?}"
    );
    assert!(hosts.dropped(1) > 0, "the cut dropped nothing");
}

/// The machine's own links and addresses (`ip -o link`, `ip -o addr`), interface indexes
/// and counters left out.
fn own_network() -> Vec<String> {
    let mut out = Vec::new();
    for what in ["link", "addr"] {
        let run = run_bounded(Command::new("ip").args(["-o", what]), DEADLINE).expect("run ip");
        out.extend(
            run.stdout_text()
                .lines()
                .map(|l| l.split_whitespace().skip(1).take(3).collect::<Vec<_>>().join(" ")),
        );
    }
    out.sort();
    out
}

fn test_namespaces() -> Vec<String> {
    let run = run_bounded(Command::new("ip").args(["netns", "list"]), DEADLINE).expect("run ip netns list");
    run.stdout_text()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with("rollout-h"))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_test_hosts_touch_nothing_of_the_machines_network_and_go_away() {
    let turn = HostsTurn::take();
    let before = own_network();
    let turn = {
        let hosts = Hosts::up_in(turn, 3);
        // Twice: idempotent, still three hosts and one bridge.
        hosts_sh(&["up", "3"]);
        let mut ns = test_namespaces();
        ns.sort();
        assert_eq!(ns, ["rollout-h0", "rollout-h1", "rollout-h2", "rollout-hbr"]);
        assert_eq!(own_network(), before, "the machine's own links and addresses changed");
        let status = hosts_sh(&["status"]);
        assert!(status.contains("rollout-h2 10.77.0.3 ok"), "{status}");
        hosts.cut(2);
        hosts.slow(2, "1mbit");
        let status = hosts_sh(&["status"]);
        assert!(status.contains("rollout-h2 10.77.0.3 cut slow"), "{status}");
        hosts.clear(2);
        assert!(hosts_sh(&["status"]).contains("rollout-h2 10.77.0.3 ok"));
        // Gone, and no other test's hosts up before the checks below are done.
        hosts.down()
    };
    assert!(test_namespaces().is_empty(), "left behind: {:?}", test_namespaces());
    // `down` with nothing up succeeds.
    hosts_sh(&["down"]);
    assert_eq!(own_network(), before);
    drop(turn);
}
