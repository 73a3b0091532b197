//! The stored weights and when they go out to the nodes: on demand, before each
//! collection, to stale nodes, or every few batches.

use std::sync::Arc;

use super::{ConfigError, Output, TrainerError, TrainerMachine};
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

    /// Sets version 0 of each node's weights (one per node, by index): what the
    /// launchers hand every node before its first `Continue` (a local node at its
    /// construction, a remote one in `welcome`), and what a node acts with until
    /// the first update. Their version is set to 0. Equal weights are kept once.
    pub fn with_initial_weights(self, weights: Vec<Weights>) -> Result<TrainerMachine, ConfigError> {
        self.with_initial_weights_where_known(weights.into_iter().map(Some).collect())
    }

    /// [`Self::with_initial_weights`] where known: a node of `None` is an env only the
    /// nodes know, whose version 0 is built once its specs are
    /// ([`Self::with_deferred_policy`]).
    pub fn with_initial_weights_where_known(
        mut self,
        weights: Vec<Option<Weights>>,
    ) -> Result<TrainerMachine, ConfigError> {
        if weights.len() != self.nodes.len() {
            return Err(ConfigError {
                field: "initial_weights",
                reason: format!("{} initial weights for {} nodes", weights.len(), self.nodes.len()),
            });
        }
        let mut initial: Vec<Option<Arc<Weights>>> = Vec::with_capacity(weights.len());
        for w in weights {
            let Some(w) = w else {
                initial.push(None);
                continue;
            };
            let w = w.with_version(0);
            let shared = initial.iter().flatten().find(|o| ***o == w).cloned();
            initial.push(Some(shared.unwrap_or_else(|| Arc::new(w))));
        }
        self.initial = initial;
        Ok(self)
    }

    /// Version 0 of node `node`'s weights, if the trainer was given them
    /// ([`TrainerMachine::with_initial_weights`]).
    pub fn initial_weights(&self, node: usize) -> Option<&Arc<Weights>> {
        self.initial.get(node).and_then(Option::as_ref)
    }

    /// The weights node `node` should act with now: the stored ones, or its version 0
    /// before any were stored.
    pub fn current_weights(&self, node: usize) -> Option<&Arc<Weights>> {
        self.weights.as_ref().or_else(|| self.initial_weights(node))
    }

    /// Lets weights holding NaN or infinity be stored ([`Self::check_weights`] refuses
    /// them by default, naming the tensor and the element).
    pub fn with_nonfinite_weights_allowed(mut self, allowed: bool) -> TrainerMachine {
        self.allow_nonfinite_weights = allowed;
        self
    }

    /// Whether `weights` fit every node's policy: the names, dtypes and shapes of its
    /// version 0 (`field` `weights`, the message naming the tensor), and every float
    /// in them a number (no NaN or infinity, naming the tensor and its first bad
    /// element; unless [`Self::with_nonfinite_weights_allowed`]). Checked before
    /// they are stored, so that weights that do not fit never reach a node and the run
    /// goes on with the ones it has. Weights for an env only the nodes know are refused
    /// until its version 0 is built (the first node of it reported its specs: the
    /// first batch waits for that): there is nothing to check them against before, and
    /// storing them unchecked would fail the run at the next batch instead. A node
    /// without a version 0 (none was given) takes anything.
    pub fn check_weights(&self, weights: &Weights) -> Result<(), ConfigError> {
        let refuse = |reason: String| ConfigError {
            field: "weights",
            reason,
        };
        let mut checked: Vec<&Arc<Weights>> = Vec::new();
        for node in 0..self.nodes.len() {
            if let Some(env) = self.version_0_pending(node) {
                return Err(refuse(format!(
                    "the policy of env {env} is not known yet: it is built from the specs of the first                      node of it to be ready; take a batch first"
                )));
            }
            let Some(v0) = self.initial_weights(node) else {
                continue;
            };
            if checked.iter().any(|c| Arc::ptr_eq(c, v0)) {
                continue;
            }
            v0.check_layout(weights).map_err(|e| match e {
                crate::policy::PolicyError::Weights(reason) => refuse(reason),
                other => refuse(other.to_string()),
            })?;
            checked.push(v0);
        }
        if !self.allow_nonfinite_weights {
            if let Some(bad) = weights.first_non_finite() {
                return Err(refuse(format!(
                    "{bad}; set allow_nonfinite_weights to store weights that are not all numbers"
                )));
            }
        }
        Ok(())
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
            self.checkpoints.deferred_push = Some(match (self.checkpoints.deferred_push.take(), nodes) {
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
        if let Some(w) = self.weights.clone() {
            if n.book.pushed_version != w.version && n.state.is_up() {
                n.book.pushed_version = w.version;
                // Sent through `send`, so its `weights_updated` is timed (deadlines.rs).
                self.send(i, ToNode::UpdateWeights(UpdateWeights { weights: w }), out);
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::test_support::*;
    use super::*;

    fn pushes(out: &[Output]) -> Vec<(usize, u64)> {
        out.iter()
            .filter_map(|o| match o {
                Output::Send {
                    node,
                    msg: ToNode::UpdateWeights(u),
                } => Some((*node, u.weights.version)),
                _ => None,
            })
            .collect()
    }

    fn weights() -> Weights {
        Weights::new(BTreeMap::new())
    }

    #[test]
    fn set_weights_numbers_versions_and_sends_nothing() {
        let mut m = machine(config(2, 1, 4, None, false));
        assert_eq!(m.set_weights(weights()), 1);
        assert_eq!(m.set_weights(weights()), 2);
        assert_eq!(m.weights_version(), 2);
        assert_eq!(m.weights().map(|w| w.version), Some(2));
    }

    fn value(v: f32) -> Weights {
        let mut t = BTreeMap::new();
        t.insert(
            "value".to_string(),
            crate::Tensor::F32(ndarray::ArrayD::from_elem(vec![1], v)),
        );
        Weights::new(t)
    }

    #[test]
    fn weights_that_do_not_fit_version_0_are_refused_naming_the_tensor() {
        let m = machine(config(2, 1, 4, None, false))
            .with_initial_weights(vec![value(1.0), value(1.0)])
            .unwrap();
        assert_eq!(m.check_weights(&value(2.0)), Ok(()));
        let mut wide = BTreeMap::new();
        wide.insert(
            "value".to_string(),
            crate::Tensor::F32(ndarray::ArrayD::from_elem(vec![2], 0.0)),
        );
        let e = m.check_weights(&Weights::new(wide)).unwrap_err();
        assert_eq!(e.field, "weights");
        assert_eq!(e.reason, "`value` must be f32 [1], got f32 [2]");
        let e = m.check_weights(&weights()).unwrap_err();
        assert_eq!(e.reason, "missing tensor `value`");
        let mut extra = value(1.0);
        extra.tensors.insert(
            "bias".to_string(),
            crate::Tensor::F32(ndarray::ArrayD::from_elem(vec![1], 0.0)),
        );
        assert_eq!(m.check_weights(&extra).unwrap_err().reason, "unexpected tensor `bias`");
        let bare = machine(config(1, 1, 4, None, false));
        assert_eq!(bare.check_weights(&weights()), Ok(()), "no version 0: anything goes");
    }

    #[test]
    fn weights_holding_nan_or_infinity_are_refused_naming_the_tensor_unless_allowed() {
        let m = machine(config(2, 1, 4, None, false))
            .with_initial_weights(vec![value(1.0), value(1.0)])
            .unwrap();
        for (v, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf"), (f32::NEG_INFINITY, "-inf")] {
            let e = m.check_weights(&value(v)).unwrap_err();
            assert_eq!(e.field, "weights");
            assert_eq!(
                e.reason,
                format!(
                    "tensor `value` holds {shown} at [0]; set allow_nonfinite_weights to store weights that are not all numbers"
                )
            );
        }
        let mut stored = m.with_nonfinite_weights_allowed(true);
        assert_eq!(stored.check_weights(&value(f32::NAN)), Ok(()));
        assert_eq!(stored.set_weights(value(f32::NAN)), 1);
        let bare = machine(config(1, 1, 4, None, false));
        assert!(
            bare.check_weights(&value(f32::NAN)).is_err(),
            "no version 0: still numbers only"
        );
    }

    #[test]
    fn version_0_is_each_nodes_until_weights_are_stored_and_equal_ones_are_kept_once() {
        let m = machine(config(3, 1, 6, None, false));
        assert!(m.current_weights(0).is_none(), "no version 0 given");
        let m = m
            .with_initial_weights(vec![value(1.0).with_version(7), value(1.0), value(2.0)])
            .unwrap();
        assert_eq!(m.initial_weights(0).map(|w| w.version), Some(0), "numbered 0");
        let (a, b, c) = (
            m.initial_weights(0).unwrap(),
            m.initial_weights(1).unwrap(),
            m.initial_weights(2).unwrap(),
        );
        assert!(Arc::ptr_eq(a, b), "equal weights are one copy");
        assert_eq!(**c, value(2.0));
        assert!(Arc::ptr_eq(m.current_weights(2).unwrap(), c));
        assert!(m.initial_weights(3).is_none());
        let mut m = m;
        m.set_weights(value(5.0));
        for i in 0..3 {
            assert_eq!(m.current_weights(i).map(|w| w.version), Some(1));
        }
        assert_eq!(m.initial_weights(2).map(|w| w.version), Some(0), "version 0 is kept");
    }

    #[test]
    fn initial_weights_for_another_number_of_nodes_are_refused() {
        let m = machine(config(2, 1, 4, None, false));
        let e = m.with_initial_weights(vec![value(1.0)]).unwrap_err();
        assert_eq!(e.field, "initial_weights");
    }

    #[test]
    fn version_0_is_not_pushed_to_nodes_that_have_it() {
        let mut m = machine(config(2, 1, 4, None, false))
            .with_initial_weights(vec![value(1.0), value(1.0)])
            .unwrap();
        let mut out = Vec::new();
        m.push_weights(None, &mut out).unwrap();
        assert!(pushes(&out).is_empty(), "every node got version 0 at its start");
    }

    #[test]
    fn a_push_goes_only_to_nodes_without_the_version() {
        let mut m = machine(config(2, 1, 4, None, false));
        m.set_weights(weights());
        let mut out = Vec::new();
        m.push_weights(Some(&[1]), &mut out).unwrap();
        assert_eq!(pushes(&out), vec![(1, 1)]);
        let mut out = Vec::new();
        m.push_weights(None, &mut out).unwrap();
        assert_eq!(pushes(&out), vec![(0, 1)], "node 1 has version 1 already");
        assert_eq!(
            m.push_weights(Some(&[2]), &mut Vec::new()),
            Err(TrainerError::UnknownNode(2))
        );
    }

    #[test]
    fn a_push_during_a_checkpoint_waits_for_its_end() {
        let mut m = machine(config(2, 1, 4, None, false));
        m.set_weights(weights());
        let id = m.begin_checkpoint(&mut Vec::new()).unwrap();
        let mut out = Vec::new();
        m.push_weights(Some(&[0]), &mut out).unwrap();
        m.push_weights(Some(&[1]), &mut out).unwrap();
        assert!(pushes(&out).is_empty());
        let mut out = Vec::new();
        m.cancel_checkpoint(id, "deadline".into(), &mut out).unwrap();
        assert_eq!(pushes(&out), vec![(0, 1), (1, 1)]);
    }

    #[test]
    fn update_after_each_batch_pushes_before_the_nodes_next_continue() {
        let mut cfg = config(1, 1, 4, None, false);
        cfg.update_after_each_batch = true;
        let mut m = machine(cfg);
        request(&mut m);
        m.set_weights(weights());
        let out = feed(&mut m, batch(0, 0, 1, 4));
        assert_eq!(sends(&out), vec![(0, "update_weights"), (0, "continue")]);
    }

    #[test]
    fn a_node_past_max_weight_update_interval_gets_the_weights() {
        let mut cfg = config(2, 1, 4, None, false);
        cfg.max_weight_update_interval = Some(1);
        let mut m = machine(cfg);
        m.set_weights(weights());
        request(&mut m);
        feed(&mut m, batch(0, 0, 1, 4));
        request(&mut m);
        let out = feed(&mut m, batch(0, 2, 1, 4));
        assert!(
            pushes(&out).is_empty(),
            "node 0 produced 2 batches; pushed at the next request"
        );
        assert_eq!(pushes(&request(&mut m)), vec![(0, 1)]);
    }

    #[test]
    fn update_interval_pushes_to_every_node_every_so_many_batches() {
        let mut cfg = config(2, 1, 8, None, true);
        cfg.update_interval = Some(2);
        let mut m = machine(cfg);
        m.set_weights(weights());
        for round in 0..2u64 {
            request(&mut m);
            feed(&mut m, batch(0, 2 * round, 1, 4));
            let out = feed(&mut m, batch(1, 2 * round + 1, 1, 4));
            let want = if round == 1 { vec![(0, 1), (1, 1)] } else { vec![] };
            assert_eq!(pushes(&out), want, "round {round}");
        }
    }
}
