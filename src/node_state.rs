//! A node's state between two batches: what its `Snapshot` reply carries, what a
//! `Restore` gives back, and what a checkpoint keeps for each node
//! ([`crate::checkpoint`]).
//!
//! Its own module, below both the messages and the checkpoint format, because
//! both carry it: a message must not need the checkpoint format to name it, nor
//! the checkpoint format the messages.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::policy::Weights;
use crate::rollout::RolloutState;

/// One env worker's part of a node's state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerState {
    /// Its rollout: envs, generators, episodes in progress.
    pub rollout: RolloutState,
    /// One past the highest trajectory id it delivered (restarts skip below it).
    pub next_traj_id: u64,
    /// Frames it delivered.
    pub frames: u64,
}

/// A node's state between two batches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeState {
    /// The node's index.
    pub node: usize,
    /// The base seed its restart seeds derive from (the last `Seed` it was sent).
    pub base_seed: u64,
    /// The weights it collects with (`None`: the policy's initial ones).
    pub weights: Option<Arc<Weights>>,
    /// One entry per env worker.
    pub workers: Vec<WorkerState>,
}

impl NodeState {
    /// The envs of all its workers: the rows of the node's batches.
    pub fn num_envs(&self) -> usize {
        self.workers.iter().map(|w| w.rollout.num_envs()).sum()
    }
}
