//! Checkpoints: taking one once no batch is in flight (meanwhile no node gets new
//! work), and restoring one before the run starts.

use super::{Output, TrainerError, TrainerMachine};
use crate::checkpoint::{Checkpoint, CheckpointError, TrainerState};
use crate::message::ToNode;
use crate::node_state::NodeState as NodeCheckpoint;
use crate::policy::Weights;

/// Checkpoints being taken or restored, and what waits for them.
#[derive(Debug, Default)]
pub(super) struct Checkpoints {
    /// A checkpoint being taken.
    pub(super) taking: Option<CheckpointRun>,
    /// A checkpoint being restored: the nodes that confirmed.
    pub(super) restoring: Option<Vec<bool>>,
    /// A checkpoint to restore when the run starts.
    pub(super) resume: Option<Box<Checkpoint>>,
    /// While restoring: each node's state, sent again to a node restarted meanwhile.
    pub(super) restore_states: Vec<Option<NodeCheckpoint>>,
    /// The id of the last checkpoint begun (0 before any).
    pub(super) last_id: u64,
    /// Weight pushes asked for during a checkpoint: sent once it ends (`Some(None)`: all nodes).
    pub(super) deferred_push: Option<Option<Vec<usize>>>,
}

/// A checkpoint in progress: which nodes were asked and what they answered.
#[derive(Debug)]
pub(super) struct CheckpointRun {
    /// Its id (see `TrainerMachine::cancel_checkpoint`).
    pub(super) id: u64,
    /// The nodes asked for their state.
    asked: Vec<bool>,
    /// What they answered.
    states: Vec<Option<NodeCheckpoint>>,
}

impl TrainerMachine {
    /// A checkpoint is being taken or restored: no node may be sent new work.
    pub(super) fn checkpointing(&self) -> bool {
        self.checkpoints.taking.is_some() || self.checkpoints.restoring.is_some()
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
        if self.elastic.is_some() {
            return Err(TrainerError::Checkpoint(
                "an elastic run takes no checkpoint: its membership changes and is not part of one".into(),
            ));
        }
        if self.checkpointing() {
            return Err(TrainerError::Checkpoint(
                "another checkpoint is being taken or restored".into(),
            ));
        }
        if let Some(i) = self.nodes.iter().position(|n| !n.state.is_up()) {
            let what = if self.nodes[i].state.is_down() {
                "down"
            } else {
                "restarting"
            };
            return Err(TrainerError::Checkpoint(format!(
                "node {i} is {what}; a checkpoint needs every node"
            )));
        }
        let n = self.nodes.len();
        self.checkpoints.last_id += 1;
        let id = self.checkpoints.last_id;
        self.checkpoints.taking = Some(CheckpointRun {
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
        if self.checkpoints.taking.as_ref().is_some_and(|r| r.id == id) {
            return self.abort_checkpoint(reason, out);
        }
        Ok(())
    }

    /// Asks every idle node not asked yet for its state.
    pub(super) fn advance_checkpoint(&mut self, out: &mut Vec<Output>) {
        if self.chain.at.is_some() || (self.cfg.sync() && self.round.is_some()) {
            return;
        }
        let Some(run) = self.checkpoints.taking.as_mut() else {
            return;
        };
        let id = run.id;
        let mut ask = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if !run.asked[i] && n.state.nothing_in_flight() {
                run.asked[i] = true;
                ask.push(i);
            }
        }
        for i in ask {
            self.send(i, ToNode::Snapshot { id }, out);
        }
    }

    /// Node `node`'s state for checkpoint `id`; the last one completes it.
    pub(super) fn on_snapshot(
        &mut self,
        node: usize,
        id: u64,
        state: NodeCheckpoint,
        out: &mut Vec<Output>,
    ) -> Result<(), TrainerError> {
        let Some(run) = self
            .checkpoints
            .taking
            .as_mut()
            .filter(|r| r.id == id && r.asked[node] && r.states[node].is_none())
        else {
            // A late answer to an abandoned checkpoint, or an invented one: never used.
            return Err(TrainerError::Checkpoint(format!(
                "node {node} sent a snapshot for checkpoint {id}, which is not waiting for it"
            )));
        };
        if state.node != node || state.workers.is_empty() || state.num_envs() != self.cfg.envs(node) {
            let reason = format!(
                "node {node} sent the state of node {} with {} env workers of {} envs in all",
                state.node,
                state.workers.len(),
                state.num_envs()
            );
            return self.abort_checkpoint(reason, out);
        }
        run.states[node] = Some(state);
        if run.states.iter().all(Option::is_some) {
            let run = self.checkpoints.taking.take().expect("checked above");
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

    /// Gives up the checkpoint being taken, if any, and serves what waited.
    pub(super) fn abort_checkpoint(&mut self, reason: String, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.checkpoints.taking.take().is_none() {
            return Ok(());
        }
        tracing::warn!(%reason, "checkpoint failed");
        out.push(Output::CheckpointFailed(reason));
        self.resume_after_checkpoint(out)
    }

    /// Serves what waited for the checkpoint: weight pushes, a seeding chain, requests.
    pub(super) fn resume_after_checkpoint(&mut self, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.checkpointing() || self.chain.at.is_some() {
            return Ok(());
        }
        if let Some(nodes) = self.checkpoints.deferred_push.take() {
            self.push_weights(nodes.as_deref(), out)?;
        }
        if let Some(seed) = self.chain.queued.take() {
            // The chain serves the waiting request when it ends.
            self.set_seed(seed, out);
            return Ok(());
        }
        if std::mem::take(&mut self.deferred) {
            self.request(out)?;
        } else if !self.cfg.sync() {
            self.try_yield_async(out)?;
        }
        // Nodes whose prefetch waited for the checkpoint go on now.
        self.prefetch_idle(out)
    }

    /// The trainer's part of a checkpoint (call between batches).
    pub fn trainer_state(&self) -> TrainerState {
        TrainerState {
            sync: self.cfg.sync(),
            frames_per_batch: self.cfg.frames_per_batch(),
            envs_per_node: self.cfg.shares.envs_per_node().to_vec(),
            frames_yielded: self.frames_yielded,
            batches_yielded: self.batches_yielded,
            next_seq: self.next_seq,
            weights_version: self.version,
            weights: self.weights.clone(),
            chain_seed: self.chain.seed,
            started: self.started,
            ready: self.ready.iter().cloned().collect(),
            frames_collected: self.frames_collected,
            nodes: self.nodes.iter().map(|n| n.book.clone()).collect(),
        }
    }

    /// Whether `checkpoint` fits this run's config.
    fn check_fits(&self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        checkpoint.check_fits(
            self.cfg.sync(),
            self.cfg.frames_per_batch(),
            self.cfg.shares.envs_per_node(),
            self.cfg.total_frames(),
        )
    }

    /// The weights each node collects with in `checkpoint` must have the parameters
    /// of this run's policy for that node (names, dtypes, shapes): the trainer builds
    /// those weights itself, so a checkpoint of another env or policy is refused here,
    /// by name, instead of by whichever node check happens to fire first.
    fn check_weights_fit(&self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        for (node, st) in checkpoint.nodes.iter().enumerate() {
            let (Some(theirs), Some(ours)) = (st.weights.as_deref(), self.initial_weights(node)) else {
                continue;
            };
            if let Some(why) = weights_difference(ours, theirs) {
                return Err(CheckpointError::Mismatch {
                    field: "resume",
                    reason: format!("node {node}'s weights in the checkpoint do not fit this run's policy: {why}"),
                });
            }
        }
        Ok(())
    }

    /// The run will go on from `checkpoint` (see [`Self::start_resume`]); whether it
    /// fits this run's config is checked now, naming the first setting that differs.
    pub fn with_resume(mut self, checkpoint: Checkpoint) -> Result<TrainerMachine, CheckpointError> {
        self.check_fits(&checkpoint)?;
        self.check_weights_fit(&checkpoint)?;
        self.checkpoints.resume = Some(Box::new(checkpoint));
        Ok(self)
    }

    /// Starts restoring the checkpoint given to [`Self::with_resume`], if any
    /// (returns whether there was one): the run's first step, instead of seeding.
    pub fn start_resume(&mut self, out: &mut Vec<Output>) -> Result<bool, CheckpointError> {
        match self.checkpoints.resume.take() {
            Some(c) => self.restore(*c, out).map(|()| true),
            None => Ok(false),
        }
    }

    /// Goes on from `checkpoint` instead of starting afresh: call before anything
    /// else (no seeding chain; the seeds are in the checkpoint). Every node is sent
    /// its state; requests wait until all confirmed. A node that cannot restore
    /// fails the run (see [`FromNode::CheckpointFailed`](crate::message::FromNode::CheckpointFailed)).
    pub fn restore(&mut self, checkpoint: Checkpoint, out: &mut Vec<Output>) -> Result<(), CheckpointError> {
        self.check_fits(&checkpoint)?;
        if self.next_seq != 0 || self.batches_yielded != 0 || self.checkpointing() || self.chain.at.is_some() {
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
        self.chain.seed = t.chain_seed;
        self.started = t.started;
        self.frames_collected = t.frames_collected;
        self.ready = t.ready.into_iter().collect();
        for (n, b) in self.nodes.iter_mut().zip(t.nodes) {
            n.book = b;
            n.incarnation_seq = t.next_seq;
        }
        if self.remaining() == Some(0) {
            self.finished = true;
        }
        self.checkpoints.restoring = Some(vec![false; self.nodes.len()]);
        self.checkpoints.restore_states = nodes.iter().cloned().map(Some).collect();
        for (i, st) in nodes.into_iter().enumerate() {
            self.send(i, ToNode::Restore(Box::new(st)), out);
        }
        tracing::info!(
            batches = self.batches_yielded,
            frames = self.frames_yielded,
            "restoring a checkpoint"
        );
        Ok(())
    }

    /// Node `node` restored its state.
    pub(super) fn on_restored(&mut self, node: usize, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        let Some(done) = self.checkpoints.restoring.as_mut() else {
            return Err(TrainerError::Checkpoint(format!("node {node} restored nothing asked")));
        };
        done[node] = true;
        self.finish_restore_if_done(out)
    }

    /// Once every node restored (or was lost meanwhile), serves what waited.
    pub(super) fn finish_restore_if_done(&mut self, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self
            .checkpoints
            .restoring
            .as_ref()
            .is_some_and(|d| d.iter().all(|x| *x))
        {
            self.checkpoints.restoring = None;
            self.checkpoints.restore_states = Vec::new();
            tracing::info!("every node restored the checkpoint");
            self.resume_after_checkpoint(out)?;
        }
        Ok(())
    }
}

/// How `theirs` differs from `ours` in parameter names, dtypes or shapes, if it does.
fn weights_difference(ours: &Weights, theirs: &Weights) -> Option<String> {
    for (name, here) in &ours.tensors {
        let Some(there) = theirs.tensors.get(name) else {
            return Some(format!("`{name}` is missing"));
        };
        if (there.dtype(), there.shape()) != (here.dtype(), here.shape()) {
            return Some(format!(
                "`{name}` is {:?} {:?} here, {:?} {:?} in the checkpoint",
                here.dtype(),
                here.shape(),
                there.dtype(),
                there.shape()
            ));
        }
    }
    theirs
        .tensors
        .keys()
        .find(|k| !ours.tensors.contains_key(*k))
        .map(|k| format!("`{k}` is not a parameter of this run's policy"))
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::message::FromNode;

    fn snapshots(out: &[Output]) -> Vec<usize> {
        out.iter()
            .filter_map(|o| match o {
                Output::Send {
                    node,
                    msg: ToNode::Snapshot { .. },
                } => Some(*node),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_checkpoint_asks_each_node_once_its_batch_in_flight_arrived() {
        let mut m = machine(config(2, 1, 4, None, false));
        request(&mut m);
        let mut out = Vec::new();
        m.begin_checkpoint(&mut out).unwrap();
        assert!(snapshots(&out).is_empty(), "both nodes collect");
        let out = feed(&mut m, batch(1, 1, 1, 4));
        assert_eq!(snapshots(&out), vec![1]);
        assert!(yields(&out).is_empty(), "the batch waits in the checkpoint");
        assert!(continues(&out).is_empty(), "no node gets work meanwhile");
        assert_eq!(snapshots(&feed(&mut m, batch(0, 0, 1, 4))), vec![0]);
    }

    #[test]
    fn a_released_nodes_batch_on_its_way_holds_the_checkpoint_back() {
        let mut m = machine(config(1, 1, 4, None, false));
        request(&mut m);
        m.batch_arriving(0, &mut Vec::new()).unwrap();
        let mut out = Vec::new();
        m.begin_checkpoint(&mut out).unwrap();
        assert!(out.is_empty());
        // Its released batch is whole, but the Continue sent meanwhile is in flight.
        let out = feed(&mut m, batch(0, 0, 1, 4));
        assert!(snapshots(&out).is_empty(), "{out:?}");
        assert_eq!(snapshots(&feed(&mut m, batch(0, 1, 1, 4))), vec![0]);
    }

    #[test]
    fn a_sync_checkpoint_waits_for_the_whole_round() {
        let mut m = machine(config(2, 1, 8, None, true));
        request(&mut m);
        let mut out = Vec::new();
        m.begin_checkpoint(&mut out).unwrap();
        assert!(snapshots(&feed(&mut m, batch(0, 0, 1, 4))).is_empty());
        assert_eq!(snapshots(&feed(&mut m, batch(1, 1, 1, 4))), vec![0, 1]);
    }

    #[test]
    fn a_cancelled_checkpoint_fails_and_what_waited_is_served() {
        let mut m = machine(config(1, 1, 4, None, false));
        let id = m.begin_checkpoint(&mut Vec::new()).unwrap();
        assert!(request(&mut m).is_empty(), "requests wait for the checkpoint");
        let mut out = Vec::new();
        m.cancel_checkpoint(id, "deadline".into(), &mut out).unwrap();
        assert_eq!(out[0], Output::CheckpointFailed("deadline".into()));
        assert_eq!(continues(&out), vec![(0, 0, 4)]);
        // A late answer to it is refused.
        let r = m.on_node(
            FromNode::CheckpointFailed {
                node: 0,
                id,
                reason: "late".into(),
            },
            &mut Vec::new(),
        );
        assert_eq!(r, Ok(()));
    }

    #[test]
    fn a_snapshot_of_the_wrong_shape_fails_the_checkpoint() {
        let mut m = machine(config(1, 1, 4, None, false));
        let id = m.begin_checkpoint(&mut Vec::new()).unwrap();
        let state = NodeCheckpoint {
            node: 0,
            base_seed: 0,
            weights: None,
            workers: Vec::new(),
        };
        let out = feed(
            &mut m,
            FromNode::Snapshot {
                node: 0,
                id,
                state: Box::new(state),
            },
        );
        assert!(
            matches!(&out[..], [Output::CheckpointFailed(r)] if r.contains("0 env workers")),
            "{out:?}"
        );
        assert!(!m.checkpointing());
    }

    #[test]
    fn a_node_lost_during_a_checkpoint_fails_it() {
        let mut m = machine(config(2, 1, 4, None, false)).with_supervision(supervision(3, None));
        m.begin_checkpoint(&mut Vec::new()).unwrap();
        let out = feed(
            &mut m,
            FromNode::Failed {
                node: 1,
                reason: "boom".into(),
            },
        );
        assert!(
            matches!(&out[0], Output::CheckpointFailed(r) if r.contains("node 1")),
            "{out:?}"
        );
        let r = m.begin_checkpoint(&mut Vec::new());
        assert!(
            matches!(r, Err(TrainerError::Checkpoint(ref why)) if why.contains("restarting")),
            "{r:?}"
        );
    }

    #[test]
    fn a_checkpoint_cannot_start_during_another_or_the_shutdown() {
        let mut m = machine(config(1, 1, 4, None, false));
        m.begin_checkpoint(&mut Vec::new()).unwrap();
        assert!(m.begin_checkpoint(&mut Vec::new()).is_err());
        let mut m = machine(config(1, 1, 4, None, false));
        m.shutdown(&mut Vec::new());
        assert!(m.begin_checkpoint(&mut Vec::new()).is_err());
    }

    #[test]
    fn restoring_waits_for_every_node_before_serving_requests() {
        let mut source = machine(config(2, 1, 4, None, false));
        let trainer = source.trainer_state();
        let nodes = (0..2).map(node_checkpoint).collect();
        let mut m = machine(config(2, 1, 4, None, false));
        let mut out = Vec::new();
        m.restore(Checkpoint { trainer, nodes }, &mut out).unwrap();
        assert_eq!(out.len(), 2, "each node is sent its state");
        assert!(request(&mut m).is_empty());
        assert!(feed(&mut m, FromNode::Restored { node: 0 }).is_empty());
        let out = feed(&mut m, FromNode::Restored { node: 1 });
        assert_eq!(continues(&out), vec![(0, 0, 4), (1, 1, 4)]);
        // Restoring once collection started is refused.
        request(&mut source);
        let again = Checkpoint {
            trainer: m.trainer_state(),
            nodes: Vec::new(),
        };
        assert!(source.restore(again, &mut Vec::new()).is_err());
    }

    #[test]
    fn a_checkpoint_is_taken_once_every_node_sent_its_state_and_holds_the_waiting_batches() {
        let mut m = machine(config(2, 1, 4, None, false));
        request(&mut m);
        // Node 0's batch is yielded and it is asked seq 2.
        feed(&mut m, batch(0, 0, 1, 4));
        let mut out = Vec::new();
        let id = m.begin_checkpoint(&mut out).unwrap();
        assert!(snapshots(&out).is_empty(), "both nodes collect");
        assert_eq!(snapshots(&feed(&mut m, batch(1, 1, 1, 4))), vec![1]);
        assert_eq!(snapshots(&feed(&mut m, batch(0, 2, 1, 4))), vec![0]);
        let snapshot = |node| FromNode::Snapshot {
            node,
            id,
            state: Box::new(node_checkpoint(node)),
        };
        assert!(feed(&mut m, snapshot(1)).is_empty());
        let out = feed(&mut m, snapshot(0));
        let [Output::Checkpoint(c)] = &out[..] else {
            panic!("no checkpoint alone: {out:?}");
        };
        assert_eq!(c.nodes.len(), 2);
        let waiting: Vec<usize> = c.trainer.ready.iter().map(|b| b.node).collect();
        assert_eq!(waiting, vec![1, 0], "the batches that arrived meanwhile are in it");
        assert_eq!(c.trainer.next_seq, 3);
        assert_eq!(c.trainer.batches_yielded, 1);
        assert!(!m.checkpointing());
        // Collection goes on from the waiting batches.
        assert_eq!(yields(&request(&mut m))[0].node, Some(1));
    }
}
