//! The trainer owns the policy: it builds version 0 of the weights and every node acts with
//! the trainer's weights, never with weights of its own.
//!
//! - A Rust node joined to a scripted trainer acts with the weights in `welcome` (chosen
//!   here, unlike anything it would build), fails naming why when they are missing or of
//!   another layout, and fails on an update of another layout.
//! - Two process nodes, deterministic: every frame's action is what a policy built here, in
//!   process, computes for that frame's observation with the weights of the batch's version:
//!   version 0 from the trainer, then the versions pushed by `update_after_each_batch`.
//! - `rollout collect --update-after-each-batch` / `--update-interval N` push new versions:
//!   the batches' `weights_version` increase.
//!
//! Every wait has a deadline; nothing sleeps and hopes.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use ndarray::{ArrayD, IxDyn};
use rollout::message::{Continue, FromNode, ToNode, UpdateWeights};
use rollout::node_spec::NodeSpec;
use rollout::policy::{ActionsMut, Policy};
use rollout::schema::keys;
use rollout::space::EnvSpecs;
use rollout::wire::TrainerFrame;
use rollout::{EnvSpec, ExplorationType, PolicyConfig, PolicySpec, Registry, Tensor, TensorDict, Weights};
use rollout_actors::{DistributedCollector, Launcher};
use rollout_tests::{rollout_bin, run_bounded, scripted_join, scripted_node_result};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(60);

// --- a Rust node and a scripted trainer ------------------------------------------------------

/// The spec of a one-worker node of `env` with `policy`, deterministic.
fn node_spec(env: &str, policy: PolicyConfig, frames: usize) -> NodeSpec {
    let policy = PolicySpec {
        config: policy,
        exploration: ExplorationType::Deterministic,
        init_seed: 0,
        record: true,
    };
    NodeSpec::new(env, policy, 1)
        .with_env_share(frames)
        .with_seed(3)
        .with_restarts(0, 5000)
        .with_worker_nice(0)
}

/// An f32 tensor of `shape`.
fn f32s(shape: &[usize], data: &[f32]) -> Tensor {
    Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).expect("shape"))
}

/// CartPole linear weights that push the cart the way the pole leans: action 1 iff
/// `theta + 0.5 * theta_dot > 0`; nothing like the initial weights of any seed.
fn lean_weights() -> Weights {
    let mut w = BTreeMap::new();
    w.insert(
        "weight".to_string(),
        f32s(&[2, 4], &[0.0, 0.0, -1.0, -0.5, 0.0, 0.0, 1.0, 0.5]),
    );
    w.insert("bias".to_string(), f32s(&[2], &[0.0, 0.0]));
    Weights::new(w)
}

/// The policy `spec` builds here, in process, for `env`, acting with `weights`.
fn reference(spec: &PolicySpec, env: &str, weights: &Weights) -> Box<dyn Policy> {
    let e = Registry::with_builtins().make(&EnvSpec::new(env)).expect("env");
    let mut p = spec.build(e.observation_spec(), e.action_spec(), 0).expect("policy");
    p.set_weights(weights).expect("the reference takes the weights");
    p
}

/// The `(observations, actions)` of `data`'s frames, flattened, in the same order.
fn frames(data: &TensorDict) -> (Vec<f32>, Tensor) {
    let obs = data.f32(keys::OBSERVATION).expect("observations");
    (
        obs.iter().copied().collect(),
        data.get(keys::ACTION).expect("actions").clone(),
    )
}

/// What `policy` does for each observation of `obs` (rows of `obs_dim`), as the batch
/// stores actions.
fn act(policy: &mut dyn Policy, obs: &[f32], obs_dim: usize, like: &Tensor) -> Tensor {
    let k = obs.len() / obs_dim;
    match like {
        Tensor::I64(a) => {
            let mut out = vec![0i64; k];
            policy.act(obs, k, ActionsMut::Discrete(&mut out)).expect("act");
            Tensor::I64(ArrayD::from_shape_vec(a.raw_dim(), out).expect("shape"))
        }
        Tensor::F32(a) => {
            let mut out = vec![0f32; a.len()];
            policy.act(obs, k, ActionsMut::Continuous(&mut out)).expect("act");
            Tensor::F32(ArrayD::from_shape_vec(a.raw_dim(), out).expect("shape"))
        }
        other => panic!("actions of dtype {}", other.dtype()),
    }
}

#[test]
fn a_rust_node_acts_with_the_weights_in_welcome_not_weights_of_its_own() {
    let spec = node_spec("CartPole-v1", PolicyConfig::Linear, 200);
    let policy = spec.policy.clone();
    let own = spec.initial_weights(&Registry::with_builtins()).expect("version 0");
    let given = lean_weights();
    assert_ne!(own, given);
    let (mut t, node) = scripted_join(spec, Some(given.clone()), 500);
    assert!(matches!(t.message("ready"), FromNode::Ready { node: 0, .. }));
    t.send(&TrainerFrame::Message(ToNode::Continue(Continue {
        seq: 1,
        frames: 200,
    })));
    let batch = match t.message("a batch") {
        FromNode::Batch(b) => b,
        other => panic!("expected a batch, got {other:?}"),
    };
    assert_eq!(batch.weights_version, 0, "welcome's weights are version 0");
    let (obs, actions) = frames(&batch.data);
    let expect = act(reference(&policy, "CartPole-v1", &given).as_mut(), &obs, 4, &actions);
    assert_eq!(
        actions, expect,
        "every action is the welcome weights' for its observation"
    );
    let with_own = act(reference(&policy, "CartPole-v1", &own).as_mut(), &obs, 4, &actions);
    assert_ne!(actions, with_own, "the node's own version 0 would have acted otherwise");
    t.send(&TrainerFrame::Message(ToNode::Shutdown));
    assert!(matches!(t.message("down"), FromNode::Down { node: 0 }));
    assert_eq!(scripted_node_result(node), Ok(()));
}

/// The node's `failed` reason, then it closes and `run_node` errs with the same cause.
fn fails_at_start(spec: NodeSpec, weights: Option<Weights>, expect: &[&str]) {
    let (mut t, node) = scripted_join(spec, weights, 500);
    let reason = match t.message("failed") {
        FromNode::Failed { node: 0, reason } => reason,
        other => panic!("expected failed, got {other:?}"),
    };
    for e in expect {
        assert!(reason.contains(e), "{reason:?} should contain {e:?}");
    }
    assert!(t.recv().is_none(), "the node closes after failed");
    let err = scripted_node_result(node).expect_err("run_node fails");
    assert!(err.contains(expect[0]), "{err}");
}

#[test]
fn a_rust_node_without_weights_in_welcome_fails_on_a_continue_before_any_naming_what_its_policy_needs() {
    let (mut t, node) = scripted_join(node_spec("CartPole-v1", PolicyConfig::Linear, 10), None, 500);
    match t.message("ready") {
        FromNode::Ready { node: 0, specs, .. } => {
            let cartpole = Registry::with_builtins()
                .make(&EnvSpec::new("CartPole-v1"))
                .expect("env");
            assert_eq!(
                specs,
                Some(Box::new(EnvSpecs::from_specs(
                    cartpole.observation_spec(),
                    cartpole.action_spec()
                ))),
                "ready carries the env's specs"
            );
        }
        other => panic!("expected ready, got {other:?}"),
    }
    t.send(&TrainerFrame::Message(ToNode::Continue(Continue {
        seq: 1,
        frames: 10,
    })));
    let reason = match t.message("failed") {
        FromNode::Failed { node: 0, reason } => reason,
        other => panic!("expected failed, got {other:?}"),
    };
    for e in ["came before any weights", "`bias` f32 [2]", "`weight` f32 [2, 4]"] {
        assert!(reason.contains(e), "{reason:?} should contain {e:?}");
    }
    drop(t);
    assert!(scripted_node_result(node).is_err());
}

#[test]
fn a_rust_node_without_weights_in_welcome_collects_with_the_update_that_follows() {
    let spec = node_spec("CartPole-v1", PolicyConfig::Linear, 200);
    let policy = spec.policy.clone();
    let (mut t, node) = scripted_join(spec, None, 500);
    assert!(matches!(t.message("ready"), FromNode::Ready { node: 0, .. }));
    let given = lean_weights();
    t.send(&TrainerFrame::Message(ToNode::UpdateWeights(UpdateWeights {
        weights: std::sync::Arc::new(given.clone()),
    })));
    assert!(matches!(
        t.message("weights_updated"),
        FromNode::WeightsUpdated { node: 0, version: 0 }
    ));
    t.send(&TrainerFrame::Message(ToNode::Continue(Continue {
        seq: 1,
        frames: 200,
    })));
    let batch = match t.message("a batch") {
        FromNode::Batch(b) => b,
        other => panic!("expected a batch, got {other:?}"),
    };
    let (obs, actions) = frames(&batch.data);
    let expect = act(reference(&policy, "CartPole-v1", &given).as_mut(), &obs, 4, &actions);
    assert_eq!(actions, expect, "every action is the update's for its observation");
    t.send(&TrainerFrame::Message(ToNode::Shutdown));
    assert!(matches!(t.message("down"), FromNode::Down { node: 0 }));
    assert_eq!(scripted_node_result(node), Ok(()));
}

#[test]
fn a_rust_node_given_weights_of_another_layout_fails_naming_the_tensor() {
    let mut wrong = lean_weights();
    wrong.tensors.insert("weight".into(), f32s(&[3, 4], &[0.0; 12]));
    fails_at_start(
        node_spec("CartPole-v1", PolicyConfig::Linear, 10),
        Some(wrong),
        &["`weight` must be f32 [2, 4], got f32 [3, 4]"],
    );
    let mut extra = lean_weights();
    extra.tensors.insert("value".into(), f32s(&[1], &[1.0]));
    fails_at_start(
        node_spec("CartPole-v1", PolicyConfig::Linear, 10),
        Some(extra),
        &["unexpected tensor `value`"],
    );
}

#[test]
fn a_random_policy_needs_no_weights_in_welcome() {
    let (mut t, node) = scripted_join(node_spec("CartPole-v1", PolicyConfig::Random, 10), None, 500);
    assert!(matches!(t.message("ready"), FromNode::Ready { node: 0, .. }));
    t.send(&TrainerFrame::Message(ToNode::Shutdown));
    assert!(matches!(t.message("down"), FromNode::Down { node: 0 }));
    assert_eq!(scripted_node_result(node), Ok(()));
}

#[test]
fn an_update_of_another_layout_fails_the_node_naming_the_tensor() {
    let (mut t, node) = scripted_join(
        node_spec("CartPole-v1", PolicyConfig::Linear, 10),
        Some(lean_weights()),
        500,
    );
    assert!(matches!(t.message("ready"), FromNode::Ready { .. }));
    let mut wrong = lean_weights().with_version(1);
    wrong.tensors.insert("bias".into(), f32s(&[3], &[0.0; 3]));
    t.send(&TrainerFrame::Message(ToNode::UpdateWeights(UpdateWeights {
        weights: std::sync::Arc::new(wrong),
    })));
    match t.message("failed") {
        FromNode::Failed { node: 0, reason } => {
            assert!(reason.contains("version 1"), "{reason}");
            assert!(reason.contains("`bias` must be f32 [2], got f32 [3]"), "{reason}");
        }
        other => panic!("expected failed, got {other:?}"),
    }
    // The trainer drops a failed node: its connection closes and the node leaves.
    drop(t);
    assert!(scripted_node_result(node).is_err());
}

// --- process nodes against an in-process reference --------------------------------------------

/// Version `v` of a run's weights: version 0's tensors, every value replaced by one
/// spread over [-1, 1] by its index and `v`, so that each version acts differently.
fn version(w0: &Weights, v: u64) -> Weights {
    let mut w = w0.clone();
    for t in w.tensors.values_mut() {
        if let Tensor::F32(a) = t {
            for (i, x) in a.iter_mut().enumerate() {
                let h = (i as u64).wrapping_mul(7919).wrapping_add(v.wrapping_mul(104_729)) % 2001;
                *x = h as f32 / 1000.0 - 1.0;
            }
        }
    }
    w.version = 0;
    w
}

/// Two process nodes of `env` with `policy`, deterministic, weights stored anew after
/// every batch and pushed before each node's next one. Every share's actions are the
/// reference's for its observations with the weights of its version, and some pushed
/// version changed some action. Returns each batch's versions (one per share).
fn follows_the_trainers_weights(env: &str, policy: PolicyConfig, obs_dim: usize, sync: bool) -> Vec<Vec<u64>> {
    let spec = PolicySpec {
        config: policy,
        exploration: ExplorationType::Deterministic,
        init_seed: 0,
        record: true,
    };
    let mut c = DistributedCollector::builder()
        .env(env)
        .policy(spec.clone())
        .nodes(2)
        .envs_per_node(2)
        .frames_per_batch(80)
        .total_frames(560)
        .sync(sync)
        .seed(11)
        .update_after_each_batch(true)
        .launcher(Launcher::Process)
        .node_program(rollout_bin())
        .join_timeout(DEADLINE)
        .batch_timeout(DEADLINE)
        .build()
        .expect("collector");
    let w0 = c.policy_weights(0).expect("weights").expect("version 0");
    assert_eq!(w0.version, 0);
    let mut by_version: BTreeMap<u64, Weights> = BTreeMap::new();
    by_version.insert(0, (*w0).clone());
    let mut versions = Vec::new();
    let mut followed_a_push = false;
    while let Some(b) = c.next_batch().expect("batch") {
        let (obs, actions) = frames(&b.data);
        let shares = b.weights_versions.len();
        let per_obs = obs.len() / shares;
        let per_act = actions.len() / shares;
        for (n, &v) in b.weights_versions.iter().enumerate() {
            let w = by_version
                .get(&v)
                .unwrap_or_else(|| panic!("batch {} has unknown version {v}", b.index));
            let o = &obs[n * per_obs..(n + 1) * per_obs];
            let share = slice(&actions, n * per_act, per_act);
            let expect = act(reference(&spec, env, w).as_mut(), o, obs_dim, &share);
            assert_eq!(share, expect, "batch {} share {n}: version {v}'s actions", b.index);
            if v > 0 {
                let old = act(reference(&spec, env, &w0).as_mut(), o, obs_dim, &share);
                followed_a_push |= old != share;
            }
        }
        versions.push(b.weights_versions.clone());
        let next = version(&w0, b.index + 1);
        let v = c.set_policy_weights(next.clone()).expect("store");
        by_version.insert(v, next);
    }
    c.shutdown().expect("shutdown");
    assert!(followed_a_push, "{env}: the pushed weights changed the actions");
    versions
}

/// `n` values of `a` from `start`, flattened.
fn slice(a: &Tensor, start: usize, n: usize) -> Tensor {
    match a {
        Tensor::I64(x) => {
            let v: Vec<i64> = x.iter().skip(start).take(n).copied().collect();
            Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[n]), v).expect("shape"))
        }
        Tensor::F32(x) => {
            let v: Vec<f32> = x.iter().skip(start).take(n).copied().collect();
            Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[n]), v).expect("shape"))
        }
        other => panic!("actions of dtype {}", other.dtype()),
    }
}

#[test]
fn process_nodes_act_as_the_reference_with_version_0_then_every_pushed_version_sync() {
    for (env, policy, dim) in [
        ("CartPole-v1", PolicyConfig::Linear, 4),
        ("Pendulum-v1", PolicyConfig::Mlp { hidden: vec![8] }, 3),
    ] {
        let versions = follows_the_trainers_weights(env, policy, dim, true);
        assert_eq!(versions.len(), 7);
        for (i, v) in versions.iter().enumerate() {
            // Sync: the update stored after batch i is pushed before round i + 1.
            assert_eq!(v, &vec![i as u64; 2], "{env}: batch {i}'s versions");
        }
    }
}

#[test]
fn process_nodes_act_as_the_reference_with_version_0_then_every_pushed_version_async() {
    let versions = follows_the_trainers_weights("CartPole-v1", PolicyConfig::Linear, 4, false);
    assert_eq!(versions.len(), 7);
    assert_eq!(versions[0], vec![0], "the first batch is collected with version 0");
    assert!(
        versions.iter().flatten().any(|&v| v > 0),
        "later batches use pushed versions: {versions:?}"
    );
}

// --- rollout collect's update flags ------------------------------------------------------------

/// The `weights_version` of each batch line of `rollout collect --json` with `flags`.
fn collect_versions(flags: &[&str]) -> Vec<u64> {
    let mut cmd = Command::new(rollout_bin());
    cmd.args([
        "collect",
        "--env",
        "CartPole-v1",
        "--launcher",
        "process",
        "--nodes",
        "2",
        "--frames-per-batch",
        "40",
        "--total-frames",
        "240",
        "--sync",
        "--seed",
        "5",
        "--json",
        "--quiet",
    ]);
    cmd.args(flags);
    let run = run_bounded(&mut cmd, Duration::from_secs(120)).expect("rollout collect");
    assert_eq!(run.code(), Some(0), "rollout collect {flags:?}: {}", run.stderr_text());
    run.stdout_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("batch").is_some())
        .map(|v| v["weights_version"].as_u64().expect("weights_version"))
        .collect()
}

#[test]
fn rollout_collect_pushes_a_new_version_after_each_batch_or_every_n_batches() {
    assert_eq!(collect_versions(&[]), [0; 6], "no update flag: version 0 throughout");
    assert_eq!(
        collect_versions(&["--update-after-each-batch"]),
        [0, 1, 2, 3, 4, 5],
        "a new version before every round"
    );
    let every_2 = collect_versions(&["--update-interval", "2"]);
    assert_eq!(every_2.len(), 6);
    assert!(every_2.windows(2).all(|w| w[0] <= w[1]), "{every_2:?}");
    assert!(every_2[5] > 0, "pushed every 2 batches: {every_2:?}");
    assert!(
        every_2.windows(2).any(|w| w[0] == w[1]),
        "not every batch gets a push: {every_2:?}"
    );
}
