//! The `Local` launcher: trainer and nodes on the calling system's arbiter,
//! one arbiter thread per env worker.

use actix::prelude::*;
use rollout::machine::{NodeMachine, TrainerMachine};
use rollout::node_spec::NodeSpec;
use rollout::Registry;

use crate::env_worker::EnvWorker;
use crate::error::CollectError;
use crate::node::Node;
use crate::trainer::Trainer;

/// What a launch started: the trainer and the threads to join at the end.
pub struct Started {
    /// The trainer.
    pub trainer: Addr<Trainer>,
    /// One arbiter per env worker; stopped and joined at shutdown.
    pub arbiters: Vec<Arbiter>,
}

/// Starts a trainer over local nodes. Must run inside a running actix `System`.
/// Every env and policy is built first, so a bad config fails here, before any thread starts.
/// The trainer seeds the nodes with `seed` before its first batch, and checks each
/// node's batches against the layout of the workers built for it here.
pub fn start(
    machine: TrainerMachine,
    specs: &[NodeSpec],
    registry: &Registry,
    seed: u64,
) -> Result<Started, CollectError> {
    let mut rollouts = Vec::with_capacity(specs.len());
    for spec in specs {
        rollouts.push(spec.build_workers(registry).map_err(|source| CollectError::NodeBuild {
            node: spec.index,
            source,
        })?);
    }
    let layouts = rollouts.iter().map(|w| w.first().map(|r| r.batch_layout())).collect();
    let machine = machine.with_layouts(layouts);
    let trainer_ctx = Context::<Trainer>::new();
    let trainer = trainer_ctx.address();
    let mut arbiters = Vec::new();
    let mut nodes = Vec::with_capacity(specs.len());
    let mut recyclers = Vec::with_capacity(specs.len());
    for (spec, workers) in specs.iter().zip(rollouts) {
        let node_ctx = Context::<Node>::new();
        let node_addr = node_ctx.address();
        let mut addrs = Vec::with_capacity(workers.len());
        let mut handles = Vec::with_capacity(workers.len());
        for (w, rollout) in workers.into_iter().enumerate() {
            let arbiter = Arbiter::new();
            let to_node = node_addr.clone().recipient();
            addrs.push(EnvWorker::start_in_arbiter(&arbiter.handle(), move |_| {
                EnvWorker::new(w, rollout, to_node, true)
            }));
            handles.push(arbiter.handle());
            arbiters.push(arbiter);
        }
        let machine = NodeMachine::from_spec(spec);
        node_ctx.run(Node::new(machine, addrs, trainer.clone().recipient()).with_rebuild(
            spec.clone(),
            registry.clone(),
            handles,
        ));
        recyclers.push(Some(node_addr.clone().recipient()));
        nodes.push(node_addr.recipient());
    }
    trainer_ctx.run(
        Trainer::new(machine, nodes)
            .with_recyclers(recyclers)
            .with_initial_seed(seed),
    );
    Ok(Started { trainer, arbiters })
}
