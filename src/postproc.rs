//! Post-processing of collected batches: trajectory splitting and n-step returns.
//!
//! A collected batch is a [`TensorDict`] whose batch shape ends in the time
//! dim: `[K, T]` (K envs, T steps) or `[N, K, T]` (N nodes). Both functions
//! here flatten every leading batch dim except time into *rows* (C order, so
//! row `r` of a `[N, K, T]` batch is node `r / K`, env `r % K`) and treat the
//! rows independently: nothing ever crosses from one row to the next.
//!
//! Trajectories are found from `collector.traj_ids` (one `i64` per frame):
//! a trajectory is a maximal run of equal ids within a row. A trajectory may
//! have started before the batch and may continue after it, so a row can hold
//! a partial trajectory at each end.
//!
//! * [`split_trajectories`] regroups a batch into one padded row per
//!   trajectory, like torchrl's `split_trajectories`.
//! * [`MultiStep`] replaces one-step rewards by discounted n-step returns,
//!   like torchrl's `MultiStep` post-processor.

use ndarray::{ArrayD, IxDyn};

use crate::schema::keys;
use crate::tensor::{DType, Tensor, TensorDict, TensorError};

/// Key of the per-frame trajectory ids (`i64`, shape `[.., T]` or `[.., T, 1]`): the
/// batch schema's [`keys::TRAJ_IDS`], named once there.
pub const TRAJ_IDS_KEY: &str = keys::TRAJ_IDS;
/// Key of the validity mask added by [`split_trajectories`] (`bool`, `[n_traj, max_len]`):
/// [`keys::MASK`].
pub const MASK_KEY: &str = keys::MASK;
/// Key of the reward (`f32`, `[.., T, ..]`, usually `[.., T, 1]`): [`keys::NEXT_REWARD`].
pub const REWARD_KEY: &str = keys::NEXT_REWARD;
/// Key of the done flag (`bool`, `[.., T, 1]`): [`keys::NEXT_DONE`].
pub const DONE_KEY: &str = keys::NEXT_DONE;
/// Key added by [`MultiStep`]: frames looked ahead (`i64`, `[.., T, 1]`).
pub const STEPS_TO_NEXT_OBS_KEY: &str = "steps_to_next_obs";
/// Key added by [`MultiStep`]: discount of the bootstrap value (`f32`, `[.., T, 1]`).
pub const GAMMA_KEY: &str = "gamma";

/// Prefix of the entries describing the state after a transition.
const NEXT_PREFIX: &str = "next.";

/// What went wrong while post-processing a batch.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PostprocError {
    /// A key the operation needs is absent from the batch.
    #[error("{op}: the batch has no `{key}` entry")]
    MissingKey {
        /// The missing dotted key.
        key: String,
        /// The operation that needed it.
        op: &'static str,
    },
    /// An entry is present but has an unusable shape.
    #[error("{op}: bad `{key}`: {reason}")]
    BadEntry {
        /// The offending dotted key.
        key: String,
        /// The operation that read it.
        op: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The batch has no batch dim, so no time dim.
    #[error("{op}: the batch needs a time dim, but its batch shape is {batch_size:?}")]
    NoTimeDim {
        /// The operation.
        op: &'static str,
        /// The batch shape found.
        batch_size: Vec<usize>,
    },
    /// A constructor parameter is out of its domain.
    #[error("invalid `{field}`: {reason}")]
    InvalidParam {
        /// The parameter's name.
        field: &'static str,
        /// Why it is rejected.
        reason: String,
    },
    /// The batch already carries an entry the operation would add.
    #[error("{op}: the batch already has `{key}` (was it applied twice?)")]
    AlreadyApplied {
        /// The existing key.
        key: String,
        /// The operation.
        op: &'static str,
    },
    /// A tensor operation failed (dtype mismatch, shape mismatch, ...).
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// Rows and time steps of a batch whose leading dims are flattened into rows.
#[derive(Clone, Copy, Debug)]
struct Layout {
    rows: usize,
    time: usize,
}

impl Layout {
    fn of(batch: &TensorDict, op: &'static str) -> Result<Layout, PostprocError> {
        batch.validate()?;
        let bs = batch.batch_size();
        let (&time, lead) = bs.split_last().ok_or_else(|| PostprocError::NoTimeDim {
            op,
            batch_size: bs.to_vec(),
        })?;
        Ok(Layout {
            rows: lead.iter().product(),
            time,
        })
    }

    fn frames(self) -> usize {
        self.rows * self.time
    }
}

/// The tensor under `key`, or a [`PostprocError::MissingKey`] naming it.
fn require<'a>(batch: &'a TensorDict, key: &str, op: &'static str) -> Result<&'a Tensor, PostprocError> {
    batch.get(key).map_err(|_| PostprocError::MissingKey {
        key: key.to_string(),
        op,
    })
}

/// The feature shape of `tensor` (its dims after the batch dims).
fn feature_shape<'a>(
    tensor: &'a Tensor,
    batch: &TensorDict,
    key: &str,
    op: &'static str,
) -> Result<&'a [usize], PostprocError> {
    let nb = batch.batch_size().len();
    let shape = tensor.shape();
    match shape.get(..nb) {
        Some(lead) if lead == batch.batch_size() => Ok(&shape[nb..]),
        _ => Err(PostprocError::BadEntry {
            key: key.to_string(),
            op,
            reason: format!(
                "shape {shape:?} does not start with the batch shape {:?}",
                batch.batch_size()
            ),
        }),
    }
}

/// Reads a one-element-per-frame entry (shape `[.., T]` or `[.., T, 1]`) in C order.
fn per_frame<A: Clone>(
    batch: &TensorDict,
    key: &str,
    op: &'static str,
    dtype: DType,
    view: fn(&Tensor) -> Option<&ArrayD<A>>,
) -> Result<Vec<A>, PostprocError> {
    let tensor = require(batch, key, op)?;
    let array = view(tensor).ok_or_else(|| TensorError::DType {
        key: key.to_string(),
        expected: dtype,
        got: tensor.dtype(),
    })?;
    let feat = feature_shape(tensor, batch, key, op)?;
    if feat.iter().product::<usize>() != 1 {
        return Err(PostprocError::BadEntry {
            key: key.to_string(),
            op,
            reason: format!("expected one element per frame, got feature shape {feat:?}"),
        });
    }
    Ok(array.iter().cloned().collect())
}

/// A run of frames of one trajectory within one row, in flat frame indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    start: usize,
    len: usize,
}

impl Segment {
    fn end(self) -> usize {
        self.start + self.len
    }
}

/// Cuts each row into trajectory segments, in row order then time order.
///
/// A segment ends at the end of its row, before a change of id, after a done
/// frame (when `done` is given) and before a frame whose `valid` flag is false
/// (such frames belong to no segment).
fn segments(layout: Layout, ids: &[i64], done: Option<&[bool]>, valid: Option<&[bool]>) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for row in 0..layout.rows {
        let mut current: Option<Segment> = None;
        for f in row * layout.time..(row + 1) * layout.time {
            if valid.is_some_and(|v| !v[f]) {
                out.extend(current.take());
                continue;
            }
            current = match current {
                Some(mut seg) if ids[f - 1] == ids[f] && !done.is_some_and(|d| d[f - 1]) => {
                    seg.len += 1;
                    Some(seg)
                }
                previous => {
                    out.extend(previous);
                    Some(Segment { start: f, len: 1 })
                }
            };
        }
        out.extend(current);
    }
    out
}

/// Splits a batch into one zero-padded row per trajectory.
///
/// All leading batch dims except time are flattened into rows; each row is
/// cut wherever `collector.traj_ids` changes (and at its ends, so a
/// trajectory never spans two rows). The result has batch shape
/// `[n_traj, max_len]` where `max_len` is the longest trajectory found;
/// trajectories come in order of first appearance, scanning rows in order
/// and each row in time order. Every entry of the input is carried over, for
/// any dtype and feature shape, with zeros (`false` for bool) after the end
/// of each trajectory, and `collector.mask` (`bool`, `[n_traj, max_len]`) is
/// set to true on real frames and false on padding. If the input already has
/// a per-frame `collector.mask`, the new mask is the old one (moved along
/// with the frames) AND the new one.
///
/// Only ids cut trajectories, as in torchrl: a done frame followed by a frame
/// with the same id stays in one trajectory. A run of an id that reappears
/// later in the same row, after another id, becomes a separate trajectory.
/// An empty batch (no row or no step) gives batch shape `[0, 0]`.
///
/// # Errors
///
/// [`PostprocError::MissingKey`] without `collector.traj_ids`;
/// [`PostprocError::BadEntry`] or a dtype error if it is not one `i64` per
/// frame; [`PostprocError::NoTimeDim`] if the batch shape is empty.
pub fn split_trajectories(batch: &TensorDict) -> Result<TensorDict, PostprocError> {
    const OP: &str = "split_trajectories";
    let layout = Layout::of(batch, OP)?;
    let ids = per_frame(batch, TRAJ_IDS_KEY, OP, DType::I64, Tensor::as_i64)?;
    let old_mask = if batch.contains(MASK_KEY) {
        Some(per_frame(batch, MASK_KEY, OP, DType::Bool, Tensor::as_bool)?)
    } else {
        None
    };
    let segs = segments(layout, &ids, None, None);
    let n_traj = segs.len();
    let max_len = segs.iter().map(|s| s.len).max().unwrap_or(0);
    let n = layout.frames();

    // Index of the source frame of each output slot; `n` is an appended zero frame.
    let mut index = vec![n; n_traj * max_len];
    let mut mask = vec![false; n_traj * max_len];
    for (i, seg) in segs.iter().enumerate() {
        for k in 0..seg.len {
            let f = seg.start + k;
            index[i * max_len + k] = f;
            mask[i * max_len + k] = old_mask.as_ref().is_none_or(|m| m[f]);
        }
    }

    let mut out = TensorDict::new(&[n_traj, max_len]);
    for (key, tensor) in batch.iter() {
        let feat = feature_shape(tensor, batch, key, OP)?;
        let mut flat_shape = vec![n];
        flat_shape.extend_from_slice(feat);
        let mut pad_shape = vec![1];
        pad_shape.extend_from_slice(feat);
        let mut out_shape = vec![n_traj, max_len];
        out_shape.extend_from_slice(feat);

        let flat = tensor.clone().reshape(&flat_shape)?;
        let padded = Tensor::cat(&[&flat, &Tensor::zeros(tensor.dtype(), &pad_shape)], key)?;
        out.set(key, padded.select(0, &index)?.reshape(&out_shape)?)?;
    }
    let mask = ArrayD::from_shape_vec(IxDyn(&[n_traj, max_len]), mask)
        .map_err(|e| TensorError::Invalid(format!("`{MASK_KEY}`: {e}")))?;
    out.set(MASK_KEY, Tensor::Bool(mask))?;
    Ok(out)
}

/// Torchrl's `MultiStep` n-step return post-processor, applied within one batch.
///
/// For each frame `t` of a trajectory, with `m` the number of frames looked
/// ahead, `m = min(n_steps, frames from t to the last frame of its trajectory
/// in the row)`, where a trajectory's last frame is a done frame, the frame
/// before a change of `collector.traj_ids`, or the last frame of the row:
///
/// * `next.reward` becomes `sum_{i<m} gamma^i * r[t+i]` (element-wise for
///   multi-dim rewards);
/// * every other `next.*` entry (`next.observation`, `next.done`,
///   `next.terminated`, `next.truncated`, ...) becomes that of frame `t+m-1`;
/// * `steps_to_next_obs` (`i64`, `[.., T, 1]`) is set to `m`;
/// * `gamma` (`f32`, `[.., T, 1]`) is set to `gamma^m`, the discount to apply
///   to the value bootstrapped from the new `next.observation` (masked by the
///   new `next.terminated`/`next.done` as usual).
///
/// Entries outside `next.` are unchanged.
///
/// **Batch boundaries.** torchrl's collector-side `MultiStep` keeps the last
/// `n_steps` frames in a buffer and completes them with the next batch; this
/// one is stateless and sees one batch only, so near the end of a row whose
/// trajectory continues into the next batch `m` is truncated to the frames
/// available (the last frame of such a row gets `m = 1`). Those frames still
/// carry a correct, shorter return with the matching `steps_to_next_obs` and
/// `gamma`; they are just not full `n_steps` returns.
///
/// **Padding.** If the batch has a per-frame `collector.mask` (e.g. it comes
/// from [`split_trajectories`]), frames where it is false are excluded from
/// every trajectory and left unchanged, with `steps_to_next_obs = 0` and
/// `gamma = 1`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MultiStep {
    gamma: f32,
    n_steps: usize,
}

impl MultiStep {
    /// A post-processor discounting by `gamma` over at most `n_steps` frames.
    ///
    /// # Errors
    ///
    /// [`PostprocError::InvalidParam`] naming `gamma` unless it is in
    /// `[0, 1]` (NaN is rejected), or naming `n_steps` if it is 0.
    pub fn new(gamma: f32, n_steps: usize) -> Result<Self, PostprocError> {
        if !(0.0..=1.0).contains(&gamma) {
            return Err(PostprocError::InvalidParam {
                field: "gamma",
                reason: format!("must be in [0, 1], got {gamma}"),
            });
        }
        if n_steps == 0 {
            return Err(PostprocError::InvalidParam {
                field: "n_steps",
                reason: "must be at least 1, got 0".into(),
            });
        }
        Ok(MultiStep { gamma, n_steps })
    }

    /// The discount factor.
    pub fn gamma(&self) -> f32 {
        self.gamma
    }

    /// The maximum number of frames looked ahead.
    pub fn n_steps(&self) -> usize {
        self.n_steps
    }

    /// Returns a copy of `batch` with n-step rewards and shifted `next.*` entries.
    ///
    /// See the type's documentation for the semantics. The batch shape must end
    /// in the time dim; any number of leading dims is accepted.
    ///
    /// # Errors
    ///
    /// [`PostprocError::MissingKey`] without `collector.traj_ids`,
    /// `next.done` or `next.reward`; a dtype error if they are not `i64`,
    /// `bool` and `f32`; [`PostprocError::BadEntry`] if ids, done or mask are
    /// not one element per frame; [`PostprocError::AlreadyApplied`] if the
    /// batch already has `steps_to_next_obs` or `gamma`.
    pub fn apply(&self, batch: &TensorDict) -> Result<TensorDict, PostprocError> {
        const OP: &str = "MultiStep";
        let layout = Layout::of(batch, OP)?;
        for key in [STEPS_TO_NEXT_OBS_KEY, GAMMA_KEY] {
            if batch.contains(key) {
                return Err(PostprocError::AlreadyApplied {
                    key: key.into(),
                    op: OP,
                });
            }
        }
        let ids = per_frame(batch, TRAJ_IDS_KEY, OP, DType::I64, Tensor::as_i64)?;
        let done = per_frame(batch, DONE_KEY, OP, DType::Bool, Tensor::as_bool)?;
        let valid = if batch.contains(MASK_KEY) {
            Some(per_frame(batch, MASK_KEY, OP, DType::Bool, Tensor::as_bool)?)
        } else {
            None
        };
        let reward_tensor = require(batch, REWARD_KEY, OP)?;
        let reward_array = reward_tensor.as_f32().ok_or_else(|| TensorError::DType {
            key: REWARD_KEY.into(),
            expected: DType::F32,
            got: reward_tensor.dtype(),
        })?;
        let reward_feat = feature_shape(reward_tensor, batch, REWARD_KEY, OP)?;
        let width: usize = reward_feat.iter().product();
        let reward: Vec<f32> = reward_array.iter().copied().collect();

        let n = layout.frames();
        // gamma^i for every i that can occur (m never exceeds T).
        let max_m = self.n_steps.min(layout.time);
        let mut powers = Vec::with_capacity(max_m + 1);
        let mut p = 1.0f64;
        for _ in 0..=max_m {
            powers.push(p);
            p *= f64::from(self.gamma);
        }

        let mut source: Vec<usize> = (0..n).collect();
        let mut steps = vec![0i64; n];
        let mut discount = vec![1.0f32; n];
        let mut new_reward = reward.clone();
        for seg in segments(layout, &ids, Some(&done), valid.as_deref()) {
            for f in seg.start..seg.end() {
                let m = self.n_steps.min(seg.end() - f);
                source[f] = f + m - 1;
                steps[f] = i64::try_from(m).map_err(|e| TensorError::Invalid(e.to_string()))?;
                discount[f] = powers[m] as f32;
                for c in 0..width {
                    let sum: f64 = (0..m).map(|i| powers[i] * f64::from(reward[(f + i) * width + c])).sum();
                    new_reward[f * width + c] = sum as f32;
                }
            }
        }

        let mut out = batch.clone();
        for (key, tensor) in batch.iter() {
            if !key.starts_with(NEXT_PREFIX) || key == REWARD_KEY {
                continue;
            }
            let feat = feature_shape(tensor, batch, key, OP)?;
            let mut flat_shape = vec![n];
            flat_shape.extend_from_slice(feat);
            let shifted = tensor.clone().reshape(&flat_shape)?.select(0, &source)?;
            out.set(key, shifted.reshape(tensor.shape())?)?;
        }
        let shape_err = |key: &str, e: ndarray::ShapeError| TensorError::Invalid(format!("`{key}`: {e}"));
        let reward =
            ArrayD::from_shape_vec(IxDyn(reward_tensor.shape()), new_reward).map_err(|e| shape_err(REWARD_KEY, e))?;
        out.set(REWARD_KEY, Tensor::F32(reward))?;
        let mut frame_shape = batch.batch_size().to_vec();
        frame_shape.push(1);
        let steps =
            ArrayD::from_shape_vec(IxDyn(&frame_shape), steps).map_err(|e| shape_err(STEPS_TO_NEXT_OBS_KEY, e))?;
        out.set(STEPS_TO_NEXT_OBS_KEY, Tensor::I64(steps))?;
        let discount = ArrayD::from_shape_vec(IxDyn(&frame_shape), discount).map_err(|e| shape_err(GAMMA_KEY, e))?;
        out.set(GAMMA_KEY, Tensor::F32(discount))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
    }
    fn i64s(shape: &[usize], v: Vec<i64>) -> Tensor {
        Tensor::I64(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
    }
    fn bools(shape: &[usize], v: &[u8]) -> Tensor {
        Tensor::Bool(ArrayD::from_shape_vec(IxDyn(shape), v.iter().map(|&b| b == 1).collect()).unwrap())
    }
    fn vf32(td: &TensorDict, key: &str) -> Vec<f32> {
        td.f32(key).unwrap().iter().copied().collect()
    }
    fn vi64(td: &TensorDict, key: &str) -> Vec<i64> {
        td.i64(key).unwrap().iter().copied().collect()
    }
    fn vbool(td: &TensorDict, key: &str) -> Vec<u8> {
        td.bool(key).unwrap().iter().map(|&b| u8::from(b)).collect()
    }

    /// A [2, 6] batch: row 0 holds trajectories 10 (started before the batch,
    /// done at t=1), 12 (done at t=4) and 14 (continues after the batch);
    /// row 1 holds 11 (started before, done at t=3) and 13 (continues).
    fn split_batch() -> TensorDict {
        let obs: Vec<f32> = (0..2)
            .flat_map(|r| (0..6).flat_map(move |t| [(10 * r + t) as f32, (100 + 10 * r + t) as f32]))
            .collect();
        TensorDict::from_entries(
            &[2, 6],
            [
                ("observation".to_string(), f32s(&[2, 6, 2], obs)),
                (
                    "action".to_string(),
                    i64s(&[2, 6], vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
                ),
                (
                    "collector.traj_ids".to_string(),
                    i64s(&[2, 6], vec![10, 10, 12, 12, 12, 14, 11, 11, 11, 11, 13, 13]),
                ),
                (
                    "next.done".to_string(),
                    bools(&[2, 6, 1], &[0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0]),
                ),
                (
                    "next.reward".to_string(),
                    f32s(
                        &[2, 6, 1],
                        vec![0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5, 11.5],
                    ),
                ),
                (
                    "step_count".to_string(),
                    i64s(&[2, 6, 1], vec![3, 4, 0, 1, 2, 0, 5, 6, 7, 8, 0, 1]),
                ),
            ],
        )
        .unwrap()
    }

    #[test]
    fn split_groups_pads_and_orders_trajectories() {
        let out = split_trajectories(&split_batch()).unwrap();
        // Order of first appearance: 10, 12, 14 (row 0), then 11, 13 (row 1); longest is 11 (4 frames).
        assert_eq!(out.batch_size(), &[5, 4]);
        assert_eq!(
            vi64(&out, TRAJ_IDS_KEY),
            vec![10, 10, 0, 0, 12, 12, 12, 0, 14, 0, 0, 0, 11, 11, 11, 11, 13, 13, 0, 0]
        );
        assert_eq!(
            vbool(&out, MASK_KEY),
            vec![1, 1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0]
        );
        assert_eq!(out.get("observation").unwrap().shape(), &[5, 4, 2]);
        assert_eq!(
            vf32(&out, "observation"),
            vec![
                0., 100., 1., 101., 0., 0., 0., 0., //
                2., 102., 3., 103., 4., 104., 0., 0., //
                5., 105., 0., 0., 0., 0., 0., 0., //
                10., 110., 11., 111., 12., 112., 13., 113., //
                14., 114., 15., 115., 0., 0., 0., 0.,
            ]
        );
        assert_eq!(
            vi64(&out, "action"),
            vec![1, 2, 0, 0, 3, 4, 5, 0, 6, 0, 0, 0, 7, 8, 9, 10, 11, 12, 0, 0]
        );
        assert_eq!(out.get("next.done").unwrap().shape(), &[5, 4, 1]);
        assert_eq!(
            vbool(&out, "next.done"),
            vec![0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
        );
        assert_eq!(
            vf32(&out, "next.reward"),
            vec![0.5, 1.5, 0., 0., 2.5, 3.5, 4.5, 0., 5.5, 0., 0., 0., 6.5, 7.5, 8.5, 9.5, 10.5, 11.5, 0., 0.]
        );
        assert_eq!(
            vi64(&out, "step_count"),
            vec![3, 4, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 5, 6, 7, 8, 0, 1, 0, 0]
        );
        assert_eq!(out.len(), 7);
    }

    #[test]
    fn split_flattens_node_and_env_dims() {
        let flat = split_trajectories(&split_batch()).unwrap();
        let nested = split_trajectories(&split_batch().reshape(&[1, 2, 6]).unwrap()).unwrap();
        assert_eq!(flat, nested);
        // [2, 1, 6]: two nodes of one env each gives the same rows too.
        let nodes = split_trajectories(&split_batch().reshape(&[2, 1, 6]).unwrap()).unwrap();
        assert_eq!(flat, nodes);
    }

    #[test]
    fn split_cuts_at_row_ends_even_with_equal_ids() {
        // Malformed on purpose: id 7 ends row 0 and starts row 1; rows are never joined.
        let batch = TensorDict::from_entries(
            &[2, 2],
            [("collector.traj_ids".to_string(), i64s(&[2, 2, 1], vec![7, 7, 7, 8]))],
        )
        .unwrap();
        let out = split_trajectories(&batch).unwrap();
        assert_eq!(out.batch_size(), &[3, 2]);
        assert_eq!(vi64(&out, TRAJ_IDS_KEY), vec![7, 7, 7, 0, 8, 0]);
        assert_eq!(vbool(&out, MASK_KEY), vec![1, 1, 1, 0, 1, 0]);
    }

    #[test]
    fn split_of_empty_batch_is_empty() {
        let batch = TensorDict::from_entries(
            &[3, 0],
            [
                ("collector.traj_ids".to_string(), i64s(&[3, 0], vec![])),
                ("observation".to_string(), f32s(&[3, 0, 4], vec![])),
            ],
        )
        .unwrap();
        let out = split_trajectories(&batch).unwrap();
        assert_eq!(out.batch_size(), &[0, 0]);
        assert_eq!(out.get("observation").unwrap().shape(), &[0, 0, 4]);
        assert_eq!(out.get(MASK_KEY).unwrap().shape(), &[0, 0]);
    }

    #[test]
    fn split_errors() {
        let mut batch = split_batch();
        batch.remove(TRAJ_IDS_KEY);
        let err = split_trajectories(&batch).unwrap_err();
        assert_eq!(
            err,
            PostprocError::MissingKey {
                key: "collector.traj_ids".into(),
                op: "split_trajectories"
            }
        );
        assert!(err.to_string().contains("`collector.traj_ids`"), "{err}");

        let mut batch = split_batch();
        batch.remove(TRAJ_IDS_KEY);
        batch.set(TRAJ_IDS_KEY, f32s(&[2, 6], vec![0.; 12])).unwrap();
        let err = split_trajectories(&batch).unwrap_err();
        assert!(matches!(err, PostprocError::Tensor(TensorError::DType { .. })), "{err}");

        let mut batch = split_batch();
        batch.remove(TRAJ_IDS_KEY);
        batch.set(TRAJ_IDS_KEY, i64s(&[2, 6, 2], vec![0; 24])).unwrap();
        let err = split_trajectories(&batch).unwrap_err();
        assert!(matches!(err, PostprocError::BadEntry { .. }), "{err}");
        assert!(err.to_string().contains("collector.traj_ids"), "{err}");

        let err = split_trajectories(&TensorDict::new(&[])).unwrap_err();
        assert!(matches!(err, PostprocError::NoTimeDim { .. }), "{err}");
    }

    /// A [2, 8] batch. Row 0: trajectory 0 (t=0..3, terminated at t=3), then
    /// trajectory 1 (t=4..7, continues after the batch). Row 1: one id (5)
    /// throughout, but truncated at t=2, so t=0..2 and t=3..7 are separate.
    fn multistep_batch() -> TensorDict {
        let next_obs: Vec<f32> = (0..2)
            .flat_map(|r| (0..8).flat_map(move |t| [(10 * r + t + 1) as f32, -((10 * r + t + 1) as f32)]))
            .collect();
        let obs: Vec<f32> = (0..2)
            .flat_map(|r| (0..8).flat_map(move |t| [(10 * r + t) as f32, -((10 * r + t) as f32)]))
            .collect();
        let row0_done = [0, 0, 0, 1, 0, 0, 0, 0];
        let row1_done = [0, 0, 1, 0, 0, 0, 0, 0];
        let none = [0u8; 8];
        let cat = |a: &[u8], b: &[u8]| -> Vec<u8> { a.iter().chain(b).copied().collect() };
        TensorDict::from_entries(
            &[2, 8],
            [
                ("observation".to_string(), f32s(&[2, 8, 2], obs)),
                ("next.observation".to_string(), f32s(&[2, 8, 2], next_obs)),
                ("action".to_string(), i64s(&[2, 8], (0..16).collect())),
                (
                    "next.reward".to_string(),
                    f32s(&[2, 8, 1], (1..=16).map(|v| v as f32).collect()),
                ),
                ("next.done".to_string(), bools(&[2, 8, 1], &cat(&row0_done, &row1_done))),
                (
                    "next.terminated".to_string(),
                    bools(&[2, 8, 1], &cat(&row0_done, &none)),
                ),
                ("next.truncated".to_string(), bools(&[2, 8, 1], &cat(&none, &row1_done))),
                (
                    "collector.traj_ids".to_string(),
                    i64s(&[2, 8], vec![0, 0, 0, 0, 1, 1, 1, 1, 5, 5, 5, 5, 5, 5, 5, 5]),
                ),
            ],
        )
        .unwrap()
    }

    #[test]
    fn multistep_three_steps_half_discount() {
        let batch = multistep_batch();
        let out = MultiStep::new(0.5, 3).unwrap().apply(&batch).unwrap();
        assert_eq!(out.batch_size(), &[2, 8]);
        // Row 0: r = 1..8; ends at t=3 (done) and t=7 (batch end).
        //   t0: 1 + .5*2 + .25*3 = 2.75   t1: 2 + 1.5 + 1 = 4.5   t2: 3 + 2 = 5   t3: 4
        //   t4: 5 + 3 + 1.75 = 9.75       t5: 6 + 3.5 + 2 = 11.5  t6: 7 + 4 = 11  t7: 8
        // Row 1: r = 9..16; ends at t=2 (truncated, same id) and t=7.
        //   t0: 9 + 5 + 2.75 = 16.75      t1: 10 + 5.5 = 15.5     t2: 11
        //   t3: 12 + 6.5 + 3.5 = 22       t4: 13 + 7 + 3.75 = 23.75
        //   t5: 14 + 7.5 + 4 = 25.5       t6: 15 + 8 = 23         t7: 16
        assert_eq!(
            vf32(&out, "next.reward"),
            vec![2.75, 4.5, 5., 4., 9.75, 11.5, 11., 8., 16.75, 15.5, 11., 22., 23.75, 25.5, 23., 16.]
        );
        assert_eq!(out.get("next.reward").unwrap().shape(), &[2, 8, 1]);
        assert_eq!(
            vi64(&out, STEPS_TO_NEXT_OBS_KEY),
            vec![3, 3, 2, 1, 3, 3, 2, 1, 3, 2, 1, 3, 3, 3, 2, 1]
        );
        assert_eq!(out.get(STEPS_TO_NEXT_OBS_KEY).unwrap().shape(), &[2, 8, 1]);
        assert_eq!(
            vf32(&out, GAMMA_KEY),
            vec![
                0.125, 0.125, 0.25, 0.5, 0.125, 0.125, 0.25, 0.5, //
                0.125, 0.25, 0.5, 0.125, 0.125, 0.125, 0.25, 0.5
            ]
        );
        assert_eq!(out.get(GAMMA_KEY).unwrap().shape(), &[2, 8, 1]);
        // Source frames t+m-1: row 0 [2,3,3,3,6,7,7,7], row 1 [2,2,2,5,6,7,7,7];
        // next.observation of frame (r, s) is [10r+s+1, -(10r+s+1)].
        assert_eq!(
            vf32(&out, "next.observation"),
            vec![
                3., -3., 4., -4., 4., -4., 4., -4., 7., -7., 8., -8., 8., -8., 8., -8., //
                13., -13., 13., -13., 13., -13., 16., -16., 17., -17., 18., -18., 18., -18., 18., -18.
            ]
        );
        assert_eq!(
            vbool(&out, "next.done"),
            vec![0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            vbool(&out, "next.terminated"),
            vec![0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            vbool(&out, "next.truncated"),
            vec![0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0]
        );
        // Everything outside `next.` is untouched.
        for key in ["observation", "action", "collector.traj_ids"] {
            assert_eq!(out.get(key).unwrap(), batch.get(key).unwrap(), "{key}");
        }
        assert_eq!(out.len(), batch.len() + 2);
    }

    #[test]
    fn multistep_one_step_keeps_rewards_and_next() {
        let batch = multistep_batch();
        let out = MultiStep::new(0.5, 1).unwrap().apply(&batch).unwrap();
        for key in [
            "next.reward",
            "next.observation",
            "next.done",
            "next.terminated",
            "next.truncated",
        ] {
            assert_eq!(out.get(key).unwrap(), batch.get(key).unwrap(), "{key}");
        }
        assert_eq!(vi64(&out, STEPS_TO_NEXT_OBS_KEY), vec![1; 16]);
        assert_eq!(vf32(&out, GAMMA_KEY), vec![0.5; 16]);
    }

    #[test]
    fn multistep_long_horizon_stops_at_trajectory_end() {
        // n_steps larger than T: each frame sums to its trajectory's end.
        let out = MultiStep::new(1.0, usize::MAX)
            .unwrap()
            .apply(&multistep_batch())
            .unwrap();
        // Row 0: 1+2+3+4=10, 9, 7, 4, 5+6+7+8=26, 21, 15, 8.
        // Row 1: 9+10+11=30, 21, 11, 12+..+16=70, 58, 45, 31, 16.
        assert_eq!(
            vf32(&out, "next.reward"),
            vec![10., 9., 7., 4., 26., 21., 15., 8., 30., 21., 11., 70., 58., 45., 31., 16.]
        );
        assert_eq!(
            vi64(&out, STEPS_TO_NEXT_OBS_KEY),
            vec![4, 3, 2, 1, 4, 3, 2, 1, 3, 2, 1, 5, 4, 3, 2, 1]
        );
        assert_eq!(vf32(&out, GAMMA_KEY), vec![1.; 16]);
    }

    #[test]
    fn multistep_works_on_node_env_time_batches() {
        let ms = MultiStep::new(0.5, 3).unwrap();
        let flat = ms.apply(&multistep_batch()).unwrap();
        let nested = ms.apply(&multistep_batch().reshape(&[2, 1, 8]).unwrap()).unwrap();
        assert_eq!(nested.batch_size(), &[2, 1, 8]);
        assert_eq!(nested.reshape(&[2, 8]).unwrap(), flat);
    }

    #[test]
    fn multistep_skips_split_padding() {
        // Split gives [[id 0 x2, pad], [id 1 x3]]: padded frames also have id 0,
        // but the mask keeps them out of trajectory 0.
        let batch = TensorDict::from_entries(
            &[1, 5],
            [
                ("collector.traj_ids".to_string(), i64s(&[1, 5], vec![0, 0, 1, 1, 1])),
                ("next.reward".to_string(), f32s(&[1, 5, 1], vec![1., 2., 3., 4., 5.])),
                ("next.done".to_string(), bools(&[1, 5, 1], &[0, 0, 0, 0, 0])),
                (
                    "next.observation".to_string(),
                    f32s(&[1, 5, 1], vec![1., 2., 3., 4., 5.]),
                ),
            ],
        )
        .unwrap();
        let split = split_trajectories(&batch).unwrap();
        assert_eq!(split.batch_size(), &[2, 3]);
        let out = MultiStep::new(0.5, 2).unwrap().apply(&split).unwrap();
        // Trajectory 0: [1 + .5*2, 2, pad 0]; trajectory 1: [3 + .5*4, 4 + .5*5, 5].
        assert_eq!(vf32(&out, "next.reward"), vec![2., 2., 0., 5., 6.5, 5.]);
        assert_eq!(vi64(&out, STEPS_TO_NEXT_OBS_KEY), vec![2, 1, 0, 2, 2, 1]);
        assert_eq!(vf32(&out, GAMMA_KEY), vec![0.25, 0.5, 1., 0.25, 0.25, 0.5]);
        assert_eq!(vf32(&out, "next.observation"), vec![2., 2., 0., 4., 5., 5.]);
    }

    #[test]
    fn multistep_rejects_bad_parameters() {
        for gamma in [-0.1, 1.5, f32::NAN] {
            let err = MultiStep::new(gamma, 3).unwrap_err();
            assert!(
                matches!(err, PostprocError::InvalidParam { field: "gamma", .. }),
                "{err}"
            );
            assert!(err.to_string().contains("`gamma`"), "{err}");
        }
        let err = MultiStep::new(0.9, 0).unwrap_err();
        assert!(
            matches!(err, PostprocError::InvalidParam { field: "n_steps", .. }),
            "{err}"
        );
        assert!(err.to_string().contains("`n_steps`"), "{err}");
        assert!(MultiStep::new(0.0, 1).is_ok());
        assert!(MultiStep::new(1.0, 1).is_ok());
    }

    #[test]
    fn multistep_missing_keys_are_named() {
        let ms = MultiStep::new(0.9, 2).unwrap();
        for key in ["next.reward", "next.done", "collector.traj_ids"] {
            let mut batch = multistep_batch();
            batch.remove(key);
            let err = ms.apply(&batch).unwrap_err();
            assert_eq!(
                err,
                PostprocError::MissingKey {
                    key: key.into(),
                    op: "MultiStep"
                }
            );
            assert!(err.to_string().contains(&format!("`{key}`")), "{err}");
        }
        // Optional next entries may be absent.
        let mut batch = multistep_batch();
        batch.remove("next.observation");
        batch.remove("next.terminated");
        batch.remove("next.truncated");
        assert!(ms.apply(&batch).is_ok());
    }

    #[test]
    fn multistep_twice_is_an_error() {
        let ms = MultiStep::new(0.9, 2).unwrap();
        let once = ms.apply(&multistep_batch()).unwrap();
        let err = ms.apply(&once).unwrap_err();
        assert!(matches!(err, PostprocError::AlreadyApplied { .. }), "{err}");
    }

    #[test]
    fn multistep_reward_dtype_is_checked() {
        let mut batch = multistep_batch();
        batch.remove("next.reward");
        batch.set("next.reward", i64s(&[2, 8, 1], vec![1; 16])).unwrap();
        let err = MultiStep::new(0.9, 2).unwrap().apply(&batch).unwrap_err();
        assert!(err.to_string().contains("next.reward"), "{err}");
    }
}
