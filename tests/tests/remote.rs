//! Remote nodes over real loopback sockets: process nodes, nodes joined by hand,
//! a node library call with a custom env, and every kind of bad input — each of
//! which must close that one connection with a logged reason while the trainer
//! goes on serving the other nodes.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc::RecvTimeoutError;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ndarray::ArrayD;
use rollout::message::{Continue, FromNode, ToNode};
use rollout::rollout::keys;
use rollout::wire::{self, Hello, NodeFrame, TrainerFrame, Welcome, PROTOCOL_VERSION};
use rollout::{Counting, CountingConfig, Env, EnvError, PolicyConfig, Registry, Tensor, TensorDict, Weights};
use rollout_actors::remote::{run_node, NodeOptions};
use rollout_actors::{CollectError, Collected, DistributedCollector, Launcher};
use rollout_tests::{
    alive, built_on_a_thread, connect, counting_process_builder, good_node, good_node_named, handshake, hello,
    holds_for, listening_on_a_thread, logs, real_batch, recv, rollout_bin, send, unique_name, value_weights, OwnLog,
};

const TOKEN: &[u8] = b"s3cret-token-for-tests";
const DEADLINE: Duration = Duration::from_secs(20);

/// A trainer expecting `nodes` external nodes, built on a thread (build waits for the
/// joins), and the address it listens on.
fn trainer(nodes: usize, sync: bool, total: i64) -> (JoinHandle<DistributedCollector>, SocketAddr) {
    built_on_a_thread(
        DistributedCollector::builder()
            .env("Counting")
            .policy(PolicyConfig::Constant { value: 1.0 })
            .nodes(nodes)
            .frames_per_batch(100)
            .total_frames(total)
            .sync(sync)
            .seed(0)
            .launcher(Launcher::External)
            .token(TOKEN)
            .handshake_timeout(Duration::from_millis(500))
            .heartbeat(Duration::from_millis(100), Duration::from_millis(1500))
            .join_timeout(DEADLINE)
            .batch_timeout(DEADLINE),
    )
}

/// Reads until the trainer closes; returns the reason of a `Reject`, if one came.
fn until_closed(s: &mut TcpStream) -> Option<String> {
    let mut reason = None;
    while let Some(f) = recv(s) {
        if let TrainerFrame::Reject { reason: r } = f {
            reason = Some(r);
        }
    }
    reason
}

/// Whose batches a run yields.
enum From<'a> {
    /// Sync: every batch holds a share of every node, and names none.
    EveryNode,
    /// Async: every batch is one node's, one of these.
    Nodes(&'a [usize]),
}

/// The run completes with exact frames, every batch from `from`.
fn finish(t: JoinHandle<DistributedCollector>, total: usize, from: From) -> Vec<Collected> {
    let mut c = t.join().expect("trainer thread");
    let mut batches = Vec::new();
    while let Some(b) = c.next_batch().expect("batch") {
        batches.push(b);
    }
    let frames: usize = batches.iter().map(|b| b.data.numel()).sum();
    assert_eq!(frames, total);
    for (i, b) in batches.iter().enumerate() {
        match (&from, b.node) {
            (From::EveryNode, None) => {}
            (From::Nodes(nodes), Some(n)) if nodes.contains(&n) => {}
            (From::EveryNode, Some(n)) => panic!("sync batch {i} names node {n}"),
            (From::Nodes(nodes), n) => panic!("batch {i} from {n:?}, not one of the nodes {nodes:?}"),
        }
    }
    c.shutdown().expect("shutdown");
    batches
}

fn pre_handshake_case(rogue: impl FnOnce(&mut TcpStream) -> Option<String>, expect_reason: &str) {
    let (t, addr) = trainer(2, false, 600);
    let mut s = connect(addr, DEADLINE);
    let log = OwnLog::peer(&s);
    let reason = rogue(&mut s);
    if let Some(r) = reason {
        assert!(r.contains(expect_reason), "reject reason `{r}` lacks `{expect_reason}`");
    }
    log.assert_logged(expect_reason);
    let nodes = [good_node(addr, TOKEN, None), good_node(addr, TOKEN, None)];
    finish(t, 600, From::Nodes(&[0, 1]));
    for n in nodes {
        assert_eq!(n.join().expect("node thread"), Ok(()));
    }
}

#[test]
fn garbage_bytes_instead_of_a_frame() {
    pre_handshake_case(
        |s| {
            s.write_all(&[0, 0, 0, 5, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1]).expect("write");
            until_closed(s)
        },
        "malformed handshake frame",
    );
}

#[test]
fn length_prefix_over_the_maximum() {
    pre_handshake_case(
        |s| {
            s.write_all(&u32::MAX.to_be_bytes()).expect("write");
            until_closed(s)
        },
        "exceeds the maximum",
    );
}

#[test]
fn truncated_frame_then_eof() {
    pre_handshake_case(
        |s| {
            s.write_all(&[0, 0, 0, 100, 1, 2, 3]).expect("write");
            s.shutdown(std::net::Shutdown::Write).expect("shutdown");
            until_closed(s)
        },
        "frame cut short",
    );
}

#[test]
fn valid_msgpack_of_the_wrong_message() {
    pre_handshake_case(
        |s| {
            send(s, &NodeFrame::Heartbeat);
            until_closed(s)
        },
        "expected hello, got heartbeat",
    );
}

#[test]
fn wrong_token_is_rejected() {
    pre_handshake_case(
        |s| match handshake(s, b"not-the-token", "intruder", None) {
            TrainerFrame::Reject { reason } => {
                assert!(recv(s).is_none(), "closed after the reject");
                Some(reason)
            }
            other => panic!("admitted with a wrong token: {other:?}"),
        },
        "wrong token",
    );
}

#[test]
fn wrong_protocol_version_is_rejected() {
    pre_handshake_case(
        |s| {
            hello(s, PROTOCOL_VERSION + 1, "future", None);
            until_closed(s)
        },
        &format!("protocol version {} is not supported", PROTOCOL_VERSION + 1),
    );
}

#[test]
fn silent_client_is_closed_at_the_handshake_deadline() {
    pre_handshake_case(
        |s| {
            let start = Instant::now();
            let r = until_closed(s);
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "closed in {:?}",
                start.elapsed()
            );
            r
        },
        "handshake not done within 0.5 s",
    );
}

#[test]
fn a_hello_a_byte_at_a_time_is_closed_at_the_handshake_deadline() {
    pre_handshake_case(
        |s| {
            // A byte every 50 ms: the whole hello would take seconds, bytes keep coming
            // past the deadline.
            let mut w = s.try_clone().expect("clone");
            let hello = wire::encode(
                &NodeFrame::Hello(Hello {
                    protocol_version: PROTOCOL_VERSION,
                    node_name: "slow".into(),
                    node_index: None,
                }),
                wire::DEFAULT_MAX_FRAME,
            )
            .expect("encode");
            let slow = thread::spawn(move || {
                let mut next = Instant::now();
                for b in hello {
                    if w.write_all(&[b]).is_err() {
                        return;
                    }
                    // The attacker's pace, not a wait for anything.
                    next += Duration::from_millis(50);
                    thread::sleep(next.saturating_duration_since(Instant::now()));
                }
            });
            let start = Instant::now();
            let r = until_closed(s);
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "closed in {:?}",
                start.elapsed()
            );
            let _ = slow.join();
            r
        },
        "handshake not done within 0.5 s",
    );
}

#[test]
fn index_taken_and_late_nodes_are_rejected() {
    let (t, addr) = trainer(2, false, 600);
    let name = unique_name("first");
    let log = OwnLog::node(&name);
    let first = good_node_named(addr, TOKEN, Some(0), name);
    // Wait until node 0 is in, then claim its index.
    log.assert_logged("node joined");
    let mut s = connect(addr, DEADLINE);
    match handshake(&mut s, TOKEN, "twin", Some(0)) {
        TrainerFrame::Reject { reason } => assert!(reason.contains("node index 0 is already taken"), "{reason}"),
        other => panic!("a second node 0 was admitted: {other:?}"),
    }
    let second = good_node(addr, TOKEN, None);
    let mut c = t.join().expect("trainer");
    let mut late = connect(addr, DEADLINE);
    match handshake(&mut late, TOKEN, "late", None) {
        TrainerFrame::Reject { reason } => assert!(reason.contains("all 2 node slots are taken"), "{reason}"),
        other => panic!("a third node was admitted: {other:?}"),
    }
    let mut frames = 0;
    while let Some(b) = c.next_batch().expect("batch") {
        frames += b.data.numel();
    }
    assert_eq!(frames, 600);
    c.shutdown().expect("shutdown");
    assert_eq!(first.join().expect("node"), Ok(()));
    assert_eq!(second.join().expect("node"), Ok(()));
}

/// A node that joins properly as node 0 (Ready included), then answers its first
/// Continue with `bad`.
fn post_join_case(bad: impl FnOnce(&mut TcpStream, &Welcome, Continue), expect_reason: &str) {
    post_join_case_ready(true, bad, expect_reason)
}

/// [`post_join_case`], sending `Ready` after the handshake or not.
fn post_join_case_ready(ready: bool, bad: impl FnOnce(&mut TcpStream, &Welcome, Continue), expect_reason: &str) {
    let (t, addr) = trainer(2, false, 600);
    let mut s = connect(addr, DEADLINE);
    let name = unique_name("rogue");
    let log = OwnLog::node(&name);
    let TrainerFrame::Welcome(welcome) = handshake(&mut s, TOKEN, &name, Some(0)) else {
        panic!("rogue not admitted");
    };
    if ready {
        let r = welcome
            .spec
            .build_worker(&Registry::with_builtins(), 0)
            .expect("rollout");
        send(
            &mut s,
            &NodeFrame::Message(FromNode::Ready {
                node: 0,
                layout: r.batch_layout(),
                specs: Some(Box::new(r.env_specs())),
            }),
        );
    }
    let good = good_node(addr, TOKEN, Some(1));
    // The consumer pulls batches meanwhile: that is what sends the Continues.
    let driver = thread::spawn(move || finish(t, 600, From::Nodes(&[1])).len());
    // Behave until the first Continue: answer the seeding chain, keep the heartbeat.
    let c = loop {
        send(&mut s, &NodeFrame::Heartbeat);
        match recv(&mut s).expect("the trainer sends work") {
            TrainerFrame::Message(ToNode::Continue(c)) => break c,
            TrainerFrame::Message(ToNode::Seed(seed)) => send(
                &mut s,
                &NodeFrame::Message(FromNode::Seeded {
                    node: 0,
                    next_seed: seed.seed + 1,
                }),
            ),
            _ => continue,
        }
    };
    bad(&mut s, &welcome, c);
    assert!(until_closed(&mut s).is_none());
    log.assert_logged(expect_reason);
    assert!(driver.join().expect("driver") > 0);
    assert_eq!(good.join().expect("node thread"), Ok(()));
}

#[test]
fn batch_before_ready() {
    post_join_case_ready(
        false,
        |s, w, c| {
            let b = real_batch(w, c);
            send(s, &NodeFrame::Message(FromNode::Batch(b)));
        },
        "a Batch before Ready",
    );
}

#[test]
fn batch_with_the_wrong_shape() {
    post_join_case(
        |s, w, c| {
            let mut b = real_batch(w, c);
            b.data = b.data.reshape(&[2, c.frames / 2]).expect("reshape");
            send(s, &NodeFrame::Message(FromNode::Batch(b)));
        },
        "got batch shape [2, 50]",
    );
}

#[test]
fn batch_with_the_wrong_dtype() {
    post_join_case(
        |s, w, c| {
            let mut b = real_batch(w, c);
            let mut entries: BTreeMap<String, Tensor> = b.data.clone().into_entries();
            entries.insert(
                keys::OBSERVATION.into(),
                Tensor::F64(ArrayD::zeros(vec![1, c.frames, 1])),
            );
            b.data = TensorDict::from_entries(&[1, c.frames], entries).expect("dict");
            send(s, &NodeFrame::Message(FromNode::Batch(b)));
        },
        "`observation` must be f32, got f64",
    );
}

#[test]
fn batch_with_the_wrong_frame_count() {
    post_join_case(
        |s, w, c| {
            let b = real_batch(
                w,
                Continue {
                    seq: c.seq,
                    frames: c.frames - 10,
                },
            );
            send(s, &NodeFrame::Message(FromNode::Batch(b)));
        },
        "asked for 100 frames over 1 envs",
    );
}

#[test]
fn batch_for_a_continue_never_sent() {
    post_join_case(
        |s, w, c| {
            let b = real_batch(
                w,
                Continue {
                    seq: c.seq + 1000,
                    frames: c.frames,
                },
            );
            send(s, &NodeFrame::Message(FromNode::Batch(b)));
        },
        "which is not outstanding",
    );
}

#[test]
fn batch_claiming_another_node() {
    post_join_case(
        |s, w, c| {
            let mut b = real_batch(w, c);
            b.node = 1;
            send(s, &NodeFrame::Message(FromNode::Batch(b)));
        },
        "node 0 sent a message as node 1",
    );
}

#[test]
fn handshake_frame_after_the_handshake() {
    post_join_case(
        |s, _w, _c| hello(s, PROTOCOL_VERSION, "again", None),
        "handshake frame after the handshake",
    );
}

#[test]
fn garbage_after_the_handshake() {
    post_join_case(
        |s, _w, _c| s.write_all(&[0, 0, 0, 3, 0xc1, 0xc1, 0xc1]).expect("write"),
        "bad frame",
    );
}

#[test]
fn silent_node_is_dropped_after_the_heartbeat_timeout() {
    // Joins and then says nothing at all: no heartbeat, no answer to the seeding chain.
    let (t, addr) = trainer(2, false, 600);
    let mut s = connect(addr, DEADLINE);
    let name = unique_name("mute");
    let log = OwnLog::node(&name);
    assert!(matches!(
        handshake(&mut s, TOKEN, &name, Some(0)),
        TrainerFrame::Welcome(_)
    ));
    let good = good_node(addr, TOKEN, Some(1));
    let driver = thread::spawn(move || finish(t, 600, From::Nodes(&[1])).len());
    let start = Instant::now();
    assert!(until_closed(&mut s).is_none());
    // Timeout 1.5 s, checked every 0.1 s.
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "closed after {:?}",
        start.elapsed()
    );
    log.assert_logged("heartbeat timeout");
    assert!(driver.join().expect("driver") > 0);
    assert_eq!(good.join().expect("node thread"), Ok(()));
}

#[test]
fn sync_run_with_a_lost_node_fails_clearly_instead_of_hanging() {
    let (t, addr) = trainer(2, true, 600);
    let mut s = connect(addr, DEADLINE);
    let name = unique_name("rogue");
    assert!(matches!(
        handshake(&mut s, TOKEN, &name, Some(0)),
        TrainerFrame::Welcome(_)
    ));
    let good = good_node(addr, TOKEN, Some(1));
    let mut c = t.join().expect("trainer");
    drop(s);
    let start = Instant::now();
    // Every sync batch holds a share of node 0, which never sends one: the first call
    // is the failure, naming the node and its lost connection.
    match c.next_batch() {
        Err(CollectError::NodeFailed { node: 0, reason }) => {
            assert!(reason.starts_with(&format!("connection to {name}: ")), "{reason}");
        }
        other => panic!("expected node 0 to fail the run, got {other:?}"),
    }
    assert!(start.elapsed() < DEADLINE, "failed only after {:?}", start.elapsed());
    c.shutdown().ok();
    let _ = good.join();
}

/// A user env that only the user's binary knows: registered on both sides.
fn custom_registry() -> Registry {
    let mut r = Registry::with_builtins();
    r.register("Custom-v0", |_c| -> Result<Box<dyn Env>, EnvError> {
        Ok(Box::new(Counting::new(CountingConfig {
            max_steps: 2,
            ..CountingConfig::default()
        })?))
    });
    r
}

#[test]
fn library_nodes_run_user_envs() {
    logs();
    let (t, addr) = listening_on_a_thread(
        DistributedCollector::builder()
            .env("Custom-v0")
            .registry(custom_registry())
            .policy(PolicyConfig::Constant { value: 1.0 })
            .nodes(2)
            .frames_per_batch(60)
            .total_frames(300)
            .sync(true)
            .launcher(Launcher::External)
            .token(TOKEN)
            .join_timeout(DEADLINE),
        |b| b.build().expect("collector"),
    );
    let nodes: Vec<_> = (0..2)
        .map(|i| {
            thread::spawn(move || {
                let opts = NodeOptions {
                    name: format!("custom-{i}"),
                    registry: custom_registry(),
                    connect_timeout: DEADLINE,
                    ..NodeOptions::default()
                };
                run_node(&addr.to_string(), TOKEN, opts).map_err(|e| e.to_string())
            })
        })
        .collect();
    let batches = finish(t, 300, From::EveryNode);
    // max_steps 2: observations cycle 0, 1, 2.
    let obs: Vec<f32> = batches[0]
        .data
        .f32(keys::OBSERVATION)
        .expect("obs")
        .iter()
        .copied()
        .collect();
    assert_eq!(&obs[..6], &[0., 1., 2., 0., 1., 2.]);
    for n in nodes {
        assert_eq!(n.join().expect("node"), Ok(()));
    }
}

fn process_collector(sync: bool, fpb: usize, total: i64) -> DistributedCollector {
    logs();
    counting_process_builder(sync, fpb, total).build().expect("collector")
}

/// Weights pushed after the first batch reach process nodes: every batch's actions are
/// those of the version it carries. Sync: every later round is asked after the push, so
/// every later batch carries version 1. Async (first ready, first served): a node's
/// batches asked before the push still carry version 0 and may come last (a slow
/// node's first batch can be the run's last), but a node has at most two `Continue`s
/// unanswered (one sent ahead of a batch on its way), and once it carries version 1 it
/// never goes back; so of the 5 later batches at most 4 carry version 0.
#[test]
fn process_nodes_take_weight_updates() {
    for sync in [true, false] {
        let mut c = process_collector(sync, 50, 300);
        // (node, weights version) of every batch in yield order.
        let mut seen: Vec<(Option<usize>, u64)> = Vec::new();
        while let Some(b) = c.next_batch().expect("batch") {
            let action = if b.weights_version == 0 { 1.0 } else { 2.0 };
            assert!(b.weights_version <= 1, "sync={sync}: version {}", b.weights_version);
            assert!(
                b.data.f32(keys::ACTION).expect("a").iter().all(|&a| a == action),
                "sync={sync} batch {}: actions of version {}",
                seen.len(),
                b.weights_version
            );
            if seen.is_empty() {
                assert_eq!(b.weights_version, 0, "sync={sync}: the first batch");
                c.update_policy_weights(value_weights(2.0), None).expect("push");
            }
            seen.push((b.node, b.weights_version));
        }
        assert_eq!(seen.len(), 6, "sync={sync}: 300 frames in batches of 50");
        let later = &seen[1..];
        if sync {
            assert!(later.iter().all(|&(_, v)| v == 1), "sync: {seen:?}");
            continue;
        }
        for node in [0, 1] {
            let versions: Vec<u64> = later.iter().filter(|s| s.0 == Some(node)).map(|s| s.1).collect();
            assert!(versions.is_sorted(), "node {node} went back to version 0: {seen:?}");
            let old = versions.iter().filter(|&&v| v == 0).count();
            assert!(
                old <= 2,
                "node {node}: {old} batches of version 0 after the push: {seen:?}"
            );
        }
        assert!(later.iter().any(|&(_, v)| v == 1), "no batch took the update: {seen:?}");
    }
}

/// CartPole batches; `recycle` hands every batch back (with process nodes its storage
/// then takes a later batch on the trainer). Sync (2 nodes) pushes new weights after
/// every batch, so old weight versions take later updates on process nodes; async
/// runs one node and pushes nothing, so that its batches do not depend on timing.
/// `hidden`: an MLP policy of these widths instead of the linear one — with
/// [256, 256] (67,586 parameters) it computes from the named tensors and its
/// updates go out in parts from the tensors' own memory.
fn reused_storage_run(launcher: Launcher, sync: bool, recycle: bool, hidden: &[usize]) -> Vec<(u64, TensorDict)> {
    let nodes = if sync { 2 } else { 1 };
    let (policy, batches) = if hidden.is_empty() {
        (PolicyConfig::Linear, 10)
    } else {
        (
            PolicyConfig::Mlp {
                hidden: hidden.to_vec(),
            },
            4,
        )
    };
    let mut c = DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(policy)
        .nodes(nodes)
        .frames_per_batch(200)
        .total_frames(200 * batches)
        .sync(sync)
        .seed(3)
        .launcher(launcher)
        .node_program(rollout_bin())
        .join_timeout(DEADLINE)
        .batch_timeout(DEADLINE)
        .build()
        .expect("collector");
    let mut out = Vec::new();
    while let Some(b) = c.next_batch().expect("batch") {
        if sync {
            c.update_policy_weights(pushed_weights(out.len(), hidden), None)
                .expect("push");
        }
        out.push((b.weights_version, b.data.clone()));
        if recycle {
            c.recycle(b);
        }
    }
    // Every batch handed back is counted, and none that was not.
    let recycled = c.stats().expect("stats").batches_recycled;
    assert_eq!(recycled, if recycle { out.len() as u64 } else { 0 });
    c.shutdown().expect("shutdown");
    out
}

/// The weights pushed after batch `i`: distinct for every `i`.
fn pushed_weights(i: usize, hidden: &[usize]) -> Weights {
    if !hidden.is_empty() {
        let obs = rollout::Spec::uniform_box(4, f32::NEG_INFINITY, f32::INFINITY);
        let act = rollout::Spec::Discrete { n: 2 };
        let mlp = rollout::policy::Mlp::new(&obs, &act, hidden, 100 + i as u64, 0).expect("mlp");
        return rollout::Policy::weights(&mlp).clone();
    }
    let i = i as f32;
    let mut t = BTreeMap::new();
    t.insert(
        "weight".to_string(),
        Tensor::F32(ArrayD::from_shape_fn(vec![2, 4], |d| {
            (d[0] as f32 - 0.5) * (d[1] as f32 + i) * 0.3
        })),
    );
    t.insert("bias".to_string(), Tensor::F32(ArrayD::from_elem(vec![2], 0.1 * i)));
    Weights::new(t)
}

/// Process nodes decode batches (trainer) and weight updates (nodes) into storage
/// freed earlier, and large updates go out from the tensors' own memory; the
/// in-process run, where nothing is encoded or decoded, is the reference.
#[test]
fn reusing_batch_and_weight_storage_changes_no_frame() {
    for hidden in [&[][..], &[256, 256][..]] {
        for sync in [true, false] {
            let fresh = reused_storage_run(Launcher::Local, sync, false, hidden);
            let reused = reused_storage_run(Launcher::Process, sync, true, hidden);
            let n = if hidden.is_empty() { 10 } else { 4 };
            assert_eq!(fresh.len(), n);
            if sync {
                let versions: Vec<u64> = fresh.iter().map(|b| b.0).collect();
                assert_eq!(
                    versions,
                    (0..n as u64).collect::<Vec<u64>>(),
                    "each batch used the weights pushed before it"
                );
            }
            for (i, (a, b)) in fresh.iter().zip(&reused).enumerate() {
                assert_eq!(a.0, b.0, "hidden={hidden:?} sync={sync} batch {i}: weights version");
                assert_eq!(a.1, b.1, "hidden={hidden:?} sync={sync} batch {i}: frames");
            }
        }
    }
}

/// Two sync process nodes with frames of at most 4 KiB, and a `batch_timeout` far
/// longer than the tests' deadline (a failure must not wait for it).
fn small_frames(env: &str, policy: PolicyConfig, fpb: usize) -> DistributedCollector {
    small_frames_builder(env, policy, fpb).build().expect("collector")
}

fn small_frames_builder(env: &str, policy: PolicyConfig, fpb: usize) -> rollout_actors::CollectorBuilder {
    DistributedCollector::builder()
        .env(env)
        .policy(policy)
        .nodes(2)
        .frames_per_batch(fpb)
        .total_frames(fpb as i64 * 100)
        .sync(true)
        .seed(0)
        .max_frame(4096)
        .launcher(Launcher::Process)
        .node_program(rollout_bin())
        .join_timeout(DEADLINE)
        .batch_timeout(Duration::from_secs(120))
}

/// Batches or weight updates that cannot fit in the maximum frame are a configuration
/// error at build time, naming `max_frame` and what does not fit, before any node starts.
#[test]
fn frames_that_cannot_fit_the_maximum_are_refused_at_build() {
    // 200 frames of 75 bytes per node (with the linear policy's log-probs and logits).
    let err = small_frames_builder("CartPole-v1", PolicyConfig::Linear, 400)
        .build()
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("max_frame") && err.contains("batches of 200 frames hold 15000 bytes"),
        "{err}"
    );
    // 3,073 parameters: 12 KB of weights.
    let err = small_frames_builder("Counting", PolicyConfig::Mlp { hidden: vec![1024] }, 20)
        .build()
        .expect_err("refused")
        .to_string();
    assert!(err.contains("max_frame") && err.contains("3073 parameters"), "{err}");
    // In-process nodes exchange no frames.
    small_frames_builder("Counting", PolicyConfig::Mlp { hidden: vec![1024] }, 20)
        .launcher(Launcher::Local)
        .build()
        .expect("local nodes have no frames")
        .shutdown()
        .expect("shutdown");
}

/// A node whose batch cannot be sent (over the maximum frame size) says so: the sync
/// run fails at once naming the node and why, instead of waiting for `batch_timeout`.
#[test]
fn a_batch_over_the_maximum_frame_fails_its_node_with_the_reason() {
    // 54 frames of 75 bytes per node (63 of the env's keys, 12 of the policy's
    // `action_log_prob` and `logits`): 4,050 bytes of tensors fit the 4,096 the build
    // checks, and the frame's headers tip it over.
    let mut c = small_frames("CartPole-v1", PolicyConfig::Linear, 108);
    let t = Instant::now();
    let err = c.next_batch().expect_err("no batch fits").to_string();
    assert!(t.elapsed() < DEADLINE, "failed only after {:?}", t.elapsed());
    assert!(
        err.contains("cannot send its batch") && err.contains("exceeds the maximum of 4096"),
        "{err}"
    );
    c.shutdown().expect("shutdown");
}

/// Weights that do not fit the policy (here 12 KB more than it has, over the maximum
/// frame size too) are refused before they are stored: no node is sent them, and the
/// run goes on with the weights it has.
#[test]
fn weights_with_a_tensor_the_policy_lacks_are_refused_before_any_frame() {
    let mut c = small_frames("Counting", PolicyConfig::Linear, 20);
    let first = c.next_batch().expect("ok").expect("a batch");
    assert_eq!(first.weights_version, 0);
    let obs = rollout::Spec::uniform_box(1, f32::NEG_INFINITY, f32::INFINITY);
    let act = rollout::Spec::uniform_box(1, 0.0, 1.0);
    let linear = rollout::policy::Linear::new(&obs, &act, 5, 0).expect("linear");
    let mut w = rollout::Policy::weights(&linear).clone();
    w.tensors.insert(
        "extra".into(),
        rollout::Tensor::F32(ndarray::ArrayD::zeros(ndarray::IxDyn(&[3072]))),
    );
    match c.update_policy_weights(w, None) {
        Err(rollout_actors::CollectError::Config(e)) => {
            assert_eq!((e.field, e.reason.as_str()), ("weights", "unexpected tensor `extra`"))
        }
        other => panic!("expected the weights to be refused, got {other:?}"),
    }
    let next = c.next_batch().expect("the run goes on").expect("a batch");
    assert_eq!(next.weights_version, 0, "nothing was stored");
    c.shutdown().expect("shutdown");
}

#[test]
fn process_nodes_are_reaped_when_the_trainer_is_dropped_mid_run() {
    let mut c = process_collector(false, 100, -1);
    let pids = c.node_pids();
    c.next_batch().expect("ok").expect("batch");
    drop(c);
    for p in pids {
        assert!(!alive(p), "node process {p} left behind");
    }
}

#[test]
fn endless_process_run_shuts_down_cleanly() {
    for sync in [false, true] {
        let mut c = process_collector(sync, 10_000, -1);
        let pids = c.node_pids();
        for _ in 0..5 {
            c.next_batch().expect("ok").expect("batch");
        }
        let start = Instant::now();
        c.shutdown().expect("shutdown");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "shutdown took {:?}",
            start.elapsed()
        );
        for p in pids {
            assert!(!alive(p), "node process {p} left behind");
        }
    }
}

/// Issue 5: a remote node whose socket is cut in the middle of a frame is detected
/// at once, and with supervision on the trainer frees its slot, waits for a node to
/// rejoin under its index and completes the run exactly, each share once (sync).
#[test]
fn socket_cut_mid_frame_is_detected_and_the_rejoined_node_completes_the_run() {
    logs();
    let (t, addr) = listening_on_a_thread(
        DistributedCollector::builder()
            .env("Counting")
            .policy(PolicyConfig::Constant { value: 1.0 })
            .nodes(2)
            .frames_per_batch(100)
            .total_frames(600)
            .sync(true)
            .seed(0)
            .launcher(Launcher::External)
            .token(TOKEN)
            .heartbeat(Duration::from_millis(100), Duration::from_millis(1500))
            .node_max_restarts(2)
            .join_timeout(DEADLINE)
            .batch_timeout(DEADLINE),
        |b| b.build().expect("collector"),
    );
    let mut s = connect(addr, DEADLINE);
    let name = unique_name("cut");
    let log = OwnLog::node(&name);
    let TrainerFrame::Welcome(welcome) = handshake(&mut s, TOKEN, &name, Some(0)) else {
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
            node: 0,
            layout,
            specs: None,
        }),
    );
    let other = good_node(addr, TOKEN, Some(1));
    let driver = thread::spawn(move || {
        let mut c = t.join().expect("trainer thread");
        let mut batches = Vec::new();
        while let Some(b) = c.next_batch().expect("batch") {
            batches.push(b);
        }
        let restarts = c.stats().expect("stats").restarts;
        c.shutdown().expect("shutdown");
        (batches, restarts)
    });
    let c = loop {
        send(&mut s, &NodeFrame::Heartbeat);
        match recv(&mut s).expect("the trainer sends work") {
            TrainerFrame::Message(ToNode::Continue(c)) => break c,
            TrainerFrame::Message(ToNode::Seed(seed)) => send(
                &mut s,
                &NodeFrame::Message(FromNode::Seeded {
                    node: 0,
                    next_seed: seed.seed + 1,
                }),
            ),
            _ => continue,
        }
    };
    // Half of a real answer, then the connection is gone.
    let frame = wire::encode(
        &NodeFrame::Message(FromNode::Batch(real_batch(&welcome, c))),
        wire::DEFAULT_MAX_FRAME,
    )
    .expect("encode");
    s.write_all(&frame[..frame.len() / 2]).expect("write");
    let cut = Instant::now();
    drop(s);
    log.assert_logged("connection closed inside a frame");
    assert!(
        cut.elapsed() < Duration::from_secs(5),
        "detected after {:?}",
        cut.elapsed()
    );
    // The replacement joins under index 0, as a scheduler would start it.
    let replacement = good_node(addr, TOKEN, Some(0));
    let (batches, restarts) = driver.join().expect("driver");
    let frames: usize = batches.iter().map(|b| b.data.numel()).sum();
    assert_eq!(frames, 600);
    assert!(
        batches.iter().all(|b| b.data.batch_size() == [2, 1, 50]),
        "every sync batch whole"
    );
    rollout_tests::assert_unique_traj_ids(&batches);
    assert_eq!(restarts, vec![1, 0]);
    assert_eq!(replacement.join().expect("node"), Ok(()));
    assert_eq!(other.join().expect("node"), Ok(()));
}

#[test]
fn a_node_waiting_in_the_lobby_longer_than_the_heartbeat_timeout_stays_and_the_run_is_exact() {
    // Node 0 joins, then node 1 only after more than the heartbeat timeout: meanwhile
    // node 0 hears only the lobby's heartbeats, and must not leave for silence.
    let timeout = Duration::from_millis(600);
    logs();
    let (t, addr) = listening_on_a_thread(
        DistributedCollector::builder()
            .env("Counting")
            .policy(PolicyConfig::Constant { value: 1.0 })
            .nodes(2)
            .frames_per_batch(100)
            .total_frames(600)
            .sync(true)
            .seed(0)
            .launcher(Launcher::External)
            .token(TOKEN)
            .heartbeat(Duration::from_millis(100), timeout)
            .join_timeout(DEADLINE)
            .batch_timeout(DEADLINE),
        |b| b.build().expect("collector"),
    );
    let first = unique_name("early");
    let log = OwnLog::node(&first);
    let early = good_node_named(addr, TOKEN, Some(0), first);
    log.assert_logged("node joined");
    // The condition under test is time passing with node 0 admitted and node 1 not:
    // two and a half heartbeat timeouts of it, node 0 watched all along.
    holds_for(timeout * 5 / 2, "node 0 waiting in the lobby", || !early.is_finished());
    let late = good_node(addr, TOKEN, Some(1));
    finish(t, 600, From::EveryNode);
    assert_eq!(early.join().expect("node 0 thread"), Ok(()), "node 0 stayed to the end");
    assert_eq!(late.join().expect("node 1 thread"), Ok(()));
}

/// A Rust node answers each of the trainer's heartbeats with one of its own (so a
/// trainer's nodes beat on its clock and their heartbeats reach it together), and once
/// the trainer's stop it beats alone, 1.25 intervals after its last.
#[test]
fn a_node_answers_the_trainers_heartbeats_and_beats_alone_once_they_stop() {
    use rollout_tests::{scripted_join, scripted_node_result};

    const INTERVAL: Duration = Duration::from_millis(400);
    let (mut t, node) = scripted_join(one_env_spec(), None, INTERVAL.as_millis() as u64);
    assert!(matches!(t.recv(), Some(NodeFrame::Message(FromNode::Ready { .. }))));
    // Every frame the node sends from here on, with the time it came.
    let mut read = rollout_tests::Scripted {
        s: t.s.try_clone().expect("clone"),
    };
    let (tx, frames) = std::sync::mpsc::channel();
    let reader = thread::spawn(move || {
        while let Some(f) = read.frame() {
            if tx.send((Instant::now(), f)).is_err() {
                return;
            }
        }
    });
    // The node's heartbeats that come until `until`.
    let mut node_beats = Vec::new();
    let mut beats_until = |until: Instant| loop {
        match frames.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok((at, NodeFrame::Heartbeat)) => node_beats.push(at),
            Ok((_, other)) => panic!("only heartbeats while idle, got {}", other.name()),
            Err(RecvTimeoutError::Timeout) if Instant::now() >= until => return,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => panic!("the node's frames ended"),
        }
    };
    // Eight trainer beats an interval apart, off the node's own phase (the node's beats
    // taken as they come in between), then none for four intervals.
    let start = Instant::now() + INTERVAL / 3;
    let beats: Vec<Instant> = (0..8).map(|k| start + INTERVAL * k).collect();
    for &at in &beats {
        beats_until(at);
        t.send(&TrainerFrame::Heartbeat);
    }
    let last = beats[beats.len() - 1];
    beats_until(last + INTERVAL * 9 / 2);
    // From the third trainer beat on (the node's own first beat may come before the
    // trainer's first): exactly one node heartbeat per trainer beat, within half an
    // interval after it, none in the rest of the interval.
    let count = |from: Instant, to: Instant| node_beats.iter().filter(|&&a| a >= from && a < to).count();
    for (k, &beat) in beats.iter().enumerate().skip(2) {
        assert_eq!(
            count(beat, beat + INTERVAL / 2),
            1,
            "answers to trainer beat {k}: {node_beats:?}"
        );
        if let Some(&next) = beats.get(k + 1) {
            assert_eq!(
                count(beat + INTERVAL / 2, next),
                0,
                "own beats between trainer beats {k} and {}",
                k + 1
            );
        }
    }
    // Alone: from its last answer on, its own beats 1.25 intervals apart (at least
    // two in four intervals).
    let alone: Vec<Instant> = node_beats.iter().copied().filter(|&a| a >= last).collect();
    assert!(
        alone.len() >= 3,
        "the last answer and at least two of its own: {alone:?}"
    );
    for pair in alone.windows(2) {
        let gap = pair[1].duration_since(pair[0]);
        assert!(
            gap >= INTERVAL && gap < INTERVAL * 2,
            "gap {gap:?} between the node's own beats"
        );
    }
    t.send(&TrainerFrame::Message(ToNode::Shutdown));
    assert_eq!(scripted_node_result(node), Ok(()));
    drop(frames);
    reader.join().expect("reader");
}

/// After its `down` a Rust node closes cleanly: its write side shut, it reads what the
/// trainer still sends until the trainer closes. A node that closed at once would answer
/// those bytes with a reset, and a reset throws away whatever the node still had queued to
/// send (on a slow link, the `down` itself).
#[test]
fn after_its_down_a_node_reads_until_the_trainer_closes() {
    use rollout_tests::{scripted_join, scripted_node_result};

    // Heartbeats far apart: only the frames this test sends.
    let (mut t, node) = scripted_join(one_env_spec(), None, 60_000);
    assert!(matches!(t.recv(), Some(NodeFrame::Message(FromNode::Ready { .. }))));
    t.send(&TrainerFrame::Message(ToNode::Shutdown));
    assert!(matches!(t.recv(), Some(NodeFrame::Message(FromNode::Down { node: 0 }))));
    // Its write side is shut after `down`.
    let mut byte = [0u8; 1];
    assert_eq!(t.s.read(&mut byte).ok(), Some(0), "the end after down");
    // It still reads: heartbeats written for 300 ms all go through (a closed socket
    // would answer the first with a reset, and the writes after it would fail).
    let beat = wire::encode(&TrainerFrame::Heartbeat, 64).expect("encode");
    for i in 0..30 {
        if let Err(e) = t.s.write_all(&beat) {
            panic!("heartbeat {i} after down: {e} (the node closed without reading)");
        }
        // The writes' pace (a reset has time to come back between them), not a wait
        // for anything.
        thread::sleep(Duration::from_millis(10));
    }
    // The trainer closes: the node is done, and ends well.
    drop(t);
    assert_eq!(scripted_node_result(node), Ok(()));
}

/// A one-worker CartPole node with a random policy (needs no weights), for the
/// scripted trainer.
fn one_env_spec() -> rollout::node_spec::NodeSpec {
    rollout::node_spec::NodeSpec::new("CartPole-v1", PolicyConfig::Random, 1)
        .with_env_share(10)
        .with_restarts(0, 5000)
        .with_worker_nice(0)
}
