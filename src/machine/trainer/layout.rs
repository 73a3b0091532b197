//! What each node's batches must hold, and the check of a batch against it.

use super::{TrainerError, TrainerMachine};
use crate::schema::BatchLayout;

pub use crate::schema::check_layout;

impl TrainerMachine {
    /// Every batch of every node will be checked against `layout` (keys, dtypes,
    /// feature shapes). Same as [`Self::with_layouts`] with `layout` for each node.
    pub fn with_layout(mut self, layout: BatchLayout) -> TrainerMachine {
        self.layouts = vec![Some(layout); self.cfg.nodes];
        self
    }

    /// Node `i`'s batches will be checked against `layouts[i]` (unchecked where `None`,
    /// or beyond the end). Sync mode needs equal layouts: see [`Self::set_layout`].
    pub fn with_layouts(mut self, layouts: Vec<Option<BatchLayout>>) -> TrainerMachine {
        let n = self.cfg.nodes;
        self.layouts = layouts.into_iter().chain(std::iter::repeat(None)).take(n).collect();
        self
    }

    /// Records the layout node `node` advertised (a remote node's `Ready`). In sync
    /// mode, where shares are stacked, a layout that differs from another node's is
    /// refused with the difference (the layout is not recorded).
    pub fn set_layout(&mut self, node: usize, layout: BatchLayout) -> Result<(), TrainerError> {
        if node >= self.layouts.len() {
            return Err(TrainerError::UnknownNode(node));
        }
        if self.cfg.sync {
            for (other, known) in self.layouts.iter().enumerate() {
                if other == node {
                    continue;
                }
                if let Some(diff) = known
                    .as_ref()
                    .and_then(|k| crate::schema::layout_difference(node, &layout, other, k))
                {
                    return Err(TrainerError::BadLayout {
                        node,
                        reason: format!("sync collection stacks node shares, but {diff}"),
                    });
                }
            }
        }
        self.layouts[node] = Some(layout);
        Ok(())
    }

    /// The layout node `node`'s batches are checked against, once known.
    pub fn layout(&self, node: usize) -> Option<&BatchLayout> {
        self.layouts.get(node).and_then(Option::as_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::tensor::DType;

    fn traj_ids_layout() -> BatchLayout {
        BatchLayout::from([(crate::schema::keys::TRAJ_IDS.to_string(), (DType::I64, vec![]))])
    }

    #[test]
    fn a_batch_matching_its_layout_passes_and_a_different_one_is_named() {
        let d = data(0, 1, 4);
        assert_eq!(check_layout(&d, &traj_ids_layout()), Ok(()));
        let mut wrong = traj_ids_layout();
        wrong.insert("observation".into(), (DType::F32, vec![4]));
        assert!(check_layout(&d, &wrong).is_err(), "a missing entry");
        let f32_ids = BatchLayout::from([(crate::schema::keys::TRAJ_IDS.to_string(), (DType::F32, vec![]))]);
        assert_eq!(
            check_layout(&d, &f32_ids),
            Err(format!(
                "`{}` must be {}, got {}",
                crate::schema::keys::TRAJ_IDS,
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
        m.set_layout(0, traj_ids_layout()).unwrap();
        let r = m.set_layout(1, BatchLayout::new());
        assert!(matches!(r, Err(TrainerError::BadLayout { node: 1, .. })), "{r:?}");
        assert_eq!(m.layout(1), None, "a refused layout is not recorded");
        assert_eq!(m.set_layout(2, BatchLayout::new()), Err(TrainerError::UnknownNode(2)));
    }
}
