//! One `Continue` split over the env workers and their shares joined, in worker
//! order, into the node's one `Batch`; the storage of a yielded batch handed back.

use crate::message::{Batch, Continue, FromNode};
use crate::schema::keys;
use crate::tensor::{Tensor, TensorDict};

use super::{NodeError, NodeMachine, NodeOutput, WorkerCmd};

/// The `Continue` in flight.
pub(super) struct Pending {
    pub(super) seq: u64,
    /// Frames asked of each worker.
    pub(super) frames: usize,
    /// Each worker's share once it came: (weights version, frames).
    pub(super) shares: Vec<Option<(u64, TensorDict)>>,
    /// The workers that said their share is nearly done.
    pub(super) nearly: Vec<bool>,
    /// `NodeOutput::NearlyDone` was given for this `Continue`.
    pub(super) announced: bool,
}

impl NodeMachine {
    /// Asks every worker for its equal share of `c`. One `Continue` may come while
    /// another is still collected (an early release): the workers take it after the
    /// current one, in order, and it is assembled once that one is done.
    pub(super) fn begin_collect(&mut self, c: Continue, out: &mut Vec<NodeOutput>) -> Result<(), NodeError> {
        if let Some(p) = &self.pending {
            if self.queued.is_some() {
                return Err(NodeError::Busy {
                    seq: c.seq,
                    pending: p.seq,
                });
            }
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
        let next = Pending {
            seq: c.seq,
            frames,
            shares: vec![None; self.workers],
            nearly: vec![false; self.workers],
            announced: false,
        };
        if self.pending.is_some() {
            self.queued = Some(next);
        } else {
            self.pending = Some(next);
        }
        Ok(())
    }

    /// The `Continue` in flight (or the next one) that `seq` names.
    fn pending_mut(&mut self, seq: u64) -> Option<&mut Pending> {
        [self.pending.as_mut(), self.queued.as_mut()]
            .into_iter()
            .flatten()
            .find(|p| p.seq == seq)
    }

    /// Worker `worker` is nearly done with its share of `seq`. Once every worker is,
    /// the shell is told ([`NodeOutput::NearlyDone`]), once per `Continue` and only
    /// for the one in flight with nothing after it (a `Continue` that comes next
    /// was released already). A note about anything else (a share already
    /// replaced, a `Continue` dropped at shutdown) is advice that came too late:
    /// ignored.
    pub(super) fn on_worker_nearly_done(&mut self, worker: usize, seq: u64, out: &mut Vec<NodeOutput>) {
        if self.stopping {
            return;
        }
        let Some(p) = self.pending_mut(seq).filter(|p| worker < p.nearly.len()) else {
            return;
        };
        p.nearly[worker] = true;
        self.announce(out);
    }

    /// [`NodeOutput::NearlyDone`] for the `Continue` in flight, if every worker said
    /// so, nothing comes after it and it was not said yet.
    fn announce(&mut self, out: &mut Vec<NodeOutput>) {
        if self.queued.is_some() {
            return;
        }
        if let Some(p) = self.pending.as_mut() {
            if !p.announced && p.nearly.iter().all(|n| *n) {
                p.announced = true;
                out.push(NodeOutput::NearlyDone);
            }
        }
    }

    /// A worker's share for `seq`, collected with weights `version`. The last share
    /// completes the node's batch: the shares joined in worker order, stamped with
    /// the oldest weights version among them. A share of the next `Continue` (a
    /// worker that went on to it while another still finishes the current one) is
    /// kept for it.
    pub(super) fn on_worker_batch(
        &mut self,
        worker: usize,
        seq: u64,
        version: u64,
        data: TensorDict,
        out: &mut Vec<NodeOutput>,
    ) -> Result<(), NodeError> {
        if self.stopping {
            // Work that was in flight when Shutdown came: dropped on purpose, quietly.
            return Ok(());
        }
        let Some(p) = self.pending_mut(seq).filter(|p| worker < p.shares.len()) else {
            return Err(NodeError::Unexpected { worker, seq });
        };
        if p.shares[worker].is_some() {
            return Err(NodeError::Unexpected { worker, seq });
        }
        let frames = data.numel() as u64;
        let max = max_traj_id(&data);
        p.shares[worker] = Some((version, data));
        let life = &mut self.lives[worker];
        life.frames = life.frames.saturating_add(frames);
        if let Some(max) = max {
            life.next_traj_id = life.next_traj_id.max(max + 1);
        }
        // The one in flight, then the next if it is whole too, in order.
        while self
            .pending
            .as_ref()
            .is_some_and(|p| p.shares.iter().all(Option::is_some))
        {
            let Some(p) = self.pending.take() else {
                break;
            };
            self.pending = self.queued.take();
            self.assemble(p, out)?;
        }
        self.announce(out);
        Ok(())
    }

    /// The node's `Batch` of a `Continue` every worker answered.
    fn assemble(&mut self, p: Pending, out: &mut Vec<NodeOutput>) -> Result<(), NodeError> {
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

/// The highest trajectory id in a batch, if it has any (ids are non-negative). A
/// worker's batch is contiguous: its ids are read as one slice, which the compiler
/// turns into a vector loop (an ndarray iterator over the same 10,000 ids took a
/// fifth of the node's and trainer's instructions per sync round).
fn max_traj_id(data: &TensorDict) -> Option<u64> {
    let max = match data.get(keys::TRAJ_IDS) {
        Ok(Tensor::I64(ids)) => match ids.as_slice_memory_order() {
            Some(s) => s.iter().copied().max(),
            None => ids.iter().copied().max(),
        },
        _ => None,
    };
    max.and_then(|m| u64::try_from(m).ok())
}
