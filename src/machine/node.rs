//! The node's decisions, with no IO: split a `Continue` over the env workers,
//! assemble their shares into one `Batch`, fan weights and seeds out, shut down,
//! and supervise the workers: a failed worker is restarted one-for-one (rebuilt
//! from the spec, reseeded, its trajectory ids moved past those it delivered, the
//! current weights applied) and its share asked again; past the restart intensity
//! the node fails, naming the worker, the cause and the restart history.

use std::sync::Arc;
use std::time::Duration;

use crate::message::{Batch, FromNode, ToNode};
use crate::node_spec::NodeSpec;
use crate::node_state::{NodeState, WorkerState};
use crate::policy::Weights;
use crate::rollout::RolloutState;
use crate::schema::keys;
use crate::supervisor::{restart_seed, RestartIntensity, Restarts};
use crate::tensor::{Tensor, TensorDict, TensorError};

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
    /// Replace worker `worker`'s rollout, which failed, by a fresh one: build it from
    /// the node's spec, then reseed it with `seed`, move its trajectory ids to
    /// `skip_traj_ids_below` or beyond, resume its frame count at `frames` and load
    /// `weights` (when `Some`). Commands for the worker that follow this output go to
    /// the new rollout. If the rebuild fails, report it with
    /// [`NodeMachine::on_worker_failed`]: it counts as one more failure.
    RestartWorker {
        /// Worker index.
        worker: usize,
        /// The restart's number for this worker, from 1.
        restart: u32,
        /// The seed of the new rollout: a fixed function of the node's base seed,
        /// the worker index and `restart`.
        seed: u64,
        /// One past the highest trajectory id the worker delivered (0 if none).
        skip_traj_ids_below: u64,
        /// Frames the worker delivered so far.
        frames: u64,
        /// The weights the node was last sent, if any (else the policy's initial ones).
        weights: Option<Arc<Weights>>,
        /// The failure that caused the restart.
        cause: String,
    },
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
    /// Frames asked of each worker.
    frames: usize,
    shares: Vec<Option<(u64, TensorDict)>>,
}

/// What the node knows of one worker's past, for restarting it.
#[derive(Clone, Debug)]
struct WorkerLife {
    restarts: Restarts,
    /// One past the highest trajectory id delivered.
    next_traj_id: u64,
    /// Frames delivered.
    frames: u64,
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
    base_seed: u64,
    weights: Option<Arc<Weights>>,
    lives: Vec<WorkerLife>,
    failed: bool,
    /// A `Snapshot` being answered: its id and the worker states received so far.
    snapshot: Option<(u64, Vec<Option<RolloutState>>)>,
    /// A `Restore` being applied: the workers that confirmed.
    restoring: Option<Vec<bool>>,
}

impl NodeMachine {
    /// Node `index` with `workers` env workers of `envs_per_worker` envs each; base
    /// seed 0 and the default restart intensity (5 restarts within 5 s per worker).
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
            pending: None,
            stopped: vec![false; workers],
            stopping: false,
            down: false,
            base_seed: 0,
            weights: None,
            lives: vec![life; workers],
            failed: false,
            snapshot: None,
            restoring: None,
        }
    }

    /// The machine of the node `spec` describes (one env per worker): its base seed
    /// and restart intensity come from the spec.
    pub fn from_spec(spec: &NodeSpec) -> NodeMachine {
        NodeMachine::new(spec.index, spec.envs_per_node, 1)
            .with_base_seed(spec.rollout.seed)
            .with_intensity(spec.restart_intensity())
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

    /// Sets the weights the workers started with (a remote node's `Welcome` weights),
    /// so a restarted worker gets them too until an `UpdateWeights` replaces them.
    pub fn with_weights(mut self, weights: Arc<Weights>) -> NodeMachine {
        self.weights = Some(weights);
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

    /// The seed worker `worker`'s rollout gets at restart `restart`.
    pub fn restart_seed(&self, worker: usize, restart: u32) -> u64 {
        let own = self.base_seed.wrapping_add(worker as u64 * self.envs_per_worker as u64);
        restart_seed(own, restart)
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
                    ToNode::Snapshot { .. } => "Snapshot",
                    ToNode::Restore(_) => "Restore",
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
                    frames,
                    shares: vec![None; self.workers],
                });
            }
            ToNode::UpdateWeights(u) => {
                let version = u.weights.version;
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
            ToNode::Shutdown => {
                self.pending = None;
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
        if let Some(max) = max_traj_id(&data) {
            life.next_traj_id = life.next_traj_id.max(max + 1);
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

    /// Worker `worker` failed at `now` (time since an origin of the caller's choice)
    /// with `reason`: an env or policy error, a caught panic, a NaN observation, a dead
    /// worker actor, or a failed rebuild. Within the restart intensity the worker is
    /// restarted ([`NodeOutput::RestartWorker`]) and, when its share of the `Continue`
    /// in flight is missing, asked for it again (same seq, same frames), so the node's
    /// `Batch` still comes whole and once. Past the intensity the node reports
    /// `Failed` naming the worker, the cause and the restart history, and drops the
    /// `Continue` in flight. Ignored after `Shutdown` or once the node has failed.
    pub fn on_worker_failed(&mut self, worker: usize, reason: &str, now: Duration, out: &mut Vec<NodeOutput>) {
        if self.stopping || self.failed {
            tracing::debug!(
                node = self.index,
                worker,
                cause = reason,
                "worker failure ignored: node stopping or failed"
            );
            return;
        }
        let Some(life) = self.lives.get_mut(worker) else {
            tracing::error!(
                node = self.index,
                worker,
                cause = reason,
                "failure of an unknown worker"
            );
            return;
        };
        match life.restarts.record(now, reason) {
            Ok(restart) => {
                tracing::warn!(
                    node = self.index,
                    worker,
                    cause = reason,
                    restart,
                    "env worker failed; restarting it"
                );
                let (skip, frames) = (life.next_traj_id, life.frames);
                out.push(NodeOutput::RestartWorker {
                    worker,
                    restart,
                    seed: self.restart_seed(worker, restart),
                    skip_traj_ids_below: skip,
                    frames,
                    weights: self.weights.clone(),
                    cause: reason.to_string(),
                });
                if let Some(p) = self.pending.as_ref().filter(|p| p.shares[worker].is_none()) {
                    out.push(NodeOutput::Worker {
                        worker,
                        cmd: WorkerCmd::Collect {
                            seq: p.seq,
                            frames: p.frames,
                        },
                    });
                }
                if self.snapshot.as_ref().is_some_and(|(_, s)| s[worker].is_none()) {
                    // The new incarnation's state is the truth now.
                    out.push(NodeOutput::Worker {
                        worker,
                        cmd: WorkerCmd::Snapshot,
                    });
                }
                if self.restoring.take().is_some() {
                    self.checkpoint_failed(0, format!("env worker {worker} failed while restoring: {reason}"), out);
                }
            }
            Err(escalation) => {
                tracing::error!(
                    node = self.index,
                    worker,
                    cause = reason,
                    restarts = escalation.total_restarts,
                    "env worker failed past the restart intensity; the node fails"
                );
                self.failed = true;
                self.pending = None;
                self.snapshot = None;
                self.restoring = None;
                out.push(NodeOutput::Trainer(FromNode::Failed {
                    node: self.index,
                    reason: format!(
                        "env worker {worker} failed after {} restarts: {escalation}",
                        escalation.total_restarts
                    ),
                }));
            }
        }
    }

    /// Refuses the `Snapshot` `id` (0: the `Restore`).
    fn checkpoint_failed(&self, id: u64, reason: String, out: &mut Vec<NodeOutput>) {
        tracing::warn!(node = self.index, id, %reason, "checkpoint request failed");
        out.push(NodeOutput::Trainer(FromNode::CheckpointFailed {
            node: self.index,
            id,
            reason,
        }));
    }

    fn begin_snapshot(&mut self, id: u64, out: &mut Vec<NodeOutput>) {
        if let Some(p) = &self.pending {
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

    fn begin_restore(&mut self, state: NodeState, out: &mut Vec<NodeOutput>) {
        if self.pending.is_some() || self.snapshot.is_some() || self.restoring.is_some() {
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
    pub fn on_worker_snapshot(
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
    pub fn on_worker_restored(
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

    fn set_down(&mut self, out: &mut Vec<NodeOutput>) {
        self.down = true;
        out.push(NodeOutput::Trainer(FromNode::Down { node: self.index }));
    }
}

/// The highest trajectory id in a batch, if it has any (ids are non-negative).
fn max_traj_id(data: &TensorDict) -> Option<u64> {
    match data.get(keys::TRAJ_IDS) {
        Ok(Tensor::I64(ids)) => ids.iter().copied().max().and_then(|m| u64::try_from(m).ok()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ndarray::ArrayD;

    use super::*;
    use crate::message::{Continue, Seed, UpdateWeights};

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    /// A worker's share of `n` frames whose trajectory ids are `ids` (cycled).
    fn share(n: usize, ids: &[i64]) -> TensorDict {
        let mut d = TensorDict::new(&[1, n]);
        let v: Vec<i64> = (0..n).map(|i| ids[i % ids.len()]).collect();
        d.set(
            keys::TRAJ_IDS,
            Tensor::I64(ArrayD::from_shape_vec(vec![1, n], v).unwrap()),
        )
        .unwrap();
        d
    }

    fn cont(m: &mut NodeMachine, seq: u64, frames: usize) {
        let mut out = Vec::new();
        m.handle(ToNode::Continue(Continue { seq, frames }), &mut out).unwrap();
    }

    fn trainer_msgs(out: &[NodeOutput]) -> Vec<&FromNode> {
        out.iter()
            .filter_map(|o| match o {
                NodeOutput::Trainer(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_worker_failing_mid_collect_is_restarted_and_asked_again() {
        let mut m = NodeMachine::new(3, 2, 1).with_base_seed(100);
        cont(&mut m, 1, 8);
        let mut out = Vec::new();
        m.on_worker_batch(0, 1, 0, share(4, &[3, 7]), &mut out).unwrap();
        m.on_worker_failed(1, "panic: boom", s(1), &mut out);
        assert_eq!(
            out,
            vec![
                NodeOutput::RestartWorker {
                    worker: 1,
                    restart: 1,
                    seed: restart_seed(101, 1),
                    skip_traj_ids_below: 0,
                    frames: 0,
                    weights: None,
                    cause: "panic: boom".into(),
                },
                NodeOutput::Worker {
                    worker: 1,
                    cmd: WorkerCmd::Collect { seq: 1, frames: 4 },
                },
            ]
        );
        out.clear();
        m.on_worker_batch(1, 1, 0, share(4, &[1, 5]), &mut out).unwrap();
        let msgs = trainer_msgs(&out);
        assert_eq!(msgs.len(), 1, "one whole batch");
        match msgs[0] {
            FromNode::Batch(b) => assert_eq!((b.node, b.seq, b.data.numel()), (3, 1, 8)),
            other => panic!("{other:?}"),
        }
        assert_eq!(m.restarts(1), 1);
        assert_eq!(m.restarts(0), 0);
        // The same seed for the same (base seed, worker, restart): reproducible.
        assert_eq!(
            m.restart_seed(1, 1),
            NodeMachine::new(0, 2, 1).with_base_seed(100).restart_seed(1, 1)
        );
    }

    #[test]
    fn restart_skips_delivered_traj_ids_resumes_frames_and_gets_current_weights() {
        let mut m = NodeMachine::new(0, 1, 1).with_base_seed(5);
        let mut out = Vec::new();
        let w = Arc::new(Weights::new(BTreeMap::new()).with_version(4));
        m.handle(ToNode::UpdateWeights(UpdateWeights { weights: w.clone() }), &mut out)
            .unwrap();
        m.handle(ToNode::Seed(Seed { seed: 40 }), &mut out).unwrap();
        cont(&mut m, 1, 6);
        m.on_worker_batch(0, 1, 4, share(6, &[2, 10, 6]), &mut out).unwrap();
        cont(&mut m, 2, 6);
        out.clear();
        m.on_worker_failed(0, "env 0 failed: bad", s(0), &mut out);
        match &out[0] {
            NodeOutput::RestartWorker {
                seed,
                skip_traj_ids_below,
                frames,
                weights,
                ..
            } => {
                assert_eq!(*seed, restart_seed(40, 1), "from the base seed the last Seed set");
                assert_eq!(*skip_traj_ids_below, 11);
                assert_eq!(*frames, 6);
                assert_eq!(weights.as_ref(), Some(&w));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            out[1],
            NodeOutput::Worker {
                worker: 0,
                cmd: WorkerCmd::Collect { seq: 2, frames: 6 }
            }
        );
    }

    #[test]
    fn a_failure_after_the_share_was_delivered_does_not_ask_again() {
        let mut m = NodeMachine::new(0, 2, 1);
        cont(&mut m, 1, 4);
        let mut out = Vec::new();
        m.on_worker_batch(0, 1, 0, share(2, &[0]), &mut out).unwrap();
        m.on_worker_failed(0, "policy failed", s(0), &mut out);
        assert_eq!(out.len(), 1);
        assert!(matches!(out[0], NodeOutput::RestartWorker { worker: 0, .. }));
        // Idle node: a restart, nothing to ask again.
        let mut m = NodeMachine::new(0, 1, 1);
        out.clear();
        m.on_worker_failed(0, "x", s(0), &mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn past_the_intensity_the_node_fails_naming_worker_cause_and_history() {
        let mut m = NodeMachine::new(2, 2, 1).with_intensity(RestartIntensity::new(2, s(10)).unwrap());
        cont(&mut m, 1, 4);
        let mut out = Vec::new();
        m.on_worker_failed(1, "panic: a", s(0), &mut out);
        m.on_worker_failed(1, "panic: b", s(1), &mut out);
        out.clear();
        m.on_worker_failed(1, "panic: c", s(2), &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        let NodeOutput::Trainer(FromNode::Failed { node, reason }) = &out[0] else {
            panic!("{out:?}");
        };
        assert_eq!(*node, 2);
        for want in [
            "env worker 1 failed after 2 restarts: panic: c",
            "limit 2 restarts within 10.000 s",
            "restart 1 at 0.000 s after panic: a",
            "restart 2 at 1.000 s after panic: b",
        ] {
            assert!(reason.contains(want), "{want:?} not in {reason}");
        }
        assert!(m.has_failed());
        assert_eq!(m.pending_seq(), None, "the Continue in flight is dropped");
        // Later failures (and late shares) produce nothing more.
        out.clear();
        m.on_worker_failed(0, "panic: d", s(3), &mut out);
        assert!(out.is_empty());
        assert!(m.on_worker_batch(0, 1, 0, share(2, &[0]), &mut out).is_err());
    }

    #[test]
    fn failures_spread_wider_than_the_window_restart_forever() {
        let mut m = NodeMachine::new(0, 1, 1).with_intensity(RestartIntensity::new(1, s(5)).unwrap());
        let mut out = Vec::new();
        for i in 0..20 {
            m.on_worker_failed(0, "slow", s(5 * i), &mut out);
        }
        assert!(!m.has_failed());
        assert_eq!(m.restarts(0), 20);
        m.on_worker_failed(0, "fast", s(5 * 19 + 1), &mut out);
        assert!(m.has_failed());
    }

    #[test]
    fn no_restart_while_stopping() {
        let mut m = NodeMachine::new(0, 1, 1);
        let mut out = Vec::new();
        m.handle(ToNode::Shutdown, &mut out).unwrap();
        out.clear();
        m.on_worker_failed(0, "late", s(0), &mut out);
        assert!(out.is_empty());
        m.on_worker_stopped(0, &mut out);
        assert_eq!(out, vec![NodeOutput::Trainer(FromNode::Down { node: 0 })]);
    }

    /// A real rollout state (one Counting env).
    fn rollout_state() -> RolloutState {
        let spec = NodeSpec {
            index: 0,
            env: crate::EnvSpec::new("Counting"),
            policy: crate::PolicySpec::from(crate::PolicyConfig::Constant { value: 1.0 }),
            envs_per_node: 1,
            first_lane: 0,
            lanes: 1,
            rollout: crate::rollout::RolloutConfig {
                frames_per_batch: 2,
                ..Default::default()
            },
            max_restarts: 5,
            restart_window_ms: 5000,
            worker_nice: crate::node_spec::DEFAULT_WORKER_NICE,
        };
        let r = spec.build_workers(&crate::Registry::with_builtins()).unwrap();
        r[0].snapshot().unwrap()
    }

    fn worker_cmds(out: &[NodeOutput]) -> Vec<(usize, &WorkerCmd)> {
        out.iter()
            .filter_map(|o| match o {
                NodeOutput::Worker { worker, cmd } => Some((*worker, cmd)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_snapshot_gathers_every_worker_and_echoes_the_id() {
        let mut m = NodeMachine::new(2, 2, 1).with_base_seed(9);
        let mut out = Vec::new();
        m.handle(ToNode::Snapshot { id: 7 }, &mut out).unwrap();
        assert_eq!(
            worker_cmds(&out),
            vec![(0, &WorkerCmd::Snapshot), (1, &WorkerCmd::Snapshot)]
        );
        out.clear();
        m.on_worker_snapshot(1, Ok(rollout_state()), &mut out).unwrap();
        assert!(out.is_empty(), "one worker still to answer");
        assert!(
            m.on_worker_snapshot(1, Ok(rollout_state()), &mut out).is_err(),
            "a second answer of the same worker is refused"
        );
        m.on_worker_snapshot(0, Ok(rollout_state()), &mut out).unwrap();
        match trainer_msgs(&out).as_slice() {
            [FromNode::Snapshot { node: 2, id: 7, state }] => {
                assert_eq!((state.node, state.base_seed, state.workers.len()), (2, 9, 2));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_snapshot_is_refused_while_a_continue_is_in_flight_and_a_worker_refusal_fails_it() {
        let mut m = NodeMachine::new(0, 1, 1);
        cont(&mut m, 1, 2);
        let mut out = Vec::new();
        m.handle(ToNode::Snapshot { id: 3 }, &mut out).unwrap();
        match trainer_msgs(&out).as_slice() {
            [FromNode::CheckpointFailed { id: 3, reason, .. }] => assert!(reason.contains("in flight"), "{reason}"),
            other => panic!("{other:?}"),
        }
        let mut m = NodeMachine::new(0, 1, 1);
        out.clear();
        m.handle(ToNode::Snapshot { id: 4 }, &mut out).unwrap();
        out.clear();
        m.on_worker_snapshot(0, Err("env `Mine` cannot be checkpointed".into()), &mut out)
            .unwrap();
        match trainer_msgs(&out).as_slice() {
            [FromNode::CheckpointFailed { id: 4, reason, .. }] => assert!(reason.contains("Mine"), "{reason}"),
            other => panic!("{other:?}"),
        }
        // The node is free again: the next snapshot is taken.
        out.clear();
        m.handle(ToNode::Snapshot { id: 5 }, &mut out).unwrap();
        assert_eq!(worker_cmds(&out), vec![(0, &WorkerCmd::Snapshot)]);
    }

    #[test]
    fn a_worker_failing_during_a_snapshot_is_restarted_and_asked_again() {
        let mut m = NodeMachine::new(0, 2, 1);
        let mut out = Vec::new();
        m.handle(ToNode::Snapshot { id: 1 }, &mut out).unwrap();
        m.on_worker_snapshot(0, Ok(rollout_state()), &mut out).unwrap();
        out.clear();
        m.on_worker_failed(1, "panic: boom", s(0), &mut out);
        assert!(matches!(out[0], NodeOutput::RestartWorker { worker: 1, .. }));
        assert_eq!(worker_cmds(&out), vec![(1, &WorkerCmd::Snapshot)]);
        out.clear();
        m.on_worker_snapshot(1, Ok(rollout_state()), &mut out).unwrap();
        assert!(matches!(
            trainer_msgs(&out).as_slice(),
            [FromNode::Snapshot { id: 1, .. }]
        ));
    }

    #[test]
    fn a_restore_loads_weights_and_states_then_confirms_or_refuses() {
        let state = |node, workers: usize| NodeState {
            node,
            base_seed: 33,
            weights: Some(Arc::new(Weights::new(BTreeMap::new()).with_version(6))),
            workers: (0..workers)
                .map(|_| WorkerState {
                    rollout: rollout_state(),
                    next_traj_id: 12,
                    frames: 40,
                })
                .collect(),
        };
        let mut out = Vec::new();
        for (bad, want) in [(state(1, 2), "node 1's"), (state(0, 3), "3 env workers")] {
            let mut m = NodeMachine::new(0, 2, 1);
            out.clear();
            m.handle(ToNode::Restore(Box::new(bad)), &mut out).unwrap();
            match trainer_msgs(&out).as_slice() {
                [FromNode::CheckpointFailed { id: 0, reason, .. }] => assert!(reason.contains(want), "{reason}"),
                other => panic!("{other:?}"),
            }
        }
        let mut m = NodeMachine::new(0, 2, 1);
        out.clear();
        m.handle(ToNode::Restore(Box::new(state(0, 2))), &mut out).unwrap();
        let cmds = worker_cmds(&out);
        assert_eq!(cmds.len(), 4, "weights, then the state, for each worker");
        assert!(matches!(cmds[0], (0, WorkerCmd::SetWeights(w)) if w.version == 6));
        assert!(matches!(cmds[1], (0, WorkerCmd::Restore(_))));
        assert_eq!(m.base_seed(), 33);
        out.clear();
        m.on_worker_restored(0, Ok(()), &mut out).unwrap();
        assert!(out.is_empty());
        m.on_worker_restored(1, Ok(()), &mut out).unwrap();
        assert_eq!(trainer_msgs(&out), vec![&FromNode::Restored { node: 0 }]);
        // A restarted worker skips the restored trajectory ids and counts on from 40 frames.
        out.clear();
        m.on_worker_failed(1, "x", s(0), &mut out);
        assert!(matches!(
            out[0],
            NodeOutput::RestartWorker {
                skip_traj_ids_below: 12,
                frames: 40,
                ..
            }
        ));
        // A worker that cannot restore fails the request.
        let mut m = NodeMachine::new(0, 2, 1);
        out.clear();
        m.handle(ToNode::Restore(Box::new(state(0, 2))), &mut out).unwrap();
        out.clear();
        m.on_worker_restored(1, Err("obs dim".into()), &mut out).unwrap();
        assert!(matches!(
            trainer_msgs(&out).as_slice(),
            [FromNode::CheckpointFailed { id: 0, .. }]
        ));
    }

    #[test]
    fn from_spec_takes_seed_and_intensity() {
        let spec = NodeSpec {
            index: 4,
            env: crate::EnvSpec::new("Counting"),
            policy: crate::PolicySpec::default(),
            envs_per_node: 3,
            first_lane: 0,
            lanes: 3,
            rollout: crate::rollout::RolloutConfig {
                seed: 77,
                ..Default::default()
            },
            max_restarts: 9,
            restart_window_ms: 250,
            worker_nice: crate::node_spec::DEFAULT_WORKER_NICE,
        };
        let m = NodeMachine::from_spec(&spec);
        assert_eq!((m.index(), m.workers(), m.base_seed()), (4, 3, 77));
        assert_eq!(
            m.intensity(),
            RestartIntensity::new(9, Duration::from_millis(250)).unwrap()
        );
    }
}
