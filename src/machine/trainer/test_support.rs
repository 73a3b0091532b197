//! Helpers for the trainer machine's unit tests: configs, batches answering a
//! `Continue`, and views of the output list. No actor, no thread.

use std::time::Duration;

use ndarray::ArrayD;

use super::{Collected, NodeSupervision, Output, TrainerConfig, TrainerMachine};
use crate::message::{Batch, Continue, FromNode, ToNode};
use crate::schema::keys;
use crate::tensor::{Tensor, TensorDict};

/// A config of `nodes` nodes with `envs` envs each, yielding `fpb` frames per batch.
pub(super) fn config(nodes: usize, envs: usize, fpb: usize, total: Option<u64>, sync: bool) -> TrainerConfig {
    let shares = match crate::shares::Shares::new(fpb, vec![envs; nodes], 1, sync, total) {
        Ok(s) => s,
        Err(e) => panic!("test shares refused: {e}"),
    };
    TrainerConfig::new(shares)
}

/// A machine for `cfg`.
pub(super) fn machine(cfg: TrainerConfig) -> TrainerMachine {
    match TrainerMachine::new(cfg) {
        Ok(m) => m,
        Err(e) => panic!("test config refused: {e}"),
    }
}

/// Supervision with `max_restarts` restarts in a long window and an optional timeout.
pub(super) fn supervision(max_restarts: u32, continue_timeout: Option<Duration>) -> NodeSupervision {
    NodeSupervision {
        intensity: crate::supervisor::RestartIntensity {
            max_restarts,
            window: Duration::from_secs(3600),
        },
        continue_timeout,
        continue_without_lost_nodes: false,
        open_slot_wait: None,
    }
}

/// Milliseconds on the machine clock.
pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The frames of `node` answering `seq`: `[envs, frames / envs]`, every trajectory
/// id `node` (so stacked shares show their order).
pub(super) fn data(node: usize, envs: usize, frames: usize) -> TensorDict {
    let steps = frames / envs;
    let mut d = TensorDict::new(&[envs, steps]);
    let ids = ArrayD::from_elem(vec![envs, steps], node as i64);
    if let Err(e) = d.set(keys::TRAJ_IDS, Tensor::I64(ids)) {
        panic!("test batch: {e}");
    }
    d
}

/// Node `node`'s batch for `seq` of `frames` frames over `envs` envs.
pub(super) fn batch(node: usize, seq: u64, envs: usize, frames: usize) -> FromNode {
    batch_of_version(node, seq, envs, frames, 0)
}

/// [`batch`], collected with weights `version`.
pub(super) fn batch_of_version(node: usize, seq: u64, envs: usize, frames: usize, version: u64) -> FromNode {
    FromNode::Batch(Batch {
        node,
        seq,
        weights_version: version,
        data: data(node, envs, frames),
    })
}

/// The `Continue`s in `out`, as (node, seq, frames).
pub(super) fn continues(out: &[Output]) -> Vec<(usize, u64, usize)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send {
                node,
                msg: ToNode::Continue(Continue { seq, frames }),
            } => Some((*node, *seq, *frames)),
            _ => None,
        })
        .collect()
}

/// The batches yielded in `out`.
pub(super) fn yields(out: &[Output]) -> Vec<&Collected> {
    out.iter()
        .filter_map(|o| match o {
            Output::Yield(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// The messages sent in `out`, as (node, wire name).
pub(super) fn sends(out: &[Output]) -> Vec<(usize, &'static str)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send { node, msg } => Some((*node, msg.name())),
            _ => None,
        })
        .collect()
}

/// Feeds node message `msg`, expecting it accepted; returns what came out.
pub(super) fn feed(m: &mut TrainerMachine, msg: FromNode) -> Vec<Output> {
    let mut out = Vec::new();
    if let Err(e) = m.on_node(msg, &mut out) {
        panic!("message refused: {e}");
    }
    out
}

/// The consumer asks for a batch; returns what came out.
pub(super) fn request(m: &mut TrainerMachine) -> Vec<Output> {
    let mut out = Vec::new();
    if let Err(e) = m.request(&mut out) {
        panic!("request refused: {e}");
    }
    out
}

/// A real state of node `node` with one env worker (a Counting env), as a node
/// would send in a `Snapshot`.
pub(super) fn node_checkpoint(node: usize) -> crate::checkpoint::NodeState {
    let spec = crate::node_spec::NodeSpec::new("Counting", crate::PolicyConfig::Constant { value: 1.0 }, 1)
        .with_index(node)
        .with_env_share(2);
    let rollout = match spec.build_workers(&crate::Registry::with_builtins()) {
        Ok(w) => match w[0].snapshot() {
            Ok(r) => r,
            Err(e) => panic!("snapshot: {e}"),
        },
        Err(e) => panic!("workers: {e}"),
    };
    crate::checkpoint::NodeState {
        node,
        base_seed: 0,
        weights: None,
        workers: vec![crate::checkpoint::WorkerState {
            rollout,
            next_traj_id: 0,
            frames: 0,
        }],
    }
}
