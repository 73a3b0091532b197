//! Checkpoint and resume: a run stopped after k batches and resumed from its
//! checkpoint goes on as if it had never stopped (sync mode: bit for bit), with
//! nothing lost and nothing doubled in async mode; bad checkpoints are clear errors.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use rollout::checkpoint::Checkpoint;
use rollout::policy::Weights;
use rollout::{PolicyConfig, Tensor};
use rollout_actors::checkpoint_file;
use rollout_actors::testkit::Cluster;
use rollout_actors::{Collected, CollectorBuilder, DistributedCollector, Launcher};
use rollout_tests::{assert_unique_traj_ids, panicky_builder, panicky_registry, rollout_bin, temp_dir};

const DEADLINE: Duration = Duration::from_secs(30);

/// CartPole with a sampling linear policy: envs' generators and the policy's both matter.
fn builder(sync: bool, total: i64) -> CollectorBuilder {
    DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .nodes(2)
        .envs_per_node(2)
        .frames_per_batch(120)
        .total_frames(total)
        .sync(sync)
        .seed(11)
        .batch_timeout(DEADLINE)
        .join_timeout(DEADLINE)
}

/// Weights `w` scaled by `f` (a stand-in for a learner's update).
fn scaled(w: &Weights, f: f32) -> Weights {
    let tensors = w
        .tensors
        .iter()
        .map(|(k, t)| {
            let t = match t {
                Tensor::F32(a) => Tensor::F32(a.mapv(|x| x * f + 0.01)),
                other => other.clone(),
            };
            (k.clone(), t)
        })
        .collect();
    Weights::new(tensors)
}

fn initial_weights() -> Weights {
    let obs = rollout::Spec::uniform_box(4, -1.0, 1.0);
    let act = rollout::Spec::Discrete { n: 2 };
    let p = rollout::PolicySpec::from(PolicyConfig::Linear)
        .build(&obs, &act, 0)
        .expect("policy");
    p.weights().clone()
}

/// Collects every batch; after batch 1 new weights are pushed (so the checkpoint must
/// carry weights too). With `stop_after`, stops there and returns the checkpoint.
fn run(mut c: DistributedCollector, stop_after: Option<usize>) -> (Vec<Collected>, Option<Checkpoint>) {
    let mut out = Vec::new();
    loop {
        if Some(out.len()) == stop_after {
            let ck = c.checkpoint().expect("checkpoint");
            c.shutdown().expect("shutdown");
            return (out, Some(ck));
        }
        let Some(b) = c.next_batch().expect("batch") else {
            break;
        };
        if b.index == 1 {
            c.update_policy_weights(scaled(&initial_weights(), 0.5), None)
                .expect("push");
        }
        out.push(b);
    }
    c.shutdown().expect("shutdown");
    (out, None)
}

fn assert_same_batches(a: &[Collected], b: &[Collected]) {
    assert_eq!(a.len(), b.len(), "batch count");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.index, y.index);
        assert_eq!(x.node, y.node);
        assert_eq!(x.weights_versions, y.weights_versions, "batch {}", x.index);
        assert_eq!(x.data, y.data, "batch {} differs", x.index);
    }
}

fn sync_resume_is_bit_identical(launcher: Launcher) {
    let b = |total| {
        let b = builder(true, total).launcher(launcher.clone());
        if matches!(launcher, Launcher::Process) {
            b.node_program(rollout_bin())
        } else {
            b
        }
    };
    let (whole, _) = run(b(1200).build().expect("collector"), None);
    assert_eq!(whole.len(), 10);
    let (head, ck) = run(b(1200).build().expect("collector"), Some(4));
    assert_same_batches(&head, &whole[..4]);
    let dir = temp_dir(&format!("ckpt-sync-{launcher:?}"));
    let path = dir.path().join("run.ckpt");
    checkpoint_file::save(&ck.expect("checkpoint"), &path).expect("save");
    let loaded = checkpoint_file::load(&path).expect("load");
    assert_eq!(loaded.trainer.batches_yielded, 4);
    assert_eq!(loaded.trainer.frames_yielded, 480);
    assert_eq!(loaded.trainer.weights_version, 1, "the pushed weights are in it");
    let (tail, _) = run(b(1200).resume(loaded).build().expect("resumed collector"), None);
    assert_same_batches(&tail, &whole[4..]);
    // The control: without the checkpoint the same config starts over, so the test can tell.
    assert_ne!(whole[0].data, whole[4].data);
}

#[test]
fn sync_resume_yields_the_same_batches_bit_for_bit() {
    sync_resume_is_bit_identical(Launcher::Local);
}

#[test]
fn sync_resume_with_process_nodes_is_bit_identical() {
    sync_resume_is_bit_identical(Launcher::Process);
}

#[test]
fn async_resume_loses_nothing_and_doubles_nothing() {
    let total = 1440;
    let mut c = builder(false, total).build().expect("collector");
    let mut before = Vec::new();
    for _ in 0..3 {
        before.push(c.next_batch().expect("batch").expect("a batch"));
    }
    let ck = c.checkpoint().expect("checkpoint");
    // Both nodes had a batch in flight: the checkpoint received and kept them.
    assert_eq!(ck.trainer.ready.len(), 2, "in-flight batches kept");
    let kept: Vec<_> = ck.trainer.ready.iter().map(|b| b.data.clone()).collect();
    // The collector itself goes on after a checkpoint: it yields the kept batch next.
    let next = c.next_batch().expect("batch").expect("a batch");
    assert_eq!(next.data, kept[0]);
    c.shutdown().expect("shutdown");

    let mut r = builder(false, total).resume(ck).build().expect("resumed");
    let mut after = Vec::new();
    while let Some(b) = r.next_batch().expect("batch") {
        after.push(b);
    }
    r.shutdown().expect("shutdown");
    assert_eq!(after[0].data, kept[0], "the kept batches come first, in order");
    assert_eq!(after[1].data, kept[1]);
    assert_eq!(after[0].index, 3);
    let frames: usize = before.iter().chain(&after).map(|b| b.data.numel()).sum();
    assert_eq!(frames as i64, total, "exactly total_frames over both runs");
    let all: Vec<Collected> = before.into_iter().chain(after).collect();
    assert_unique_traj_ids(&all);
}

/// A run checkpointed after its last batch and resumed with a larger `total_frames`
/// goes on on every node: the batches that arrived after the end are yielded first,
/// trajectories carry on where they stopped, frames are exact over both runs.
#[test]
fn a_finished_run_resumed_with_a_larger_total_goes_on() {
    for sync in [false, true] {
        let mut c = builder(sync, 480).build().expect("collector");
        let mut all = Vec::new();
        while let Some(b) = c.next_batch().expect("batch") {
            all.push(b);
        }
        let ck = c.checkpoint().expect("checkpoint at the end");
        c.shutdown().expect("shutdown");
        let kept = ck.trainer.ready.len();
        // 500 more batches: which async node answers when is timing, and on a loaded
        // machine one node can take a few batches in a row before the other answers.
        let total = 480 + 120 * 500;
        let mut r = builder(sync, total)
            .batch_timeout(Duration::from_secs(10))
            .resume(ck)
            .build()
            .expect("resumed");
        let mut nodes = std::collections::BTreeSet::new();
        while let Some(b) = r.next_batch().expect("the resumed run collects") {
            nodes.insert(b.node);
            all.push(b);
        }
        r.shutdown().expect("shutdown");
        let frames: usize = all.iter().map(|b| b.data.numel()).sum();
        assert_eq!(frames as i64, total, "sync={sync}: exact over both runs");
        if !sync {
            assert!(kept <= 2);
            assert_eq!(nodes.len(), 2, "both nodes work after the resume: {nodes:?}");
        }
        assert_unique_traj_ids(&all);
    }
}

#[test]
fn in_memory_async_resume_is_bit_identical() {
    let b = builder(false, 1200);
    let (cfg, specs, _) = b.plan_specs().expect("plan");
    let registry = rollout::Registry::with_builtins();
    let cluster = || {
        let mut c = Cluster::new(cfg.clone(), &specs, &registry).expect("cluster");
        c.set_seed(11);
        c
    };
    let mut whole = cluster();
    let mut all = Vec::new();
    while let Some(b) = whole.next_batch().expect("batch") {
        all.push(b);
    }
    assert_eq!(all.len(), 10);
    let mut first = cluster();
    for want in &all[..3] {
        let got = first.next_batch().expect("batch").expect("a batch");
        assert_eq!(got.data, want.data);
    }
    let ck = first.checkpoint().expect("checkpoint");
    let bytes = ck.to_bytes().expect("encode");
    let ck = Checkpoint::from_bytes(&bytes).expect("decode");
    let mut resumed = Cluster::new(cfg.clone(), &specs, &registry).expect("cluster");
    resumed.restore(ck).expect("restore");
    let mut rest = Vec::new();
    while let Some(b) = resumed.next_batch().expect("batch") {
        rest.push(b);
    }
    assert_same_batches(&rest, &all[3..]);
}

#[test]
fn a_checkpoint_that_does_not_fit_names_the_setting() {
    let mut c = builder(true, 1200).build().expect("collector");
    c.next_batch().expect("batch");
    let ck = c.checkpoint().expect("checkpoint");
    c.shutdown().expect("shutdown");
    let cases: Vec<(&str, CollectorBuilder)> = vec![
        ("frames_per_batch", builder(true, 1200).frames_per_batch(240)),
        ("nodes", builder(true, 1200).nodes(4).frames_per_batch(120)),
        (
            "envs_per_node",
            builder(true, 1200).envs_per_node(3).frames_per_batch(120),
        ),
        ("sync", builder(false, 1200)),
        ("total_frames", builder(true, 1200).total_frames(60)),
    ];
    for (field, b) in cases {
        let err = b.resume(ck.clone()).build().expect_err(field).to_string();
        assert!(err.contains(&format!("`{field}`")), "{field}: {err}");
    }
}

#[test]
fn a_checkpoint_of_another_env_fails_the_resumed_run_clearly() {
    let mut c = builder(true, 1200).build().expect("collector");
    c.next_batch().expect("batch");
    let ck = c.checkpoint().expect("checkpoint");
    c.shutdown().expect("shutdown");
    // Same counts, another env: the trainer builds this run's weights itself, and the
    // ones the nodes collected with in the checkpoint have other shapes.
    let err = builder(true, 1200)
        .env("MountainCarContinuous-v0")
        .resume(ck)
        .build()
        .expect_err("resume refused")
        .to_string();
    assert!(
        err.contains("resume") && err.contains("do not fit this run's policy") && err.contains("`bias`"),
        "{err}"
    );
}

#[test]
fn bad_checkpoint_files_are_clear_errors() {
    let mut c = builder(true, 1200).build().expect("collector");
    c.next_batch().expect("batch");
    let ck = c.checkpoint().expect("checkpoint");
    c.shutdown().expect("shutdown");
    let good = ck.to_bytes().expect("encode");
    let dir = temp_dir("ckpt-bad");
    let path = dir.path().join("run.ckpt");
    let mut wrong_version = good.clone();
    wrong_version[11] = 9;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("does not start with `ROLLCKPT`", b"hello world".to_vec()),
        ("format version", wrong_version),
        ("does not decode", good[..good.len() / 2].to_vec()),
        ("does not decode", [&good[..12], &[0xc1, 0xff, 0x00]].concat()),
    ];
    for (want, bytes) in cases {
        std::fs::write(&path, &bytes).expect("write");
        let err = checkpoint_file::load(&path).expect_err(want).to_string();
        assert!(err.contains(want) && err.contains("run.ckpt"), "{want}: {err}");
    }
    let err = checkpoint_file::load(&path.with_file_name("missing.ckpt"))
        .expect_err("missing")
        .to_string();
    assert!(err.contains("missing.ckpt"), "{err}");
    // A save replaces the file whole and leaves no temporary behind.
    checkpoint_file::save(&ck, &path).expect("save");
    assert_eq!(checkpoint_file::load(&path).expect("load"), ck);
    let leftovers = std::fs::read_dir(path.parent().expect("dir"))
        .expect("list")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().contains(".tmp"))
        })
        .count();
    assert_eq!(leftovers, 0);
}

#[test]
fn two_saves_at_once_to_one_path_both_succeed_and_leave_one_whole_checkpoint() {
    let mut c = builder(true, 1200).build().expect("collector");
    c.next_batch().expect("batch");
    let first = c.checkpoint().expect("checkpoint");
    c.next_batch().expect("batch");
    let second = c.checkpoint().expect("checkpoint");
    c.shutdown().expect("shutdown");
    assert_ne!(first, second, "two states, so the file tells which save it holds");
    let dir = temp_dir("ckpt-concurrent");
    let path = dir.path().join("run.ckpt");
    for round in 0..10 {
        // Both threads save at the same instant, to the same path.
        let start = Arc::new(Barrier::new(2));
        let savers: Vec<_> = [&first, &second]
            .into_iter()
            .map(|ck| {
                let (ck, path, start) = (ck.clone(), path.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    checkpoint_file::save(&ck, &path)
                })
            })
            .collect();
        for s in savers {
            let saved = s.join().expect("saver thread");
            assert!(saved.is_ok(), "round {round}: {saved:?}");
        }
        let loaded = checkpoint_file::load(&path).expect("a whole checkpoint");
        assert!(loaded == first || loaded == second, "round {round}: neither save");
    }
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["run.ckpt"], "no temporary file left behind");
}

#[test]
fn an_env_without_checkpoint_support_is_refused_and_collection_goes_on() {
    let (registry, _) = panicky_registry(u64::MAX);
    let mut c = panicky_builder(registry)
        .frames_per_batch(20)
        .total_frames(100)
        .sync(true)
        .batch_timeout(DEADLINE)
        .build()
        .expect("collector");
    c.next_batch().expect("batch");
    let err = c.checkpoint().expect_err("no checkpoint support").to_string();
    assert!(err.contains("Panicky") && err.contains("checkpoint"), "{err}");
    let mut frames = 20;
    while let Some(b) = c.next_batch().expect("collection goes on") {
        frames += b.data.numel();
    }
    assert_eq!(frames, 100);
    c.shutdown().expect("shutdown");
}

mod machine {
    //! The trainer's side of a checkpoint, message by message, against nodes the test plays.

    use rollout::checkpoint::{Checkpoint, NodeState};
    use rollout::machine::{NodeSupervision, TrainerConfig};
    use rollout::message::{Continue, FromNode, ToNode};
    use rollout::shares::Shares;
    use rollout::{Registry, Weights};
    use rollout_actors::testkit::{scripted_batch, NodeHarness, TrainerHarness};
    use rollout_tests::describe_sent;

    fn cfg(sync: bool) -> TrainerConfig {
        TrainerConfig::new(Shares::new(4, vec![1, 1], 1, sync, None).expect("valid shares"))
    }

    /// A real state for node `node` (one Counting env).
    fn state(node: usize) -> Box<NodeState> {
        let b = rollout_actors::DistributedCollector::builder()
            .env("Counting")
            .policy(rollout::PolicyConfig::Constant { value: 1.0 })
            .nodes(2)
            .frames_per_batch(4);
        let (_, specs, _) = b.plan_specs().expect("plan");
        let mut h = NodeHarness::new(&specs[node], &Registry::with_builtins()).expect("node");
        match h.send(ToNode::Snapshot { id: 1 }).pop() {
            Some(FromNode::Snapshot { state, .. }) => state,
            other => panic!("{other:?}"),
        }
    }

    fn snapshot(node: usize, id: u64) -> FromNode {
        FromNode::Snapshot {
            node,
            id,
            state: state(node),
        }
    }

    fn sent(t: &mut TrainerHarness) -> Vec<(usize, String)> {
        describe_sent(&t.take_sent())
    }

    fn p(node: usize, id: u64) -> (usize, String) {
        (node, format!("P{id}"))
    }

    /// A checkpoint of an idle trainer with two nodes.
    fn idle_checkpoint(sync: bool) -> Checkpoint {
        let mut t = TrainerHarness::new(cfg(sync)).expect("trainer");
        let id = t.begin_checkpoint().expect("begin");
        for n in 0..2 {
            t.reply(snapshot(n, id)).expect("snapshot");
        }
        t.take_checkpoints().pop().expect("done").expect("a checkpoint")
    }

    #[test]
    fn async_snapshots_wait_for_in_flight_batches_and_requests_wait_for_the_checkpoint() {
        let mut t = TrainerHarness::new(cfg(false)).expect("trainer");
        t.request().expect("request");
        let first = t.take_continues();
        assert_eq!(first.len(), 2);
        t.reply(FromNode::Batch(scripted_batch(0, first[0].1, 1, 0, 0.0)))
            .expect("batch");
        assert_eq!(t.take_yielded().len(), 1);
        let again = t.take_continues();
        assert_eq!(again.len(), 1, "node 0 goes on at once");
        let id = t.begin_checkpoint().expect("begin");
        assert!(t.take_sent().is_empty(), "both nodes are busy: nobody is asked yet");
        t.request().expect("request during the checkpoint");
        assert!(t.take_sent().is_empty() && t.take_yielded().is_empty(), "held");
        t.reply(FromNode::Batch(scripted_batch(1, first[1].1, 1, 0, 10.0)))
            .expect("batch");
        assert_eq!(sent(&mut t), vec![p(1, id)]);
        assert!(t.take_yielded().is_empty(), "nothing yielded while the checkpoint runs");
        t.reply(FromNode::Batch(scripted_batch(0, again[0].1, 1, 0, 20.0)))
            .expect("batch");
        assert_eq!(sent(&mut t), vec![p(0, id)]);
        t.reply(snapshot(1, id)).expect("snapshot");
        assert!(t.take_checkpoints().is_empty(), "one node still to answer");
        t.reply(snapshot(0, id)).expect("snapshot");
        let ck = t.take_checkpoints().pop().expect("done").expect("a checkpoint");
        assert_eq!(ck.trainer.ready.len(), 2, "both received batches are in it");
        assert_eq!(ck.trainer.batches_yielded, 1);
        // The held request is served now: node 1's batch (first ready), node 1 goes on.
        let y = t.take_yielded();
        assert_eq!((y.len(), y[0].node), (1, Some(1)));
        assert_eq!(t.take_continues().iter().map(|c| c.0).collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn sync_snapshots_wait_for_the_round_in_flight() {
        let mut t = TrainerHarness::new(cfg(true)).expect("trainer");
        t.request().expect("request");
        let round = t.take_continues();
        let id = t.begin_checkpoint().expect("begin");
        t.reply(FromNode::Batch(scripted_batch(0, round[0].1, 1, 0, 0.0)))
            .expect("share");
        assert!(t.take_sent().is_empty(), "node 0 is idle but its round is not whole");
        t.reply(FromNode::Batch(scripted_batch(1, round[1].1, 1, 0, 0.0)))
            .expect("share");
        assert_eq!(t.take_yielded().len(), 1, "the round completes and is yielded");
        assert_eq!(sent(&mut t), vec![p(0, id), p(1, id)]);
    }

    #[test]
    fn a_node_lost_during_a_checkpoint_fails_it_and_the_run_goes_on() {
        let mut t = TrainerHarness::new(cfg(false)).expect("trainer");
        t.request().expect("request");
        let first = t.take_continues();
        t.begin_checkpoint().expect("begin");
        t.request().expect("held");
        t.reply(FromNode::Batch(scripted_batch(0, first[0].1, 1, 0, 0.0)))
            .expect("batch");
        let _ = t.take_sent();
        let lost = t.reply(FromNode::Failed {
            node: 1,
            reason: "gone".into(),
        });
        assert!(lost.is_err(), "async: lost, going on without it");
        let r = t.take_checkpoints().pop().expect("an answer");
        assert!(r.expect_err("failed").contains("node 1 was lost"));
        assert_eq!(t.take_yielded().len(), 1, "the held request is served by node 0");
        assert!(t.begin_checkpoint().is_err(), "node 1 is down: no checkpoint");
    }

    #[test]
    fn no_checkpoint_while_a_node_restarts_and_a_refusal_is_reported() {
        let mut t = TrainerHarness::supervised(cfg(false), NodeSupervision::default()).expect("trainer");
        t.request().expect("request");
        let first = t.take_continues();
        t.reply(FromNode::Failed {
            node: 1,
            reason: "boom".into(),
        })
        .expect("supervised");
        let err = t.begin_checkpoint().expect_err("restarting").to_string();
        assert!(err.contains("node 1 is restarting"), "{err}");
        t.node_restarted(1).expect("back");
        let _ = t.take_sent();
        t.reply(FromNode::Batch(scripted_batch(0, first[0].1, 1, 0, 0.0)))
            .expect("batch");
        let _ = t.take_continues();
        let id = t.begin_checkpoint().expect("begin");
        t.reply(FromNode::CheckpointFailed {
            node: 1,
            id,
            reason: "env `Mine` cannot be checkpointed".into(),
        })
        .expect("refusal");
        let r = t.take_checkpoints().pop().expect("an answer");
        assert!(r.expect_err("refused").contains("Mine"));
    }

    #[test]
    fn late_answers_to_an_abandoned_checkpoint_never_reach_the_next_one() {
        let mut t = TrainerHarness::new(cfg(true)).expect("trainer");
        let old = t.begin_checkpoint().expect("begin");
        assert_eq!(sent(&mut t), vec![p(0, old), p(1, old)]);
        t.request().expect("held");
        assert!(t.take_continues().is_empty());
        // The deadline passes: given up, the held request is served.
        t.cancel_checkpoint(old, "deadline").expect("cancel");
        let r = t.take_checkpoints().pop().expect("an answer");
        assert!(r.expect_err("given up").contains("deadline"));
        let round = t.take_continues();
        assert_eq!(round.len(), 2, "collection goes on");
        for (n, c) in round {
            t.reply(FromNode::Batch(scripted_batch(n, c, 1, 0, 0.0)))
                .expect("share");
        }
        let new = t.begin_checkpoint().expect("begin again");
        assert_ne!(new, old);
        let _ = t.take_sent();
        // Node 0's late snapshot and node 1's late refusal, both of the old checkpoint.
        assert!(t.reply(snapshot(0, old)).is_err(), "a stale snapshot is refused");
        t.reply(FromNode::CheckpointFailed {
            node: 1,
            id: old,
            reason: "late".into(),
        })
        .expect("ignored");
        assert!(t.take_checkpoints().is_empty(), "the new checkpoint is still waiting");
        t.reply(snapshot(0, new)).expect("snapshot");
        t.reply(snapshot(1, new)).expect("snapshot");
        let ck = t.take_checkpoints().pop().expect("done").expect("a checkpoint");
        assert_eq!(ck.trainer.batches_yielded, 1);
    }

    #[test]
    fn a_push_and_a_seed_during_a_checkpoint_wait_for_its_end() {
        let mut t = TrainerHarness::new(cfg(true)).expect("trainer");
        let id = t.begin_checkpoint().expect("begin");
        let _ = t.take_sent();
        t.set_weights(Weights::default());
        t.push_weights(None).expect("push");
        t.set_seed(5);
        assert!(t.take_sent().is_empty(), "nothing goes out while the nodes snapshot");
        for n in 0..2 {
            t.reply(snapshot(n, id)).expect("snapshot");
        }
        let ck = t.take_checkpoints().pop().expect("done").expect("a checkpoint");
        let books: Vec<u64> = ck.trainer.nodes.iter().map(|b| b.pushed_version).collect();
        assert_eq!(books, vec![0, 0], "the nodes held version 0 when they were snapshotted");
        assert_eq!(ck.trainer.weights_version, 1, "the stored weights are in it");
        // After the checkpoint: the push, then the seeding chain.
        assert_eq!(
            sent(&mut t),
            vec![(0, "W1".to_string()), (1, "W1".to_string()), (0, "S5".to_string())]
        );
    }

    #[test]
    fn a_node_lost_while_restoring_does_not_hang_the_run() {
        for supervised in [true, false] {
            let mut t = if supervised {
                TrainerHarness::supervised(cfg(false), NodeSupervision::default()).expect("trainer")
            } else {
                TrainerHarness::new(cfg(false)).expect("trainer")
            };
            t.restore(idle_checkpoint(false)).expect("restore");
            assert_eq!(sent(&mut t), vec![(0, "R0".to_string()), (1, "R1".to_string())]);
            t.reply(FromNode::Restored { node: 0 }).expect("restored");
            let lost = t.reply(FromNode::Failed {
                node: 1,
                reason: "boom".into(),
            });
            assert_eq!(lost.is_err(), !supervised, "unsupervised async: lost, going on");
            if supervised {
                t.node_restarted(1).expect("back");
                // The new incarnation gets the same state again, and the run waits for it.
                assert_eq!(sent(&mut t), vec![(1, "R1".to_string())]);
                t.request().expect("held");
                assert!(t.take_continues().is_empty(), "still restoring");
                t.reply(FromNode::Restored { node: 1 }).expect("restored");
            } else {
                t.request().expect("request");
            }
            let want = if supervised { 2 } else { 1 };
            assert_eq!(t.take_continues().len(), want, "supervised={supervised}");
        }
    }

    #[test]
    fn a_restore_refused_by_a_node_fails_the_run() {
        let mut t = TrainerHarness::new(cfg(true)).expect("trainer");
        t.restore(idle_checkpoint(true)).expect("restore");
        let err = t
            .reply(FromNode::CheckpointFailed {
                node: 1,
                id: 0,
                reason: "another env".into(),
            })
            .expect_err("fails the run")
            .to_string();
        assert!(err.contains("cannot restore the checkpoint: another env"), "{err}");
    }

    #[test]
    fn a_checkpoint_that_is_not_whole_is_refused_before_anything_is_sent() {
        let mut bad_batch = idle_checkpoint(false);
        let mut b = scripted_batch(0, Continue { seq: 0, frames: 4 }, 1, 0, 0.0);
        b.node = 7;
        bad_batch.trainer.ready.push(b);
        let mut missing = idle_checkpoint(false);
        missing.nodes.pop();
        let mut wrong_shape = idle_checkpoint(false);
        wrong_shape
            .trainer
            .ready
            .push(scripted_batch(1, Continue { seq: 0, frames: 2 }, 1, 0, 0.0));
        let mut huge = idle_checkpoint(false);
        huge.trainer.frames_yielded = u64::MAX;
        let mut huge_offset = idle_checkpoint(false);
        huge_offset.trainer.nodes[1].traj_offset = u64::MAX;
        for (want, ck) in [
            ("pending batch names node 7", bad_batch),
            ("1 node states", missing),
            ("batch shape [1, 2]", wrong_shape),
            ("frames_yielded = 18446744073709551615, out of range", huge),
            ("out-of-range counters for node 1", huge_offset),
        ] {
            let mut t = TrainerHarness::new(cfg(false)).expect("trainer");
            let err = t.restore(ck.clone()).expect_err(want).to_string();
            assert!(err.contains(want), "{want}: {err}");
            assert!(t.take_sent().is_empty());
            // The collector refuses it at build time too.
            let err = super::builder(false, -1)
                .nodes(2)
                .envs_per_node(1)
                .frames_per_batch(4)
                .resume(ck)
                .build()
                .expect_err(want)
                .to_string();
            assert!(err.contains(want), "{want}: {err}");
        }
    }
}
