//! One `Continue` split over the env workers and their shares joined, in worker
//! order, into the node's one `Batch`; the storage of a yielded batch handed back.

use std::sync::Arc;

use crate::message::{Batch, Continue, FromNode};
use crate::policy::Weights;
use crate::tensor::TensorDict;

use super::{NodeError, NodeMachine, NodeOutput, WorkerCmd};

/// The `Continue` in flight.
pub(super) struct Pending {
    pub(super) seq: u64,
    /// Frames asked of each worker.
    pub(super) frames: usize,
    /// Each worker's share once it came: (weights version, frames).
    pub(super) shares: Vec<Option<(u64, TensorDict)>>,
    /// The weights the node had when the `Continue` came: every share is collected
    /// with them (updates wait in each worker's queue behind its `Collect`, and a
    /// worker restarted meanwhile is rebuilt with these), so the batch has one version.
    pub(super) weights: Option<Arc<Weights>>,
}

impl NodeMachine {
    /// Asks every worker for its equal share of `c`.
    pub(super) fn begin_collect(&mut self, c: Continue, out: &mut Vec<NodeOutput>) -> Result<(), NodeError> {
        if let Some(p) = &self.pending {
            return Err(NodeError::Busy {
                seq: c.seq,
                pending: p.seq,
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
        self.pending = Some(Pending {
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
    /// they ever to differ).
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
            .as_mut()
            .filter(|p| p.seq == seq && worker < p.shares.len())
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
        if !p.shares.iter().all(Option::is_some) {
            return Ok(());
        }
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
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
