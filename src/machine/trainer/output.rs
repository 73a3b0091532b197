//! What the machine wants done, and the batches it yields.

#[cfg(doc)]
use super::TrainerMachine;
use crate::checkpoint::Checkpoint;
use crate::message::ToNode;
use crate::tensor::TensorDict;

/// A batch ready for the consumer.
#[derive(Clone, Debug, PartialEq)]
pub struct Collected {
    /// 0-based index of the batch in the run.
    pub index: u64,
    /// The node that collected it (async), or `None` for a sync batch stacked from all nodes.
    pub node: Option<usize>,
    /// The oldest weights version any of its frames were collected with.
    pub weights_version: u64,
    /// Weights version of each share (one entry per node in sync mode, one in async).
    pub weights_versions: Vec<u64>,
    /// The frames: `[nodes, envs, T]` in sync mode, `[envs, T]` in async mode.
    pub data: TensorDict,
}

/// What the machine wants done.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// Send `msg` to node `node`.
    Send {
        /// Node index.
        node: usize,
        /// The message.
        msg: ToNode,
    },
    /// Hand this batch to the consumer.
    Yield(Collected),
    /// `total_frames` have been yielded; no batch will come.
    Finished,
    /// The seeding chain is complete; `next_seed` is the first seed no node used.
    Seeded {
        /// The first unused seed.
        next_seed: u64,
    },
    /// Every node answered `Shutdown` with `Down`.
    AllDown,
    /// Node `node` failed and is to be restarted (restart number `restart` over its
    /// life): the launcher brings it back and calls [`TrainerMachine::node_restarted`],
    /// or [`TrainerMachine::node_restart_failed`] when it cannot.
    RestartNode {
        /// Node index.
        node: usize,
        /// The restart's number over the node's life, from 1.
        restart: u32,
        /// The failure.
        cause: String,
    },
    /// A share was copied into a yielded batch: its storage can go back to
    /// `node` for reuse (an in-process optimisation; remote nodes ignore it).
    Recycle {
        /// Node index.
        node: usize,
        /// The share.
        data: TensorDict,
    },
    /// The checkpoint asked for by [`TrainerMachine::begin_checkpoint`].
    Checkpoint(Box<Checkpoint>),
    /// The checkpoint asked for could not be taken; collection goes on.
    CheckpointFailed(String),
}

/// A batch to yield; its index is set when it is yielded.
pub(super) fn node_batch(node: Option<usize>, versions: Vec<u64>, data: TensorDict) -> Collected {
    Collected {
        index: 0,
        node,
        weights_version: versions.iter().copied().min().unwrap_or(0),
        weights_versions: versions,
        data,
    }
}
