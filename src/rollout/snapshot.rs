//! Snapshots of a rollout between two batches, and restoring one from them.

use serde::{Deserialize, Serialize};

use super::{RecurrentState, Rollout, RolloutError, TrajIds};
use crate::env::EnvSnapshot;
use crate::policy::{Policy, SamplerState};

/// Everything a [`Rollout`] needs to go on exactly where another one stopped: each
/// env's state and random generator, the policy's sampling generator, the episodes in
/// progress, a recurrent policy's state and the trajectory-id allocators. The weights
/// travel separately.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutState {
    /// Frames collected so far.
    pub frames: u64,
    /// One entry per env, in order.
    pub(super) envs: Vec<EnvState>,
    /// The policy's sampler (`None` for a policy without one).
    pub(super) policy: Option<SamplerState>,
    /// The sampler of the `init_random_frames` policy, when the config has one.
    pub(super) random: Option<SamplerState>,
    /// A recurrent policy's state (absent for a policy without state, as in the
    /// checkpoints written before recurrent policies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) recurrent: Option<RecurrentState>,
}

impl RolloutState {
    /// The envs of the rollout this state is of.
    pub fn num_envs(&self) -> usize {
        self.envs.len()
    }
}

/// One env's part of a [`RolloutState`]: the env itself and the episode the rollout
/// is stepping in it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct EnvState {
    /// The env's name, to refuse a checkpoint of another env.
    pub(super) name: String,
    pub(super) env: EnvSnapshot,
    /// The observation the next action is taken in.
    pub(super) obs: Vec<f32>,
    pub(super) traj_id: i64,
    pub(super) step_count: i64,
    pub(super) needs_reset: bool,
    pub(super) pending_seed: Option<u64>,
    pub(super) ids: TrajIds,
}

impl Rollout {
    /// The rollout's state between two batches, for a checkpoint. Fails (naming it) when
    /// an env or the policy does not implement the checkpoint hooks.
    pub fn snapshot(&self) -> Result<RolloutState, RolloutError> {
        let d = self.obs_dim;
        let envs = (0..self.envs.len())
            .map(|k| (k, self.envs.get(k)))
            .map(|(k, e)| {
                Ok(EnvState {
                    name: e.name().to_string(),
                    env: e.snapshot().map_err(|source| RolloutError::Env { env: k, source })?,
                    obs: self.cur_obs[k * d..(k + 1) * d].to_vec(),
                    traj_id: self.traj_id[k],
                    step_count: self.step_count[k],
                    needs_reset: self.needs_reset[k],
                    pending_seed: self.pending_seed[k],
                    ids: self.ids[k],
                })
            })
            .collect::<Result<_, RolloutError>>()?;
        let random = match &self.random {
            Some(r) => r.sampler_state()?,
            None => None,
        };
        Ok(RolloutState {
            frames: self.frames,
            envs,
            policy: self.policy.get().sampler_state()?,
            random,
            recurrent: self.recurrent.as_ref().map(|r| r.snapshot()),
        })
    }

    /// Continues from `state` (taken from a rollout built from the same config, envs and
    /// policy): with the same weights loaded, the next batches are bit for bit the ones the
    /// snapshotted rollout would have collected. A state that does not fit is an error
    /// and leaves this rollout as it was.
    pub fn restore(&mut self, state: &RolloutState) -> Result<(), RolloutError> {
        self.check(state)?;
        let backup = self.snapshot()?;
        if let Err(e) = self.apply(state) {
            // The backup came from this very rollout: putting it back cannot fail.
            let _ = self.apply(&backup);
            return Err(e);
        }
        Ok(())
    }

    /// Checks what the rollout itself can check of an untrusted `state` (the envs and
    /// the policy check their own parts when restored).
    fn check(&self, state: &RolloutState) -> Result<(), RolloutError> {
        let bad = |why: String| Err(RolloutError::Checkpoint(why));
        let k = self.envs.len();
        if state.envs.len() != k {
            return bad(format!(
                "the checkpoint has {} envs, this rollout {k}",
                state.envs.len()
            ));
        }
        if state.frames > i64::MAX as u64 {
            return bad(format!("frame count {} is out of range", state.frames));
        }
        if state.random.is_some() != self.random.is_some() {
            return bad("the checkpoint and this rollout disagree on init_random_frames".into());
        }
        match (&self.recurrent, &state.recurrent) {
            (None, None) => {}
            (Some(mine), Some(theirs)) => {
                if let Some(why) = mine.misfit(theirs) {
                    return bad(why);
                }
            }
            (Some(_), None) => return bad("the checkpoint holds no recurrent state; this policy keeps one".into()),
            (None, Some(_)) => return bad("the checkpoint holds a recurrent state; this policy keeps none".into()),
        }
        for (i, s) in state.envs.iter().enumerate() {
            let env = self.envs.get(i);
            let ids = &self.ids[i];
            if s.name != env.name() {
                return bad(format!(
                    "env {i} is `{}` in the checkpoint, `{}` here",
                    s.name,
                    env.name()
                ));
            }
            if s.obs.len() != self.obs_dim {
                return bad(format!(
                    "env {i}'s observation has {} values, expected {}",
                    s.obs.len(),
                    self.obs_dim
                ));
            }
            if s.step_count < 0 || s.step_count == i64::MAX {
                return bad(format!("env {i}'s step count {} is out of range", s.step_count));
            }
            if s.ids.stride() != ids.stride() || s.ids.peek() % ids.stride() != ids.peek() % ids.stride() {
                return bad(format!(
                    "env {i}'s trajectory ids are lane {} of {} in the checkpoint, lane {} of {} here",
                    s.ids.peek() % s.ids.stride().max(1),
                    s.ids.stride(),
                    ids.peek() % ids.stride(),
                    ids.stride()
                ));
            }
            if s.ids.peek() > i64::MAX as u64 {
                return bad(format!("env {i}'s next trajectory id {} is out of range", s.ids.peek()));
            }
        }
        Ok(())
    }

    /// Puts a checked `state` in place; only the envs and the policies can still refuse it.
    fn apply(&mut self, state: &RolloutState) -> Result<(), RolloutError> {
        let d = self.obs_dim;
        for (k, s) in state.envs.iter().enumerate() {
            self.envs
                .get_mut(k)
                .restore(&s.env)
                .map_err(|source| RolloutError::Env { env: k, source })?;
        }
        self.policy.get_mut().set_sampler_state(state.policy.as_ref())?;
        if let Some(r) = &mut self.random {
            r.set_sampler_state(state.random.as_ref())?;
        }
        for (k, s) in state.envs.iter().enumerate() {
            self.cur_obs[k * d..(k + 1) * d].copy_from_slice(&s.obs);
            self.traj_id[k] = s.traj_id;
            self.step_count[k] = s.step_count;
            self.needs_reset[k] = s.needs_reset;
            self.pending_seed[k] = s.pending_seed;
            self.ids[k] = s.ids;
        }
        if let (Some(r), Some(s)) = (&mut self.recurrent, &state.recurrent) {
            r.restore(s);
        }
        self.frames = state.frames;
        Ok(())
    }
}
