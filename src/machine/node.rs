//! The node's decisions, with no IO: split a `Continue` over the env workers,
//! assemble their shares into one `Batch`, fan weights and seeds out, shut down.

use std::sync::Arc;

use crate::message::{Batch, FromNode, ToNode};
use crate::policy::Weights;
use crate::tensor::{TensorDict, TensorError};

/// A command for one env worker.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkerCmd {
    /// Collect `frames` frames for the `Continue` `seq`.
    Collect {
        /// The node's seq.
        seq: u64,
        /// Frames for this worker.
        frames: usize,
    },
    /// Use these weights from the next step on.
    SetWeights(Arc<Weights>),
    /// Reseed: the worker's env `i` gets `seed + i`.
    Seed {
        /// First seed of the worker.
        seed: u64,
    },
    /// Storage of a batch the worker produced, handed back for reuse.
    Recycle(TensorDict),
    /// Stop and release everything.
    Stop,
}

/// What the node machine wants done.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeOutput {
    /// Send a command to worker `worker`.
    Worker {
        /// Worker index.
        worker: usize,
        /// The command.
        cmd: WorkerCmd,
    },
    /// Send a message to the trainer.
    Trainer(FromNode),
}

/// A message the node refused; it was dropped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NodeError {
    /// A `Continue` while another is in flight.
    #[error("Continue {seq} while {pending} is still in flight")]
    Busy {
        /// The new seq.
        seq: u64,
        /// The seq in flight.
        pending: u64,
    },
    /// Frames that do not divide over the workers.
    #[error("{frames} frames do not divide over {workers} env workers")]
    Uneven {
        /// Frames asked.
        frames: usize,
        /// Workers.
        workers: usize,
    },
    /// A worker answered something not asked.
    #[error("worker {worker} answered seq {seq}, which is not in flight")]
    Unexpected {
        /// Worker.
        worker: usize,
        /// Seq.
        seq: u64,
    },
    /// A message after `Shutdown`: the node is stopping or down and takes no more work.
    #[error("{msg} after Shutdown: the node is {state}")]
    ShutDown {
        /// The kind of message refused.
        msg: &'static str,
        /// `stopping` or `down`.
        state: &'static str,
    },
    /// Joining the shares failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

struct Pending {
    seq: u64,
    shares: Vec<Option<(u64, TensorDict)>>,
}

/// The node's state machine.
pub struct NodeMachine {
    index: usize,
    workers: usize,
    envs_per_worker: usize,
    pending: Option<Pending>,
    stopped: Vec<bool>,
    stopping: bool,
    down: bool,
}

impl NodeMachine {
    /// Node `index` with `workers` env workers of `envs_per_worker` envs each.
    pub fn new(index: usize, workers: usize, envs_per_worker: usize) -> NodeMachine {
        NodeMachine {
            index,
            workers,
            envs_per_worker,
            pending: None,
            stopped: vec![false; workers],
            stopping: false,
            down: false,
        }
    }

    /// The node's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Number of env workers.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The seq in flight, if any.
    pub fn pending_seq(&self) -> Option<u64> {
        self.pending.as_ref().map(|p| p.seq)
    }

    /// True once every worker stopped after `Shutdown`.
    pub fn is_down(&self) -> bool {
        self.down
    }

    /// A message from the trainer.
    pub fn handle(&mut self, msg: ToNode, out: &mut Vec<NodeOutput>) -> Result<(), NodeError> {
        if self.stopping {
            // Its workers are stopped or stopping: anything sent to them now would
            // come back as a failure (or, for a second Shutdown, a second Down).
            return Err(NodeError::ShutDown {
                msg: match msg {
                    ToNode::Continue(_) => "Continue",
                    ToNode::UpdateWeights(_) => "UpdateWeights",
                    ToNode::Seed(_) => "Seed",
                    ToNode::Shutdown => "Shutdown",
                },
                state: if self.down { "down" } else { "stopping" },
            });
        }
        match msg {
            ToNode::Continue(c) => {
                if let Some(p) = &self.pending {
                    return Err(NodeError::Busy {
                        seq: c.seq,
                        pending: p.seq,
                    });
                }
                if c.frames % self.workers != 0 || c.frames == 0 {
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
                    shares: vec![None; self.workers],
                });
            }
            ToNode::UpdateWeights(u) => {
                let version = u.weights.version;
                for worker in 0..self.workers {
                    out.push(NodeOutput::Worker {
                        worker,
                        cmd: WorkerCmd::SetWeights(u.weights.clone()),
                    });
                }
                // Workers apply commands in order, so the next Collect already uses them.
                out.push(NodeOutput::Trainer(FromNode::WeightsUpdated {
                    node: self.index,
                    version,
                }));
            }
            ToNode::Seed(s) => {
                let per = self.envs_per_worker as u64;
                for worker in 0..self.workers {
                    out.push(NodeOutput::Worker {
                        worker,
                        cmd: WorkerCmd::Seed {
                            seed: s.seed.wrapping_add(worker as u64 * per),
                        },
                    });
                }
                out.push(NodeOutput::Trainer(FromNode::Seeded {
                    node: self.index,
                    next_seed: s.seed.wrapping_add(self.workers as u64 * per),
                }));
            }
            ToNode::Shutdown => {
                self.pending = None;
                self.stopping = true;
                for worker in 0..self.workers {
                    if !self.stopped[worker] {
                        out.push(NodeOutput::Worker {
                            worker,
                            cmd: WorkerCmd::Stop,
                        });
                    }
                }
                if self.stopped.iter().all(|s| *s) {
                    self.set_down(out);
                }
            }
        }
        Ok(())
    }

    /// A worker's share for `seq`, collected with weights `version`.
    pub fn on_worker_batch(
        &mut self,
        worker: usize,
        seq: u64,
        version: u64,
        data: TensorDict,
        out: &mut Vec<NodeOutput>,
    ) -> Result<(), NodeError> {
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
        p.shares[worker] = Some((version, data));
        if p.shares.iter().all(Option::is_some) {
            let p = self.pending.take().expect("pending checked above");
            let (versions, mut parts): (Vec<u64>, Vec<TensorDict>) = p.shares.into_iter().flatten().unzip();
            let data = if parts.len() == 1 {
                parts.pop().expect("one part")
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
        }
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

    /// A worker stopped (after `Stop`).
    pub fn on_worker_stopped(&mut self, worker: usize, out: &mut Vec<NodeOutput>) {
        if let Some(s) = self.stopped.get_mut(worker) {
            *s = true;
        }
        if !self.down && self.stopped.iter().all(|s| *s) {
            self.set_down(out);
        }
    }

    /// A worker failed; the node reports it (supervision decides what follows).
    pub fn on_worker_failed(&mut self, worker: usize, reason: &str, out: &mut Vec<NodeOutput>) {
        out.push(NodeOutput::Trainer(FromNode::Failed {
            node: self.index,
            reason: format!("env worker {worker}: {reason}"),
        }));
    }

    fn set_down(&mut self, out: &mut Vec<NodeOutput>) {
        self.down = true;
        out.push(NodeOutput::Trainer(FromNode::Down { node: self.index }));
    }
}
