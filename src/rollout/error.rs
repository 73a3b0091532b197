//! What goes wrong while building or running a rollout.

use crate::env::EnvError;
use crate::policy::PolicyError;
use crate::tensor::TensorError;

/// What went wrong while building or running a rollout.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RolloutError {
    /// A config value is unusable; names the field.
    #[error("invalid `{field}`: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// An env failed.
    #[error("env {env} failed: {source}")]
    Env {
        /// Index of the env in this rollout.
        env: usize,
        /// The env's error.
        source: EnvError,
    },
    /// The policy failed.
    #[error("policy failed: {0}")]
    Policy(#[from] PolicyError),
    /// An observation held a NaN and the rollout treats that as a failure.
    #[error("env {env} produced a NaN observation")]
    NanObservation {
        /// Index of the env.
        env: usize,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// A [`RolloutState`](crate::rollout::RolloutState) does not fit this rollout
    /// (another config, or corrupt).
    #[error("cannot restore the rollout: {0}")]
    Checkpoint(String),
    /// The stop flag given to
    /// [`Rollout::collect_frames_until`](crate::rollout::Rollout::collect_frames_until)
    /// was set: collection ended between two steps and the frames of the batch so far
    /// were dropped (not a failure: the node is shutting down).
    #[error("collection stopped between steps: the batch so far was dropped")]
    Stopped,
}
