//! Checkpoints of a node: a `Snapshot` gathers every worker's rollout state with
//! what the node knows of each worker's past into one [`NodeState`]; a `Restore`
//! loads such a state back (weights, then each worker's rollout) and confirms once
//! every worker did.

use crate::message::FromNode;
use crate::node_state::{NodeState, WorkerState};
use crate::rollout::RolloutState;

use super::{NodeError, NodeMachine, NodeOutput, WorkerCmd};

impl NodeMachine {
    /// Refuses the `Snapshot` `id` (0: the `Restore`).
    pub(super) fn checkpoint_failed(&self, id: u64, reason: String, out: &mut Vec<NodeOutput>) {
        tracing::warn!(node = self.index, id, %reason, "checkpoint request failed");
        out.push(NodeOutput::Trainer(FromNode::CheckpointFailed {
            node: self.index,
            id,
            reason,
        }));
    }

    pub(super) fn begin_snapshot(&mut self, id: u64, out: &mut Vec<NodeOutput>) {
        if let Some(p) = self.pending.front() {
            // The trainer waits for every batch before it asks; this is a protocol slip.
            return self.checkpoint_failed(id, format!("Snapshot while Continue {} is in flight", p.seq), out);
        }
        if self.snapshot.is_some() || self.restoring.is_some() {
            return self.checkpoint_failed(id, "Snapshot while another checkpoint request runs".into(), out);
        }
        self.snapshot = Some((id, vec![None; self.workers]));
        for worker in 0..self.workers {
            out.push(NodeOutput::Worker {
                worker,
                cmd: WorkerCmd::Snapshot,
            });
        }
    }

    pub(super) fn begin_restore(&mut self, state: NodeState, out: &mut Vec<NodeOutput>) {
        if !self.pending.is_empty() || self.snapshot.is_some() || self.restoring.is_some() {
            return self.checkpoint_failed(0, "Restore while the node is busy".into(), out);
        }
        if state.node != self.index {
            return self.checkpoint_failed(
                0,
                format!("the state is node {}'s, this is node {}", state.node, self.index),
                out,
            );
        }
        if state.workers.len() != self.workers {
            return self.checkpoint_failed(
                0,
                format!(
                    "the state has {} env workers, this node has {}",
                    state.workers.len(),
                    self.workers
                ),
                out,
            );
        }
        // Counters travel as u64 but are i64 in batches: anything past that is not a real run.
        if let Some(w) = state
            .workers
            .iter()
            .position(|w| w.frames > i64::MAX as u64 || w.next_traj_id > i64::MAX as u64)
        {
            return self.checkpoint_failed(
                0,
                format!("worker {w}'s frame or trajectory count is out of range"),
                out,
            );
        }
        self.base_seed = state.base_seed;
        self.weights = state.weights.clone();
        self.restoring = Some(vec![false; self.workers]);
        for (worker, w) in state.workers.into_iter().enumerate() {
            self.lives[worker].next_traj_id = w.next_traj_id;
            self.lives[worker].frames = w.frames;
            if let Some(weights) = &state.weights {
                out.push(NodeOutput::Worker {
                    worker,
                    cmd: WorkerCmd::SetWeights(weights.clone()),
                });
            }
            out.push(NodeOutput::Worker {
                worker,
                cmd: WorkerCmd::Restore(Box::new(w.rollout)),
            });
        }
    }

    /// A worker's answer to [`WorkerCmd::Snapshot`]. Once every worker answered the
    /// node sends its [`NodeState`]; a worker that cannot snapshot fails the request.
    pub(super) fn on_worker_snapshot(
        &mut self,
        worker: usize,
        state: Result<RolloutState, String>,
        out: &mut Vec<NodeOutput>,
    ) -> Result<(), NodeError> {
        let Some((id, states)) = self
            .snapshot
            .as_mut()
            .filter(|(_, s)| worker < s.len() && s[worker].is_none())
        else {
            return Err(NodeError::Unexpected { worker, seq: 0 });
        };
        let id = *id;
        match state {
            Ok(s) => states[worker] = Some(s),
            Err(reason) => {
                self.snapshot = None;
                self.checkpoint_failed(id, format!("env worker {worker}: {reason}"), out);
                return Ok(());
            }
        }
        if states.iter().all(Option::is_some) {
            let states = self.snapshot.take().map(|(_, s)| s).unwrap_or_default();
            let workers = states
                .into_iter()
                .flatten()
                .zip(&self.lives)
                .map(|(rollout, life)| WorkerState {
                    rollout,
                    next_traj_id: life.next_traj_id,
                    frames: life.frames,
                })
                .collect();
            out.push(NodeOutput::Trainer(FromNode::Snapshot {
                node: self.index,
                id,
                state: Box::new(NodeState {
                    node: self.index,
                    base_seed: self.base_seed,
                    weights: self.weights.clone(),
                    workers,
                }),
            }));
        }
        Ok(())
    }

    /// A worker's answer to [`WorkerCmd::Restore`]. Once every worker restored the
    /// node answers `Restored`; a worker that cannot fails the request.
    pub(super) fn on_worker_restored(
        &mut self,
        worker: usize,
        result: Result<(), String>,
        out: &mut Vec<NodeOutput>,
    ) -> Result<(), NodeError> {
        let Some(done) = self.restoring.as_mut().filter(|d| worker < d.len() && !d[worker]) else {
            return Err(NodeError::Unexpected { worker, seq: 0 });
        };
        if let Err(reason) = result {
            self.restoring = None;
            self.checkpoint_failed(0, format!("env worker {worker} cannot restore: {reason}"), out);
            return Ok(());
        }
        done[worker] = true;
        if done.iter().all(|d| *d) {
            self.restoring = None;
            out.push(NodeOutput::Trainer(FromNode::Restored { node: self.index }));
        }
        Ok(())
    }
}
