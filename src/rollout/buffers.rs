//! The storage of one batch: sized for the batch, turned into the batch's
//! [`TensorDict`], and taken back from a recycled batch so the next one reuses it.

use ndarray::{ArrayD, IxDyn};

use super::{keys, Recurrent, Rollout, RolloutError};
use crate::policy::Recorded;
use crate::tensor::{Tensor, TensorDict, TensorError};

/// The storage of one batch, reused across batches.
#[derive(Default)]
pub(super) struct Buffers {
    pub(super) obs: Vec<f32>,
    pub(super) next_obs: Vec<f32>,
    pub(super) action_i: Vec<i64>,
    pub(super) action_f: Vec<f32>,
    pub(super) reward: Vec<f32>,
    pub(super) done: Vec<bool>,
    pub(super) terminated: Vec<bool>,
    pub(super) truncated: Vec<bool>,
    pub(super) traj_ids: Vec<i64>,
    pub(super) step_count: Vec<i64>,
    /// `action_log_prob`, when the policy records it.
    pub(super) log_prob: Vec<f32>,
    /// `logits` or `loc`, when the policy records them.
    pub(super) param_a: Vec<f32>,
    /// `scale`, when the policy records it.
    pub(super) param_b: Vec<f32>,
    /// A recurrent policy's `is_init`, and each state tensor before (`<name>`) and
    /// after (`next.<name>`) the step; empty for a policy without state.
    pub(super) is_init: Vec<bool>,
    pub(super) state: Vec<Vec<f32>>,
    pub(super) next_state: Vec<Vec<f32>>,
}

/// A buffer of exactly `n` elements. A recycled buffer of the right size is
/// returned as is: every element is overwritten by the next batch anyway.
fn sized<T: Clone + Default>(mut v: Vec<T>, n: usize) -> Vec<T> {
    if v.len() != n {
        v.clear();
        v.resize(n, T::default());
    }
    v
}

fn take_vec<T: Clone>(t: Tensor, unwrap: fn(Tensor) -> Option<ArrayD<T>>) -> Vec<T> {
    match unwrap(t) {
        Some(a) if a.is_standard_layout() => {
            let (v, offset) = a.into_raw_vec_and_offset();
            if offset.unwrap_or(0) == 0 {
                v
            } else {
                Vec::new()
            }
        }
        _ => Vec::new(),
    }
}

impl Rollout {
    /// Hands a batch back so its storage is reused by the next `collect`.
    /// A batch of another layout is simply dropped.
    pub fn recycle(&mut self, batch: TensorDict) {
        if batch.batch_size() != self.batch_size() {
            return;
        }
        let mut t = batch.into_entries();
        let mut take = |k: &str| t.remove(k);
        let b = Buffers {
            obs: take(keys::OBSERVATION).map_or_else(Vec::new, |x| take_vec(x, into_f32)),
            next_obs: take(keys::NEXT_OBSERVATION).map_or_else(Vec::new, |x| take_vec(x, into_f32)),
            action_i: if self.discrete {
                take(keys::ACTION).map_or_else(Vec::new, |x| take_vec(x, into_i64))
            } else {
                Vec::new()
            },
            action_f: if self.discrete {
                Vec::new()
            } else {
                take(keys::ACTION).map_or_else(Vec::new, |x| take_vec(x, into_f32))
            },
            reward: take(keys::NEXT_REWARD).map_or_else(Vec::new, |x| take_vec(x, into_f32)),
            done: take(keys::NEXT_DONE).map_or_else(Vec::new, |x| take_vec(x, into_bool)),
            terminated: take(keys::NEXT_TERMINATED).map_or_else(Vec::new, |x| take_vec(x, into_bool)),
            truncated: take(keys::NEXT_TRUNCATED).map_or_else(Vec::new, |x| take_vec(x, into_bool)),
            traj_ids: take(keys::TRAJ_IDS).map_or_else(Vec::new, |x| take_vec(x, into_i64)),
            step_count: take(keys::STEP_COUNT).map_or_else(Vec::new, |x| take_vec(x, into_i64)),
            log_prob: take(keys::ACTION_LOG_PROB)
                .or_else(|| take(keys::CHOSEN_ACTION_VALUE))
                .map_or_else(Vec::new, |x| take_vec(x, into_f32)),
            param_a: take(keys::LOGITS)
                .or_else(|| take(keys::LOC))
                .or_else(|| take(keys::ACTION_VALUE))
                .map_or_else(Vec::new, |x| take_vec(x, into_f32)),
            param_b: take(keys::SCALE).map_or_else(Vec::new, |x| take_vec(x, into_f32)),
            is_init: take(keys::IS_INIT).map_or_else(Vec::new, |x| take_vec(x, into_bool)),
            state: Vec::new(),
            next_state: Vec::new(),
        };
        let mut b = b;
        if let Some(r) = &self.recurrent {
            for t in &r.tensors {
                b.state
                    .push(take(&t.name).map_or_else(Vec::new, |x| take_vec(x, into_f32)));
                b.next_state
                    .push(take(&t.next_key()).map_or_else(Vec::new, |x| take_vec(x, into_f32)));
            }
        }
        self.spare = Some(b);
    }

    /// Storage for the next batch: the recycled buffers, sized for it, or new ones.
    pub(super) fn buffers(&mut self) -> Buffers {
        let n = self.envs.len() * self.steps;
        let (lp, pa, pb) = record_sizes(self.recorded);
        let b = self.spare.take().unwrap_or_default();
        Buffers {
            obs: sized(b.obs, n * self.obs_dim),
            next_obs: sized(b.next_obs, n * self.obs_dim),
            action_i: if self.discrete {
                sized(b.action_i, n)
            } else {
                Vec::new()
            },
            action_f: if self.discrete {
                Vec::new()
            } else {
                sized(b.action_f, n * self.act_dim)
            },
            reward: sized(b.reward, n),
            done: sized(b.done, n),
            terminated: sized(b.terminated, n),
            truncated: sized(b.truncated, n),
            traj_ids: sized(b.traj_ids, n),
            step_count: sized(b.step_count, n),
            log_prob: sized(b.log_prob, n * lp),
            param_a: sized(b.param_a, n * pa),
            param_b: sized(b.param_b, n * pb),
            is_init: sized(b.is_init, if self.recurrent.is_some() { n } else { 0 }),
            state: state_buffers(b.state, self.recurrent.as_ref(), n),
            next_state: state_buffers(b.next_state, self.recurrent.as_ref(), n),
        }
    }

    /// The batch, as the [`TensorDict`] of torchrl's keys and shapes, over the
    /// buffers' storage (no copy).
    pub(super) fn to_tensordict(&self, b: Buffers) -> Result<TensorDict, RolloutError> {
        let (k, t, d, a) = (self.envs.len(), self.steps, self.obs_dim, self.act_dim);
        let bs = [k, t];
        let arr = |shape: &[usize]| IxDyn(shape);
        let e = |e: ndarray::ShapeError| TensorError::Invalid(e.to_string());
        let mut td = TensorDict::new(&bs);
        td.set(
            keys::OBSERVATION,
            ArrayD::from_shape_vec(arr(&[k, t, d]), b.obs).map_err(e)?.into(),
        )?;
        td.set(
            keys::NEXT_OBSERVATION,
            ArrayD::from_shape_vec(arr(&[k, t, d]), b.next_obs).map_err(e)?.into(),
        )?;
        let action: Tensor = if self.discrete {
            ArrayD::from_shape_vec(arr(&[k, t]), b.action_i).map_err(e)?.into()
        } else {
            ArrayD::from_shape_vec(arr(&[k, t, a]), b.action_f).map_err(e)?.into()
        };
        td.set(keys::ACTION, action)?;
        let one = [k, t, 1];
        td.set(
            keys::NEXT_REWARD,
            ArrayD::from_shape_vec(arr(&one), b.reward).map_err(e)?.into(),
        )?;
        td.set(
            keys::NEXT_DONE,
            ArrayD::from_shape_vec(arr(&one), b.done).map_err(e)?.into(),
        )?;
        td.set(
            keys::NEXT_TERMINATED,
            ArrayD::from_shape_vec(arr(&one), b.terminated).map_err(e)?.into(),
        )?;
        td.set(
            keys::NEXT_TRUNCATED,
            ArrayD::from_shape_vec(arr(&one), b.truncated).map_err(e)?.into(),
        )?;
        td.set(
            keys::TRAJ_IDS,
            ArrayD::from_shape_vec(arr(&[k, t]), b.traj_ids).map_err(e)?.into(),
        )?;
        td.set(
            keys::STEP_COUNT,
            ArrayD::from_shape_vec(arr(&one), b.step_count).map_err(e)?.into(),
        )?;
        let (lp, pa, pb) = record_sizes(self.recorded);
        let (key_lp, key_a, key_b) = match self.recorded {
            Recorded::Categorical { .. } => (keys::ACTION_LOG_PROB, keys::LOGITS, ""),
            Recorded::QValue { .. } => (keys::CHOSEN_ACTION_VALUE, keys::ACTION_VALUE, ""),
            _ => (keys::ACTION_LOG_PROB, keys::LOC, keys::SCALE),
        };
        if lp == 1 {
            // A log-probability per frame, or the greedy action's value as `[1]`.
            let shape: &[usize] = if key_lp == keys::CHOSEN_ACTION_VALUE { &one } else { &bs };
            td.set(
                key_lp,
                ArrayD::from_shape_vec(arr(shape), b.log_prob).map_err(e)?.into(),
            )?;
        }
        if pa > 0 {
            td.set(
                key_a,
                ArrayD::from_shape_vec(arr(&[k, t, pa]), b.param_a).map_err(e)?.into(),
            )?;
        }
        if pb > 0 {
            td.set(
                key_b,
                ArrayD::from_shape_vec(arr(&[k, t, pb]), b.param_b).map_err(e)?.into(),
            )?;
        }
        if let Some(r) = &self.recurrent {
            td.set(
                keys::IS_INIT,
                ArrayD::from_shape_vec(arr(&one), b.is_init).map_err(e)?.into(),
            )?;
            for ((s, before), after) in r.tensors.iter().zip(b.state).zip(b.next_state) {
                let shape: Vec<usize> = [k, t].iter().chain(&s.shape).copied().collect();
                td.set(&s.name, ArrayD::from_shape_vec(arr(&shape), before).map_err(e)?.into())?;
                td.set(
                    &s.next_key(),
                    ArrayD::from_shape_vec(arr(&shape), after).map_err(e)?.into(),
                )?;
            }
        }
        Ok(td)
    }
}

/// One buffer of `n` frames per state tensor of `recurrent` (recycled ones reused).
fn state_buffers(recycled: Vec<Vec<f32>>, recurrent: Option<&Recurrent>, n: usize) -> Vec<Vec<f32>> {
    let Some(r) = recurrent else {
        return Vec::new();
    };
    let mut recycled = recycled.into_iter();
    r.widths
        .iter()
        .map(|w| sized(recycled.next().unwrap_or_default(), n * w))
        .collect()
}

/// Values per frame of what a policy records: log-probabilities (0 or 1; a Q-value
/// actor's greedy value), logits, action values or loc, scale.
#[inline]
pub(super) fn record_sizes(recorded: Recorded) -> (usize, usize, usize) {
    match recorded {
        Recorded::None => (0, 0, 0),
        Recorded::LogProb => (1, 0, 0),
        Recorded::Categorical { n } | Recorded::QValue { n } => (1, n, 0),
        Recorded::Normal { d } => (1, d, d),
    }
}

fn into_f32(t: Tensor) -> Option<ArrayD<f32>> {
    match t {
        Tensor::F32(a) => Some(a),
        _ => None,
    }
}
fn into_i64(t: Tensor) -> Option<ArrayD<i64>> {
    match t {
        Tensor::I64(a) => Some(a),
        _ => None,
    }
}
fn into_bool(t: Tensor) -> Option<ArrayD<bool>> {
    match t {
        Tensor::Bool(a) => Some(a),
        _ => None,
    }
}
