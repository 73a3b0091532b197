//! Why the machine refused a request or a node's message.

use crate::tensor::TensorError;

/// A node message the trainer did not accept; the message is dropped, the run goes on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TrainerError {
    /// A node index outside `0..nodes`.
    #[error("message from unknown node {0}")]
    UnknownNode(usize),
    /// A `Batch` answering no outstanding `Continue` (late, duplicated or invented).
    #[error("node {node} sent a batch for seq {seq}, which is not outstanding ({expected})")]
    UnexpectedBatch {
        /// The node.
        node: usize,
        /// The seq it sent.
        seq: u64,
        /// What the trainer waits for from it.
        expected: String,
    },
    /// A `Batch` whose content does not match what was asked.
    #[error("node {node} sent a bad batch: {reason}")]
    BadBatch {
        /// The node.
        node: usize,
        /// What is wrong.
        reason: String,
    },
    /// A layout a node advertised that this run cannot use (sync mode: it differs from
    /// another node's).
    #[error("node {node} advertised a layout the trainer cannot use: {reason}")]
    BadLayout {
        /// The node.
        node: usize,
        /// What is wrong.
        reason: String,
    },
    /// A node was lost; the run goes on without it (async mode, other nodes left).
    #[error("node {node} lost, going on without it: {reason}")]
    NodeLost {
        /// The node.
        node: usize,
        /// Why.
        reason: String,
    },
    /// A checkpoint cannot be taken or restored now.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// The node reported a failure.
    #[error("node {node} failed: {reason}")]
    NodeFailed {
        /// The node.
        node: usize,
        /// Its reason.
        reason: String,
    },
    /// An elastic run refused a node that joined (its connection is closed).
    #[error("node {node} cannot join: {reason}")]
    JoinRefused {
        /// The slot it was admitted to.
        node: usize,
        /// Why.
        reason: String,
    },
    /// The run's policy cannot act in the env whose specs a node reported (or its
    /// weights do not fit a frame): the run fails, naming the key and why.
    #[error("{0}")]
    Policy(String),
    /// An elastic run had no node left for longer than it waits for one: it fails.
    #[error("{0}")]
    NoNodes(String),
    /// Stacking shares failed.
    #[error("cannot assemble the batch: {0}")]
    Tensor(#[from] TensorError),
}
