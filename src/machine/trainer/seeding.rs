//! The seeding chain: node 0 gets the seed, node k+1 the seed node k did not use,
//! one node at a time so that no node collects with a half-applied seed.

use super::{Output, TrainerError, TrainerMachine};
use crate::message::{Seed, ToNode};

/// The seeding chain's progress.
#[derive(Debug, Default)]
pub(super) struct SeedChain {
    /// The chain in progress: the node being seeded and its seed.
    pub(super) at: Option<(usize, u64)>,
    /// A chain asked for while another was running.
    pub(super) queued: Option<u64>,
    /// The seed of the last chain (node 0's seed), 0 before any.
    pub(super) seed: u64,
}

impl TrainerMachine {
    /// The seed node `node` gets from the last seeding chain (all nodes up).
    pub(super) fn chain_seed_of(&self, node: usize) -> u64 {
        let before = self.cfg.shares.first_lane(node);
        self.chain.seed.wrapping_add(before)
    }

    /// Starts the seeding chain: node 0 gets `seed`, node k+1 the seed node k did not use.
    /// Ends with [`Output::Seeded`].
    /// A chain asked for while another runs starts when that one ends; only the
    /// last chain's result is reported.
    pub fn set_seed(&mut self, seed: u64, out: &mut Vec<Output>) {
        if self.chain.at.is_some() || self.checkpointing() {
            self.chain.queued = Some(seed);
            return;
        }
        self.chain.seed = seed;
        if let Err(e) = self.seed_from(0, seed, out) {
            tracing::error!(error = %e, "seeding failed");
        }
    }

    /// The first seed of the run no env was given: where the last seeding chain ends
    /// (node 0's seed plus one seed per env of the run; a chain waiting to start counts
    /// as the last), or in an elastic run past the nodes that joined since.
    pub fn next_unused_seed(&self) -> u64 {
        let lanes = self.cfg.shares.lanes();
        if let Some(queued) = self.chain.queued {
            return queued.wrapping_add(lanes);
        }
        match &self.elastic {
            Some(e) if self.chain.at.is_none() => e.next_seed,
            _ => self.chain.seed.wrapping_add(lanes),
        }
    }

    /// torchrl's `reset()`: every env of every node starts a new episode, seeded from
    /// the run's next unused seeds: the seeding chain from [`Self::next_unused_seed`],
    /// so the episodes in progress are cut without `done` (PROTOCOL.md, "Seeding") and
    /// the run stays reproducible from its seed. A node collecting when its `seed`
    /// arrives applies it after that batch (with `prefetch`, after the one asked ahead
    /// too: both were asked before the seed); a sync round asked after this call starts
    /// every episode anew. Ends with [`Output::Seeded`], as [`Self::set_seed`] does.
    pub fn reset_envs(&mut self, out: &mut Vec<Output>) {
        let seed = self.next_unused_seed();
        self.set_seed(seed, out);
    }

    /// Node `node` used its seeds (`Seeded`): the chain goes on with the next one.
    /// A report from a node the chain is not at is ignored.
    pub(super) fn on_seeded(&mut self, node: usize, next_seed: u64, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.chain.at.map(|(n, _)| n) != Some(node) {
            return Ok(());
        }
        self.seed_from(node + 1, next_seed, out)
    }

    /// Sends `seed` to the first live node from `node` on; a node that is down is
    /// skipped as if it had used its envs' seeds, so the others get the seeds they
    /// would have had. Past the last node the chain is complete.
    pub(super) fn seed_from(
        &mut self,
        mut node: usize,
        mut seed: u64,
        out: &mut Vec<Output>,
    ) -> Result<(), TrainerError> {
        while node < self.nodes.len() && !self.nodes[node].state.is_up() {
            seed = seed.wrapping_add(self.cfg.envs(node) as u64);
            node += 1;
        }
        if node < self.nodes.len() {
            self.chain.at = Some((node, seed));
            self.send(node, ToNode::Seed(Seed { seed }), out);
            return Ok(());
        }
        self.chain.at = None;
        if let Some(queued) = self.chain.queued.take() {
            self.chain.seed = queued;
            return self.seed_from(0, queued, out);
        }
        out.push(Output::Seeded { next_seed: seed });
        self.chain_ended(seed, out);
        if self.checkpoints.taking.is_some() {
            self.advance_checkpoint(out);
            return Ok(());
        }
        if std::mem::take(&mut self.deferred) {
            self.request(out)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::message::FromNode;

    fn seeds(out: &[Output]) -> Vec<(usize, u64)> {
        out.iter()
            .filter_map(|o| match o {
                Output::Send {
                    node,
                    msg: ToNode::Seed(Seed { seed }),
                } => Some((*node, *seed)),
                _ => None,
            })
            .collect()
    }

    fn seeded(node: usize, next_seed: u64) -> FromNode {
        FromNode::Seeded { node, next_seed }
    }

    #[test]
    fn the_chain_seeds_one_node_at_a_time_with_the_seed_the_previous_did_not_use() {
        let mut m = machine(config(3, 2, 4, None, false));
        let mut out = Vec::new();
        m.set_seed(10, &mut out);
        assert_eq!(seeds(&out), vec![(0, 10)]);
        assert_eq!(seeds(&feed(&mut m, seeded(0, 12))), vec![(1, 12)]);
        assert_eq!(seeds(&feed(&mut m, seeded(1, 14))), vec![(2, 14)]);
        assert_eq!(feed(&mut m, seeded(2, 16)), vec![Output::Seeded { next_seed: 16 }]);
        assert_eq!(m.chain_seed_of(2), 14, "a restart derives from the seed the chain gave");
    }

    #[test]
    fn a_reset_runs_the_chain_from_the_first_seed_no_env_was_given() {
        let mut m = machine(config(3, 2, 4, None, false));
        let mut out = Vec::new();
        m.set_seed(10, &mut out);
        feed(&mut m, seeded(0, 12));
        feed(&mut m, seeded(1, 14));
        feed(&mut m, seeded(2, 16));
        assert_eq!(m.next_unused_seed(), 16, "3 nodes x 2 envs seeded from 10");
        let mut out = Vec::new();
        m.reset_envs(&mut out);
        assert_eq!(seeds(&out), vec![(0, 16)]);
        assert_eq!(seeds(&feed(&mut m, seeded(0, 18))), vec![(1, 18)]);
        assert_eq!(seeds(&feed(&mut m, seeded(1, 20))), vec![(2, 20)]);
        assert_eq!(feed(&mut m, seeded(2, 22)), vec![Output::Seeded { next_seed: 22 }]);
        assert_eq!(m.next_unused_seed(), 22, "the next reset takes seeds no env had");
    }

    #[test]
    fn a_reset_asked_during_a_chain_follows_the_chain_waiting_to_start() {
        let mut m = machine(config(2, 1, 4, None, false));
        m.set_seed(0, &mut Vec::new());
        m.set_seed(100, &mut Vec::new());
        assert_eq!(m.next_unused_seed(), 102, "after the queued chain");
        m.reset_envs(&mut Vec::new());
        feed(&mut m, seeded(0, 1));
        let out = feed(&mut m, seeded(1, 2));
        assert_eq!(
            seeds(&out),
            vec![(0, 102)],
            "the reset replaced the queued chain, past its seeds"
        );
    }

    #[test]
    fn a_seeded_report_from_a_node_the_chain_is_not_at_is_ignored() {
        let mut m = machine(config(2, 1, 4, None, false));
        m.set_seed(0, &mut Vec::new());
        assert!(feed(&mut m, seeded(1, 5)).is_empty());
    }

    #[test]
    fn a_request_during_the_chain_is_served_once_it_ends() {
        let mut m = machine(config(2, 1, 4, None, false));
        m.set_seed(0, &mut Vec::new());
        assert!(request(&mut m).is_empty(), "no node collects with a half-applied seed");
        feed(&mut m, seeded(0, 1));
        let out = feed(&mut m, seeded(1, 2));
        assert_eq!(out[0], Output::Seeded { next_seed: 2 });
        assert_eq!(continues(&out), vec![(0, 0, 4), (1, 1, 4)]);
    }

    #[test]
    fn a_chain_asked_during_another_starts_when_it_ends_and_only_the_last_is_reported() {
        let mut m = machine(config(2, 1, 4, None, false));
        m.set_seed(0, &mut Vec::new());
        let mut out = Vec::new();
        m.set_seed(100, &mut out);
        assert!(out.is_empty());
        feed(&mut m, seeded(0, 1));
        let out = feed(&mut m, seeded(1, 2));
        assert_eq!(seeds(&out), vec![(0, 100)]);
        assert!(!out.iter().any(|o| matches!(o, Output::Seeded { .. })));
        feed(&mut m, seeded(0, 101));
        assert_eq!(feed(&mut m, seeded(1, 102)), vec![Output::Seeded { next_seed: 102 }]);
    }

    #[test]
    fn a_lost_node_is_skipped_as_if_it_used_its_envs_seeds() {
        let mut m = machine(config(3, 2, 4, None, false));
        let _ = m.on_node(
            FromNode::Failed {
                node: 1,
                reason: "gone".into(),
            },
            &mut Vec::new(),
        );
        m.set_seed(10, &mut Vec::new());
        assert_eq!(seeds(&feed(&mut m, seeded(0, 12))), vec![(2, 14)]);
        assert_eq!(feed(&mut m, seeded(2, 16)), vec![Output::Seeded { next_seed: 16 }]);
    }

    #[test]
    fn a_node_lost_while_being_seeded_passes_the_chain_on() {
        let mut m = machine(config(2, 2, 4, None, false));
        m.set_seed(10, &mut Vec::new());
        let mut out = Vec::new();
        let r = m.on_node(
            FromNode::Failed {
                node: 0,
                reason: "gone".into(),
            },
            &mut out,
        );
        assert!(matches!(r, Err(TrainerError::NodeLost { node: 0, .. })), "{r:?}");
        assert_eq!(seeds(&out), vec![(1, 12)]);
    }
}
