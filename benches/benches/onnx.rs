//! The `onnx` policy against the built-in `mlp` of the same shape, in one run.
//!
//! (1) Weight modes: a 1,000-frame batch (at K = 1 and K = 16 rows per call) after a new
//!     weight version, on tract with the initializers fed as model inputs against the plan
//!     rebuilt once per version, and on the built-in kernel (the dense chain the policy
//!     recognises); for the 64-64 model and, when present, the 10 M-parameter one.
//! (2) Collection: `Rollout` on CartPole-v1 with the 64-64 tanh MLP torch exported
//!     (tests/fixtures/onnx/cartpole_tanh_mlp_64.onnx; a chain of dense layers, so on the
//!     built-in kernel, as `OnnxPolicy::new` picks for a node) against the built-in
//!     `mlp --hidden 64,64`, K = 1 and 16 envs per policy call, deterministic, alternating
//!     rounds; ns per frame and built-in / onnx (the target is >= 0.8).
//! (3) A 10 M-parameter update on the node: the `update_weights` tensors decoded from
//!     MessagePack, handed to the policy (`set_shared_weights`), then one action, ONNX
//!     against the built-in `mlp --hidden 3162,3162` (target <= 1.2). Needs the model:
//!     `python scripts/export-test-models.py --big /tmp/rollout-onnx` and
//!     `ROLLOUT_ONNX_BIG=/tmp/rollout-onnx/cartpole_tanh_mlp_3162.onnx`.
//!
//! (4) A recurrent actor: `Rollout` on CartPole-v1 with torch's 64-unit LSTM and a linear
//!     head (tests/fixtures/onnx/cartpole_lstm_64.onnx, on tract), K = 1 and 16 envs per
//!     call, against its own baseline in the same run: the bare recurrent forward
//!     (`act_recurrent` on K fixed rows, the state fed back), ns per frame each.
//!
//! Run: `cargo bench -p rollout-benches --bench onnx`.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rollout::env::{CartPole, CartPoleConfig};
use rollout::policy::{
    ActionsMut, Mlp, OnnxEngine, OnnxHead, OnnxModel, OnnxPolicy, Policy, RecordMut, StateIo, StateTensor, WeightMode,
};
use rollout::rollout::{Rollout, RolloutConfig, TrajIds};
use rollout::{Env, ExplorationType, Spec, Weights};

/// How long each collection measurement runs.
const WINDOW: Duration = Duration::from_millis(500);

fn specs() -> (Spec, Spec) {
    (
        Spec::uniform_box(4, f32::NEG_INFINITY, f32::INFINITY),
        Spec::Discrete { n: 2 },
    )
}

fn model(path: &PathBuf) -> OnnxModel {
    OnnxModel::parse(std::fs::read(path).expect("model file")).expect("model")
}

/// The policy on tract, weight versions reaching it as `mode` says.
fn onnx(model: &OnnxModel, mode: WeightMode) -> OnnxPolicy {
    let (obs, act) = specs();
    let mut p = OnnxPolicy::with_mode(model, OnnxHead::Categorical, &obs, &act, 1, mode).expect("policy");
    p.set_exploration(ExplorationType::Deterministic);
    p
}

/// The policy as nodes build it: the exported MLP is a chain of dense layers, so it
/// runs on the built-in kernel.
fn onnx_auto(model: &OnnxModel) -> OnnxPolicy {
    let (obs, act) = specs();
    let mut p = OnnxPolicy::new(model, OnnxHead::Categorical, &obs, &act, 1).expect("policy");
    assert_eq!(p.engine(), OnnxEngine::DenseChain, "the exported MLP is a chain");
    p.set_exploration(ExplorationType::Deterministic);
    p
}

fn mlp(hidden: &[usize]) -> Mlp {
    let (obs, act) = specs();
    let mut p = Mlp::new(&obs, &act, hidden, 0, 1).expect("mlp");
    p.set_exploration(ExplorationType::Deterministic);
    p
}

/// The same tensors, other values and a new version (so a policy cannot skip them).
fn bumped(w: &Weights, version: u64) -> Weights {
    let mut w = w.clone().with_version(version);
    for t in w.tensors.values_mut() {
        if let rollout::Tensor::F32(a) = t {
            a.mapv_inplace(|v| v * 0.999);
        }
    }
    w
}

/// Seconds for one weight version then 1,000 frames in calls of `k` rows.
fn batch_after_update(p: &mut dyn Policy, w: &Arc<Weights>, k: usize) -> f64 {
    let obs: Vec<f32> = (0..k * 4).map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * 0.1).collect();
    let mut a = vec![0i64; k];
    let start = Instant::now();
    p.set_shared_weights(w).expect("update");
    for _ in 0..1000 / k {
        p.act(black_box(&obs), k, ActionsMut::Discrete(&mut a)).expect("act");
    }
    black_box(&a);
    start.elapsed().as_secs_f64()
}

fn weight_modes(name: &str, m: &OnnxModel, rounds: usize) {
    for k in [1usize, 16] {
        let (mut inputs, mut rebuild, mut chain) = (Vec::new(), Vec::new(), Vec::new());
        let mut pi = onnx(m, WeightMode::Inputs);
        let mut pr = onnx(m, WeightMode::Rebuild);
        let mut pc = onnx_auto(m);
        let base = pi.weights().clone();
        for r in 0..rounds {
            let w = Arc::new(bumped(&base, r as u64 + 1));
            inputs.push(batch_after_update(&mut pi, &w, k));
            rebuild.push(batch_after_update(&mut pr, &w, k));
            chain.push(batch_after_update(&mut pc, &w, k));
        }
        let (i, b, c) = (median(&mut inputs), median(&mut rebuild), median(&mut chain));
        println!(
            "weight modes  {name:<10} K={k:<3} update + 1,000 frames: tract inputs {:>9.3} ms, tract rebuild {:>9.3} ms, inputs/rebuild {:.2}; dense chain {:>9.3} ms",
            i * 1e3,
            b * 1e3,
            i / b,
            c * 1e3
        );
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// ns per frame of `Rollout` collecting with `policy` on `k` CartPoles.
fn collection(policy: Box<dyn Policy>, k: usize) -> impl FnMut() -> f64 {
    let frames = 1024 / k * k;
    let envs: Vec<Box<dyn Env>> = (0..k)
        .map(|_| Box::new(CartPole::new(CartPoleConfig::default()).expect("cartpole")) as Box<dyn Env>)
        .collect();
    let ids = (0..k as u64).map(|i| TrajIds::new(i, k as u64).expect("ids")).collect();
    let cfg = RolloutConfig {
        frames_per_batch: frames,
        ..RolloutConfig::default()
    };
    let mut rollout = Rollout::new(envs, policy, ids, cfg).expect("rollout");
    move || {
        let start = Instant::now();
        let mut n = 0usize;
        while start.elapsed() < WINDOW {
            let batch = rollout.collect().expect("collect");
            rollout.recycle(black_box(batch));
            n += frames;
        }
        start.elapsed().as_nanos() as f64 / n as f64
    }
}

/// The LSTM policy, deterministic.
fn recurrent(model: &OnnxModel, state: &[StateTensor]) -> OnnxPolicy {
    let (obs, act) = specs();
    let mut p = OnnxPolicy::recurrent(model, OnnxHead::Categorical, state, &obs, &act, 1).expect("policy");
    p.set_exploration(ExplorationType::Deterministic);
    p
}

/// ns per frame of the bare recurrent forward on `k` rows, its state fed back.
fn bare_recurrent(p: &mut OnnxPolicy, k: usize) -> f64 {
    let obs: Vec<f32> = (0..4 * k).map(|i| (i as f32 * 0.37).sin() * 0.1).collect();
    let mut before: Vec<Vec<f32>> = p.state().iter().map(|s| vec![0.0; k * s.numel()]).collect();
    let mut after = before.clone();
    let is_init = vec![false; k];
    let mut a = vec![0i64; k];
    let start = Instant::now();
    let mut n = 0usize;
    while start.elapsed() < WINDOW {
        let io = StateIo {
            is_init: &is_init,
            before: &before,
            after: &mut after,
        };
        p.act_recurrent(&obs, k, io, ActionsMut::Discrete(&mut a), RecordMut::nothing())
            .expect("act");
        std::mem::swap(&mut before, &mut after);
        n += k;
    }
    black_box(&a);
    start.elapsed().as_nanos() as f64 / n as f64
}

/// Seconds to decode an `update_weights`' tensors, apply them and act once.
fn update_cost(p: &mut dyn Policy, encoded: &[u8]) -> f64 {
    let mut a = [0i64];
    let start = Instant::now();
    let w: Weights = rmp_serde::from_slice(encoded).expect("weights");
    p.set_shared_weights(&Arc::new(w)).expect("update");
    p.act(&[0.1, 0.0, -0.1, 0.2], 1, ActionsMut::Discrete(&mut a))
        .expect("act");
    black_box(a);
    start.elapsed().as_secs_f64()
}

fn main() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx");
    let small = model(&fixtures.join("cartpole_tanh_mlp_64.onnx"));
    let big = std::env::var_os("ROLLOUT_ONNX_BIG").map(PathBuf::from);

    weight_modes("64-64", &small, 15);
    let big_model = big.as_ref().map(model);
    match &big_model {
        Some(m) => weight_modes("3162-3162", m, 3),
        None => println!("weight modes  3162-3162: skipped (ROLLOUT_ONNX_BIG unset)"),
    }

    for k in [1usize, 16] {
        let mut b = collection(Box::new(mlp(&[64, 64])), k);
        let mut o = collection(Box::new(onnx_auto(&small)), k);
        let (mut bs, mut os) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            bs.push(b());
            os.push(o());
        }
        let (bn, on) = (median(&mut bs), median(&mut os));
        println!(
            "collection    CartPole-v1 64-64 K={k:<3} built-in {bn:>8.1} ns/frame, onnx {on:>8.1} ns/frame, built-in/onnx {:.3}",
            bn / on
        );
    }

    let lstm = model(&fixtures.join("cartpole_lstm_64.onnx"));
    let state = lstm.declared_state().expect("the LSTM's state");
    for k in [1usize, 16] {
        let mut bare_policy = recurrent(&lstm, &state);
        let mut c = collection(Box::new(recurrent(&lstm, &state)), k);
        let (mut bs, mut cs) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            bs.push(bare_recurrent(&mut bare_policy, k));
            cs.push(c());
        }
        let (bn, cn) = (median(&mut bs), median(&mut cs));
        println!(
            "recurrent     CartPole-v1 LSTM-64 K={k:<3} collection {cn:>8.1} ns/frame ({:.0} frames/s on one core), bare forward {bn:>8.1} ns/frame, bare/collection {:.3}",
            1e9 / cn,
            bn / cn
        );
    }

    if let Some(m) = &big_model {
        let mut o = onnx_auto(m);
        let mut b = mlp(&[3162, 3162]);
        assert_eq!(o.weights().numel(), b.weights().numel(), "the same shape");
        let (mut os, mut bs) = (Vec::new(), Vec::new());
        for r in 0..5u64 {
            let eo = rmp_serde::to_vec_named(&bumped(o.weights(), r + 1)).expect("encode");
            let eb = rmp_serde::to_vec_named(&bumped(b.weights(), r + 1)).expect("encode");
            os.push(update_cost(&mut o, &eo));
            bs.push(update_cost(&mut b, &eb));
        }
        let (on, bn) = (median(&mut os), median(&mut bs));
        println!(
            "update        {} parameters: onnx {:.1} ms, built-in {:.1} ms, onnx/built-in {:.2}",
            o.weights().numel(),
            on * 1e3,
            bn * 1e3,
            on / bn
        );
    }
}
