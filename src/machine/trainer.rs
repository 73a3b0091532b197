//! The trainer's decisions, with no IO: who gets `Continue`, how shares assemble
//! into a batch, when weights go out, when the run is over.
//!
//! Feed it the consumer's requests and the nodes' messages; it appends what to
//! send and what to yield to an output list. The Trainer actor is a thin shell
//! around it, and the testkit pumps it in memory.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::checkpoint::{Checkpoint, CheckpointError, NodeBook, TrainerState};
use crate::message::{Batch, Continue, FromNode, Seed, ToNode, UpdateWeights};
use crate::node_state::NodeState as NodeCheckpoint;
use crate::policy::Weights;
use crate::schema::{keys, BatchLayout};
use crate::supervisor::{restart_seed, RestartIntensity, Restarts};
use crate::tensor::{Tensor, TensorDict, TensorError};

/// How the trainer collects; torchrl's argument names.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainerConfig {
    /// Number of nodes.
    pub nodes: usize,
    /// Env workers of each node (one entry per node).
    pub envs_per_node: Vec<usize>,
    /// Frames per yielded batch.
    pub frames_per_batch: usize,
    /// Frames to yield in all; `None` collects until shutdown.
    pub total_frames: Option<u64>,
    /// Sync (every node collects a share of each batch) or async (first ready, first served).
    pub sync: bool,
    /// Push the stored weights before each collection (sync: all nodes; async: the node that delivered).
    pub update_after_each_batch: bool,
    /// Push to a node that produced more than this many batches since its last update.
    pub max_weight_update_interval: Option<u64>,
    /// Push to all nodes every this many yielded batches.
    pub update_interval: Option<u64>,
}

/// A config the trainer cannot run, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid `{field}`: {reason}")]
pub struct ConfigError {
    /// The field (a builder method name).
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

fn cfg_err(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        reason: reason.into(),
    }
}

impl TrainerConfig {
    /// Checks every field, so that a run never fails halfway for a reason known up front.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let n = self.nodes;
        if n == 0 {
            return Err(cfg_err("nodes", "must be at least 1"));
        }
        if self.envs_per_node.len() != n {
            return Err(cfg_err(
                "envs_per_node",
                format!("{} entries for {n} nodes", self.envs_per_node.len()),
            ));
        }
        if let Some(i) = self.envs_per_node.iter().position(|&k| k == 0) {
            return Err(cfg_err("envs_per_node", format!("node {i} has no env")));
        }
        let f = self.frames_per_batch;
        if f == 0 {
            return Err(cfg_err("frames_per_batch", "must be at least 1"));
        }
        if self.total_frames == Some(0) {
            return Err(cfg_err("total_frames", "must be at least 1 (or endless)"));
        }
        if self.max_weight_update_interval == Some(0) {
            return Err(cfg_err("max_weight_update_interval", "must be at least 1 (or unset)"));
        }
        if self.update_interval == Some(0) {
            return Err(cfg_err("update_interval", "must be at least 1 (or unset)"));
        }
        let tail = self.total_frames.map_or(0, |t| (t % f as u64) as usize);
        if self.sync {
            if !f.is_multiple_of(n) {
                return Err(cfg_err(
                    "frames_per_batch",
                    format!("sync collection splits {f} frames evenly over {n} nodes, and {n} does not divide {f}"),
                ));
            }
            let share = f / n;
            if let Some(i) = self.envs_per_node.iter().position(|&k| !share.is_multiple_of(k)) {
                return Err(cfg_err(
                    "frames_per_batch",
                    format!(
                        "each node's share of {share} frames must divide over its {} envs (node {i})",
                        self.envs_per_node[i]
                    ),
                ));
            }
            if self.envs_per_node.iter().any(|&k| k != self.envs_per_node[0]) {
                return Err(cfg_err(
                    "envs_per_node",
                    "sync collection stacks node shares, so every node needs the same env count",
                ));
            }
            if tail != 0 && (!tail.is_multiple_of(n) || !(tail / n).is_multiple_of(self.envs_per_node[0])) {
                return Err(cfg_err(
                    "total_frames",
                    format!(
                        "the last batch of {tail} frames cannot be split evenly over {n} nodes x {} envs",
                        self.envs_per_node[0]
                    ),
                ));
            }
        } else {
            if let Some(i) = self.envs_per_node.iter().position(|&k| !f.is_multiple_of(k)) {
                return Err(cfg_err(
                    "frames_per_batch",
                    format!(
                        "{f} frames do not divide over the {} envs of node {i}",
                        self.envs_per_node[i]
                    ),
                ));
            }
            if let Some(i) = self.envs_per_node.iter().position(|&k| !tail.is_multiple_of(k)) {
                return Err(cfg_err(
                    "total_frames",
                    format!(
                        "the last batch of {tail} frames cannot be split over the {} envs of node {i}",
                        self.envs_per_node[i]
                    ),
                ));
            }
        }
        Ok(())
    }
}

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
    /// Stacking shares failed.
    #[error("cannot assemble the batch: {0}")]
    Tensor(#[from] TensorError),
}

#[derive(Clone, Debug, Default)]
struct NodeState {
    /// The `Continue` in flight: (seq, frames).
    outstanding: Option<(u64, usize)>,
    /// The `Continue` whose batch is on its way, the node already released to the
    /// next one (see [`TrainerMachine::batch_arriving`]): (seq, frames).
    arriving: Option<(u64, usize)>,
    /// When that `Continue` was sent: it is timed until its batch is whole, and the
    /// outstanding one from then on.
    arriving_sent_at: Duration,
    /// A batch of this node began to arrive and is not whole yet (released or not).
    in_transit: bool,
    /// Version last pushed to the node (0: the initial weights).
    pushed_version: u64,
    /// Batches produced since the last weight update.
    since_update: u64,
    down: bool,
    /// Being restarted: no `Continue`, no pushes until [`TrainerMachine::node_restarted`].
    restarting: bool,
    /// Frames of the `Continue` lost with the failed incarnation (or held back while
    /// restarting), sent again under a new seq once the node is back.
    lost: Option<usize>,
    /// When the outstanding `Continue` was sent (machine clock).
    sent_at: Duration,
    /// Seqs below this were sent to an earlier incarnation: their batches are late.
    incarnation_seq: u64,
    /// Added to the trajectory ids of this incarnation's batches (a multiple of all
    /// lanes), so a restarted node never repeats an id its predecessors delivered.
    traj_offset: u64,
    /// The highest trajectory id delivered by the node (after the offset).
    max_traj: Option<u64>,
}

/// How the trainer supervises its nodes (off by default: a lost node is lost).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSupervision {
    /// Restarts of one node allowed within a window; past it the failure is an error.
    pub intensity: RestartIntensity,
    /// A `Continue` not answered within this long counts as a node failure (`None`: no limit).
    pub continue_timeout: Option<Duration>,
    /// When a node cannot be restarted (the launcher gave up): in async mode go on
    /// with the other nodes (`true`) or fail the run (`false`, the default).
    pub continue_without_lost_nodes: bool,
}

/// Counters of a supervised run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SupervisionStats {
    /// Restarts of each node over the run.
    pub restarts: Vec<u32>,
    /// Batches refused because they answered a `Continue` of an incarnation that was replaced.
    pub dropped_late: u64,
    /// Frames in the batches accepted from nodes.
    pub frames_collected: u64,
}

/// The trainer's state machine.
#[derive(Debug)]
pub struct TrainerMachine {
    cfg: TrainerConfig,
    nodes: Vec<NodeState>,
    next_seq: u64,
    weights: Option<Arc<Weights>>,
    version: u64,
    frames_yielded: u64,
    batches_yielded: u64,
    finished: bool,
    /// Sync: the shares of the round in flight.
    round: Option<Vec<Option<Batch>>>,
    /// Async: batches received and not yet yielded.
    ready: VecDeque<Batch>,
    /// Async: Continue already sent to every node.
    started: bool,
    /// The consumer asked for a batch and has not got it yet.
    wanted: bool,
    /// Seeding chain in progress: the node being seeded.
    seeding: Option<(usize, u64)>,
    /// A request arrived during the seeding chain; it is served once the chain ends,
    /// so no node ever collects with a half-applied seed.
    deferred: bool,
    /// A seeding chain asked for while another was running.
    queued_seed: Option<u64>,
    shutting_down: bool,
    /// What each node's batches must hold, once known (given at start for local
    /// nodes, advertised by a remote node in its `Ready`).
    layouts: Vec<Option<BatchLayout>>,
    /// Node supervision, when on.
    supervision: Option<NodeSupervision>,
    /// Restart bookkeeping per node (used when supervision is on).
    restarts: Vec<Restarts>,
    /// The machine's clock: the latest [`TrainerMachine::tick`].
    now: Duration,
    /// The seed of the last seeding chain (node 0's seed), 0 before any.
    chain_seed: u64,
    /// Late batches refused.
    dropped_late: u64,
    /// Frames in accepted batches.
    frames_collected: u64,
    /// A checkpoint being taken.
    checkpoint: Option<CheckpointRun>,
    /// A checkpoint being restored: the nodes that confirmed.
    restoring: Option<Vec<bool>>,
    /// A checkpoint to restore when the run starts.
    resume: Option<Box<Checkpoint>>,
    /// While restoring: each node's state, sent again to a node restarted meanwhile.
    restore_states: Vec<Option<NodeCheckpoint>>,
    /// The id of the last checkpoint begun (0 before any).
    checkpoint_id: u64,
    /// Weight pushes asked for during a checkpoint: sent once it ends (`Some(None)`: all nodes).
    deferred_push: Option<Option<Vec<usize>>>,
}

/// A checkpoint in progress: which nodes were asked and what they answered.
#[derive(Debug)]
struct CheckpointRun {
    id: u64,
    asked: Vec<bool>,
    states: Vec<Option<NodeCheckpoint>>,
}

/// Checks a batch's entries against a layout: same keys, dtypes and feature shapes.
pub fn check_layout(data: &TensorDict, layout: &BatchLayout) -> Result<(), String> {
    crate::schema::check_layout(data, layout)
}

impl TrainerMachine {
    /// A machine for a validated config.
    pub fn new(cfg: TrainerConfig) -> Result<TrainerMachine, ConfigError> {
        cfg.validate()?;
        let cfg_nodes = cfg.nodes;
        Ok(TrainerMachine {
            nodes: vec![NodeState::default(); cfg.nodes],
            cfg,
            next_seq: 0,
            weights: None,
            version: 0,
            frames_yielded: 0,
            batches_yielded: 0,
            finished: false,
            round: None,
            ready: VecDeque::new(),
            started: false,
            wanted: false,
            seeding: None,
            deferred: false,
            queued_seed: None,
            shutting_down: false,
            layouts: vec![None; cfg_nodes],
            supervision: None,
            restarts: Vec::new(),
            now: Duration::ZERO,
            chain_seed: 0,
            dropped_late: 0,
            frames_collected: 0,
            checkpoint: None,
            restoring: None,
            resume: None,
            restore_states: Vec::new(),
            checkpoint_id: 0,
            deferred_push: None,
        })
    }

    /// Supervises the nodes: a failed node is restarted (see [`Output::RestartNode`])
    /// up to the intensity, then its failure is an error.
    pub fn with_supervision(mut self, sup: NodeSupervision) -> TrainerMachine {
        self.restarts = vec![Restarts::new(sup.intensity); self.cfg.nodes];
        self.supervision = Some(sup);
        self
    }

    /// The node supervision, when on.
    pub fn supervision(&self) -> Option<&NodeSupervision> {
        self.supervision.as_ref()
    }

    /// Restarts, late batches and frames collected so far.
    pub fn stats(&self) -> SupervisionStats {
        SupervisionStats {
            restarts: (0..self.cfg.nodes)
                .map(|i| self.restarts.get(i).map_or(0, Restarts::total))
                .collect(),
            dropped_late: self.dropped_late,
            frames_collected: self.frames_collected,
        }
    }

    /// True while node `node` is being restarted.
    pub fn is_restarting(&self, node: usize) -> bool {
        self.nodes.get(node).is_some_and(|n| n.restarting)
    }

    /// The seed node `node` gets from the last seeding chain (all nodes up).
    fn chain_seed_of(&self, node: usize) -> u64 {
        let before: u64 = self.cfg.envs_per_node[..node].iter().map(|&k| k as u64).sum();
        self.chain_seed.wrapping_add(before)
    }

    /// The clock moved to `now` (since an origin the caller picks): a `Continue`
    /// unanswered for longer than `continue_timeout` counts as a node failure. A
    /// `Continue` sent while the node's previous batch was on its way counts from when
    /// that batch was whole.
    pub fn tick(&mut self, now: Duration, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        self.now = self.now.max(now);
        let Some(limit) = self.supervision.as_ref().and_then(|s| s.continue_timeout) else {
            return Ok(());
        };
        if self.shutting_down {
            return Ok(());
        }
        for i in 0..self.nodes.len() {
            let n = &self.nodes[i];
            if n.down || n.restarting {
                continue;
            }
            // The batch on its way first: the outstanding `Continue` is timed from
            // when that batch is whole, as if it had been sent then.
            let timed = match n.arriving {
                Some(a) => Some((a, n.arriving_sent_at)),
                None => n.outstanding.map(|o| (o, n.sent_at)),
            };
            if let Some(((seq, frames), sent_at)) = timed {
                if self.now.saturating_sub(sent_at) >= limit {
                    let reason = format!(
                        "no answer to Continue seq {seq} ({frames} frames) within {:.3} s",
                        limit.as_secs_f64()
                    );
                    self.node_lost(i, reason, out)?;
                }
            }
        }
        Ok(())
    }

    /// The launcher brought node `node` back: it gets the current weights, its restart
    /// seed, then the `Continue` its failed incarnation lost, under a new seq.
    pub fn node_restarted(&mut self, node: usize, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if node >= self.nodes.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        if !self.nodes[node].restarting {
            return Ok(());
        }
        let restart = self.restarts.get(node).map_or(0, Restarts::total);
        let next_seq = self.next_seq;
        let unrestored = self.restoring.as_ref().is_some_and(|d| !d[node]);
        if let Some(state) = self.restore_states.get(node).cloned().flatten().filter(|_| unrestored) {
            // Lost while restoring: the new incarnation gets the same state, so the run
            // still resumes exactly (it delivered nothing since, its ids need no offset).
            let st = &mut self.nodes[node];
            st.restarting = false;
            st.incarnation_seq = next_seq;
            st.pushed_version = state.weights.as_ref().map_or(0, |w| w.version);
            out.push(Output::Send {
                node,
                msg: ToNode::Restore(Box::new(state)),
            });
            tracing::info!(node, restart, "node restarted while restoring: its state is sent again");
            return Ok(());
        }
        let seed = restart_seed(self.chain_seed_of(node), restart);
        let weights = self.weights.clone();
        let lanes: u64 = self.cfg.envs_per_node.iter().map(|&k| k as u64).sum::<u64>().max(1);
        let st = &mut self.nodes[node];
        if let Some(max) = st.max_traj {
            st.traj_offset = (max + 1).div_ceil(lanes) * lanes;
        }
        st.restarting = false;
        st.since_update = 0;
        st.pushed_version = 0;
        st.incarnation_seq = next_seq;
        if let Some(w) = weights {
            st.pushed_version = w.version;
            out.push(Output::Send {
                node,
                msg: ToNode::UpdateWeights(UpdateWeights { weights: w }),
            });
        }
        out.push(Output::Send {
            node,
            msg: ToNode::Seed(Seed { seed }),
        });
        tracing::info!(node, restart, seed, "node restarted");
        if let Some(frames) = self.nodes[node].lost.take() {
            if !self.finished {
                self.continue_node(node, frames, out);
            }
        }
        Ok(())
    }

    /// The launcher could not bring node `node` back: the failure stands. Sync mode
    /// fails; async mode goes on without the node if `continue_without_lost_nodes`.
    pub fn node_restart_failed(
        &mut self,
        node: usize,
        reason: String,
        out: &mut Vec<Output>,
    ) -> Result<(), TrainerError> {
        if node >= self.nodes.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        let st = &mut self.nodes[node];
        if !st.restarting {
            return Ok(());
        }
        st.restarting = false;
        st.down = true;
        if let Some(done) = self.restoring.as_mut() {
            done[node] = true;
        }
        st.lost = None;
        st.outstanding = None;
        st.arriving = None;
        st.in_transit = false;
        let reason = format!("restart failed: {reason}");
        tracing::error!(node, %reason, "node not restarted");
        if self.shutting_down {
            if self.nodes.iter().all(|n| n.down) {
                out.push(Output::AllDown);
            }
            return Ok(());
        }
        let go_on = self.supervision.as_ref().is_some_and(|s| s.continue_without_lost_nodes);
        if !self.cfg.sync && go_on && self.nodes.iter().any(|n| !n.down) {
            self.finish_restore_if_done(out)?;
            return Err(TrainerError::NodeLost { node, reason });
        }
        Err(TrainerError::NodeFailed { node, reason })
    }

    /// Every batch of every node will be checked against `layout` (keys, dtypes,
    /// feature shapes). Same as [`Self::with_layouts`] with `layout` for each node.
    pub fn with_layout(mut self, layout: BatchLayout) -> TrainerMachine {
        self.layouts = vec![Some(layout); self.cfg.nodes];
        self
    }

    /// Node `i`'s batches will be checked against `layouts[i]` (unchecked where `None`,
    /// or beyond the end). Sync mode needs equal layouts: see [`Self::set_layout`].
    pub fn with_layouts(mut self, layouts: Vec<Option<BatchLayout>>) -> TrainerMachine {
        let n = self.cfg.nodes;
        self.layouts = layouts.into_iter().chain(std::iter::repeat(None)).take(n).collect();
        self
    }

    /// Records the layout node `node` advertised (a remote node's `Ready`). In sync
    /// mode, where shares are stacked, a layout that differs from another node's is
    /// refused with the difference (the layout is not recorded).
    pub fn set_layout(&mut self, node: usize, layout: BatchLayout) -> Result<(), TrainerError> {
        if node >= self.layouts.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        if self.cfg.sync {
            for (other, known) in self.layouts.iter().enumerate() {
                if other == node {
                    continue;
                }
                if let Some(diff) = known
                    .as_ref()
                    .and_then(|k| crate::schema::layout_difference(node, &layout, other, k))
                {
                    return Err(TrainerError::BadLayout {
                        node,
                        reason: format!("sync collection stacks node shares, but {diff}"),
                    });
                }
            }
        }
        self.layouts[node] = Some(layout);
        Ok(())
    }

    /// The layout node `node`'s batches are checked against, once known.
    pub fn layout(&self, node: usize) -> Option<&BatchLayout> {
        self.layouts.get(node).and_then(Option::as_ref)
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

    /// The version of the stored weights (0 before any).
    pub fn weights_version(&self) -> u64 {
        self.version
    }

    /// The stored weights, if any were set.
    pub fn weights(&self) -> Option<&Arc<Weights>> {
        self.weights.as_ref()
    }

    /// The `Continue` each node has in flight, as `(seq, frames)`: the newest, when a
    /// node was released while its previous batch is still on its way.
    pub fn outstanding(&self, node: usize) -> Option<(u64, usize)> {
        self.nodes.get(node).and_then(|n| n.outstanding)
    }

    /// Stores new weights under the next version and returns it. Nothing is sent:
    /// pushes happen by [`TrainerMachine::push_weights`] or the update options.
    pub fn set_weights(&mut self, mut weights: Weights) -> u64 {
        self.version += 1;
        weights.version = self.version;
        self.weights = Some(Arc::new(weights));
        self.version
    }

    /// Sends the stored weights to `nodes` (all when `None`) that do not have them yet.
    /// During a checkpoint the push waits for its end, so that no node's state in it
    /// is taken on one side of the push and the trainer's on the other.
    pub fn push_weights(&mut self, nodes: Option<&[usize]>, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if let Some(&bad) = nodes.and_then(|l| l.iter().find(|&&i| i >= self.nodes.len())) {
            return Err(TrainerError::UnknownNode(bad));
        }
        if self.checkpointing() {
            self.deferred_push = Some(match (self.deferred_push.take(), nodes) {
                (Some(None), _) | (_, None) => None,
                (Some(Some(mut a)), Some(b)) => {
                    a.extend_from_slice(b);
                    Some(a)
                }
                (None, Some(b)) => Some(b.to_vec()),
            });
            return Ok(());
        }
        match nodes {
            None => {
                for i in 0..self.nodes.len() {
                    self.push_to(i, out);
                }
            }
            Some(list) => {
                if let Some(&bad) = list.iter().find(|&&i| i >= self.nodes.len()) {
                    return Err(TrainerError::UnknownNode(bad));
                }
                for &i in list {
                    self.push_to(i, out);
                }
            }
        }
        Ok(())
    }

    fn push_to(&mut self, i: usize, out: &mut Vec<Output>) {
        let n = &mut self.nodes[i];
        n.since_update = 0;
        if let Some(w) = &self.weights {
            if n.pushed_version != w.version && !n.down && !n.restarting {
                n.pushed_version = w.version;
                out.push(Output::Send {
                    node: i,
                    msg: ToNode::UpdateWeights(UpdateWeights { weights: w.clone() }),
                });
            }
        }
    }

    fn push_stale(&mut self, out: &mut Vec<Output>) {
        if let Some(max) = self.cfg.max_weight_update_interval {
            for i in 0..self.nodes.len() {
                if self.nodes[i].since_update > max {
                    self.push_to(i, out);
                }
            }
        }
    }

    /// Starts the seeding chain: node 0 gets `seed`, node k+1 the seed node k did not use.
    /// Ends with [`Output::Seeded`].
    /// A chain asked for while another runs starts when that one ends; only the
    /// last chain's result is reported.
    pub fn set_seed(&mut self, seed: u64, out: &mut Vec<Output>) {
        if self.seeding.is_some() || self.checkpointing() {
            self.queued_seed = Some(seed);
            return;
        }
        self.chain_seed = seed;
        if let Err(e) = self.seed_from(0, seed, out) {
            tracing::error!(error = %e, "seeding failed");
        }
    }

    /// Sends `seed` to the first live node from `node` on; a node that is down is
    /// skipped as if it had used its envs' seeds, so the others get the seeds they
    /// would have had. Past the last node the chain is complete.
    fn seed_from(&mut self, mut node: usize, mut seed: u64, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        while node < self.nodes.len() && (self.nodes[node].down || self.nodes[node].restarting) {
            seed = seed.wrapping_add(self.cfg.envs_per_node[node] as u64);
            node += 1;
        }
        if node < self.nodes.len() {
            self.seeding = Some((node, seed));
            out.push(Output::Send {
                node,
                msg: ToNode::Seed(Seed { seed }),
            });
            return Ok(());
        }
        self.seeding = None;
        if let Some(queued) = self.queued_seed.take() {
            self.chain_seed = queued;
            return self.seed_from(0, queued, out);
        }
        out.push(Output::Seeded { next_seed: seed });
        if self.checkpoint.is_some() {
            self.advance_checkpoint(out);
            return Ok(());
        }
        if std::mem::take(&mut self.deferred) {
            self.request(out)?;
        }
        Ok(())
    }

    fn continue_node(&mut self, node: usize, frames: usize, out: &mut Vec<Output>) {
        if self.nodes[node].restarting {
            // Held back: sent under a new seq once the node is back.
            self.nodes[node].lost = Some(frames);
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.nodes[node].outstanding = Some((seq, frames));
        self.nodes[node].sent_at = self.now;
        out.push(Output::Send {
            node,
            msg: ToNode::Continue(Continue { seq, frames }),
        });
    }

    fn remaining(&self) -> Option<u64> {
        self.cfg.total_frames.map(|t| t.saturating_sub(self.frames_yielded))
    }

    /// The consumer wants the next batch. Yields at once if one is ready, else
    /// sends what is needed and yields when the nodes have answered.
    pub fn request(&mut self, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.finished {
            out.push(Output::Finished);
            return Ok(());
        }
        self.wanted = true;
        if self.seeding.is_some() || self.checkpointing() {
            self.deferred = true;
            return Ok(());
        }
        if self.cfg.sync {
            if self.round.is_none() {
                if self.cfg.update_after_each_batch {
                    self.push_weights(None, out)?;
                }
                self.push_stale(out);
                let f = self.remaining().map_or(self.cfg.frames_per_batch as u64, |r| {
                    r.min(self.cfg.frames_per_batch as u64)
                }) as usize;
                let share = f / self.cfg.nodes;
                for i in 0..self.cfg.nodes {
                    self.continue_node(i, share, out);
                }
                self.round = Some(vec![None; self.cfg.nodes]);
            }
        } else {
            self.push_stale(out);
            // Every live node with nothing in flight and nothing waiting to be yielded
            // gets work: all of them at the start, and after a resume those whose batch
            // is not among the kept ones (a run resumed with a larger `total_frames`).
            self.started = true;
            for i in 0..self.cfg.nodes {
                let n = &self.nodes[i];
                let idle = !n.down && !n.restarting && n.outstanding.is_none() && n.lost.is_none();
                if idle && !self.ready.iter().any(|b| b.node == i) {
                    self.continue_node(i, self.cfg.frames_per_batch, out);
                }
            }
            self.try_yield_async(out)?;
        }
        Ok(())
    }

    fn try_yield_async(&mut self, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        // While a checkpoint is taken or restored no node may be sent new work.
        if !self.wanted || self.finished || self.checkpointing() {
            return Ok(());
        }
        let Some(b) = self.ready.pop_front() else {
            return Ok(());
        };
        let node = b.node;
        let mut data = b.data;
        if let Some(r) = self.remaining() {
            let n = data.numel() as u64;
            if n > r {
                let envs = data.batch_size()[0];
                let steps = r as usize / envs;
                data = data.slice(1, 0..steps)?;
            }
        }
        // The node whose batch is yielded goes on at once (after its weight update,
        // if any), so it never idles while the consumer works on the batch.
        let more = self.remaining().is_none_or(|r| r > data.numel() as u64);
        // Periodic pushes go out before the node continues, so its next batch has them.
        self.interval_push(self.batches_yielded + 1, out);
        // A node released while its batch was on its way has its next batch asked already.
        let released = self.nodes[node].outstanding.is_some() || self.nodes[node].lost.is_some();
        if more && !released {
            self.release(node, out)?;
        }
        self.emit(node_batch(Some(node), vec![b.weights_version], data), false, out);
        Ok(())
    }

    /// Node `node` goes on to its next batch, after its weight update if any.
    fn release(&mut self, node: usize, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.cfg.update_after_each_batch {
            self.push_weights(Some(&[node]), out)?;
        }
        self.continue_node(node, self.cfg.frames_per_batch, out);
        Ok(())
    }

    /// Node `node`'s batch began to arrive (a remote node's first bytes of it; a
    /// batch over a socket takes a while to be whole). In async mode, when the
    /// consumer waits, nothing is ready, no other node's batch is on its way and more
    /// frames are wanted than this batch holds, this batch is the next one yielded:
    /// the node is released now, as it would be once the batch is whole and yielded,
    /// so it collects while the batch travels. Anything else: nothing happens, and
    /// the node goes on when its batch is yielded. A batch that then fails to arrive
    /// is handled as any lost work.
    pub fn batch_arriving(&mut self, node: usize, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if node >= self.nodes.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        let n = &self.nodes[node];
        // Only an answer to the outstanding `Continue` can be on its way (anything
        // else is refused once whole).
        let live = !n.down && !n.restarting && n.arriving.is_none();
        let Some((seq, frames)) = n.outstanding.filter(|_| live) else {
            return Ok(());
        };
        let others = self.nodes.iter().enumerate().any(|(i, m)| i != node && m.in_transit);
        self.nodes[node].in_transit = true;
        let quiet = self.seeding.is_none() && !self.checkpointing() && !self.shutting_down;
        if self.cfg.sync || !self.wanted || self.finished || !quiet || others || !self.ready.is_empty() {
            return Ok(());
        }
        if self.remaining().is_some_and(|r| r <= frames as u64) {
            return Ok(());
        }
        let n = &mut self.nodes[node];
        n.arriving = Some((seq, frames));
        n.arriving_sent_at = n.sent_at;
        n.outstanding = None;
        self.interval_push(self.batches_yielded + 1, out);
        self.release(node, out)
    }

    fn interval_push(&mut self, yielded: u64, out: &mut Vec<Output>) {
        if let Some(ui) = self.cfg.update_interval {
            if yielded.is_multiple_of(ui) {
                for i in 0..self.nodes.len() {
                    self.push_to(i, out);
                }
            }
        }
    }

    fn emit(&mut self, mut c: Collected, push: bool, out: &mut Vec<Output>) {
        c.index = self.batches_yielded;
        self.wanted = false;
        self.batches_yielded += 1;
        self.frames_yielded += c.data.numel() as u64;
        out.push(Output::Yield(c));
        if push {
            self.interval_push(self.batches_yielded, out);
        }
        if self.remaining() == Some(0) {
            self.finished = true;
        }
    }

    /// A message from a node. An error means the message was refused and dropped;
    /// the machine's state is as before (except that a refused batch, being whole,
    /// is no longer on its way).
    pub fn on_node(&mut self, msg: FromNode, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        let node = msg.node();
        if node >= self.nodes.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        match msg {
            FromNode::Batch(b) => self.on_batch(b, out),
            FromNode::WeightsUpdated { .. } => Ok(()),
            FromNode::Seeded { node, next_seed } => {
                if self.seeding.map(|(n, _)| n) != Some(node) {
                    return Ok(());
                }
                self.seed_from(node + 1, next_seed, out)
            }
            FromNode::Down { node } => {
                self.nodes[node].down = true;
                self.nodes[node].outstanding = None;
                self.nodes[node].arriving = None;
                self.nodes[node].in_transit = false;
                if self.shutting_down && self.nodes.iter().all(|n| n.down) {
                    out.push(Output::AllDown);
                }
                Ok(())
            }
            FromNode::Failed { node, reason } => self.node_lost(node, reason, out),
            FromNode::Ready { node, layout } => self.set_layout(node, layout),
            FromNode::Snapshot { node, id, state } => self.on_snapshot(node, id, *state, out),
            FromNode::Restored { node } => self.on_restored(node, out),
            FromNode::CheckpointFailed { node, id: 0, reason } => {
                if self.restoring.is_some() {
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
                if self.checkpoint.as_ref().is_some_and(|r| r.id == id) {
                    return self.abort_checkpoint(format!("node {node}: {reason}"), out);
                }
                // About a checkpoint already given up.
                tracing::debug!(node, id, %reason, "late refusal of an abandoned checkpoint");
                Ok(())
            }
        }
    }

    /// Node `node` is gone (failed, disconnected, silent). During shutdown it counts
    /// as down. In async mode the run goes on with the nodes left, if any; in sync
    /// mode no batch can be whole any more, so it is an error.
    fn node_lost(&mut self, node: usize, reason: String, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        // A checkpoint needs every node: it fails, and what waited for it is served
        // once the node is marked lost (so no work goes to it).
        let aborted = self.checkpoint.take().is_some();
        if aborted {
            let why = format!("node {node} was lost: {reason}");
            tracing::warn!(reason = %why, "checkpoint failed");
            out.push(Output::CheckpointFailed(why));
        }
        let was_restoring = self.restoring.is_some();
        let r = self.node_gone(node, reason, out);
        if matches!(r, Err(TrainerError::NodeFailed { .. })) {
            return r;
        }
        if was_restoring {
            self.finish_restore_if_done(out)?;
        } else if aborted {
            self.resume_after_checkpoint(out)?;
        }
        r
    }

    fn node_gone(&mut self, node: usize, reason: String, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if let Some(done) = self.restoring.as_mut() {
            if !done[node] && self.supervision.is_none() {
                // Lost for good: do not wait for it.
                tracing::warn!(node, %reason, "node lost while restoring the checkpoint");
                done[node] = true;
            }
            // Supervised, it is restarted and sent its state again (see `node_restarted`).
        }
        let st = &mut self.nodes[node];
        let was_down = st.down;
        st.down = true;
        // A batch on its way is lost with the node; the node was released already,
        // so its outstanding `Continue` is the one asked again.
        st.arriving = None;
        st.in_transit = false;
        if let Some((_, frames)) = st.outstanding.take() {
            st.lost = Some(frames);
        }
        if st.restarting && !self.shutting_down {
            // A late report about the incarnation being replaced.
            st.down = false;
            return Ok(());
        }
        if self.shutting_down {
            if !was_down && self.nodes.iter().all(|n| n.down) {
                out.push(Output::AllDown);
            }
            return Ok(());
        }
        if was_down {
            return Ok(());
        }
        if self.supervision.is_some() {
            return self.supervise(node, reason, out);
        }
        if let Some((n, seed)) = self.seeding {
            if n == node {
                // The chain goes on without it.
                self.seed_from(node + 1, seed.wrapping_add(self.cfg.envs_per_node[node] as u64), out)?;
            }
        }
        if !self.cfg.sync && self.nodes.iter().any(|n| !n.down) {
            return Err(TrainerError::NodeLost { node, reason });
        }
        Err(TrainerError::NodeFailed { node, reason })
    }

    /// A supervised node failed: restart it within the intensity, else escalate.
    fn supervise(&mut self, node: usize, cause: String, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        let st = &mut self.nodes[node];
        // `node_lost` marked it down; a supervised node is restarting instead.
        st.down = false;
        if st.restarting {
            // Another report of the incarnation already being replaced.
            return Ok(());
        }
        let now = self.now;
        match self.restarts[node].record(now, cause.clone()) {
            Ok(restart) => {
                let st = &mut self.nodes[node];
                st.restarting = true;
                // `outstanding` was cleared by the caller; keep the frames asked.
                tracing::warn!(node, restart, %cause, "node failed; restarting it");
                if let Some((n, seed)) = self.seeding {
                    if n == node {
                        self.seed_from(node + 1, seed.wrapping_add(self.cfg.envs_per_node[node] as u64), out)?;
                    }
                }
                out.push(Output::RestartNode { node, restart, cause });
                Ok(())
            }
            Err(esc) => {
                self.nodes[node].down = true;
                tracing::error!(node, restarts = esc.total_restarts, cause = %esc.cause, "node failed past its restart intensity");
                Err(TrainerError::NodeFailed {
                    node,
                    reason: esc.to_string(),
                })
            }
        }
    }

    /// Nodes still serving (not down, failed or lost).
    pub fn nodes_alive(&self) -> usize {
        self.nodes.iter().filter(|n| !n.down).count()
    }

    fn on_batch(&mut self, mut b: Batch, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        let node = b.node;
        // Whatever it turns out to be, the node's frame on its way is whole.
        self.nodes[node].in_transit = false;
        let st = &self.nodes[node];
        // A node answers in order: the batch on its way first, then the outstanding one.
        let expected = st.arriving.or(st.outstanding);
        let Some((seq, frames)) = expected.filter(|(s, _)| *s == b.seq) else {
            if self.supervision.is_some() && (st.restarting || b.seq < st.incarnation_seq) {
                self.dropped_late += 1;
                tracing::info!(node, seq = b.seq, "dropped a late batch of a replaced node incarnation");
                return Ok(());
            }
            return Err(TrainerError::UnexpectedBatch {
                node,
                seq: b.seq,
                expected: match expected {
                    Some((s, _)) => format!("seq {s}"),
                    None => "nothing".into(),
                },
            });
        };
        let envs = self.cfg.envs_per_node[node];
        let bs = b.data.batch_size();
        if bs.len() != 2 || bs[0] != envs || bs[0] * bs[1] != frames {
            return Err(TrainerError::BadBatch {
                node,
                reason: format!("asked for {frames} frames over {envs} envs, got batch shape {bs:?}"),
            });
        }
        b.data.validate().map_err(|e| TrainerError::BadBatch {
            node,
            reason: e.to_string(),
        })?;
        if let Some(layout) = self.layouts.get(node).and_then(Option::as_ref) {
            check_layout(&b.data, layout).map_err(|reason| TrainerError::BadBatch { node, reason })?;
        }
        let st = &mut self.nodes[node];
        if self.supervision.is_some() {
            if let Ok(Tensor::I64(ids)) = b.data.get_mut(keys::TRAJ_IDS) {
                let off = st.traj_offset as i64;
                if off > 0 {
                    ids.mapv_inplace(|x| if x >= 0 { x.saturating_add(off) } else { x });
                }
                if let Some(m) = ids.iter().copied().max().and_then(|m| u64::try_from(m).ok()) {
                    st.max_traj = Some(st.max_traj.map_or(m, |p| p.max(m)));
                }
            }
        }
        if st.arriving.is_some_and(|(s, _)| s == seq) {
            st.arriving = None;
            st.sent_at = self.now;
        } else {
            st.outstanding = None;
        }
        st.since_update += 1;
        self.frames_collected += frames as u64;
        if self.cfg.sync {
            if !self.finished {
                if let Some(round) = self.round.as_mut() {
                    round[node] = Some(b);
                    if round.iter().all(Option::is_some) {
                        let shares: Vec<Batch> = self.round.take().into_iter().flatten().flatten().collect();
                        let versions: Vec<u64> = shares.iter().map(|s| s.weights_version).collect();
                        let data: Vec<TensorDict> = shares.into_iter().map(|s| s.data).collect();
                        let stacked = TensorDict::stack(&data)?;
                        for (node, data) in data.into_iter().enumerate() {
                            out.push(Output::Recycle { node, data });
                        }
                        self.emit(node_batch(None, versions, stacked), true, out);
                    }
                }
            }
        } else {
            // Kept even once the run is finished: a checkpoint then holds these frames,
            // and a run resumed with a larger `total_frames` yields them first.
            self.ready.push_back(b);
            self.try_yield_async(out)?;
        }
        self.advance_checkpoint(out);
        Ok(())
    }

    fn checkpointing(&self) -> bool {
        self.checkpoint.is_some() || self.restoring.is_some()
    }

    /// Starts a checkpoint: every node is asked for its state as soon as it has no
    /// work in flight (sync: once the round in flight is whole; async: once its batch
    /// arrived, which then waits in the checkpoint to be yielded). Meanwhile no node
    /// gets new work and requests wait. Ends with [`Output::Checkpoint`] or
    /// [`Output::CheckpointFailed`]; an error here means it could not start. Returns
    /// the checkpoint's id (see [`Self::cancel_checkpoint`]).
    pub fn begin_checkpoint(&mut self, out: &mut Vec<Output>) -> Result<u64, TrainerError> {
        if self.shutting_down {
            return Err(TrainerError::Checkpoint("the collector is shutting down".into()));
        }
        if self.checkpointing() {
            return Err(TrainerError::Checkpoint(
                "another checkpoint is being taken or restored".into(),
            ));
        }
        if let Some(i) = self.nodes.iter().position(|n| n.down || n.restarting) {
            let what = if self.nodes[i].down { "down" } else { "restarting" };
            return Err(TrainerError::Checkpoint(format!(
                "node {i} is {what}; a checkpoint needs every node"
            )));
        }
        let n = self.nodes.len();
        self.checkpoint_id += 1;
        let id = self.checkpoint_id;
        self.checkpoint = Some(CheckpointRun {
            id,
            asked: vec![false; n],
            states: vec![None; n],
        });
        self.advance_checkpoint(out);
        Ok(id)
    }

    /// Gives up checkpoint `id` if it is still being taken (its deadline passed):
    /// [`Output::CheckpointFailed`] with `reason`, and collection goes on.
    pub fn cancel_checkpoint(&mut self, id: u64, reason: String, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.checkpoint.as_ref().is_some_and(|r| r.id == id) {
            return self.abort_checkpoint(reason, out);
        }
        Ok(())
    }

    /// Asks every idle node not asked yet for its state.
    fn advance_checkpoint(&mut self, out: &mut Vec<Output>) {
        if self.seeding.is_some() || (self.cfg.sync && self.round.is_some()) {
            return;
        }
        let Some(run) = self.checkpoint.as_mut() else {
            return;
        };
        for (i, n) in self.nodes.iter().enumerate() {
            if !run.asked[i] && n.outstanding.is_none() && n.arriving.is_none() {
                run.asked[i] = true;
                out.push(Output::Send {
                    node: i,
                    msg: ToNode::Snapshot { id: run.id },
                });
            }
        }
    }

    fn on_snapshot(
        &mut self,
        node: usize,
        id: u64,
        state: NodeCheckpoint,
        out: &mut Vec<Output>,
    ) -> Result<(), TrainerError> {
        let Some(run) = self
            .checkpoint
            .as_mut()
            .filter(|r| r.id == id && r.asked[node] && r.states[node].is_none())
        else {
            // A late answer to an abandoned checkpoint, or an invented one: never used.
            return Err(TrainerError::Checkpoint(format!(
                "node {node} sent a snapshot for checkpoint {id}, which is not waiting for it"
            )));
        };
        if state.node != node || state.workers.len() != self.cfg.envs_per_node[node] {
            let reason = format!(
                "node {node} sent the state of node {} with {} env workers",
                state.node,
                state.workers.len()
            );
            return self.abort_checkpoint(reason, out);
        }
        run.states[node] = Some(state);
        if run.states.iter().all(Option::is_some) {
            let run = self.checkpoint.take().expect("checked above");
            let nodes: Vec<NodeCheckpoint> = run.states.into_iter().flatten().collect();
            let mut trainer = self.trainer_state();
            for (book, st) in trainer.nodes.iter_mut().zip(&nodes) {
                // What the node holds is the truth, whatever was pushed meanwhile.
                book.pushed_version = st.weights.as_ref().map_or(0, |w| w.version);
            }
            tracing::info!(
                batches = self.batches_yielded,
                frames = self.frames_yielded,
                "checkpoint taken"
            );
            out.push(Output::Checkpoint(Box::new(Checkpoint { trainer, nodes })));
            self.resume_after_checkpoint(out)?;
        }
        Ok(())
    }

    fn abort_checkpoint(&mut self, reason: String, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.checkpoint.take().is_none() {
            return Ok(());
        }
        tracing::warn!(%reason, "checkpoint failed");
        out.push(Output::CheckpointFailed(reason));
        self.resume_after_checkpoint(out)
    }

    /// Serves what waited for the checkpoint: weight pushes, a seeding chain, requests.
    fn resume_after_checkpoint(&mut self, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.checkpointing() || self.seeding.is_some() {
            return Ok(());
        }
        if let Some(nodes) = self.deferred_push.take() {
            self.push_weights(nodes.as_deref(), out)?;
        }
        if let Some(seed) = self.queued_seed.take() {
            // The chain serves the waiting request when it ends.
            self.set_seed(seed, out);
            return Ok(());
        }
        if std::mem::take(&mut self.deferred) {
            return self.request(out);
        }
        if !self.cfg.sync {
            return self.try_yield_async(out);
        }
        Ok(())
    }

    /// The trainer's part of a checkpoint (call between batches).
    pub fn trainer_state(&self) -> TrainerState {
        TrainerState {
            sync: self.cfg.sync,
            frames_per_batch: self.cfg.frames_per_batch,
            envs_per_node: self.cfg.envs_per_node.clone(),
            frames_yielded: self.frames_yielded,
            batches_yielded: self.batches_yielded,
            next_seq: self.next_seq,
            weights_version: self.version,
            weights: self.weights.clone(),
            chain_seed: self.chain_seed,
            started: self.started,
            ready: self.ready.iter().cloned().collect(),
            frames_collected: self.frames_collected,
            nodes: self
                .nodes
                .iter()
                .map(|n| NodeBook {
                    pushed_version: n.pushed_version,
                    since_update: n.since_update,
                    traj_offset: n.traj_offset,
                    max_traj: n.max_traj,
                })
                .collect(),
        }
    }

    fn check_fits(&self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        checkpoint.check_fits(
            self.cfg.sync,
            self.cfg.frames_per_batch,
            &self.cfg.envs_per_node,
            self.cfg.total_frames,
        )
    }

    /// The run will go on from `checkpoint` (see [`Self::start_resume`]); whether it
    /// fits this run's config is checked now, naming the first setting that differs.
    pub fn with_resume(mut self, checkpoint: Checkpoint) -> Result<TrainerMachine, CheckpointError> {
        self.check_fits(&checkpoint)?;
        self.resume = Some(Box::new(checkpoint));
        Ok(self)
    }

    /// Starts restoring the checkpoint given to [`Self::with_resume`], if any
    /// (returns whether there was one): the run's first step, instead of seeding.
    pub fn start_resume(&mut self, out: &mut Vec<Output>) -> Result<bool, CheckpointError> {
        match self.resume.take() {
            Some(c) => self.restore(*c, out).map(|()| true),
            None => Ok(false),
        }
    }

    /// Goes on from `checkpoint` instead of starting afresh: call before anything
    /// else (no seeding chain; the seeds are in the checkpoint). Every node is sent
    /// its state; requests wait until all confirmed. A node that cannot restore
    /// fails the run (see [`FromNode::CheckpointFailed`]).
    pub fn restore(&mut self, checkpoint: Checkpoint, out: &mut Vec<Output>) -> Result<(), CheckpointError> {
        self.check_fits(&checkpoint)?;
        if self.next_seq != 0 || self.batches_yielded != 0 || self.checkpointing() || self.seeding.is_some() {
            return Err(CheckpointError::Mismatch {
                field: "resume",
                reason: "a checkpoint is restored before collection starts".into(),
            });
        }
        let Checkpoint { trainer: t, nodes } = checkpoint;
        self.frames_yielded = t.frames_yielded;
        self.batches_yielded = t.batches_yielded;
        self.next_seq = t.next_seq;
        self.version = t.weights_version;
        self.weights = t.weights;
        self.chain_seed = t.chain_seed;
        self.started = t.started;
        self.frames_collected = t.frames_collected;
        self.ready = t.ready.into_iter().collect();
        for (n, b) in self.nodes.iter_mut().zip(t.nodes) {
            n.pushed_version = b.pushed_version;
            n.since_update = b.since_update;
            n.traj_offset = b.traj_offset;
            n.max_traj = b.max_traj;
            n.incarnation_seq = t.next_seq;
        }
        if self.remaining() == Some(0) {
            self.finished = true;
        }
        self.restoring = Some(vec![false; self.nodes.len()]);
        self.restore_states = nodes.iter().cloned().map(Some).collect();
        for (i, st) in nodes.into_iter().enumerate() {
            out.push(Output::Send {
                node: i,
                msg: ToNode::Restore(Box::new(st)),
            });
        }
        tracing::info!(
            batches = self.batches_yielded,
            frames = self.frames_yielded,
            "restoring a checkpoint"
        );
        Ok(())
    }

    fn on_restored(&mut self, node: usize, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        let Some(done) = self.restoring.as_mut() else {
            return Err(TrainerError::Checkpoint(format!("node {node} restored nothing asked")));
        };
        done[node] = true;
        self.finish_restore_if_done(out)
    }

    /// Once every node restored (or was lost meanwhile), serves what waited.
    fn finish_restore_if_done(&mut self, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.restoring.as_ref().is_some_and(|d| d.iter().all(|x| *x)) {
            self.restoring = None;
            self.restore_states = Vec::new();
            tracing::info!("every node restored the checkpoint");
            self.resume_after_checkpoint(out)?;
        }
        Ok(())
    }

    /// Starts the shutdown: `Shutdown` to every node still up. Ends with [`Output::AllDown`].
    pub fn shutdown(&mut self, out: &mut Vec<Output>) {
        self.shutting_down = true;
        self.finished = true;
        for n in &mut self.nodes {
            if n.restarting {
                n.restarting = false;
                n.down = true;
            }
        }
        let mut any = false;
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.down {
                any = true;
                out.push(Output::Send {
                    node: i,
                    msg: ToNode::Shutdown,
                });
            }
        }
        if !any {
            out.push(Output::AllDown);
        }
    }

    /// Nodes that have not answered `Shutdown` yet.
    pub fn nodes_up(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| !self.nodes[i].down).collect()
    }
}

fn node_batch(node: Option<usize>, versions: Vec<u64>, data: TensorDict) -> Collected {
    Collected {
        index: 0,
        node,
        weights_version: versions.iter().copied().min().unwrap_or(0),
        weights_versions: versions,
        data,
    }
}
