//! Message-level tests through the public testkit: the node and trainer machines
//! pumped in memory, no threads, no sleeps. The last test replays a threaded
//! `DistributedCollector` run in one call stack and checks it bit for bit.

use std::sync::Arc;

use rollout::machine::{Collected, TrainerConfig, TrainerError};
use rollout::message::{Continue, FromNode, Seed, ToNode, UpdateWeights};
use rollout::node_spec::NodeSpec;
use rollout::rollout::keys;
use rollout::{EnvSpec, PolicyConfig, PolicySpec, Registry, Weights};
use rollout_actors::testkit::{scripted_batch, Cluster, NodeHarness, TrainerHarness};
use rollout_tests::{cartpole_sync_builder, only_batch, trainer_config as cfg};

// ---------------------------------------------------------------- helpers

/// Node `index` of a Counting run with a constant policy (action 1.0), `envs` env workers.
fn counting_spec(index: usize, envs: usize) -> NodeSpec {
    NodeSpec::new("Counting", PolicyConfig::Constant { value: 1.0 }, envs)
        .with_index(index)
        .with_lanes((index * envs) as u64, (4 * envs) as u64)
        .with_env_share(4)
}

fn counting_node(index: usize, envs: usize) -> NodeHarness {
    NodeHarness::new(&counting_spec(index, envs), &Registry::with_builtins()).expect("node builds")
}

fn value_weights(v: f32, version: u64) -> Weights {
    rollout_tests::value_weights(v).with_version(version)
}

fn flat_f32(d: &rollout::TensorDict, key: &str) -> Vec<f32> {
    d.f32(key).expect("f32 entry").iter().copied().collect()
}

fn harness(c: TrainerConfig) -> TrainerHarness {
    TrainerHarness::new(c).expect("valid config")
}

fn cont(seq: u64, frames: usize) -> Continue {
    Continue { seq, frames }
}

/// Answers `c` from `node` with a well-formed scripted batch.
fn answer(t: &mut TrainerHarness, node: usize, c: Continue, envs: usize, version: u64, first: f32) {
    t.reply(FromNode::Batch(scripted_batch(node, c, envs, version, first)))
        .unwrap_or_else(|e| panic!("node {node} answer to {c:?} refused: {e}"));
}

/// The `(node, version)` of every `UpdateWeights` sent, in order, and nothing else sent.
fn weight_pushes(sent: &[(usize, ToNode)]) -> Vec<(usize, u64)> {
    sent.iter()
        .filter_map(|(n, m)| match m {
            ToNode::UpdateWeights(u) => Some((*n, u.weights.version)),
            _ => None,
        })
        .collect()
}

fn d(v: &[(usize, &str)]) -> Vec<(usize, String)> {
    v.iter().map(|(n, s)| (*n, s.to_string())).collect()
}

// ---------------------------------------------------------------- NodeHarness

#[test]
fn node_continue_yields_one_batch_counting_from_zero() {
    let mut node = counting_node(1, 2);
    let b = only_batch(node.send(ToNode::Continue(cont(7, 8))));
    assert_eq!(b.node, 1);
    assert_eq!(b.seq, 7);
    assert_eq!(b.weights_version, 0);
    assert_eq!(b.data.batch_size(), &[2, 4]);
    assert_eq!(b.data.numel(), 8);
    assert_eq!(b.data.f32(keys::OBSERVATION).expect("obs").shape(), &[2, 4, 1]);
    assert_eq!(
        flat_f32(&b.data, keys::OBSERVATION),
        vec![0., 1., 2., 3., 0., 1., 2., 3.]
    );
    assert_eq!(flat_f32(&b.data, keys::ACTION), vec![1.0; 8]);
    // Trajectories go on across batches: 4, 5, then done (count 6 > 5) and a reset.
    let b = only_batch(node.send(ToNode::Continue(cont(8, 4))));
    assert_eq!((b.seq, b.data.batch_size()), (8, &[2usize, 2][..]));
    assert_eq!(flat_f32(&b.data, keys::OBSERVATION), vec![4., 5., 4., 5.]);
    let b = only_batch(node.send(ToNode::Continue(cont(9, 4))));
    assert_eq!(flat_f32(&b.data, keys::OBSERVATION), vec![0., 1., 0., 1.]);
    assert!(node.refusals().is_empty(), "{:?}", node.refusals());
    assert_eq!(node.machine().pending_seq(), None);
}

#[test]
fn node_update_weights_acks_and_next_batch_uses_them() {
    let mut node = counting_node(0, 2);
    let w = Arc::new(value_weights(2.0, 3));
    let replies = node.send(ToNode::UpdateWeights(UpdateWeights { weights: w }));
    assert_eq!(replies, vec![FromNode::WeightsUpdated { node: 0, version: 3 }]);
    let b = only_batch(node.send(ToNode::Continue(cont(0, 6))));
    assert_eq!(b.weights_version, 3);
    assert_eq!(flat_f32(&b.data, keys::ACTION), vec![2.0; 6]);
    // count += 2 per step.
    assert_eq!(flat_f32(&b.data, keys::OBSERVATION), vec![0., 2., 4., 0., 2., 4.]);
    assert!(node.refusals().is_empty(), "{:?}", node.refusals());
}

#[test]
fn node_seed_answers_the_next_unused_seed() {
    let mut node = counting_node(2, 3);
    let replies = node.send(ToNode::Seed(Seed { seed: 10 }));
    assert_eq!(replies, vec![FromNode::Seeded { node: 2, next_seed: 13 }]);
    assert!(node.refusals().is_empty(), "{:?}", node.refusals());
}

#[test]
fn node_shutdown_goes_down_and_refuses_what_follows() {
    let mut node = counting_node(1, 2);
    assert_eq!(node.send(ToNode::Shutdown), vec![FromNode::Down { node: 1 }]);
    assert!(node.machine().is_down());
    assert!(node.refusals().is_empty(), "{:?}", node.refusals());
    // Nothing after Down produces an answer (a Batch, a Failed, a second Down...).
    let after = [
        ToNode::Continue(cont(0, 4)),
        ToNode::UpdateWeights(UpdateWeights {
            weights: Arc::new(value_weights(2.0, 1)),
        }),
        ToNode::Seed(Seed { seed: 5 }),
        ToNode::Shutdown,
    ];
    let n = after.len();
    for msg in after {
        let replies = node.send(msg.clone());
        assert!(replies.is_empty(), "{msg:?} after Down answered {replies:?}");
    }
    assert_eq!(
        node.refusals().len(),
        n,
        "each late message refused: {:?}",
        node.refusals()
    );
}

#[test]
fn node_refuses_frames_that_do_not_divide_over_its_envs() {
    let mut node = counting_node(0, 2);
    assert!(node.send(ToNode::Continue(cont(0, 5))).is_empty());
    assert_eq!(node.refusals().len(), 1);
    assert!(node.refusals()[0].contains("5 frames"), "{:?}", node.refusals());
    assert_eq!(node.machine().pending_seq(), None, "nothing in flight");
    // The node is not stuck: a good Continue still works.
    let b = only_batch(node.send(ToNode::Continue(cont(1, 4))));
    assert_eq!((b.seq, b.data.numel()), (1, 4));
    assert_eq!(node.refusals().len(), 1);
}

// ---------------------------------------------------------------- TrainerHarness: sync

#[test]
fn sync_round_stacks_both_shares() {
    let mut t = harness(cfg(2, 2, 8, None, true));
    t.request().expect("request");
    let cs = t.take_continues();
    assert_eq!(cs, vec![(0, cont(0, 4)), (1, cont(1, 4))]);
    assert!(t.take_sent().is_empty());
    answer(&mut t, 0, cs[0].1, 2, 0, 0.0);
    assert!(t.take_yielded().is_empty(), "half a round yields nothing");
    assert!(t.take_sent().is_empty());
    answer(&mut t, 1, cs[1].1, 2, 0, 100.0);
    let y = t.take_yielded();
    assert_eq!(y.len(), 1);
    let b = &y[0];
    assert_eq!((b.index, b.node, b.weights_version), (0, None, 0));
    assert_eq!(b.weights_versions, vec![0, 0]);
    assert_eq!(b.data.batch_size(), &[2, 2, 2]);
    assert_eq!(
        flat_f32(&b.data, keys::OBSERVATION),
        vec![0., 1., 2., 3., 100., 101., 102., 103.]
    );
    assert!(t.take_sent().is_empty(), "no Continue before the next request");
    assert_eq!(t.machine().batches_yielded(), 1);
    assert_eq!(t.machine().frames_yielded(), 8);
}

#[test]
fn sync_refuses_duplicate_stale_bad_and_unknown_answers() {
    let mut t = harness(cfg(2, 2, 8, None, true));
    t.request().expect("request");
    let cs = t.take_continues();
    answer(&mut t, 0, cs[0].1, 2, 0, 0.0);
    // Duplicate of node 0's answer.
    let dup = t.reply(FromNode::Batch(scripted_batch(0, cs[0].1, 2, 0, 0.0)));
    assert!(
        matches!(dup, Err(TrainerError::UnexpectedBatch { node: 0, seq: 0, ref expected }) if expected == "nothing"),
        "{dup:?}"
    );
    // Wrong seq from node 1.
    let stale = t.reply(FromNode::Batch(scripted_batch(1, cont(0, 4), 2, 0, 0.0)));
    assert!(
        matches!(stale, Err(TrainerError::UnexpectedBatch { node: 1, seq: 0, ref expected }) if expected == "seq 1"),
        "{stale:?}"
    );
    // Right seq, wrong frame count.
    let bad = t.reply(FromNode::Batch(scripted_batch(1, cont(1, 8), 2, 0, 0.0)));
    assert!(matches!(bad, Err(TrainerError::BadBatch { node: 1, .. })), "{bad:?}");
    // Right frames, wrong env layout ([1, 4] for a node of 2 envs).
    let bad = t.reply(FromNode::Batch(scripted_batch(1, cont(1, 4), 1, 0, 0.0)));
    assert!(matches!(bad, Err(TrainerError::BadBatch { node: 1, .. })), "{bad:?}");
    // Unknown node.
    let unknown = t.reply(FromNode::Batch(scripted_batch(2, cont(1, 4), 2, 0, 0.0)));
    assert_eq!(unknown, Err(TrainerError::UnknownNode(2)));
    assert_eq!(
        t.reply(FromNode::Seeded { node: 9, next_seed: 0 }),
        Err(TrainerError::UnknownNode(9))
    );
    // None of these changed anything: node 1's real answer completes the round.
    assert!(t.take_yielded().is_empty());
    assert_eq!(t.machine().outstanding(1), Some((1, 4)));
    answer(&mut t, 1, cs[1].1, 2, 0, 100.0);
    let y = t.take_yielded();
    assert_eq!(y.len(), 1);
    assert_eq!(flat_f32(&y[0].data, keys::OBSERVATION)[4], 100.0);
    assert!(t.take_sent().is_empty());
}

#[test]
fn sync_total_frames_finishes_with_a_cut_last_batch() {
    // 8 frames a batch, 20 in all: 8, 8, then 4 (2 per node).
    let mut t = harness(cfg(2, 2, 8, Some(20), true));
    let mut sizes = Vec::new();
    let mut asked = Vec::new();
    for _ in 0..3 {
        assert!(!t.machine().is_finished());
        t.request().expect("request");
        let cs = t.take_continues();
        asked.push(cs.iter().map(|(n, c)| (*n, c.frames)).collect::<Vec<_>>());
        for (n, c) in cs {
            answer(&mut t, n, c, 2, 0, 0.0);
        }
        let y = t.take_yielded();
        assert_eq!(y.len(), 1);
        sizes.push((y[0].index, y[0].data.batch_size().to_vec()));
    }
    assert_eq!(
        asked,
        vec![vec![(0, 4), (1, 4)], vec![(0, 4), (1, 4)], vec![(0, 2), (1, 2)]]
    );
    assert_eq!(sizes, vec![(0, vec![2, 2, 2]), (1, vec![2, 2, 2]), (2, vec![2, 2, 1])]);
    assert!(t.machine().is_finished());
    assert_eq!(t.machine().frames_yielded(), 20);
    assert!(!t.finished(), "Finished is the answer to the next request");
    t.request().expect("request after the end");
    assert!(t.finished());
    assert!(t.take_sent().is_empty(), "nothing more is asked of the nodes");
    assert!(t.take_yielded().is_empty());
}

// ---------------------------------------------------------------- TrainerHarness: async

#[test]
fn async_first_ready_first_served() {
    let mut t = harness(cfg(2, 2, 8, None, false));
    t.request().expect("request");
    let cs = t.take_continues();
    assert_eq!(cs, vec![(0, cont(0, 8)), (1, cont(1, 8))]);
    // Node 1 answers first: its batch is served, and only node 1 goes on at once.
    answer(&mut t, 1, cs[1].1, 2, 0, 50.0);
    let y = t.take_yielded();
    assert_eq!(y.len(), 1);
    assert_eq!(
        (y[0].index, y[0].node, y[0].weights_versions.clone()),
        (0, Some(1), vec![0])
    );
    assert_eq!(y[0].data.batch_size(), &[2, 4]);
    assert_eq!(flat_f32(&y[0].data, keys::OBSERVATION)[0], 50.0);
    assert_eq!(t.take_continues(), vec![(1, cont(2, 8))]);
    assert!(t.take_sent().is_empty());
    // Nobody wants a batch: node 0's answer waits, and node 0 is not asked again yet.
    answer(&mut t, 0, cs[0].1, 2, 0, 0.0);
    assert!(t.take_yielded().is_empty());
    assert!(t.take_sent().is_empty());
    // The next request is served at once from what is ready; node 0 goes on.
    t.request().expect("request");
    let y = t.take_yielded();
    assert_eq!(y.len(), 1);
    assert_eq!((y[0].index, y[0].node), (1, Some(0)));
    assert_eq!(t.take_continues(), vec![(0, cont(3, 8))]);
    // A request with nothing ready sends nothing: both nodes are busy.
    t.request().expect("request");
    assert!(t.take_sent().is_empty());
    assert!(t.take_yielded().is_empty());
}

#[test]
fn async_total_frames_finishes_with_a_cut_last_batch() {
    // 8 frames a batch, 20 in all: 8, 8, then 4 cut from an 8-frame batch.
    let mut t = harness(cfg(2, 2, 8, Some(20), false));
    t.request().expect("request");
    let cs = t.take_continues();
    answer(&mut t, 0, cs[0].1, 2, 0, 0.0);
    assert_eq!(t.take_continues(), vec![(0, cont(2, 8))]);
    t.request().expect("request");
    answer(&mut t, 1, cs[1].1, 2, 0, 0.0);
    assert_eq!(t.take_continues(), vec![(1, cont(3, 8))]);
    t.request().expect("request");
    answer(&mut t, 0, cont(2, 8), 2, 0, 10.0);
    let y = t.take_yielded();
    assert_eq!(y.len(), 3);
    assert_eq!(
        y.iter().map(|c| (c.index, c.node, c.data.numel())).collect::<Vec<_>>(),
        vec![(0, Some(0), 8), (1, Some(1), 8), (2, Some(0), 4)]
    );
    // The last batch keeps the first 2 steps of each env: [2, 2].
    assert_eq!(y[2].data.batch_size(), &[2, 2]);
    assert_eq!(flat_f32(&y[2].data, keys::OBSERVATION), vec![10., 11., 14., 15.]);
    assert!(t.machine().is_finished());
    assert!(t.take_sent().is_empty(), "the finishing node is not asked again");
    // Node 1's late answer is accepted quietly and yields nothing.
    assert_eq!(
        t.reply(FromNode::Batch(scripted_batch(1, cont(3, 8), 2, 0, 0.0))),
        Ok(())
    );
    assert!(t.take_yielded().is_empty());
    t.request().expect("request");
    assert!(t.finished());
    assert!(t.take_sent().is_empty());
}

#[test]
fn async_a_node_goes_on_as_soon_as_its_batch_begins_to_arrive() {
    let mut c = cfg(2, 2, 8, Some(40), false);
    c.update_after_each_batch = true;
    let mut t = harness(c);
    t.request().expect("request");
    let cs = t.take_continues();
    t.set_weights(value_weights(2.0, 0));
    // The consumer waits, nothing is ready: node 1's batch is the next one yielded,
    // so node 1 gets its weights and next Continue before the batch is whole.
    t.batch_arriving(1).expect("arriving");
    assert_eq!(
        rollout_tests::describe_sent(&t.take_sent()),
        d(&[(1, "W1"), (1, "C2:8")])
    );
    assert!(
        t.take_yielded().is_empty(),
        "nothing is yielded before the batch is whole"
    );
    assert_eq!(t.machine().outstanding(1), Some((2, 8)));
    // Another node's batch beginning meanwhile waits for its turn.
    t.batch_arriving(0).expect("arriving");
    assert!(t.take_sent().is_empty());
    // Node 1's batch (seq 1, the one on its way) is taken and yielded; it is not
    // asked again; only then is a second early release possible.
    answer(&mut t, 1, cs[1].1, 2, 0, 50.0);
    let y = t.take_yielded();
    assert_eq!((y.len(), y[0].node), (1, Some(1)));
    assert!(t.take_sent().is_empty(), "node 1 was released already");
    // Nobody waits for a batch: no early release, node 0 goes on when its batch is taken.
    t.batch_arriving(0).expect("arriving");
    answer(&mut t, 0, cs[0].1, 2, 0, 0.0);
    assert!(t.take_sent().is_empty());
    t.request().expect("request");
    assert_eq!(t.take_yielded()[0].node, Some(0));
    assert_eq!(
        rollout_tests::describe_sent(&t.take_sent()),
        d(&[(0, "W1"), (0, "C3:8")])
    );
    // 16 of 40 frames yielded. Node 1's seq 2 arriving: released (16 + 8 < 40).
    t.request().expect("request");
    t.batch_arriving(1).expect("arriving");
    assert_eq!(rollout_tests::describe_sent(&t.take_sent()), d(&[(1, "C4:8")]));
    // An answer out of order (the newer seq first) is refused.
    assert!(t
        .reply(FromNode::Batch(scripted_batch(1, cont(4, 8), 2, 1, 0.0)))
        .is_err());
    answer(&mut t, 1, cont(2, 8), 2, 1, 0.0);
    assert_eq!(t.take_yielded().len(), 1);
    assert!(t.take_sent().is_empty());
    // 24 yielded, 16 wanted: node 0's batch (8) leaves 8 to go, so it is released.
    t.request().expect("request");
    t.batch_arriving(0).expect("arriving");
    assert_eq!(rollout_tests::describe_sent(&t.take_sent()), d(&[(0, "C5:8")]));
    answer(&mut t, 0, cont(3, 8), 2, 1, 0.0);
    // 32 yielded, 8 to go: node 1's batch (seq 4) is the last one needed: not released.
    t.request().expect("request");
    t.batch_arriving(1).expect("arriving");
    assert!(t.take_sent().is_empty(), "node 1 is not released for the last batch");
    answer(&mut t, 1, cont(4, 8), 2, 1, 0.0);
    assert_eq!(t.take_yielded().len(), 2);
    assert!(t.machine().is_finished());
}

#[test]
fn a_batch_on_its_way_unreleased_keeps_the_next_one_from_being_released_early() {
    let mut t = harness(cfg(2, 2, 8, None, false));
    t.request().expect("request");
    let cs = t.take_continues();
    answer(&mut t, 0, cs[0].1, 2, 0, 0.0);
    assert_eq!(t.take_yielded().len(), 1);
    assert_eq!(t.take_continues(), vec![(0, cont(2, 8))]);
    // Node 1's batch begins while the consumer has not asked again: not released.
    t.batch_arriving(1).expect("arriving");
    assert!(t.take_sent().is_empty());
    // The consumer asks; node 0's batch begins. Node 1's may well be whole first and
    // be yielded first, so node 0 is not released yet either.
    t.request().expect("request");
    t.batch_arriving(0).expect("arriving");
    assert!(t.take_sent().is_empty());
    answer(&mut t, 1, cs[1].1, 2, 0, 1.0);
    assert_eq!(t.take_yielded()[0].node, Some(1));
    assert_eq!(t.take_continues(), vec![(1, cont(3, 8))]);
    answer(&mut t, 0, cont(2, 8), 2, 0, 2.0);
    assert!(t.take_sent().is_empty(), "node 0 waits for its batch to be taken");
    t.request().expect("request");
    assert_eq!(t.take_yielded()[0].node, Some(0));
    assert_eq!(t.take_continues(), vec![(0, cont(4, 8))]);
}

#[test]
fn no_early_release_in_sync_mode_before_the_start_while_seeding_or_checkpointing() {
    // Sync: a round is yielded whole; nobody goes on early.
    let mut t = harness(cfg(2, 2, 8, None, true));
    t.request().expect("request");
    let cs = t.take_continues();
    t.batch_arriving(0).expect("arriving");
    assert!(t.take_sent().is_empty());
    answer(&mut t, 0, cs[0].1, 2, 0, 0.0);
    assert!(t.take_sent().is_empty());
    // Async, before the first request: no Continue, so no batch can be on its way.
    let mut t = harness(cfg(2, 2, 8, None, false));
    t.batch_arriving(0).expect("arriving");
    assert!(t.take_sent().is_empty());
    assert!(t.batch_arriving(2).is_err(), "no node 2");
    // While a seeding chain runs no node is sent new work.
    t.request().expect("request");
    let cs = t.take_continues();
    t.set_seed(5);
    assert_eq!(rollout_tests::describe_sent(&t.take_sent()), d(&[(0, "S5")]));
    t.batch_arriving(0).expect("arriving");
    assert!(t.take_sent().is_empty());
    // Nor while a checkpoint is taken: node 0's batch waits in it.
    t.reply(FromNode::Seeded { node: 0, next_seed: 7 }).expect("seeded");
    t.reply(FromNode::Seeded { node: 1, next_seed: 9 }).expect("seeded");
    t.take_sent();
    t.begin_checkpoint().expect("checkpoint");
    t.batch_arriving(0).expect("arriving");
    assert!(t.take_continues().is_empty());
    answer(&mut t, 0, cs[0].1, 2, 0, 0.0);
    assert!(t.take_yielded().is_empty());
    assert!(t.take_continues().is_empty());
}

#[test]
fn async_a_node_lost_while_its_batch_arrives_is_asked_again_once_restarted() {
    let sup = rollout::machine::NodeSupervision::default();
    let mut t = TrainerHarness::supervised(cfg(2, 2, 8, None, false), sup).expect("valid");
    t.request().expect("request");
    let cs = t.take_continues();
    t.batch_arriving(0).expect("arriving");
    assert_eq!(t.take_continues(), vec![(0, cont(2, 8))]);
    // The connection breaks inside the batch: the node is restarted and asked for
    // one batch again (under a new seq); the old incarnation's batches are late.
    t.reply(FromNode::Failed {
        node: 0,
        reason: "closed inside a frame".into(),
    })
    .expect("supervised");
    assert_eq!(t.take_restarts().len(), 1);
    t.node_restarted(0).expect("restarted");
    let c = t.take_continues();
    assert_eq!(c, vec![(0, cont(3, 8))]);
    assert_eq!(
        t.reply(FromNode::Batch(scripted_batch(0, cs[0].1, 2, 0, 0.0))),
        Ok(()),
        "a late batch is dropped quietly"
    );
    assert!(t.take_yielded().is_empty());
    answer(&mut t, 0, c[0].1, 2, 0, 9.0);
    assert_eq!(flat_f32(&t.take_yielded()[0].data, keys::OBSERVATION)[0], 9.0);
    assert_eq!(t.take_continues(), vec![(0, cont(4, 8))]);
}

// ---------------------------------------------------------------- seeding

#[test]
fn seeding_chain_goes_node_by_node() {
    let mut t = harness(cfg(2, 3, 12, None, true));
    t.set_seed(10);
    assert_eq!(rollout_tests::describe_sent(&t.take_sent()), d(&[(0, "S10")]));
    // A Seeded from a node not being seeded is ignored.
    t.reply(FromNode::Seeded { node: 1, next_seed: 99 }).expect("ignored");
    assert!(t.take_sent().is_empty());
    assert_eq!(t.seeded(), None);
    t.reply(FromNode::Seeded { node: 0, next_seed: 13 }).expect("seeded");
    assert_eq!(rollout_tests::describe_sent(&t.take_sent()), d(&[(1, "S13")]));
    assert_eq!(t.seeded(), None);
    t.reply(FromNode::Seeded { node: 1, next_seed: 16 }).expect("seeded");
    assert_eq!(t.seeded(), Some(16));
    assert!(t.take_sent().is_empty());
}

#[test]
fn a_request_during_the_seeding_chain_waits_for_its_end() {
    let mut t = harness(cfg(2, 2, 8, None, true));
    t.set_seed(0);
    t.request().expect("request");
    assert_eq!(rollout_tests::describe_sent(&t.take_sent()), d(&[(0, "S0")]));
    t.reply(FromNode::Seeded { node: 0, next_seed: 2 }).expect("seeded");
    assert_eq!(rollout_tests::describe_sent(&t.take_sent()), d(&[(1, "S2")]));
    t.reply(FromNode::Seeded { node: 1, next_seed: 4 }).expect("seeded");
    assert_eq!(t.seeded(), Some(4));
    assert_eq!(
        rollout_tests::describe_sent(&t.take_sent()),
        d(&[(0, "C0:4"), (1, "C1:4")])
    );
}

#[test]
fn a_seed_asked_during_a_chain_runs_after_it_and_only_it_is_reported() {
    let mut t = harness(cfg(2, 1, 8, None, true));
    t.set_seed(0);
    t.set_seed(100);
    assert_eq!(rollout_tests::describe_sent(&t.take_sent()), d(&[(0, "S0")]));
    t.reply(FromNode::Seeded { node: 0, next_seed: 1 }).expect("seeded");
    t.reply(FromNode::Seeded { node: 1, next_seed: 2 }).expect("seeded");
    assert_eq!(t.seeded(), None, "the first chain's result is not reported");
    assert_eq!(
        rollout_tests::describe_sent(&t.take_sent()),
        d(&[(1, "S1"), (0, "S100")])
    );
    t.reply(FromNode::Seeded {
        node: 0,
        next_seed: 101,
    })
    .expect("seeded");
    t.reply(FromNode::Seeded {
        node: 1,
        next_seed: 102,
    })
    .expect("seeded");
    assert_eq!(t.seeded(), Some(102));
}

// ---------------------------------------------------------------- weights

#[test]
fn push_weights_to_a_subset_sends_only_there() {
    let mut t = harness(cfg(2, 2, 8, None, true));
    assert_eq!(t.set_weights(value_weights(3.0, 0)), 1);
    t.push_weights(Some(&[1])).expect("push");
    let sent = t.take_sent();
    assert_eq!(weight_pushes(&sent), vec![(1, 1)]);
    assert_eq!(sent.len(), 1);
    match &sent[0].1 {
        ToNode::UpdateWeights(u) => assert_eq!(*u.weights, value_weights(3.0, 1)),
        other => panic!("{other:?}"),
    }
    // Node 1 already has version 1: pushing again sends nothing; node 0 still gets it.
    t.push_weights(Some(&[1])).expect("push");
    assert!(t.take_sent().is_empty());
    t.push_weights(None).expect("push");
    assert_eq!(weight_pushes(&t.take_sent()), vec![(0, 1)]);
    assert_eq!(t.push_weights(Some(&[0, 2])), Err(TrainerError::UnknownNode(2)));
    assert!(t.take_sent().is_empty(), "a refused push sends nothing at all");
    assert_eq!(t.set_weights(value_weights(4.0, 0)), 2);
    assert!(t.take_sent().is_empty(), "storing sends nothing");
    assert_eq!(t.machine().weights_version(), 2);
}

/// Runs one sync round (request, both nodes answer with `version`), returns what was sent.
fn sync_round(t: &mut TrainerHarness, envs: usize, version: u64) -> Vec<(usize, String)> {
    t.request().expect("request");
    let sent = t.take_sent();
    for (n, m) in &sent {
        if let ToNode::Continue(c) = m {
            answer(t, *n, *c, envs, version, 0.0);
        }
    }
    assert_eq!(t.take_yielded().len(), 1, "one batch per round");
    let mut all = rollout_tests::describe_sent(&sent);
    all.extend(rollout_tests::describe_sent(&t.take_sent()));
    all
}

#[test]
fn update_interval_pushes_to_all_every_n_batches() {
    let mut c = cfg(2, 1, 4, None, true);
    c.update_interval = Some(2);
    let mut t = harness(c);
    t.set_weights(value_weights(2.0, 0));
    assert_eq!(sync_round(&mut t, 1, 0), d(&[(0, "C0:2"), (1, "C1:2")]));
    // The second yielded batch triggers the push, right after the yield.
    assert_eq!(
        sync_round(&mut t, 1, 0),
        d(&[(0, "C2:2"), (1, "C3:2"), (0, "W1"), (1, "W1")])
    );
    assert_eq!(sync_round(&mut t, 1, 1), d(&[(0, "C4:2"), (1, "C5:2")]));
    // Nothing new stored: the 4th batch pushes nothing.
    assert_eq!(sync_round(&mut t, 1, 1), d(&[(0, "C6:2"), (1, "C7:2")]));
    t.set_weights(value_weights(3.0, 0));
    assert_eq!(sync_round(&mut t, 1, 1), d(&[(0, "C8:2"), (1, "C9:2")]));
    assert_eq!(
        sync_round(&mut t, 1, 1),
        d(&[(0, "C10:2"), (1, "C11:2"), (0, "W2"), (1, "W2")])
    );
}

#[test]
fn update_after_each_batch_sync_pushes_before_each_round() {
    let mut c = cfg(2, 1, 4, None, true);
    c.update_after_each_batch = true;
    let mut t = harness(c);
    // No weights stored: nothing to push.
    assert_eq!(sync_round(&mut t, 1, 0), d(&[(0, "C0:2"), (1, "C1:2")]));
    t.set_weights(value_weights(2.0, 0));
    // Weights go out before the Continues, so the round uses them.
    assert_eq!(
        sync_round(&mut t, 1, 1),
        d(&[(0, "W1"), (1, "W1"), (0, "C2:2"), (1, "C3:2")])
    );
    assert_eq!(sync_round(&mut t, 1, 1), d(&[(0, "C4:2"), (1, "C5:2")]));
}

#[test]
fn update_after_each_batch_async_updates_only_the_delivering_node() {
    let mut c = cfg(2, 1, 4, None, false);
    c.update_after_each_batch = true;
    let mut t = harness(c);
    t.request().expect("request");
    assert_eq!(
        rollout_tests::describe_sent(&t.take_sent()),
        d(&[(0, "C0:4"), (1, "C1:4")])
    );
    t.set_weights(value_weights(2.0, 0));
    answer(&mut t, 1, cont(1, 4), 1, 0, 0.0);
    assert_eq!(t.take_yielded().len(), 1);
    assert_eq!(
        rollout_tests::describe_sent(&t.take_sent()),
        d(&[(1, "W1"), (1, "C2:4")])
    );
    t.request().expect("request");
    answer(&mut t, 0, cont(0, 4), 1, 0, 0.0);
    assert_eq!(t.take_yielded()[0].node, Some(0));
    assert_eq!(
        rollout_tests::describe_sent(&t.take_sent()),
        d(&[(0, "W1"), (0, "C3:4")])
    );
    t.request().expect("request");
    answer(&mut t, 1, cont(2, 4), 1, 1, 0.0);
    assert_eq!(t.take_yielded()[0].weights_version, 1);
    assert_eq!(
        rollout_tests::describe_sent(&t.take_sent()),
        d(&[(1, "C4:4")]),
        "node 1 is up to date"
    );
}

#[test]
fn max_weight_update_interval_updates_nodes_past_the_limit() {
    let mut c = cfg(2, 1, 4, None, true);
    c.max_weight_update_interval = Some(2);
    let mut t = harness(c);
    t.set_weights(value_weights(7.0, 0));
    // Each node produced 0, 1, 2 batches before rounds 0, 1, 2: not more than 2.
    assert_eq!(sync_round(&mut t, 1, 0), d(&[(0, "C0:2"), (1, "C1:2")]));
    assert_eq!(sync_round(&mut t, 1, 0), d(&[(0, "C2:2"), (1, "C3:2")]));
    assert_eq!(sync_round(&mut t, 1, 0), d(&[(0, "C4:2"), (1, "C5:2")]));
    // 3 > 2: both are updated before round 3; then the count restarts.
    assert_eq!(
        sync_round(&mut t, 1, 1),
        d(&[(0, "W1"), (1, "W1"), (0, "C6:2"), (1, "C7:2")])
    );
    assert_eq!(sync_round(&mut t, 1, 1), d(&[(0, "C8:2"), (1, "C9:2")]));
    t.set_weights(value_weights(8.0, 0));
    assert_eq!(sync_round(&mut t, 1, 1), d(&[(0, "C10:2"), (1, "C11:2")]));
    // Version 2 went out before their `Continue`: their batches carry it.
    assert_eq!(
        sync_round(&mut t, 1, 2),
        d(&[(0, "W2"), (1, "W2"), (0, "C12:2"), (1, "C13:2")])
    );
}

// ---------------------------------------------------------------- shutdown

#[test]
fn shutdown_reaches_every_node_and_ends_with_all_down() {
    let mut t = harness(cfg(3, 1, 6, None, true));
    t.request().expect("request");
    t.take_sent();
    t.shutdown();
    assert_eq!(
        rollout_tests::describe_sent(&t.take_sent()),
        d(&[(0, "X"), (1, "X"), (2, "X")])
    );
    assert_eq!(t.machine().nodes_up(), vec![0, 1, 2]);
    t.reply(FromNode::Down { node: 2 }).expect("down");
    t.reply(FromNode::Down { node: 0 }).expect("down");
    assert!(!t.all_down());
    assert_eq!(t.machine().nodes_up(), vec![1]);
    t.reply(FromNode::Down { node: 1 }).expect("down");
    assert!(t.all_down());
    assert_eq!(t.machine().outstanding(0), None);
    // After shutdown the run is over: a request answers Finished, sends nothing.
    t.request().expect("request");
    assert!(t.finished());
    assert!(t.take_sent().is_empty());
}

// ---------------------------------------------------------------- Cluster

#[test]
fn plan_specs_lays_out_lanes_frames_and_seeds() {
    let (cfg, specs, seed) = cartpole_sync_builder(7).plan_specs().expect("valid");
    assert_eq!(seed, 7);
    assert_eq!(cfg.shares.envs_per_node(), [2, 2]);
    assert_eq!(
        (cfg.frames_per_batch(), cfg.total_frames(), cfg.sync()),
        (400, Some(2000), true)
    );
    let got: Vec<_> = specs
        .iter()
        .map(|s| {
            (
                s.index,
                s.first_lane,
                s.lanes,
                s.rollout.frames_per_batch,
                s.rollout.seed,
            )
        })
        .collect();
    assert_eq!(got, vec![(0, 0, 4, 100, 7), (1, 2, 4, 100, 9)]);
    assert!(specs
        .iter()
        .all(|s| s.envs_per_node == 2 && s.env == EnvSpec::new("CartPole-v1")));
    let err = cartpole_sync_builder(7)
        .nodes(3)
        .plan_specs()
        .expect_err("3 does not divide 400");
    assert!(err.to_string().contains("frames_per_batch"), "{err}");
}

fn cluster_run(seed: u64) -> Vec<Collected> {
    let (cfg, specs, seed) = cartpole_sync_builder(seed).plan_specs().expect("valid");
    let mut cluster = Cluster::new(cfg, &specs, &Registry::with_builtins()).expect("cluster");
    // The Trainer actor seeds the nodes as it starts: do the same.
    assert_eq!(cluster.set_seed(seed), Some(seed + 4));
    let mut out = Vec::new();
    while let Some(b) = cluster.next_batch().expect("batch") {
        out.push(b);
        assert!(out.len() <= 5, "runaway run");
    }
    for n in &cluster.nodes {
        assert!(
            n.refusals().is_empty(),
            "node {}: {:?}",
            n.machine().index(),
            n.refusals()
        );
    }
    out
}

#[test]
fn cluster_replays_a_threaded_sync_run_bit_for_bit() {
    let mem = cluster_run(11);
    assert_eq!(mem.len(), 5);
    for (i, b) in mem.iter().enumerate() {
        assert_eq!(
            (b.index, b.node, b.data.batch_size()),
            (i as u64, None, &[2usize, 2, 100][..])
        );
    }
    let mut c = cartpole_sync_builder(11).build().expect("valid");
    let mut threaded = Vec::new();
    while let Some(b) = c.next_batch().expect("batch") {
        threaded.push(b);
        assert!(threaded.len() <= 5, "runaway run");
    }
    c.shutdown().expect("shutdown");
    assert_eq!(threaded.len(), mem.len());
    for (i, (a, b)) in mem.iter().zip(&threaded).enumerate() {
        assert_eq!(a, b, "batch {i} differs");
    }
    // And the replay depends on the seed.
    let other = cluster_run(12);
    assert_ne!(other[0].data, mem[0].data);
}

// ---------------------------------------------------------------- envs per worker

/// Node 0 of a CartPole run with a 16-16 MLP, 4 envs, `per` of them in each worker.
fn cartpole_mlp_spec(per: usize, exploration: rollout::ExplorationType) -> NodeSpec {
    let policy = PolicySpec {
        exploration,
        ..PolicySpec::from(PolicyConfig::Mlp { hidden: vec![16, 16] })
    };
    NodeSpec::new("CartPole-v1", policy, 4)
        .with_envs_per_worker(per)
        .with_env_share(40)
        .with_seed(11)
}

/// Two batches of 80 frames from a node of `spec`, with its version-0 weights.
fn two_batches(spec: &NodeSpec) -> Vec<rollout::TensorDict> {
    let registry = Registry::with_builtins();
    let mut node = NodeHarness::new(spec, &registry).expect("node builds");
    let w = spec.initial_weights(&registry).expect("weights");
    node.send(ToNode::UpdateWeights(UpdateWeights { weights: Arc::new(w) }));
    (0..2)
        .map(|seq| only_batch(node.send(ToNode::Continue(Continue { seq, frames: 80 }))).data)
        .collect()
}

/// Envs grouped into workers (one policy call per step for a worker's envs) give each
/// env the very frames it gets alone in a worker: same seeds, same trajectory ids,
/// and, for a deterministic policy, the same actions bit for bit (the batched forward
/// sums as the one-row one does).
#[test]
fn envs_grouped_into_workers_collect_the_frames_of_one_env_per_worker() {
    let det = rollout::ExplorationType::Deterministic;
    let alone = two_batches(&cartpole_mlp_spec(1, det));
    for per in [2, 4] {
        let spec = cartpole_mlp_spec(per, det);
        assert_eq!(spec.workers().expect("divides"), 4 / per);
        let grouped = two_batches(&spec);
        for (a, g) in alone.iter().zip(&grouped) {
            assert_eq!(a.batch_size(), g.batch_size(), "per {per}");
            for key in a.keys() {
                assert_eq!(
                    a.get(key).expect("key"),
                    g.get(key).expect("key"),
                    "per {per}: `{key}` differs"
                );
            }
        }
    }
    // Sampled actions come from each worker's own stream: the same envs, other draws.
    let random = rollout::ExplorationType::Random;
    let (one, four) = (
        two_batches(&cartpole_mlp_spec(1, random)),
        two_batches(&cartpole_mlp_spec(4, random)),
    );
    assert_eq!(
        flat_f32(&one[0], keys::OBSERVATION)[..4],
        flat_f32(&four[0], keys::OBSERVATION)[..4]
    );
}

/// Envs that do not split evenly into workers are refused naming the field, before
/// any worker is built.
#[test]
fn envs_that_do_not_split_into_workers_are_refused_by_name() {
    let spec = cartpole_mlp_spec(3, rollout::ExplorationType::Deterministic);
    match NodeHarness::new(&spec, &Registry::with_builtins()) {
        Err(e) => assert!(e.to_string().contains("envs_per_worker"), "{e}"),
        Ok(_) => panic!("4 envs in workers of 3 accepted"),
    }
    let zero = cartpole_mlp_spec(0, rollout::ExplorationType::Deterministic);
    assert!(zero.workers().is_err());
}
