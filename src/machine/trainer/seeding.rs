//! The seeding chain: node 0 gets the seed, node k+1 the seed node k did not use,
//! one node at a time so that no node collects with a half-applied seed.

use super::{Output, TrainerError, TrainerMachine};
use crate::message::{Seed, ToNode};

impl TrainerMachine {
    /// The seed node `node` gets from the last seeding chain (all nodes up).
    pub(super) fn chain_seed_of(&self, node: usize) -> u64 {
        let before: u64 = self.cfg.envs_per_node[..node].iter().map(|&k| k as u64).sum();
        self.chain_seed.wrapping_add(before)
    }

    /// Starts the seeding chain: node 0 gets `seed`, node k+1 the seed node k did not use.
    /// Ends with [`Output::Seeded`].
    /// A chain asked for while another runs starts when that one ends; only the
    /// last chain's result is reported.
    pub fn set_seed(&mut self, seed: u64, out: &mut Vec<Output>) {
        if self.seeding.is_some() || self.checkpointing() {
            self.queued_seed = Some(seed);
            return;
        }
        self.chain_seed = seed;
        if let Err(e) = self.seed_from(0, seed, out) {
            tracing::error!(error = %e, "seeding failed");
        }
    }

    /// Node `node` used its seeds (`Seeded`): the chain goes on with the next one.
    /// A report from a node the chain is not at is ignored.
    pub(super) fn on_seeded(&mut self, node: usize, next_seed: u64, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if self.seeding.map(|(n, _)| n) != Some(node) {
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
            seed = seed.wrapping_add(self.cfg.envs_per_node[node] as u64);
            node += 1;
        }
        if node < self.nodes.len() {
            self.seeding = Some((node, seed));
            out.push(Output::Send {
                node,
                msg: ToNode::Seed(Seed { seed }),
            });
            return Ok(());
        }
        self.seeding = None;
        if let Some(queued) = self.queued_seed.take() {
            self.chain_seed = queued;
            return self.seed_from(0, queued, out);
        }
        out.push(Output::Seeded { next_seed: seed });
        if self.checkpoint.is_some() {
            self.advance_checkpoint(out);
            return Ok(());
        }
        if std::mem::take(&mut self.deferred) {
            self.request(out)?;
        }
        Ok(())
    }
}
