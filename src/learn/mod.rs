//! Learning from collected batches: a policy-gradient learner with no actors and
//! no threads (the `rollout-actors` crate runs it as an actor).
//!
//! [`Ppo`] trains the `Linear` and `Mlp` softmax policies on discrete actions:
//! a clipped-surrogate policy loss on GAE advantages (normalised per batch), a
//! separate value network, Adam, gradients written out by hand over flat f64
//! slices. Every update yields new [`Weights`](crate::Weights) with the
//! policy's own names and shapes, ready for the nodes.
//!
//! Batches are used as they come: a trajectory cut by the end of a batch is
//! bootstrapped with the value of its last next observation, so no frame waits
//! for a later batch. [`EpisodeTracker`] follows episode returns across batches
//! by trajectory id, for progress reports and stopping rules.

use std::collections::{BTreeMap, VecDeque};

use crate::schema::keys;
use crate::tensor::{TensorDict, TensorError};

pub mod adam;
pub mod advantage;
pub mod net;
pub mod ppo;

pub use adam::{Adam, AdamState};
pub use net::DenseNet;
pub use ppo::{Ppo, PpoConfig, PpoState, UpdateStats};

/// What went wrong while learning.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LearnError {
    /// A hyper-parameter or network shape the learner cannot use.
    #[error("bad learner config: {0}")]
    Config(String),
    /// A policy or action space without a gradient here.
    #[error("cannot learn {0}")]
    Unsupported(String),
    /// Weights of the wrong names or shapes.
    #[error("bad weights: {0}")]
    Weights(String),
    /// A batch without the keys, dtypes or shapes the learner needs.
    #[error("bad batch: {0}")]
    Batch(String),
    /// A tensor error while reading a batch.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// The weights became NaN or infinite.
    #[error("training diverged: {0}")]
    Diverged(String),
    /// Saved learner state that does not fit the learner it is loaded into, or is
    /// inconsistent in itself.
    #[error("bad checkpoint: {0}")]
    Checkpoint(String),
}

/// Sums rewards per trajectory id across batches and records every finished episode's return.
///
/// Serialisable for checkpoints; deserialising checks the invariants (window no
/// longer than its length, counts consistent) so a hand-edited or corrupt file fails
/// to load instead of breaking [`Self::mean`] or [`Self::window_full`] later.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "TrackerRepr")]
pub struct EpisodeTracker {
    partial: BTreeMap<i64, f64>,
    window: VecDeque<f64>,
    window_len: usize,
    episodes: u64,
    best: Option<f64>,
}

/// The serialised form of an [`EpisodeTracker`], checked before it becomes one.
#[derive(serde::Deserialize)]
struct TrackerRepr {
    partial: BTreeMap<i64, f64>,
    window: VecDeque<f64>,
    window_len: usize,
    episodes: u64,
    best: Option<f64>,
}

impl TryFrom<TrackerRepr> for EpisodeTracker {
    type Error = LearnError;

    fn try_from(r: TrackerRepr) -> Result<EpisodeTracker, LearnError> {
        let bad = |why: String| Err(LearnError::Checkpoint(format!("episode tracker: {why}")));
        if r.window_len == 0 {
            return bad("a window of 0 episodes".into());
        }
        if r.window.len() > r.window_len {
            return bad(format!("{} returns in a window of {}", r.window.len(), r.window_len));
        }
        if r.window.len() as u64 > r.episodes {
            return bad(format!(
                "{} returns in the window but {} episodes",
                r.window.len(),
                r.episodes
            ));
        }
        if r.best.is_some() != (r.episodes > 0) {
            return bad(format!("best return {:?} after {} episodes", r.best, r.episodes));
        }
        Ok(EpisodeTracker {
            partial: r.partial,
            window: r.window,
            window_len: r.window_len,
            episodes: r.episodes,
            best: r.best,
        })
    }
}

impl EpisodeTracker {
    /// A tracker whose [`Self::mean`] covers the last `window` episodes (at least 1).
    pub fn new(window: usize) -> EpisodeTracker {
        EpisodeTracker {
            window_len: window.max(1),
            ..EpisodeTracker::default()
        }
    }

    /// Reads `next.reward`, `next.done` and `collector.traj_ids` of a batch (`[.., T]`,
    /// time last); returns the returns of the episodes that ended in it, in order
    /// (lane by lane, then time).
    pub fn observe(&mut self, batch: &TensorDict) -> Result<Vec<f64>, crate::learn::LearnError> {
        let reward = batch.f32(keys::NEXT_REWARD)?;
        let done = batch.bool(keys::NEXT_DONE)?;
        let ids = batch.i64(keys::TRAJ_IDS)?;
        if reward.len() != ids.len() || done.len() != ids.len() {
            return Err(LearnError::Batch(format!(
                "{} rewards, {} dones and {} trajectory ids",
                reward.len(),
                done.len(),
                ids.len()
            )));
        }
        let mut ended = Vec::new();
        for ((&r, &d), &id) in reward.iter().zip(done.iter()).zip(ids.iter()) {
            let sum = self.partial.entry(id).or_insert(0.0);
            *sum += f64::from(r);
            if d {
                let total = self.partial.remove(&id).unwrap_or(0.0);
                ended.push(total);
                self.episodes += 1;
                self.best = Some(self.best.map_or(total, |b| b.max(total)));
                self.window.push_back(total);
                if self.window.len() > self.window_len {
                    self.window.pop_front();
                }
            }
        }
        Ok(ended)
    }

    /// Episodes finished so far.
    pub fn episodes(&self) -> u64 {
        self.episodes
    }

    /// Mean return of the last `window` episodes (fewer at the start), `None` before the first.
    pub fn mean(&self) -> Option<f64> {
        (!self.window.is_empty()).then(|| self.window.iter().sum::<f64>() / self.window.len() as f64)
    }

    /// How many episodes [`Self::mean`] covers, so a resumed run can check that it
    /// was started with the same window.
    pub fn window_len(&self) -> usize {
        self.window_len
    }

    /// True once `window` episodes have finished.
    pub fn window_full(&self) -> bool {
        self.window.len() == self.window_len
    }

    /// The best return so far.
    pub fn best(&self) -> Option<f64> {
        self.best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;
    use ndarray::{ArrayD, IxDyn};

    fn batch(reward: &[f32], done: &[bool], ids: &[i64], shape: &[usize]) -> TensorDict {
        let mut td = TensorDict::new(shape);
        let fshape: Vec<usize> = [shape, &[1]].concat();
        td.set(
            keys::NEXT_REWARD,
            Tensor::F32(ArrayD::from_shape_vec(IxDyn(&fshape), reward.to_vec()).unwrap()),
        )
        .unwrap();
        td.set(
            keys::NEXT_DONE,
            Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&fshape), done.to_vec()).unwrap()),
        )
        .unwrap();
        td.set(
            keys::TRAJ_IDS,
            Tensor::I64(ArrayD::from_shape_vec(IxDyn(shape), ids.to_vec()).unwrap()),
        )
        .unwrap();
        td
    }

    #[test]
    fn episodes_span_batches_by_trajectory_id() {
        let mut t = EpisodeTracker::new(2);
        assert_eq!(t.mean(), None);
        // Two lanes of 3 steps: lane 0 ends traj 0 after 2 steps and starts traj 2;
        // lane 1 runs traj 1 past the batch end.
        let b1 = batch(
            &[1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
            &[false, true, false, false, false, false],
            &[0, 0, 2, 1, 1, 1],
            &[2, 3],
        );
        assert_eq!(t.observe(&b1).unwrap(), [2.0]);
        let b2 = batch(
            &[1.0, 1.0, 1.0, 2.0, 1.0, 1.0],
            &[false, true, false, true, false, false],
            &[2, 2, 4, 1, 3, 3],
            &[2, 3],
        );
        assert_eq!(t.observe(&b2).unwrap(), [3.0, 5.0]);
        assert_eq!(t.episodes(), 3);
        assert_eq!(t.mean(), Some(4.0), "the window holds the last two");
        assert!(t.window_full());
        assert_eq!(t.best(), Some(5.0));
    }

    /// A tracker saved with an episode in progress and restored carries on summing it:
    /// the rest of the trajectory gives the same returns as on the original.
    #[test]
    fn roundtrip_keeps_partial_episodes() {
        let mut t = EpisodeTracker::new(3);
        let b1 = batch(
            &[1.0, 2.0, 0.5, 1.0],
            &[true, false, false, false],
            &[7, 8, 9, 9],
            &[2, 2],
        );
        assert_eq!(t.observe(&b1).unwrap(), [1.0]);
        let bytes = rmp_serde::to_vec_named(&t).unwrap();
        let mut u: EpisodeTracker = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(u, t);
        assert_eq!(u.window_len(), 3);
        let b2 = batch(
            &[3.0, 1.0, 1.0, 4.0],
            &[true, false, false, true],
            &[8, 10, 9, 9],
            &[2, 2],
        );
        let want = t.observe(&b2).unwrap();
        assert_eq!(want, [5.0, 6.5], "traj 8 and 9 finish with their earlier rewards");
        assert_eq!(u.observe(&b2).unwrap(), want);
        assert_eq!(u, t);
    }

    /// A file whose window holds more returns than its length is refused, not loaded.
    #[test]
    fn deserialising_checks_the_window() {
        #[derive(serde::Serialize)]
        struct Raw {
            partial: BTreeMap<i64, f64>,
            window: Vec<f64>,
            window_len: usize,
            episodes: u64,
            best: Option<f64>,
        }
        let raw = |window: Vec<f64>, window_len, episodes, best| Raw {
            partial: BTreeMap::new(),
            window,
            window_len,
            episodes,
            best,
        };
        let load = |r: Raw| rmp_serde::from_slice::<EpisodeTracker>(&rmp_serde::to_vec_named(&r).unwrap());
        assert!(load(raw(vec![1.0, 2.0], 2, 2, Some(2.0))).is_ok());
        let err = load(raw(vec![1.0, 2.0, 3.0], 2, 3, Some(3.0))).unwrap_err();
        assert!(err.to_string().contains("3 returns in a window of 2"), "{err}");
        assert!(load(raw(vec![], 0, 0, None)).is_err());
        assert!(load(raw(vec![1.0], 2, 0, None)).is_err());
        assert!(load(raw(vec![], 2, 1, None)).is_err());
    }
}
