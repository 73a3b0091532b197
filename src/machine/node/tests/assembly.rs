//! A `Continue` split over the workers and their shares assembled.

use super::*;

#[test]
fn a_share_from_every_worker_assembles_the_batch_in_worker_order() {
    let mut m = NodeMachine::new(3, 3, 1);
    let mut out = Vec::new();
    m.handle(ToNode::Continue(Continue { seq: 5, frames: 6 }), &mut out)
        .unwrap();
    assert_eq!(
        worker_cmds(&out),
        vec![
            (0, &WorkerCmd::Collect { seq: 5, frames: 2 }),
            (1, &WorkerCmd::Collect { seq: 5, frames: 2 }),
            (2, &WorkerCmd::Collect { seq: 5, frames: 2 }),
        ]
    );
    out.clear();
    // Shares arrive out of order; the batch is still in worker order.
    m.on_worker(batch(2, 5, 4, share(2, &[20, 21])), s(0), &mut out)
        .unwrap();
    m.on_worker(batch(0, 5, 3, share(2, &[0, 1])), s(0), &mut out).unwrap();
    assert!(out.is_empty(), "waits for worker 1: {out:?}");
    assert_eq!(m.pending_seq(), Some(5));
    m.on_worker(batch(1, 5, 4, share(2, &[10, 11])), s(0), &mut out)
        .unwrap();
    let [FromNode::Batch(b)] = trainer_msgs(&out)[..] else {
        panic!("{out:?}");
    };
    assert_eq!((b.node, b.seq, b.data.batch_size()), (3, 5, &[3usize, 2][..]));
    assert_eq!(traj_ids(&b.data), vec![0, 1, 10, 11, 20, 21]);
    assert_eq!(b.weights_version, 3, "the oldest weights among the shares");
    // The shares were copied into the batch: each goes back to its worker.
    let recycled: Vec<usize> = worker_cmds(&out)
        .into_iter()
        .filter(|(_, c)| matches!(c, WorkerCmd::Recycle(_)))
        .map(|(w, _)| w)
        .collect();
    assert_eq!(recycled, vec![0, 1, 2]);
    assert_eq!(m.pending_seq(), None);
}

#[test]
fn answers_to_nothing_asked_are_refused() {
    let mut m = NodeMachine::new(0, 2, 1);
    let mut out = Vec::new();
    assert!(matches!(
        m.on_worker(batch(0, 1, 0, share(2, &[0])), s(0), &mut out),
        Err(NodeError::Unexpected { worker: 0, seq: 1 })
    ));
    cont(&mut m, 1, 4);
    m.on_worker(batch(0, 1, 0, share(2, &[0])), s(0), &mut out).unwrap();
    assert!(
        m.on_worker(batch(0, 1, 0, share(2, &[0])), s(0), &mut out).is_err(),
        "a second share of the same worker"
    );
    assert!(
        m.on_worker(batch(1, 2, 0, share(2, &[0])), s(0), &mut out).is_err(),
        "another seq"
    );
    assert!(
        m.on_worker(
            WorkerEvent::Restored {
                worker: 0,
                result: Ok(())
            },
            s(0),
            &mut out
        )
        .is_err(),
        "a restore nobody asked for"
    );
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(m.pending_seq(), Some(1), "the Continue in flight is untouched");
}

fn nearly(worker: usize, seq: u64) -> WorkerEvent {
    WorkerEvent::NearlyDone { worker, seq }
}

fn nearly_done_outputs(out: &[NodeOutput]) -> usize {
    out.iter().filter(|o| matches!(o, NodeOutput::NearlyDone)).count()
}

#[test]
fn the_node_is_nearly_done_once_every_worker_is_and_says_so_once() {
    let mut m = NodeMachine::new(0, 2, 1);
    let mut out = Vec::new();
    cont(&mut m, 1, 4);
    m.on_worker(nearly(0, 1), s(0), &mut out).unwrap();
    m.on_worker(nearly(0, 1), s(0), &mut out).unwrap();
    assert_eq!(nearly_done_outputs(&out), 0, "worker 1 is not nearly done: {out:?}");
    m.on_worker(nearly(1, 1), s(0), &mut out).unwrap();
    m.on_worker(nearly(1, 1), s(0), &mut out).unwrap();
    assert_eq!(nearly_done_outputs(&out), 1, "{out:?}");
    // A note about another seq, or with nothing asked, changes nothing.
    out.clear();
    m.on_worker(nearly(0, 7), s(0), &mut out).unwrap();
    let mut idle = NodeMachine::new(0, 1, 1);
    idle.on_worker(nearly(0, 1), s(0), &mut out).unwrap();
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn a_continue_released_early_goes_to_the_workers_at_once_and_is_assembled_after_the_current_one() {
    let mut m = NodeMachine::new(2, 1, 1);
    let mut out = Vec::new();
    cont(&mut m, 1, 2);
    m.on_worker(nearly(0, 1), s(0), &mut out).unwrap();
    out.clear();
    // The trainer released the node early: its next Continue comes before the batch.
    m.handle(ToNode::Continue(Continue { seq: 2, frames: 2 }), &mut out)
        .unwrap();
    assert_eq!(worker_cmds(&out), vec![(0, &WorkerCmd::Collect { seq: 2, frames: 2 })]);
    assert_eq!(m.pending_seq(), Some(1), "seq 1 is still the one assembled");
    // A third one while two are in flight is refused.
    assert!(matches!(
        m.handle(ToNode::Continue(Continue { seq: 3, frames: 2 }), &mut out),
        Err(NodeError::Busy { seq: 3, pending: 1 })
    ));
    // With seq 2 taken, its own note comes too late for a second early release.
    out.clear();
    m.on_worker(nearly(0, 1), s(0), &mut out).unwrap();
    assert_eq!(nearly_done_outputs(&out), 0);
    m.on_worker(batch(0, 1, 0, share(2, &[0, 0])), s(0), &mut out).unwrap();
    assert!(matches!(trainer_msgs(&out)[..], [FromNode::Batch(b)] if b.seq == 1));
    assert_eq!(m.pending_seq(), Some(2));
    out.clear();
    m.on_worker(nearly(0, 2), s(0), &mut out).unwrap();
    assert_eq!(nearly_done_outputs(&out), 1, "seq 2 is the one in flight now");
    m.on_worker(batch(0, 2, 0, share(2, &[0, 1])), s(0), &mut out).unwrap();
    assert!(matches!(trainer_msgs(&out)[..], [FromNode::Batch(b)] if b.seq == 2));
    assert_eq!(m.pending_seq(), None);
}

#[test]
fn a_worker_done_with_the_next_continue_first_has_its_share_kept_and_batches_come_in_order() {
    let mut m = NodeMachine::new(0, 2, 1);
    let mut out = Vec::new();
    cont(&mut m, 1, 4);
    cont(&mut m, 2, 4);
    // Worker 0 finishes seq 1 and all of seq 2 while worker 1 is still in seq 1.
    m.on_worker(batch(0, 1, 0, share(2, &[0, 0])), s(0), &mut out).unwrap();
    m.on_worker(nearly(0, 2), s(0), &mut out).unwrap();
    m.on_worker(batch(0, 2, 0, share(2, &[0, 2])), s(0), &mut out).unwrap();
    assert!(out.is_empty(), "{out:?}");
    // Worker 1's share of seq 1 completes it; its note for seq 2 completes seq 2's notes.
    m.on_worker(batch(1, 1, 0, share(2, &[1, 1])), s(0), &mut out).unwrap();
    let seqs = |out: &[NodeOutput]| -> Vec<u64> {
        trainer_msgs(out)
            .iter()
            .filter_map(|m| match m {
                FromNode::Batch(b) => Some(b.seq),
                _ => None,
            })
            .collect()
    };
    assert_eq!(seqs(&out), vec![1]);
    assert_eq!(m.pending_seq(), Some(2));
    m.on_worker(nearly(1, 2), s(0), &mut out).unwrap();
    assert_eq!(nearly_done_outputs(&out), 1, "{out:?}");
    m.on_worker(batch(1, 2, 0, share(2, &[1, 3])), s(0), &mut out).unwrap();
    assert_eq!(seqs(&out), vec![1, 2]);
    assert_eq!(m.pending_seq(), None);
}
