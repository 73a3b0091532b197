//! Elastic membership (issue 16): an async run over the `External` launcher starts
//! with `min_nodes`, takes nodes that join while it runs (up to `max_nodes`) and lets
//! nodes leave (`leave`) or be lost without failing; none is restarted, frames stay
//! exact and trajectory ids unique. Real `rollout node` processes and signals over
//! loopback, then 64 in-process nodes (`run_node` on threads, over real TCP) joining
//! and leaving at random.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rollout::rollout::keys;
use rollout::PolicyConfig;
use rollout_actors::remote::{run_node, JoinError, LeaveHandle, NodeOptions};
use rollout_actors::{CollectError, Collected, CollectorBuilder, DistributedCollector, Launcher};
use rollout_tests::{
    assert_unique_traj_ids, listening_on_a_thread, log_text, logs, poll_until, rollout_bin, signal, value_weights,
    wait_with_deadline,
};

const TOKEN: &[u8] = b"elastic-membership-token";
const DEADLINE: Duration = Duration::from_secs(20);
const FPB: usize = 20;

/// An elastic run of Counting envs (1 env a node) listening on a free loopback port.
fn elastic_builder(min: usize, max: usize, total: i64) -> CollectorBuilder {
    logs();
    DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .min_nodes(min)
        .max_nodes(max)
        .frames_per_batch(FPB)
        .total_frames(total)
        .seed(3)
        .launcher(Launcher::External)
        .listen("127.0.0.1:0")
        .token(TOKEN)
        .heartbeat(Duration::from_millis(100), Duration::from_secs(2))
        .join_timeout(DEADLINE)
        .batch_timeout(DEADLINE)
}

/// `build` returns once `min_nodes` joined: on a thread, while the test starts them;
/// with the address they join.
fn build_on_a_thread(b: CollectorBuilder) -> (JoinHandle<DistributedCollector>, SocketAddr) {
    listening_on_a_thread(b, |b| b.build().expect("collector"))
}

/// `rollout node --join ADDR --index I`, as anyone holding the token would start it.
fn node_process(addr: SocketAddr, index: usize) -> Child {
    Command::new(rollout_bin())
        .args(["node", "--join", &addr.to_string(), "--index", &index.to_string()])
        .env("ROLLOUT_TOKEN", std::str::from_utf8(TOKEN).expect("utf8"))
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn node")
}

/// Every frame is a Counting step: the next observation is the observation plus the
/// action (1 under every weights version here), and the batch has its size.
fn assert_valid(b: &Collected, fpb: usize, last: bool) {
    let n = b.data.numel();
    assert!(
        n == fpb || (last && n > 0 && n < fpb),
        "batch {} has {n} frames",
        b.index
    );
    assert_eq!(b.data.batch_size()[0], 1, "one env a node");
    let obs = b.data.f32(keys::OBSERVATION).expect("observation");
    let next = b.data.f32(keys::NEXT_OBSERVATION).expect("next observation");
    let act = b.data.f32(keys::ACTION).expect("action");
    for ((o, x), a) in obs.iter().zip(next.iter()).zip(act.iter()) {
        assert_eq!(
            *x,
            *o + *a,
            "batch {} of node {:?}: not a Counting step",
            b.index,
            b.node
        );
    }
}

/// Frames exact, each batch index once, every batch valid, ids unique.
fn assert_exact(batches: &[Collected], total: usize) {
    let frames: usize = batches.iter().map(|b| b.data.numel()).sum();
    assert_eq!(frames, total, "total_frames exact");
    for (i, b) in batches.iter().enumerate() {
        assert_eq!(b.index, i as u64, "batch indices in order, none twice");
        assert_valid(b, FPB, i + 1 == batches.len());
    }
    assert_unique_traj_ids(batches);
}

/// Waits (within the deadline) for a log line of this process holding every one of `parts`.
fn wait_logged(parts: &[&str]) {
    let logged = poll_until(Instant::now() + DEADLINE, || {
        log_text()
            .lines()
            .any(|l| parts.iter().all(|p| l.contains(p)))
            .then_some(())
    });
    assert!(logged.is_some(), "no log line with {parts:?}:\n{}", log_text());
}

/// Pulls batches until one comes from `node`, within the deadline.
fn pull_until_node(c: &mut DistributedCollector, node: usize, batches: &mut Vec<Collected>) -> Collected {
    let end = Instant::now() + DEADLINE;
    loop {
        assert!(Instant::now() < end, "no batch of node {node} within {DEADLINE:?}");
        let b = c.next_batch().expect("batch").expect("the run is not over");
        batches.push(b.clone());
        if b.node == Some(node) {
            return b;
        }
    }
}

#[test]
fn a_run_starts_with_two_processes_a_third_joins_one_leaves_on_sigterm_and_frames_are_exact() {
    let total = 3000;
    let (t, addr) = build_on_a_thread(elastic_builder(2, 3, total as i64));
    let mut nodes = vec![node_process(addr, 0), node_process(addr, 1)];
    let mut c = t.join().expect("collector thread");
    let mut batches = Vec::new();
    for _ in 0..10 {
        batches.push(c.next_batch().expect("ok").expect("batch"));
    }
    assert!(
        batches.iter().all(|b| b.node.is_some_and(|n| n < 2)),
        "the two that started"
    );
    // Weights pushed before the third joins: it must act with them, not version 0.
    let version = c.update_policy_weights(value_weights(1.0), None).expect("push");
    nodes.push(node_process(addr, 2));
    let first = pull_until_node(&mut c, 2, &mut batches);
    assert_eq!(
        first.weights_version, version,
        "the joiner got the stored weights first"
    );
    // Node 0 leaves on SIGTERM: `leave`, exit 0; the run goes on without it.
    let before = batches.len();
    let zero = batches.iter().rev().find(|b| b.node == Some(0)).map(|b| b.index);
    assert!(zero.is_some(), "node 0 delivered before it left");
    signal(nodes[0].id(), "TERM");
    let st = wait_with_deadline(&mut nodes[0], DEADLINE);
    assert!(
        st.is_some_and(|s| s.success()),
        "SIGTERM: the node leaves and exits 0: {st:?}"
    );
    while let Some(b) = c.next_batch().expect("batch") {
        batches.push(b);
        assert!(batches.len() < 10_000, "runaway collection");
    }
    assert!(batches.len() > before + 5, "the run went on after the leave");
    assert_exact(&batches, total);
    let stats = c.stats().expect("stats");
    assert_eq!((stats.joined, stats.left), (3, 1), "{stats:?}");
    wait_logged(&["node left", "node=0"]);
    assert_eq!(stats.restarts, vec![0, 0, 0], "no node restarted");
    c.shutdown().expect("shutdown");
    for n in nodes.iter_mut().skip(1) {
        let st = wait_with_deadline(n, DEADLINE);
        assert!(st.is_some_and(|s| s.success()), "a node exits 0 after Shutdown: {st:?}");
    }
}

#[test]
fn a_node_killed_in_an_elastic_run_is_not_restarted_nor_waited_for_and_frames_are_exact() {
    let total = 2000;
    let (t, addr) = build_on_a_thread(elastic_builder(3, 3, total as i64));
    let mut nodes: Vec<Child> = (0..3).map(|i| node_process(addr, i)).collect();
    let mut c = t.join().expect("collector thread");
    let mut batches = Vec::new();
    pull_until_node(&mut c, 1, &mut batches);
    let _ = nodes[1].kill();
    let _ = nodes[1].wait();
    // The trainer notices (the connection closes) and goes on without it.
    wait_logged(&["node lost; the others go on", "node=1"]);
    let after = batches.len();
    while let Some(b) = c.next_batch().expect("the run does not fail when a node is lost") {
        batches.push(b);
        assert!(batches.len() < 10_000, "runaway collection");
    }
    assert!(batches.len() > after + 5, "the others went on");
    assert_exact(&batches, total);
    let stats = c.stats().expect("stats");
    assert_eq!(stats.restarts, vec![0, 0, 0], "not restarted: {stats:?}");
    assert_eq!((stats.joined, stats.left), (3, 0), "nobody rejoined: {stats:?}");
    c.shutdown().expect("shutdown");
    for i in [0, 2] {
        let st = wait_with_deadline(&mut nodes[i], DEADLINE);
        assert!(
            st.is_some_and(|s| s.success()),
            "node {i} exits 0 after Shutdown: {st:?}"
        );
    }
}

/// splitmix64: the churn's choices, replayed from the seed a failure prints.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One in-process node over TCP, and the handle that makes it leave.
struct Member {
    leave: LeaveHandle,
    thread: JoinHandle<Result<(), JoinError>>,
    asked_to_leave: bool,
}

fn member(addr: SocketAddr, n: usize) -> Member {
    let leave = LeaveHandle::new();
    let opts = NodeOptions {
        name: format!("churn-{n}"),
        connect_timeout: DEADLINE,
        leave: Some(leave.clone()),
        ..NodeOptions::default()
    };
    let thread = thread::spawn(move || run_node(&addr.to_string(), TOKEN, opts));
    Member {
        leave,
        thread,
        asked_to_leave: false,
    }
}

/// Nodes joining and leaving at random for `churn_for` (choices from `seed`): up to 64
/// first, then each step a node leaves with odds `live / 64` or one joins (so membership
/// wanders around 32, sometimes 64 and sometimes few); at least 4 are left in at the
/// end, to collect the rest of the run.
fn churn(addr: SocketAddr, seed: u64, first: Vec<Member>, churn_for: Duration) -> Vec<Member> {
    let mut rng = Rng(seed);
    let mut live = first;
    let mut gone = Vec::new();
    let mut spawned = live.len();
    while live.len() < 64 {
        live.push(member(addr, spawned));
        spawned += 1;
    }
    let start = Instant::now();
    while start.elapsed() < churn_for {
        let leave = !live.is_empty() && rng.below(64) < live.len();
        if leave {
            let mut m = live.swap_remove(rng.below(live.len()));
            m.leave.leave();
            m.asked_to_leave = true;
            gone.push(m);
        } else {
            live.push(member(addr, spawned));
            spawned += 1;
        }
        // The churn's pace, not a wait for anything.
        thread::sleep(Duration::from_millis(10 + rng.below(50) as u64));
    }
    while live.len() < 4 {
        live.push(member(addr, spawned));
        spawned += 1;
    }
    live.extend(gone);
    live
}

#[test]
fn sixty_four_nodes_joining_and_leaving_at_random_for_twenty_seconds_keep_frames_exact() {
    let seed = std::env::var("ELASTIC_CHURN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16u64);
    eprintln!("churn seed {seed} (ELASTIC_CHURN_SEED replays it)");
    // The consumer pulls a batch every 5 ms at most: about 4,000 batches in the 20 s
    // of churn (the rest, if the machine is slower, is collected after it).
    let total = 4000 * 10;
    // 64 nodes on a busy machine: a heartbeat missed is no node lost.
    let b = elastic_builder(8, 64, total as i64)
        .frames_per_batch(10)
        .heartbeat(Duration::from_millis(250), Duration::from_secs(10));
    let (t, addr) = build_on_a_thread(b);
    let first: Vec<Member> = (0..8).map(|i| member(addr, i)).collect();
    let mut c = t.join().expect("collector thread");
    let churn_for = Duration::from_secs(20);
    let churner = thread::spawn(move || churn(addr, seed, first, churn_for));
    let pace = Duration::from_millis(5);
    let start = Instant::now();
    let mut batches: Vec<Collected> = Vec::new();
    let mut frames = 0usize;
    let mut stored = false;
    loop {
        let now = Instant::now();
        if !stored && now.duration_since(start) > churn_for / 2 {
            // Stored, not pushed: nodes that join from now on get it before their first batch.
            c.set_policy_weights(value_weights(1.0)).expect("store");
            stored = true;
        }
        match c.next_batch() {
            Ok(Some(b)) => {
                frames += b.data.numel();
                assert_valid(&b, 10, frames == total);
                batches.push(b);
            }
            Ok(None) => break,
            Err(e) => panic!("churn seed {seed}: the run failed: {e}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "churn seed {seed}: the run did not end"
        );
        // The consumer's pace (its work on a batch), not a wait for anything.
        if let Some(rest) = (now + pace).checked_duration_since(Instant::now()) {
            thread::sleep(rest);
        }
    }
    assert_eq!(frames, total, "churn seed {seed}: total_frames exact");
    assert_unique_traj_ids(&batches);
    let members = churner.join().expect("churn thread");
    let stats = c.stats().expect("stats");
    eprintln!(
        "churn seed {seed}: {} batches, {} nodes joined, {} left, in {:.1} s",
        batches.len(),
        stats.joined,
        stats.left,
        start.elapsed().as_secs_f64()
    );
    c.shutdown().expect("shutdown");
    let (mut joined, mut left) = (0u64, 0u64);
    let spawned = members.len();
    for m in members {
        match m.thread.join().expect("node thread") {
            Ok(()) => {
                joined += 1;
                left += u64::from(m.asked_to_leave);
            }
            // All 64 slots were held (a slot is free once its node's connection closed).
            Err(JoinError::Rejected(r)) => assert!(r.contains("slots are taken"), "seed {seed}: {r}"),
            Err(e) => panic!("churn seed {seed}: a node failed: {e}"),
        }
    }
    assert_eq!(
        stats.joined, joined,
        "churn seed {seed}: every node that joined was counted"
    );
    assert_eq!(stats.left, left, "churn seed {seed}: every leave was counted");
    assert!(
        stats.joined > 100 && stats.left > 50,
        "churn seed {seed}: {stats:?} over {spawned} spawned"
    );
    assert!(stats.restarts.iter().all(|&r| r == 0));
}

#[test]
fn elastic_settings_that_cannot_work_are_refused_at_build_time_by_name() {
    let field = |b: CollectorBuilder| match b.build() {
        Err(CollectError::Config(e)) => e.field,
        Err(e) => panic!("not a config error: {e}"),
        Ok(_) => panic!("built"),
    };
    assert_eq!(field(elastic_builder(3, 2, 100)), "min_nodes");
    assert_eq!(field(elastic_builder(0, 2, 100)), "min_nodes");
    assert_eq!(field(elastic_builder(1, 0, 100)), "max_nodes");
    assert_eq!(field(elastic_builder(1, 2, 100).sync(true)), "sync");
    assert_eq!(field(elastic_builder(1, 2, 100).nodes(2)), "nodes");
    assert_eq!(field(elastic_builder(1, 2, 100).launcher(Launcher::Local)), "launcher");
    assert_eq!(
        field(elastic_builder(1, 2, 100).launcher(Launcher::Process)),
        "launcher"
    );
    assert_eq!(
        field(elastic_builder(1, 2, 100).node_max_restarts(3)),
        "node_max_restarts"
    );
    let min_only = DistributedCollector::builder()
        .env("Counting")
        .frames_per_batch(10)
        .min_nodes(2);
    assert_eq!(field(min_only), "max_nodes");
}

#[test]
fn with_no_node_left_an_elastic_run_fails_clearly_once_none_joined_within_the_join_timeout() {
    let b = elastic_builder(1, 2, -1).join_timeout(Duration::from_secs(1));
    let (t, addr) = build_on_a_thread(b);
    let only = member(addr, 0);
    let mut c = t.join().expect("collector thread");
    c.next_batch().expect("ok").expect("a batch");
    only.leave.leave();
    assert!(only.thread.join().expect("node thread").is_ok(), "it left cleanly");
    let start = Instant::now();
    let err = loop {
        match c.next_batch() {
            // Batches it sent before it left are still yielded.
            Ok(Some(_)) => assert!(start.elapsed() < DEADLINE, "batches after the node left"),
            Ok(None) => panic!("an endless run ended"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(
        err.contains("no node left in the elastic run and none joined within 1.0 s"),
        "{err}"
    );
    assert!(start.elapsed() < DEADLINE);
}

// ---------------------------------------------------------------- message level (testkit)

#[test]
fn through_the_testkit_a_joiner_gets_weights_seed_and_work_and_a_reused_slot_repeats_no_id() {
    use rollout::machine::trainer::Membership;
    use rollout::message::{FromNode, ToNode};
    use rollout_actors::testkit::{scripted_batch, TrainerHarness};
    let membership = Membership {
        min_nodes: 1,
        empty_timeout: DEADLINE,
    };
    // Two slots of one env each, total 40 frames of 10: slot 1 free at the start.
    let cfg = rollout_tests::trainer_config(2, 1, 10, Some(40), false);
    let mut t = TrainerHarness::elastic(cfg, membership, &[0]).expect("elastic");
    t.set_seed(5);
    t.reply(FromNode::Seeded { node: 0, next_seed: 6 }).expect("seeded");
    t.take_sent();
    t.request().expect("request");
    let c = t.take_continues();
    assert_eq!(
        c.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        vec![0],
        "the free slot gets nothing"
    );
    t.reply(FromNode::Batch(scripted_batch(0, c[0].1, 1, 0, 0.0)))
        .expect("batch");
    let version = t.set_weights(value_weights(2.0));
    // Node 0 goes on (its batch was yielded); then a node joins slot 1.
    assert_eq!(t.take_continues().iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![0]);
    t.node_joined(1).expect("join");
    let sent: Vec<(usize, &str)> = t.take_sent().iter().map(|(n, m)| (*n, m.name())).collect();
    assert_eq!(
        sent,
        vec![(1, "update_weights"), (1, "seed"), (1, "continue")],
        "in that order"
    );
    // Node 0 leaves with its next Continue in flight: not waited for.
    t.request().expect("request");
    t.reply(FromNode::Leave { node: 0 }).expect("a leave is no error");
    assert!(t.take_sent().iter().all(|(_, m)| !matches!(m, ToNode::Shutdown)));
    // A new node takes slot 0 again; both collect the rest.
    t.node_joined(0).expect("rejoin of the free slot");
    let mut yielded = t.take_yielded();
    while !t.finished() {
        for (node, c) in t.take_continues() {
            t.reply(FromNode::Batch(scripted_batch(node, c, 1, version, 0.0)))
                .expect("batch");
        }
        yielded.extend(t.take_yielded());
        t.request().expect("request");
        yielded.extend(t.take_yielded());
    }
    let frames: usize = yielded.iter().map(|b| b.data.numel()).sum();
    assert_eq!(frames, 40, "total_frames exact");
    // Slot 0's first node and its second both wrote id 0; the second's are shifted.
    let ids_of = |node: usize| -> Vec<i64> {
        yielded
            .iter()
            .filter(|b| b.node == Some(node))
            .flat_map(|b| {
                b.data
                    .i64(keys::TRAJ_IDS)
                    .expect("ids")
                    .iter()
                    .copied()
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    // (Scripted batches number every trajectory 0; a real node's ids follow its lane.)
    let slot0 = ids_of(0);
    assert!(slot0.contains(&0) && slot0.contains(&2), "{slot0:?}");
    assert!(
        slot0.iter().all(|&i| i == 0 || i == 2),
        "moved past 0 by the lanes (2): {slot0:?}"
    );
}

// ---------------------------------------------------------------- the command line

#[test]
fn rollout_collect_refuses_elastic_flags_that_cannot_work_with_exit_2_and_one_line_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--max-nodes", "2", "--min-nodes", "3", "--launcher", "external"],
            "`min_nodes`",
        ),
        (&["--max-nodes", "0", "--launcher", "external"], "`max_nodes`"),
        (&["--min-nodes", "2", "--launcher", "external"], "`max_nodes`"),
        (&["--max-nodes", "2", "--launcher", "external", "--sync"], "`sync`"),
        (
            &["--max-nodes", "2", "--launcher", "external", "--nodes", "2"],
            "`nodes`",
        ),
        (&["--max-nodes", "2"], "`launcher`"),
        (&["--max-nodes", "2", "--launcher", "process"], "`launcher`"),
        (
            &["--max-nodes", "2", "--launcher", "external", "--node-max-restarts", "3"],
            "`node_max_restarts`",
        ),
        (
            &[
                "--max-nodes",
                "2",
                "--launcher",
                "external",
                "--checkpoint",
                "/nonexistent/ck",
            ],
            "`checkpoint`",
        ),
    ];
    for (flags, named) in cases {
        let run = rollout_tests::run_bounded(
            Command::new(rollout_bin())
                .args(["collect", "--env", "Counting", "--quiet"])
                .args(*flags)
                .env("ROLLOUT_TOKEN", std::str::from_utf8(TOKEN).expect("utf8"))
                .env_remove("RUST_LOG"),
            DEADLINE,
        )
        .expect("spawn rollout");
        let err = run.stderr_text();
        assert_eq!(run.code(), Some(2), "{flags:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{flags:?}: one line: {err}");
        assert!(err.contains(named), "{flags:?} names {named}: {err}");
    }
}

#[test]
fn rollout_collect_with_max_nodes_runs_elastic_with_nodes_joining_from_outside() {
    use std::io::{BufRead, BufReader};
    let mut collect = Command::new(rollout_bin())
        .args([
            "collect", "--env", "Counting", "--policy", "constant", "--quiet", "--json",
        ])
        .args(["--launcher", "external", "--listen", "127.0.0.1:0"])
        .args(["--min-nodes", "1", "--max-nodes", "3"])
        .args([
            "--frames-per-batch",
            "20",
            "--total-frames",
            "1000",
            "--join-timeout",
            "20",
        ])
        .env("ROLLOUT_TOKEN", std::str::from_utf8(TOKEN).expect("utf8"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn rollout collect");
    let mut out = BufReader::new(collect.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("the listening line");
    let listening: serde_json::Value = serde_json::from_str(&first).expect("JSON");
    let addr: SocketAddr = listening["listening"].as_str().expect("address").parse().expect("addr");
    let mut nodes = vec![node_process(addr, 0), node_process(addr, 2)];
    // The rest of stdout on a thread, so the run is never held by a full pipe.
    let rest = thread::spawn(move || out.lines().map_while(Result::ok).collect::<Vec<String>>());
    let st = wait_with_deadline(&mut collect, DEADLINE);
    assert!(st.is_some_and(|s| s.success()), "rollout collect: {st:?}");
    let lines = rest.join().expect("reader");
    let summary: serde_json::Value = serde_json::from_str(lines.last().expect("summary")).expect("JSON");
    assert_eq!(summary["frames"], 1000, "{summary}");
    let nodes_seen: std::collections::BTreeSet<u64> = lines[..lines.len() - 1]
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["node"].as_u64())
        .collect();
    assert!(
        nodes_seen.iter().all(|&n| n == 0 || n == 2),
        "slots asked for: {nodes_seen:?}"
    );
    for n in &mut nodes {
        let st = wait_with_deadline(n, DEADLINE);
        // A node admitted before the end is shut down (exit 0); one that came after it
        // found the trainer gone (exit 1): both are fine, neither may hang.
        assert!(st.is_some(), "a node outlived the run");
    }
}
