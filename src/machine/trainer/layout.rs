//! What each node's batches must hold: the layout the trainer knows itself (built
//! from the env's specs) or, for an env it cannot build, the first one a node of
//! that env announced; and the check of a node's `ready` and batches against it.
//!
//! A node's own word is never the measure: a node announcing an empty layout would
//! otherwise have empty batches accepted as frames.

use super::{TrainerError, TrainerMachine};
use crate::schema::{check_rollout_layout, layout_difference, named_difference, BatchLayout};
use crate::tensor::TensorDict;

pub use crate::schema::check_layout;

/// Where the layout a node's batches are checked against comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum LayoutSource {
    /// The trainer's own, built from the env's specs: the node's `ready` must announce
    /// exactly this. `of` names where it comes from in errors (`env CartPole-v1`).
    Known {
        /// What the layout is of, for errors.
        of: String,
        /// The layout.
        layout: BatchLayout,
    },
    /// Specs the trainer knows (an env it builds, or specs the user declared): the
    /// layout is `specs.batch_layout_with(recorded, &state)`, and a node's `ready` must
    /// announce it and, when it sends specs, these specs. `of` names where they come
    /// from in errors.
    Specs {
        /// What the specs are of, for errors (`env CartPole-v1`, `the declared specs`).
        of: String,
        /// The specs (boxed: a multi-agent env's groups make them the largest variant).
        specs: Box<crate::space::EnvSpecs>,
        /// What the run's policy records beside its actions for these specs
        /// ([`EnvSpecs::recorded`](crate::space::EnvSpecs::recorded)).
        recorded: crate::policy::Recorded,
        /// A recurrent policy's state tensors (empty: none), whose keys the batches hold.
        state: Vec<crate::policy::StateTensor>,
    },
    /// An env the trainer cannot build: the first `ready` of a node of `env` that is
    /// accepted (a rollout's layout, or with protocol version 4 the layout of the
    /// specs it sends) sets it; every other node of `env` must match.
    FirstReady {
        /// The env (its name, or any key telling envs apart).
        env: String,
    },
    /// Nothing known beforehand: the node's own `ready`, if it is a rollout's layout.
    /// The default, for machines driven without a plan (tests, harnesses).
    Announced,
}

/// The layout of each node: where it comes from and the one in force.
#[derive(Debug, Default)]
pub(super) struct Layouts {
    pub(super) sources: Vec<LayoutSource>,
    /// What each node's batches are checked against, once known.
    pub(super) in_force: Vec<Option<BatchLayout>>,
    /// Nodes whose last `ready` was refused: their batches are refused too (a batch
    /// may already be on its way when the connection is closed for the `ready`).
    pub(super) refused: Vec<bool>,
}

impl Layouts {
    /// `nodes` nodes, nothing known of any.
    pub(super) fn new(nodes: usize) -> Layouts {
        Layouts::from_sources(vec![LayoutSource::Announced; nodes])
    }

    fn from_sources(sources: Vec<LayoutSource>) -> Layouts {
        let in_force = sources
            .iter()
            .map(|s| match s {
                LayoutSource::Known { layout, .. } => Some(layout.clone()),
                LayoutSource::Specs {
                    specs, recorded, state, ..
                } => Some(specs.batch_layout_with(*recorded, state)),
                _ => None,
            })
            .collect();
        let refused = vec![false; sources.len()];
        Layouts {
            sources,
            in_force,
            refused,
        }
    }

    /// Checks node `node`'s batch against its layout.
    pub(super) fn check(&self, node: usize, data: &TensorDict) -> Result<(), String> {
        if self.refused.get(node).copied().unwrap_or(false) {
            return Err("its ready was refused".into());
        }
        match (self.in_force.get(node).and_then(Option::as_ref), self.sources.get(node)) {
            (Some(layout), _) => check_layout(data, layout),
            (None, Some(LayoutSource::FirstReady { .. })) => Err("no layout of it was accepted yet".into()),
            // Nothing known and nothing announced: only a machine driven by hand.
            (None, _) => Ok(()),
        }
    }

    /// The first node other than `node` of env `env` with a layout in force.
    fn first_of(&self, env: &str, node: usize) -> Option<(usize, &BatchLayout)> {
        self.sources
            .iter()
            .zip(&self.in_force)
            .enumerate()
            .filter(|&(i, _)| i != node)
            .find_map(|(i, (s, l))| match (s, l) {
                (LayoutSource::FirstReady { env: e }, Some(l)) if e == env => Some((i, l)),
                _ => None,
            })
    }

    /// Why node `node`'s announced `layout` cannot be its layout, if it cannot.
    /// `of_specs`: the layout is that of the specs the node sent, which were checked
    /// (then it need not be the layout of an f32 box's rollout).
    fn refusal(&self, node: usize, layout: &BatchLayout, of_specs: bool) -> Option<String> {
        let me = format!("node {node}");
        let rollouts = |layout: &BatchLayout| {
            if of_specs {
                return None;
            }
            check_rollout_layout(layout)
                .err()
                .map(|e| format!("not a rollout's layout: {e}"))
        };
        match &self.sources[node] {
            LayoutSource::Known { of, layout: known } => named_difference(&me, layout, of, known),
            LayoutSource::Specs {
                of,
                specs,
                recorded,
                state,
            } => named_difference(&me, layout, of, &specs.batch_layout_with(*recorded, state)),
            LayoutSource::FirstReady { env } => {
                if let Some(e) = rollouts(layout) {
                    return Some(e);
                }
                let own = self.in_force[node].as_ref().map(|l| (node, l));
                let (first, l) = self.first_of(env, node).or(own)?;
                named_difference(&me, layout, &format!("node {first}"), l)
                    .map(|d| format!("{d} (the first of env {env} to be ready)"))
            }
            LayoutSource::Announced => rollouts(layout),
        }
    }
}

impl TrainerMachine {
    /// Every batch of every node will be checked against `layout` (keys, dtypes,
    /// feature shapes), the trainer's own. Same as [`Self::with_layouts`] with `layout`
    /// for each node.
    pub fn with_layout(self, layout: BatchLayout) -> TrainerMachine {
        let n = self.cfg.nodes();
        self.with_layouts(vec![Some(layout); n])
    }

    /// Node `i`'s batches will be checked against `layouts[i]`, the trainer's own
    /// (a `ready` must announce the same); where `None` (or beyond the end), against
    /// what the node announces. Sync mode needs equal layouts: see [`Self::set_layout`].
    pub fn with_layouts(self, layouts: Vec<Option<BatchLayout>>) -> TrainerMachine {
        let sources = layouts
            .into_iter()
            .map(|l| match l {
                Some(layout) => LayoutSource::Known {
                    of: "the trainer".into(),
                    layout,
                },
                None => LayoutSource::Announced,
            })
            .collect();
        self.with_layout_sources(sources)
    }

    /// Where each node's layout comes from (missing entries: [`LayoutSource::Announced`]).
    pub fn with_layout_sources(mut self, sources: Vec<LayoutSource>) -> TrainerMachine {
        let n = self.cfg.nodes();
        let sources = sources
            .into_iter()
            .chain(std::iter::repeat(LayoutSource::Announced))
            .take(n)
            .collect();
        self.layouts = Layouts::from_sources(sources);
        self
    }

    /// The layout node `node` announced (a remote node's `Ready`). Refused with the
    /// difference (and not recorded) when it is not the layout the trainer knows for
    /// the node's env, or for an env the trainer cannot build when it is no rollout's
    /// layout or differs from the first one of that env; in sync mode, where shares
    /// are stacked, also when it differs from another node's. The node's batches are
    /// refused after a refused `ready`, until one is accepted.
    pub fn set_layout(&mut self, node: usize, layout: BatchLayout) -> Result<(), TrainerError> {
        self.accept_layout(node, layout, false)
    }

    /// [`Self::set_layout`]; `of_specs`: `layout` is that of specs the node sent,
    /// checked already.
    pub(super) fn accept_layout(
        &mut self,
        node: usize,
        layout: BatchLayout,
        of_specs: bool,
    ) -> Result<(), TrainerError> {
        if node >= self.layouts.sources.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        let refusal = self.layouts.refusal(node, &layout, of_specs).or_else(|| {
            if !self.cfg.sync() {
                return None;
            }
            // Every layout in force in sync mode equals every other (each was checked
            // against them when accepted; the known ones are equal, or the build
            // refused them): one of them stands for all, so a thousand nodes' `ready`
            // cost a thousand comparisons, not a million.
            let (other, known) = self
                .layouts
                .in_force
                .iter()
                .enumerate()
                .find_map(|(other, known)| Some((other, known.as_ref()?)).filter(|&(o, _)| o != node))?;
            (*known != layout)
                .then(|| layout_difference(node, &layout, other, known))
                .flatten()
                .map(|diff| format!("sync collection stacks node shares, but {diff}"))
        });
        if let Some(reason) = refusal {
            self.layouts.refused[node] = true;
            return Err(TrainerError::BadLayout { node, reason });
        }
        self.layouts.refused[node] = false;
        self.layouts.in_force[node] = Some(layout);
        Ok(())
    }

    /// The layout node `node`'s batches are checked against, once known.
    pub fn layout(&self, node: usize) -> Option<&BatchLayout> {
        self.layouts.in_force.get(node).and_then(Option::as_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::schema::{batch_layout, keys};
    use crate::spec::Spec;
    use crate::tensor::DType;

    fn traj_ids_layout() -> BatchLayout {
        BatchLayout::from([(keys::TRAJ_IDS.to_string(), (DType::I64, vec![]))])
    }

    /// A rollout's layout with an observation of `obs` values and a discrete action.
    fn rollout_layout(obs: usize) -> BatchLayout {
        batch_layout(&Spec::uniform_box(obs, -1.0, 1.0), &Spec::Discrete { n: 2 })
    }

    fn known(layout: BatchLayout) -> LayoutSource {
        LayoutSource::Known {
            of: "env E".into(),
            layout,
        }
    }

    fn first_ready(env: &str) -> LayoutSource {
        LayoutSource::FirstReady { env: env.into() }
    }

    fn bad_layout(r: Result<(), TrainerError>) -> String {
        match r {
            Err(TrainerError::BadLayout { reason, .. }) => reason,
            other => panic!("expected BadLayout, got {other:?}"),
        }
    }

    #[test]
    fn a_batch_matching_its_layout_passes_and_a_different_one_is_named() {
        let d = data(0, 1, 4);
        assert_eq!(check_layout(&d, &traj_ids_layout()), Ok(()));
        let mut wrong = traj_ids_layout();
        wrong.insert("observation".into(), (DType::F32, vec![4]));
        assert!(check_layout(&d, &wrong).is_err(), "a missing entry");
        let f32_ids = BatchLayout::from([(keys::TRAJ_IDS.to_string(), (DType::F32, vec![]))]);
        assert_eq!(
            check_layout(&d, &f32_ids),
            Err(format!(
                "`{}` must be {}, got {}",
                keys::TRAJ_IDS,
                DType::F32,
                DType::I64
            ))
        );
        assert!(matches!(check_layout(&d, &BatchLayout::new()), Err(e) if e.contains("unexpected entry")));
    }

    #[test]
    fn a_batch_off_its_nodes_layout_is_refused() {
        let mut m = machine(config(1, 1, 4, None, false)).with_layout(BatchLayout::new());
        request(&mut m);
        let r = m.on_node(batch(0, 0, 1, 4), &mut Vec::new());
        assert!(matches!(r, Err(TrainerError::BadBatch { node: 0, .. })), "{r:?}");
    }

    #[test]
    fn sync_refuses_a_layout_that_differs_from_another_nodes() {
        let mut m = machine(config(2, 1, 8, None, true));
        m.set_layout(0, rollout_layout(4)).unwrap();
        let reason = bad_layout(m.set_layout(1, rollout_layout(3)));
        assert_eq!(
            reason,
            "sync collection stacks node shares, but node 1's observation is f32 [3], node 0's is f32 [4]"
        );
        assert_eq!(m.layout(1), None, "a refused layout is not recorded");
        assert_eq!(m.set_layout(2, rollout_layout(4)), Err(TrainerError::UnknownNode(2)));
    }

    #[test]
    fn a_ready_off_the_layout_the_trainer_knows_is_refused_with_the_difference() {
        let mut m = machine(config(2, 1, 4, None, false))
            .with_layout_sources(vec![known(rollout_layout(4)), known(rollout_layout(2))]);
        let reason = bad_layout(m.set_layout(0, BatchLayout::new()));
        assert_eq!(reason, "node 0's observation is absent, env E's is f32 [4]");
        let reason = bad_layout(m.set_layout(1, rollout_layout(4)));
        assert_eq!(reason, "node 1's observation is f32 [4], env E's is f32 [2]");
        assert_eq!(m.layout(0), Some(&rollout_layout(4)), "the known layout stays in force");
        assert_eq!(m.set_layout(1, rollout_layout(2)), Ok(()));
    }

    #[test]
    fn after_a_refused_ready_the_nodes_batches_are_refused() {
        let mut m = machine(config(1, 1, 4, None, false));
        bad_layout(m.set_layout(0, traj_ids_layout()));
        request(&mut m);
        let r = m.on_node(batch(0, 0, 1, 4), &mut Vec::new());
        assert!(
            matches!(&r, Err(TrainerError::BadBatch { node: 0, reason }) if reason == "its ready was refused"),
            "{r:?}"
        );
    }

    #[test]
    fn nothing_known_a_ready_must_still_be_a_rollouts_layout() {
        let mut m = machine(config(1, 1, 4, None, false));
        let reason = bad_layout(m.set_layout(0, BatchLayout::new()));
        assert!(
            reason.starts_with("not a rollout's layout: its collector.traj_ids is absent"),
            "{reason}"
        );
        let mut no_action = rollout_layout(4);
        no_action.insert(keys::ACTION.into(), (DType::U8, vec![]));
        let reason = bad_layout(m.set_layout(0, no_action));
        assert_eq!(
            reason,
            "not a rollout's layout: its action is u8 [], a rollout's is i64 [] or f32"
        );
        let mut extra = rollout_layout(4);
        extra.insert("env.extra".into(), (DType::U8, vec![2]));
        assert_eq!(
            m.set_layout(0, extra.clone()),
            Ok(()),
            "an env's own entries are allowed"
        );
        assert_eq!(m.layout(0), Some(&extra));
    }

    #[test]
    fn an_env_the_trainer_cannot_build_takes_the_first_ready_and_holds_the_others_to_it() {
        let mut m = machine(config(3, 1, 4, None, false)).with_layout_sources(vec![
            first_ready("Custom"),
            first_ready("Custom"),
            first_ready("Other"),
        ]);
        request(&mut m);
        // Before any layout of it is accepted, a batch has nothing to be checked against.
        let r = m.on_node(batch(1, 1, 1, 4), &mut Vec::new());
        assert!(matches!(r, Err(TrainerError::BadBatch { node: 1, .. })), "{r:?}");
        assert!(bad_layout(m.set_layout(1, BatchLayout::new())).starts_with("not a rollout's layout"));
        assert_eq!(m.set_layout(1, rollout_layout(4)), Ok(()));
        let reason = bad_layout(m.set_layout(0, rollout_layout(3)));
        assert_eq!(
            reason,
            "node 0's observation is f32 [3], node 1's is f32 [4] (the first of env Custom to be ready)"
        );
        assert_eq!(m.set_layout(0, rollout_layout(4)), Ok(()));
        assert_eq!(
            m.set_layout(2, rollout_layout(3)),
            Ok(()),
            "another env may differ (async)"
        );
        // A restarted node announces again: it must match what is in force.
        let reason = bad_layout(m.set_layout(1, rollout_layout(5)));
        assert!(
            reason.starts_with("node 1's observation is f32 [5], node 0's is f32 [4]"),
            "{reason}"
        );
    }
}
