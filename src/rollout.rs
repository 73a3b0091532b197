//! The collection loop: K envs stepped by one policy into a preallocated batch.
//!
//! [`Rollout::collect`] fills exactly `frames_per_batch` frames, laid out
//! `[K, F/K]` (env first, time last, as torchrl). Trajectories carry on across
//! batches; the ids they get come from a [`TrajIds`] allocator whose lanes keep
//! them unique across envs, nodes and batches. Buffers handed back with
//! [`Rollout::recycle`] are reused, so steady-state collection allocates nothing.
//!
//! This file holds the rollout itself (its parts, building it, its accessors); each
//! file under `rollout/` one concept of it: `config` its settings,
//! `error` what goes wrong, `traj_ids` the id lanes, `snapshot` checkpoints,
//! `buffers` the batch's storage, `collect` the choice of compiled loop, `fill` and
//! `fill_argmax2` the loops themselves, `concrete` the built-ins by their type.

use std::sync::Arc;

use crate::env::Env;
use crate::policy::{Policy, RandomPolicy, Recorded, Weights};
use crate::spec::Spec;

// The batch schema lives in `crate::schema`; these names stay reachable here for
// the crates that use `rollout::rollout::{keys, BatchLayout, ..}`.
pub use crate::schema::{batch_layout, keys, layout_difference, BatchLayout};

pub use collect::STOP_CHECK_STEPS;
pub use config::RolloutConfig;
pub use error::RolloutError;
pub use recurrent::RecurrentState;
pub use snapshot::RolloutState;
pub use traj_ids::TrajIds;

use buffers::{record_sizes, Buffers};
use concrete::{Envs, Pol};
use recurrent::Recurrent;

mod buffers;
mod collect;
mod concrete;
mod config;
mod error;
mod fill;
mod fill_argmax2;
mod recurrent;
mod snapshot;
mod traj_ids;

// What the test modules use through `super::*`.
#[cfg(test)]
use crate::{
    env::{Action, EnvError, EnvSnapshot},
    policy::{ActionsMut, PolicyError, RecordMut, SamplerState},
    tensor::{Tensor, TensorDict},
};

#[cfg(test)]
mod checkpoint_tests;
#[cfg(test)]
mod collect_tests;
#[cfg(test)]
mod concrete_tests;
#[cfg(test)]
mod qvalue_tests;
#[cfg(test)]
mod recurrent_tests;
#[cfg(test)]
mod stop_tests;
#[cfg(test)]
mod unrecorded_tests;

/// Steps K envs with one policy and fills batches of exactly `frames_per_batch` frames.
///
/// Built-in envs and policies are stepped by their concrete type (see
/// [`concrete`](self::concrete)); envs and policies of your own through their traits.
pub struct Rollout {
    envs: Envs,
    policy: Pol,
    random: Option<RandomPolicy>,
    config: RolloutConfig,
    discrete: bool,
    obs_dim: usize,
    act_dim: usize,
    steps: usize,
    cur_obs: Vec<f32>,
    traj_id: Vec<i64>,
    step_count: Vec<i64>,
    needs_reset: Vec<bool>,
    pending_seed: Vec<Option<u64>>,
    act_i: Vec<i64>,
    act_f: Vec<f32>,
    /// What the policy records beside its actions, and the policy call's buffers for it
    /// (one row per env): log-probabilities, then logits or loc, then scale.
    recorded: Recorded,
    rec_lp: Vec<f32>,
    rec_a: Vec<f32>,
    rec_b: Vec<f32>,
    ids: Vec<TrajIds>,
    /// A recurrent policy's state, one row per env (`None`: a policy without state).
    recurrent: Option<Recurrent>,
    frames: u64,
    /// The largest trajectory id of the last batch, when the loop kept it as it wrote them.
    batch_max_traj_id: Option<i64>,
    spare: Option<Buffers>,
}

impl Rollout {
    /// A rollout over `envs` with `policy`. `ids[k]` hands out env `k`'s trajectory ids.
    pub fn new(
        envs: Vec<Box<dyn Env>>,
        policy: Box<dyn Policy>,
        ids: Vec<TrajIds>,
        config: RolloutConfig,
    ) -> Result<Rollout, RolloutError> {
        let k = envs.len();
        if k == 0 {
            return Err(RolloutError::Config {
                field: "envs",
                reason: "at least one env is needed".into(),
            });
        }
        if ids.len() != k {
            return Err(RolloutError::Config {
                field: "traj_lanes",
                reason: format!("{} id allocators for {k} envs", ids.len()),
            });
        }
        config.check(k)?;
        let obs_spec = envs[0].observation_spec().clone();
        let act_spec = envs[0].action_spec().clone();
        for (i, e) in envs.iter().enumerate() {
            if *e.observation_spec() != obs_spec || *e.action_spec() != act_spec {
                return Err(RolloutError::Config {
                    field: "envs",
                    reason: format!("env {i} ({}) has other specs than env 0 ({})", e.name(), envs[0].name()),
                });
            }
        }
        let obs_dim = match &obs_spec {
            Spec::Box { low, .. } => low.len(),
            Spec::Discrete { .. } => {
                return Err(RolloutError::Config {
                    field: "envs",
                    reason: "observations must be a box of f32".into(),
                })
            }
        };
        let discrete = act_spec.is_discrete();
        let act_dim = act_spec.dim();
        let random = if config.init_random_frames > 0 {
            Some(RandomPolicy::new(act_spec.clone(), config.seed ^ 0x5eed_5eed_5eed_5eed))
        } else {
            None
        };
        let pending_seed = (0..k).map(|i| Some(config.seed.wrapping_add(i as u64))).collect();
        let recorded = policy.recorded();
        let (lp, a, b) = record_sizes(recorded);
        crate::policy::check_state(policy.state())?;
        let recurrent = Recurrent::new(policy.state(), k);
        Ok(Rollout {
            recorded,
            recurrent,
            rec_lp: vec![0.0; k * lp],
            rec_a: vec![0.0; k * a],
            rec_b: vec![0.0; k * b],
            steps: config.frames_per_batch / k,
            cur_obs: vec![0.0; k * obs_dim],
            traj_id: vec![-1; k],
            step_count: vec![0; k],
            needs_reset: vec![true; k],
            pending_seed,
            act_i: vec![0; k],
            act_f: vec![0.0; k * act_dim],
            envs: Envs::new(envs),
            policy: Pol::new(policy),
            random,
            config,
            discrete,
            obs_dim,
            act_dim,
            ids,
            frames: 0,
            batch_max_traj_id: None,
            spare: None,
        })
    }

    /// The layout of every batch this rollout produces: its envs' specs' keys, what
    /// its policy records ([`Policy::recorded`]) and a recurrent policy's state keys
    /// ([`Policy::state`]).
    pub fn batch_layout(&self) -> BatchLayout {
        let mut layout = batch_layout(self.envs.get(0).observation_spec(), self.envs.get(0).action_spec());
        self.recorded.extend_layout(&mut layout);
        crate::policy::extend_state_layout(self.policy.get().state(), &mut layout);
        layout
    }

    /// What the policy records beside its actions, in every batch.
    pub fn recorded(&self) -> Recorded {
        self.recorded
    }

    /// This rollout recording what its policy records (`on`, as built), or nothing: its
    /// batches then leave the recorded keys out and the policy is asked for none
    /// (PROTOCOL.md §3, `policy.record`).
    pub fn recording(mut self, on: bool) -> Rollout {
        if !on {
            self.recorded = Recorded::None;
            self.rec_lp = Vec::new();
            self.rec_a = Vec::new();
            self.rec_b = Vec::new();
        }
        self
    }

    /// Its envs' observation and action spaces: what its node reports in `ready`.
    pub fn env_specs(&self) -> crate::space::EnvSpecs {
        crate::space::EnvSpecs::from_specs(self.envs.get(0).observation_spec(), self.envs.get(0).action_spec())
    }

    /// Number of envs.
    pub fn num_envs(&self) -> usize {
        self.envs.len()
    }

    /// The batch shape of every collected batch, `[K, F/K]`.
    pub fn batch_size(&self) -> [usize; 2] {
        [self.envs.len(), self.steps]
    }

    /// Frames collected so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// The config.
    pub fn config(&self) -> &RolloutConfig {
        &self.config
    }

    /// The policy's current weights.
    pub fn weights(&self) -> &Weights {
        self.policy.get().weights()
    }

    /// Loads new weights into the policy.
    pub fn set_weights(&mut self, weights: &Weights) -> Result<(), RolloutError> {
        Ok(self.policy.get_mut().set_weights(weights)?)
    }

    /// Loads weights shared with others (see [`Policy::set_shared_weights`]): what a
    /// node's workers do with the one decoded update they all receive.
    pub fn set_shared_weights(&mut self, weights: &Arc<Weights>) -> Result<(), RolloutError> {
        Ok(self.policy.get_mut().set_shared_weights(weights)?)
    }

    /// The trajectory id allocators, one per env.
    pub fn traj_ids(&self) -> &[TrajIds] {
        &self.ids
    }

    /// Moves every env's trajectory-id allocator past `min`: no id below it is handed
    /// out again (a restarted worker must not repeat ids its predecessor delivered).
    /// The trajectory in progress keeps its id; the next one gets a fresh id.
    pub fn skip_traj_ids_below(&mut self, min: u64) {
        for ids in &mut self.ids {
            ids.skip_below(min);
        }
    }

    /// Sets the count of frames collected so far, so a rollout rebuilt after a
    /// failure resumes its predecessor's count (`init_random_frames` is not redone).
    pub fn resume_frames(&mut self, frames: u64) {
        self.frames = frames;
    }

    /// Reseeds: env `k` starts a new episode seeded `seed + k` at its next step,
    /// the policy's sampling is reseeded too. Returns the next unused seed.
    pub fn set_seed(&mut self, seed: u64) -> u64 {
        let k = self.envs.len() as u64;
        for (i, s) in self.pending_seed.iter_mut().enumerate() {
            *s = Some(seed.wrapping_add(i as u64));
        }
        self.needs_reset.iter_mut().for_each(|r| *r = true);
        self.policy
            .get_mut()
            .reseed(seed.wrapping_add(k).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        if let Some(r) = &mut self.random {
            r.reseed(seed ^ 0x5eed_5eed_5eed_5eed);
        }
        seed.wrapping_add(k)
    }

    /// The largest trajectory id in the batch [`Rollout::collect_frames`] returned last,
    /// when the loop kept it while writing them (the one-env argmax loop does); `None`:
    /// not kept, read it from the batch ([`crate::schema::max_traj_id`]).
    pub fn batch_max_traj_id(&self) -> Option<i64> {
        self.batch_max_traj_id
    }
}
