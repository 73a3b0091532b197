//! What goes into and comes out of the node machine besides the trainer's
//! messages: the commands it gives its env workers, the events they answer with,
//! the outputs its shell carries out, and the errors it refuses input with.

use std::fmt;
use std::sync::Arc;

use crate::message::FromNode;
use crate::policy::Weights;
use crate::rollout::{Rollout, RolloutState};
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
    /// Answer with the rollout's state (for a checkpoint).
    Snapshot,
    /// Go on from this state (a resumed checkpoint).
    Restore(Box<RolloutState>),
    /// Stop and release everything.
    Stop,
}

/// An env worker's answer to its node, given to [`NodeMachine::on_worker`](super::NodeMachine::on_worker).
#[derive(Clone, Debug, PartialEq)]
pub enum WorkerEvent {
    /// The frames asked for by [`WorkerCmd::Collect`].
    Batch {
        /// Worker index in the node.
        worker: usize,
        /// The node's seq.
        seq: u64,
        /// Weights version used.
        version: u64,
        /// The frames, `[1, frames]`.
        data: TensorDict,
        /// The highest trajectory id in `data` ([`crate::schema::max_traj_id`]),
        /// taken by the worker while the frames are in its own cache: the node,
        /// on another thread, would read the whole id column across cores for it
        /// (a quarter of the actor system's time per in-process batch). Build the
        /// event with [`WorkerEvent::batch`], which computes it.
        max_traj_id: Option<u64>,
    },
    /// The worker failed: an env or policy error, a caught panic, or (seen by the
    /// shell) a dead worker actor.
    Failed {
        /// Worker index.
        worker: usize,
        /// What happened.
        reason: String,
    },
    /// The worker stopped after [`WorkerCmd::Stop`].
    Stopped {
        /// Worker index.
        worker: usize,
    },
    /// Answer to [`WorkerCmd::Snapshot`].
    Snapshot {
        /// Worker index.
        worker: usize,
        /// The rollout's state, or why it cannot be taken.
        state: Result<Box<RolloutState>, String>,
    },
    /// Answer to [`WorkerCmd::Restore`].
    Restored {
        /// Worker index.
        worker: usize,
        /// Done, or why not.
        result: Result<(), String>,
    },
}

impl WorkerEvent {
    /// A worker's share `data` for `seq`, collected with weights `version`.
    pub fn batch(worker: usize, seq: u64, version: u64, data: TensorDict) -> WorkerEvent {
        WorkerEvent::batch_with_max(worker, seq, version, data, None)
    }

    /// [`WorkerEvent::batch`], with the largest trajectory id in `data` when its
    /// collector kept it ([`crate::rollout::Rollout::batch_max_traj_id`]); `None`: read
    /// from `data`.
    pub fn batch_with_max(
        worker: usize,
        seq: u64,
        version: u64,
        data: TensorDict,
        max_traj_id: Option<i64>,
    ) -> WorkerEvent {
        let max_traj_id = match max_traj_id {
            Some(m) => u64::try_from(m).ok(),
            None => crate::schema::max_traj_id(&data),
        };
        WorkerEvent::Batch {
            worker,
            seq,
            version,
            data,
            max_traj_id,
        }
    }
}

/// How a failed worker was restarted: the inputs its new rollout was built from,
/// kept beside it so the shell can log them and tests can check them.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerRestart {
    /// The restart's number for this worker, from 1.
    pub number: u32,
    /// The seed of the new rollout: [`restart_seed`](crate::supervisor::restart_seed)
    /// of the worker's own first seed (the node's base seed plus the worker's first
    /// env index) and `number`, so a rerun restarts with the same seeds.
    pub seed: u64,
    /// Its trajectory ids start at this or beyond: one past the highest id the
    /// worker delivered (0 if none).
    pub skip_traj_ids_below: u64,
    /// Its frame count resumes here: the frames the worker delivered so far.
    pub frames: u64,
    /// The weights loaded into it: those the node was last sent, if any (else the
    /// policy's initial ones).
    pub weights: Option<Arc<Weights>>,
    /// The failure that caused the restart.
    pub cause: String,
}

/// What the node machine wants done.
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
    /// Worker `worker` failed and was rebuilt from the node's spec: go on with
    /// `rollout` in its place (the old one was dropped when it failed). Commands for
    /// the worker that follow this output are meant for the new rollout. A shell
    /// that cannot install it (say, the worker's thread is gone) reports that as one
    /// more [`WorkerEvent::Failed`].
    Replace {
        /// Worker index.
        worker: usize,
        /// What the new rollout was built from.
        restart: WorkerRestart,
        /// The new rollout, ready to collect.
        rollout: Box<Rollout>,
    },
}

impl fmt::Debug for NodeOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeOutput::Worker { worker, cmd } => f
                .debug_struct("Worker")
                .field("worker", worker)
                .field("cmd", cmd)
                .finish(),
            NodeOutput::Trainer(m) => f.debug_tuple("Trainer").field(m).finish(),
            // A rollout holds envs and a policy, which need not be `Debug`.
            NodeOutput::Replace {
                worker,
                restart,
                rollout,
            } => f
                .debug_struct("Replace")
                .field("worker", worker)
                .field("restart", restart)
                .field("envs", &rollout.num_envs())
                .field("frames", &rollout.frames())
                .finish(),
        }
    }
}

/// A message the node refused; it was dropped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NodeError {
    /// A `Continue` while [`MAX_CONTINUES`](super::MAX_CONTINUES) are in flight.
    #[error("Continue {seq} while {pending:?} are still in flight")]
    Busy {
        /// The new seq.
        seq: u64,
        /// The seqs in flight, oldest first.
        pending: Vec<u64>,
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
