//! The trainer's decisions, with no IO: who gets `Continue`, how shares assemble
//! into a batch, when weights go out, when the run is over.
//!
//! Feed it the consumer's requests and the nodes' messages; it appends what to
//! send and what to yield to an output list, and judges its own errors
//! ([`Verdict`]). The Trainer actor is a thin shell around it, and the testkit
//! pumps it in memory.
//!
//! One concept per file: `config` (what a run collects), `rounds` (sync rounds,
//! async yields, early release), `weights` (when weights go out), `seeding` (the
//! seed chain), `supervise` (timeouts, failures, restarts), `checkpoint` (taking
//! and restoring one), `deadlines` (how long a node may take to answer each
//! request), `layout` (what batches must hold), `specs` (the env specs nodes report, and
//! version 0 built from them), `versions` (the protocol versions that can serve the
//! run), `verdict` (what an error means for the run: which end it, lose a node,
//! close a connection or only drop a message), `membership` (elastic runs: nodes
//! that join and leave), and `node_state` (where each node is, as one enum).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::message::{Batch, FromNode, ToNode};
use crate::policy::Weights;
use crate::pool::TensorPool;
use crate::supervisor::Restarts;

mod checkpoint;
mod config;
mod deadlines;
mod error;
#[cfg(test)]
mod lag_tests;
mod layout;
mod membership;
mod node_state;
mod open_slots;
mod output;
mod rounds;
mod seeding;
mod specs;
mod supervise;
#[cfg(test)]
mod test_support;
mod verdict;
mod versions;
mod weights;

use checkpoint::Checkpoints;
pub use config::{ConfigError, TrainerConfig, MAX_PREFETCH};
pub use deadlines::RequestDeadlines;
pub use error::TrainerError;
use layout::Layouts;
pub use layout::{check_layout, LayoutSource};
pub use membership::Membership;
use node_state::{Node, NodeState};
pub use output::{Collected, Output};
use seeding::SeedChain;
pub use specs::{initial_weights_for, spec_params_for};
pub use supervise::{CutOff, NodeSupervision, SupervisionStats};
pub use verdict::Verdict;

/// The request a node's message answers, if it answers one (a `batch` answers its
/// `continue`, timed by the node's state instead).
fn answers(msg: &FromNode) -> Option<deadlines::Request> {
    use deadlines::Request;
    match msg {
        FromNode::Seeded { .. } => Some(Request::Seed),
        FromNode::WeightsUpdated { version, .. } => Some(Request::UpdateWeights(*version)),
        FromNode::Snapshot { id, .. } => Some(Request::Snapshot(*id)),
        FromNode::CheckpointFailed { id: 0, .. } | FromNode::Restored { .. } => Some(Request::Restore),
        FromNode::CheckpointFailed { id, .. } => Some(Request::Snapshot(*id)),
        _ => None,
    }
}

/// The trainer's state machine.
#[derive(Debug)]
pub struct TrainerMachine {
    /// What the run collects and how.
    cfg: TrainerConfig,
    /// Where each node is, and its books.
    nodes: Vec<Node>,
    /// The seq of the next `Continue` (one counter for all nodes).
    next_seq: u64,
    /// The stored weights, pushed by [`TrainerMachine::push_weights`] and the update options.
    weights: Option<Arc<Weights>>,
    /// The stored weights' version (0 before any).
    version: u64,
    /// Version 0 of each node's weights, built by the trainer from the policy spec
    /// and handed to every node before its first `Continue` (nodes never invent
    /// weights); nodes of one layout share one copy.
    initial: Vec<Option<Arc<Weights>>>,
    /// Frames yielded to the consumer.
    frames_yielded: u64,
    /// Batches yielded to the consumer.
    batches_yielded: u64,
    /// `total_frames` yielded, or shutting down: no batch will come.
    finished: bool,
    /// Sync: the shares of the round in flight.
    round: Option<rounds::Round>,
    /// Sync: storage of stacked rounds the consumer handed back
    /// ([`TrainerMachine::recycle_round`]), which the next rounds are stacked into.
    stacked: TensorPool,
    /// Async: batches received and not yet yielded.
    ready: VecDeque<Batch>,
    /// Async: Continue already sent to every node.
    started: bool,
    /// The consumer asked for a batch and has not got it yet.
    wanted: bool,
    /// The seeding chain: where it is, what is queued, the last chain's seed.
    chain: SeedChain,
    /// A request arrived during the seeding chain or a checkpoint; it is served once
    /// that ends, so no node ever collects with a half-applied seed or mid-checkpoint.
    deferred: bool,
    /// `Shutdown` was sent: failures count as down, nothing new starts.
    shutting_down: bool,
    /// What each node's batches must hold: the trainer's own layout of its env, or
    /// for an env it cannot build the first one a node of that env announced.
    layouts: Layouts,
    /// Node supervision, when on.
    supervision: Option<NodeSupervision>,
    /// Restart bookkeeping per node (used when supervision is on).
    restarts: Vec<Restarts>,
    /// Per node, when nodes join on their own: its slot, open since its node failed
    /// and until a node in it delivers (`open_slots.rs`).
    open_slots: Vec<Option<open_slots::OpenSlot>>,
    /// The machine's clock: the latest [`TrainerMachine::tick`].
    now: Duration,
    /// Checkpoints being taken or restored, and what waits for them.
    checkpoints: Checkpoints,
    /// Late batches refused.
    dropped_late: u64,
    /// Batches (and their frames) dropped past `max_policy_lag`.
    lagging_dropped: (u64, u64),
    /// Frames in accepted batches.
    frames_collected: u64,
    /// Batches the consumer handed back.
    recycled: u64,
    /// How long a node may take to answer each request.
    deadlines: RequestDeadlines,
    /// Nodes given up at shutdown, not yet reported (see [`TrainerMachine::take_abandoned`]).
    abandoned: Vec<(usize, String)>,
    /// Elastic membership, when on: nodes join and leave while the run goes on.
    elastic: Option<membership::Elastic>,
    /// The specs of envs only the nodes know, and the version 0 built from them.
    specs: specs::NodeSpecs,
    /// No deadline can pass before this (machine clock): ticks before it check nothing.
    quiet_until: Duration,
    /// Weights holding NaN or infinity may be stored (off: refused naming the tensor).
    allow_nonfinite_weights: bool,
}

impl TrainerMachine {
    /// A machine for a validated config.
    pub fn new(cfg: TrainerConfig) -> Result<TrainerMachine, ConfigError> {
        cfg.validate()?;
        let cfg_nodes = cfg.nodes();
        Ok(TrainerMachine {
            nodes: vec![Node::default(); cfg.nodes()],
            cfg,
            next_seq: 0,
            weights: None,
            version: 0,
            initial: vec![None; cfg_nodes],
            frames_yielded: 0,
            batches_yielded: 0,
            finished: false,
            round: None,
            stacked: TensorPool::new(usize::MAX),
            ready: VecDeque::new(),
            started: false,
            wanted: false,
            chain: SeedChain::default(),
            deferred: false,
            shutting_down: false,
            layouts: Layouts::new(cfg_nodes),
            supervision: None,
            restarts: Vec::new(),
            open_slots: Vec::new(),
            now: Duration::ZERO,
            dropped_late: 0,
            lagging_dropped: (0, 0),
            frames_collected: 0,
            recycled: 0,
            checkpoints: Checkpoints::default(),
            deadlines: RequestDeadlines::default(),
            abandoned: Vec::new(),
            elastic: None,
            specs: specs::NodeSpecs::new(cfg_nodes),
            quiet_until: Duration::ZERO,
            allow_nonfinite_weights: false,
        })
    }

    /// The config.
    pub fn config(&self) -> &TrainerConfig {
        &self.cfg
    }

    /// Frames yielded so far.
    pub fn frames_yielded(&self) -> u64 {
        self.frames_yielded
    }

    /// Batches yielded so far.
    pub fn batches_yielded(&self) -> u64 {
        self.batches_yielded
    }

    /// True once `total_frames` have been yielded.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The `Continue` each node has in flight, as `(seq, frames)`: the newest, when a
    /// node was released while its previous batch is still on its way.
    pub fn outstanding(&self, node: usize) -> Option<(u64, usize)> {
        self.nodes.get(node).and_then(|n| n.state.outstanding())
    }

    /// A message from a node. An error means the message was refused and dropped;
    /// the machine's state is as before (except that a refused batch, being whole,
    /// is no longer on its way).
    pub fn on_node(&mut self, msg: FromNode, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        let node = msg.node();
        if node >= self.nodes.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        if let Some(answered) = answers(&msg) {
            self.request_answered(node, answered);
        }
        match msg {
            FromNode::Batch(b) => self.on_batch(b, out),
            FromNode::WeightsUpdated { .. } => Ok(()),
            FromNode::Seeded { node, next_seed } => self.on_seeded(node, next_seed, out),
            FromNode::Down { node } => {
                self.nodes[node].state = NodeState::Down;
                self.nodes[node].awaiting.clear();
                if self.shutting_down && self.all_down() {
                    out.push(Output::AllDown);
                }
                Ok(())
            }
            FromNode::Failed { node, reason } => self.node_lost(node, reason, out),
            FromNode::Leave { node } => self.node_left(node, out),
            FromNode::Ready { node, layout, specs } => self.on_ready(node, layout, specs.map(|s| *s), out),
            FromNode::Snapshot { node, id, state } => self.on_snapshot(node, id, *state, out),
            FromNode::Restored { node } => self.on_restored(node, out),
            FromNode::CheckpointFailed { node, id: 0, reason } => {
                if self.checkpoints.restoring.is_some() {
                    return Err(TrainerError::NodeFailed {
                        node,
                        reason: format!("cannot restore the checkpoint: {reason}"),
                    });
                }
                Err(TrainerError::Checkpoint(format!(
                    "node {node} refused a restore nobody sent: {reason}"
                )))
            }
            FromNode::CheckpointFailed { node, id, reason } => {
                if self.checkpoints.taking.as_ref().is_some_and(|r| r.id == id) {
                    return self.abort_checkpoint(format!("node {node}: {reason}"), out);
                }
                // About a checkpoint already given up.
                tracing::debug!(node, id, %reason, "late refusal of an abandoned checkpoint");
                Ok(())
            }
        }
    }

    /// Starts the shutdown: `Shutdown` to every node still up. Ends with [`Output::AllDown`].
    pub fn shutdown(&mut self, out: &mut Vec<Output>) {
        self.shutting_down = true;
        self.finished = true;
        for n in &mut self.nodes {
            if n.state.is_restarting() {
                n.state = NodeState::Down;
            }
        }
        let mut any = false;
        for i in 0..self.nodes.len() {
            if !self.nodes[i].state.is_down() {
                any = true;
                self.send(i, ToNode::Shutdown, out);
            }
        }
        if !any {
            out.push(Output::AllDown);
        }
    }

    /// Nodes that have not answered `Shutdown` yet.
    pub fn nodes_up(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| !self.nodes[i].state.is_down())
            .collect()
    }

    /// Every node answered `Shutdown` or is lost.
    fn all_down(&self) -> bool {
        self.nodes.iter().all(|n| n.state.is_down())
    }
}
