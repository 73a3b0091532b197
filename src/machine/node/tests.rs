//! The node machine driven by hand: trainer messages in through `handle`, worker
//! events in through `on_worker`, outputs checked; no actor, no thread.

use std::collections::BTreeMap;

use ndarray::ArrayD;

use super::*;
use crate::checkpoint::{NodeState, WorkerState};
use crate::message::{Continue, Seed, UpdateWeights};
use crate::rollout::{keys, RolloutConfig};
use crate::supervisor::restart_seed;
use crate::tensor::{Tensor, TensorDict};
use crate::{EnvSpec, PolicyConfig, PolicySpec};

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

/// Node `index` of a Counting run, `workers` env workers, base seed `seed`.
fn spec(index: usize, workers: usize, seed: u64) -> NodeSpec {
    NodeSpec {
        index,
        env: EnvSpec::new("Counting"),
        policy: PolicySpec::from(PolicyConfig::Constant { value: 1.0 }),
        envs_per_node: workers,
        first_lane: 0,
        lanes: workers as u64,
        rollout: RolloutConfig {
            frames_per_batch: 2,
            seed,
            ..Default::default()
        },
        max_restarts: 5,
        restart_window_ms: 5000,
        worker_nice: crate::node_spec::DEFAULT_WORKER_NICE,
    }
}

/// The machine of `spec`, rebuilding failed workers from it.
fn machine(spec: &NodeSpec) -> NodeMachine {
    NodeMachine::from_spec(spec).with_rebuild(spec.clone(), Registry::with_builtins())
}

/// A worker's share of `n` frames whose trajectory ids are `ids` (cycled).
fn share(n: usize, ids: &[i64]) -> TensorDict {
    let mut d = TensorDict::new(&[1, n]);
    let v: Vec<i64> = (0..n).map(|i| ids[i % ids.len()]).collect();
    d.set(
        keys::TRAJ_IDS,
        Tensor::I64(ArrayD::from_shape_vec(vec![1, n], v).unwrap()),
    )
    .unwrap();
    d
}

/// Weights the Constant policy takes: it acts `value`.
fn weights(value: f32, version: u64) -> Arc<Weights> {
    let mut t = BTreeMap::new();
    t.insert("value".to_string(), Tensor::F32(ArrayD::from_elem(vec![1], value)));
    Arc::new(Weights::new(t).with_version(version))
}

fn batch(worker: usize, seq: u64, version: u64, data: TensorDict) -> WorkerEvent {
    WorkerEvent::Batch {
        worker,
        seq,
        version,
        data,
    }
}

fn failed(worker: usize, reason: &str) -> WorkerEvent {
    WorkerEvent::Failed {
        worker,
        reason: reason.into(),
    }
}

fn cont(m: &mut NodeMachine, seq: u64, frames: usize) {
    let mut out = Vec::new();
    m.handle(ToNode::Continue(Continue { seq, frames }), &mut out).unwrap();
}

fn trainer_msgs(out: &[NodeOutput]) -> Vec<&FromNode> {
    out.iter()
        .filter_map(|o| match o {
            NodeOutput::Trainer(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn worker_cmds(out: &[NodeOutput]) -> Vec<(usize, &WorkerCmd)> {
    out.iter()
        .filter_map(|o| match o {
            NodeOutput::Worker { worker, cmd } => Some((*worker, cmd)),
            _ => None,
        })
        .collect()
}

/// The `(worker, restart)` of every `Replace` in `out`.
fn replaced(out: &[NodeOutput]) -> Vec<(usize, &WorkerRestart)> {
    out.iter()
        .filter_map(|o| match o {
            NodeOutput::Replace { worker, restart, .. } => Some((*worker, restart)),
            _ => None,
        })
        .collect()
}

fn traj_ids(d: &TensorDict) -> Vec<i64> {
    match d.get(keys::TRAJ_IDS) {
        Ok(Tensor::I64(ids)) => ids.iter().copied().collect(),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------- assembly

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

// ---------------------------------------------------------------- supervision

#[test]
fn a_failed_worker_is_rebuilt_with_the_documented_seed_and_its_share_collected_again() {
    let spec = spec(3, 2, 100);
    let registry = Registry::with_builtins();
    let mut m = machine(&spec);
    cont(&mut m, 1, 8);
    let mut out = Vec::new();
    m.on_worker(batch(0, 1, 0, share(4, &[3, 7])), s(1), &mut out).unwrap();
    m.on_worker(failed(1, "panic: boom"), s(1), &mut out).unwrap();
    let [NodeOutput::Replace {
        worker: 1,
        restart,
        rollout,
    }, NodeOutput::Worker {
        worker: 1,
        cmd: WorkerCmd::Collect { seq: 1, frames: 4 },
    }] = &out[..]
    else {
        panic!("a rebuild, then its share asked again: {out:?}");
    };
    // The documented seed: restart_seed of the worker's own first seed (base + 1).
    let seed = restart_seed(101, 1);
    assert_eq!(
        restart,
        &WorkerRestart {
            number: 1,
            seed,
            skip_traj_ids_below: 0,
            frames: 0,
            weights: None,
            cause: "panic: boom".into(),
        }
    );
    assert_eq!(m.restart_seed(1, 1), seed);
    // The rollout is the one the spec builds with that seed, not the first one.
    let by_hand = spec.rebuild_worker(&registry, 1, seed, 0, 0, None).unwrap();
    let first = spec.build_worker(&registry, 1).unwrap();
    assert_eq!(rollout.snapshot().unwrap(), by_hand.snapshot().unwrap());
    assert_ne!(rollout.snapshot().unwrap(), first.snapshot().unwrap());
    // The share asked again completes the batch, once.
    out.clear();
    m.on_worker(batch(1, 1, 0, share(4, &[1, 5])), s(1), &mut out).unwrap();
    match trainer_msgs(&out)[..] {
        [FromNode::Batch(b)] => assert_eq!((b.node, b.seq, b.data.numel()), (3, 1, 8)),
        ref other => panic!("{other:?}"),
    }
    assert_eq!((m.restarts(0), m.restarts(1)), (0, 1));
}

#[test]
fn restart_skips_delivered_traj_ids_resumes_frames_and_gets_current_weights() {
    let spec = spec(0, 1, 5);
    let mut m = machine(&spec);
    let mut out = Vec::new();
    let w = weights(2.0, 4);
    m.handle(ToNode::UpdateWeights(UpdateWeights { weights: w.clone() }), &mut out)
        .unwrap();
    m.handle(ToNode::Seed(Seed { seed: 40 }), &mut out).unwrap();
    cont(&mut m, 1, 6);
    m.on_worker(batch(0, 1, 4, share(6, &[2, 10, 6])), s(0), &mut out)
        .unwrap();
    cont(&mut m, 2, 6);
    out.clear();
    m.on_worker(failed(0, "env 0 failed: bad"), s(0), &mut out).unwrap();
    let [(0, restart)] = replaced(&out)[..] else {
        panic!("{out:?}");
    };
    assert_eq!(
        restart.seed,
        restart_seed(40, 1),
        "from the base seed the last Seed set"
    );
    assert_eq!(restart.skip_traj_ids_below, 11);
    assert_eq!(restart.frames, 6);
    assert_eq!(restart.weights.as_ref(), Some(&w));
    let NodeOutput::Replace { rollout, .. } = &out[0] else {
        panic!("{out:?}");
    };
    assert_eq!(rollout.frames(), 6, "the frame count resumes");
    assert_eq!(rollout.weights().version, 4, "the current weights are loaded");
    assert_eq!(worker_cmds(&out), vec![(0, &WorkerCmd::Collect { seq: 2, frames: 6 })]);
}

#[test]
fn a_failure_after_the_share_was_delivered_does_not_ask_again() {
    let mut m = machine(&spec(0, 2, 0));
    cont(&mut m, 1, 4);
    let mut out = Vec::new();
    m.on_worker(batch(0, 1, 0, share(2, &[0])), s(0), &mut out).unwrap();
    m.on_worker(failed(0, "policy failed"), s(0), &mut out).unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(matches!(out[0], NodeOutput::Replace { worker: 0, .. }));
    // Idle node: a rebuild, nothing to ask again.
    let mut m = machine(&spec(0, 1, 0));
    out.clear();
    m.on_worker(failed(0, "x"), s(0), &mut out).unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(matches!(out[0], NodeOutput::Replace { worker: 0, .. }));
}

#[test]
fn without_a_spec_every_rebuild_fails_and_counts_until_the_node_fails() {
    let mut m = NodeMachine::new(1, 1, 1).with_intensity(RestartIntensity::new(3, s(10)).unwrap());
    cont(&mut m, 1, 2);
    let mut out = Vec::new();
    m.on_worker(failed(0, "panic: first"), s(0), &mut out).unwrap();
    let [NodeOutput::Trainer(FromNode::Failed { node: 1, reason })] = &out[..] else {
        panic!("no rebuild to install, only the node's failure: {out:?}");
    };
    for want in [
        "env worker 0 failed after 3 restarts",
        "no spec to rebuild workers from",
        "restart 1 at 0.000 s after panic: first",
    ] {
        assert!(reason.contains(want), "{want:?} not in {reason}");
    }
    assert_eq!(m.restarts(0), 3);
    assert!(m.has_failed());
}

#[test]
fn past_the_intensity_the_node_fails_naming_worker_cause_and_history() {
    let mut m = machine(&spec(2, 2, 0)).with_intensity(RestartIntensity::new(2, s(10)).unwrap());
    cont(&mut m, 1, 4);
    let mut out = Vec::new();
    m.on_worker(failed(1, "panic: a"), s(0), &mut out).unwrap();
    m.on_worker(failed(1, "panic: b"), s(1), &mut out).unwrap();
    assert_eq!(replaced(&out).len(), 2);
    out.clear();
    m.on_worker(failed(1, "panic: c"), s(2), &mut out).unwrap();
    let [NodeOutput::Trainer(FromNode::Failed { node: 2, reason })] = &out[..] else {
        panic!("{out:?}");
    };
    for want in [
        "env worker 1 failed after 2 restarts: panic: c",
        "limit 2 restarts within 10.000 s",
        "restart 1 at 0.000 s after panic: a",
        "restart 2 at 1.000 s after panic: b",
    ] {
        assert!(reason.contains(want), "{want:?} not in {reason}");
    }
    assert!(m.has_failed());
    assert_eq!(m.pending_seq(), None, "the Continue in flight is dropped");
    // Later failures (and late shares) produce nothing more.
    out.clear();
    m.on_worker(failed(0, "panic: d"), s(3), &mut out).unwrap();
    assert!(out.is_empty(), "{out:?}");
    assert!(m.on_worker(batch(0, 1, 0, share(2, &[0])), s(3), &mut out).is_err());
}

#[test]
fn failures_spread_wider_than_the_window_restart_forever() {
    let mut m = machine(&spec(0, 1, 0)).with_intensity(RestartIntensity::new(1, s(5)).unwrap());
    let mut out = Vec::new();
    for i in 0..20 {
        m.on_worker(failed(0, "slow"), s(5 * i), &mut out).unwrap();
    }
    assert!(!m.has_failed());
    assert_eq!(m.restarts(0), 20);
    assert_eq!(replaced(&out).len(), 20);
    m.on_worker(failed(0, "fast"), s(5 * 19 + 1), &mut out).unwrap();
    assert!(m.has_failed());
}

// ---------------------------------------------------------------- stop

#[test]
fn shutdown_stops_every_worker_and_the_node_is_down_once_all_stopped() {
    let mut m = NodeMachine::new(4, 2, 1);
    cont(&mut m, 1, 4);
    let mut out = Vec::new();
    m.handle(ToNode::Shutdown, &mut out).unwrap();
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

// ---------------------------------------------------------------- checkpoint

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
    let spec = NodeSpec {
        index: 4,
        envs_per_node: 3,
        lanes: 3,
        max_restarts: 9,
        restart_window_ms: 250,
        ..spec(4, 3, 77)
    };
    let m = NodeMachine::from_spec(&spec);
    assert_eq!((m.index(), m.workers(), m.base_seed()), (4, 3, 77));
    assert_eq!(
        m.intensity(),
        RestartIntensity::new(9, Duration::from_millis(250)).unwrap()
    );
}
