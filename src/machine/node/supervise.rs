//! One-for-one supervision of the env workers: a failed worker is rebuilt from the
//! node's spec (reseeded, its trajectory ids moved past those it delivered, its
//! frame count resumed, the current weights loaded) and asked again for what it
//! owed; past the restart intensity the node fails, naming the worker, the cause
//! and the restart history.

use std::sync::Arc;
use std::time::Duration;

use crate::env::Registry;
use crate::node_spec::NodeSpec;
use crate::policy::Weights;
use crate::rollout::Rollout;
use crate::supervisor::{restart_seed, Restarts};

use super::{NodeMachine, NodeOutput, WorkerCmd, WorkerRestart};

/// What the node knows of one worker's past, for restarting it.
#[derive(Clone, Debug)]
pub(super) struct WorkerLife {
    pub(super) restarts: Restarts,
    /// One past the highest trajectory id delivered.
    pub(super) next_traj_id: u64,
    /// Frames delivered.
    pub(super) frames: u64,
}

/// What failed workers are rebuilt from.
pub(super) struct Rebuild {
    pub(super) spec: NodeSpec,
    pub(super) registry: Registry,
}

impl NodeMachine {
    /// The seed worker `worker`'s rollout gets at restart `restart`: the
    /// [`restart_seed`] of the worker's own first seed (base seed plus its first
    /// env index).
    pub fn restart_seed(&self, worker: usize, restart: u32) -> u64 {
        let own = self.base_seed.wrapping_add(worker as u64 * self.envs_per_worker as u64);
        restart_seed(own, restart)
    }

    /// Worker `worker` failed at `now` (time since an origin of the caller's choice)
    /// with `reason`. Within the restart intensity the worker is rebuilt
    /// ([`NodeOutput::Replace`]) and, when its share of the `Continue` in flight (or
    /// its snapshot) is missing, asked for it again (same seq, same frames), so the
    /// node's `Batch` still comes whole and once; a failed rebuild counts as one
    /// more failure. Past the intensity the node reports `Failed` naming the worker,
    /// the cause and the restart history, and drops the `Continue` in flight.
    /// Ignored after `Shutdown` or once the node has failed.
    pub(super) fn on_worker_failed(&mut self, worker: usize, reason: &str, now: Duration, out: &mut Vec<NodeOutput>) {
        // A loop, not recursion: each failed rebuild is one more failure, bounded by
        // the restart intensity however large it is.
        let mut cause = reason.to_string();
        loop {
            let Some(restart) = self.restart(worker, cause, now, out) else {
                return;
            };
            // A Restore being applied fails with the worker (after its restart is out).
            let restore_failed = self
                .restoring
                .take()
                .map(|_| format!("env worker {worker} failed while restoring: {}", restart.cause));
            let built = self.rebuild(worker, &restart);
            let failed_again = match built {
                Ok(rollout) => {
                    out.push(NodeOutput::Replace {
                        worker,
                        restart,
                        rollout: Box::new(rollout),
                    });
                    self.ask_again(worker, out);
                    None
                }
                Err(e) => {
                    let reason = format!("rebuild after `{}` failed: {e}", restart.cause);
                    tracing::error!(node = self.index, worker, restart = restart.number, %reason, "env worker rebuild failed");
                    Some(reason)
                }
            };
            if let Some(reason) = restore_failed {
                self.checkpoint_failed(0, reason, out);
            }
            match failed_again {
                Some(reason) => cause = reason,
                None => return,
            }
        }
    }

    /// Records the failure: the restart to do, or `None` if there is none (the node
    /// is stopping or failed, the worker unknown, or the intensity is spent and the
    /// node fails now).
    fn restart(
        &mut self,
        worker: usize,
        cause: String,
        now: Duration,
        out: &mut Vec<NodeOutput>,
    ) -> Option<WorkerRestart> {
        if self.stopping || self.failed {
            tracing::debug!(
                node = self.index,
                worker,
                cause = cause.as_str(),
                "worker failure ignored: node stopping or failed"
            );
            return None;
        }
        let Some(life) = self.lives.get_mut(worker) else {
            tracing::error!(
                node = self.index,
                worker,
                cause = cause.as_str(),
                "failure of an unknown worker"
            );
            return None;
        };
        match life.restarts.record(now, &cause) {
            Ok(number) => {
                tracing::warn!(
                    node = self.index,
                    worker,
                    cause = cause.as_str(),
                    restart = number,
                    "env worker failed; restarting it"
                );
                let (skip_traj_ids_below, frames) = (life.next_traj_id, life.frames);
                Some(WorkerRestart {
                    number,
                    seed: self.restart_seed(worker, number),
                    skip_traj_ids_below,
                    frames,
                    weights: self.weights_owed_by(worker),
                    cause,
                })
            }
            Err(escalation) => {
                tracing::error!(
                    node = self.index,
                    worker,
                    cause = cause.as_str(),
                    restarts = escalation.total_restarts,
                    "env worker failed past the restart intensity; the node fails"
                );
                let reason = format!(
                    "env worker {worker} failed after {} restarts: {escalation}",
                    escalation.total_restarts
                );
                self.fail(reason, out);
                None
            }
        }
    }

    /// The weights a restarted worker is rebuilt with: those of the oldest `Continue`
    /// in flight it owes a share of (so the node's batch is collected with one
    /// version; the newer ones follow its share), else the node's current ones.
    fn weights_owed_by(&self, worker: usize) -> Option<Arc<Weights>> {
        match self
            .pending
            .iter()
            .find(|p| p.shares.get(worker).is_some_and(Option::is_none))
        {
            Some(p) => p.weights.clone(),
            None => self.weights.clone(),
        }
    }

    /// Builds worker `worker`'s new rollout as `restart` says, from the node's spec.
    fn rebuild(&self, worker: usize, restart: &WorkerRestart) -> Result<Rollout, String> {
        let Some(rb) = &self.rebuild else {
            return Err("this node has no spec to rebuild workers from".into());
        };
        rb.spec
            .rebuild_worker(
                &rb.registry,
                worker,
                restart.seed,
                restart.skip_traj_ids_below,
                restart.frames,
                restart.weights.as_deref(),
            )
            .map_err(|e| e.to_string())
    }

    /// Asks a restarted worker again for what it owed: its share of each `Continue`
    /// in flight, oldest first, each with the weights it was asked with (the worker
    /// was rebuilt with the first's, [`Self::weights_owed_by`]), then the node's
    /// current weights; its part of the snapshot being taken.
    fn ask_again(&self, worker: usize, out: &mut Vec<NodeOutput>) {
        let same = |a: &Option<Arc<Weights>>, b: &Option<Arc<Weights>>| match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        let mut has = self.weights_owed_by(worker);
        for p in self.pending.iter().filter(|p| p.shares[worker].is_none()) {
            if let (false, Some(w)) = (same(&p.weights, &has), &p.weights) {
                out.push(NodeOutput::Worker {
                    worker,
                    cmd: WorkerCmd::SetWeights(w.clone()),
                });
                has = p.weights.clone();
            }
            out.push(NodeOutput::Worker {
                worker,
                cmd: WorkerCmd::Collect {
                    seq: p.seq,
                    frames: p.frames,
                },
            });
        }
        // The ones that came since follow its shares.
        if let (false, Some(w)) = (same(&self.weights, &has), &self.weights) {
            out.push(NodeOutput::Worker {
                worker,
                cmd: WorkerCmd::SetWeights(w.clone()),
            });
        }
        if self.snapshot.as_ref().is_some_and(|(_, s)| s[worker].is_none()) {
            // The new incarnation's state is the truth now.
            out.push(NodeOutput::Worker {
                worker,
                cmd: WorkerCmd::Snapshot,
            });
        }
    }
}
