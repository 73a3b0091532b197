//! Elastic membership (async runs): nodes join while the run goes on and leave
//! without failing it.
//!
//! The trainer has a slot per node it may hold at once (`TrainerConfig::nodes`, the
//! run's maximum); a slot no node holds is `Down`. A node that joins takes a free
//! slot and gets, before its first `Continue`, the stored weights (when any were
//! stored) and the next seed of the chain; a node that leaves (`leave`) or is lost
//! is neither restarted nor waited for, and its slot is free again. The frames its
//! `Continue` in flight would have brought are collected by the others (async: every
//! node collects until the run has its `total_frames`). Trajectory ids stay unique
//! across every node that ever held a slot: a joiner's ids are shifted past the
//! highest id its slot delivered before (as after a restart, `rounds.rs`). When no
//! node is left the run waits `empty_timeout` for a joiner, then fails.

use std::time::Duration;

use super::node_state::NodeState;
use super::{ConfigError, Output, TrainerError, TrainerMachine};
use crate::message::{Seed, ToNode, UpdateWeights};

/// How an elastic run's membership may change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    /// Nodes that must have joined before the run starts (at least 1; at most the
    /// run's `nodes`, its maximum).
    pub min_nodes: usize,
    /// With no node left, how long the run waits for one to join before it fails.
    pub empty_timeout: Duration,
}

/// The elastic run's books, beside each node's state.
#[derive(Debug)]
pub(super) struct Elastic {
    /// The settings.
    pub(super) membership: Membership,
    /// Since when no node is up (machine clock), while none is.
    pub(super) empty_since: Option<Duration>,
    /// The seed the next joiner gets: the chain's end, moved on by each joiner's envs.
    pub(super) next_seed: u64,
    /// Joiners the running seed chain had already passed: seeded when it ends.
    pub(super) behind_chain: Vec<usize>,
    /// Nodes that joined over the run (those at the start included).
    pub(super) joined: u64,
    /// Nodes that left with `leave`.
    pub(super) left: u64,
}

impl TrainerMachine {
    /// Makes the run elastic: it starts once `min_nodes` nodes are in (see
    /// [`Self::start_with`]), takes nodes that join up to `nodes` at once
    /// ([`Self::node_joined`]) and goes on when nodes leave or are lost. Async only;
    /// not with node supervision (a lost node is not restarted) nor a resumed
    /// checkpoint (membership is not part of one).
    pub fn with_elastic(mut self, m: Membership) -> Result<TrainerMachine, ConfigError> {
        let err = |field: &'static str, reason: String| ConfigError { field, reason };
        if m.min_nodes == 0 {
            return Err(err("min_nodes", "must be at least 1".into()));
        }
        if m.min_nodes > self.cfg.nodes() {
            return Err(err(
                "min_nodes",
                format!("{} is more than max_nodes ({})", m.min_nodes, self.cfg.nodes()),
            ));
        }
        if self.cfg.sync() {
            return Err(err(
                "sync",
                "elastic membership is for async runs: a sync batch needs a share of every node".into(),
            ));
        }
        if self.supervision.is_some() {
            return Err(err(
                "node_max_restarts",
                "an elastic run restarts no node: one that is lost leaves, and others may join".into(),
            ));
        }
        if self.checkpoints.resume.is_some() {
            return Err(err(
                "resume",
                "an elastic run cannot resume a checkpoint: its membership is not part of one".into(),
            ));
        }
        if m.empty_timeout.is_zero() {
            return Err(err("join_timeout", "must be longer than zero".into()));
        }
        self.elastic = Some(Elastic {
            membership: m,
            empty_since: None,
            next_seed: 0,
            behind_chain: Vec::new(),
            joined: 0,
            left: 0,
        });
        Ok(self)
    }

    /// The elastic membership settings, when the run is elastic.
    pub fn membership(&self) -> Option<&Membership> {
        self.elastic.as_ref().map(|e| &e.membership)
    }

    /// Elastic: the nodes in `members` hold their slots as the run starts; every other
    /// slot is free (`Down`) until a node joins it. Call before the first message.
    pub fn start_with(&mut self, members: &[usize]) {
        let Some(e) = self.elastic.as_mut() else {
            return;
        };
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if !members.contains(&i) {
                n.state = NodeState::Down;
            }
        }
        e.joined = members.len() as u64;
    }

    /// Elastic: a node joined slot `node` mid-run (its connection is up, its `ready`
    /// follows). It gets the stored weights if any were stored (it was welcomed with
    /// version 0), the next seed of the chain, and, once the run has started, its
    /// first `Continue` at once. Refused when the run is not elastic, is shutting
    /// down, or the slot is held.
    pub fn node_joined(&mut self, node: usize, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if node >= self.nodes.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        let refuse = |reason: &str| {
            Err(TrainerError::JoinRefused {
                node,
                reason: reason.into(),
            })
        };
        if self.elastic.is_none() {
            return refuse("this run has a fixed set of nodes");
        }
        if self.shutting_down {
            return refuse("the run is shutting down");
        }
        if !self.nodes[node].state.is_down() {
            return refuse("its slot is held by another node");
        }
        self.nodes[node].state = NodeState::Idle;
        self.new_incarnation(node);
        let envs = self.cfg.envs(node) as u64;
        let chain_at = self.chain.at.map(|(at, _)| at);
        let Some(e) = self.elastic.as_mut() else {
            return refuse("this run has a fixed set of nodes");
        };
        e.empty_since = None;
        e.joined += 1;
        // The seed: a running chain that has not reached this slot seeds it on its
        // way; one that passed it seeds it when it ends; else the next of the chain.
        let seed = match chain_at {
            Some(at) if at < node => None,
            Some(_) => {
                e.behind_chain.push(node);
                None
            }
            None => {
                let s = e.next_seed;
                e.next_seed = s.wrapping_add(envs);
                Some(s)
            }
        };
        if let Some(w) = self.weights.clone() {
            self.nodes[node].book.pushed_version = w.version;
            self.send(node, ToNode::UpdateWeights(UpdateWeights { weights: w }), out);
        }
        if let Some(seed) = seed {
            self.send(node, ToNode::Seed(Seed { seed }), out);
        }
        tracing::info!(node, ?seed, version = self.version, "node joined");
        let quiet = self.chain.at.is_none() && !self.checkpointing();
        if self.started && !self.finished && quiet && self.remaining() != Some(0) {
            self.continue_node(node, self.cfg.shares.node_share(), out);
        }
        Ok(())
    }

    /// Node `node` said `leave`. Elastic: it is down, its slot free, nothing it was
    /// asked is waited for (its `Continue` in flight is collected by the others).
    /// Fixed runs: a node that leaves is a lost node (restarted when supervised).
    pub(super) fn node_left(&mut self, node: usize, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        let reason = "the node left (leave)".to_string();
        if self.elastic.is_none() {
            return self.node_lost(node, reason, out);
        }
        if self.nodes[node].state.is_down() {
            return Ok(());
        }
        if let Some(e) = self.elastic.as_mut() {
            e.left += 1;
        }
        match self.node_lost(node, reason, out) {
            // Leaving is no loss: the run goes on, nothing to report.
            Err(TrainerError::NodeLost { .. }) => {
                tracing::info!(node, "node left");
                Ok(())
            }
            r => r,
        }
    }

    /// Elastic, with no node up and the run not over: [`Self::check_membership`] times
    /// the wait for a joiner, so every tick must run it.
    pub(super) fn waiting_for_a_joiner(&self) -> bool {
        self.elastic.is_some() && !(self.finished || self.shutting_down) && !self.nodes.iter().any(|n| n.state.is_up())
    }

    /// Elastic, with no node up: the run fails once none joined for `empty_timeout`.
    pub(super) fn check_membership(&mut self) -> Result<(), TrainerError> {
        if self.elastic.is_none() {
            return Ok(());
        }
        let up = self.nodes.iter().any(|n| n.state.is_up());
        let (now, finished) = (self.now, self.finished || self.shutting_down);
        let Some(e) = self.elastic.as_mut() else {
            return Ok(());
        };
        if up || finished {
            e.empty_since = None;
            return Ok(());
        }
        let since = *e.empty_since.get_or_insert(now);
        let limit = e.membership.empty_timeout;
        if now.saturating_sub(since) >= limit {
            e.empty_since = None;
            return Err(TrainerError::NoNodes(format!(
                "no node left in the elastic run and none joined within {:.1} s",
                limit.as_secs_f64()
            )));
        }
        Ok(())
    }

    /// The seed chain ended at `next`: joiners get seeds from there, and those that
    /// joined behind it get theirs now.
    pub(super) fn chain_ended(&mut self, next: u64, out: &mut Vec<Output>) {
        let Some(e) = self.elastic.as_mut() else {
            return;
        };
        e.next_seed = next;
        let behind = std::mem::take(&mut e.behind_chain);
        for node in behind {
            if !self.nodes[node].state.is_up() {
                continue;
            }
            let Some(e) = self.elastic.as_mut() else {
                return;
            };
            let seed = e.next_seed;
            e.next_seed = seed.wrapping_add(self.cfg.envs(node) as u64);
            self.send(node, ToNode::Seed(Seed { seed }), out);
        }
    }

    /// Elastic: nodes that joined over the run (those at the start included) and
    /// nodes that left with `leave`.
    pub fn membership_counts(&self) -> Option<(u64, u64)> {
        self.elastic.as_ref().map(|e| (e.joined, e.left))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::test_support::*;
    use super::*;
    use crate::message::FromNode;
    use crate::policy::Weights;
    use crate::schema::keys;
    use crate::tensor::Tensor;

    fn membership(min_nodes: usize) -> Membership {
        Membership {
            min_nodes,
            empty_timeout: ms(1000),
        }
    }

    /// An elastic async machine of `max` slots, 1 env each, `fpb` frames a batch,
    /// started with the nodes in `members`.
    fn elastic(max: usize, fpb: usize, total: Option<u64>, members: &[usize]) -> TrainerMachine {
        let mut m = match machine(config(max, 1, fpb, total, false)).with_elastic(membership(1)) {
            Ok(m) => m,
            Err(e) => panic!("elastic refused: {e}"),
        };
        m.start_with(members);
        m
    }

    fn joined(m: &mut TrainerMachine, node: usize) -> Vec<Output> {
        let mut out = Vec::new();
        if let Err(e) = m.node_joined(node, &mut out) {
            panic!("join refused: {e}");
        }
        out
    }

    fn field(r: Result<TrainerMachine, ConfigError>) -> Option<&'static str> {
        r.err().map(|e| e.field)
    }

    #[test]
    fn elastic_settings_that_cannot_work_are_refused_by_name() {
        let m = |sync| machine(config(4, 1, 4, None, sync));
        assert_eq!(field(m(false).with_elastic(membership(0))), Some("min_nodes"));
        assert_eq!(field(m(false).with_elastic(membership(5))), Some("min_nodes"));
        assert_eq!(field(m(true).with_elastic(membership(2))), Some("sync"));
        let supervised = m(false).with_supervision(supervision(3, None));
        assert_eq!(field(supervised.with_elastic(membership(2))), Some("node_max_restarts"));
        let zero = Membership {
            min_nodes: 1,
            empty_timeout: Duration::ZERO,
        };
        assert_eq!(field(m(false).with_elastic(zero)), Some("join_timeout"));
        assert!(m(false).with_elastic(membership(4)).is_ok(), "min == max is fine");
    }

    #[test]
    fn free_slots_get_no_work_and_a_joiner_gets_weights_seed_and_a_continue_at_once() {
        let mut m = elastic(3, 4, None, &[0]);
        let mut out = Vec::new();
        m.set_seed(10, &mut out);
        assert_eq!(sends(&out), vec![(0, "seed")], "the chain skips free slots");
        assert_eq!(
            feed(&mut m, FromNode::Seeded { node: 0, next_seed: 11 }),
            vec![Output::Seeded { next_seed: 13 }]
        );
        assert_eq!(continues(&request(&mut m)), vec![(0, 0, 4)], "only the member is asked");
        m.set_weights(Weights::new(BTreeMap::new()));
        m.set_weights(Weights::new(BTreeMap::new()));
        let out = joined(&mut m, 2);
        assert_eq!(sends(&out), vec![(2, "update_weights"), (2, "seed"), (2, "continue")]);
        assert!(
            out.iter()
                .any(|o| matches!(o, Output::Send { msg: ToNode::UpdateWeights(u), .. } if u.weights.version == 2)),
            "the stored version, not version 0: {out:?}"
        );
        assert!(out.contains(&Output::Send {
            node: 2,
            msg: ToNode::Seed(Seed { seed: 13 })
        }));
        assert_eq!(continues(&out), vec![(2, 1, 4)]);
        let out = joined(&mut m, 1);
        assert!(
            out.contains(&Output::Send {
                node: 1,
                msg: ToNode::Seed(Seed { seed: 14 })
            }),
            "each joiner its own seed: {out:?}"
        );
        assert_eq!(m.membership_counts(), Some((3, 0)));
    }

    #[test]
    fn a_joiner_before_the_first_request_waits_for_it() {
        let mut m = elastic(2, 4, None, &[0]);
        let out = joined(&mut m, 1);
        assert!(continues(&out).is_empty(), "no Continue before the run started");
        assert_eq!(continues(&request(&mut m)), vec![(0, 0, 4), (1, 1, 4)]);
    }

    #[test]
    fn a_node_that_leaves_is_not_waited_for_and_the_others_bring_its_frames() {
        let mut m = elastic(2, 4, Some(12), &[0, 1]);
        request(&mut m);
        feed(&mut m, batch(1, 1, 1, 4));
        // Node 0 leaves with seq 0 in flight: no error, nothing to send it.
        let out = feed(&mut m, FromNode::Leave { node: 0 });
        assert!(sends(&out).is_empty(), "{out:?}");
        assert_eq!(m.outstanding(0), None);
        assert_eq!(m.nodes_alive(), 1);
        let mut total = 4;
        let mut seq = 2;
        while !m.is_finished() {
            request(&mut m);
            let out = feed(&mut m, batch(1, seq, 1, 4));
            total += yields(&out).iter().map(|y| y.data.numel()).sum::<usize>();
            seq += 1;
        }
        assert_eq!(total, 12, "total_frames exact without the node that left");
        assert_eq!(m.frames_yielded(), 12);
        assert_eq!(m.membership_counts(), Some((2, 1)));
    }

    #[test]
    fn a_lost_node_is_not_restarted_and_the_run_goes_on_even_with_none_left() {
        let mut m = elastic(2, 4, None, &[0]);
        request(&mut m);
        let mut out = Vec::new();
        let r = m.on_node(
            FromNode::Failed {
                node: 0,
                reason: "killed".into(),
            },
            &mut out,
        );
        assert!(matches!(r, Err(TrainerError::NodeLost { node: 0, .. })), "{r:?}");
        assert!(!out.iter().any(|o| matches!(o, Output::RestartNode { .. })));
        assert_eq!(m.nodes_alive(), 0);
        // A joiner takes the free slot and the run goes on.
        let out = joined(&mut m, 0);
        assert_eq!(continues(&out), vec![(0, 1, 4)]);
        let out = feed(&mut m, batch(0, 1, 1, 4));
        assert_eq!(yields(&out).len(), 1);
    }

    #[test]
    fn with_no_node_left_the_run_fails_once_none_joined_within_the_timeout() {
        let mut m = elastic(2, 4, None, &[0]);
        request(&mut m);
        feed(&mut m, FromNode::Leave { node: 0 });
        let mut out = Vec::new();
        m.tick(ms(10), &mut out).unwrap();
        m.tick(ms(1009), &mut out).unwrap();
        // A joiner resets the wait; once it leaves the wait starts again.
        joined(&mut m, 1);
        m.tick(ms(1500), &mut out).unwrap();
        feed(&mut m, FromNode::Leave { node: 1 });
        m.tick(ms(1600), &mut out).unwrap();
        m.tick(ms(2599), &mut out).unwrap();
        let r = m.tick(ms(2600), &mut out);
        assert!(
            matches!(&r, Err(TrainerError::NoNodes(why)) if why.contains("1.0 s")),
            "{r:?}"
        );
    }

    #[test]
    fn a_joiner_in_a_reused_slot_never_repeats_the_trajectory_ids_of_its_predecessors() {
        // Two slots of one env each: slot 0's lane is ids 0, 2, 4, ...
        let mut m = elastic(2, 4, None, &[0, 1]);
        request(&mut m);
        let ids = |node: usize, seq: u64, id: i64| {
            let FromNode::Batch(mut b) = batch(node, seq, 1, 4) else {
                unreachable!("a batch")
            };
            let _ = b
                .data
                .set(keys::TRAJ_IDS, Tensor::I64(ndarray::ArrayD::from_elem(vec![1, 4], id)));
            FromNode::Batch(b)
        };
        let first = feed(&mut m, ids(0, 0, 4));
        feed(&mut m, FromNode::Leave { node: 0 });
        let out = joined(&mut m, 0);
        let (_, seq, _) = continues(&out)[0];
        // The new node starts its lane afresh, at id 0.
        request(&mut m);
        let again = feed(&mut m, ids(0, seq, 0));
        let id_of = |out: &[Output]| match yields(out)[0].data.get(keys::TRAJ_IDS) {
            Ok(Tensor::I64(a)) => crate::tensor::max_i64(a),
            _ => None,
        };
        assert_eq!(id_of(&first), Some(4));
        assert_eq!(id_of(&again), Some(6), "shifted past 4, in its lane");
    }

    #[test]
    fn joins_are_refused_in_fixed_runs_into_held_slots_and_at_shutdown() {
        let mut fixed = machine(config(2, 1, 4, None, false));
        let r = fixed.node_joined(1, &mut Vec::new());
        assert!(matches!(r, Err(TrainerError::JoinRefused { node: 1, .. })), "{r:?}");
        let mut m = elastic(2, 4, None, &[0]);
        let r = m.node_joined(0, &mut Vec::new());
        assert!(
            matches!(&r, Err(TrainerError::JoinRefused { reason, .. }) if reason.contains("held")),
            "{r:?}"
        );
        assert!(matches!(
            m.node_joined(2, &mut Vec::new()),
            Err(TrainerError::UnknownNode(2))
        ));
        m.shutdown(&mut Vec::new());
        let r = m.node_joined(1, &mut Vec::new());
        assert!(
            matches!(&r, Err(TrainerError::JoinRefused { reason, .. }) if reason.contains("shutting down")),
            "{r:?}"
        );
    }

    #[test]
    fn a_joiner_the_running_chain_passed_is_seeded_when_it_ends_and_one_ahead_by_the_chain() {
        let mut m = elastic(3, 4, None, &[1]);
        let mut out = Vec::new();
        m.set_seed(10, &mut out);
        assert_eq!(sends(&out), vec![(1, "seed")]);
        // Slot 0 is behind the chain, slot 2 ahead of it.
        assert!(sends(&joined(&mut m, 0)).is_empty());
        assert!(sends(&joined(&mut m, 2)).is_empty());
        let out = feed(&mut m, FromNode::Seeded { node: 1, next_seed: 12 });
        assert_eq!(
            out,
            vec![Output::Send {
                node: 2,
                msg: ToNode::Seed(Seed { seed: 12 })
            }]
        );
        let out = feed(&mut m, FromNode::Seeded { node: 2, next_seed: 13 });
        assert_eq!(
            out,
            vec![
                Output::Seeded { next_seed: 13 },
                Output::Send {
                    node: 0,
                    msg: ToNode::Seed(Seed { seed: 13 })
                }
            ]
        );
    }

    #[test]
    fn an_elastic_run_takes_no_checkpoint_and_a_leave_in_a_fixed_run_is_a_lost_node() {
        let mut m = elastic(2, 4, None, &[0, 1]);
        let r = m.begin_checkpoint(&mut Vec::new());
        assert!(
            matches!(&r, Err(TrainerError::Checkpoint(why)) if why.contains("elastic")),
            "{r:?}"
        );
        let mut fixed = machine(config(2, 1, 4, None, false));
        request(&mut fixed);
        let r = fixed.on_node(FromNode::Leave { node: 0 }, &mut Vec::new());
        assert!(matches!(r, Err(TrainerError::NodeLost { node: 0, .. })), "{r:?}");
    }
}
