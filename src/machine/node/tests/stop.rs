//! `Shutdown`: workers stopped, the node down, later work refused.

use super::*;

#[test]
fn shutdown_stops_every_worker_and_the_node_is_down_once_all_stopped() {
    let mut m = NodeMachine::new(4, 2, 1);
    cont(&mut m, 1, 4);
    assert!(!m.is_stopping());
    let mut out = Vec::new();
    m.handle(ToNode::Shutdown, &mut out).unwrap();
    // The shell sets its workers' stop flag on this, before the `Stop`s queue behind their batches.
    assert!(m.is_stopping());
    assert_eq!(worker_cmds(&out), vec![(0, &WorkerCmd::Stop), (1, &WorkerCmd::Stop)]);
    assert_eq!(m.pending_seq(), None, "the Continue in flight is dropped");
    out.clear();
    // A share that was on its way is dropped quietly; more work is refused.
    m.on_worker(batch(0, 1, 0, share(2, &[0])), s(0), &mut out).unwrap();
    assert!(matches!(
        m.handle(ToNode::Continue(Continue { seq: 2, frames: 4 }), &mut out),
        Err(NodeError::ShutDown {
            msg: "Continue",
            state: "stopping"
        })
    ));
    m.on_worker(WorkerEvent::Stopped { worker: 1 }, s(0), &mut out).unwrap();
    assert!(out.is_empty(), "worker 0 still runs: {out:?}");
    assert!(!m.is_down());
    m.on_worker(WorkerEvent::Stopped { worker: 0 }, s(0), &mut out).unwrap();
    assert_eq!(trainer_msgs(&out), vec![&FromNode::Down { node: 4 }]);
    assert!(m.is_down());
    assert!(matches!(
        m.handle(ToNode::Shutdown, &mut out),
        Err(NodeError::ShutDown {
            msg: "Shutdown",
            state: "down"
        })
    ));
}

#[test]
fn no_restart_while_stopping() {
    let mut m = machine(&spec(0, 1, 0));
    let mut out = Vec::new();
    m.handle(ToNode::Shutdown, &mut out).unwrap();
    out.clear();
    m.on_worker(failed(0, "late"), s(0), &mut out).unwrap();
    assert!(out.is_empty(), "{out:?}");
    m.on_worker(WorkerEvent::Stopped { worker: 0 }, s(0), &mut out).unwrap();
    assert_eq!(trainer_msgs(&out), vec![&FromNode::Down { node: 0 }]);
}
