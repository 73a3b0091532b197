//! The `Local` launcher: trainer and nodes on the calling system's arbiter,
//! one arbiter thread per env worker.

use std::sync::Arc;

use actix::prelude::*;
use rollout::node_spec::NodeSpec;
use rollout::{Registry, Weights};

use super::NodePlan;
use crate::error::CollectError;
use crate::node::{Halt, Node};
use crate::node_start::{build_workers, start_node, StartedNode};
use crate::trainer::{NodeRestartFailed, NodeRestarted, Restarter, Trainer};

/// What a launch started: the trainer and the threads to join at the end.
pub struct Started {
    /// The trainer.
    pub trainer: Addr<Trainer>,
    /// One arbiter per env worker; stopped and joined at shutdown.
    pub arbiters: Vec<Arbiter>,
}

/// Restarts local nodes in place: the old node actor is halted and its env workers'
/// arbiters stopped, a new node is built from its [`NodeSpec`].
pub(crate) struct LocalRestarter {
    specs: Vec<NodeSpec>,
    registry: Registry,
    /// Version 0 of each node's weights, as the trainer built them.
    weights: Vec<Option<Arc<Weights>>>,
    nodes: Vec<Addr<Node>>,
    /// The arbiters of each node's current workers.
    handles: Vec<Vec<ArbiterHandle>>,
    /// Arbiters started by restarts; stopped and joined when the restarter goes.
    spawned: Vec<Arbiter>,
}

impl Restarter for LocalRestarter {
    fn restart(&mut self, node: usize, restart: u32, cause: &str, trainer: Addr<Trainer>) {
        let (Some(spec), Some(old)) = (self.specs.get(node), self.nodes.get(node)) else {
            trainer.do_send(NodeRestartFailed {
                node,
                reason: "no such local node".into(),
            });
            return;
        };
        old.do_send(Halt);
        for h in self.handles[node].drain(..) {
            h.stop();
        }
        tracing::warn!(node, restart, %cause, "rebuilding local node");
        // Version 0 from the trainer; the trainer pushes newer weights once the node is back.
        let weights = self.weights.get(node).cloned().flatten();
        let workers = match build_workers(spec, &self.registry, weights.as_deref()) {
            Ok(w) => w,
            Err(e) => {
                trainer.do_send(NodeRestartFailed {
                    node,
                    reason: format!("rebuilding node {node} failed: {e}"),
                });
                return;
            }
        };
        let StartedNode { addr, arbiters, .. } = start_node(
            spec,
            &self.registry,
            workers,
            weights,
            None,
            trainer.clone().recipient(),
        );
        self.handles[node] = arbiters.iter().map(Arbiter::handle).collect();
        self.spawned.extend(arbiters);
        self.nodes[node] = addr.clone();
        trainer.do_send(NodeRestarted {
            node,
            recipient: addr.clone().recipient(),
            recycler: Some(addr.recipient()),
        });
    }
}

impl Drop for LocalRestarter {
    fn drop(&mut self) {
        for a in &self.spawned {
            a.stop();
        }
        for a in self.spawned.drain(..) {
            let _ = a.join();
        }
    }
}

/// Starts a trainer over local nodes. Must run inside a running actix `System`.
/// Every env and policy is built first, so a bad config fails here, before any thread starts.
/// The trainer seeds the nodes with `seed` before its first batch, and checks each
/// node's batches against the layout of the workers built for it here. With
/// supervision on in `machine`, failed nodes are rebuilt in place from their spec.
pub(crate) fn start(plan: NodePlan) -> Result<Started, CollectError> {
    let NodePlan {
        machine,
        specs,
        registry,
        seed,
        delivery,
    } = plan;
    let (specs, registry) = (&specs[..], &registry);
    // Every node starts from the trainer's version 0, handed over at construction.
    let weights: Vec<Option<Arc<Weights>>> = (0..specs.len()).map(|i| machine.initial_weights(i).cloned()).collect();
    let mut rollouts = Vec::with_capacity(specs.len());
    for (spec, w) in specs.iter().zip(&weights) {
        rollouts.push(
            build_workers(spec, registry, w.as_deref()).map_err(|source| CollectError::NodeBuild {
                node: spec.index,
                source,
            })?,
        );
    }
    let layouts = rollouts.iter().map(|w| w.first().map(|r| r.batch_layout())).collect();
    let machine = machine.with_layouts(layouts);
    let trainer_ctx = Context::<Trainer>::new();
    let trainer = trainer_ctx.address();
    let mut arbiters = Vec::new();
    let mut nodes = Vec::with_capacity(specs.len());
    let mut recyclers = Vec::with_capacity(specs.len());
    let mut addrs = Vec::with_capacity(specs.len());
    let mut handles = Vec::with_capacity(specs.len());
    for ((spec, workers), w) in specs.iter().zip(rollouts).zip(&weights) {
        let StartedNode {
            addr: node_addr,
            arbiters: node_arbiters,
            ..
        } = start_node(spec, registry, workers, w.clone(), None, trainer.clone().recipient());
        handles.push(node_arbiters.iter().map(Arbiter::handle).collect());
        arbiters.extend(node_arbiters);
        recyclers.push(Some(node_addr.clone().recipient()));
        nodes.push(node_addr.clone().recipient());
        addrs.push(node_addr);
    }
    let supervised = machine.supervision().is_some();
    let mut t = Trainer::new(machine, nodes)
        .with_recyclers(recyclers)
        .with_initial_seed(seed)
        .with_delivery(delivery);
    if supervised {
        t = t.with_restarter(Box::new(LocalRestarter {
            specs: specs.to_vec(),
            registry: registry.clone(),
            weights,
            nodes: addrs,
            handles,
            spawned: Vec::new(),
        }));
    }
    trainer_ctx.run(t);
    Ok(Started { trainer, arbiters })
}
