//! What a node needs to build its env workers: the same value for a local node
//! (handed over in memory) and a remote one (sent in the join handshake).

use serde::{Deserialize, Serialize};

use crate::env::{EnvSpec, Registry};
use crate::policy::PolicySpec;
use crate::rollout::{Rollout, RolloutConfig, RolloutError, TrajIds};

/// Everything that defines one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    /// The node's index, `0..nodes`.
    pub index: usize,
    /// The env every worker of the node builds.
    pub env: EnvSpec,
    /// The policy every worker of the node builds.
    pub policy: PolicySpec,
    /// Env workers on this node (torchrl's `num_workers_per_collector`).
    pub envs_per_node: usize,
    /// The trajectory-id lane of this node's first worker.
    pub first_lane: u64,
    /// Lanes in the whole run (total env workers over all nodes).
    pub lanes: u64,
    /// Collection-loop settings; `frames_per_batch` is the largest share a worker is asked for.
    pub rollout: RolloutConfig,
}

impl NodeSpec {
    /// Builds the rollout of worker `worker` (one env), seeded `rollout.seed + worker`.
    pub fn build_worker(&self, registry: &Registry, worker: usize) -> Result<Rollout, RolloutError> {
        let env = registry
            .make(&self.env)
            .map_err(|source| RolloutError::Env { env: worker, source })?;
        let seed = self.rollout.seed.wrapping_add(worker as u64);
        let policy = self.policy.build(
            env.observation_spec(),
            env.action_spec(),
            seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 1,
        )?;
        let ids = TrajIds::new(self.first_lane + worker as u64, self.lanes)?;
        let mut cfg = self.rollout.clone();
        cfg.seed = seed;
        Rollout::new(vec![env], policy, vec![ids], cfg)
    }

    /// Builds the rollouts of all the node's workers.
    pub fn build_workers(&self, registry: &Registry) -> Result<Vec<Rollout>, RolloutError> {
        (0..self.envs_per_node)
            .map(|w| self.build_worker(registry, w))
            .collect()
    }
}
