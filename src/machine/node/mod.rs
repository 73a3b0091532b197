//! The node's decisions, with no IO: split a `Continue` over the env workers,
//! assemble their shares into one `Batch`, fan weights and seeds out, take and
//! restore checkpoints, shut down, and supervise the workers (a failed worker is
//! rebuilt from the node's spec and asked again for its share).
//!
//! Two entry points take everything that happens to a node: [`NodeMachine::handle`]
//! for the trainer's messages and [`NodeMachine::on_worker`] for the workers'
//! events. A shell (the node actor, the testkit's harness) carries out the
//! [`NodeOutput`]s and feeds the answers back; it decides nothing.

mod assembly;
mod checkpoint;
mod messages;
mod supervise;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use crate::env::Registry;
use crate::message::{FromNode, ToNode};
use crate::node_spec::NodeSpec;
use crate::policy::Weights;
use crate::rollout::RolloutState;
use crate::supervisor::{RestartIntensity, Restarts};

use assembly::InFlight;
pub use assembly::MAX_CONTINUES;
pub use messages::{NodeError, NodeOutput, WorkerCmd, WorkerEvent, WorkerRestart};
use supervise::{Rebuild, WorkerLife};

/// The node's state machine.
///
/// # Examples
///
/// A node of two workers splits a `Continue` and answers once both shares came:
///
/// ```
/// use std::time::Duration;
///
/// use rollout::machine::node::{NodeMachine, NodeOutput, WorkerCmd, WorkerEvent};
/// use rollout::message::{Continue, FromNode, ToNode};
/// use rollout::TensorDict;
///
/// let mut node = NodeMachine::new(0, 2, 1);
/// let mut out = Vec::new();
/// node.handle(ToNode::Continue(Continue { seq: 1, frames: 4 }), &mut out)?;
/// assert!(matches!(
///     out[..],
///     [
///         NodeOutput::Worker { worker: 0, cmd: WorkerCmd::Collect { seq: 1, frames: 2 } },
///         NodeOutput::Worker { worker: 1, cmd: WorkerCmd::Collect { seq: 1, frames: 2 } },
///     ]
/// ));
/// out.clear();
/// for worker in [1, 0] {
///     let data = TensorDict::new(&[1, 2]);
///     let share = WorkerEvent::batch(worker, 1, 0, data);
///     node.on_worker(share, Duration::ZERO, &mut out)?;
/// }
/// let batch = out.iter().find_map(|o| match o {
///     NodeOutput::Trainer(FromNode::Batch(b)) => Some(b),
///     _ => None,
/// });
/// assert_eq!(batch.map(|b| (b.seq, b.data.batch_size())), Some((1, &[2usize, 2][..])));
/// # Ok::<(), rollout::machine::NodeError>(())
/// ```
pub struct NodeMachine {
    index: usize,
    workers: usize,
    envs_per_worker: usize,
    /// The `Continue`s in flight, oldest first (at most [`MAX_CONTINUES`]).
    pending: InFlight,
    stopped: Vec<bool>,
    stopping: bool,
    down: bool,
    base_seed: u64,
    weights: Option<Arc<Weights>>,
    lives: Vec<WorkerLife>,
    failed: bool,
    /// What failed workers are rebuilt from; without it each rebuild fails.
    rebuild: Option<Rebuild>,
    /// A `Snapshot` being answered: its id and the worker states received so far.
    snapshot: Option<(u64, Vec<Option<RolloutState>>)>,
    /// A `Restore` being applied: the workers that confirmed.
    restoring: Option<Vec<bool>>,
    /// The policy's weights it waits for (welcomed without them, for an env whose
    /// specs the trainer learns from the nodes): what they are, for the failure of a
    /// `Continue` that comes first.
    awaiting_weights: Option<String>,
}

impl NodeMachine {
    /// Node `index` with `workers` env workers of `envs_per_worker` envs each; base
    /// seed 0, the default restart intensity (5 restarts within 5 s per worker) and
    /// no spec to rebuild failed workers from (see [`Self::with_rebuild`]).
    pub fn new(index: usize, workers: usize, envs_per_worker: usize) -> NodeMachine {
        let life = WorkerLife {
            restarts: Restarts::new(RestartIntensity::default()),
            next_traj_id: 0,
            frames: 0,
        };
        NodeMachine {
            index,
            workers,
            envs_per_worker,
            pending: InFlight::new(),
            stopped: vec![false; workers],
            stopping: false,
            down: false,
            base_seed: 0,
            weights: None,
            lives: vec![life; workers],
            failed: false,
            rebuild: None,
            snapshot: None,
            restoring: None,
            awaiting_weights: None,
        }
    }

    /// The machine of the node `spec` describes (`envs_per_worker` envs per worker;
    /// a spec whose counts do not divide is refused by [`NodeSpec::workers`] before
    /// any worker is built, and gets one worker per env here): its base seed and
    /// restart intensity come from the spec.
    pub fn from_spec(spec: &NodeSpec) -> NodeMachine {
        let (workers, per) = match spec.workers() {
            Ok(w) => (w, spec.envs_per_worker),
            Err(_) => (spec.envs_per_node, 1),
        };
        NodeMachine::new(spec.index, workers, per)
            .with_base_seed(spec.rollout.seed)
            .with_intensity(spec.restart_intensity())
    }

    /// Rebuilds a failed worker `w` from `spec` and `registry`
    /// ([`NodeSpec::rebuild_worker`]). Without it a failed worker cannot be rebuilt:
    /// each attempt counts as one more failure, so the node fails once the restart
    /// intensity is spent.
    pub fn with_rebuild(mut self, spec: NodeSpec, registry: Registry) -> NodeMachine {
        self.rebuild = Some(Rebuild { spec, registry });
        self
    }

    /// Sets the base seed: worker `w`'s first env was seeded `seed + w * envs_per_worker`.
    /// A later `Seed` message replaces it. Restart seeds derive from it.
    pub fn with_base_seed(mut self, seed: u64) -> NodeMachine {
        self.base_seed = seed;
        self
    }

    /// Sets the restart intensity of each worker (and forgets past restarts).
    pub fn with_intensity(mut self, intensity: RestartIntensity) -> NodeMachine {
        for l in &mut self.lives {
            l.restarts = Restarts::new(intensity);
        }
        self
    }

    /// Sets the weights the workers started with (the trainer's: version 0, handed to
    /// a local node at construction and to a remote one in `Welcome`), so a restarted
    /// worker gets them too until an `UpdateWeights` replaces them, and an update of
    /// another layout is refused (the node reports `Failed` naming the difference).
    pub fn with_weights(mut self, weights: Arc<Weights>) -> NodeMachine {
        self.weights = Some(weights);
        self
    }

    /// The node was given no weights and its policy has some (`needed` says which):
    /// it waits for an `UpdateWeights` before it collects, and a `Continue` that comes
    /// first fails it (`Failed`, naming why) rather than act with weights it invented.
    pub fn awaiting_weights(mut self, needed: String) -> NodeMachine {
        self.awaiting_weights = Some(needed);
        self
    }

    /// The base seed restart seeds derive from.
    pub fn base_seed(&self) -> u64 {
        self.base_seed
    }

    /// The weights a restarted worker gets.
    pub fn weights(&self) -> Option<&Arc<Weights>> {
        self.weights.as_ref()
    }

    /// The restart intensity of each worker.
    pub fn intensity(&self) -> RestartIntensity {
        self.lives
            .first()
            .map_or_else(RestartIntensity::default, |l| l.restarts.intensity())
    }

    /// Restarts of worker `worker` so far.
    pub fn restarts(&self, worker: usize) -> u32 {
        self.lives.get(worker).map_or(0, |l| l.restarts.total())
    }

    /// True once a worker failed past the restart intensity and the node reported `Failed`.
    pub fn has_failed(&self) -> bool {
        self.failed
    }

    /// The node's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Number of env workers.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The seq in flight answered next, if any.
    pub fn pending_seq(&self) -> Option<u64> {
        self.pending.front().map(|p| p.seq)
    }

    /// Every seq in flight, oldest (answered first) first.
    pub fn pending_seqs(&self) -> Vec<u64> {
        self.pending.iter().map(|p| p.seq).collect()
    }

    /// True from `Shutdown` on: the workers are told to stop, and their batches in
    /// flight are dropped.
    pub fn is_stopping(&self) -> bool {
        self.stopping
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
                    ToNode::Snapshot { .. } => "Snapshot",
                    ToNode::Restore(_) => "Restore",
                },
                state: if self.down { "down" } else { "stopping" },
            });
        }
        match msg {
            ToNode::Continue(c) => {
                if let Some(needed) = &self.awaiting_weights {
                    let reason = format!(
                        "a continue (seq {}) came before any weights: the trainer's welcome had none and no \
                         update_weights came, and the policy needs {needed}",
                        c.seq
                    );
                    tracing::error!(node = self.index, %reason, "cannot collect");
                    self.fail(reason, out);
                    return Ok(());
                }
                return self.begin_collect(c, out);
            }
            ToNode::UpdateWeights(u) => {
                self.awaiting_weights = None;
                let version = u.weights.version;
                // Weights of another layout would fail every worker, and each rebuild
                // with them again: the node fails at once, naming what does not fit.
                if let Some(bad) = self.weights.as_ref().and_then(|w| w.check_layout(&u.weights).err()) {
                    tracing::error!(node = self.index, version, error = %bad, "weights the policy cannot use");
                    self.fail(format!("cannot use the weights of version {version}: {bad}"), out);
                    return Ok(());
                }
                self.weights = Some(u.weights.clone());
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
                self.base_seed = s.seed;
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
            ToNode::Snapshot { id } => self.begin_snapshot(id, out),
            ToNode::Restore(state) => self.begin_restore(*state, out),
            ToNode::Shutdown => self.begin_shutdown(out),
        }
        Ok(())
    }

    /// An event of one of the node's workers, at `now` (time since an origin of the
    /// caller's choice; it paces the restart intensity). This is the whole of what
    /// a worker's answer does to the node: a share completes the batch or waits for
    /// the others, a failure restarts the worker (see [`NodeOutput::Replace`]) or
    /// fails the node, a snapshot or restore answer completes or fails the
    /// checkpoint request, a stop brings the node down once every worker stopped.
    /// An answer to nothing asked is refused and changes nothing.
    pub fn on_worker(&mut self, event: WorkerEvent, now: Duration, out: &mut Vec<NodeOutput>) -> Result<(), NodeError> {
        match event {
            WorkerEvent::Batch {
                worker,
                seq,
                version,
                data,
                max_traj_id,
            } => self.on_worker_batch(worker, seq, version, data, max_traj_id, out),
            WorkerEvent::Failed { worker, reason } => {
                self.on_worker_failed(worker, &reason, now, out);
                Ok(())
            }
            WorkerEvent::Stopped { worker } => {
                self.on_worker_stopped(worker, out);
                Ok(())
            }
            WorkerEvent::Snapshot { worker, state } => self.on_worker_snapshot(worker, state.map(|s| *s), out),
            WorkerEvent::Restored { worker, result } => self.on_worker_restored(worker, result, out),
        }
    }

    /// `Shutdown`: drops whatever is in flight and stops every worker still running.
    fn begin_shutdown(&mut self, out: &mut Vec<NodeOutput>) {
        self.pending.clear();
        self.snapshot = None;
        self.restoring = None;
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

    /// A worker stopped (after `Stop`).
    fn on_worker_stopped(&mut self, worker: usize, out: &mut Vec<NodeOutput>) {
        if let Some(s) = self.stopped.get_mut(worker) {
            *s = true;
        }
        if !self.down && self.stopped.iter().all(|s| *s) {
            self.set_down(out);
        }
    }

    /// The node cannot go on: it reports `Failed` with `reason` and drops what is in flight.
    pub(super) fn fail(&mut self, reason: String, out: &mut Vec<NodeOutput>) {
        self.failed = true;
        self.pending.clear();
        self.snapshot = None;
        self.restoring = None;
        out.push(NodeOutput::Trainer(FromNode::Failed {
            node: self.index,
            reason,
        }));
    }

    fn set_down(&mut self, out: &mut Vec<NodeOutput>) {
        self.down = true;
        out.push(NodeOutput::Trainer(FromNode::Down { node: self.index }));
    }
}
