//! Configurations several scenario files run: collectors, trainer configs, weights.

use std::collections::BTreeMap;
use std::time::Duration;

use ndarray::ArrayD;
use rollout::machine::TrainerConfig;
use rollout::{PolicyConfig, Tensor, Weights};
use rollout_actors::{CollectorBuilder, DistributedCollector, Launcher};

/// Weights of the `Constant` policy: its action becomes `v` (version 0: the trainer
/// numbers what it is given).
pub fn value_weights(v: f32) -> Weights {
    let mut t = BTreeMap::new();
    t.insert("value".to_string(), Tensor::F32(ArrayD::from_elem(vec![1], v)));
    Weights::new(t)
}

/// A trainer config of `nodes` nodes of `envs` envs each, no automatic weight pushes.
pub fn trainer_config(nodes: usize, envs: usize, fpb: usize, total: Option<u64>, sync: bool) -> TrainerConfig {
    TrainerConfig {
        nodes,
        envs_per_node: vec![envs; nodes],
        frames_per_batch: fpb,
        total_frames: total,
        sync,
        update_after_each_batch: false,
        max_weight_update_interval: None,
        update_interval: None,
    }
}

/// Two process nodes (the `rollout` binary of [`crate::rollout_bin`]) of `Counting`
/// with a constant action 1.0, seed 0; joins and batches bounded by 20 s.
pub fn counting_process_builder(sync: bool, fpb: usize, total: i64) -> CollectorBuilder {
    DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .frames_per_batch(fpb)
        .total_frames(total)
        .sync(sync)
        .seed(0)
        .launcher(Launcher::Process)
        .node_program(crate::rollout_bin())
        .join_timeout(Duration::from_secs(20))
        .batch_timeout(Duration::from_secs(20))
}

/// Sync CartPole with a linear policy: 2 nodes of 2 envs, 5 batches of 400 frames.
pub fn cartpole_sync_builder(seed: u64) -> CollectorBuilder {
    DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .nodes(2)
        .envs_per_node(2)
        .frames_per_batch(400)
        .total_frames(2000)
        .sync(true)
        .seed(seed)
}

/// Two nodes (in process unless a launcher is set) of `Panicky` envs from `registry`
/// (see [`crate::panicky_registry`]), a constant action 1.0, seed 0; batches bounded by 20 s.
pub fn panicky_builder(registry: rollout::Registry) -> CollectorBuilder {
    DistributedCollector::builder()
        .env("Panicky")
        .registry(registry)
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .seed(0)
        .batch_timeout(Duration::from_secs(20))
}
