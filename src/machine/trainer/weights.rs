//! The stored weights and when they go out to the nodes: on demand, before each
//! collection, to stale nodes, or every few batches.

use std::sync::Arc;

use super::{Output, TrainerError, TrainerMachine};
use crate::message::{ToNode, UpdateWeights};
use crate::policy::Weights;

impl TrainerMachine {
    /// The version of the stored weights (0 before any).
    pub fn weights_version(&self) -> u64 {
        self.version
    }

    /// The stored weights, if any were set.
    pub fn weights(&self) -> Option<&Arc<Weights>> {
        self.weights.as_ref()
    }

    /// Stores new weights under the next version and returns it. Nothing is sent:
    /// pushes happen by [`TrainerMachine::push_weights`] or the update options.
    pub fn set_weights(&mut self, mut weights: Weights) -> u64 {
        self.version += 1;
        weights.version = self.version;
        self.weights = Some(Arc::new(weights));
        self.version
    }

    /// Sends the stored weights to `nodes` (all when `None`) that do not have them yet.
    /// During a checkpoint the push waits for its end, so that no node's state in it
    /// is taken on one side of the push and the trainer's on the other.
    pub fn push_weights(&mut self, nodes: Option<&[usize]>, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        if let Some(&bad) = nodes.and_then(|l| l.iter().find(|&&i| i >= self.nodes.len())) {
            return Err(TrainerError::UnknownNode(bad));
        }
        if self.checkpointing() {
            self.deferred_push = Some(match (self.deferred_push.take(), nodes) {
                (Some(None), _) | (_, None) => None,
                (Some(Some(mut a)), Some(b)) => {
                    a.extend_from_slice(b);
                    Some(a)
                }
                (None, Some(b)) => Some(b.to_vec()),
            });
            return Ok(());
        }
        match nodes {
            None => {
                for i in 0..self.nodes.len() {
                    self.push_to(i, out);
                }
            }
            Some(list) => {
                for &i in list {
                    self.push_to(i, out);
                }
            }
        }
        Ok(())
    }

    /// Node `i` gets the stored weights if it is up and lacks them; either way its
    /// count of batches since an update restarts.
    pub(super) fn push_to(&mut self, i: usize, out: &mut Vec<Output>) {
        let n = &mut self.nodes[i];
        n.book.since_update = 0;
        if let Some(w) = &self.weights {
            if n.book.pushed_version != w.version && n.state.is_up() {
                n.book.pushed_version = w.version;
                out.push(Output::Send {
                    node: i,
                    msg: ToNode::UpdateWeights(UpdateWeights { weights: w.clone() }),
                });
            }
        }
    }

    /// `max_weight_update_interval`: nodes that produced more batches than that since
    /// their last update get the weights.
    pub(super) fn push_stale(&mut self, out: &mut Vec<Output>) {
        if let Some(max) = self.cfg.max_weight_update_interval {
            for i in 0..self.nodes.len() {
                if self.nodes[i].book.since_update > max {
                    self.push_to(i, out);
                }
            }
        }
    }

    /// `update_interval`: every node gets the weights once `yielded` batches are a
    /// multiple of it.
    pub(super) fn interval_push(&mut self, yielded: u64, out: &mut Vec<Output>) {
        if let Some(ui) = self.cfg.update_interval {
            if yielded.is_multiple_of(ui) {
                for i in 0..self.nodes.len() {
                    self.push_to(i, out);
                }
            }
        }
    }
}
