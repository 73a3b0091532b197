//! Collecting one batch: the stop flag's contract, and the choice of the loop
//! compiled for the rollout's env and policy types.

use std::sync::atomic::AtomicBool;

use super::concrete::{EnvKind, Envs, Pol, PolicyKind};
use super::{Buffers, Rollout, RolloutError};
use crate::env::{CartPole, Env, MountainCarContinuous, Pendulum};
use crate::policy::{Linear, Mlp, Policy};
use crate::tensor::TensorDict;

/// How many steps the collection loop takes between two looks at its stop flag
/// ([`Rollout::collect_frames_until`]): a stop is seen within this many steps, and
/// one relaxed load per this many steps keeps the hot loop's speed.
pub const STOP_CHECK_STEPS: usize = 64;

impl Rollout {
    /// Collects one batch of exactly `frames_per_batch` frames, shape `[K, F/K]`.
    pub fn collect(&mut self) -> Result<TensorDict, RolloutError> {
        self.collect_frames(self.config.frames_per_batch)
    }

    /// Collects a batch of exactly `frames` frames (a multiple of the env count), shape `[K, frames/K]`.
    pub fn collect_frames(&mut self, frames: usize) -> Result<TensorDict, RolloutError> {
        self.collect_frames_until(frames, &AtomicBool::new(false))
    }

    /// [`Rollout::collect_frames`], looking at `stop` before the first step and then
    /// every [`STOP_CHECK_STEPS`] steps: once it is set, collection ends there with
    /// [`RolloutError::Stopped`] and the frames of the batch so far are dropped (the
    /// envs keep the steps they took, as after any batch). A node shutting down sets
    /// it from another thread, so that a large batch does not hold the shutdown back.
    pub fn collect_frames_until(&mut self, frames: usize, stop: &AtomicBool) -> Result<TensorDict, RolloutError> {
        let k_envs = self.envs.len();
        if frames == 0 || !frames.is_multiple_of(k_envs) {
            return Err(RolloutError::Config {
                field: "frames",
                reason: format!("{frames} frames cannot be split evenly over {k_envs} envs"),
            });
        }
        self.steps = frames / k_envs;
        self.batch_max_traj_id = None;
        if self.config.reset_at_each_iter {
            self.needs_reset.iter_mut().for_each(|r| *r = true);
        }
        let mut b = self.buffers();
        // Compiled for each built-in env (its observation size is a constant) and
        // policy, and for one env (the env loop disappears); envs of your own are
        // specialised for common observation sizes only (0 = any size).
        let filled = match (&self.envs, &self.policy, k_envs == 1) {
            (Envs::CartPole(_), Pol::Linear(_), one) => self.fill_k::<4, CartPole, Linear>(&mut b, one, stop),
            (Envs::CartPole(_), Pol::Mlp(_), one) => self.fill_k::<4, CartPole, Mlp>(&mut b, one, stop),
            (Envs::CartPole(_), Pol::Dyn(_), one) => self.fill_k::<4, CartPole, dyn Policy>(&mut b, one, stop),
            (Envs::Pendulum(_), Pol::Linear(_), one) => self.fill_k::<3, Pendulum, Linear>(&mut b, one, stop),
            (Envs::Pendulum(_), Pol::Mlp(_), one) => self.fill_k::<3, Pendulum, Mlp>(&mut b, one, stop),
            (Envs::Pendulum(_), Pol::Dyn(_), one) => self.fill_k::<3, Pendulum, dyn Policy>(&mut b, one, stop),
            (Envs::MountainCar(_), Pol::Linear(_), one) => {
                self.fill_k::<2, MountainCarContinuous, Linear>(&mut b, one, stop)
            }
            (Envs::MountainCar(_), Pol::Mlp(_), one) => self.fill_k::<2, MountainCarContinuous, Mlp>(&mut b, one, stop),
            (Envs::MountainCar(_), Pol::Dyn(_), one) => {
                self.fill_k::<2, MountainCarContinuous, dyn Policy>(&mut b, one, stop)
            }
            (Envs::Dyn(_), _, one) => match self.obs_dim {
                1 => self.fill_k::<1, Box<dyn Env>, dyn Policy>(&mut b, one, stop),
                2 => self.fill_k::<2, Box<dyn Env>, dyn Policy>(&mut b, one, stop),
                3 => self.fill_k::<3, Box<dyn Env>, dyn Policy>(&mut b, one, stop),
                4 => self.fill_k::<4, Box<dyn Env>, dyn Policy>(&mut b, one, stop),
                _ => self.fill_k::<0, Box<dyn Env>, dyn Policy>(&mut b, one, stop),
            },
        };
        match filled {
            Ok(()) => self.to_tensordict(b),
            Err(e) => {
                self.spare = Some(b);
                Err(e)
            }
        }
    }

    /// [`Rollout::fill`] for one env (`one`) or any number.
    #[inline(always)]
    fn fill_k<const D: usize, E: EnvKind, P: PolicyKind + ?Sized>(
        &mut self,
        b: &mut Buffers,
        one: bool,
        stop: &AtomicBool,
    ) -> Result<(), RolloutError> {
        if one {
            self.fill::<D, 1, E, P>(b, stop)
        } else {
            self.fill::<D, 0, E, P>(b, stop)
        }
    }
}
