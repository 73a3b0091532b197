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

#[test]
fn a_continue_sent_ahead_goes_to_the_workers_at_once_and_is_answered_after_the_first() {
    let mut m = NodeMachine::new(0, 2, 1);
    let mut out = Vec::new();
    m.handle(ToNode::Continue(Continue { seq: 1, frames: 4 }), &mut out)
        .unwrap();
    out.clear();
    m.handle(ToNode::Continue(Continue { seq: 2, frames: 4 }), &mut out)
        .unwrap();
    assert_eq!(
        worker_cmds(&out),
        vec![
            (0, &WorkerCmd::Collect { seq: 2, frames: 2 }),
            (1, &WorkerCmd::Collect { seq: 2, frames: 2 }),
        ],
        "queued behind each worker's first share, not held by the node"
    );
    assert_eq!(m.pending_seqs(), vec![1, 2]);
    // Worker 0 is done with both before worker 1 is done with the first.
    out.clear();
    m.on_worker(batch(0, 1, 0, share(2, &[0])), s(0), &mut out).unwrap();
    m.on_worker(batch(0, 2, 0, share(2, &[1])), s(0), &mut out).unwrap();
    assert!(trainer_msgs(&out).is_empty(), "{out:?}");
    m.on_worker(batch(1, 1, 0, share(2, &[10])), s(0), &mut out).unwrap();
    let seqs: Vec<u64> = trainer_msgs(&out)
        .iter()
        .filter_map(|f| match f {
            FromNode::Batch(b) => Some(b.seq),
            _ => None,
        })
        .collect();
    assert_eq!(
        seqs,
        vec![1],
        "the first, once whole; the second still lacks worker 1's share"
    );
    out.clear();
    m.on_worker(batch(1, 2, 0, share(2, &[11])), s(0), &mut out).unwrap();
    let [FromNode::Batch(b)] = trainer_msgs(&out)[..] else {
        panic!("{out:?}");
    };
    assert_eq!(b.seq, 2);
    assert_eq!(traj_ids(&b.data), vec![1, 1, 11, 11]);
    assert_eq!(m.pending_seqs(), Vec::<u64>::new());
}

#[test]
fn a_third_continue_in_flight_is_refused_and_the_two_stand() {
    let mut m = NodeMachine::new(0, 1, 1);
    cont(&mut m, 1, 2);
    cont(&mut m, 2, 2);
    let mut out = Vec::new();
    assert_eq!(
        m.handle(ToNode::Continue(Continue { seq: 3, frames: 2 }), &mut out),
        Err(NodeError::Busy {
            seq: 3,
            pending: vec![1, 2]
        })
    );
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(m.pending_seqs(), vec![1, 2]);
}
