//! Node supervision: Continue timeouts, failures, restarts, lost nodes.

use std::time::Duration;

use super::node_state::{Asked, NodeState};
use super::{Output, TrainerError, TrainerMachine};
use crate::message::{Seed, ToNode, UpdateWeights};
use crate::supervisor::{restart_seed, RestartIntensity, Restarts};

/// How the trainer supervises its nodes (off by default: a lost node is lost).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSupervision {
    /// Restarts of one node allowed within a window; past it the failure is an error.
    pub intensity: RestartIntensity,
    /// A `Continue` not answered within this long counts as a node failure (`None`: no
    /// limit). The same as [`RequestDeadlines::batch`](super::RequestDeadlines::batch),
    /// which works with or without supervision (the collector's builder sets that one);
    /// when both are set the shorter counts.
    pub continue_timeout: Option<Duration>,
    /// When a node cannot be restarted (the launcher gave up): in async mode go on
    /// with the other nodes (`true`) or fail the run (`false`, the default).
    pub continue_without_lost_nodes: bool,
    /// `Some(wait)`: nodes join on their own (the external launcher), so a node's
    /// failure is the failure of the peer that held its slot, whatever it sent: the
    /// slot is freed for the next node to join without counting against `intensity`,
    /// an async run goes on with its other nodes whether or not one joins, and a sync
    /// run fails once the slot has had no node deliver for `wait` since its first
    /// failure, naming the slot and the refusals (`open_slots.rs`). `None`: the
    /// trainer's launcher starts the nodes, and the intensity bounds their restarts.
    pub open_slot_wait: Option<Duration>,
}

/// A node being restarted: why it was cut off from the run, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CutOff {
    /// The node.
    pub node: usize,
    /// Why it was cut off (its failure, loss or offence).
    pub cause: String,
    /// When (the machine's clock, as given to [`TrainerMachine::tick`]).
    pub at: Duration,
}

impl CutOff {
    /// Why the run cannot go on without it, `waited` after the cut: names the node,
    /// the cause and the wait.
    pub fn not_back(&self, waited: Duration) -> String {
        format!(
            "cut off for: {}; not back {:.1} s later",
            self.cause,
            waited.as_secs_f64()
        )
    }
}

/// Counters of a supervised run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SupervisionStats {
    /// Restarts of each node over the run.
    pub restarts: Vec<u32>,
    /// Batches refused because they answered a `Continue` of an incarnation that was replaced.
    pub dropped_late: u64,
    /// Batches dropped unyielded because their weights lagged past `max_policy_lag`
    /// (their frames asked again).
    pub dropped_lagging: u64,
    /// Frames of those batches.
    pub frames_dropped_lagging: u64,
    /// Frames in the batches accepted from nodes.
    pub frames_collected: u64,
    /// Elastic runs: nodes that joined over the run, those it started with included (0 otherwise).
    pub joined: u64,
    /// Elastic runs: nodes that left with `leave` (0 otherwise).
    pub left: u64,
    /// Batches the consumer handed back for their storage to be reused (a Rust
    /// learner's `recycle`; a Python batch once Python frees its arrays).
    pub batches_recycled: u64,
}

impl TrainerMachine {
    /// A slot gets a new node (a restart, or an elastic joiner): its trajectory ids start
    /// past every id the slot delivered (a multiple of the lanes, so each env keeps its
    /// lane), unique across every node that held it; it owes nothing its predecessor was
    /// asked and holds no pushed weights yet.
    pub(super) fn new_incarnation(&mut self, node: usize) {
        let lanes: u64 = self.cfg.shares.lanes().max(1);
        let next_seq = self.next_seq;
        let st = &mut self.nodes[node];
        if let Some(max) = st.book.max_traj {
            st.book.traj_offset = max.saturating_add(1).div_ceil(lanes).saturating_mul(lanes);
        }
        st.book.since_update = 0;
        st.book.pushed_version = 0;
        st.incarnation_seq = next_seq;
        st.awaiting.clear();
        self.specs_new_incarnation(node);
    }

    /// Supervises the nodes: a failed node is restarted (see [`Output::RestartNode`])
    /// up to the intensity, then its failure is an error.
    pub fn with_supervision(mut self, sup: NodeSupervision) -> TrainerMachine {
        self.restarts = vec![Restarts::new(sup.intensity); self.cfg.nodes()];
        self.open_slots = vec![None; self.cfg.nodes()];
        self.supervision = Some(sup);
        self.quiet_until = Duration::ZERO;
        self
    }

    /// The node supervision, when on.
    pub fn supervision(&self) -> Option<&NodeSupervision> {
        self.supervision.as_ref()
    }

    /// Restarts, late batches and frames collected so far.
    pub fn stats(&self) -> SupervisionStats {
        SupervisionStats {
            restarts: (0..self.cfg.nodes())
                .map(|i| self.restarts.get(i).map_or(0, Restarts::total))
                .collect(),
            dropped_late: self.dropped_late,
            dropped_lagging: self.lagging_dropped.0,
            frames_dropped_lagging: self.lagging_dropped.1,
            frames_collected: self.frames_collected,
            joined: self.membership_counts().map_or(0, |(j, _)| j),
            left: self.membership_counts().map_or(0, |(_, l)| l),
            batches_recycled: self.recycled,
        }
    }

    /// Every node being restarted, with why it was cut off and when, the longest
    /// waited for first: what a batch that does not come is waiting on.
    pub fn cut_off(&self) -> Vec<CutOff> {
        let mut cut: Vec<CutOff> = (0..self.nodes.len())
            .filter(|&i| self.is_restarting(i))
            .filter_map(|i| {
                let last = self.restarts.get(i)?.history().last()?;
                Some(CutOff {
                    node: i,
                    cause: last.cause.clone(),
                    at: last.at,
                })
            })
            .collect();
        cut.sort_by_key(|c| c.at);
        cut
    }

    /// True while node `node` is being restarted.
    pub fn is_restarting(&self, node: usize) -> bool {
        self.nodes.get(node).is_some_and(|n| n.state.is_restarting())
    }

    /// The clock moved to `now` (since an origin the caller picks): a request
    /// unanswered past its deadline (see [`RequestDeadlines`](super::RequestDeadlines))
    /// counts as a node failure, and so does a `Continue` unanswered for longer than
    /// the batch deadline or `continue_timeout` (the shorter). A `Continue` sent while
    /// the node's previous batch was on its way counts from when that batch was whole.
    /// At shutdown, a node past the shutdown deadline is given up instead (see
    /// [`Self::take_abandoned`]).
    pub fn tick(&mut self, now: Duration, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        self.now = self.now.max(now);
        // Nothing can be overdue before the earliest deadline the last full check
        // saw (see `earliest_deadline`): the tick of every node message is then O(1),
        // not a scan of every node. An elastic run with no node up is the exception:
        // its wait for a joiner is timed by the check itself.
        if self.now < self.quiet_until && !self.waiting_for_a_joiner() {
            return Ok(());
        }
        let r = self.check_overdue(out);
        self.quiet_until = if r.is_ok() {
            self.earliest_deadline()
        } else {
            Duration::ZERO
        };
        r
    }

    /// The `Continue` deadline: the batch deadline or `continue_timeout`, the shorter.
    pub(super) fn continue_limit(&self) -> Option<Duration> {
        let sup_limit = self.supervision.as_ref().and_then(|s| s.continue_timeout);
        match (self.deadlines.batch, sup_limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Every node checked against every deadline at `self.now` (see [`Self::tick`]).
    fn check_overdue(&mut self, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        self.check_deadlines(out)?;
        self.check_membership()?;
        self.check_open_slots()?;
        if self.shutting_down {
            return Ok(());
        }
        let Some(limit) = self.continue_limit() else {
            return Ok(());
        };
        for i in 0..self.nodes.len() {
            // The batch on its way first: the outstanding `Continue` is timed from
            // when that batch is whole, as if it had been sent then.
            if let Some(Asked { seq, frames, since, .. }) = self.nodes[i].state.expected() {
                if self.now.saturating_sub(since) >= limit {
                    let reason = format!(
                        "no answer to Continue seq {seq} ({frames} frames) within {:.3} s",
                        limit.as_secs_f64()
                    );
                    self.node_lost(i, reason, out)?;
                }
            }
        }
        Ok(())
    }

    /// The launcher brought node `node` back: it gets the current weights, its restart
    /// seed, then the `Continue` its failed incarnation lost, under a new seq. Back
    /// after the shutdown began, it is told `Shutdown` (see [`Self::back_at_shutdown`]).
    pub fn node_restarted(&mut self, node: usize, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if node >= self.nodes.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        if self.shutting_down && self.nodes[node].state.is_down() {
            self.back_at_shutdown(node, out);
            return Ok(());
        }
        let Some(held) = self.nodes[node].state.back() else {
            return Ok(());
        };
        let restart = self.restarts.get(node).map_or(0, Restarts::total);
        let next_seq = self.next_seq;
        let unrestored = self.checkpoints.restoring.as_ref().is_some_and(|d| !d[node]);
        if let Some(state) = self
            .checkpoints
            .restore_states
            .get(node)
            .cloned()
            .flatten()
            .filter(|_| unrestored)
        {
            // Lost while restoring: the new incarnation gets the same state, so the run
            // still resumes exactly (it delivered nothing since, its ids need no offset).
            // Nothing is held: no work goes out while restoring.
            debug_assert!(held.is_none(), "work held while restoring");
            let st = &mut self.nodes[node];
            st.incarnation_seq = next_seq;
            st.book.pushed_version = state.weights.as_ref().map_or(0, |w| w.version);
            self.send(node, ToNode::Restore(Box::new(state)), out);
            tracing::info!(node, restart, "node restarted while restoring: its state is sent again");
            return Ok(());
        }
        let seed = restart_seed(self.chain_seed_of(node), restart);
        let weights = self.weights.clone();
        self.new_incarnation(node);
        let st = &mut self.nodes[node];
        if let Some(w) = weights {
            st.book.pushed_version = w.version;
            self.send(node, ToNode::UpdateWeights(UpdateWeights { weights: w }), out);
        }
        self.send(node, ToNode::Seed(Seed { seed }), out);
        tracing::info!(node, restart, seed, "node restarted");
        if let Some(frames) = held {
            if !self.finished {
                self.continue_node(node, frames, out);
            }
        }
        Ok(())
    }

    /// Node `node` came back after the shutdown began, which counted it down while it
    /// restarted (no restart starts at shutdown, and a failed one reports no node, so a
    /// node back now is that one). It is told `Shutdown` too, so that it ends cleanly
    /// rather than find its connection dropped with the run; unless every other node is
    /// down already (the shutdown is over), the shutdown waits for its `down`, within
    /// the shutdown deadline.
    fn back_at_shutdown(&mut self, node: usize, out: &mut Vec<Output>) {
        let wait = !self.all_down();
        tracing::info!(
            node,
            waited_for = wait,
            "node back during the shutdown: it is shut down too"
        );
        self.send(node, ToNode::Shutdown, out);
        if wait {
            self.nodes[node].state = NodeState::Idle;
        } else {
            // Down: it owes nothing the trainer waits for.
            self.nodes[node].awaiting.clear();
        }
    }

    /// The launcher could not bring node `node` back: the failure stands. Sync mode
    /// fails; async mode goes on without the node if `continue_without_lost_nodes`.
    pub fn node_restart_failed(
        &mut self,
        node: usize,
        reason: String,
        out: &mut Vec<Output>,
    ) -> Result<(), TrainerError> {
        if node >= self.nodes.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        if !self.is_restarting(node) {
            return Ok(());
        }
        // The cut that started this restart: the failure names it and the wait.
        let cut = self.cut_off().into_iter().find(|c| c.node == node);
        self.nodes[node].state = NodeState::Down;
        if let Some(done) = self.checkpoints.restoring.as_mut() {
            done[node] = true;
        }
        let reason = match cut {
            Some(c) => format!(
                "{}: restart failed: {reason}",
                c.not_back(self.now.saturating_sub(c.at))
            ),
            None => format!("restart failed: {reason}"),
        };
        tracing::error!(node, %reason, "node not restarted");
        if self.shutting_down {
            if self.all_down() {
                out.push(Output::AllDown);
            }
            return Ok(());
        }
        // A slot nodes join on their own is no node of the run's: the run goes on
        // without whoever held it.
        let go_on = self
            .supervision
            .as_ref()
            .is_some_and(|s| s.continue_without_lost_nodes || s.open_slot_wait.is_some());
        if !self.cfg.sync() && go_on && self.nodes.iter().any(|n| !n.state.is_down()) {
            self.finish_restore_if_done(out)?;
            return Err(TrainerError::NodeLost { node, reason });
        }
        Err(TrainerError::NodeFailed { node, reason })
    }

    /// Node `node` is gone (failed, disconnected, silent). During shutdown it counts
    /// as down. In async mode the run goes on with the nodes left, if any; in sync
    /// mode no batch can be whole any more, so it is an error.
    pub(super) fn node_lost(&mut self, node: usize, reason: String, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        // A checkpoint needs every node: it fails, and what waited for it is served
        // once the node is marked lost (so no work goes to it).
        let aborted = self.checkpoints.taking.take().is_some();
        if aborted {
            let why = format!("node {node} was lost: {reason}");
            tracing::warn!(reason = %why, "checkpoint failed");
            out.push(Output::CheckpointFailed(why));
        }
        let was_restoring = self.checkpoints.restoring.is_some();
        let r = self.node_gone(node, reason, out);
        if matches!(r, Err(TrainerError::NodeFailed { .. })) {
            return r;
        }
        if was_restoring {
            self.finish_restore_if_done(out)?;
        } else if aborted {
            self.resume_after_checkpoint(out)?;
        }
        r
    }

    /// Marks node `node` gone and decides: restart it, go on without it, or fail.
    fn node_gone(&mut self, node: usize, reason: String, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if let Some(done) = self.checkpoints.restoring.as_mut() {
            if !done[node] && self.supervision.is_none() {
                // Lost for good: do not wait for it.
                tracing::warn!(node, %reason, "node lost while restoring the checkpoint");
                done[node] = true;
            }
            // Supervised, it is restarted and sent its state again (see `node_restarted`).
        }
        let st = &mut self.nodes[node].state;
        if st.is_restarting() && !self.shutting_down {
            // A late report about the incarnation being replaced.
            return Ok(());
        }
        let was_down = st.is_down();
        // A batch on its way is lost with the node; the node was released already,
        // so its outstanding `Continue` is the one asked again.
        let lost = st.lose();
        // Nothing it was asked is waited for any more.
        self.nodes[node].awaiting.clear();
        if self.shutting_down {
            if !was_down && self.all_down() {
                out.push(Output::AllDown);
            }
            return Ok(());
        }
        if was_down {
            return Ok(());
        }
        if self.supervision.is_some() {
            return self.supervise(node, reason, lost, out);
        }
        if let Some((n, seed)) = self.chain.at {
            if n == node {
                // The chain goes on without it.
                self.seed_from(node + 1, seed.wrapping_add(self.cfg.envs(node) as u64), out)?;
            }
        }
        // An elastic run goes on with no node too: it waits for one to join (`membership.rs`).
        if !self.cfg.sync() && (self.elastic.is_some() || self.nodes.iter().any(|n| !n.state.is_down())) {
            return Err(TrainerError::NodeLost { node, reason });
        }
        Err(TrainerError::NodeFailed { node, reason })
    }

    /// A supervised node failed (it is down now): restart it within the intensity,
    /// holding the `lost` frames for its next incarnation, else escalate.
    fn supervise(
        &mut self,
        node: usize,
        cause: String,
        lost: Option<usize>,
        out: &mut Vec<Output>,
    ) -> Result<(), TrainerError> {
        if self.open_slot_wait().is_some() {
            return self.open_slot(node, cause, lost, out);
        }
        let now = self.now;
        match self.restarts[node].record(now, cause.clone()) {
            Ok(restart) => {
                tracing::warn!(node, restart, %cause, "node failed; restarting it");
                self.restart_node(node, restart, cause, lost, out)
            }
            Err(esc) => {
                tracing::error!(node, restarts = esc.total_restarts, cause = %esc.cause, "node failed past its restart intensity");
                Err(TrainerError::NodeFailed {
                    node,
                    reason: esc.to_string(),
                })
            }
        }
    }

    /// Restart number `restart` of node `node` for `cause`: it holds the frames `lost`
    /// for its next incarnation, the seeding chain goes on past it, and the launcher is
    /// asked to bring it back.
    pub(super) fn restart_node(
        &mut self,
        node: usize,
        restart: u32,
        cause: String,
        lost: Option<usize>,
        out: &mut Vec<Output>,
    ) -> Result<(), TrainerError> {
        self.nodes[node].state.restart(lost);
        if let Some((n, seed)) = self.chain.at {
            if n == node {
                self.seed_from(node + 1, seed.wrapping_add(self.cfg.envs(node) as u64), out)?;
            }
        }
        out.push(Output::RestartNode { node, restart, cause });
        Ok(())
    }

    /// Nodes still serving (not down, failed or lost).
    pub fn nodes_alive(&self) -> usize {
        self.nodes.iter().filter(|n| !n.state.is_down()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::message::FromNode;

    fn failed(node: usize) -> FromNode {
        FromNode::Failed {
            node,
            reason: "boom".into(),
        }
    }

    #[test]
    fn a_restart_that_fails_names_why_the_node_was_cut_and_how_long_it_was_waited_for() {
        let mut m = machine(config(2, 1, 8, None, true)).with_supervision(supervision(3, None));
        m.tick(ms(1000), &mut Vec::new()).unwrap();
        feed(&mut m, failed(1));
        let cut = CutOff {
            node: 1,
            cause: "boom".into(),
            at: ms(1000),
        };
        assert_eq!(m.cut_off(), vec![cut]);
        m.tick(ms(3500), &mut Vec::new()).unwrap();
        let r = m.node_restart_failed(1, "no node rejoined".into(), &mut Vec::new());
        assert_eq!(
            r,
            Err(TrainerError::NodeFailed {
                node: 1,
                reason: "cut off for: boom; not back 2.5 s later: restart failed: no node rejoined".into()
            })
        );
        assert!(m.cut_off().is_empty(), "down, no longer being restarted");
    }

    #[test]
    fn a_node_lost_mid_round_is_restarted_and_its_share_asked_again_under_a_new_seq() {
        let mut m = machine(config(2, 1, 8, None, true)).with_supervision(supervision(3, None));
        request(&mut m);
        feed(&mut m, batch(0, 0, 1, 4));
        let out = feed(&mut m, failed(1));
        assert!(
            matches!(
                &out[..],
                [Output::RestartNode {
                    node: 1,
                    restart: 1,
                    ..
                }]
            ),
            "{out:?}"
        );
        assert!(m.is_restarting(1));
        assert_eq!(m.outstanding(1), None);
        let mut out = Vec::new();
        m.node_restarted(1, &mut out).unwrap();
        assert_eq!(
            out,
            vec![
                Output::Send {
                    node: 1,
                    msg: ToNode::Seed(Seed {
                        seed: restart_seed(m.chain_seed_of(1), 1)
                    })
                },
                Output::Send {
                    node: 1,
                    msg: ToNode::Continue(crate::message::Continue { seq: 2, frames: 4 })
                },
            ]
        );
        // The failed incarnation's answer is late: dropped, counted, no error.
        let out = feed(&mut m, batch(1, 1, 1, 4));
        assert!(out.is_empty());
        assert_eq!(m.stats().dropped_late, 1);
        let out = feed(&mut m, batch(1, 2, 1, 4));
        assert_eq!(yields(&out).len(), 1, "the round is whole with the share asked again");
        assert_eq!(m.stats().restarts, vec![0, 1]);
    }

    #[test]
    fn work_asked_of_a_restarting_node_is_held_until_it_is_back() {
        let mut m = machine(config(2, 1, 8, None, true)).with_supervision(supervision(3, None));
        request(&mut m);
        feed(&mut m, batch(0, 0, 1, 4));
        feed(&mut m, batch(1, 1, 1, 4));
        feed(&mut m, failed(1));
        let out = request(&mut m);
        assert_eq!(continues(&out), vec![(0, 2, 4)], "only the live node is asked");
        let mut out = Vec::new();
        m.node_restarted(1, &mut out).unwrap();
        assert_eq!(continues(&out), vec![(1, 3, 4)]);
    }

    #[test]
    fn past_the_restart_intensity_a_failure_fails_the_run() {
        let mut m = machine(config(2, 1, 4, None, false)).with_supervision(supervision(0, None));
        request(&mut m);
        let mut out = Vec::new();
        let r = m.on_node(failed(0), &mut out);
        assert!(matches!(r, Err(TrainerError::NodeFailed { node: 0, .. })), "{r:?}");
        assert_eq!(m.nodes_alive(), 1);
    }

    #[test]
    fn unsupervised_async_goes_on_without_a_lost_node_and_sync_fails() {
        let mut m = machine(config(2, 1, 4, None, false));
        request(&mut m);
        let mut out = Vec::new();
        let r = m.on_node(failed(0), &mut out);
        assert!(matches!(r, Err(TrainerError::NodeLost { node: 0, .. })), "{r:?}");
        assert_eq!(m.nodes_alive(), 1);
        assert_eq!(m.outstanding(0), None);
        let out = feed(&mut m, batch(1, 1, 1, 4));
        assert_eq!(continues(&out), vec![(1, 2, 4)], "the node left goes on");

        let mut m = machine(config(2, 1, 8, None, true));
        request(&mut m);
        let r = m.on_node(failed(0), &mut Vec::new());
        assert!(matches!(r, Err(TrainerError::NodeFailed { node: 0, .. })), "{r:?}");
    }

    #[test]
    fn a_node_lost_while_its_batch_waits_is_sent_no_continue_when_it_is_yielded() {
        let mut m = machine(config(2, 1, 4, None, false));
        request(&mut m);
        feed(&mut m, batch(1, 1, 1, 4));
        feed(&mut m, batch(0, 0, 1, 4));
        let _ = m.on_node(failed(0), &mut Vec::new());
        let out = request(&mut m);
        assert_eq!(yields(&out)[0].node, Some(0), "its frames are still yielded");
        assert!(continues(&out).is_empty(), "a lost node gets no work");
    }

    #[test]
    fn a_continue_unanswered_past_the_timeout_fails_the_node() {
        let mut m = machine(config(1, 1, 4, None, false)).with_supervision(supervision(3, Some(ms(1000))));
        request(&mut m);
        let mut out = Vec::new();
        m.tick(ms(999), &mut out).unwrap();
        assert!(out.is_empty());
        m.tick(ms(1000), &mut out).unwrap();
        assert!(
            matches!(&out[..], [Output::RestartNode { node: 0, restart: 1, cause }] if cause.contains("seq 0")),
            "{out:?}"
        );
        // A restarting node is not timed.
        let mut out = Vec::new();
        m.tick(ms(5000), &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn a_released_batch_is_timed_from_its_continue_and_the_next_from_its_arrival() {
        let mut m = machine(config(1, 1, 4, None, false)).with_supervision(supervision(3, Some(ms(1000))));
        request(&mut m);
        let mut out = Vec::new();
        m.tick(ms(900), &mut out).unwrap();
        m.batch_arriving(0, &mut out).unwrap();
        assert_eq!(continues(&out), vec![(0, 1, 4)]);
        m.tick(ms(950), &mut out).unwrap();
        feed(&mut m, batch(0, 0, 1, 4));
        // Seq 1 was sent at 900 but counts from 950, when seq 0's batch was whole.
        let mut out = Vec::new();
        m.tick(ms(1949), &mut out).unwrap();
        assert!(out.is_empty(), "{out:?}");
        m.tick(ms(1950), &mut out).unwrap();
        assert!(
            matches!(&out[..], [Output::RestartNode { node: 0, cause, .. }] if cause.contains("seq 1")),
            "{out:?}"
        );
    }

    #[test]
    fn a_released_batch_that_does_not_arrive_in_time_fails_the_node() {
        let mut m = machine(config(1, 1, 4, None, false)).with_supervision(supervision(3, Some(ms(1000))));
        request(&mut m);
        let mut out = Vec::new();
        m.tick(ms(900), &mut out).unwrap();
        m.batch_arriving(0, &mut out).unwrap();
        let mut out = Vec::new();
        m.tick(ms(1000), &mut out).unwrap();
        assert!(
            matches!(&out[..], [Output::RestartNode { node: 0, cause, .. }] if cause.contains("seq 0")),
            "{out:?}"
        );
        // The Continue asked meanwhile is the one asked again.
        let mut out = Vec::new();
        m.node_restarted(0, &mut out).unwrap();
        assert_eq!(continues(&out), vec![(0, 2, 4)]);
    }

    #[test]
    fn a_failed_restart_in_async_goes_on_without_the_node_when_allowed() {
        let mut sup = supervision(3, None);
        sup.continue_without_lost_nodes = true;
        let mut m = machine(config(2, 1, 4, None, false)).with_supervision(sup);
        request(&mut m);
        feed(&mut m, failed(0));
        let r = m.node_restart_failed(0, "no host".into(), &mut Vec::new());
        assert!(matches!(r, Err(TrainerError::NodeLost { node: 0, .. })), "{r:?}");
        assert!(!m.is_restarting(0));
        assert_eq!(m.nodes_up(), vec![1]);
        assert_eq!(
            m.node_restarted(0, &mut Vec::new()),
            Ok(()),
            "a down node does not come back"
        );
        assert_eq!(m.outstanding(0), None);
    }

    #[test]
    fn shutdown_ends_when_every_node_is_down_and_a_restarting_node_counts_as_down() {
        let mut m = machine(config(3, 1, 4, None, false)).with_supervision(supervision(3, None));
        request(&mut m);
        feed(&mut m, failed(2));
        let mut out = Vec::new();
        m.shutdown(&mut out);
        assert_eq!(
            out,
            vec![
                Output::Send {
                    node: 0,
                    msg: ToNode::Shutdown
                },
                Output::Send {
                    node: 1,
                    msg: ToNode::Shutdown
                },
            ]
        );
        assert!(feed(&mut m, FromNode::Down { node: 0 }).is_empty());
        assert_eq!(m.outstanding(0), None, "a node down has nothing outstanding");
        assert_eq!(feed(&mut m, FromNode::Down { node: 1 }), vec![Output::AllDown]);
        assert!(m.nodes_up().is_empty());
    }

    #[test]
    fn a_node_back_while_the_others_shut_down_is_shut_down_too_and_awaited() {
        let mut m = machine(config(2, 1, 4, None, false)).with_supervision(supervision(3, None));
        request(&mut m);
        feed(&mut m, failed(0));
        let mut out = Vec::new();
        m.shutdown(&mut out);
        assert_eq!(sends(&out), vec![(1, "shutdown")], "node 0 restarts: counted down");
        let mut out = Vec::new();
        m.node_restarted(0, &mut out).unwrap();
        assert_eq!(sends(&out), vec![(0, "shutdown")], "back: told to stop, nothing else");
        assert_eq!(m.nodes_up(), vec![0, 1]);
        assert!(
            feed(&mut m, FromNode::Down { node: 1 }).is_empty(),
            "node 0 owes its down"
        );
        assert_eq!(feed(&mut m, FromNode::Down { node: 0 }), vec![Output::AllDown]);
    }

    #[test]
    fn a_node_back_after_the_shutdown_ended_is_told_to_stop_and_not_awaited() {
        let deadlines = crate::machine::RequestDeadlines {
            shutdown: Some(ms(1000)),
            ..Default::default()
        };
        let mut m = machine(config(2, 1, 4, None, false))
            .with_supervision(supervision(3, None))
            .with_deadlines(deadlines);
        request(&mut m);
        feed(&mut m, failed(0));
        m.shutdown(&mut Vec::new());
        assert_eq!(feed(&mut m, FromNode::Down { node: 1 }), vec![Output::AllDown]);
        let mut out = Vec::new();
        m.node_restarted(0, &mut out).unwrap();
        assert_eq!(sends(&out), vec![(0, "shutdown")]);
        assert!(m.nodes_up().is_empty(), "the shutdown is over: nothing to wait for");
        let mut out = Vec::new();
        m.tick(ms(5000), &mut out).unwrap();
        assert!(
            out.is_empty() && m.take_abandoned().is_empty(),
            "no shutdown deadline runs for it: {out:?}"
        );
    }
}
