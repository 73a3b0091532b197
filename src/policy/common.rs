//! Pieces shared by the policies: buffer checks, the sampling generator, the
//! action head and a small dense network (used by both `Linear` and `Mlp`).
//!
//! Everything called from `act` works on plain slices and scratch buffers
//! allocated once in the constructor: no allocation and no formatting on the
//! success path.

use std::collections::BTreeMap;
use std::sync::Arc;

use ndarray::{ArrayD, IxDyn};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::dense::{dense_cols, to_cols};
use super::logprob::{log_softmax2, log_softmax2_batch, log_softmax_at, normal_log_prob, wanted};
use super::record::{ParamsMut, RecordMut, Recorded};
use super::tanh::{tanh, tanh_in_place};
use super::{ActionsMut, ExplorationType, PolicyError, SamplerState, Weights};
use crate::rng::RngState;
use crate::spec::Spec;
use crate::tensor::Tensor;

/// Refuse networks with more parameters than this (4 GiB of f32), so that an
/// absurd spec (say `Discrete { n: 1 << 40 }`) is an error, not an abort.
const MAX_PARAMS: usize = 1 << 30;

/// The parameters of dense layers `obs_dim -> hidden... -> outputs`, each a weight
/// and a bias, as [`Net::new`] lays them out; `None` if the count overflows.
pub(super) fn net_params(obs_dim: usize, hidden: &[usize], outputs: usize) -> Option<usize> {
    let dims: Vec<usize> = std::iter::once(obs_dim)
        .chain(hidden.iter().copied())
        .chain(std::iter::once(outputs))
        .collect();
    dims.windows(2).try_fold(0usize, |total, io| {
        io[0].checked_mul(io[1])?.checked_add(io[1])?.checked_add(total)
    })
}

/// From this many parameters on, a network reads its layers from the named tensors
/// (one lookup per layer per row, nothing next to a forward pass this size) instead
/// of keeping a flat copy: a weight update then copies nothing.
pub(super) const NAMED_MIN_PARAMS: usize = 1 << 16;

/// Std of the exploration noise, as a fraction of the half-range of the action box.
pub(super) const NOISE_FRACTION: f32 = 0.1;

/// Checks that `obs` holds exactly `k` observations of `obs_dim` values.
#[inline]
pub(super) fn check_obs(obs: &[f32], k: usize, obs_dim: usize) -> Result<(), PolicyError> {
    if Some(obs.len()) == k.checked_mul(obs_dim) {
        Ok(())
    } else {
        Err(obs_len_error(obs.len(), k, obs_dim))
    }
}

/// The error for an observation buffer of the wrong length.
#[cold]
#[inline(never)]
fn obs_len_error(len: usize, k: usize, obs_dim: usize) -> PolicyError {
    PolicyError::Buffer(format!(
        "observation buffer has {len} values, expected k * obs_dim = {k} * {obs_dim}"
    ))
}

/// Checks an action buffer against the action spec: right kind, exactly `k` actions.
#[inline]
pub(super) fn check_actions(action: &Spec, k: usize, actions: &ActionsMut<'_>) -> Result<(), PolicyError> {
    let (len, dim) = match (action, actions) {
        (Spec::Discrete { .. }, ActionsMut::Discrete(a)) => (a.len(), 1),
        (Spec::Box { low, .. }, ActionsMut::Continuous(a)) => (a.len(), low.len()),
        _ => return Err(action_kind_error(action, actions)),
    };
    if Some(len) == k.checked_mul(dim) {
        Ok(())
    } else {
        Err(action_len_error(len, k, dim))
    }
}

/// The error for an action buffer of the wrong kind.
#[cold]
#[inline(never)]
pub(super) fn action_kind_error(action: &Spec, actions: &ActionsMut<'_>) -> PolicyError {
    let (spec, buffer) = match (action, actions) {
        (Spec::Discrete { .. }, _) => ("discrete", "ActionsMut::Continuous"),
        (Spec::Box { .. }, _) => ("a box", "ActionsMut::Discrete"),
    };
    PolicyError::Buffer(format!("the action spec is {spec} but the buffer is {buffer}"))
}

/// The error for an action buffer of the wrong length.
#[cold]
#[inline(never)]
pub(super) fn action_len_error(len: usize, k: usize, dim: usize) -> PolicyError {
    PolicyError::Buffer(format!(
        "action buffer has {len} values, expected k * action_dim = {k} * {dim}"
    ))
}

/// The sampling generator: ChaCha8 plus the spare normal of Box–Muller.
#[derive(Clone)]
pub(super) struct Sampler {
    rng: ChaCha8Rng,
    spare: Option<f32>,
}

impl Sampler {
    /// A generator seeded with `seed`.
    pub(super) fn new(seed: u64) -> Sampler {
        Sampler {
            rng: ChaCha8Rng::seed_from_u64(seed),
            spare: None,
        }
    }

    /// Restarts the stream from `seed`.
    pub(super) fn reseed(&mut self, seed: u64) {
        *self = Sampler::new(seed);
    }

    /// The position, for a checkpoint.
    pub(super) fn state(&self) -> SamplerState {
        SamplerState {
            rng: RngState::of(&self.rng),
            spare: self.spare,
        }
    }

    /// Continues from `state`; a missing or corrupt state is an error and changes nothing.
    pub(super) fn set_state(&mut self, state: Option<&SamplerState>) -> Result<(), PolicyError> {
        let state = state.ok_or_else(|| PolicyError::Checkpoint("the policy samples but the state is empty".into()))?;
        self.rng = state.rng.to_rng().map_err(|e| PolicyError::Checkpoint(e.to_string()))?;
        self.spare = state.spare;
        Ok(())
    }

    /// The generator itself.
    pub(super) fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    /// Uniform in `[0, 1)`.
    #[inline]
    pub(super) fn uniform(&mut self) -> f32 {
        self.rng.random::<f32>()
    }

    /// Standard normal, by Box–Muller (two per pair of uniforms; the second is kept).
    #[inline]
    pub(super) fn normal(&mut self) -> f32 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let u1 = 1.0 - self.rng.random::<f32>(); // (0, 1]: ln is finite
        let u2 = self.rng.random::<f32>();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f32::consts::TAU * u2).sin_cos();
        self.spare = Some(r * s);
        r * c
    }
}

/// Index of the first maximum (NaNs are never a maximum unless first).
#[inline]
pub(super) fn argmax(z: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = z[0];
    for (i, &v) in z.iter().enumerate().skip(1) {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// Samples an index from softmax(`z`) with the uniform `u` in `[0, 1)`.
///
/// Subtracts the max before `exp`; overwrites `z` with the unnormalised
/// probabilities. Falls back to the argmax when the logits are not finite.
#[inline]
pub(super) fn sample_softmax(z: &mut [f32], u: f32) -> usize {
    let best = argmax(z);
    let m = z[best];
    let mut sum = 0.0f32;
    for v in z.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    if !(sum.is_finite() && sum > 0.0) {
        return best;
    }
    let t = u * sum;
    let mut acc = 0.0f32;
    let mut last = best;
    for (i, &e) in z.iter().enumerate() {
        acc += e;
        if t < acc {
            return i;
        }
        if e > 0.0 {
            last = i;
        }
    }
    // Rounding left `t` at or past the total: the last index with mass.
    last
}

/// How raw outputs become actions.
#[derive(Clone)]
pub(super) enum Head {
    /// Logits over `n` choices.
    Discrete {
        /// Number of choices.
        n: usize,
    },
    /// `mid + half * tanh(z)`, plus noise `noise * N(0, 1)` when exploring,
    /// clipped to `[low, high]`. For an element with an infinite bound,
    /// `mid = 0`, `half = 1`, `noise = 0.1`.
    Continuous {
        low: Vec<f32>,
        high: Vec<f32>,
        mid: Vec<f32>,
        half: Vec<f32>,
        noise: Vec<f32>,
    },
}

impl Head {
    /// The head for `action` (which must be valid).
    pub(super) fn new(action: &Spec) -> Result<Head, PolicyError> {
        action.validate()?;
        Ok(match action {
            Spec::Discrete { n } => Head::Discrete {
                n: usize::try_from(*n)
                    .ok()
                    .filter(|&n| n <= MAX_PARAMS)
                    .ok_or_else(|| PolicyError::Spec(format!("{n} discrete actions are too many")))?,
            },
            Spec::Box { low, high } => {
                let mut mid = Vec::with_capacity(low.len());
                let mut half = Vec::with_capacity(low.len());
                for (&l, &h) in low.iter().zip(high) {
                    if l.is_finite() && h.is_finite() {
                        // Halve first so that huge finite bounds cannot overflow.
                        mid.push(0.5 * l + 0.5 * h);
                        half.push(0.5 * h - 0.5 * l);
                    } else {
                        mid.push(0.0);
                        half.push(1.0);
                    }
                }
                let noise = half.iter().map(|h| NOISE_FRACTION * h).collect();
                Head::Continuous {
                    low: low.clone(),
                    high: high.clone(),
                    mid,
                    half,
                    noise,
                }
            }
        })
    }

    /// Number of raw outputs: `n` logits, or one per action element.
    pub(super) fn out_dim(&self) -> usize {
        match self {
            Head::Discrete { n } => *n,
            Head::Continuous { low, .. } => low.len(),
        }
    }
}

/// One dense layer: its place in the flat parameter vector and its tensors' names.
#[derive(Clone)]
struct Layer {
    n_in: usize,
    n_out: usize,
    /// Offset of the `[n_out, n_in]` weight in `params`.
    w: usize,
    /// Offset of the `[n_out]` bias in `params`.
    b: usize,
    w_name: String,
    b_name: String,
}

/// Dense layers (tanh between them) followed by a [`Head`]; the engine of
/// `Linear` and `Mlp`.
#[derive(Clone)]
pub(super) struct Net {
    obs_dim: usize,
    action: Spec,
    layers: Vec<Layer>,
    /// All parameters, layer by layer, weight then bias: the fast copy of `weights`
    /// for small networks; empty when `named`.
    params: Vec<f32>,
    /// Large network: layers are read from `weights` itself (f32, contiguous).
    named: bool,
    /// The widest layer (inputs included): scratch holds `width * k` values.
    width: usize,
    /// Ping-pong scratch of feature-major activations (`[features, k]`); the output
    /// layer's ends in `cols_a`. Grown to the largest `k` seen, then reused.
    cols_a: Vec<f32>,
    cols_b: Vec<f32>,
    /// One observation's logits, gathered from `cols_a` for the head.
    logits: Vec<f32>,
    head: Head,
    sampler: Sampler,
    exploration: ExplorationType,
    /// The named form of `params`, shared with whoever else holds these weights
    /// (see [`Net::set_shared_weights`]).
    weights: Arc<Weights>,
}

impl Net {
    /// Builds the network `obs_dim -> hidden... -> head`, naming layer `i`'s
    /// tensors with `names(i)`, with torch-like initial weights from `init_seed`.
    pub(super) fn new(
        obs: &Spec,
        action: &Spec,
        hidden: &[usize],
        names: impl Fn(usize) -> (String, String),
        init_seed: u64,
        seed: u64,
    ) -> Result<Net, PolicyError> {
        obs.validate()?;
        let head = Head::new(action)?;
        if let Some(i) = hidden.iter().position(|&w| w == 0) {
            return Err(PolicyError::Spec(format!("hidden layer {i} has width 0")));
        }
        let obs_dim = obs.dim();
        let mut dims = Vec::with_capacity(hidden.len() + 2);
        dims.push(obs_dim);
        dims.extend_from_slice(hidden);
        dims.push(head.out_dim());

        let too_big = || PolicyError::Spec(format!("network {dims:?} has too many parameters"));
        let mut layers = Vec::with_capacity(dims.len() - 1);
        let mut total = 0usize;
        for (i, io) in dims.windows(2).enumerate() {
            let (n_in, n_out) = (io[0], io[1]);
            let nw = n_in.checked_mul(n_out).ok_or_else(too_big)?;
            let w = total;
            let b = w.checked_add(nw).ok_or_else(too_big)?;
            total = b.checked_add(n_out).ok_or_else(too_big)?;
            if total > MAX_PARAMS {
                return Err(too_big());
            }
            let (w_name, b_name) = names(i);
            layers.push(Layer {
                n_in,
                n_out,
                w,
                b,
                w_name,
                b_name,
            });
        }

        // torch.nn.Linear's default: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        let mut init = ChaCha8Rng::seed_from_u64(init_seed);
        let mut params = Vec::with_capacity(total);
        for l in &layers {
            let bound = 1.0 / (l.n_in as f32).sqrt();
            for _ in 0..(l.n_in * l.n_out + l.n_out) {
                params.push(bound * (2.0 * init.random::<f32>() - 1.0));
            }
        }

        let mut tensors = BTreeMap::new();
        for l in &layers {
            let w = ArrayD::from_shape_vec(IxDyn(&[l.n_out, l.n_in]), params[l.w..l.b].to_vec())
                .expect("weight length matches its shape");
            let b = ArrayD::from_shape_vec(IxDyn(&[l.n_out]), params[l.b..l.b + l.n_out].to_vec())
                .expect("bias length matches its shape");
            tensors.insert(l.w_name.clone(), Tensor::F32(w));
            tensors.insert(l.b_name.clone(), Tensor::F32(b));
        }

        let width = dims.iter().copied().max().unwrap_or(0);
        let named = total >= NAMED_MIN_PARAMS;
        Ok(Net {
            obs_dim,
            action: action.clone(),
            layers,
            params: if named { Vec::new() } else { params },
            named,
            width,
            cols_a: Vec::new(),
            cols_b: Vec::new(),
            logits: vec![0.0; head.out_dim()],
            head,
            sampler: Sampler::new(seed),
            exploration: ExplorationType::default(),
            weights: Arc::new(Weights::new(tensors)),
        })
    }

    /// What the head records: a categorical's logits, or a normal's loc and scale.
    pub(super) fn recorded(&self) -> Recorded {
        match &self.head {
            Head::Discrete { n } => Recorded::Categorical { n: *n },
            Head::Continuous { low, .. } => Recorded::Normal { d: low.len() },
        }
    }

    /// See [`Policy::act_recording`](super::Policy::act_recording). The network runs
    /// once on all `k` observations ([`dense_cols`]); the head then takes them one by
    /// one, in order, so the sampler is drawn from exactly as when each was evaluated
    /// alone. What `record` asks for is written beside (empty buffers: nothing); the
    /// actions do not depend on it.
    pub(super) fn act(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        check_obs(obs, k, self.obs_dim)?;
        match (&self.head, &actions) {
            (Head::Discrete { .. }, ActionsMut::Discrete(out)) if out.len() != k => {
                return Err(action_len_error(out.len(), k, 1))
            }
            (Head::Continuous { low, .. }, ActionsMut::Continuous(out))
                if Some(out.len()) != k.checked_mul(low.len()) =>
            {
                return Err(action_len_error(out.len(), k, low.len()))
            }
            (Head::Discrete { .. }, ActionsMut::Discrete(_)) | (Head::Continuous { .. }, ActionsMut::Continuous(_)) => {
            }
            _ => return Err(action_kind_error(&self.action, &actions)),
        }
        let (want_lp, want_params) = wanted(&record, k, self.head.out_dim())?;
        let RecordMut { log_prob, params } = record;
        self.forward(obs, k);
        let random = self.exploration == ExplorationType::Random;
        match (&self.head, actions) {
            (Head::Discrete { n }, ActionsMut::Discrete(out)) => {
                let n = *n;
                let z_all = &self.cols_a[..n * k];
                let mut logits_out = match params {
                    ParamsMut::Logits(z) if want_params => Some(z),
                    _ => None,
                };
                // Two logits recorded: the log-probabilities in one vectorised pass over
                // them after the rows (the same function, so the same bits, as row by row).
                let after = want_lp && n == 2 && logits_out.is_some();
                for (r, o) in out.iter_mut().enumerate() {
                    let z = &mut self.logits[..n];
                    for (j, v) in z.iter_mut().enumerate() {
                        *v = z_all[j * k + r];
                    }
                    if let Some(dst) = logits_out.as_deref_mut() {
                        // Element by element: a `copy_from_slice` of `n` values (known
                        // only at run time) is a call to `memmove` per row.
                        for (d, &v) in dst[r * n..(r + 1) * n].iter_mut().zip(z.iter()) {
                            *d = v;
                        }
                    }
                    let i = match (random, n) {
                        (false, _) => argmax(z),
                        // softmax of two logits: p(1) = 1 / (1 + exp(z0 - z1)), one exp.
                        (true, 2) => {
                            let p1 = 1.0 / (1.0 + (z[0] - z[1]).exp());
                            (self.sampler.uniform() < p1) as usize
                        }
                        (true, _) => sample_softmax(z, self.sampler.uniform()),
                    };
                    *o = i as i64;
                    if want_lp && !after {
                        // Sampling overwrote `z`: the logits again, from the network's output.
                        for (j, v) in z.iter_mut().enumerate() {
                            *v = z_all[j * k + r];
                        }
                        log_prob[r] = log_softmax_at(z, i);
                    }
                }
                if let (true, Some(z)) = (after, logits_out.as_deref()) {
                    log_softmax2_batch(z, out, log_prob);
                }
            }
            (
                Head::Continuous {
                    low,
                    high,
                    mid,
                    half,
                    noise,
                },
                ActionsMut::Continuous(out),
            ) => {
                let d = low.len();
                let z_all = &self.cols_a[..d * k];
                let mut normal_out = match params {
                    ParamsMut::Normal { loc, scale } if want_params => Some((loc, scale)),
                    _ => None,
                };
                for r in 0..k {
                    let o = &mut out[r * d..(r + 1) * d];
                    let mut lp = 0.0f64;
                    for j in 0..d {
                        let mean = mid[j] + half[j] * tanh(z_all[j * k + r]);
                        let mut a = mean;
                        if random {
                            a += noise[j] * self.sampler.normal();
                        }
                        let a = a.max(low[j]).min(high[j]);
                        o[j] = a;
                        if want_lp {
                            lp += normal_log_prob(a, mean, noise[j]);
                        }
                        if let Some((loc, scale)) = normal_out.as_mut() {
                            loc[r * d + j] = mean;
                            scale[r * d + j] = noise[j];
                        }
                    }
                    if want_lp {
                        log_prob[r] = lp as f32;
                    }
                }
            }
            (_, actions) => return Err(action_kind_error(&self.action, &actions)),
        }
        Ok(())
    }

    /// Runs the `k` observations of `obs` through the layers; the output layer's values
    /// are left feature-major in `cols_a[..out_dim * k]`.
    fn forward(&mut self, obs: &[f32], k: usize) {
        let need = self.width * k;
        if self.cols_a.len() < need {
            self.cols_a.resize(need, 0.0);
            self.cols_b.resize(need, 0.0);
        }
        to_cols(obs, k, self.obs_dim, &mut self.cols_b);
        if self.named {
            forward(
                &self.layers,
                &Named(&self.weights),
                k,
                &mut self.cols_a,
                &mut self.cols_b,
            );
        } else {
            forward(&self.layers, &Flat(&self.params), k, &mut self.cols_a, &mut self.cols_b);
        }
    }

    /// [`Net::act`] for observations of `D` values (a constant), written for the
    /// collection loop's compiled path: a single layer to two logits, or to a box, is
    /// evaluated with fixed-length rows (no loop over the input, no per-row checks),
    /// with the same operations in the same order, so the actions are bit for bit
    /// those of `act`. Anything else (hidden layers, a large network read from its
    /// named tensors, `D` = 0) is `act` itself.
    #[inline(always)]
    pub(super) fn act_fixed<const D: usize>(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        let [layer] = &self.layers[..] else {
            return self.act(obs, k, actions, record);
        };
        if D == 0 || self.named || self.obs_dim != D || Some(obs.len()) != k.checked_mul(D) {
            return self.act(obs, k, actions, record);
        }
        let random = self.exploration == ExplorationType::Random;
        let params = &self.params[layer.w..layer.b + layer.n_out];
        match (&self.head, actions) {
            (Head::Discrete { n: 2 }, ActionsMut::Discrete(out)) if out.len() == k && params.len() == 2 * D + 2 => {
                let (want_lp, want_logits) = wanted(&record, k, 2)?;
                let RecordMut { log_prob, params: rec } = record;
                let mut logits_out = match rec {
                    ParamsMut::Logits(z) if want_logits => Some(z),
                    _ => None,
                };
                let (w0, rest) = params.split_at(D);
                let (w1, bias) = rest.split_at(D);
                for (r, o) in out.iter_mut().enumerate() {
                    let x = &obs[r * D..(r + 1) * D];
                    let z0 = dot::<D>(w0, x, bias[0]);
                    let z1 = dot::<D>(w1, x, bias[1]);
                    let i = if random {
                        let p1 = 1.0 / (1.0 + (z0 - z1).exp());
                        self.sampler.uniform() < p1
                    } else {
                        // The argmax, the first one on ties (a NaN first logit wins, as there).
                        z1 > z0
                    };
                    *o = i as i64;
                    if want_lp {
                        log_prob[r] = log_softmax2(z0, z1, i as usize);
                    }
                    if let Some(z) = logits_out.as_deref_mut() {
                        z[2 * r] = z0;
                        z[2 * r + 1] = z1;
                    }
                }
                Ok(())
            }
            (_, actions) => self.act(obs, k, actions, record),
        }
    }

    /// What [`Net::act_fixed`] computes for observations of `D` values when it is the
    /// deterministic argmax of a one-layer, two-action network: its weights, copied out,
    /// so that a loop stepping one env can pick actions without going through memory.
    pub(super) fn argmax2<const D: usize>(&self) -> Option<Argmax2<D>> {
        let [layer] = &self.layers[..] else {
            return None;
        };
        if D == 0 || self.named || self.obs_dim != D || self.exploration == ExplorationType::Random {
            return None;
        }
        let params = &self.params[layer.w..layer.b + layer.n_out];
        if !matches!(self.head, Head::Discrete { n: 2 }) || params.len() != 2 * D + 2 {
            return None;
        }
        let (w0, rest) = params.split_at(D);
        let (w1, bias) = rest.split_at(D);
        Some(Argmax2 {
            w0: w0.try_into().ok()?,
            w1: w1.try_into().ok()?,
            bias: [bias[0], bias[1]],
        })
    }

    /// The current weights.
    pub(super) fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Copies `weights` in place (layout checked first, so nothing changes on error).
    pub(super) fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
        self.weights.check_layout(weights)?;
        if !self.named {
            self.load_params(weights);
        }
        match Arc::get_mut(&mut self.weights) {
            Some(own) => {
                for (name, dst) in own.tensors.iter_mut() {
                    match (dst, &weights.tensors[name.as_str()]) {
                        (Tensor::F32(d), Tensor::F32(s)) => d.assign(s),
                        _ => unreachable!("layout checked: f32"),
                    }
                }
                own.version = weights.version;
            }
            // Shared with a caller of `set_shared_weights`: never write through it.
            None => self.weights = Arc::new(contiguous_copy(weights)),
        }
        Ok(())
    }

    /// Keeps the `Arc` as the named copy: a large network reads it directly (no copy
    /// at all), a small one copies it into its flat parameters (one copy, not two).
    pub(super) fn set_shared_weights(&mut self, weights: &Arc<Weights>) -> Result<(), PolicyError> {
        self.weights.check_layout(weights)?;
        if !self.named {
            self.load_params(weights);
            self.weights = Arc::clone(weights);
        } else if weights.tensors.values().all(is_contiguous) {
            self.weights = Arc::clone(weights);
        } else {
            self.weights = Arc::new(contiguous_copy(weights));
        }
        Ok(())
    }

    /// Copies every layer's tensors into `params` (layout already checked).
    fn load_params(&mut self, weights: &Weights) {
        for l in &self.layers {
            for (name, off) in [(&l.w_name, l.w), (&l.b_name, l.b)] {
                let src = weights.tensors[name.as_str()].as_f32().expect("layout checked: f32");
                let dst = &mut self.params[off..off + src.len()];
                match src.as_slice() {
                    Some(s) => dst.copy_from_slice(s),
                    // Not in standard layout (a transposed view): element by element.
                    None => dst.iter_mut().zip(src.iter()).for_each(|(d, s)| *d = *s),
                }
            }
        }
    }

    /// Whether layers are read from the named tensors (a large network).
    #[cfg(test)]
    pub(super) fn is_named(&self) -> bool {
        self.named
    }

    /// The same network computing from a flat copy of its parameters, for comparing
    /// the two ways of reading them.
    #[cfg(test)]
    pub(super) fn into_flat(mut self) -> Net {
        let mut params = Vec::new();
        for l in &self.layers {
            for name in [&l.w_name, &l.b_name] {
                params.extend_from_slice(self.weights.f32_slice(name).expect("f32, contiguous"));
            }
        }
        self.params = params;
        self.named = false;
        self
    }

    /// Mode or sampling.
    pub(super) fn set_exploration(&mut self, exploration: ExplorationType) {
        self.exploration = exploration;
    }

    /// Restarts the sampling stream.
    pub(super) fn reseed(&mut self, seed: u64) {
        self.sampler.reseed(seed);
    }

    /// Continues sampling from `state`, for checkpoints.
    pub(super) fn set_sampler_state(&mut self, state: Option<&SamplerState>) -> Result<(), PolicyError> {
        self.sampler.set_state(state)
    }

    /// The sampler's position, for checkpoints.
    pub(super) fn sampler_state(&self) -> SamplerState {
        self.sampler.state()
    }
}

/// f32 in standard layout: what a large network reads its layers from.
pub(super) fn is_contiguous(t: &Tensor) -> bool {
    matches!(t, Tensor::F32(a) if a.is_standard_layout())
}

/// `w` with every tensor in standard layout (a transposed view is laid out anew).
pub(super) fn contiguous_copy(w: &Weights) -> Weights {
    let tensors = w
        .tensors
        .iter()
        .map(|(k, t)| {
            let t = match t {
                Tensor::F32(a) if !a.is_standard_layout() => Tensor::F32(a.as_standard_layout().into_owned()),
                other => other.clone(),
            };
            (k.clone(), t)
        })
        .collect();
    Weights {
        version: w.version,
        tensors,
    }
}

/// Where a layer's weight and bias are read from.
trait LayerSource {
    /// The `[n_out, n_in]` weight and `[n_out]` bias of `l`.
    fn layer(&self, l: &Layer) -> (&[f32], &[f32]);
}

/// The flat parameter vector of a small network.
struct Flat<'a>(&'a [f32]);

impl LayerSource for Flat<'_> {
    #[inline(always)]
    fn layer(&self, l: &Layer) -> (&[f32], &[f32]) {
        (&self.0[l.w..l.b], &self.0[l.b..l.b + l.n_out])
    }
}

/// The named tensors of a large network.
struct Named<'a>(&'a Weights);

impl LayerSource for Named<'_> {
    fn layer(&self, l: &Layer) -> (&[f32], &[f32]) {
        match (self.0.f32_slice(&l.w_name), self.0.f32_slice(&l.b_name)) {
            (Ok(w), Ok(b)) => (w, b),
            _ => unreachable!("a large network's weights are checked f32 and contiguous when set"),
        }
    }
}

/// Runs the `k` feature-major inputs in `b` through `layers`; the output is left in
/// `a[..last n_out * k]`, tanh between the layers.
#[inline(always)]
fn forward(layers: &[Layer], params: &impl LayerSource, k: usize, a: &mut Vec<f32>, b: &mut Vec<f32>) {
    let last = layers.len() - 1;
    for (i, l) in layers.iter().enumerate() {
        let (w, bias) = params.layer(l);
        dense_cols(w, bias, l.n_in, l.n_out, &b[..l.n_in * k], k, &mut a[..l.n_out * k]);
        if i != last {
            tanh_in_place(&mut a[..l.n_out * k]);
            std::mem::swap(a, b);
        }
    }
}

/// A one-layer, two-action network's deterministic argmax over observations of `D`
/// values, its weights held by value: the same sums in the same order as
/// [`Net::act_fixed`], so the same actions bit for bit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Argmax2<const D: usize> {
    w0: [f32; D],
    w1: [f32; D],
    bias: [f32; 2],
}

impl<const D: usize> Argmax2<D> {
    /// The action for observation `x` (1 if its logit is the larger, else 0: the
    /// first one on ties; a NaN first logit wins) and its two logits.
    #[inline(always)]
    pub(crate) fn logits(&self, x: &[f32; D]) -> (i64, f32, f32) {
        let z0 = dot::<D>(&self.w0, x, self.bias[0]);
        let z1 = dot::<D>(&self.w1, x, self.bias[1]);
        ((z1 > z0) as i64, z0, z1)
    }

    /// The log-probabilities of `actions` under their rows of two `logits` (as every
    /// path records them), after the loop: off its dependency chain, and vectorised.
    #[inline(always)]
    pub(crate) fn log_probs(logits: &[f32], actions: &[i64], out: &mut [f32]) {
        log_softmax2_batch(logits, actions, out);
    }
}

/// `b + w . x` over exactly `D` values, summed in [`dense_cols`]'s order.
#[inline(always)]
fn dot<const D: usize>(w: &[f32], x: &[f32], b: f32) -> f32 {
    let (w, x) = (&w[..D], &x[..D]);
    let mut s = b;
    for i in 0..D {
        s += w[i] * x[i];
    }
    s
}

/// Test helpers shared by the policies' unit tests.
#[cfg(test)]
pub(super) mod testutil {
    use super::*;

    /// An f32 tensor of `shape` from `data`.
    pub(crate) fn t(shape: &[usize], data: &[f32]) -> Tensor {
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap())
    }

    /// Weights from `(name, tensor)` pairs.
    pub(crate) fn w(version: u64, entries: Vec<(&str, Tensor)>) -> Weights {
        Weights::new(entries.into_iter().map(|(k, v)| (k.to_string(), v)).collect()).with_version(version)
    }

    /// The flattened f32 tensor `name` of `w`.
    pub(crate) fn vals(w: &Weights, name: &str) -> Vec<f32> {
        w.f32_slice(name).unwrap().to_vec()
    }
}
