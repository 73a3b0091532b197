//! A node supervises its env workers (issue #5, lowest level): a worker whose env
//! panics is rebuilt from the spec and its share collected again, one-for-one; past
//! the restart intensity the node fails with a reason naming the worker, the cause
//! and the restarts. Real faults throughout: `Panicky` panics on its Nth step.
//!
//! The first tests pump a node in memory (no threads, no sleeps, a manual clock);
//! the last ones run whole collections with local nodes, every wait bounded.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rollout::machine::NodeMachine;
use rollout::message::{Continue, FromNode, ToNode, UpdateWeights};
use rollout::node_spec::NodeSpec;
use rollout::rollout::keys;
use rollout::supervisor::RestartIntensity;
use rollout::{PolicyConfig, TensorDict};
use rollout_actors::testkit::NodeHarness;
use rollout_actors::{CollectError, DistributedCollector, Launcher};
use rollout_tests::{
    assert_unique_traj_ids, drain, listening_on_a_thread, only_batch, panicky_builder, panicky_registry, value_weights,
};

// ---------------------------------------------------------------- helpers

/// Node 0 of `Panicky` envs (constant action 1.0), `workers` env workers.
fn panicky_spec(workers: usize, max_restarts: u32, window_ms: u64) -> NodeSpec {
    NodeSpec::new("Panicky", PolicyConfig::Constant { value: 1.0 }, workers)
        .with_env_share(4)
        .with_seed(10)
        .with_restarts(max_restarts, window_ms)
}

fn node(panic_at: u64, workers: usize, max_restarts: u32, window_ms: u64) -> NodeHarness {
    let (reg, _) = panicky_registry(panic_at);
    NodeHarness::new(&panicky_spec(workers, max_restarts, window_ms), &reg).expect("node builds")
}

fn cont(seq: u64, frames: usize) -> ToNode {
    ToNode::Continue(Continue { seq, frames })
}

fn only_failure(replies: Vec<FromNode>) -> String {
    assert_eq!(replies.len(), 1, "exactly one message: {replies:?}");
    match replies.into_iter().next() {
        Some(FromNode::Failed { node: 0, reason }) => reason,
        other => panic!("expected node 0 Failed, got {other:?}"),
    }
}

/// Row `r` of a `[rows, t]` i64 entry.
fn row_i64(d: &TensorDict, key: &str, r: usize) -> Vec<i64> {
    let a = d.i64(key).expect("i64 entry");
    let t = *a.shape().last().expect("time dim");
    a.iter().skip(r * t).take(t).copied().collect()
}

fn actions(d: &TensorDict) -> Vec<f32> {
    d.f32(keys::ACTION).expect("f32 actions").iter().copied().collect()
}

// ---------------------------------------------------------------- message level

#[test]
fn a_worker_failing_mid_collect_is_rebuilt_and_the_batch_still_arrives_whole_once() {
    // 2 workers, 4 frames each per Continue; every env instance panics on step 6.
    let mut n = node(6, 2, 5, 5000);
    let first = only_batch(n.send(cont(1, 8)));
    assert_eq!(first.data.batch_size(), &[2, 4]);
    assert!(n.restarts().is_empty());
    // Steps 5 and 6: both workers panic mid-Collect, are rebuilt and collect again.
    let second = only_batch(n.send(cont(2, 8)));
    assert_eq!((second.seq, second.data.batch_size()), (2, &[2usize, 4][..]));
    assert!(n.refusals().is_empty(), "{:?}", n.refusals());
    let m = NodeMachine::from_spec(&panicky_spec(2, 5, 5000));
    assert_eq!(
        n.restarts(),
        &[(0, 1, m.restart_seed(0, 1)), (1, 1, m.restart_seed(1, 1))],
        "one restart each, reproducible seeds"
    );
    assert_eq!(n.machine().restarts(0), 1);
    // The rebuilt workers start fresh trajectories, with ids past those delivered.
    for w in 0..2 {
        let before = row_i64(&first.data, keys::TRAJ_IDS, w);
        let after = row_i64(&second.data, keys::TRAJ_IDS, w);
        let max_before = before.iter().copied().max().expect("ids");
        assert!(
            after.iter().all(|&id| id > max_before),
            "worker {w}: {before:?} then {after:?}"
        );
        assert_eq!(
            row_i64(&second.data, keys::STEP_COUNT, w)[0],
            row_i64(&first.data, keys::STEP_COUNT, w)[0],
            "a new episode, as at the start"
        );
    }
    // And the node goes on: steps 5, 6 of the new instances panic again.
    let third = only_batch(n.send(cont(3, 8)));
    assert_eq!(third.data.numel(), 8);
    assert_eq!(n.restarts().len(), 4);
}

#[test]
fn past_the_intensity_the_node_fails_naming_worker_cause_and_restarts() {
    // Every instance panics on its first step; 2 restarts allowed.
    let mut n = node(1, 1, 2, 5000);
    let reason = only_failure(n.send(cont(1, 4)));
    for want in [
        "env worker 0 failed after 2 restarts: panic: env exploded at step 1",
        "limit 2 restarts within 5.000 s",
        "restart 1 at 0.000 s after panic: env exploded at step 1",
        "restart 2 at 0.000 s after panic: env exploded at step 1",
    ] {
        assert!(reason.contains(want), "{want:?} not in {reason}");
    }
    assert_eq!(n.restarts().len(), 2);
    assert!(n.machine().has_failed());
    // The failed node still shuts down cleanly.
    assert_eq!(n.send(ToNode::Shutdown), vec![FromNode::Down { node: 0 }]);
}

#[test]
fn restarts_older_than_the_window_no_longer_count() {
    // One restart within 10 s. Each instance panics on step 6: in the first Continue
    // after its first (steps 5, 6), and so in every Continue from the 2nd on.
    let mut n = node(6, 1, 1, 10_000);
    only_batch(n.send(cont(1, 4)));
    only_batch(n.send(cont(2, 4))); // restart 1 at t = 0
    n.advance(Duration::from_secs(11));
    only_batch(n.send(cont(3, 4))); // restart 2 at t = 11 s: the first is out of the window
    n.advance(Duration::from_secs(3));
    let reason = only_failure(n.send(cont(4, 4))); // t = 14 s: one too many
    assert!(reason.contains("env worker 0 failed after 2 restarts"), "{reason}");
    assert!(reason.contains("restart 2 at 11.000 s"), "{reason}");
    assert!(
        !reason.contains("restart 1 at"),
        "only the restarts in the window: {reason}"
    );
}

#[test]
fn a_restarted_worker_gets_the_current_weights() {
    let mut n = node(6, 1, 5, 5000);
    let w = Arc::new(value_weights(2.0).with_version(1));
    assert_eq!(
        n.send(ToNode::UpdateWeights(UpdateWeights { weights: w })),
        vec![FromNode::WeightsUpdated { node: 0, version: 1 }]
    );
    let first = only_batch(n.send(cont(1, 4)));
    assert_eq!(first.weights_version, 1);
    let second = only_batch(n.send(cont(2, 4))); // panics, rebuilt
    assert_eq!(n.restarts().len(), 1);
    assert_eq!(second.weights_version, 1);
    assert!(
        actions(&second.data).iter().all(|&a| a == 2.0),
        "{:?}",
        actions(&second.data)
    );
    assert_eq!(n.worker(0).expect("rebuilt").weights().version, 1);
}

#[test]
fn a_node_without_a_spec_cannot_rebuild_and_fails_once_the_intensity_is_spent() {
    let (reg, _) = panicky_registry(1);
    let spec = panicky_spec(1, 5, 5000);
    let rollouts = spec.build_workers(&reg).expect("builds");
    let mut n = NodeHarness::from_rollouts(0, rollouts.into_iter().map(Some).collect()).with_machine(
        NodeMachine::new(0, 1, 1).with_intensity(RestartIntensity::new(3, Duration::from_secs(1)).unwrap()),
    );
    let reason = only_failure(n.send(cont(1, 4)));
    assert!(reason.contains("after 3 restarts"), "{reason}");
    assert!(reason.contains("no spec to rebuild workers from"), "{reason}");
    assert!(
        reason.contains("panic: env exploded at step 1"),
        "the first cause is in the history: {reason}"
    );
}

// ---------------------------------------------------------------- whole collections

/// 2 local nodes of one `Panicky` env each. A worker's share must stay below
/// `panic_at`, or no share could ever be whole.
fn panicky_collector(
    panic_at: u64,
    sync: bool,
    fpb: usize,
    total: i64,
) -> (DistributedCollector, Arc<std::sync::atomic::AtomicUsize>) {
    let (reg, built) = panicky_registry(panic_at);
    let c = panicky_builder(reg)
        .frames_per_batch(fpb)
        .total_frames(total)
        .sync(sync)
        .launcher(Launcher::Local)
        .max_restarts(1000)
        .restart_window(Duration::from_secs(60))
        .build()
        .expect("valid config");
    (c, built)
}

fn collection_survives_panics(sync: bool) {
    // Each env instance panics on its 37th step; shares are 10 (sync) or 20 (async)
    // frames: a restart every 3 or 2 shares.
    let (mut c, built) = panicky_collector(37, sync, 20, 1000);
    let at_start = built.load(Ordering::SeqCst);
    let start = Instant::now();
    let batches = drain(&mut c);
    assert_eq!(batches.len(), 50);
    for b in &batches {
        assert_eq!(b.data.numel(), 20, "every batch is full");
        let want: &[usize] = if sync { &[2, 1, 10] } else { &[1, 20] };
        assert_eq!(b.data.batch_size(), want);
    }
    let frames: usize = batches.iter().map(|b| b.data.numel()).sum();
    assert_eq!(frames, 1000, "exact frames");
    assert_unique_traj_ids(&batches);
    // At least 500 frames per node in sync, 1000 over both in async: >= 26 restarts.
    let restarts = built.load(Ordering::SeqCst) - at_start;
    assert!(restarts >= 26, "{restarts} restarts");
    assert!(start.elapsed() < Duration::from_secs(30));
    c.shutdown().expect("shutdown");
}

#[test]
fn sync_collection_survives_env_panics_with_exact_frames_and_unique_traj_ids() {
    collection_survives_panics(true);
}

#[test]
fn async_collection_survives_env_panics_with_exact_frames_and_unique_traj_ids() {
    collection_survives_panics(false);
}

fn intensity_exceeded(sync: bool) {
    // Every instance panics on its first step; one restart allowed.
    let (reg, _) = panicky_registry(1);
    let mut c = panicky_builder(reg)
        .frames_per_batch(100)
        .total_frames(-1)
        .sync(sync)
        .max_restarts(1)
        .build()
        .expect("valid config");
    let start = Instant::now();
    let err = c.next_batch().expect_err("no batch can be collected");
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    assert!(matches!(err, CollectError::NodeFailed { .. }), "{err:?}");
    let text = err.to_string();
    for want in [
        "failed: env worker 0 failed after 1 restarts: panic: env exploded at step 1",
        "restart 1 at ",
        "limit 1 restarts within 5.000 s",
    ] {
        assert!(text.contains(want), "{want:?} not in {text}");
    }
    assert!(text.contains("node 0") || text.contains("node 1"), "{text}");
    c.shutdown().expect("shutdown");
}

#[test]
fn sync_past_the_intensity_next_batch_errs_naming_node_worker_cause_and_restarts() {
    intensity_exceeded(true);
}

#[test]
fn async_past_the_intensity_next_batch_errs_naming_node_worker_cause_and_restarts() {
    intensity_exceeded(false);
}

#[test]
fn a_restarted_worker_collects_with_the_current_weights() {
    // 50 frames per node per batch; each env panics on its 120th step: in batch 2
    // (steps 101..150), after the weights pushed after batch 0 reached the nodes.
    let (mut c, built) = panicky_collector(120, true, 100, 600);
    let at_start = built.load(Ordering::SeqCst);
    let first = c.next_batch().expect("ok").expect("batch 0");
    assert_eq!(first.weights_version, 0);
    c.update_policy_weights(value_weights(2.0), None).expect("push");
    let rest = drain(&mut c);
    assert_eq!(rest.len(), 5);
    // 2 restarts of each worker (in batches 2 and 4).
    assert_eq!(built.load(Ordering::SeqCst) - at_start, 4);
    for (i, b) in rest.iter().enumerate().skip(1) {
        assert_eq!(b.weights_versions, vec![1, 1], "batch {}", i + 1);
        assert!(
            actions(&b.data).iter().all(|&a| a == 2.0),
            "batch {}: {:?}",
            i + 1,
            actions(&b.data)
        );
    }
    c.shutdown().expect("shutdown");
}

#[test]
fn remote_nodes_restart_their_workers_too() {
    // Two library nodes joining over loopback, with the Panicky env: the same Node
    // actor, built from the Welcome, supervises its workers.
    const TOKEN: &[u8] = b"supervision-token";
    let deadline = Duration::from_secs(20);
    let (t, addr) = listening_on_a_thread(
        panicky_builder(panicky_registry(37).0)
            .frames_per_batch(20)
            .total_frames(600)
            .sync(true)
            .max_restarts(1000)
            .restart_window(Duration::from_secs(60))
            .launcher(Launcher::External)
            .token(TOKEN)
            .join_timeout(deadline)
            .batch_timeout(deadline),
        |b| b.build().expect("collector"),
    );
    let builds: Vec<_> = (0..2).map(|_| panicky_registry(37)).collect();
    let counters: Vec<_> = builds.iter().map(|(_, b)| b.clone()).collect();
    let nodes: Vec<_> = builds
        .into_iter()
        .enumerate()
        .map(|(i, (registry, _))| {
            std::thread::spawn(move || {
                let opts = rollout_actors::remote::NodeOptions {
                    name: format!("panicky-{i}"),
                    registry,
                    connect_timeout: deadline,
                    ..Default::default()
                };
                rollout_actors::remote::run_node(&addr.to_string(), TOKEN, opts).map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut c = t.join().expect("trainer thread");
    let start = Instant::now();
    let batches = drain(&mut c);
    assert_eq!(batches.len(), 30);
    assert!(batches.iter().all(|b| b.data.numel() == 20), "every batch is full");
    assert_unique_traj_ids(&batches);
    assert!(start.elapsed() < Duration::from_secs(30));
    c.shutdown().expect("shutdown");
    for n in nodes {
        assert_eq!(n.join().expect("node thread"), Ok(()));
    }
    // 300 frames per node in shares of 10; an instance delivers 3 shares (steps 1..30)
    // and panics in its 4th: 10 instances, 9 restarts on each node.
    for (i, b) in counters.iter().enumerate() {
        assert_eq!(b.load(Ordering::SeqCst), 1 + 9, "node {i}: the worker and its rebuilds");
    }
}
