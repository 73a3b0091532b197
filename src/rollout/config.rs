//! The settings of one rollout, and the rules they must follow.

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::Rollout;
use super::RolloutError;

/// Settings of one [`Rollout`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutConfig {
    /// Frames per collected batch over all envs; must be a multiple of the env count.
    pub frames_per_batch: usize,
    /// Cut trajectories longer than this (marked truncated); `None` for no limit.
    pub max_frames_per_traj: Option<u64>,
    /// Start every batch with fresh episodes.
    pub reset_at_each_iter: bool,
    /// Frames (counted over this rollout) stepped with the random policy before the real one.
    pub init_random_frames: u64,
    /// Base seed: env `k` is first reset with `seed + k`.
    pub seed: u64,
    /// Treat a NaN in an observation as a failure.
    pub nan_is_failure: bool,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            frames_per_batch: 1000,
            max_frames_per_traj: None,
            reset_at_each_iter: false,
            init_random_frames: 0,
            seed: 0,
            nan_is_failure: false,
        }
    }
}

impl RolloutConfig {
    /// Checks the settings for a rollout of `k_envs` envs (at least one), naming the
    /// field at fault.
    pub(super) fn check(&self, k_envs: usize) -> Result<(), RolloutError> {
        let f = self.frames_per_batch;
        if f == 0 {
            return Err(RolloutError::Config {
                field: "frames_per_batch",
                reason: "must be at least 1".into(),
            });
        }
        if !f.is_multiple_of(k_envs) {
            return Err(RolloutError::Config {
                field: "frames_per_batch",
                reason: format!("{f} frames do not divide evenly over {k_envs} envs"),
            });
        }
        if self.max_frames_per_traj == Some(0) {
            return Err(RolloutError::Config {
                field: "max_frames_per_traj",
                reason: "must be at least 1 (or unset)".into(),
            });
        }
        Ok(())
    }
}
