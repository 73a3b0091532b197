//! [`Shares`]: how a run's frames are shared out, computed and checked once.
//!
//! One number, `frames_per_batch`, means three things at three levels, and each
//! level has its own name here: the **run's batch** (what the consumer is handed),
//! a **node's share** of it (sync: the batch split evenly over the nodes; async: a
//! whole batch), and **an env's share** of that (the node's share over its envs,
//! the `frames_per_batch` of a node spec on the wire); an env worker steps
//! `envs_per_worker` envs, so its batch is that many envs' shares. Every rule about
//! how they divide lives in [`Shares::new`]; the planner, the trainer machine and the
//! node spec read the numbers from here and check nothing of their own.

use crate::config_error::ConfigError;

/// A run's batch, its nodes' and envs' shares of it, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shares {
    frames_per_batch: usize,
    envs_per_node: Vec<usize>,
    envs_per_worker: usize,
    sync: bool,
    total_frames: Option<u64>,
}

impl Shares {
    /// The shares of a run of `envs_per_node.len()` nodes, or the error naming the
    /// setting that does not divide: every node has envs, whole workers of
    /// `envs_per_worker` envs, and every batch (the last one of `total_frames`
    /// included) splits into equal env shares (sync: over the nodes first, which
    /// then need equal env counts, since their shares are stacked).
    pub fn new(
        frames_per_batch: usize,
        envs_per_node: Vec<usize>,
        envs_per_worker: usize,
        sync: bool,
        total_frames: Option<u64>,
    ) -> Result<Shares, ConfigError> {
        fn err(field: &'static str, reason: impl Into<String>) -> ConfigError {
            ConfigError::new(field, reason)
        }
        let n = envs_per_node.len();
        if n == 0 {
            return Err(err("nodes", "must be at least 1"));
        }
        if let Some(i) = envs_per_node.iter().position(|&k| k == 0) {
            return Err(err("envs_per_node", format!("node {i} has no env")));
        }
        let per = envs_per_worker;
        if per == 0 {
            return Err(err("envs_per_worker", "must be at least 1"));
        }
        if let Some(i) = envs_per_node.iter().position(|&k| !k.is_multiple_of(per)) {
            return Err(err(
                "envs_per_worker",
                format!("{per} does not divide node {i}'s {} envs", envs_per_node[i]),
            ));
        }
        let f = frames_per_batch;
        if f == 0 {
            return Err(err("frames_per_batch", "must be at least 1"));
        }
        if total_frames == Some(0) {
            return Err(err("total_frames", "must be at least 1 (or endless)"));
        }
        let tail = total_frames.map_or(0, |t| (t % f as u64) as usize);
        if sync {
            if let Some(i) = envs_per_node.iter().position(|&k| k != envs_per_node[0]) {
                return Err(err(
                    "envs_per_node",
                    format!(
                        "sync collection stacks node shares, so every node needs the same env count, but node {i} \
                         has {} envs and node 0 has {}",
                        envs_per_node[i], envs_per_node[0]
                    ),
                ));
            }
            if !f.is_multiple_of(n) {
                return Err(err(
                    "frames_per_batch",
                    format!("sync collection splits {f} frames evenly over {n} nodes, and {n} does not divide {f}"),
                ));
            }
            let (share, k) = (f / n, envs_per_node[0]);
            if !share.is_multiple_of(k) {
                return Err(err(
                    "frames_per_batch",
                    format!("each node's share of {share} frames must divide over its {k} envs"),
                ));
            }
            if tail != 0 && (!tail.is_multiple_of(n) || !(tail / n).is_multiple_of(k)) {
                return Err(err(
                    "total_frames",
                    format!("the last batch of {tail} frames cannot be split evenly over {n} nodes x {k} envs"),
                ));
            }
        } else {
            if let Some(i) = envs_per_node.iter().position(|&k| !f.is_multiple_of(k)) {
                return Err(err(
                    "frames_per_batch",
                    format!(
                        "{f} frames do not divide over the {} envs of node {i}",
                        envs_per_node[i]
                    ),
                ));
            }
            if let Some(i) = envs_per_node.iter().position(|&k| !tail.is_multiple_of(k)) {
                return Err(err(
                    "total_frames",
                    format!(
                        "the last batch of {tail} frames cannot be split over the {} envs of node {i}",
                        envs_per_node[i]
                    ),
                ));
            }
        }
        Ok(Shares {
            frames_per_batch,
            envs_per_node,
            envs_per_worker,
            sync,
            total_frames,
        })
    }

    /// Number of nodes (an elastic run: its slots).
    pub fn nodes(&self) -> usize {
        self.envs_per_node.len()
    }

    /// Frames of the run's batch, what the consumer is handed (the last one of a run
    /// may be smaller: [`Self::last_batch`]).
    pub fn frames_per_batch(&self) -> usize {
        self.frames_per_batch
    }

    /// Frames to collect in all; `None` collects until shutdown.
    pub fn total_frames(&self) -> Option<u64> {
        self.total_frames
    }

    /// Sync (every node collects a share of each batch, stacked) or async (each batch
    /// is one node's).
    pub fn sync(&self) -> bool {
        self.sync
    }

    /// The envs of each node, in node order.
    pub fn envs_per_node(&self) -> &[usize] {
        &self.envs_per_node
    }

    /// The envs of node `node`.
    pub fn envs(&self, node: usize) -> usize {
        self.envs_per_node[node]
    }

    /// Envs each env worker steps (one policy call per step for all of them).
    pub fn envs_per_worker(&self) -> usize {
        self.envs_per_worker
    }

    /// The frames of the run's batch when `remaining` frames are still wanted: the
    /// whole batch, or the smaller last one.
    pub fn batch_frames(&self, remaining: Option<u64>) -> usize {
        match remaining {
            Some(r) if r < self.frames_per_batch as u64 => r as usize,
            _ => self.frames_per_batch,
        }
    }

    /// A node's share of a batch of `batch` frames: sync, an even split over the
    /// nodes; async, the whole batch.
    pub fn node_share_of(&self, batch: usize) -> usize {
        if self.sync {
            batch / self.nodes()
        } else {
            batch
        }
    }

    /// A node's share of a whole batch, the most a node is asked for at once.
    pub fn node_share(&self) -> usize {
        self.node_share_of(self.frames_per_batch)
    }

    /// An env's share of node `node`'s share: what a node spec calls
    /// `frames_per_batch` on the wire, the most one env is asked for at once.
    pub fn env_share(&self, node: usize) -> usize {
        self.node_share() / self.envs(node)
    }

    /// An env worker's batch on node `node`: the shares of its envs.
    pub fn worker_share(&self, node: usize) -> usize {
        self.env_share(node) * self.envs_per_worker
    }

    /// Trajectory-id lanes in the whole run: one per env.
    pub fn lanes(&self) -> u64 {
        self.envs_per_node.iter().map(|&k| k as u64).sum()
    }

    /// The lane of node `node`'s first env: the envs of the nodes before it.
    pub fn first_lane(&self, node: usize) -> u64 {
        self.envs_per_node[..node].iter().map(|&k| k as u64).sum()
    }
}

/// An env worker's batch of `envs_per_worker` envs each asked for `env_share`
/// frames, or `None` when the product overflows (a spec from a peer).
pub fn worker_frames(env_share: usize, envs_per_worker: usize) -> Option<usize> {
    env_share.checked_mul(envs_per_worker)
}

#[cfg(test)]
mod tests {
    use super::Shares;

    fn field(r: Result<Shares, super::ConfigError>) -> Option<&'static str> {
        r.err().map(|e| e.field)
    }

    fn shares(
        nodes: usize,
        envs: usize,
        f: usize,
        total: Option<u64>,
        sync: bool,
    ) -> Result<Shares, super::ConfigError> {
        Shares::new(f, vec![envs; nodes], 1, sync, total)
    }

    #[test]
    fn valid_shares_pass() {
        assert_eq!(field(shares(2, 2, 8, Some(16), true)), None);
        assert_eq!(field(shares(3, 2, 4, None, false)), None);
    }

    #[test]
    fn each_invalid_setting_is_named() {
        assert_eq!(field(shares(0, 1, 4, None, false)), Some("nodes"));
        assert_eq!(field(shares(1, 0, 4, None, false)), Some("envs_per_node"));
        assert_eq!(field(shares(1, 1, 0, None, false)), Some("frames_per_batch"));
        assert_eq!(field(shares(1, 1, 4, Some(0), false)), Some("total_frames"));
        assert_eq!(field(Shares::new(4, vec![2], 0, false, None)), Some("envs_per_worker"));
        assert_eq!(
            field(Shares::new(12, vec![6, 4], 3, false, None)),
            Some("envs_per_worker")
        );
    }

    #[test]
    fn sync_needs_even_shares_over_equal_nodes() {
        assert_eq!(field(shares(3, 1, 8, None, true)), Some("frames_per_batch"));
        assert_eq!(field(shares(2, 3, 8, None, true)), Some("frames_per_batch"));
        assert_eq!(field(Shares::new(8, vec![1, 2], 1, true, None)), Some("envs_per_node"));
        assert_eq!(field(shares(2, 2, 8, Some(10), true)), Some("total_frames"));
        assert_eq!(
            field(shares(2, 2, 8, Some(12), true)),
            None,
            "a last batch of 4 = 2 nodes x 2 envs"
        );
    }

    #[test]
    fn async_batches_and_the_last_one_divide_over_each_nodes_envs() {
        assert_eq!(field(shares(1, 3, 8, None, false)), Some("frames_per_batch"));
        assert_eq!(field(shares(1, 2, 8, Some(9), false)), Some("total_frames"));
        assert_eq!(
            field(Shares::new(12, vec![2, 3], 1, false, None)),
            None,
            "async nodes may differ"
        );
    }

    #[test]
    fn each_level_has_its_share() -> Result<(), super::ConfigError> {
        let sync = Shares::new(48, vec![4, 4, 4], 2, true, Some(120))?;
        assert_eq!(sync.node_share(), 16, "sync: the batch over 3 nodes");
        assert_eq!(sync.env_share(1), 4, "a node's share over its 4 envs");
        assert_eq!(sync.worker_share(1), 8, "a worker steps 2 envs");
        assert_eq!(sync.batch_frames(Some(24)), 24, "the last batch");
        assert_eq!(sync.node_share_of(24), 8);
        assert_eq!((sync.lanes(), sync.first_lane(2)), (12, 8));
        let not_sync = Shares::new(12, vec![2, 6], 2, false, None)?;
        assert_eq!(not_sync.node_share(), 12, "async: a node makes whole batches");
        assert_eq!((not_sync.env_share(0), not_sync.env_share(1)), (6, 2));
        assert_eq!(not_sync.worker_share(1), 4);
        assert_eq!(not_sync.batch_frames(None), 12);
        Ok(())
    }
}
