//! A deadline on every answer a node owes the trainer (issue 14, items 3, 4 and 8):
//! a real trainer and a scripted node over a real socket that heartbeats but never
//! answers `seed` (or `update_weights`, or `shutdown`), and `kill -9` of a process
//! node in a default `rollout collect` run. The run goes on with the others, ends
//! with exact frames, and the reason is reported.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rollout::message::{Continue, FromNode, ToNode};
use rollout::wire::{self, Auth, Hello, NodeFrame, TrainerFrame, Welcome, PROTOCOL_VERSION};
use rollout::{PolicyConfig, Registry};
use rollout_actors::{Collected, DistributedCollector, Launcher};
use rollout_tests::{
    built_on_a_thread, children, connect, good_node_named, log_text, node_with_index, real_batch, recv, rollout_bin,
    signal, try_send, unique_name, value_weights, wait_for, wait_until, wait_with_deadline, OwnLog, Running,
};

/// 32 bytes: long enough for any token rule.
const TOKEN: &[u8] = b"deadlines-test-token-0123456789a";
/// Generous bound on anything a test waits for.
const DEADLINE: Duration = Duration::from_secs(60);
/// Bound on a whole CLI run of 2000 sync rounds on a loaded machine.
const RUN_DEADLINE: Duration = Duration::from_secs(300);

/// Asserts that one log line holds both `event` and `reason`.
fn assert_logged(event: &str, reason: &str) {
    let log = log_text();
    assert!(
        log.lines().any(|l| l.contains(event) && l.contains(reason)),
        "no `{event}` line saying `{reason}`; log:\n{log}"
    );
}

/// A trainer of two external nodes, async, 600 frames, built on a thread (build waits
/// for the joins), and the address it listens on; `tune` sets the deadline under test.
fn trainer(
    tune: fn(rollout_actors::CollectorBuilder) -> rollout_actors::CollectorBuilder,
) -> (JoinHandle<DistributedCollector>, SocketAddr) {
    let b = DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .frames_per_batch(100)
        .total_frames(600)
        .seed(0)
        .launcher(Launcher::External)
        .token(TOKEN)
        .heartbeat(Duration::from_millis(100), Duration::from_secs(5))
        .join_timeout(DEADLINE)
        .batch_timeout(DEADLINE);
    built_on_a_thread(tune(b))
}

/// A well-behaved node as node `index`, served by the library function.
fn good_node(addr: SocketAddr, index: usize) -> JoinHandle<Result<(), String>> {
    good_node_named(addr, TOKEN, Some(index), format!("good-{index}"))
}

/// [`try_send`]: the trainer may have closed the connection.
fn send(s: &mut TcpStream, f: &NodeFrame) -> std::io::Result<()> {
    try_send(s, f)
}

/// A node driven by the test over a raw socket: it joins properly (hello, auth,
/// ready) and heartbeats every 100 ms; what it answers is up to the test.
struct Scripted {
    stream: TcpStream,
    welcome: Welcome,
    /// Frames from the trainer; disconnected once the trainer closed the connection.
    frames: Receiver<TrainerFrame>,
    last_beat: Instant,
}

impl Scripted {
    /// Joins `addr` as node `index`.
    fn join(addr: SocketAddr, index: usize) -> Scripted {
        let mut s = connect(addr, DEADLINE);
        let name = format!("scripted-{index}");
        let hello = NodeFrame::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            node_name: name.clone(),
            node_index: Some(index),
        });
        send(&mut s, &hello).expect("hello");
        let Some(TrainerFrame::Challenge { nonce }) = recv(&mut s) else {
            panic!("expected a challenge");
        };
        let auth = NodeFrame::Auth(Auth {
            proof: wire::auth_proof(TOKEN, &nonce, &name),
        });
        send(&mut s, &auth).expect("auth");
        let Some(TrainerFrame::Welcome(welcome)) = recv(&mut s) else {
            panic!("not admitted");
        };
        let layout = welcome
            .spec
            .build_worker(&Registry::with_builtins(), 0)
            .expect("rollout")
            .batch_layout();
        send(
            &mut s,
            &NodeFrame::Message(FromNode::Ready {
                node: index,
                layout,
                specs: None,
            }),
        )
        .expect("ready");
        let (tx, frames) = mpsc::channel();
        let mut reader = s.try_clone().expect("clone");
        thread::spawn(move || {
            while let Some(f) = recv(&mut reader) {
                if tx.send(f).is_err() {
                    return;
                }
            }
        });
        Scripted {
            stream: s,
            welcome: *welcome,
            frames,
            last_beat: Instant::now(),
        }
    }

    /// The next message from the trainer (heartbeating meanwhile), or `None` once the
    /// trainer closed the connection. Fails past the deadline.
    fn next(&mut self) -> Option<ToNode> {
        let end = Instant::now() + DEADLINE;
        loop {
            if self.last_beat.elapsed() >= Duration::from_millis(100) {
                // The trainer may have closed already: a failed write is no error here.
                let _ = send(&mut self.stream, &NodeFrame::Heartbeat);
                self.last_beat = Instant::now();
            }
            match self.frames.recv_timeout(Duration::from_millis(50)) {
                Ok(TrainerFrame::Message(m)) => return Some(m),
                Ok(_) => {}
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => {
                    assert!(Instant::now() < end, "the trainer neither sent nor closed");
                }
            }
        }
    }

    /// Answers `msg` as a real node would (a real batch for a `continue`).
    fn answer(&mut self, msg: &ToNode) {
        let node = self.welcome.node_index;
        let reply = match msg {
            ToNode::Seed(s) => FromNode::Seeded {
                node,
                next_seed: s.seed + 1,
            },
            ToNode::UpdateWeights(u) => FromNode::WeightsUpdated {
                node,
                version: u.weights.version,
            },
            ToNode::Continue(c) => FromNode::Batch(real_batch(&self.welcome, *c)),
            ToNode::Shutdown => FromNode::Down { node },
            other => panic!("unexpected {other:?}"),
        };
        send(&mut self.stream, &NodeFrame::Message(reply)).expect("answer");
    }

    /// Heartbeats, answering nothing, until the trainer closes the connection; returns
    /// the kinds of message it was sent meanwhile.
    fn ignore_until_closed(&mut self) -> Vec<&'static str> {
        let mut kinds = Vec::new();
        while let Some(m) = self.next() {
            kinds.push(m.name());
        }
        kinds
    }
}

/// Pulls every batch, then shuts down; asserts exact frames, every batch from node 1.
fn finish_on_node_1(mut c: DistributedCollector) -> Vec<Collected> {
    let mut batches = Vec::new();
    while let Some(b) = c.next_batch().expect("batch") {
        batches.push(b);
    }
    let frames: usize = batches.iter().map(|b| b.data.numel()).sum();
    assert_eq!(frames, 600);
    assert!(batches.iter().all(|b| b.node == Some(1)), "a batch of the silent node");
    c.shutdown().expect("shutdown");
    batches
}

#[test]
fn a_node_that_heartbeats_but_never_answers_seed_is_dropped_and_the_run_finishes_exactly() {
    let (t, addr) = trainer(|b| b.seed_timeout(Duration::from_secs(1)));
    let mut silent = Scripted::join(addr, 0);
    let good = good_node(addr, 1);
    let start = Instant::now();
    let sent = silent.ignore_until_closed();
    assert_eq!(sent, vec!["seed"], "node 0 got its seed and nothing after");
    let closed_after = start.elapsed();
    assert!(closed_after < DEADLINE, "{closed_after:?}");
    finish_on_node_1(t.join().expect("trainer thread"));
    assert_eq!(good.join().expect("node thread"), Ok(()));
    assert_logged("node lost", "no answer to seed within 1.000 s");
}

#[test]
fn a_node_that_never_answers_update_weights_is_dropped_and_the_run_finishes_exactly() {
    let (t, addr) = trainer(|b| b.update_weights_timeout(Duration::from_secs(1)));
    let mut silent = Scripted::join(addr, 0);
    let good = good_node(addr, 1);
    let mut c = t.join().expect("trainer thread");
    c.update_policy_weights(value_weights(1.0), None).expect("push");
    // It answers the seed, then nothing more. Nothing pulls batches until it is
    // dropped, so the run cannot end first (async Continues go out on the first pull).
    let mut sent = Vec::new();
    while let Some(m) = silent.next() {
        sent.push(m.name());
        if matches!(m, ToNode::Seed(_)) {
            silent.answer(&m);
        }
    }
    assert_eq!(sent, vec!["seed", "update_weights"]);
    let batches = finish_on_node_1(c);
    assert!(
        batches.iter().all(|b| b.weights_version == 1),
        "node 1 collected with v1"
    );
    assert_eq!(good.join().expect("node thread"), Ok(()));
    assert_logged("node lost", "no answer to update_weights (version 1) within 1.000 s");
}

/// `rollout collect` with `args`, stdout piped, stderr to a pipe read on a thread.
fn collect_cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new(rollout_bin());
    cmd.arg("collect")
        .args(args)
        .env("ROLLOUT_TOKEN", std::str::from_utf8(TOKEN).expect("utf8"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The `frames` of the summary object (the last line of `--json` output).
fn summary_frames(stdout: &str) -> Option<u64> {
    let last = stdout.lines().last()?;
    let v: serde_json::Value = serde_json::from_str(last).ok()?;
    v.get("seconds")?;
    v.get("frames")?.as_u64()
}

#[test]
fn a_node_that_ignores_shutdown_is_closed_with_a_warning_and_the_cli_exits_0_with_its_summary() {
    let mut cli = Running::spawn(&mut collect_cmd(&[
        "--launcher",
        "external",
        "--listen",
        "127.0.0.1:0",
        "--nodes",
        "2",
        "--env",
        "Counting",
        "--policy",
        "constant",
        "--frames-per-batch",
        "100",
        "--total-frames",
        "600",
        "--shutdown-ack-timeout",
        "1",
        "--json",
        "--quiet",
    ]))
    .expect("run rollout collect");
    let addr = cli.listening_addr(DEADLINE);
    let mut rude = Scripted::join(addr, 0);
    let mut good = Command::new(rollout_bin())
        .args(["node", "--join", &addr.to_string(), "--index", "1"])
        .env("ROLLOUT_TOKEN", std::str::from_utf8(TOKEN).expect("utf8"))
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn node");
    // A perfect node until `shutdown`, which it ignores (heartbeating on).
    let mut got_shutdown = false;
    while let Some(m) = rude.next() {
        if matches!(m, ToNode::Shutdown) {
            got_shutdown = true;
            continue;
        }
        assert!(!got_shutdown, "{} after shutdown", m.name());
        rude.answer(&m);
    }
    assert!(got_shutdown, "the trainer closed before its shutdown");
    let done = cli.finish(DEADLINE);
    let (stdout, stderr) = (done.stdout_text(), done.stderr_text());
    assert_eq!(done.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(summary_frames(&stdout), Some(600), "stdout:\n{stdout}");
    let batch_frames: u64 = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("batch").is_some())
        .filter_map(|v| v.get("frames").and_then(|f| f.as_u64()))
        .sum();
    assert_eq!(batch_frames, 600, "every frame was delivered");
    assert!(
        stderr.lines().any(|l| l.contains("node closed at shutdown")
            && l.contains("node=0")
            && l.contains("no answer to shutdown within 1.000 s")),
        "no warning naming the node's silence; stderr:\n{stderr}"
    );
    let st = wait_with_deadline(&mut good, DEADLINE);
    assert!(
        st.is_some_and(|s| s.success()),
        "the good node exits after shutdown: {st:?}"
    );
}

/// A sync process run of 2000 batches with `extra` flags, where one node is killed
/// with SIGKILL mid-run; returns (exit code, stdout, stderr). The test stops reading
/// stdout after the first batch line, so the CLI (whose `--json` lines outgrow the
/// pipe's 64 KiB buffer: 2000 lines of ~58 bytes) cannot finish before the kill; then it reads everything.
fn kill_one_process_node(extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args = vec![
        "--launcher",
        "process",
        "--sync",
        "--nodes",
        "2",
        "--env",
        "Counting",
        "--policy",
        "constant",
        "--frames-per-batch",
        "20",
        "--total-frames",
        "40000",
        "--seed",
        "3",
        "--json",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    let mut child = collect_cmd(&args).spawn().expect("spawn rollout collect");
    let pid = child.id();
    let stderr = child.stderr.take().expect("stderr");
    let err = thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut s);
        s
    });
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(first.contains("\"batch\":0"), "first line: {first}");
    let nodes = wait_for(Instant::now() + DEADLINE, "two node processes", || {
        Some(children(pid)).filter(|c| c.len() == 2)
    });
    let victim = node_with_index(&nodes, 1).expect("a node process with --index 1");
    signal(victim, "KILL");
    let mut stdout = first + "\n";
    for l in lines.map_while(Result::ok) {
        stdout.push_str(&l);
        stdout.push('\n');
    }
    let st = wait_with_deadline(&mut child, RUN_DEADLINE);
    if st.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    (st.and_then(|s| s.code()), stdout, err.join().unwrap_or_default())
}

#[test]
fn a_process_node_killed_in_a_default_sync_run_is_restarted_and_the_run_completes_exactly() {
    let (code, stdout, stderr) = kill_one_process_node(&[]);
    assert_eq!(code, Some(0), "stderr:\n{stderr}");
    assert_eq!(summary_frames(&stdout), Some(40000), "stderr:\n{stderr}");
    let batches: Vec<u64> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("batch").and_then(|b| b.as_u64()))
        .collect();
    assert_eq!(batches, (0..2000).collect::<Vec<u64>>(), "every batch once, in order");
    assert!(
        stderr.contains("restarting"),
        "the restart was not reported; stderr:\n{stderr}"
    );
}

#[test]
fn with_node_max_restarts_0_a_killed_process_node_fails_the_sync_run_naming_it() {
    let (code, _stdout, stderr) = kill_one_process_node(&["--node-max-restarts", "0"]);
    assert_eq!(code, Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.contains("node 1") && !stderr.contains("node 0"),
        "the node is not named; stderr:\n{stderr}"
    );
}

#[test]
fn under_supervision_a_node_silent_on_seed_is_replaced_and_the_run_finishes_exactly() {
    let (t, addr) = trainer(|b| {
        b.seed_timeout(Duration::from_secs(1))
            .node_max_restarts(1)
            .node_restart_window(Duration::from_secs(60))
    });
    let mut silent = Scripted::join(addr, 0);
    let good = good_node(addr, 1);
    let mut c = t.join().expect("trainer thread");
    assert_eq!(silent.ignore_until_closed(), vec!["seed"]);
    // The trainer frees slot 0 as it counts the restart; then a good node takes it.
    wait_until(Instant::now() + DEADLINE, "the restart of node 0 counted", || {
        c.stats().expect("stats").restarts == [1, 0]
    });
    let name = unique_name("replacement");
    let rejoined = OwnLog::node(&name);
    let replacement = good_node_named(addr, TOKEN, Some(0), name);
    // Node 1 alone collects the 600 frames in a few milliseconds: the replacement must be
    // back before the first batch is asked for, or the run can end before it joins.
    // (Admitted, it is in the trainer's inbox ahead of every batch that can end the run.)
    rejoined.assert_logged("node rejoined");
    let mut frames = 0;
    while let Some(b) = c.next_batch().expect("batch") {
        frames += b.data.numel();
    }
    assert_eq!(frames, 600);
    assert_eq!(c.stats().expect("stats").restarts, vec![1, 0]);
    c.shutdown().expect("shutdown");
    assert_eq!(good.join().expect("node thread"), Ok(()));
    assert_eq!(replacement.join().expect("node thread"), Ok(()));
    assert_logged("restarting", "no answer to seed within 1.000 s");
}

#[test]
fn a_deadline_of_zero_is_refused_naming_it() {
    for (field, b) in [
        (
            "request_timeout",
            DistributedCollector::builder().request_timeout(Duration::ZERO),
        ),
        (
            "seed_timeout",
            DistributedCollector::builder().seed_timeout(Duration::ZERO),
        ),
        (
            "continue_timeout",
            DistributedCollector::builder().continue_timeout(Duration::ZERO),
        ),
        (
            "shutdown_ack_timeout",
            DistributedCollector::builder().shutdown_ack_timeout(Duration::ZERO),
        ),
    ] {
        match b.env("Counting").frames_per_batch(4).build() {
            Err(rollout_actors::CollectError::Config(e)) => assert_eq!(e.field, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

/// The short batch deadline of the tests below: 6 s where a user may say 20; what
/// matters is that it is shorter than the 30 s request deadline the builder used to
/// default to whatever the batch deadline, and 6 s keeps the tests short.
const SHORT_BATCH: Duration = Duration::from_secs(6);

/// Sync, supervised (one restart within a minute), `batch_timeout` [`SHORT_BATCH`]
/// and no request deadline set.
fn sync_supervised(b: rollout_actors::CollectorBuilder) -> rollout_actors::CollectorBuilder {
    b.sync(true)
        .batch_timeout(SHORT_BATCH)
        .node_max_restarts(1)
        .node_restart_window(Duration::from_secs(60))
}

#[test]
fn with_a_short_batch_timeout_a_node_silent_on_seed_is_cut_in_time_replaced_and_the_sync_run_ends_exactly() {
    let (t, addr) = trainer(sync_supervised);
    let mut silent = Scripted::join(addr, 0);
    let good = good_node(addr, 1);
    let mut c = t.join().expect("trainer thread");
    // Once the silent node is cut off its slot is free (released as its connection is
    // closed, before the close reaches the socket): a good node takes it.
    let replacement = thread::spawn(move || {
        let sent = silent.ignore_until_closed();
        (sent, good_node(addr, 0).join().expect("node thread"))
    });
    let mut frames = 0;
    while let Some(b) = c.next_batch().expect("every round within batch_timeout") {
        frames += b.data.numel();
    }
    assert_eq!(frames, 600);
    assert_eq!(c.stats().expect("stats").restarts, vec![1, 0]);
    c.shutdown().expect("shutdown");
    let (sent, replaced) = replacement.join().expect("replacement thread");
    assert_eq!(sent, vec!["seed"], "node 0 got its seed and nothing after");
    assert_eq!(replaced, Ok(()));
    assert_eq!(good.join().expect("node thread"), Ok(()));
    // The seed deadline was derived from the batch's: half of it.
    assert_logged("restarting", "no answer to seed within 3.000 s");
}

#[test]
fn rollout_collect_with_a_short_batch_timeout_replaces_a_node_silent_on_seed_and_exits_0() {
    let batch = SHORT_BATCH.as_secs().to_string();
    let mut cli = Running::spawn(&mut collect_cmd(&[
        "--launcher",
        "external",
        "--listen",
        "127.0.0.1:0",
        "--nodes",
        "2",
        "--sync",
        "--env",
        "Counting",
        "--policy",
        "constant",
        "--frames-per-batch",
        "100",
        "--total-frames",
        "600",
        "--batch-timeout",
        &batch,
        "--json",
        "--quiet",
    ]))
    .expect("run rollout collect");
    let addr = cli.listening_addr(DEADLINE);
    let node = |index: &str| {
        Command::new(rollout_bin())
            .args(["node", "--join", &addr.to_string(), "--index", index])
            .env("ROLLOUT_TOKEN", std::str::from_utf8(TOKEN).expect("utf8"))
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn node")
    };
    let mut silent = Scripted::join(addr, 0);
    let mut good = node("1");
    assert_eq!(silent.ignore_until_closed(), vec!["seed"]);
    let mut replacement = node("0");
    let done = cli.finish(DEADLINE);
    let (stdout, stderr) = (done.stdout_text(), done.stderr_text());
    assert_eq!(done.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(summary_frames(&stdout), Some(600), "stdout:\n{stdout}");
    assert!(
        stderr.contains("no answer to seed within 3.000 s"),
        "the cut was not reported with the derived deadline; stderr:\n{stderr}"
    );
    for (name, child) in [("node 1", &mut good), ("the replacement", &mut replacement)] {
        let st = wait_with_deadline(child, DEADLINE);
        assert!(st.is_some_and(|s| s.success()), "{name} exits after shutdown: {st:?}");
    }
}

/// A node that answers everything but each `continue` with a batch for a seq that is
/// not outstanding: the trainer cuts it off for that offence.
fn offender(addr: SocketAddr) -> JoinHandle<()> {
    let mut node = Scripted::join(addr, 0);
    thread::spawn(move || {
        while let Some(m) = node.next() {
            let ToNode::Continue(c) = m else {
                node.answer(&m);
                continue;
            };
            let bad = Continue { seq: c.seq + 1000, ..c };
            let batch = FromNode::Batch(real_batch(&node.welcome, bad));
            // The trainer may have closed already.
            let _ = send(&mut node.stream, &NodeFrame::Message(batch));
        }
    })
}

/// The seconds in "not back {s} s later" of a failure's reason.
fn waited(reason: &str) -> f64 {
    let after = reason.split("not back ").nth(1).unwrap_or_default();
    let secs = after.split(" s later").next().unwrap_or_default();
    secs.parse().unwrap_or_else(|_| panic!("no wait in {reason:?}"))
}

/// Pulls batches until the run fails; the failure.
fn failure(mut c: DistributedCollector) -> rollout_actors::CollectError {
    loop {
        match c.next_batch() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the run ended without its node 0"),
            Err(e) => return e,
        }
    }
}

/// `err` is node 0's failure, cut off for the offence of [`offender`]: its reason and
/// how long the trainer waited for the node, as the reason says.
fn cut_off_for_the_offence(err: rollout_actors::CollectError) -> (String, f64) {
    let rollout_actors::CollectError::NodeFailed { node, reason } = &err else {
        panic!("not the node's failure: {err}");
    };
    assert_eq!(*node, 0, "{err}");
    assert!(
        reason.contains("cut off for") && reason.contains("which is not outstanding"),
        "{err}"
    );
    (reason.clone(), waited(reason))
}

#[test]
fn a_node_cut_off_for_an_offence_and_not_back_when_the_batch_is_due_fails_the_run_naming_node_offence_and_wait() {
    let (t, addr) = trainer(sync_supervised);
    let bad = offender(addr);
    let good = good_node(addr, 1);
    let (reason, w) = cut_off_for_the_offence(failure(t.join().expect("trainer thread")));
    assert!(
        reason.contains("collecting a batch ran out of time (6.0 s)"),
        "{reason}"
    );
    // Cut off at its first batch, at most a round after the batch was asked for.
    assert!((4.0..=60.0).contains(&w), "waited {w} s: {reason}");
    bad.join().expect("offender thread");
    assert!(good.join().is_ok());
}

#[test]
fn a_node_cut_off_for_an_offence_whose_restart_fails_fails_the_run_naming_node_offence_and_wait() {
    // The restart waits 3 s for a node to rejoin; the batch, 60 s.
    let (t, addr) = trainer(|b| {
        b.sync(true)
            .join_timeout(Duration::from_secs(3))
            .node_max_restarts(1)
            .node_restart_window(Duration::from_secs(60))
    });
    let bad = offender(addr);
    let good = good_node(addr, 1);
    let (reason, w) = cut_off_for_the_offence(failure(t.join().expect("trainer thread")));
    assert!(reason.contains("no node delivered in slot 0 within 3.0 s"), "{reason}");
    assert!((3.0..=60.0).contains(&w), "waited {w} s: {reason}");
    bad.join().expect("offender thread");
    assert!(good.join().is_ok());
}
