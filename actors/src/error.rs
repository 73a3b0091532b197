//! The errors users of the actor system see.

use rollout::machine::{ConfigError, TrainerError};
use rollout::rollout::RolloutError;
use rollout::EnvError;

/// Why a collector could not be built or could not go on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CollectError {
    /// The builder was given a value it cannot run with; names the field.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The env could not be built.
    #[error("cannot build the env: {0}")]
    Env(#[from] EnvError),
    /// A node's env workers could not be built.
    #[error("cannot build node {node}: {source}")]
    NodeBuild {
        /// The node.
        node: usize,
        /// Why.
        source: RolloutError,
    },
    /// A node failed.
    #[error("node {node} failed: {reason}")]
    NodeFailed {
        /// The node.
        node: usize,
        /// Its reason.
        reason: String,
    },
    /// The trainer refused something.
    #[error(transparent)]
    Trainer(#[from] TrainerError),
    /// Nothing came back within the deadline.
    #[error("{what} did not finish within {seconds:.1} s")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// The deadline.
        seconds: f64,
    },
    /// The actor system is gone (shut down, or its thread died).
    #[error("the collector's actor system is not running: {0}")]
    Stopped(String),
    /// Remote nodes did not join (in time, or at all).
    #[error("nodes did not join: {0}")]
    Join(String),
    /// A launcher could not start or end its nodes (e.g. `sbatch` or `scancel` failed).
    #[error("launcher: {0}")]
    Launch(String),
    /// Post-processing of a yielded batch failed.
    #[error("post-processing failed: {0}")]
    Postproc(String),
    /// The replay buffer refused a batch.
    #[error("replay buffer: {0}")]
    Replay(#[from] rollout::replay::ReplayError),
    /// A checkpoint could not be taken, read, written or resumed.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
}

impl From<rollout::checkpoint::CheckpointError> for CollectError {
    fn from(e: rollout::checkpoint::CheckpointError) -> Self {
        CollectError::Checkpoint(e.to_string())
    }
}
