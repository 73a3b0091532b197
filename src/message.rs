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

/// Every message's name on the wire (its `type`), written here only: [`ToNode::name`],
/// [`FromNode::name`], the frame decoder and the login decoder use these, and serde's
/// derive writes the same names (`snake_case` of the variants; a test checks each).
pub mod names {
    /// [`super::ToNode::Continue`].
    pub const CONTINUE: &str = "continue";
    /// [`super::ToNode::UpdateWeights`].
    pub const UPDATE_WEIGHTS: &str = "update_weights";
    /// [`super::ToNode::Seed`].
    pub const SEED: &str = "seed";
    /// [`super::ToNode::Shutdown`].
    pub const SHUTDOWN: &str = "shutdown";
    /// [`super::ToNode::Snapshot`] and [`super::FromNode::Snapshot`].
    pub const SNAPSHOT: &str = "snapshot";
    /// [`super::ToNode::Restore`].
    pub const RESTORE: &str = "restore";
    /// [`super::FromNode::Batch`].
    pub const BATCH: &str = "batch";
    /// [`super::FromNode::WeightsUpdated`].
    pub const WEIGHTS_UPDATED: &str = "weights_updated";
    /// [`super::FromNode::Seeded`].
    pub const SEEDED: &str = "seeded";
    /// [`super::FromNode::Down`].
    pub const DOWN: &str = "down";
    /// [`super::FromNode::Leave`].
    pub const LEAVE: &str = "leave";
    /// [`super::FromNode::Failed`].
    pub const FAILED: &str = "failed";
    /// [`super::FromNode::Ready`].
    pub const READY: &str = "ready";
    /// [`super::FromNode::Restored`].
    pub const RESTORED: &str = "restored";
    /// [`super::FromNode::CheckpointFailed`].
    pub const CHECKPOINT_FAILED: &str = "checkpoint_failed";
    /// The key that names a frame.
    pub const TYPE: &str = "type";
    /// The wire's own `hello` (node → trainer).
    pub const HELLO: &str = "hello";
    /// The wire's own `auth` (node → trainer).
    pub const AUTH: &str = "auth";
    /// The wire's own `heartbeat` (both ways).
    pub const HEARTBEAT: &str = "heartbeat";
    /// The wire's own `challenge` (trainer → node).
    pub const CHALLENGE: &str = "challenge";
    /// The wire's own `welcome` (trainer → node).
    pub const WELCOME: &str = "welcome";
    /// The wire's own `reject` (trainer → node).
    pub const REJECT: &str = "reject";
    /// Every message a node sends.
    pub const FROM_NODE: &[&str] = &[
        BATCH,
        WEIGHTS_UPDATED,
        SEEDED,
        DOWN,
        LEAVE,
        FAILED,
        READY,
        SNAPSHOT,
        RESTORED,
        CHECKPOINT_FAILED,
    ];
}

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
        /// Its env's observation and action spaces (protocol version 4; `None` from a
        /// version-3 node, which can only serve envs the trainer builds itself). Boxed:
        /// the largest of the node's messages otherwise, and every message is moved.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        specs: Option<Box<crate::space::EnvSpecs>>,
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
            ToNode::Continue(_) => names::CONTINUE,
            ToNode::UpdateWeights(_) => names::UPDATE_WEIGHTS,
            ToNode::Seed(_) => names::SEED,
            ToNode::Shutdown => names::SHUTDOWN,
            ToNode::Snapshot { .. } => names::SNAPSHOT,
            ToNode::Restore(_) => names::RESTORE,
        }
    }
}

impl FromNode {
    /// The message's name on the wire (its `type`), for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            FromNode::Batch(_) => names::BATCH,
            FromNode::WeightsUpdated { .. } => names::WEIGHTS_UPDATED,
            FromNode::Seeded { .. } => names::SEEDED,
            FromNode::Down { .. } => names::DOWN,
            FromNode::Leave { .. } => names::LEAVE,
            FromNode::Failed { .. } => names::FAILED,
            FromNode::Ready { .. } => names::READY,
            FromNode::Snapshot { .. } => names::SNAPSHOT,
            FromNode::Restored { .. } => names::RESTORED,
            FromNode::CheckpointFailed { .. } => names::CHECKPOINT_FAILED,
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
