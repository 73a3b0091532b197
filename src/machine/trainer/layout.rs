//! What each node's batches must hold, and the check of a batch against it.

use super::{TrainerError, TrainerMachine};
use crate::rollout::BatchLayout;
use crate::tensor::TensorDict;

/// Checks a batch's entries against a layout: same keys, dtypes and feature shapes.
pub fn check_layout(data: &TensorDict, layout: &BatchLayout) -> Result<(), String> {
    let nb = data.batch_size().len();
    for (key, (dtype, feature)) in layout {
        let t = data.get(key).map_err(|e| e.to_string())?;
        if t.dtype() != *dtype {
            return Err(format!("`{key}` must be {dtype}, got {}", t.dtype()));
        }
        if t.shape()[nb..] != feature[..] {
            return Err(format!(
                "`{key}` must have feature shape {feature:?}, got {:?}",
                &t.shape()[nb..]
            ));
        }
    }
    if let Some(extra) = data.keys().find(|k| !layout.contains_key(*k)) {
        return Err(format!("unexpected entry `{extra}`"));
    }
    Ok(())
}

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
                    .and_then(|k| crate::rollout::layout_difference(node, &layout, other, k))
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
