//! torchrl's test_distributed.py scenarios, ported (same numbers), plus our own:
//! unique trajectory ids, seeding, endless mode, weight-version tags, bad config.
//! The ported scenarios run with in-process nodes and with process nodes over TCP.

use std::collections::HashMap;

use ndarray::ArrayD;
use rollout::rollout::keys;
use rollout::{PolicyConfig, Tensor, Weights};
use rollout_actors::{CollectError, Collected, CollectorBuilder, DistributedCollector, Launcher};
use rollout_tests::{
    alive, assert_unique_traj_ids, cartpole_sync_builder, drain, panicky_builder, rollout_bin, value_weights,
};

/// The launchers every ported torchrl scenario runs with.
const LAUNCHERS: [Launcher; 2] = [Launcher::Local, Launcher::Process];

/// `b` with nodes started by `launcher` (process nodes run this workspace's binary).
fn launched(b: CollectorBuilder, launcher: &Launcher) -> CollectorBuilder {
    match launcher {
        Launcher::Process => b.launcher(Launcher::Process).node_program(rollout_bin()),
        other => b.launcher(other.clone()),
    }
}

fn counting_on(launcher: &Launcher, sync: bool, fpb: usize, total: i64) -> DistributedCollector {
    let b = DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .envs_per_node(1)
        .frames_per_batch(fpb)
        .total_frames(total)
        .sync(sync)
        .seed(0);
    launched(b, launcher).build().expect("valid config")
}

fn counting_collector(sync: bool, fpb: usize, total: i64) -> DistributedCollector {
    counting_on(&Launcher::Local, sync, fpb, total)
}

fn check_frames(sync: bool, fpb: usize, total: i64) {
    for launcher in &LAUNCHERS {
        check_frames_on(launcher, sync, fpb, total);
    }
}

/// Exact frames in whole batches of `fpb`; process nodes run while the run does and are
/// reaped by its shutdown.
fn check_frames_on(launcher: &Launcher, sync: bool, fpb: usize, total: i64) {
    let mut c = counting_on(launcher, sync, fpb, total);
    let pids = c.node_pids();
    if matches!(launcher, Launcher::Process) {
        assert_eq!(pids.len(), 2, "a process per node");
        assert!(pids.iter().all(|&p| alive(p)), "node processes running: {pids:?}");
    }
    let batches = drain(&mut c);
    assert_eq!(batches.len(), total as usize / fpb);
    for b in &batches {
        assert_eq!(b.data.numel(), fpb, "every batch has exactly fpb frames");
        if sync {
            assert_eq!(b.data.batch_size(), &[2, 1, fpb / 2]);
            assert_eq!(b.node, None);
        } else {
            assert_eq!(b.data.batch_size(), &[1, fpb]);
            assert!(b.node.is_some());
        }
    }
    let frames: usize = batches.iter().map(|b| b.data.numel()).sum();
    assert_eq!(frames as i64, total);
    c.shutdown().expect("shutdown");
    for p in pids {
        assert!(!alive(p), "node process {p} left behind");
    }
}

#[test]
fn sync_fpb_50_total_1000() {
    check_frames(true, 50, 1000);
}
#[test]
fn async_fpb_50_total_1000() {
    check_frames(false, 50, 1000);
}
#[test]
fn sync_fpb_100_total_1000() {
    check_frames(true, 100, 1000);
}
#[test]
fn async_fpb_100_total_1000() {
    check_frames(false, 100, 1000);
}
#[test]
fn sync_fpb_200_total_1000() {
    check_frames(true, 200, 1000);
}
#[test]
fn async_fpb_200_total_1000() {
    check_frames(false, 200, 1000);
}
#[test]
fn sync_fpb_50_total_200() {
    check_frames(true, 50, 200);
}
#[test]
fn async_fpb_50_total_200() {
    check_frames(false, 50, 200);
}

#[test]
fn last_batch_is_cut_so_total_frames_is_exact() {
    for launcher in &LAUNCHERS {
        for sync in [true, false] {
            let mut c = counting_on(launcher, sync, 100, 250);
            let sizes: Vec<usize> = drain(&mut c).iter().map(|b| b.data.numel()).collect();
            assert_eq!(sizes, vec![100, 100, 50], "{launcher:?} sync={sync}");
        }
    }
}

fn envs_per_node(sync: bool) {
    for launcher in &LAUNCHERS {
        envs_per_node_on(launcher, sync);
    }
}

fn envs_per_node_on(launcher: &Launcher, sync: bool) {
    let b = DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .nodes(2)
        .envs_per_node(3)
        .frames_per_batch(120)
        .total_frames(600)
        .sync(sync)
        .seed(1);
    let mut c = launched(b, launcher).build().expect("valid config");
    let batches = drain(&mut c);
    assert_eq!(batches.len(), 5);
    for b in &batches {
        let want: &[usize] = if sync { &[2, 3, 20] } else { &[3, 40] };
        assert_eq!(b.data.batch_size(), want);
    }
    assert_unique_traj_ids(&batches);
}

#[test]
fn sync_envs_per_node_3() {
    envs_per_node(true);
}
#[test]
fn async_envs_per_node_3() {
    envs_per_node(false);
}

fn actions(b: &Collected) -> Vec<f32> {
    b.data.f32(keys::ACTION).expect("f32 actions").iter().copied().collect()
}

/// torchrl's `_test_distributed_collector_updatepolicy`: the weight goes from 1 to 2
/// after batch 0. Every batch's actions match the version it is tagged with, a node never
/// goes back to old weights, and the new weights reach every batch collected after they
/// were sent. Sync: a push reaches round 1; a stored set is pushed when batch 1 is yielded,
/// so it reaches round 2. Async: a node goes on the moment its batch is yielded (before the
/// consumer can react) and may have a `Continue` in flight, so at most its first two
/// batches can predate the update; its third and later must have it.
fn update_policy(sync: bool, periodic: bool) {
    for launcher in &LAUNCHERS {
        update_policy_on(launcher, sync, periodic);
    }
}

fn update_policy_on(launcher: &Launcher, sync: bool, periodic: bool) {
    let mut b = DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .frames_per_batch(50)
        .total_frames(300)
        .sync(sync)
        .seed(0);
    if periodic {
        b = b.update_interval(1);
    }
    let mut c = launched(b, launcher).build().expect("valid config");
    let mut frames = 0;
    let mut per_node: std::collections::BTreeMap<Option<usize>, (u64, u64)> = Default::default();
    let mut checked = 0;
    let mut i = 0;
    while let Some(batch) = c.next_batch().expect("batch") {
        let acts = actions(&batch);
        let expected = if batch.weights_version == 0 { 1.0 } else { 2.0 };
        assert!(
            acts.iter().all(|&a| a == expected),
            "batch {i} tagged v{} holds other actions: {acts:?}",
            batch.weights_version
        );
        let (count, last_version) = per_node.entry(batch.node).or_insert((0, 0));
        assert!(
            batch.weights_version >= *last_version,
            "node {:?} went back to old weights",
            batch.node
        );
        let must_be_new = match (sync, periodic) {
            (true, false) => i >= 1,
            (true, true) => i >= 2,
            (false, _) => *count >= 2,
        };
        if must_be_new {
            assert_eq!(
                batch.weights_version, 1,
                "batch {i} (node {:?}) has the new weights",
                batch.node
            );
            checked += 1;
        }
        *count += 1;
        *last_version = batch.weights_version;
        if i == 0 {
            assert_eq!(batch.weights_version, 0, "first batch uses weight 1");
            if periodic {
                c.set_policy_weights(value_weights(2.0)).expect("store");
            } else {
                c.update_policy_weights(value_weights(2.0), None).expect("push");
            }
        }
        frames += batch.data.numel();
        i += 1;
    }
    assert_eq!(frames, 300);
    // Six batches: sync checks 4 or 5 of them; async at least 2 however they fall.
    assert!(checked >= 2, "only {checked} batches were checked against the update");
}

#[test]
fn sync_update_policy_weights() {
    update_policy(true, false);
}
#[test]
fn async_update_policy_weights() {
    update_policy(false, false);
}
#[test]
fn sync_update_interval_delivers_stored_weights() {
    update_policy(true, true);
}
#[test]
fn async_update_interval_delivers_stored_weights() {
    update_policy(false, true);
}

#[test]
fn weights_to_a_subset_of_nodes_tag_only_their_batches() {
    let mut c = counting_collector(true, 50, -1);
    c.update_policy_weights(value_weights(3.0), Some(&[1]))
        .expect("push to node 1");
    let b = c.next_batch().expect("ok").expect("batch");
    assert_eq!(b.weights_versions, vec![0, 1]);
    assert_eq!(b.weights_version, 0, "the oldest share's version");
    let node0 = b.data.index(0, 0).expect("node 0");
    let node1 = b.data.index(0, 1).expect("node 1");
    assert!(node0.f32(keys::ACTION).expect("a").iter().all(|&a| a == 1.0));
    assert!(node1.f32(keys::ACTION).expect("a").iter().all(|&a| a == 3.0));
    assert!(matches!(
        c.update_policy_weights(value_weights(3.0), Some(&[2])),
        Err(CollectError::Trainer(_))
    ));
}

#[test]
fn weights_that_do_not_fit_the_policy_are_refused_and_the_run_goes_on() {
    let mut c = counting_collector(true, 50, -1);
    let mut wide = value_weights(2.0);
    wide.tensors
        .insert("value".into(), Tensor::F32(ArrayD::from_elem(vec![2], 2.0)));
    let mut extra = value_weights(2.0);
    extra
        .tensors
        .insert("bias".into(), Tensor::F32(ArrayD::from_elem(vec![1], 0.0)));
    let refusals = [
        (wide, "`value` must be f32 [1], got f32 [2]"),
        (Weights::new(Default::default()), "missing tensor `value`"),
        (extra, "unexpected tensor `bias`"),
    ];
    for (w, reason) in refusals {
        match c.update_policy_weights(w.clone(), None) {
            Err(CollectError::Config(e)) => assert_eq!((e.field, e.reason.as_str()), ("weights", reason)),
            other => panic!("expected a config error ({reason}), got {other:?}"),
        }
        assert!(matches!(c.set_policy_weights(w), Err(CollectError::Config(_))));
    }
    let b = c.next_batch().expect("ok").expect("batch");
    assert_eq!(b.weights_versions, vec![0, 0], "nothing was stored");
    assert!(b.data.f32(keys::ACTION).expect("a").iter().all(|&a| a == 1.0));
    assert_eq!(c.update_policy_weights(value_weights(2.0), None).expect("fits"), 1);
}

#[test]
fn a_handle_answers_and_cancels_while_another_thread_waits_for_a_batch() {
    // Batches of a million frames: seconds of stepping, so the wait is still on when
    // the handle's calls are made (and `cancel_next_batch` is what ends it).
    let c = counting_on(&Launcher::Local, false, 1_000_000, -1);
    let h = c.handle();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut c = c;
        let _ = tx.send(c.next_batch().map(|b| b.is_some()));
        c
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut last_version = 0;
    let answer = loop {
        h.stats().expect("stats while a batch is waited for");
        let version = h.update_policy_weights(value_weights(2.0), None).expect("push");
        assert_eq!(version, last_version + 1, "each push stored as the next version");
        last_version = version;
        h.cancel_next_batch().expect("cancel");
        match rx.recv_timeout(std::time::Duration::from_millis(20)) {
            Ok(r) => break r,
            Err(_) => assert!(std::time::Instant::now() < deadline, "next_batch was not cancelled"),
        }
    };
    assert!(matches!(answer, Ok(false)), "the wait ended with no batch: {answer:?}");
    let mut c = waiter.join().expect("the waiting thread");
    c.shutdown().expect("shutdown");
    assert!(
        matches!(h.stats(), Err(CollectError::Stopped(_))),
        "a handle outlives its run"
    );
}

#[test]
fn update_after_each_batch_in_async_updates_the_delivering_node() {
    let mut c = DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .frames_per_batch(20)
        .total_frames(-1)
        .update_after_each_batch(true)
        .seed(0)
        .build()
        .expect("valid");
    c.next_batch().expect("ok").expect("batch");
    c.set_policy_weights(value_weights(5.0)).expect("store");
    // Endless until both nodes delivered with the new weights: which node answers
    // when is timing (on a loaded machine one node can take many batches in a row).
    let mut seen_new = HashMap::new();
    let mut pulled = 0;
    while seen_new.len() < 2 {
        let b = c.next_batch().expect("ok").expect("endless");
        let node = b.node.expect("async batch has a node");
        if b.weights_version == 1 {
            assert!(actions(&b).iter().all(|&a| a == 5.0));
            seen_new.insert(node, true);
        } else {
            assert!(!seen_new.contains_key(&node), "node {node} went back to old weights");
        }
        pulled += 1;
        assert!(pulled < 10_000, "a node never got the update: {seen_new:?}");
    }
    c.shutdown().expect("shutdown");
}

#[test]
fn max_weight_update_interval_updates_stale_nodes() {
    let mut c = DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .frames_per_batch(20)
        .total_frames(-1)
        .sync(true)
        .max_weight_update_interval(2)
        .seed(0)
        .build()
        .expect("valid");
    c.set_policy_weights(value_weights(7.0)).expect("store");
    let versions: Vec<u64> = (0..5)
        .map(|_| c.next_batch().expect("ok").expect("batch").weights_version)
        .collect();
    // Batches 0, 1, 2 are produced; a node that produced more than 2 is then updated.
    assert_eq!(versions, vec![0, 0, 0, 1, 1]);
}

#[test]
fn traj_ids_unique_across_nodes_and_batches_sync() {
    let mut c = counting_collector(true, 100, 1000);
    let batches = drain(&mut c);
    assert_unique_traj_ids(&batches);
}

#[test]
fn traj_ids_unique_across_nodes_and_batches_async() {
    let mut c = counting_collector(false, 100, 1000);
    let batches = drain(&mut c);
    assert_unique_traj_ids(&batches);
}

#[test]
fn same_seed_gives_bit_identical_sync_runs() {
    let a: Vec<_> = drain(&mut cartpole_sync_builder(7).build().expect("valid"))
        .into_iter()
        .map(|b| b.data)
        .collect();
    let b: Vec<_> = drain(&mut cartpole_sync_builder(7).build().expect("valid"))
        .into_iter()
        .map(|b| b.data)
        .collect();
    let c: Vec<_> = drain(&mut cartpole_sync_builder(8).build().expect("valid"))
        .into_iter()
        .map(|b| b.data)
        .collect();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn set_seed_returns_the_next_seed_and_repeats_runs() {
    let mut c = cartpole_sync_builder(0).build().expect("valid");
    // 2 nodes x 2 envs: seeds 100..104 are used.
    assert_eq!(c.set_seed(100).expect("seed"), 104);
    let first: Vec<_> = (0..2).map(|_| c.next_batch().expect("ok").expect("b").data).collect();
    assert_eq!(c.set_seed(100).expect("seed"), 104);
    let again: Vec<_> = (0..2).map(|_| c.next_batch().expect("ok").expect("b").data).collect();
    let obs = |d: &rollout::TensorDict| d.f32(keys::OBSERVATION).expect("obs").clone();
    assert_eq!(obs(&first[0]), obs(&again[0]));
    assert_eq!(obs(&first[1]), obs(&again[1]));
}

#[test]
fn endless_mode_yields_until_shutdown() {
    for sync in [true, false] {
        let mut c = counting_collector(sync, 50, -1);
        for i in 0..30 {
            let b = c
                .next_batch()
                .expect("ok")
                .unwrap_or_else(|| panic!("endless run ended at batch {i}"));
            assert_eq!(b.index, i);
        }
        c.shutdown().expect("shutdown");
        c.shutdown().expect("shutdown is idempotent");
        assert!(c.next_batch().expect("ok after shutdown").is_none());
    }
}

fn build_err(b: rollout_actors::CollectorBuilder) -> String {
    b.build().expect_err("must be refused").to_string()
}

#[test]
fn bad_config_fails_at_build_naming_the_field() {
    let base = || {
        DistributedCollector::builder()
            .env("CartPole-v1")
            .frames_per_batch(100)
            .total_frames(1000)
    };
    assert!(build_err(base().frames_per_batch(0)).contains("frames_per_batch"));
    assert!(build_err(base().nodes(3).sync(true)).contains("frames_per_batch"));
    assert!(build_err(base().nodes(0)).contains("nodes"));
    assert!(build_err(base().envs_per_node(0)).contains("envs_per_node"));
    assert!(build_err(base().envs_per_node(3)).contains("frames_per_batch"));
    assert!(build_err(base().total_frames(-5)).contains("total_frames"));
    assert!(build_err(base().total_frames(1031).sync(true).nodes(2)).contains("total_frames"));
    assert!(build_err(base().env("Nope-v0")).contains("Nope-v0"));
    assert!(build_err(DistributedCollector::builder().env("CartPole-v1")).contains("frames_per_batch"));
    assert!(build_err(DistributedCollector::builder().frames_per_batch(10)).contains("env"));
    assert!(build_err(base().max_weight_update_interval(0)).contains("max_weight_update_interval"));
    assert!(build_err(base().update_interval(0)).contains("update_interval"));
    assert!(build_err(base().restart_window(std::time::Duration::ZERO)).contains("restart_window"));
    assert!(build_err(base().policy(PolicyConfig::Mlp { hidden: vec![0] })).contains("policy"));
}

#[test]
fn env_panic_restarts_the_worker_and_the_run_goes_on() {
    let (reg, built) = rollout_tests::panicky_registry(120);
    let mut c = panicky_builder(reg)
        .frames_per_batch(100)
        .total_frames(600)
        .sync(true)
        .build()
        .expect("valid");
    let at_start = built.load(std::sync::atomic::Ordering::SeqCst);
    let start = std::time::Instant::now();
    // 50 frames per node per batch: the 120th step of each env panics in batch 2 and 4;
    // the worker is rebuilt and the share collected again.
    let batches = drain(&mut c);
    assert_eq!(batches.len(), 6);
    assert!(batches.iter().all(|b| b.data.numel() == 100));
    assert_unique_traj_ids(&batches);
    // 2 restarts of each worker.
    assert_eq!(built.load(std::sync::atomic::Ordering::SeqCst) - at_start, 4);
    assert!(start.elapsed() < std::time::Duration::from_secs(20));
    c.shutdown().expect("shutdown");
}

#[test]
fn env_panic_with_no_restarts_allowed_is_a_clear_error_not_a_hang() {
    let (reg, _) = rollout_tests::panicky_registry(120);
    let mut c = panicky_builder(reg)
        .frames_per_batch(100)
        .total_frames(-1)
        .sync(true)
        .max_restarts(0)
        .build()
        .expect("valid");
    let start = std::time::Instant::now();
    assert!(c.next_batch().expect("batch 0").is_some());
    assert!(c.next_batch().expect("batch 1").is_some());
    let err = c.next_batch().expect_err("batch 2 cannot be whole").to_string();
    assert!(err.contains("panic: env exploded at step 120"), "{err}");
    assert!(err.contains("node"), "{err}");
    assert!(err.contains("env worker 0 failed after 0 restarts"), "{err}");
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
    // The collector still shuts down cleanly.
    c.shutdown().expect("shutdown");
}

/// Counting whose third step (of every instance) observes a NaN.
struct NanAt3(rollout::Counting, u64);

impl rollout::Env for NanAt3 {
    fn name(&self) -> &str {
        "NanAt3"
    }
    fn observation_spec(&self) -> &rollout::Spec {
        self.0.observation_spec()
    }
    fn action_spec(&self) -> &rollout::Spec {
        self.0.action_spec()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), rollout::EnvError> {
        self.0.reset(seed, obs)
    }
    fn step(&mut self, a: rollout::Action<'_>, obs: &mut [f32]) -> Result<rollout::Transition, rollout::EnvError> {
        self.1 += 1;
        let t = self.0.step(a, obs)?;
        if self.1 == 3 {
            obs[0] = f32::NAN;
        }
        Ok(t)
    }
    fn state(&self) -> Vec<f64> {
        self.0.state()
    }
    fn set_state(&mut self, s: &[f64]) -> Result<(), rollout::EnvError> {
        self.0.set_state(s)
    }
    fn elapsed_steps(&self) -> u64 {
        self.0.elapsed_steps()
    }
    fn set_elapsed_steps(&mut self, s: u64) {
        self.0.set_elapsed_steps(s)
    }
}

#[test]
fn nan_observations_fail_the_worker_only_when_asked() {
    let reg = || {
        let mut r = rollout::Registry::with_builtins();
        r.register("NanAt3", |_c| {
            Ok(Box::new(NanAt3(
                rollout::Counting::new(rollout::CountingConfig::default())?,
                0,
            )))
        });
        r
    };
    let build = |nan_is_failure: bool| {
        DistributedCollector::builder()
            .env("NanAt3")
            .registry(reg())
            .policy(PolicyConfig::Constant { value: 1.0 })
            .nodes(1)
            .frames_per_batch(10)
            .total_frames(-1)
            .seed(0)
            .nan_is_failure(nan_is_failure)
            .max_restarts(0)
            .batch_timeout(std::time::Duration::from_secs(20))
            .build()
            .expect("valid")
    };
    let mut lenient = build(false);
    let b = lenient.next_batch().expect("ok").expect("batch");
    assert!(b.data.f32(keys::NEXT_OBSERVATION).expect("obs")[[0, 2, 0]].is_nan());
    lenient.shutdown().expect("shutdown");
    let mut strict = build(true);
    let err = strict.next_batch().expect_err("the NaN fails the worker").to_string();
    assert!(err.contains("NaN observation"), "{err}");
    strict.shutdown().expect("shutdown");
}

/// The same sync run with a node's 4 envs grouped into workers of 1, 2 and 4 (in process
/// and in child processes): a deterministic MLP's batches are equal bit for bit, so the
/// batched forward and the grouping change nothing a learner sees.
#[test]
fn envs_per_worker_changes_no_frame_of_a_deterministic_policy() {
    let run = |launcher: &Launcher, per: usize| {
        let b = DistributedCollector::builder()
            .env("Pendulum-v1")
            .policy(PolicyConfig::Mlp { hidden: vec![32, 32] })
            .exploration_type(rollout::ExplorationType::Deterministic)
            .nodes(2)
            .envs_per_node(4)
            .envs_per_worker(per)
            .frames_per_batch(400)
            .total_frames(1200)
            .sync(true)
            .seed(3);
        drain(&mut launched(b, launcher).build().expect("valid config"))
    };
    for launcher in &LAUNCHERS {
        let alone = run(launcher, 1);
        for per in [2, 4] {
            let grouped = run(launcher, per);
            assert_eq!(alone.len(), grouped.len());
            for (a, g) in alone.iter().zip(&grouped) {
                for key in a.data.keys() {
                    assert_eq!(
                        a.data.get(key).expect("key"),
                        g.data.get(key).expect("key"),
                        "{launcher:?}, envs_per_worker {per}: `{key}` differs"
                    );
                }
            }
        }
    }
}

/// Envs that do not split into workers are a config error naming the field.
#[test]
fn envs_per_worker_that_does_not_divide_is_refused_by_name() {
    for (envs, per) in [(4, 3), (4, 0), (2, 4)] {
        let err = DistributedCollector::builder()
            .env("CartPole-v1")
            .nodes(2)
            .envs_per_node(envs)
            .envs_per_worker(per)
            .frames_per_batch(400)
            .total_frames(400)
            .build()
            .err()
            .unwrap_or_else(|| panic!("{envs} envs in workers of {per} accepted"));
        match err {
            CollectError::Config(e) => assert_eq!(e.field, "envs_per_worker", "{e}"),
            other => panic!("{envs} envs in workers of {per}: {other}"),
        }
    }
}

/// The first and last `step_count` of each env of a sync batch `[nodes, envs, T, 1]`.
fn step_count_ends(c: &Collected) -> Vec<(i64, i64)> {
    let steps = c.data.i64(keys::STEP_COUNT).expect("step_count");
    let shape = steps.shape();
    assert_eq!(
        (shape.len(), shape.last()),
        (4, Some(&1)),
        "[nodes, envs, T, 1]: {shape:?}"
    );
    let t = shape[2];
    let flat: Vec<i64> = steps.iter().copied().collect();
    flat.chunks(t).map(|env| (env[0], env[t - 1])).collect()
}

#[test]
fn reset_envs_starts_every_episode_anew_at_the_next_sync_batch() {
    for launcher in &LAUNCHERS {
        // Counting episodes far longer than the run: only a reset starts one.
        let env = rollout::EnvSpec {
            name: "Counting".into(),
            config: serde_json::json!({"max_steps": 100_000}),
            done_on_any: false,
        };
        let b = DistributedCollector::builder()
            .env(env)
            .policy(PolicyConfig::Constant { value: 1.0 })
            .nodes(2)
            .envs_per_node(2)
            .frames_per_batch(40)
            .total_frames(-1)
            .sync(true)
            .seed(0);
        let mut c = launched(b, launcher).build().expect("valid config");
        let first = c.next_batch().expect("a batch").expect("endless");
        let second = c.next_batch().expect("a batch").expect("endless");
        let (before, goes_on) = (step_count_ends(&first), step_count_ends(&second));
        assert!(
            before.iter().zip(&goes_on).all(|(a, b)| b.0 == a.1 + 1),
            "{launcher:?}: episodes go on across batches: {before:?} then {goes_on:?}"
        );
        let next_seed = c.reset_envs().expect("reset");
        assert_eq!(next_seed, 8, "{launcher:?}: seeds 4..8 after the start's 0..4");
        let anew = step_count_ends(&c.next_batch().expect("a batch").expect("endless"));
        assert!(
            anew.iter().all(|&(s, _)| s == 0),
            "{launcher:?}: every env anew: {anew:?}"
        );
        c.shutdown().expect("shutdown");
        let stats = c.stats().expect("the last stats, after shutdown");
        assert!(stats.frames_collected >= 120, "{launcher:?}: {stats:?}");
        assert_eq!((c.frames_per_batch(), c.total_frames()), (40, None));
    }
}
