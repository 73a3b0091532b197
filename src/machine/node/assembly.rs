//! One `Continue` split over the env workers and their shares joined, in worker
//! order, into the node's one `Batch`; the storage of a yielded batch handed back.
//!
//! A node takes a second `Continue` while it collects the first (protocol version 11:
//! a trainer with `prefetch` sends the next one ahead): its `Collect`s go to the
//! workers at once and queue behind the first's, so each worker steps on without
//! waiting for the trainer to see the batch. The batches go out in the order asked.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::message::{Batch, Continue, FromNode};
use crate::policy::Weights;
use crate::tensor::TensorDict;

use super::{NodeError, NodeMachine, NodeOutput, WorkerCmd};

/// How many `Continue`s a node holds at once: the one collected and one queued
/// behind it (PROTOCOL.md §5, Collect). A third is refused ([`NodeError::Busy`]).
pub const MAX_CONTINUES: usize = 2;

/// The `Continue`s in flight, oldest first: each is answered once every worker's
/// share of it came, in the order they were asked.
pub(super) type InFlight = VecDeque<Pending>;

/// One `Continue` in flight.
pub(super) struct Pending {
    pub(super) seq: u64,
    /// Frames asked of each worker.
    pub(super) frames: usize,
    /// Each worker's share once it came: (weights version, frames).
    pub(super) shares: Vec<Option<(u64, TensorDict)>>,
    /// The weights the node had when the `Continue` came: every share is collected
    /// with them (updates wait in each worker's queue behind its `Collect`, and a
    /// worker restarted meanwhile is rebuilt with these), so the batch has one version.
    /// A `Continue` queued behind another has the weights that came between them.
    pub(super) weights: Option<Arc<Weights>>,
}

impl NodeMachine {
    /// Asks every worker for its equal share of `c`, behind the `Continue` in flight
    /// if there is one (at most [`MAX_CONTINUES`] in all).
    pub(super) fn begin_collect(&mut self, c: Continue, out: &mut Vec<NodeOutput>) -> Result<(), NodeError> {
        if self.pending.len() >= MAX_CONTINUES {
            return Err(NodeError::Busy {
                seq: c.seq,
                pending: self.pending.iter().map(|p| p.seq).collect(),
            });
        }
        if !c.frames.is_multiple_of(self.workers) || c.frames == 0 {
            return Err(NodeError::Uneven {
                frames: c.frames,
                workers: self.workers,
            });
        }
        let frames = c.frames / self.workers;
        for worker in 0..self.workers {
            out.push(NodeOutput::Worker {
                worker,
                cmd: WorkerCmd::Collect { seq: c.seq, frames },
            });
        }
        self.pending.push_back(Pending {
            seq: c.seq,
            frames,
            shares: vec![None; self.workers],
            weights: self.weights.clone(),
        });
        Ok(())
    }

    /// A worker's share for `seq`, collected with weights `version`. The last share
    /// completes the node's batch: the shares joined in worker order, stamped with
    /// their weights version (one for all: see [`Pending::weights`]; the oldest, were
    /// they ever to differ). Batches go out oldest first: a queued `Continue` whose
    /// shares all came waits for the one before it (a worker answers in order, so
    /// this cannot happen but through a bug elsewhere; the order holds regardless).
    pub(super) fn on_worker_batch(
        &mut self,
        worker: usize,
        seq: u64,
        version: u64,
        data: TensorDict,
        max_traj_id: Option<u64>,
        out: &mut Vec<NodeOutput>,
    ) -> Result<(), NodeError> {
        if self.stopping {
            // Work that was in flight when Shutdown came: dropped on purpose, quietly.
            return Ok(());
        }
        let Some(p) = self
            .pending
            .iter_mut()
            .find(|p| p.seq == seq && worker < p.shares.len())
        else {
            return Err(NodeError::Unexpected { worker, seq });
        };
        if p.shares[worker].is_some() {
            return Err(NodeError::Unexpected { worker, seq });
        }
        let life = &mut self.lives[worker];
        life.frames = life.frames.saturating_add(data.numel() as u64);
        if let Some(max) = max_traj_id {
            life.next_traj_id = life.next_traj_id.max(max + 1);
        }
        p.shares[worker] = Some((version, data));
        while self
            .pending
            .front()
            .is_some_and(|p| p.shares.iter().all(Option::is_some))
        {
            if let Some(p) = self.pending.pop_front() {
                self.answer(p, out)?;
            }
        }
        Ok(())
    }

    /// Sends the batch of `p`, every share of which came.
    fn answer(&mut self, p: Pending, out: &mut Vec<NodeOutput>) -> Result<(), NodeError> {
        let (versions, mut parts): (Vec<u64>, Vec<TensorDict>) = p.shares.into_iter().flatten().unzip();
        let data = if parts.len() == 1 {
            // One worker: its own storage travels, no copy.
            parts.swap_remove(0)
        } else {
            let joined = TensorDict::cat(&parts)?;
            // The parts were copied: their storage goes back to the workers.
            for (worker, part) in parts.into_iter().enumerate() {
                out.push(NodeOutput::Worker {
                    worker,
                    cmd: WorkerCmd::Recycle(part),
                });
            }
            joined
        };
        out.push(NodeOutput::Trainer(FromNode::Batch(Batch {
            node: self.index,
            seq: p.seq,
            weights_version: versions.into_iter().min().unwrap_or(0),
            data,
        })));
        Ok(())
    }

    /// A batch this node produced comes back for reuse. With one worker the
    /// batch is that worker's own storage; otherwise it was a copy and is dropped.
    pub fn recycle(&mut self, data: TensorDict, out: &mut Vec<NodeOutput>) {
        if self.workers == 1 && !self.down {
            out.push(NodeOutput::Worker {
                worker: 0,
                cmd: WorkerCmd::Recycle(data),
            });
        }
    }
}
