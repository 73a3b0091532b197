//! What the machine wants done, and the batches it yields.

#[cfg(doc)]
use super::TrainerMachine;
use crate::checkpoint::Checkpoint;
use crate::message::ToNode;
use crate::tensor::TensorDict;

/// A batch ready for the consumer.
#[derive(Clone, Debug, PartialEq)]
pub struct Collected {
    /// 0-based index of the batch in the run.
    pub index: u64,
    /// The node that collected it (async), or `None` for a sync batch stacked from all nodes.
    pub node: Option<usize>,
    /// The oldest weights version any of its frames were collected with.
    pub weights_version: u64,
    /// Weights version of each share (one entry per node in sync mode, one in async):
    /// every frame of a share was acted by those weights (a node applies updates
    /// between batches only). [`Collected::policy_version`] spreads them over the frames.
    pub weights_versions: Vec<u64>,
    /// Versions the oldest of its frames' weights was behind the stored weights when it
    /// was yielded (0: collected with the latest).
    pub policy_lag: u64,
    /// Its lag is past the run's `max_policy_lag` and it was delivered anyway (the
    /// run's `deliver_lagging`; without it such a batch is dropped and asked again).
    pub lagging: bool,
    /// The frames: `[nodes, envs, T]` in sync mode, `[envs, T]` in async mode.
    pub data: TensorDict,
}

impl Collected {
    /// The weights version each frame's action came from, shaped as the batch
    /// (torchrl's `policy_version`): a sync batch's first axis is its nodes, each
    /// with its share's version; a sync batch split into trajectories carries them
    /// per frame under `collector.weights_version`.
    pub fn policy_version(&self) -> ndarray::ArrayD<i64> {
        let size = self.data.batch_size().to_vec();
        let of = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        if let Ok(crate::tensor::Tensor::I64(v)) = self.data.get(crate::schema::keys::WEIGHTS_VERSION) {
            if v.shape() == size.as_slice() {
                return v.clone();
            }
        }
        match self.weights_versions.as_slice() {
            [one] => ndarray::ArrayD::from_elem(size, of(*one)),
            per_node if size.first() == Some(&per_node.len()) && self.node.is_none() => {
                let mut a = ndarray::ArrayD::zeros(size);
                for (mut share, &v) in a.outer_iter_mut().zip(per_node) {
                    share.fill(of(v));
                }
                a
            }
            _ => ndarray::ArrayD::from_elem(size, of(self.weights_version)),
        }
    }
}

/// What the machine wants done.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// Send `msg` to node `node`.
    Send {
        /// Node index.
        node: usize,
        /// The message.
        msg: ToNode,
    },
    /// Hand this batch to the consumer.
    Yield(Collected),
    /// `total_frames` have been yielded; no batch will come.
    Finished,
    /// The seeding chain is complete; `next_seed` is the first seed no node used.
    Seeded {
        /// The first unused seed.
        next_seed: u64,
    },
    /// Every node answered `Shutdown` with `Down`.
    AllDown,
    /// Node `node` failed and is to be restarted (restart number `restart` over its
    /// life): the launcher brings it back and calls [`TrainerMachine::node_restarted`],
    /// or [`TrainerMachine::node_restart_failed`] when it cannot.
    RestartNode {
        /// Node index.
        node: usize,
        /// The restart's number over the node's life, from 1.
        restart: u32,
        /// The failure.
        cause: String,
    },
    /// A share was copied into a yielded batch: its storage can go back to
    /// `node` for reuse (an in-process optimisation; remote nodes ignore it).
    Recycle {
        /// Node index.
        node: usize,
        /// The share.
        data: TensorDict,
    },
    /// The checkpoint asked for by [`TrainerMachine::begin_checkpoint`].
    Checkpoint(Box<Checkpoint>),
    /// The checkpoint asked for could not be taken; collection goes on.
    CheckpointFailed(String),
    /// A batch of node `node` was dropped unyielded: its weights were `policy_lag`
    /// versions behind the stored ones, past the run's `max_policy_lag`. Its frames
    /// are asked again (counted in [`SupervisionStats`](super::SupervisionStats)).
    DroppedLagging {
        /// Node index.
        node: usize,
        /// Frames dropped.
        frames: u64,
        /// Versions behind.
        policy_lag: u64,
    },
}

/// A batch to yield; its index and lag are set when it is yielded.
pub(super) fn node_batch(node: Option<usize>, versions: Vec<u64>, data: TensorDict) -> Collected {
    Collected {
        index: 0,
        node,
        weights_version: versions.iter().copied().min().unwrap_or(0),
        weights_versions: versions,
        policy_lag: 0,
        lagging: false,
        data,
    }
}
