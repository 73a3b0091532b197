//! The batch schema: the keys a collected batch holds, the layout (dtype and
//! feature shape per key) every batch of a run has, and the check of a batch
//! against it.
//!
//! Its own module because three parts of the house speak it: the collection loop
//! writes batches in it, the trainer checks what nodes send against it, and the
//! learners and post-processing read it; none of them owns it.

use std::collections::BTreeMap;

use crate::peer_text::{bounded, Bounded, BoundedDisplay};
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
    /// A multi-agent group's `<group>.mask`, bool `[.., n]`: the agent is present at
    /// the step (and `next.<group>.mask`, after it; torchrl's `PettingZooEnv` mask).
    pub const AGENT_MASK: &str = "mask";
    /// Real (true) or padding (false) frame, after `split_trajectories`.
    pub const MASK: &str = "collector.mask";
    /// The weights version the frame's action came from, i64 `[..]`: written by the
    /// trainer into a sync batch before it is split into trajectories (whose first
    /// axis then no longer says which node, and so which version, a frame is from).
    pub const WEIGHTS_VERSION: &str = "collector.weights_version";
    /// Log-probability of `action` under the policy's distribution, f32 `[..]`
    /// (summed over an action's dimensions). Written by policies with a distribution.
    pub const ACTION_LOG_PROB: &str = "action_log_prob";
    /// A categorical policy's logits, f32 `[.., N]`.
    pub const LOGITS: &str = "logits";
    /// A normal policy's means, f32 `[.., A]` (for a tanh-normal, before the tanh).
    pub const LOC: &str = "loc";
    /// A normal policy's standard deviations, f32 `[.., A]`.
    pub const SCALE: &str = "scale";
    /// A Q-value actor's action values, f32 `[.., N]` (torchrl's `QValueModule`).
    pub const ACTION_VALUE: &str = "action_value";
    /// The greedy action's value, f32 `[.., 1]`, whatever action exploration took.
    pub const CHOSEN_ACTION_VALUE: &str = "chosen_action_value";
    /// Every key a policy may record beside its action (see `policy::Recorded`).
    pub const RECORDED: [&str; 6] = [ACTION_LOG_PROB, LOGITS, LOC, SCALE, ACTION_VALUE, CHOSEN_ACTION_VALUE];
    /// The frame is the first of its episode, bool `[.., 1]` (torchrl's `InitTracker`);
    /// in the batches of a recurrent policy, whose state is zero there.
    pub const IS_INIT: &str = "is_init";
}

/// Per-frame layout of a batch: key → (dtype, feature shape after the batch dims).
pub type BatchLayout = BTreeMap<String, (DType, Vec<usize>)>;

/// The most entries a layout a node announces may have: the fixed keys, an observation
/// dict's leaves twice (`observation.*`, `next.observation.*`), the action and what
/// the policy records fit with room to spare.
pub const MAX_LAYOUT_ENTRIES: usize = 256;
/// The longest key of a layout a node announces, in bytes (`next.observation.` and
/// four levels of dict names fit).
pub const MAX_LAYOUT_KEY_LEN: usize = 512;

/// The highest trajectory id in a batch, if it has any (ids of frames in no
/// trajectory are negative and never the highest of a batch that has one).
pub fn max_traj_id(data: &TensorDict) -> Option<u64> {
    match data.get(keys::TRAJ_IDS) {
        Ok(crate::tensor::Tensor::I64(ids)) => crate::tensor::max_i64(ids).and_then(|m| u64::try_from(m).ok()),
        _ => None,
    }
}

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
    named_difference(&format!("node {node_a}"), a, &format!("node {node_b}"), b)
}

/// The first difference between layout `a` of `name_a` and `b` of `name_b`, e.g.
/// `node 2's observation is absent, env Counting's is f32 [1]`; `None` when they agree.
/// The observation first, then the action: what a reader recognises the env by.
pub fn named_difference(name_a: &str, a: &BatchLayout, name_b: &str, b: &BatchLayout) -> Option<String> {
    let first = [keys::OBSERVATION.to_string(), keys::ACTION.to_string()];
    first
        .iter()
        .chain(a.keys())
        .chain(b.keys().filter(|k| !a.contains_key(*k)))
        .find(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            // A node's key, shown bounded and escaped (`peer_text`).
            let k = Bounded(k);
            format!(
                "{name_a}'s {k} is {}, {name_b}'s is {}",
                show(a.get(k.0)),
                show(b.get(k.0))
            )
        })
}

/// An entry of a layout as the errors show it: `f32 [4]`, or `absent` (a node's
/// shape of many dimensions bounded, as its strings are).
fn show(e: Option<&(DType, Vec<usize>)>) -> String {
    match e {
        Some((dtype, shape)) => format!("{dtype} {}", BoundedDisplay(format_args!("{shape:?}"))),
        None => "absent".to_string(),
    }
}

/// Checks that a layout a node announced for an env the trainer cannot build is one
/// a rollout writes: every key of [`batch_layout`], those that do not depend on the
/// env with their own dtype and feature shape, `observation` f32 and the same as
/// `next.observation`, `action` i64 `[]` or f32. Further entries are the env's own.
/// Without this a node could announce an empty layout and have empty batches taken
/// as frames.
pub fn check_rollout_layout(layout: &BatchLayout) -> Result<(), String> {
    let fixed = batch_layout(&Spec::Discrete { n: 1 }, &Spec::Discrete { n: 1 });
    let env_keys = [keys::OBSERVATION, keys::NEXT_OBSERVATION, keys::ACTION];
    for (key, want) in fixed.iter().filter(|(k, _)| !env_keys.contains(&k.as_str())) {
        if layout.get(key) != Some(want) {
            return Err(format!(
                "its {key} is {}, a rollout's is {}",
                show(layout.get(key)),
                show(Some(want))
            ));
        }
    }
    let obs = layout.get(keys::OBSERVATION);
    if !matches!(obs, Some((DType::F32, _))) {
        return Err(format!("its observation is {}, a rollout's is f32", show(obs)));
    }
    if layout.get(keys::NEXT_OBSERVATION) != obs {
        return Err(format!(
            "its next.observation is {}, its observation {}",
            show(layout.get(keys::NEXT_OBSERVATION)),
            show(obs)
        ));
    }
    match layout.get(keys::ACTION) {
        Some((DType::F32, _)) => Ok(()),
        Some((DType::I64, shape)) if shape.is_empty() => Ok(()),
        other => Err(format!("its action is {}, a rollout's is i64 [] or f32", show(other))),
    }
}

/// Checks a batch's entries against a layout: same keys, dtypes and feature shapes.
/// The error names the first entry that differs.
pub fn check_layout(data: &TensorDict, layout: &BatchLayout) -> Result<(), String> {
    let nb = data.batch_size().len();
    // Every batch of a node that keeps its layout: both maps side by side in key
    // order, one comparison per key (a lookup per key each way was most of this
    // check's time). Anything else is found, and named, below.
    if data.len() == layout.len()
        && data.iter().zip(layout).all(|((key, t), (want, (dtype, feature)))| {
            key == want && t.dtype() == *dtype && t.shape().get(nb..) == Some(&feature[..])
        })
    {
        return Ok(());
    }
    // Keys and shapes may be a node's: shown bounded (`peer_text`).
    for (key, (dtype, feature)) in layout {
        let t = data.get(key).map_err(|e| bounded(&e.to_string()))?;
        let key = Bounded(key);
        if t.dtype() != *dtype {
            return Err(format!("`{key}` must be {dtype}, got {}", t.dtype()));
        }
        // A tensor of fewer dims than the batch breaks the dict's own invariant; a
        // dict built in memory can still hold one.
        let Some(got) = t.shape().get(nb..) else {
            return Err(format!(
                "`{key}` has {} dims, fewer than the batch's {nb}",
                t.shape().len()
            ));
        };
        if got != &feature[..] {
            return Err(format!(
                "`{key}` must have feature shape {}, got {}",
                BoundedDisplay(format_args!("{feature:?}")),
                BoundedDisplay(format_args!("{got:?}"))
            ));
        }
    }
    if let Some(extra) = data.keys().find(|k| !layout.contains_key(*k)) {
        return Err(format!("unexpected entry `{}`", Bounded(extra)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_nodes_keys_and_shapes_are_shown_bounded_in_differences() {
        let key = format!("{}\n", "k".repeat(1 << 20));
        let mut a = BatchLayout::new();
        a.insert(keys::OBSERVATION.to_string(), (DType::F32, vec![4]));
        let mut b = a.clone();
        b.insert(key.clone(), (DType::F32, vec![1; 100_000]));
        let d = layout_difference(2, &b, 0, &a).expect("a difference");
        assert!(d.len() < 3 * crate::peer_text::MAX_PRINTED, "{} bytes", d.len());
        assert!(d.contains(&format!(" … ({} bytes) is f32 [1, 1,", key.len())), "{d}");
        assert!(!d.contains('\n'), "{d}");
        let unexpected = TensorDict::from_entries(
            &[1],
            [
                (keys::OBSERVATION.to_string(), crate::Tensor::zeros(DType::F32, &[1, 4])),
                ("x".repeat(1000), crate::Tensor::zeros(DType::F32, &[1])),
            ],
        )
        .expect("dict");
        let e = check_layout(&unexpected, &a).unwrap_err();
        assert_eq!(e, format!("unexpected entry `{} … (1000 bytes)`", "x".repeat(256)));
    }

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
        let missing_err = check_layout(&missing, &l).unwrap_err();
        assert!(missing_err.contains("step_count"), "{missing_err}");
        let mut extra = good;
        extra.set("extra", Tensor::zeros(DType::U8, &[2, 4])).unwrap();
        assert_eq!(check_layout(&extra, &l), Err("unexpected entry `extra`".to_string()));
        // As many entries, one under another name: the layout's missing key is named.
        let mut renamed = batch(&l);
        let t = renamed.remove(keys::STEP_COUNT).unwrap();
        renamed.set("step_counts", t).unwrap();
        assert_eq!(renamed.len(), l.len());
        assert_eq!(
            check_layout(&renamed, &l),
            Err(missing_err),
            "the same words as with the key left out"
        );
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

    #[test]
    fn a_rollouts_layout_is_told_from_one_no_rollout_writes() {
        let l = layout();
        assert_eq!(check_rollout_layout(&l), Ok(()));
        let continuous = batch_layout(&Spec::uniform_box(3, -1.0, 1.0), &Spec::uniform_box(2, -1.0, 1.0));
        assert_eq!(check_rollout_layout(&continuous), Ok(()));
        let mut own = l.clone();
        own.insert("env.extra".into(), (DType::U8, vec![7]));
        assert_eq!(check_rollout_layout(&own), Ok(()), "an env's own entries");
        assert_eq!(
            check_rollout_layout(&BatchLayout::new()),
            Err("its collector.traj_ids is absent, a rollout's is i64 []".to_string())
        );
        let mut done = l.clone();
        done.insert(keys::NEXT_DONE.into(), (DType::U8, vec![1]));
        assert_eq!(
            check_rollout_layout(&done),
            Err("its next.done is u8 [1], a rollout's is bool [1]".to_string())
        );
        let mut obs = l.clone();
        obs.insert(keys::NEXT_OBSERVATION.into(), (DType::F32, vec![4]));
        assert_eq!(
            check_rollout_layout(&obs),
            Err("its next.observation is f32 [4], its observation f32 [3]".to_string())
        );
        obs.insert(keys::OBSERVATION.into(), (DType::I64, vec![4]));
        assert!(check_rollout_layout(&obs).unwrap_err().contains("a rollout's is f32"));
        let mut act = l;
        act.insert(keys::ACTION.into(), (DType::I64, vec![2]));
        assert_eq!(
            check_rollout_layout(&act),
            Err("its action is i64 [2], a rollout's is i64 [] or f32".to_string())
        );
    }

    #[test]
    fn a_layout_is_compared_with_the_trainers_under_its_name() {
        let a = layout();
        assert_eq!(named_difference("node 2", &a, "env E", &a), None);
        assert_eq!(
            named_difference("node 2", &BatchLayout::new(), "env E", &a).as_deref(),
            Some("node 2's observation is absent, env E's is f32 [3]")
        );
    }

    #[test]
    fn a_tensor_of_fewer_dims_than_the_batch_is_a_difference_not_a_panic() {
        // Only a dict built in memory can break its own invariant this way.
        let l = BatchLayout::from([(keys::TRAJ_IDS.to_string(), (DType::I64, vec![]))]);
        let mut d = TensorDict::new(&[2]);
        d.set(keys::TRAJ_IDS, Tensor::zeros(DType::I64, &[2])).unwrap();
        assert_eq!(check_layout(&d, &l), Ok(()));
        *d.get_mut(keys::TRAJ_IDS).unwrap() = Tensor::zeros(DType::I64, &[]);
        assert_eq!(
            check_layout(&d, &l),
            Err("`collector.traj_ids` has 0 dims, fewer than the batch's 1".to_string())
        );
    }
}
