//! Which weights acted each frame, the lag cap, and prefetch: a batch names the
//! version the trainer sent before its `Continue`, a batch past `max_policy_lag` is
//! dropped and asked again (or delivered flagged), and a node collects ahead of the
//! consumer only as far as `prefetch` lets it.

use std::collections::BTreeMap;

use super::test_support::*;
use super::*;
use crate::policy::Weights;

/// Stores new weights (the next version) and pushes them to every node.
fn store_and_push(m: &mut TrainerMachine) -> (u64, Vec<Output>) {
    let v = m.set_weights(Weights::new(BTreeMap::new()));
    let mut out = Vec::new();
    if let Err(e) = m.push_weights(None, &mut out) {
        panic!("push refused: {e}");
    }
    (v, out)
}

fn async_config(nodes: usize, total: Option<u64>) -> TrainerConfig {
    config(nodes, 1, 4, total, false)
}

fn refused(m: &mut TrainerMachine, msg: FromNode) -> TrainerError {
    let mut out = Vec::new();
    match m.on_node(msg, &mut out) {
        Err(e) => e,
        Ok(()) => panic!("accepted: {out:?}"),
    }
}

fn dropped(out: &[Output]) -> Vec<(usize, u64, u64)> {
    out.iter()
        .filter_map(|o| match o {
            Output::DroppedLagging {
                node,
                frames,
                policy_lag,
            } => Some((*node, *frames, *policy_lag)),
            _ => None,
        })
        .collect()
}

fn pushed(out: &[Output]) -> Vec<(usize, u64)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send {
                node,
                msg: crate::message::ToNode::UpdateWeights(u),
            } => Some((*node, u.weights.version)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_batch_must_name_the_weights_sent_before_its_continue_not_those_sent_during_it() {
    let mut m = machine(async_config(1, None));
    let (v1, _) = store_and_push(&mut m);
    assert_eq!(continues(&request(&mut m)), vec![(0, 0, 4)]);
    // Version 2 goes out while the node collects seq 0 with version 1.
    let (v2, out) = store_and_push(&mut m);
    assert_eq!(pushed(&out), vec![(0, v2)]);
    let e = refused(&mut m, batch_of_version(0, 0, 1, 4, v2));
    let TrainerError::BadBatch { node: 0, reason } = e else {
        panic!("{e:?}");
    };
    assert!(
        reason.contains("claims weights version 2") && reason.contains("were version 1"),
        "{reason}"
    );
    let out = feed(&mut m, batch_of_version(0, 0, 1, 4, v1));
    let y = yields(&out);
    assert_eq!(y.len(), 1);
    assert_eq!(
        (y[0].weights_versions.clone(), y[0].policy_lag, y[0].lagging),
        (vec![v1], 1, false)
    );
    assert!(y[0].policy_version().iter().all(|&v| v == v1 as i64));
    // Its next batch is collected with version 2.
    assert_eq!(continues(&out), vec![(0, 1, 4)]);
    let e = refused(&mut m, batch_of_version(0, 1, 1, 4, v1));
    assert!(matches!(e, TrainerError::BadBatch { .. }), "{e:?}");
}

#[test]
fn past_max_policy_lag_a_batch_is_dropped_counted_and_asked_again_with_the_stored_weights() {
    let mut cfg = async_config(2, Some(8));
    cfg.max_policy_lag = Some(1);
    let mut m = machine(cfg);
    assert_eq!(continues(&request(&mut m)), vec![(0, 0, 4), (1, 1, 4)]);
    // Two versions stored and not pushed: both batches in flight are 2 behind.
    m.set_weights(Weights::new(BTreeMap::new()));
    let v2 = m.set_weights(Weights::new(BTreeMap::new()));
    let out = feed(&mut m, batch(1, 1, 1, 4));
    assert!(yields(&out).is_empty(), "a batch past the cap is not yielded");
    assert_eq!(dropped(&out), vec![(1, 4, 2)]);
    assert!(
        out.iter().any(|o| matches!(o, Output::Recycle { node: 1, .. })),
        "its storage goes back to its node"
    );
    assert_eq!(pushed(&out), vec![(1, v2)], "the node gets the stored weights first");
    assert_eq!(continues(&out), vec![(1, 2, 4)], "and is asked again");
    let stats = m.stats();
    assert_eq!((stats.dropped_lagging, stats.frames_dropped_lagging), (1, 4));
    // The re-asked batch, with version 2, is yielded; the run counts delivered frames only.
    let out = feed(&mut m, batch_of_version(1, 2, 1, 4, v2));
    let y = yields(&out);
    assert_eq!((y.len(), y[0].node, y[0].policy_lag), (1, Some(1), 0));
    assert_eq!(m.frames_yielded(), 4);
    let out = request(&mut m);
    assert!(yields(&out).is_empty());
    let out = feed(&mut m, batch(0, 0, 1, 4));
    assert_eq!(dropped(&out), vec![(0, 4, 2)]);
    assert!(!m.is_finished(), "dropped frames do not count toward total_frames");
}

#[test]
fn with_prefetch_a_node_whose_batch_is_dropped_gets_the_stored_weights_before_its_next_continue() {
    let mut cfg = async_config(1, None);
    cfg.max_policy_lag = Some(0);
    cfg.prefetch = 1;
    let mut m = machine(cfg);
    assert_eq!(continues(&request(&mut m)), vec![(0, 0, 4), (0, 1, 4)]);
    // Stored, not pushed: both batches asked are collected with version 0.
    let v = m.set_weights(Weights::new(BTreeMap::new()));
    let out = feed(&mut m, batch(0, 0, 1, 4));
    assert_eq!(dropped(&out), vec![(0, 4, 1)]);
    assert_eq!(
        pushed(&out),
        vec![(0, v)],
        "pushed although its next batch is asked already"
    );
    let at = |update: bool| {
        out.iter()
            .position(|o| match o {
                Output::Send { msg, .. } => matches!(msg, crate::message::ToNode::UpdateWeights(_)) == update,
                _ => false,
            })
            .expect("sent")
    };
    assert!(
        at(true) < at(false),
        "the weights before the continue sent ahead: {out:?}"
    );
    assert_eq!(continues(&out), vec![(0, 2, 4)]);
    // The one asked before the push still lags and is dropped; the next is yielded.
    let out = feed(&mut m, batch(0, 1, 1, 4));
    assert_eq!(dropped(&out), vec![(0, 4, 1)]);
    assert!(pushed(&out).is_empty(), "it has them");
    let out = feed(&mut m, batch_of_version(0, 2, 1, 4, v));
    assert_eq!(yields(&out)[0].policy_lag, 0);
}

#[test]
fn a_lagging_batch_is_delivered_flagged_when_asked() {
    let mut cfg = async_config(1, None);
    cfg.max_policy_lag = Some(0);
    cfg.deliver_lagging = true;
    let mut m = machine(cfg);
    request(&mut m);
    m.set_weights(Weights::new(BTreeMap::new()));
    let out = feed(&mut m, batch(0, 0, 1, 4));
    assert!(dropped(&out).is_empty());
    let y = yields(&out);
    assert_eq!((y.len(), y[0].policy_lag, y[0].lagging), (1, 1, true));
    assert_eq!(m.stats().dropped_lagging, 0);
}

#[test]
fn with_prefetch_a_node_is_sent_its_next_continue_ahead_and_holds_no_more_than_prefetch_plus_one() {
    let run = |prefetch: usize| {
        let mut cfg = async_config(1, None);
        cfg.prefetch = prefetch;
        let mut m = machine(cfg);
        let first = continues(&request(&mut m));
        let out = feed(&mut m, batch(0, 0, 1, 4));
        assert_eq!(yields(&out).len(), 1);
        (m, first, continues(&out))
    };
    let (mut m, first, next) = run(0);
    assert_eq!(first, vec![(0, 0, 4)]);
    assert_eq!(next, vec![(0, 1, 4)], "the yielded batch's node goes on");
    // The consumer is busy: nobody waits for seq 1.
    assert!(
        continues(&feed(&mut m, batch(0, 1, 1, 4))).is_empty(),
        "torchrl's semantics: the node waits for its batch to be taken"
    );

    let (mut m, first, next) = run(1);
    assert_eq!(
        first,
        vec![(0, 0, 4), (0, 1, 4)],
        "the second continue goes out with the first: the node queues it"
    );
    assert_eq!(
        next,
        vec![(0, 2, 4)],
        "one taken: the one after the queued one goes ahead"
    );
    // The consumer is busy: seq 1 waits, seq 2 is collected; nothing more.
    assert!(continues(&feed(&mut m, batch(0, 1, 1, 4))).is_empty());
    assert_eq!(m.outstanding(0), Some((2, 4)));
    assert!(
        continues(&feed(&mut m, batch(0, 2, 1, 4))).is_empty(),
        "two waiting: no further"
    );
    let out = request(&mut m);
    assert_eq!(yields(&out).len(), 1);
    assert_eq!(
        continues(&out),
        vec![(0, 3, 4)],
        "one taken: one waits, one is collected"
    );
    let out = feed(&mut m, batch(0, 3, 1, 4));
    assert!(continues(&out).is_empty());
    assert_eq!(yields(&request(&mut m)).len(), 1);
}

#[test]
fn a_batch_asked_ahead_names_the_weights_sent_before_its_own_continue() {
    let mut cfg = async_config(1, None);
    cfg.prefetch = 1;
    let mut m = machine(cfg);
    assert_eq!(continues(&request(&mut m)), vec![(0, 0, 4), (0, 1, 4)]);
    // Weights pushed after both continues: the node applies them after seq 1.
    let (v, _) = store_and_push(&mut m);
    let out = feed(&mut m, batch(0, 0, 1, 4));
    let y = yields(&out);
    assert_eq!((y[0].weights_versions.clone(), y[0].policy_lag), (vec![0], v));
    let e = refused(&mut m, batch_of_version(0, 1, 1, 4, v));
    assert!(
        matches!(e, TrainerError::BadBatch { node: 0, .. }),
        "seq 1 was asked before the push: {e}"
    );
    request(&mut m);
    let out = feed(&mut m, batch(0, 1, 1, 4));
    assert_eq!(yields(&out)[0].policy_lag, v, "collected with version 0");
    // Seq 2 went out after the push: its batch names it.
    request(&mut m);
    let out = feed(&mut m, batch_of_version(0, 2, 1, 4, v));
    assert_eq!(yields(&out)[0].policy_lag, 0);
}

#[test]
fn prefetch_asks_for_no_frames_beyond_those_total_frames_still_needs() {
    let mut cfg = async_config(1, Some(8));
    cfg.prefetch = 2;
    let mut m = machine(cfg);
    assert_eq!(continues(&request(&mut m)), vec![(0, 0, 4), (0, 1, 4)]);
    let out = feed(&mut m, batch(0, 0, 1, 4));
    assert_eq!(yields(&out).len(), 1);
    assert!(
        continues(&out).is_empty(),
        "the 4 frames still needed are asked already"
    );
    let out = feed(&mut m, batch(0, 1, 1, 4));
    assert!(continues(&out).is_empty());
    let out = request(&mut m);
    assert_eq!(yields(&out).len(), 1);
    assert!(m.is_finished());
    // Nor when a batch is yielded while another waits.
    let mut cfg = async_config(1, Some(12));
    cfg.prefetch = 1;
    let mut m = machine(cfg);
    request(&mut m);
    assert_eq!(continues(&feed(&mut m, batch(0, 0, 1, 4))), vec![(0, 2, 4)]);
    assert!(continues(&feed(&mut m, batch(0, 1, 1, 4))).is_empty());
    assert!(continues(&feed(&mut m, batch(0, 2, 1, 4))).is_empty());
    let out = request(&mut m);
    assert_eq!(yields(&out).len(), 1);
    assert!(continues(&out).is_empty(), "the 4 frames still needed wait already");
    assert_eq!(yields(&request(&mut m)).len(), 1);
    assert!(m.is_finished());
    // Nor beyond what other nodes are asked for: of four nodes and 16 frames, each is asked
    // once at the first request (4 frames each) and none ahead.
    let mut cfg = async_config(4, Some(16));
    cfg.prefetch = 1;
    let mut m = machine(cfg);
    let asked: Vec<usize> = continues(&request(&mut m)).iter().map(|c| c.0).collect();
    assert_eq!(asked, vec![0, 1, 2, 3]);
    // A node whose batch is yielded goes on (as without prefetch), and is not asked ahead:
    // the 12 frames still needed are asked already.
    let out = feed(&mut m, batch(2, 2, 1, 4));
    assert_eq!(yields(&out).len(), 1);
    assert_eq!(continues(&out), vec![(2, 4, 4)], "{out:?}");
    // Of two nodes and 24 frames, each is asked once, then ahead while the run needs more.
    let mut cfg = async_config(2, Some(24));
    cfg.prefetch = 1;
    let mut m = machine(cfg);
    let asked: Vec<usize> = continues(&request(&mut m)).iter().map(|c| c.0).collect();
    assert_eq!(asked, vec![0, 1, 0, 1]);
}

#[test]
fn after_a_checkpoint_a_node_with_room_to_prefetch_goes_on() {
    let mut cfg = async_config(1, None);
    cfg.prefetch = 2;
    let mut m = machine(cfg);
    request(&mut m);
    assert_eq!(continues(&feed(&mut m, batch(0, 0, 1, 4))), vec![(0, 2, 4)]);
    let mut out = Vec::new();
    let id = m.begin_checkpoint(&mut out).unwrap();
    // Its batches arrive during the checkpoint: they wait, and the node is not sent on.
    let out = feed(&mut m, batch(0, 1, 1, 4));
    assert!(continues(&out).is_empty(), "{out:?}");
    let out = feed(&mut m, batch(0, 2, 1, 4));
    assert!(continues(&out).is_empty(), "{out:?}");
    let out = feed(
        &mut m,
        FromNode::Snapshot {
            node: 0,
            id,
            state: Box::new(node_checkpoint(0)),
        },
    );
    assert!(out.iter().any(|o| matches!(o, Output::Checkpoint(_))), "{out:?}");
    assert_eq!(
        continues(&out),
        vec![(0, 3, 4)],
        "two batches wait: room for one more, not two"
    );
}
