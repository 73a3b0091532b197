//! The engine of the built-in dense policies (`Linear` and `Mlp`): dense layers with
//! tanh between them ([`DenseLayout`]), run on a batch of observations at once
//! ([`dense_cols`]), then the [`Head`] row by row with the [`Sampler`].
//!
//! Everything called from `act` works on plain slices and scratch buffers
//! allocated once in the constructor: no allocation and no formatting on the
//! success path.

use std::sync::Arc;

use super::action_head::Head;
use super::buffer_checks::{action_kind_error, action_len_error, check_obs};
use super::contiguous::{contiguous_copy, is_contiguous};
use super::dense::{dense_cols, to_cols};
use super::dense_layout::{DenseLayer, DenseLayout};
use super::logprob::{log_softmax2_batch, log_softmax_at, normal_log_prob, wanted};
use super::record::{ParamsMut, RecordMut, Recorded};
use super::sampler::{argmax, sample_softmax, Sampler};
use super::tanh::{tanh, tanh_in_place};
use super::{ActionsMut, ExplorationType, PolicyError, SamplerState, Weights};
use crate::spec::Spec;
use crate::tensor::Tensor;

/// From this many parameters on, a network reads its layers from the named tensors
/// (one lookup per layer per row, nothing next to a forward pass this size) instead
/// of keeping a flat copy: a weight update then copies nothing.
pub(super) const NAMED_MIN_PARAMS: usize = 1 << 16;

/// Dense layers (tanh between them) followed by a [`Head`]; the engine of
/// `Linear` (no hidden layer) and `Mlp`.
#[derive(Clone)]
pub(super) struct Net {
    pub(super) obs_dim: usize,
    action: Spec,
    pub(super) layout: DenseLayout,
    /// All parameters, layer by layer, weight then bias: the fast copy of `weights`
    /// for small networks; empty when `named`.
    pub(super) params: Vec<f32>,
    /// Large network: layers are read from `weights` itself (f32, contiguous).
    pub(super) named: bool,
    /// The widest layer (inputs included): scratch holds `width * k` values.
    width: usize,
    /// Ping-pong scratch of feature-major activations (`[features, k]`); the output
    /// layer's ends in `cols_a`. Grown to the largest `k` seen, then reused.
    cols_a: Vec<f32>,
    cols_b: Vec<f32>,
    /// One observation's logits, gathered from `cols_a` for the head.
    logits: Vec<f32>,
    pub(super) head: Head,
    pub(super) sampler: Sampler,
    pub(super) exploration: ExplorationType,
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
        let layout = DenseLayout::new(&dims, names)
            .ok_or_else(|| PolicyError::Spec(format!("network {dims:?} has too many parameters")))?;
        let params = layout.init_f32(init_seed);
        let tensors = layout.to_weights(&params, |x| x);

        let width = dims.iter().copied().max().unwrap_or(0);
        let named = layout.len() >= NAMED_MIN_PARAMS;
        Ok(Net {
            obs_dim,
            action: action.clone(),
            layout,
            params: if named { Vec::new() } else { params },
            named,
            width,
            cols_a: Vec::new(),
            cols_b: Vec::new(),
            logits: vec![0.0; head.out_dim()],
            head,
            sampler: Sampler::new(seed),
            exploration: ExplorationType::default(),
            weights: Arc::new(tensors),
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
                self.layout.layers(),
                &Named(&self.weights),
                k,
                &mut self.cols_a,
                &mut self.cols_b,
            );
        } else {
            forward(
                self.layout.layers(),
                &Flat(&self.params),
                k,
                &mut self.cols_a,
                &mut self.cols_b,
            );
        }
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
        for l in self.layout.layers() {
            for (name, range, _) in l.tensors() {
                let src = weights.tensors[name].as_f32().expect("layout checked: f32");
                let dst = &mut self.params[range];
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
        for l in self.layout.layers() {
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

/// Where a layer's weight and bias are read from.
trait LayerSource {
    /// The `[n_out, n_in]` weight and `[n_out]` bias of `l`.
    fn layer(&self, l: &DenseLayer) -> (&[f32], &[f32]);
}

/// The flat parameter vector of a small network.
struct Flat<'a>(&'a [f32]);

impl LayerSource for Flat<'_> {
    #[inline(always)]
    fn layer(&self, l: &DenseLayer) -> (&[f32], &[f32]) {
        (&self.0[l.w..l.b], &self.0[l.b..l.b + l.n_out])
    }
}

/// The named tensors of a large network.
struct Named<'a>(&'a Weights);

impl LayerSource for Named<'_> {
    fn layer(&self, l: &DenseLayer) -> (&[f32], &[f32]) {
        match (self.0.f32_slice(&l.w_name), self.0.f32_slice(&l.b_name)) {
            (Ok(w), Ok(b)) => (w, b),
            _ => unreachable!("a large network's weights are checked f32 and contiguous when set"),
        }
    }
}

/// Runs the `k` feature-major inputs in `b` through `layers`; the output is left in
/// `a[..last n_out * k]`, tanh between the layers.
#[inline(always)]
fn forward(layers: &[DenseLayer], params: &impl LayerSource, k: usize, a: &mut Vec<f32>, b: &mut Vec<f32>) {
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
