//! A Q-value actor in the rollout (PROTOCOL.md §8, Q-value actors): every batch carries
//! `action_value` `[n]` and `chosen_action_value` `[1]` as the policy wrote them, NaN on
//! the random policy's frames; epsilon-greedy after it explores at the `eps` of the
//! weights each batch was collected with, and deterministic exploration is greedy.
//!
//! The Q-function here is a plain function of the observation, so every value can be
//! checked exactly: `Q(obs) = [obs[0] + w, -obs[0]]` with `w` its one weight.

use super::*;
use crate::env::{CartPole, CartPoleConfig};
use crate::policy::{EpsilonGreedy, ExplorationModule, ExplorationType, ExploringPolicy, ParamsMut};

/// `Q(obs) = [obs[0] + w, -obs[0]]`; greedy, recording as the `qvalue` head does.
struct Linear2 {
    weights: Weights,
}

fn scalar(v: f32) -> Tensor {
    Tensor::F32(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[]), v))
}

impl Linear2 {
    fn new(eps: f32) -> Linear2 {
        Linear2 {
            weights: Weights::new([("w".to_string(), scalar(0.0)), ("eps".to_string(), scalar(eps))].into()),
        }
    }

    fn q(&self, obs0: f32) -> [f32; 2] {
        let w = self.weights.f32_slice("w").map(|w| w[0]).unwrap_or(0.0);
        [obs0 + w, -obs0]
    }
}

impl Policy for Linear2 {
    fn act(&mut self, obs: &[f32], k: usize, actions: ActionsMut<'_>) -> Result<(), PolicyError> {
        self.act_recording(obs, k, actions, RecordMut::nothing())
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
    fn recorded(&self) -> Recorded {
        Recorded::QValue { n: 2 }
    }
    fn act_recording(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        let ActionsMut::Discrete(a) = actions else {
            return Err(PolicyError::Buffer("discrete".into()));
        };
        let d = obs.len() / k;
        let RecordMut { log_prob, params } = record;
        let mut values = match params {
            ParamsMut::Logits(v) if v.len() == 2 * k => Some(v),
            _ => None,
        };
        for r in 0..k {
            let q = self.q(obs[r * d]);
            let best = usize::from(q[1] > q[0]);
            a[r] = best as i64;
            if let Some(v) = values.as_deref_mut() {
                v[2 * r..2 * r + 2].copy_from_slice(&q);
            }
            if log_prob.len() == k {
                log_prob[r] = q[best];
            }
        }
        Ok(())
    }
}

fn rollout(eps: f32, init_random_frames: u64, exploration: ExplorationType) -> Rollout {
    let k = 2;
    let envs: Vec<Box<dyn Env>> = (0..k)
        .map(|_| Box::new(CartPole::new(CartPoleConfig::default()).expect("env")) as Box<dyn Env>)
        .collect();
    let ids = (0..k as u64).map(|i| TrajIds::new(i, k as u64).expect("ids")).collect();
    let module = ExplorationModule::EpsilonGreedy(EpsilonGreedy { eps: "eps".into() });
    let mut policy =
        ExploringPolicy::new(Box::new(Linear2::new(eps)), module, &Spec::Discrete { n: 2 }, 5).expect("policy");
    policy.set_exploration(exploration);
    let cfg = RolloutConfig {
        frames_per_batch: 2000,
        seed: 3,
        init_random_frames,
        ..RolloutConfig::default()
    };
    Rollout::new(envs, Box::new(policy), ids, cfg).expect("rollout")
}

/// (greedy fraction, frames whose values are NaN) of a batch, checking every value
/// the policy acted with against `Q` of the frame's observation.
fn check(b: &TensorDict, w: f32) -> (f64, usize) {
    let obs = b.f32(keys::OBSERVATION).expect("obs");
    let values = b.f32(keys::ACTION_VALUE).expect("action_value");
    let chosen = b.f32(keys::CHOSEN_ACTION_VALUE).expect("chosen_action_value");
    let action = b.i64(keys::ACTION).expect("action");
    assert_eq!(values.shape(), &[2, 1000, 2]);
    assert_eq!(chosen.shape(), &[2, 1000, 1]);
    let (obs0, v, c, a): (Vec<f32>, Vec<f32>, Vec<f32>, Vec<i64>) = (
        obs.iter().step_by(4).copied().collect(),
        values.iter().copied().collect(),
        chosen.iter().copied().collect(),
        action.iter().copied().collect(),
    );
    let (mut greedy, mut nan) = (0usize, 0usize);
    for i in 0..obs0.len() {
        if v[2 * i].is_nan() {
            assert!(
                v[2 * i + 1].is_nan() && c[i].is_nan(),
                "a random frame records no value"
            );
            nan += 1;
            continue;
        }
        let q = [obs0[i] + w, -obs0[i]];
        assert_eq!([v[2 * i], v[2 * i + 1]], q, "action_value is the Q-function's");
        let best = usize::from(q[1] > q[0]);
        assert_eq!(
            c[i], q[best],
            "chosen_action_value is the greedy action's, whatever was taken"
        );
        greedy += usize::from(a[i] == best as i64);
    }
    (greedy as f64 / (obs0.len() - nan).max(1) as f64, nan)
}

#[test]
fn batches_carry_the_q_values_and_the_greedy_value_with_the_layout_the_trainer_expects() {
    let mut r = rollout(0.0, 0, ExplorationType::Random);
    let layout = r.batch_layout();
    assert_eq!(layout[keys::ACTION_VALUE], (crate::tensor::DType::F32, vec![2]));
    assert_eq!(layout[keys::CHOSEN_ACTION_VALUE], (crate::tensor::DType::F32, vec![1]));
    assert!(!layout.contains_key(keys::ACTION_LOG_PROB) && !layout.contains_key(keys::LOGITS));
    let b = r.collect().expect("collect");
    crate::schema::check_layout(&b, &layout).expect("the batch has the rollout's layout");
    assert_eq!(check(&b, 0.0), (1.0, 0), "eps 0: every action greedy");
}

#[test]
fn epsilon_greedy_explores_at_the_eps_of_the_current_weights() {
    let mut r = rollout(1.0, 0, ExplorationType::Random);
    // eps 1: uniform over 2 actions, greedy half the time (2000 frames: sd 0.011).
    let (greedy, _) = check(&r.collect().expect("b1"), 0.0);
    assert!((greedy - 0.5).abs() < 0.05, "{greedy}");
    // An update to eps 0.4 and w 1: greedy 1 - 0.4 / 2 = 0.8 of the time, values moved.
    let mut w = r.weights().clone().with_version(1);
    w.tensors.insert("eps".into(), scalar(0.4));
    w.tensors.insert("w".into(), scalar(1.0));
    r.set_weights(&w).expect("update");
    let (greedy, _) = check(&r.collect().expect("b2"), 1.0);
    assert!((greedy - 0.8).abs() < 0.05, "{greedy}");
}

#[test]
fn deterministic_exploration_is_greedy_whatever_eps() {
    let mut r = rollout(1.0, 0, ExplorationType::Deterministic);
    assert_eq!(check(&r.collect().expect("collect"), 0.0), (1.0, 0));
}

#[test]
fn the_random_policys_frames_record_nan_values() {
    let mut r = rollout(0.0, 300, ExplorationType::Random);
    let (greedy, nan) = check(&r.collect().expect("collect"), 0.0);
    // init_random_frames counts the worker's frames: its 2 envs' first 150 steps.
    assert_eq!(nan, 300);
    assert_eq!(greedy, 1.0, "the policy's frames after them are greedy (eps 0)");
}
