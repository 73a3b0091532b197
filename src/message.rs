//! The vocabulary: every message the trainer, the nodes and the env workers exchange.
//!
//! The same types travel in-process (moved, never encoded) and over TCP (encoded
//! once with MessagePack). Weights are behind an `Arc` so one version is shared by
//! every node instead of copied to each.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::node_state::NodeState;
use crate::policy::Weights;
use crate::tensor::TensorDict;

/// Trainer → node: collect `frames` frames and answer with a [`Batch`] of the same `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Continue {
    /// Sequence number, unique per node and increasing; the answer carries it back.
    pub seq: u64,
    /// Frames to collect over all the node's envs.
    pub frames: usize,
}

/// Node → trainer: one node's share of frames.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// Index of the node that collected it.
    pub node: usize,
    /// The `seq` of the [`Continue`] it answers.
    pub seq: u64,
    /// Version of the weights the frames were collected with.
    pub weights_version: u64,
    /// The frames, batch shape `[envs, frames / envs]`.
    pub data: TensorDict,
}

/// Trainer → node: use these weights from the next step on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpdateWeights {
    /// The weights and their version, shared by all recipients.
    pub weights: Arc<Weights>,
}

/// Trainer → node: reseed every env of the node, env `i` with `seed + i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seed {
    /// The node's first seed.
    pub seed: u64,
}

/// Everything the trainer sends to a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToNode {
    /// Collect frames.
    Continue(Continue),
    /// New weights.
    UpdateWeights(UpdateWeights),
    /// Reseed.
    Seed(Seed),
    /// Stop everything and answer [`FromNode::Down`].
    Shutdown,
    /// Answer with [`FromNode::Snapshot`]: the node's whole state (for a checkpoint).
    /// Sent only while the node has no `Continue` in flight.
    Snapshot {
        /// The checkpoint's id (from 1), echoed in the answer so a late answer to an
        /// abandoned checkpoint is never taken for another's.
        id: u64,
    },
    /// Go on from this state (a resumed checkpoint) and answer [`FromNode::Restored`].
    /// Sent before any `Continue`.
    Restore(Box<NodeState>),
}

/// Everything a node sends to the trainer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromNode {
    /// An answer to a [`Continue`].
    Batch(Batch),
    /// The node now uses weights `version`.
    WeightsUpdated {
        /// The node.
        node: usize,
        /// The version now in use.
        version: u64,
    },
    /// The node reseeded its envs; `next_seed` is the first seed it did not use.
    Seeded {
        /// The node.
        node: usize,
        /// The first seed not used by this node.
        next_seed: u64,
    },
    /// The node stopped and released everything.
    Down {
        /// The node.
        node: usize,
    },
    /// The node leaves the run on purpose (a remote node stopped by SIGTERM or SIGINT),
    /// at any time after `ready`: its batches already sent are kept, the `Continue` it
    /// has in flight is asked of other nodes, and the trainer closes the connection. In
    /// an elastic run its slot is free for a node that joins; in a fixed run it counts
    /// as a lost node.
    Leave {
        /// The node.
        node: usize,
    },
    /// The node failed and cannot go on.
    Failed {
        /// The node.
        node: usize,
        /// What happened.
        reason: String,
    },
    /// The node built its workers and will serve: the layout of every batch it will
    /// send (a remote node's first message; local nodes' layouts are known at start).
    Ready {
        /// The node.
        node: usize,
        /// Per-frame entries of its batches.
        layout: crate::schema::BatchLayout,
    },
    /// Answer to [`ToNode::Snapshot`].
    Snapshot {
        /// The node.
        node: usize,
        /// The `id` of the `Snapshot` answered.
        id: u64,
        /// Its state.
        state: Box<NodeState>,
    },
    /// Answer to [`ToNode::Restore`]: the node goes on from the state it was sent.
    Restored {
        /// The node.
        node: usize,
    },
    /// A `Snapshot` or `Restore` the node could not do (e.g. a user env without
    /// checkpoint support, or a state that does not fit). The node goes on serving.
    CheckpointFailed {
        /// The node.
        node: usize,
        /// The `id` of the `Snapshot` refused, or 0 for a `Restore`.
        id: u64,
        /// Why.
        reason: String,
    },
}

impl ToNode {
    /// The message's name on the wire (its `type`), for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            ToNode::Continue(_) => "continue",
            ToNode::UpdateWeights(_) => "update_weights",
            ToNode::Seed(_) => "seed",
            ToNode::Shutdown => "shutdown",
            ToNode::Snapshot { .. } => "snapshot",
            ToNode::Restore(_) => "restore",
        }
    }
}

impl FromNode {
    /// The message's name on the wire (its `type`), for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            FromNode::Batch(_) => "batch",
            FromNode::WeightsUpdated { .. } => "weights_updated",
            FromNode::Seeded { .. } => "seeded",
            FromNode::Down { .. } => "down",
            FromNode::Leave { .. } => "leave",
            FromNode::Failed { .. } => "failed",
            FromNode::Ready { .. } => "ready",
            FromNode::Snapshot { .. } => "snapshot",
            FromNode::Restored { .. } => "restored",
            FromNode::CheckpointFailed { .. } => "checkpoint_failed",
        }
    }

    /// The node the message is from.
    pub fn node(&self) -> usize {
        match self {
            FromNode::Batch(b) => b.node,
            FromNode::WeightsUpdated { node, .. }
            | FromNode::Seeded { node, .. }
            | FromNode::Down { node }
            | FromNode::Leave { node }
            | FromNode::Failed { node, .. }
            | FromNode::Ready { node, .. }
            | FromNode::Snapshot { node, .. }
            | FromNode::Restored { node }
            | FromNode::CheckpointFailed { node, .. } => *node,
        }
    }
}
