//! Checkpoint and resume: a run stopped after k batches and resumed from its
//! checkpoint goes on as if it had never stopped (sync mode: bit for bit), with
//! nothing lost and nothing doubled in async mode; bad checkpoints are clear errors.

use std::time::Duration;

use rollout::checkpoint::Checkpoint;
use rollout::policy::Weights;
use rollout::{PolicyConfig, Tensor};
use rollout_actors::checkpoint_file;
use rollout_actors::testkit::Cluster;
use rollout_actors::{Collected, CollectorBuilder, DistributedCollector, Launcher};
use rollout_tests::{assert_unique_traj_ids, panicky_registry, rollout_bin, TempDir};

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
    let dir = TempDir::new(&format!("ckpt-sync-{launcher:?}"));
    let path = dir.join("run.ckpt");
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
    // Same counts, another env: only the nodes can tell, and they refuse.
    let mut r = builder(true, 1200)
        .env("MountainCarContinuous-v0")
        .resume(ck)
        .build()
        .expect("collector");
    let err = r.next_batch().expect_err("restore refused").to_string();
    assert!(err.contains("cannot restore the checkpoint"), "{err}");
}

#[test]
fn bad_checkpoint_files_are_clear_errors() {
    let mut c = builder(true, 1200).build().expect("collector");
    c.next_batch().expect("batch");
    let ck = c.checkpoint().expect("checkpoint");
    c.shutdown().expect("shutdown");
    let good = ck.to_bytes().expect("encode");
    let dir = TempDir::new("ckpt-bad");
    let path = dir.join("run.ckpt");
    let mut wrong_version = good.clone();
    wrong_version[11] = 9;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not a rollout checkpoint", b"hello world".to_vec()),
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
fn an_env_without_checkpoint_support_is_refused_and_collection_goes_on() {
    let (registry, _) = panicky_registry(u64::MAX);
    let mut c = DistributedCollector::builder()
        .env("Panicky")
        .registry(registry)
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .frames_per_batch(20)
        .total_frames(100)
        .sync(true)
        .seed(0)
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

    use rollout::checkpoint::NodeState;
    use rollout::machine::{NodeSupervision, TrainerConfig};
    use rollout::message::{Continue, FromNode, ToNode};
    use rollout::Registry;
    use rollout_actors::testkit::{scripted_batch, NodeHarness, TrainerHarness};
    use rollout_tests::describe_sent;

    fn cfg(sync: bool) -> TrainerConfig {
        TrainerConfig {
            nodes: 2,
            envs_per_node: vec![1, 1],
            frames_per_batch: 4,
            total_frames: None,
            sync,
            update_after_each_batch: false,
            max_weight_update_interval: None,
            update_interval: None,
        }
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
        match h.send(ToNode::Snapshot).pop() {
            Some(FromNode::Snapshot { state, .. }) => state,
            other => panic!("{other:?}"),
        }
    }

    fn snapshot(node: usize) -> FromNode {
        FromNode::Snapshot {
            node,
            state: state(node),
        }
    }

    fn conts(t: &mut TrainerHarness) -> Vec<(usize, Continue)> {
        t.take_continues()
    }

    #[test]
    fn async_snapshots_wait_for_in_flight_batches_and_requests_wait_for_the_checkpoint() {
        let mut t = TrainerHarness::new(cfg(false)).expect("trainer");
        t.request().expect("request");
        let first = conts(&mut t);
        assert_eq!(first.len(), 2);
        t.reply(FromNode::Batch(scripted_batch(0, first[0].1, 1, 0, 0.0)))
            .expect("batch");
        assert_eq!(t.take_yielded().len(), 1);
        let again = conts(&mut t);
        assert_eq!(again.len(), 1, "node 0 goes on at once");
        t.begin_checkpoint().expect("begin");
        assert!(t.take_sent().is_empty(), "both nodes are busy: nobody is asked yet");
        t.request().expect("request during the checkpoint");
        assert!(t.take_sent().is_empty() && t.take_yielded().is_empty(), "held");
        t.reply(FromNode::Batch(scripted_batch(1, first[1].1, 1, 0, 10.0)))
            .expect("batch");
        assert_eq!(describe_sent(&t.take_sent()), vec![(1, "P".to_string())]);
        assert!(t.take_yielded().is_empty(), "nothing yielded while the checkpoint runs");
        t.reply(FromNode::Batch(scripted_batch(0, again[0].1, 1, 0, 20.0)))
            .expect("batch");
        assert_eq!(describe_sent(&t.take_sent()), vec![(0, "P".to_string())]);
        t.reply(snapshot(1)).expect("snapshot");
        assert!(t.take_checkpoints().is_empty(), "one node still to answer");
        t.reply(snapshot(0)).expect("snapshot");
        let ck = t.take_checkpoints().pop().expect("done").expect("a checkpoint");
        assert_eq!(ck.trainer.ready.len(), 2, "both received batches are in it");
        assert_eq!(ck.trainer.batches_yielded, 1);
        // The held request is served now: node 1's batch (first ready), node 1 goes on.
        let y = t.take_yielded();
        assert_eq!((y.len(), y[0].node), (1, Some(1)));
        assert_eq!(conts(&mut t).iter().map(|c| c.0).collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn sync_snapshots_wait_for_the_round_in_flight() {
        let mut t = TrainerHarness::new(cfg(true)).expect("trainer");
        t.request().expect("request");
        let round = conts(&mut t);
        t.begin_checkpoint().expect("begin");
        t.reply(FromNode::Batch(scripted_batch(0, round[0].1, 1, 0, 0.0)))
            .expect("share");
        assert!(t.take_sent().is_empty(), "node 0 is idle but its round is not whole");
        t.reply(FromNode::Batch(scripted_batch(1, round[1].1, 1, 0, 0.0)))
            .expect("share");
        assert_eq!(t.take_yielded().len(), 1, "the round completes and is yielded");
        let asked = describe_sent(&t.take_sent());
        assert_eq!(asked, vec![(0, "P".to_string()), (1, "P".to_string())]);
    }

    #[test]
    fn a_node_lost_during_a_checkpoint_fails_it_and_the_run_goes_on() {
        let mut t = TrainerHarness::new(cfg(false)).expect("trainer");
        t.request().expect("request");
        let first = conts(&mut t);
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
        let first = conts(&mut t);
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
        let _ = conts(&mut t);
        t.begin_checkpoint().expect("begin");
        t.reply(FromNode::CheckpointFailed {
            node: 1,
            reason: "env `Mine` cannot be checkpointed".into(),
        })
        .expect("refusal");
        let r = t.take_checkpoints().pop().expect("an answer");
        assert!(r.expect_err("refused").contains("Mine"));
    }
}
