//! Failed workers rebuilt from the spec, asked again, or the node failed.

use super::*;

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
fn a_worker_restarted_mid_batch_collects_its_share_with_the_batchs_weights_then_takes_the_newer() {
    let spec = spec(0, 2, 5);
    let mut m = machine(&spec);
    let mut out = Vec::new();
    let old = weights(2.0, 4);
    let new = weights(3.0, 5);
    m.handle(ToNode::UpdateWeights(UpdateWeights { weights: old.clone() }), &mut out)
        .unwrap();
    cont(&mut m, 1, 8);
    // Version 5 comes while the batch is collected with version 4.
    m.handle(ToNode::UpdateWeights(UpdateWeights { weights: new.clone() }), &mut out)
        .unwrap();
    m.on_worker(batch(0, 1, 4, share(4, &[0, 1])), s(0), &mut out).unwrap();
    out.clear();
    m.on_worker(failed(1, "panic: boom"), s(0), &mut out).unwrap();
    let [(1, restart)] = replaced(&out)[..] else {
        panic!("{out:?}");
    };
    assert_eq!(
        restart.weights.as_ref().map(|w| w.version),
        Some(4),
        "rebuilt with the weights of the batch in flight, not the newer ones"
    );
    assert_eq!(
        worker_cmds(&out),
        vec![
            (1, &WorkerCmd::Collect { seq: 1, frames: 4 }),
            (1, &WorkerCmd::SetWeights(new.clone())),
        ],
        "its share asked again, then the newer weights"
    );
    out.clear();
    m.on_worker(batch(1, 1, 4, share(4, &[2, 3])), s(0), &mut out).unwrap();
    match trainer_msgs(&out)[..] {
        [FromNode::Batch(b)] => assert_eq!(b.weights_version, 4, "one version for the whole batch"),
        ref other => panic!("{other:?}"),
    }
    // Idle, a restarted worker takes the node's current weights.
    out.clear();
    m.on_worker(failed(0, "panic: again"), s(1), &mut out).unwrap();
    let [(0, restart)] = replaced(&out)[..] else {
        panic!("{out:?}");
    };
    assert_eq!(restart.weights.as_ref().map(|w| w.version), Some(5));
    assert!(worker_cmds(&out).is_empty(), "nothing owed, nothing more: {out:?}");
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

#[test]
fn a_worker_failing_with_two_continues_in_flight_collects_both_again_each_with_its_weights() {
    let mut m = machine(&spec(0, 2, 5));
    let (v4, v5, v6) = (weights(2.0, 4), weights(3.0, 5), weights(4.0, 6));
    update(&mut m, &v4);
    cont(&mut m, 1, 8);
    // The second Continue was sent after version 5, and version 6 came after it.
    update(&mut m, &v5);
    cont(&mut m, 2, 8);
    update(&mut m, &v6);
    let mut out = Vec::new();
    m.on_worker(batch(0, 1, 4, share(4, &[0])), s(0), &mut out).unwrap();
    out.clear();
    m.on_worker(failed(1, "panic: boom"), s(0), &mut out).unwrap();
    assert_eq!(rebuilt_with(&out, 1), Some(4), "the oldest owed batch's");
    assert_eq!(
        worker_cmds(&out),
        vec![
            (1, &WorkerCmd::Collect { seq: 1, frames: 4 }),
            (1, &WorkerCmd::SetWeights(v5.clone())),
            (1, &WorkerCmd::Collect { seq: 2, frames: 4 }),
            (1, &WorkerCmd::SetWeights(v6.clone())),
        ],
        "both shares again, in order, each with the weights it was asked with, then the newest"
    );
    // A worker owing only the second is rebuilt with the second's weights.
    out.clear();
    m.on_worker(failed(0, "panic: again"), s(1), &mut out).unwrap();
    assert_eq!(rebuilt_with(&out, 0), Some(5));
    assert_eq!(
        worker_cmds(&out),
        vec![
            (0, &WorkerCmd::Collect { seq: 2, frames: 4 }),
            (0, &WorkerCmd::SetWeights(v6.clone())),
        ]
    );
}
