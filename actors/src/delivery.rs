//! What happens to a batch between the trainer's machine yielding it and its consumer
//! seeing it, on every start path alike (the blocking collector's pulls, an embedded
//! run's `NextBatch` pulls and its subscriber's pushes): trajectories split, the
//! user's [`Postproc`], the replay buffer filled, and the consumer's deadline.

use std::time::Duration;

use rollout::machine::Collected;
use rollout::postproc;
use rollout::TensorDict;

use crate::error::CollectError;
use crate::replay::{self, SharedReplayBuffer};

/// A transformation applied to every yielded batch (torchrl's `postproc`), e.g. n-step returns.
pub trait Postproc: Send {
    /// Transforms one batch.
    fn apply(&self, batch: TensorDict) -> Result<TensorDict, String>;
}

impl<F> Postproc for F
where
    F: Fn(TensorDict) -> Result<TensorDict, String> + Send,
{
    fn apply(&self, batch: TensorDict) -> Result<TensorDict, String> {
        self(batch)
    }
}

impl Postproc for postproc::MultiStep {
    fn apply(&self, batch: TensorDict) -> Result<TensorDict, String> {
        postproc::MultiStep::apply(self, &batch).map_err(|e| e.to_string())
    }
}

/// The builder's delivery settings, applied by the trainer to every batch it yields.
#[derive(Default)]
pub(crate) struct Delivery {
    /// Batches split into trajectories (`[n_traj, max_len]` with `collector.mask`).
    pub(crate) split_trajs: bool,
    /// Applied after the split.
    pub(crate) postproc: Option<Box<dyn Postproc>>,
    /// Where the frames go (after `postproc`); the consumer then gets the batch's
    /// metadata and shape only.
    pub(crate) replay_buffer: Option<SharedReplayBuffer>,
    /// Longest wait of the consumer for one batch (`None`: no limit).
    pub(crate) batch_timeout: Option<Duration>,
    /// Where the trainer counts what it sees (`None`: metrics are off).
    pub(crate) metrics: Option<crate::metrics::RunMetrics>,
}

impl Delivery {
    /// `c` as its consumer receives it.
    pub(crate) fn apply(&self, mut c: Collected) -> Result<Collected, CollectError> {
        if self.split_trajs {
            if c.node.is_none() {
                // Split, a sync batch's first axis is no longer its nodes: each frame's
                // weights version travels with it.
                let versions = rollout::Tensor::I64(c.policy_version());
                c.data
                    .set(rollout::rollout::keys::WEIGHTS_VERSION, versions)
                    .map_err(|e| CollectError::Postproc(e.to_string()))?;
            }
            c.data = postproc::split_trajectories(&c.data).map_err(|e| CollectError::Postproc(e.to_string()))?;
        }
        if let Some(p) = &self.postproc {
            c.data = p.apply(c.data).map_err(CollectError::Postproc)?;
        }
        if let Some(buffer) = &self.replay_buffer {
            replay::lock(buffer).extend(&c.data)?;
            c.data = TensorDict::new(c.data.batch_size());
        }
        Ok(c)
    }

    /// Whether a batch handed back by the consumer is still the storage a node filled
    /// (and can be collected into again): not once it was split, transformed or
    /// emptied into the replay buffer.
    pub(crate) fn keeps_storage(&self) -> bool {
        !self.split_trajs && self.postproc.is_none() && self.replay_buffer.is_none()
    }
}
