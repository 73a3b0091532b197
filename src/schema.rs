//! The batch schema: the keys a collected batch holds, the layout (dtype and
//! feature shape per key) every batch of a run has, and the check of a batch
//! against it.
//!
//! Its own module because three parts of the house speak it: the collection loop
//! writes batches in it, the trainer checks what nodes send against it, and the
//! learners and post-processing read it; none of them owns it.

use std::collections::BTreeMap;

use crate::spec::Spec;
use crate::tensor::{DType, TensorDict};

/// Keys of a collected batch, torchrl's names.
pub mod keys {
    /// Observation the action was taken in, f32 `[.., D]`.
    pub const OBSERVATION: &str = "observation";
    /// Action, i64 `[..]` (discrete) or f32 `[.., A]`.
    pub const ACTION: &str = "action";
    /// Observation after the step, f32 `[.., D]`.
    pub const NEXT_OBSERVATION: &str = "next.observation";
    /// Reward of the step, f32 `[.., 1]`.
    pub const NEXT_REWARD: &str = "next.reward";
    /// `terminated || truncated`, bool `[.., 1]`.
    pub const NEXT_DONE: &str = "next.done";
    /// Terminal state reached, bool `[.., 1]`.
    pub const NEXT_TERMINATED: &str = "next.terminated";
    /// Episode cut short, bool `[.., 1]`.
    pub const NEXT_TRUNCATED: &str = "next.truncated";
    /// Trajectory id, unique across the run, i64 `[..]`.
    pub const TRAJ_IDS: &str = "collector.traj_ids";
    /// Steps taken in the trajectory before this frame, i64 `[.., 1]`.
    pub const STEP_COUNT: &str = "step_count";
    /// Real (true) or padding (false) frame, after `split_trajectories`.
    pub const MASK: &str = "collector.mask";
}

/// Per-frame layout of a batch: key → (dtype, feature shape after the batch dims).
pub type BatchLayout = BTreeMap<String, (DType, Vec<usize>)>;

/// The layout of every batch a rollout over envs with these specs produces; the
/// trainer checks each (remote) batch against it.
pub fn batch_layout(observation: &Spec, action: &Spec) -> BatchLayout {
    let obs = (DType::F32, observation.feature_shape());
    let act = if action.is_discrete() {
        (DType::I64, vec![])
    } else {
        (DType::F32, action.feature_shape())
    };
    [
        (keys::OBSERVATION, obs.clone()),
        (keys::NEXT_OBSERVATION, obs),
        (keys::ACTION, act),
        (keys::NEXT_REWARD, (DType::F32, vec![1])),
        (keys::NEXT_DONE, (DType::Bool, vec![1])),
        (keys::NEXT_TERMINATED, (DType::Bool, vec![1])),
        (keys::NEXT_TRUNCATED, (DType::Bool, vec![1])),
        (keys::TRAJ_IDS, (DType::I64, vec![])),
        (keys::STEP_COUNT, (DType::I64, vec![1])),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The first difference between two nodes' layouts, worded for a config error, e.g.
/// `node 1's observation is f32 [1], node 0's is f32 [4]`; `None` when they agree.
pub fn layout_difference(node_a: usize, a: &BatchLayout, node_b: usize, b: &BatchLayout) -> Option<String> {
    let show = |e: Option<&(DType, Vec<usize>)>| match e {
        Some((dtype, shape)) => format!("{dtype} {shape:?}"),
        None => "absent".to_string(),
    };
    // The observation first, then the action: what a reader recognises the env by.
    let first = [keys::OBSERVATION.to_string(), keys::ACTION.to_string()];
    first
        .iter()
        .chain(a.keys())
        .chain(b.keys().filter(|k| !a.contains_key(*k)))
        .find(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            format!(
                "node {node_a}'s {k} is {}, node {node_b}'s is {}",
                show(a.get(k)),
                show(b.get(k))
            )
        })
}

/// Checks a batch's entries against a layout: same keys, dtypes and feature shapes.
/// The error names the first entry that differs.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    fn layout() -> BatchLayout {
        batch_layout(&Spec::uniform_box(3, -1.0, 1.0), &Spec::Discrete { n: 2 })
    }

    /// A batch of shape `[2, 4]` holding every entry of `layout`.
    fn batch(layout: &BatchLayout) -> TensorDict {
        let entries = layout.iter().map(|(k, (dtype, feature))| {
            let mut shape = vec![2, 4];
            shape.extend_from_slice(feature);
            (k.clone(), Tensor::zeros(*dtype, &shape))
        });
        TensorDict::from_entries(&[2, 4], entries).unwrap()
    }

    #[test]
    fn a_rollouts_layout_names_every_key_with_its_dtype_and_feature_shape() {
        let l = layout();
        assert_eq!(l[keys::OBSERVATION], (DType::F32, vec![3]));
        assert_eq!(l[keys::NEXT_OBSERVATION], (DType::F32, vec![3]));
        assert_eq!(l[keys::ACTION], (DType::I64, vec![]));
        assert_eq!(l[keys::NEXT_DONE], (DType::Bool, vec![1]));
        assert_eq!(l[keys::TRAJ_IDS], (DType::I64, vec![]));
        assert!(
            !l.contains_key(keys::MASK),
            "padding masks come later, from post-processing"
        );
        let continuous = batch_layout(&Spec::uniform_box(3, -1.0, 1.0), &Spec::uniform_box(2, -1.0, 1.0));
        assert_eq!(continuous[keys::ACTION], (DType::F32, vec![2]));
    }

    #[test]
    fn a_batch_fits_its_layout_and_the_first_difference_is_named() {
        let l = layout();
        let good = batch(&l);
        assert_eq!(check_layout(&good, &l), Ok(()));
        let mut wrong_dtype = good.clone();
        wrong_dtype.remove(keys::ACTION);
        wrong_dtype
            .set(keys::ACTION, Tensor::zeros(DType::F32, &[2, 4]))
            .unwrap();
        assert_eq!(
            check_layout(&wrong_dtype, &l),
            Err("`action` must be i64, got f32".to_string())
        );
        let mut wrong_shape = good.clone();
        wrong_shape.remove(keys::OBSERVATION);
        wrong_shape
            .set(keys::OBSERVATION, Tensor::zeros(DType::F32, &[2, 4, 5]))
            .unwrap();
        assert_eq!(
            check_layout(&wrong_shape, &l),
            Err("`observation` must have feature shape [3], got [5]".to_string())
        );
        let mut missing = good.clone();
        missing.remove(keys::STEP_COUNT);
        assert!(check_layout(&missing, &l).unwrap_err().contains("step_count"));
        let mut extra = good;
        extra.set("extra", Tensor::zeros(DType::U8, &[2, 4])).unwrap();
        assert_eq!(check_layout(&extra, &l), Err("unexpected entry `extra`".to_string()));
    }

    #[test]
    fn two_layouts_differ_first_by_observation_then_action() {
        let a = layout();
        assert_eq!(layout_difference(0, &a, 1, &a), None);
        let b = batch_layout(&Spec::uniform_box(1, -1.0, 1.0), &Spec::uniform_box(2, -1.0, 1.0));
        assert_eq!(
            layout_difference(1, &b, 0, &a).as_deref(),
            Some("node 1's observation is f32 [1], node 0's is f32 [3]")
        );
        let c = batch_layout(&Spec::uniform_box(3, -1.0, 1.0), &Spec::uniform_box(2, -1.0, 1.0));
        assert_eq!(
            layout_difference(0, &a, 2, &c).as_deref(),
            Some("node 0's action is i64 [], node 2's is f32 [2]")
        );
        let mut d = a.clone();
        d.remove(keys::STEP_COUNT);
        assert_eq!(
            layout_difference(0, &a, 1, &d).as_deref(),
            Some("node 0's step_count is i64 [1], node 1's is absent")
        );
    }
}
