//! `Snapshot` and `Restore` answered from the workers' answers.

use super::*;

/// A real rollout state (one Counting env).
fn rollout_state() -> RolloutState {
    let r = spec(0, 1, 0).build_workers(&Registry::with_builtins()).unwrap();
    r[0].snapshot().unwrap()
}

fn snapshot(worker: usize, state: Result<RolloutState, String>) -> WorkerEvent {
    WorkerEvent::Snapshot {
        worker,
        state: state.map(Box::new),
    }
}

fn restored(worker: usize, result: Result<(), String>) -> WorkerEvent {
    WorkerEvent::Restored { worker, result }
}

#[test]
fn a_snapshot_gathers_every_worker_and_echoes_the_id() {
    let mut m = NodeMachine::new(2, 2, 1).with_base_seed(9);
    let mut out = Vec::new();
    m.handle(ToNode::Snapshot { id: 7 }, &mut out).unwrap();
    assert_eq!(
        worker_cmds(&out),
        vec![(0, &WorkerCmd::Snapshot), (1, &WorkerCmd::Snapshot)]
    );
    out.clear();
    m.on_worker(snapshot(1, Ok(rollout_state())), s(0), &mut out).unwrap();
    assert!(out.is_empty(), "one worker still to answer");
    assert!(
        m.on_worker(snapshot(1, Ok(rollout_state())), s(0), &mut out).is_err(),
        "a second answer of the same worker is refused"
    );
    m.on_worker(snapshot(0, Ok(rollout_state())), s(0), &mut out).unwrap();
    match trainer_msgs(&out)[..] {
        [FromNode::Snapshot { node: 2, id: 7, state }] => {
            assert_eq!((state.node, state.base_seed, state.workers.len()), (2, 9, 2));
            assert_eq!(state.workers[0].rollout, rollout_state());
        }
        ref other => panic!("{other:?}"),
    }
}

#[test]
fn a_snapshot_is_refused_while_a_continue_is_in_flight_and_a_worker_refusal_fails_it() {
    let mut m = NodeMachine::new(0, 1, 1);
    cont(&mut m, 1, 2);
    let mut out = Vec::new();
    m.handle(ToNode::Snapshot { id: 3 }, &mut out).unwrap();
    match trainer_msgs(&out)[..] {
        [FromNode::CheckpointFailed { id: 3, reason, .. }] => assert!(reason.contains("in flight"), "{reason}"),
        ref other => panic!("{other:?}"),
    }
    let mut m = NodeMachine::new(0, 1, 1);
    out.clear();
    m.handle(ToNode::Snapshot { id: 4 }, &mut out).unwrap();
    out.clear();
    m.on_worker(
        snapshot(0, Err("env `Mine` cannot be checkpointed".into())),
        s(0),
        &mut out,
    )
    .unwrap();
    match trainer_msgs(&out)[..] {
        [FromNode::CheckpointFailed { id: 4, reason, .. }] => assert!(reason.contains("Mine"), "{reason}"),
        ref other => panic!("{other:?}"),
    }
    // The node is free again: the next snapshot is taken.
    out.clear();
    m.handle(ToNode::Snapshot { id: 5 }, &mut out).unwrap();
    assert_eq!(worker_cmds(&out), vec![(0, &WorkerCmd::Snapshot)]);
}

#[test]
fn a_worker_failing_during_a_snapshot_is_rebuilt_and_asked_again() {
    let mut m = machine(&spec(0, 2, 0));
    let mut out = Vec::new();
    m.handle(ToNode::Snapshot { id: 1 }, &mut out).unwrap();
    m.on_worker(snapshot(0, Ok(rollout_state())), s(0), &mut out).unwrap();
    out.clear();
    m.on_worker(failed(1, "panic: boom"), s(0), &mut out).unwrap();
    assert!(matches!(out[0], NodeOutput::Replace { worker: 1, .. }), "{out:?}");
    assert_eq!(worker_cmds(&out), vec![(1, &WorkerCmd::Snapshot)]);
    out.clear();
    m.on_worker(snapshot(1, Ok(rollout_state())), s(0), &mut out).unwrap();
    assert!(matches!(trainer_msgs(&out)[..], [FromNode::Snapshot { id: 1, .. }]));
}

fn node_state(node: usize, workers: usize) -> NodeState {
    NodeState {
        node,
        base_seed: 33,
        weights: Some(weights(3.0, 6)),
        workers: (0..workers)
            .map(|_| WorkerState {
                rollout: rollout_state(),
                next_traj_id: 12,
                frames: 40,
            })
            .collect(),
    }
}

#[test]
fn a_restore_that_does_not_fit_the_node_is_refused() {
    let mut out = Vec::new();
    for (bad, want) in [(node_state(1, 2), "node 1's"), (node_state(0, 3), "3 env workers")] {
        let mut m = NodeMachine::new(0, 2, 1);
        out.clear();
        m.handle(ToNode::Restore(Box::new(bad)), &mut out).unwrap();
        match trainer_msgs(&out)[..] {
            [FromNode::CheckpointFailed { id: 0, reason, .. }] => assert!(reason.contains(want), "{reason}"),
            ref other => panic!("{other:?}"),
        }
        assert!(worker_cmds(&out).is_empty(), "no worker is touched");
    }
}

#[test]
fn a_restore_loads_weights_and_states_then_confirms() {
    let mut m = machine(&spec(0, 2, 0));
    let mut out = Vec::new();
    m.handle(ToNode::Restore(Box::new(node_state(0, 2))), &mut out).unwrap();
    let cmds = worker_cmds(&out);
    assert_eq!(cmds.len(), 4, "weights, then the state, for each worker");
    assert!(matches!(cmds[0], (0, WorkerCmd::SetWeights(w)) if w.version == 6));
    assert!(matches!(cmds[1], (0, WorkerCmd::Restore(_))));
    assert!(matches!(cmds[2], (1, WorkerCmd::SetWeights(w)) if w.version == 6));
    assert!(matches!(cmds[3], (1, WorkerCmd::Restore(_))));
    assert_eq!(m.base_seed(), 33);
    out.clear();
    m.on_worker(restored(0, Ok(())), s(0), &mut out).unwrap();
    assert!(out.is_empty(), "worker 1 still to confirm");
    m.on_worker(restored(1, Ok(())), s(0), &mut out).unwrap();
    assert_eq!(trainer_msgs(&out), vec![&FromNode::Restored { node: 0 }]);
    // A restarted worker skips the restored trajectory ids, counts on from 40 frames
    // and is seeded from the restored base seed.
    out.clear();
    m.on_worker(failed(1, "x"), s(0), &mut out).unwrap();
    let [(1, restart)] = replaced(&out)[..] else {
        panic!("{out:?}");
    };
    assert_eq!(
        (restart.skip_traj_ids_below, restart.frames, restart.seed),
        (12, 40, restart_seed(34, 1))
    );
}

#[test]
fn a_worker_that_cannot_restore_or_fails_while_restoring_fails_the_restore() {
    let mut m = NodeMachine::new(0, 2, 1);
    let mut out = Vec::new();
    m.handle(ToNode::Restore(Box::new(node_state(0, 2))), &mut out).unwrap();
    out.clear();
    m.on_worker(restored(1, Err("obs dim".into())), s(0), &mut out).unwrap();
    match trainer_msgs(&out)[..] {
        [FromNode::CheckpointFailed { id: 0, reason, .. }] => assert!(reason.contains("obs dim"), "{reason}"),
        ref other => panic!("{other:?}"),
    }
    let mut m = machine(&spec(0, 2, 0));
    out.clear();
    m.handle(ToNode::Restore(Box::new(node_state(0, 2))), &mut out).unwrap();
    out.clear();
    m.on_worker(failed(0, "panic: mid-restore"), s(0), &mut out).unwrap();
    assert_eq!(replaced(&out).len(), 1, "{out:?}");
    match trainer_msgs(&out)[..] {
        [FromNode::CheckpointFailed { id: 0, reason, .. }] => {
            assert!(
                reason.contains("failed while restoring: panic: mid-restore"),
                "{reason}"
            )
        }
        ref other => panic!("{other:?}"),
    }
    assert!(
        m.on_worker(restored(1, Ok(())), s(0), &mut out).is_err(),
        "the restore is over"
    );
}

#[test]
fn from_spec_takes_seed_and_intensity() {
    let spec = spec(4, 3, 77).with_restarts(9, 250);
    let m = NodeMachine::from_spec(&spec);
    assert_eq!((m.index(), m.workers(), m.base_seed()), (4, 3, 77));
    assert_eq!(
        m.intensity(),
        RestartIntensity::new(9, Duration::from_millis(250)).unwrap()
    );
}
