//! The node machine driven by hand: trainer messages in through `handle`, worker
//! events in through `on_worker`, outputs checked; no actor, no thread. Helpers here, tests by concept in
//! the submodules.

mod assembly;
mod checkpoint;
mod stop;
mod supervise;
mod weights;

use std::collections::BTreeMap;

use ndarray::ArrayD;

use super::*;
use crate::message::{Continue, Seed, UpdateWeights};
use crate::node_state::{NodeState, WorkerState};
use crate::schema::keys;
use crate::supervisor::restart_seed;
use crate::tensor::{Tensor, TensorDict};
use crate::PolicyConfig;

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

/// Node `index` of a Counting run, `workers` env workers, base seed `seed`.
fn spec(index: usize, workers: usize, seed: u64) -> NodeSpec {
    NodeSpec::new("Counting", PolicyConfig::Constant { value: 1.0 }, workers)
        .with_index(index)
        .with_env_share(2)
        .with_seed(seed)
}

/// The machine of `spec`, rebuilding failed workers from it.
fn machine(spec: &NodeSpec) -> NodeMachine {
    NodeMachine::from_spec(spec).with_rebuild(spec.clone(), Registry::with_builtins())
}

/// A worker's share of `n` frames whose trajectory ids are `ids` (cycled).
fn share(n: usize, ids: &[i64]) -> TensorDict {
    let mut d = TensorDict::new(&[1, n]);
    let v: Vec<i64> = (0..n).map(|i| ids[i % ids.len()]).collect();
    d.set(
        keys::TRAJ_IDS,
        Tensor::I64(ArrayD::from_shape_vec(vec![1, n], v).unwrap()),
    )
    .unwrap();
    d
}

/// Weights the Constant policy takes: it acts `value`.
fn weights(value: f32, version: u64) -> Arc<Weights> {
    let mut t = BTreeMap::new();
    t.insert("value".to_string(), Tensor::F32(ArrayD::from_elem(vec![1], value)));
    Arc::new(Weights::new(t).with_version(version))
}

fn batch(worker: usize, seq: u64, version: u64, data: TensorDict) -> WorkerEvent {
    WorkerEvent::batch(worker, seq, version, data)
}

fn failed(worker: usize, reason: &str) -> WorkerEvent {
    WorkerEvent::Failed {
        worker,
        reason: reason.into(),
    }
}

/// The trainer's `UpdateWeights` of `w`, taken.
fn update(m: &mut NodeMachine, w: &Arc<Weights>) {
    let mut out = Vec::new();
    m.handle(ToNode::UpdateWeights(UpdateWeights { weights: w.clone() }), &mut out)
        .unwrap();
}

/// The weights version worker `worker`'s one restart in `out` was rebuilt with.
fn rebuilt_with(out: &[NodeOutput], worker: usize) -> Option<u64> {
    match replaced(out)[..] {
        [(w, restart)] if w == worker => restart.weights.as_ref().map(|w| w.version),
        _ => panic!("not one restart of worker {worker}: {out:?}"),
    }
}

fn cont(m: &mut NodeMachine, seq: u64, frames: usize) {
    let mut out = Vec::new();
    m.handle(ToNode::Continue(Continue { seq, frames }), &mut out).unwrap();
}

fn trainer_msgs(out: &[NodeOutput]) -> Vec<&FromNode> {
    out.iter()
        .filter_map(|o| match o {
            NodeOutput::Trainer(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn worker_cmds(out: &[NodeOutput]) -> Vec<(usize, &WorkerCmd)> {
    out.iter()
        .filter_map(|o| match o {
            NodeOutput::Worker { worker, cmd } => Some((*worker, cmd)),
            _ => None,
        })
        .collect()
}

/// The `(worker, restart)` of every `Replace` in `out`.
fn replaced(out: &[NodeOutput]) -> Vec<(usize, &WorkerRestart)> {
    out.iter()
        .filter_map(|o| match o {
            NodeOutput::Replace { worker, restart, .. } => Some((*worker, restart)),
            _ => None,
        })
        .collect()
}

fn traj_ids(d: &TensorDict) -> Vec<i64> {
    match d.get(keys::TRAJ_IDS) {
        Ok(Tensor::I64(ids)) => ids.iter().copied().collect(),
        other => panic!("{other:?}"),
    }
}
