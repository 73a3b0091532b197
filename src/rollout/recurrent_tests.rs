//! A recurrent policy's state in the rollout (PROTOCOL.md §8, Recurrent): `is_init` on
//! each episode's first frame, the state zeroed there and carried otherwise (within a
//! batch, across batches, across weight updates and seeds), held still by the random
//! policy's frames, recorded before and after each step, and restored by checkpoints.
//!
//! The policy here is a plain function of its state, so every rule can be checked
//! exactly: `acc` counts the steps since `is_init` and sums the first observation
//! element, and the action is `acc`'s step count modulo 2.

use super::*;
use crate::env::{CartPole, CartPoleConfig, Counting, CountingConfig};
use crate::policy::{ExplorationType, StateIo, StateTensor};

/// A recurrent policy with one state tensor `acc` of shape `[2]`: after a step,
/// `acc = [acc[0] + obs[0], acc[1] + 1]`; its action is `acc[1] mod 2` of the state it
/// read, so the state steers the env. `bias` (its one weight) is added to `acc[0]`.
struct Accumulate {
    state: Vec<StateTensor>,
    weights: Weights,
}

impl Accumulate {
    fn new() -> Accumulate {
        let bias = Tensor::F32(ndarray::ArrayD::zeros(ndarray::IxDyn(&[1])));
        Accumulate {
            state: vec![StateTensor::new("acc", [2])],
            weights: Weights::new([("bias".to_string(), bias)].into()),
        }
    }

    fn bias(&self) -> f32 {
        self.weights.f32_slice("bias").map(|b| b[0]).unwrap_or(0.0)
    }
}

impl Policy for Accumulate {
    fn act(&mut self, _obs: &[f32], _k: usize, _actions: ActionsMut<'_>) -> Result<(), PolicyError> {
        Err(PolicyError::Failed("acts only with its state".into()))
    }
    fn weights(&self) -> &Weights {
        &self.weights
    }
    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
        self.weights.check_layout(weights)?;
        self.weights = weights.clone();
        Ok(())
    }
    fn set_exploration(&mut self, _: ExplorationType) {}
    fn reseed(&mut self, _: u64) {}
    fn sampler_state(&self) -> Result<Option<SamplerState>, PolicyError> {
        Ok(None)
    }
    fn set_sampler_state(&mut self, _: Option<&SamplerState>) -> Result<(), PolicyError> {
        Ok(())
    }
    fn state(&self) -> &[StateTensor] {
        &self.state
    }
    fn act_recurrent(
        &mut self,
        obs: &[f32],
        k: usize,
        state: StateIo<'_>,
        actions: ActionsMut<'_>,
        _record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        let ActionsMut::Discrete(a) = actions else {
            return Err(PolicyError::Buffer("discrete".into()));
        };
        let d = obs.len() / k;
        let (before, after) = (&state.before[0], &mut state.after[0]);
        for r in 0..k {
            if state.is_init[r] && before[2 * r..2 * r + 2] != [0.0, 0.0] {
                return Err(PolicyError::Failed(format!("row {r} is_init with a state not zero")));
            }
            after[2 * r] = before[2 * r] + obs[r * d] + self.bias();
            after[2 * r + 1] = before[2 * r + 1] + 1.0;
            a[r] = (before[2 * r + 1] as i64) % 2;
        }
        Ok(())
    }
}

fn cartpoles(k: usize, cfg: RolloutConfig) -> Rollout {
    let envs: Vec<Box<dyn Env>> = (0..k)
        .map(|_| Box::new(CartPole::new(CartPoleConfig::default()).expect("env")) as Box<dyn Env>)
        .collect();
    let ids = (0..k as u64).map(|i| TrajIds::new(i, k as u64).expect("ids")).collect();
    Rollout::new(envs, Box::new(Accumulate::new()), ids, cfg).expect("rollout")
}

fn cfg(frames: usize) -> RolloutConfig {
    RolloutConfig {
        frames_per_batch: frames,
        max_frames_per_traj: Some(7),
        seed: 3,
        ..RolloutConfig::default()
    }
}

/// One batch's columns, env-major (`[K, T]` flattened).
struct Cols {
    t: usize,
    is_init: Vec<bool>,
    step: Vec<i64>,
    obs0: Vec<f32>,
    action: Vec<i64>,
    acc: Vec<f32>,
    next_acc: Vec<f32>,
}

fn cols(b: &TensorDict) -> Cols {
    let t = b.batch_size()[1];
    let obs = b.f32(keys::OBSERVATION).expect("obs");
    Cols {
        t,
        is_init: b.bool(keys::IS_INIT).expect("is_init").iter().copied().collect(),
        step: b.i64(keys::STEP_COUNT).expect("step").iter().copied().collect(),
        obs0: obs.iter().step_by(4).copied().collect(),
        action: b.i64(keys::ACTION).expect("action").iter().copied().collect(),
        acc: b.f32("acc").expect("acc").iter().copied().collect(),
        next_acc: b.f32("next.acc").expect("next.acc").iter().copied().collect(),
    }
}

#[test]
fn batches_carry_is_init_and_the_state_before_and_after_each_step() {
    let mut r = cartpoles(2, cfg(20));
    let layout = r.batch_layout();
    assert_eq!(layout[keys::IS_INIT], (crate::tensor::DType::Bool, vec![1]));
    assert_eq!(layout["acc"], (crate::tensor::DType::F32, vec![2]));
    assert_eq!(layout["next.acc"], (crate::tensor::DType::F32, vec![2]));
    let mut last: Vec<Option<[f32; 2]>> = vec![None; 2];
    let mut inits_inside = 0;
    for _ in 0..4 {
        let b = r.collect().expect("collect");
        assert_eq!(b.get(keys::IS_INIT).expect("is_init").shape(), &[2, 10, 1]);
        assert_eq!(b.get("acc").expect("acc").shape(), &[2, 10, 2]);
        crate::schema::check_layout(&b, &layout).expect("the batch has the rollout's layout");
        let c = cols(&b);
        for (e, last) in last.iter_mut().enumerate() {
            for s in 0..c.t {
                let i = e * c.t + s;
                let (acc, next) = (
                    [c.acc[2 * i], c.acc[2 * i + 1]],
                    [c.next_acc[2 * i], c.next_acc[2 * i + 1]],
                );
                assert_eq!(
                    c.is_init[i],
                    c.step[i] == 0,
                    "is_init is the episode's first frame (env {e}, {s})"
                );
                if c.is_init[i] {
                    assert_eq!(acc, [0.0, 0.0], "zero where is_init");
                    inits_inside += usize::from(s > 0);
                } else {
                    // The state carries on from the previous frame, across batches too.
                    assert_eq!(Some(acc), *last, "env {e} step {s}");
                }
                assert_eq!(acc[1], c.step[i] as f32, "acc counts the steps since is_init");
                assert_eq!(
                    next,
                    [acc[0] + c.obs0[i], acc[1] + 1.0],
                    "next.acc is the policy's output"
                );
                assert_eq!(c.action[i], c.step[i] % 2, "the action read the state");
                *last = Some(next);
            }
        }
    }
    assert!(inits_inside > 0, "episodes of 7 frames start inside batches of 10");
}

#[test]
fn a_weight_update_keeps_the_state_and_a_seed_starts_it_over() {
    let mut r = cartpoles(
        1,
        RolloutConfig {
            max_frames_per_traj: None,
            ..cfg(5)
        },
    );
    let before = cols(&r.collect().expect("b1"));
    let mut w = r.weights().clone().with_version(1);
    w.tensors.insert(
        "bias".into(),
        Tensor::F32(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[1]), 100.0)),
    );
    r.set_weights(&w).expect("update");
    let after = cols(&r.collect().expect("b2"));
    assert!(!after.is_init[0], "an update starts no episode");
    assert_eq!(
        after.acc[..2],
        before.next_acc[8..10],
        "the state goes on across the update"
    );
    assert_eq!(
        after.next_acc[0],
        after.acc[0] + after.obs0[0] + 100.0,
        "the new weights act on it"
    );
    r.set_seed(11);
    let seeded = cols(&r.collect().expect("b3"));
    assert!(seeded.is_init[0], "a seed resets the env: a new episode, a zero state");
    assert_eq!(seeded.acc[..2], [0.0, 0.0]);
}

#[test]
fn reset_at_each_iter_zeroes_the_state_every_batch() {
    let mut r = cartpoles(
        2,
        RolloutConfig {
            reset_at_each_iter: true,
            max_frames_per_traj: None,
            ..cfg(6)
        },
    );
    for _ in 0..3 {
        let c = cols(&r.collect().expect("collect"));
        assert!(c.is_init[0] && c.is_init[c.t]);
        assert_eq!(c.acc[..2], [0.0, 0.0]);
    }
}

#[test]
fn the_random_policys_frames_hold_the_state() {
    let mut r = cartpoles(
        1,
        RolloutConfig {
            init_random_frames: 4,
            max_frames_per_traj: None,
            ..cfg(8)
        },
    );
    let c = cols(&r.collect().expect("collect"));
    assert!(c.is_init[0]);
    for i in 0..4 {
        assert_eq!(c.acc[2 * i..2 * i + 2], [0.0, 0.0], "frame {i}: not advanced");
        assert_eq!(c.next_acc[2 * i..2 * i + 2], [0.0, 0.0], "frame {i}: held");
        assert_eq!(c.is_init[i], i == 0);
    }
    // The policy's first frame reads the held state mid-episode, not as is_init.
    assert!(!c.is_init[4]);
    assert_eq!(c.next_acc[9], 1.0, "then it advances");
}

#[test]
fn a_checkpoint_holds_the_state_and_a_restored_rollout_writes_the_same_bytes() {
    let mut a = cartpoles(2, cfg(10));
    for _ in 0..3 {
        a.collect().expect("collect");
    }
    let snap = a.snapshot().expect("snapshot");
    let st = snap
        .recurrent
        .as_ref()
        .expect("the recurrent state is in the checkpoint");
    assert_eq!(st.names, ["acc"]);
    assert!(st.state[0].iter().any(|&v| v != 0.0));
    let bytes = rmp_serde::to_vec_named(&snap).expect("encode");
    let decoded: RolloutState = rmp_serde::from_slice(&bytes).expect("decode");
    let want: Vec<TensorDict> = (0..3).map(|_| a.collect().expect("collect")).collect();

    let mut b = cartpoles(2, cfg(10));
    b.restore(&decoded).expect("restore");
    for (i, w) in want.iter().enumerate() {
        let got = b.collect().expect("collect");
        assert_eq!(&got, w, "batch {i} after the restore");
    }
}

#[test]
fn a_checkpoint_of_another_policy_is_refused_and_changes_nothing() {
    let mut recurrent = cartpoles(1, cfg(4));
    recurrent.collect().expect("collect");
    let envs: Vec<Box<dyn Env>> = vec![Box::new(CartPole::new(CartPoleConfig::default()).expect("env"))];
    let plain_policy = Box::new(crate::policy::Constant::new(envs[0].action_spec(), 1.0).expect("policy"));
    let mut plain = Rollout::new(envs, plain_policy, vec![TrajIds::new(0, 1).expect("ids")], cfg(4)).expect("rollout");
    plain.collect().expect("collect");
    let plain_state = plain.snapshot().expect("snapshot");
    assert!(plain_state.recurrent.is_none());
    let before = recurrent.snapshot().expect("snapshot");
    let err = recurrent
        .restore(&plain_state)
        .expect_err("no state for a recurrent policy");
    assert!(err.to_string().contains("no recurrent state"), "{err}");
    let err = plain.restore(&before).expect_err("a state for a policy without one");
    assert!(err.to_string().contains("holds a recurrent state"), "{err}");

    let mut renamed = before.clone();
    if let Some(r) = renamed.recurrent.as_mut() {
        r.names = vec!["hidden".into()];
    }
    let err = recurrent.restore(&renamed).expect_err("another policy's state");
    assert!(err.to_string().contains("hidden"), "{err}");
    let mut short = before.clone();
    if let Some(r) = short.recurrent.as_mut() {
        r.state[0].pop();
    }
    let err = recurrent.restore(&short).expect_err("rows that do not fit");
    assert!(err.to_string().contains("values in the checkpoint"), "{err}");
    assert_eq!(recurrent.snapshot().expect("snapshot"), before, "nothing changed");
}

#[test]
fn a_state_breaking_the_rules_is_refused_when_the_rollout_is_built() {
    let mut p = Accumulate::new();
    p.state = vec![StateTensor::new("next.acc", [2])];
    let envs: Vec<Box<dyn Env>> = vec![Box::new(Counting::new(CountingConfig::default()).expect("env"))];
    let err = Rollout::new(envs, Box::new(p), vec![TrajIds::new(0, 1).expect("ids")], cfg(4))
        .err()
        .expect("a reserved key");
    assert!(err.to_string().contains("next.acc"), "{err}");
}

#[test]
fn split_trajectories_keeps_each_segments_first_state_and_is_init_marks_episode_starts() {
    let mut r = cartpoles(2, cfg(20));
    r.collect()
        .expect("a first batch: trajectories then run across the boundary");
    let b = r.collect().expect("collect");
    let split = crate::postproc::split_trajectories(&b).expect("split");
    let [n, len] = [split.batch_size()[0], split.batch_size()[1]];
    let mask: Vec<bool> = split.bool(keys::MASK).expect("mask").iter().copied().collect();
    let is_init: Vec<bool> = split.bool(keys::IS_INIT).expect("is_init").iter().copied().collect();
    let step: Vec<i64> = split.i64(keys::STEP_COUNT).expect("step").iter().copied().collect();
    let acc: Vec<f32> = split.f32("acc").expect("acc").iter().copied().collect();
    let next: Vec<f32> = split.f32("next.acc").expect("next.acc").iter().copied().collect();
    let (mut continued, mut started) = (0, 0);
    for t in 0..n {
        let first = t * len;
        assert!(mask[first]);
        // A segment starts an episode exactly when its first frame is_init, with a zero
        // state; else it goes on from the state the previous batch ended with.
        if is_init[first] {
            started += 1;
            assert_eq!((acc[2 * first], acc[2 * first + 1], step[first]), (0.0, 0.0, 0));
        } else {
            continued += 1;
            assert_eq!(
                acc[2 * first + 1],
                step[first] as f32,
                "the carried state counts the episode's steps"
            );
        }
        for i in first + 1..first + len {
            if mask[i] {
                assert!(!is_init[i], "one episode per segment");
                assert_eq!(
                    acc[2 * i..2 * i + 2],
                    next[2 * (i - 1)..2 * i],
                    "the state runs on inside a segment"
                );
            }
        }
    }
    assert!(
        started > 0 && continued > 0,
        "segments of both kinds: {started} started, {continued} continued"
    );
}
