//! Starting one node: its env workers, each on an arbiter thread of its own, and the
//! node actor over them. The one path shared by in-process nodes (the `Local`
//! launcher, and its restarts) and nodes that joined a trainer over TCP.

use std::sync::Arc;

use actix::prelude::*;
use rollout::machine::NodeMachine;
use rollout::message::FromNode;
use rollout::node_spec::NodeSpec;
use rollout::policy::Weights;
use rollout::rollout::{Rollout, RolloutError};
use rollout::Registry;

use crate::env_worker::{worker_arbiter, EnvWorker};
use crate::messages::Deliver;
use crate::node::Node;

/// A node that was started.
pub(crate) struct StartedNode {
    /// The node actor.
    pub(crate) addr: Addr<Node>,
    /// One arbiter per env worker; the owner stops and joins them.
    pub(crate) arbiters: Vec<Arbiter>,
}

/// Builds node `spec`'s env workers, each starting from `weights` when given (a joining
/// node's `Welcome` weights). Built before anything starts, so a bad config fails first.
pub(crate) fn build_workers(
    spec: &NodeSpec,
    registry: &Registry,
    weights: Option<&Weights>,
) -> Result<Vec<Rollout>, RolloutError> {
    let mut workers = spec.build_workers(registry)?;
    if let Some(w) = weights {
        for r in &mut workers {
            r.set_weights(w)?;
        }
    }
    Ok(workers)
}

/// Starts node `spec` over `workers` (from [`build_workers`]), each on an arbiter of its
/// own, its messages going to `trainer`. `weights` are the ones the workers started
/// from: a restarted worker gets them too, until an update replaces them. The node
/// rebuilds a failed worker from `spec` and `registry`.
pub(crate) fn start_node(
    spec: &NodeSpec,
    registry: &Registry,
    workers: Vec<Rollout>,
    weights: Option<Arc<Weights>>,
    trainer: Recipient<Deliver<FromNode>>,
) -> StartedNode {
    let node_ctx = Context::<Node>::new();
    let node_addr = node_ctx.address();
    let mut addrs = Vec::with_capacity(workers.len());
    let mut handles = Vec::with_capacity(workers.len());
    let mut arbiters = Vec::with_capacity(workers.len());
    for (w, rollout) in workers.into_iter().enumerate() {
        let arbiter = worker_arbiter(spec.worker_nice);
        let to_node = node_addr.clone().recipient();
        addrs.push(EnvWorker::start_in_arbiter(&arbiter.handle(), move |_| {
            EnvWorker::new(w, rollout, to_node, true)
        }));
        handles.push(arbiter.handle());
        arbiters.push(arbiter);
    }
    let mut machine = NodeMachine::from_spec(spec);
    if let Some(w) = weights {
        machine = machine.with_weights(w);
    }
    node_ctx.run(Node::new(machine, addrs, trainer).with_rebuild(spec.clone(), registry.clone(), handles));
    StartedNode {
        addr: node_addr,
        arbiters,
    }
}
