//! Starting one node: its env workers, each on an arbiter thread of its own, and the
//! node actor over them. The one path shared by in-process nodes (the `Local`
//! launcher, and its restarts) and nodes that joined a trainer over TCP.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use rollout::machine::NodeMachine;
use rollout::message::FromNode;
use rollout::node_spec::NodeSpec;
use rollout::policy::{PolicyError, Weights};
use rollout::rollout::{Rollout, RolloutError};
use rollout::Registry;

use crate::env_worker::{worker_arbiter, EnvWorker, Returned};
use crate::messages::Deliver;
use crate::node::Node;

/// A node that was started.
pub(crate) struct StartedNode {
    /// The node actor.
    pub(crate) addr: Addr<Node>,
    /// One arbiter per env worker; the owner stops and joins them.
    pub(crate) arbiters: Vec<Arbiter>,
    /// The workers' stop flag (the node's, see [`Node::with_stop_flag`]).
    pub(crate) stop: Arc<AtomicBool>,
}

impl StartedNode {
    /// Ends the workers' batches in flight between steps: before their arbiters are
    /// joined by an owner whose node may not have stopped (a lost connection).
    pub(crate) fn stop_workers(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Builds node `spec`'s env workers, each starting from `weights`: the trainer's (its
/// version 0, or the current ones for a node that rejoins). Built before anything
/// starts, so a bad config fails first. Without weights only a policy that has none
/// (`random`) can be built: a node never acts with weights it invented.
pub(crate) fn build_workers(
    spec: &NodeSpec,
    registry: &Registry,
    weights: Option<&Weights>,
) -> Result<Vec<Rollout>, RolloutError> {
    let mut workers = spec.build_workers(registry)?;
    match weights {
        Some(w) => {
            for r in &mut workers {
                r.set_weights(w)?;
            }
        }
        None => {
            if let Some(needed) = workers.first().map(|r| r.weights()).filter(|w| !w.tensors.is_empty()) {
                return Err(RolloutError::Policy(PolicyError::Weights(format!(
                    "the trainer sent no weights and the policy needs {}",
                    describe_layout(needed)
                ))));
            }
        }
    }
    Ok(workers)
}

/// [`build_workers`] for a node that joined over TCP: without weights (a trainer
/// that builds them once the nodes reported their env's specs), a policy that has
/// some is built too, and what it needs is returned: the node waits for them (an
/// `update_weights`) before it collects.
pub(crate) fn build_workers_awaiting(
    spec: &NodeSpec,
    registry: &Registry,
    weights: Option<&Weights>,
) -> Result<(Vec<Rollout>, Option<String>), RolloutError> {
    if weights.is_some() {
        return build_workers(spec, registry, weights).map(|w| (w, None));
    }
    let workers = spec.build_workers(registry)?;
    let needed = workers
        .first()
        .map(|r| r.weights())
        .filter(|w| !w.tensors.is_empty())
        .map(describe_layout);
    Ok((workers, needed))
}

/// `name dtype [shape]` of every tensor, for errors naming what a policy needs.
pub(crate) fn describe_layout(w: &Weights) -> String {
    let parts: Vec<String> = w
        .tensors
        .iter()
        .map(|(name, t)| format!("`{name}` {} {:?}", t.dtype(), t.shape()))
        .collect();
    parts.join(", ")
}

/// Starts node `spec` over `workers` (from [`build_workers`]), each on an arbiter of its
/// own, its messages going to `trainer`. `weights` are the ones the workers started
/// from: a restarted worker gets them too, until an update replaces them. The node
/// rebuilds a failed worker from `spec` and `registry`. `awaiting`: the weights it
/// waits for before it collects (see [`build_workers_awaiting`]).
pub(crate) fn start_node(
    spec: &NodeSpec,
    registry: &Registry,
    workers: Vec<Rollout>,
    weights: Option<Arc<Weights>>,
    awaiting: Option<String>,
    trainer: Recipient<Deliver<FromNode>>,
) -> StartedNode {
    let node_ctx = Context::<Node>::new();
    let node_addr = node_ctx.address();
    let mut addrs = Vec::with_capacity(workers.len());
    let mut handles = Vec::with_capacity(workers.len());
    let mut arbiters = Vec::with_capacity(workers.len());
    let stop = Arc::new(AtomicBool::new(false));
    let returned: Vec<Returned> = (0..workers.len()).map(|_| Returned::default()).collect();
    for (w, rollout) in workers.into_iter().enumerate() {
        let arbiter = worker_arbiter(spec.worker_nice);
        let to_node = node_addr.clone().recipient();
        let worker_stop = Arc::clone(&stop);
        let slot = returned[w].clone();
        addrs.push(EnvWorker::start_in_arbiter(&arbiter.handle(), move |_| {
            EnvWorker::new(w, rollout, to_node, true)
                .with_stop_flag(worker_stop)
                .with_returned(slot)
        }));
        handles.push(arbiter.handle());
        arbiters.push(arbiter);
    }
    let mut machine = NodeMachine::from_spec(spec);
    if let Some(w) = weights {
        machine = machine.with_weights(w);
    }
    if let Some(needed) = awaiting {
        machine = machine.awaiting_weights(needed);
    }
    node_ctx.run(
        Node::new(machine, addrs, trainer)
            .with_rebuild(spec.clone(), registry.clone(), handles)
            .with_stop_flag(Arc::clone(&stop))
            .with_returned(returned),
    );
    StartedNode {
        addr: node_addr,
        arbiters,
        stop,
    }
}
