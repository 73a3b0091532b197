//! A dense network with hand-written backpropagation, in f64: the learner's copy
//! of the `Linear` / `Mlp` policies (and of the value function).
//!
//! Parameters live in one flat vector laid out by the policies' own
//! [`DenseLayout`] (layer by layer, weight `[out, in]` row-major, then bias);
//! hidden layers are tanh, the output layer is linear.

use super::LearnError;
use crate::policy::dense_layout::DenseLayout;
use crate::policy::{DenseKind, LinearKind, MlpKind, PolicyConfig, Weights};

/// Dense layers with tanh between them; parameters in f64.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseNet {
    layout: DenseLayout,
    /// Every parameter, layer by layer, weight then bias.
    pub params: Vec<f64>,
}

/// The activations of a forward pass over `n` rows, kept for [`DenseNet::backward`].
#[derive(Clone, Debug, Default)]
pub struct Cache {
    n: usize,
    /// `acts[0]` is the input, `acts[i + 1]` the output of layer `i` (tanh applied for hidden layers).
    acts: Vec<Vec<f64>>,
}

impl Cache {
    /// The network's output, `[n, out]` row-major.
    pub fn output(&self) -> &[f64] {
        self.acts.last().map_or(&[], Vec::as_slice)
    }
}

/// Tensor names of layer `i` for a policy config (`weight`/`bias` for `Linear`,
/// `layers.{i}.weight`/`layers.{i}.bias` for `Mlp`).
pub fn layer_names(config: &PolicyConfig, i: usize) -> (String, String) {
    match config {
        PolicyConfig::Linear => LinearKind::layer_names(i),
        _ => MlpKind::layer_names(i),
    }
}

impl DenseNet {
    /// A network `dims[0] -> dims[1] -> ... -> dims[last]`, tensors named by `names(i)`,
    /// with torch's default initialisation (uniform in `±1/sqrt(fan_in)`) from `seed`.
    pub fn new(dims: &[usize], names: impl Fn(usize) -> (String, String), seed: u64) -> Result<DenseNet, LearnError> {
        if dims.len() < 2 || dims.contains(&0) {
            return Err(LearnError::Config(format!(
                "network widths {dims:?}: need at least two, none zero"
            )));
        }
        let layout = DenseLayout::new(dims, names)
            .ok_or_else(|| LearnError::Config(format!("network widths {dims:?}: too many parameters")))?;
        let params = layout.init_f64(seed);
        Ok(DenseNet { layout, params })
    }

    /// Input width.
    pub fn n_in(&self) -> usize {
        self.layout.layers()[0].n_in
    }

    /// Output width.
    pub fn n_out(&self) -> usize {
        let layers = self.layout.layers();
        layers[layers.len() - 1].n_out
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// True when the network has no parameter (never, for a built one).
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Copies `weights` (f32 tensors under this network's names and shapes) into the parameters.
    pub fn set_weights(&mut self, weights: &Weights) -> Result<(), LearnError> {
        for l in self.layout.layers() {
            for (name, range, shape) in l.tensors() {
                let t = weights
                    .tensors
                    .get(name)
                    .ok_or_else(|| LearnError::Weights(format!("missing tensor `{name}`")))?;
                let a = t
                    .as_f32()
                    .filter(|a| a.shape() == shape)
                    .ok_or_else(|| LearnError::Weights(format!("`{name}` must be f32 {shape:?}")))?;
                for (d, s) in self.params[range.start..].iter_mut().zip(a.iter()) {
                    *d = f64::from(*s);
                }
            }
        }
        Ok(())
    }

    /// The parameters as f32 [`Weights`] (version 0) under this network's names.
    pub fn to_weights(&self) -> Weights {
        self.layout.to_weights(&self.params, |x| x as f32)
    }

    /// Runs `n` rows of `x` (`[n, n_in]` row-major) through the network with `params`
    /// (this network's layout; pass `&self.params` for the current ones).
    pub fn forward_with(&self, params: &[f64], x: &[f64], n: usize) -> Cache {
        debug_assert_eq!(x.len(), n * self.n_in());
        let layers = self.layout.layers();
        let mut acts = Vec::with_capacity(layers.len() + 1);
        acts.push(x.to_vec());
        let last = layers.len() - 1;
        for (i, l) in layers.iter().enumerate() {
            let input = &acts[i];
            let w = &params[l.w..l.b];
            let b = &params[l.b..l.b + l.n_out];
            let mut out = vec![0.0; n * l.n_out];
            for r in 0..n {
                let xr = &input[r * l.n_in..(r + 1) * l.n_in];
                for (j, o) in out[r * l.n_out..(r + 1) * l.n_out].iter_mut().enumerate() {
                    let row = &w[j * l.n_in..(j + 1) * l.n_in];
                    let s: f64 = row.iter().zip(xr).map(|(a, b)| a * b).sum();
                    *o = if i == last { s + b[j] } else { (s + b[j]).tanh() };
                }
            }
            acts.push(out);
        }
        Cache { n, acts }
    }

    /// [`Self::forward_with`] the current parameters.
    pub fn forward(&self, x: &[f64], n: usize) -> Cache {
        self.forward_with(&self.params, x, n)
    }

    /// Adds to `grad` (this network's layout) the gradient of a loss whose gradient
    /// with respect to the output of `cache` is `d_out` (`[n, n_out]`).
    pub fn backward_with(&self, params: &[f64], cache: &Cache, d_out: &[f64], grad: &mut [f64]) {
        let n = cache.n;
        let mut delta = d_out.to_vec();
        for (i, l) in self.layout.layers().iter().enumerate().rev() {
            // `delta` is dL/d(pre-activation) of layer i, `[n, n_out]`.
            let input = &cache.acts[i];
            let w = &params[l.w..l.b];
            let (gw, rest) = grad[l.w..].split_at_mut(l.n_in * l.n_out);
            let gb = &mut rest[..l.n_out];
            for r in 0..n {
                let xr = &input[r * l.n_in..(r + 1) * l.n_in];
                let dr = &delta[r * l.n_out..(r + 1) * l.n_out];
                for (j, &d) in dr.iter().enumerate() {
                    if d == 0.0 {
                        continue;
                    }
                    gb[j] += d;
                    for (g, &x) in gw[j * l.n_in..(j + 1) * l.n_in].iter_mut().zip(xr) {
                        *g += d * x;
                    }
                }
            }
            if i == 0 {
                break;
            }
            // Through the weights, then through the tanh of layer i - 1 (whose output is `input`).
            let mut prev = vec![0.0; n * l.n_in];
            for r in 0..n {
                let dr = &delta[r * l.n_out..(r + 1) * l.n_out];
                let pr = &mut prev[r * l.n_in..(r + 1) * l.n_in];
                for (j, &d) in dr.iter().enumerate() {
                    if d == 0.0 {
                        continue;
                    }
                    for (p, &wv) in pr.iter_mut().zip(&w[j * l.n_in..(j + 1) * l.n_in]) {
                        *p += d * wv;
                    }
                }
                for (p, &a) in pr.iter_mut().zip(&input[r * l.n_in..(r + 1) * l.n_in]) {
                    *p *= 1.0 - a * a;
                }
            }
            delta = prev;
        }
    }

    /// [`Self::backward_with`] the current parameters.
    pub fn backward(&self, cache: &Cache, d_out: &[f64], grad: &mut [f64]) {
        self.backward_with(&self.params, cache, d_out, grad);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{ActionsMut, ExplorationType, PolicySpec};
    use crate::spec::Spec;

    #[test]
    fn round_trips_policy_weights_and_matches_the_policy() {
        let obs = Spec::uniform_box(4, -1.0, 1.0);
        let act = Spec::Discrete { n: 2 };
        for config in [PolicyConfig::Linear, PolicyConfig::Mlp { hidden: vec![5, 3] }] {
            let spec = PolicySpec {
                config: config.clone(),
                exploration: ExplorationType::Deterministic,
                init_seed: 4,
                record: true,
            };
            let mut p = spec.build(&obs, &act, 0).unwrap();
            let dims: Vec<usize> = match &config {
                PolicyConfig::Mlp { hidden } => [vec![4], hidden.clone(), vec![2]].concat(),
                _ => vec![4, 2],
            };
            let mut net = DenseNet::new(&dims, |i| layer_names(&config, i), 0).unwrap();
            net.set_weights(p.weights()).unwrap();
            assert_eq!(&net.to_weights(), p.weights());
            // The same argmax as the policy.
            let x = [0.3f32, -0.2, 0.9, 0.1, -0.5, 0.4, -0.9, 0.2];
            let mut a = [0i64; 2];
            p.act(&x, 2, ActionsMut::Discrete(&mut a)).unwrap();
            let xd: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
            let out = net.forward(&xd, 2);
            for (r, &ar) in a.iter().enumerate() {
                let z = &out.output()[r * 2..r * 2 + 2];
                assert_eq!(ar, i64::from(z[1] > z[0]), "{config:?} {z:?}");
            }
            p.set_weights(&net.to_weights().with_version(1)).unwrap();
        }
    }

    #[test]
    fn missing_or_misshaped_weights_are_errors() {
        let mut net = DenseNet::new(
            &[2, 3, 2],
            |i| layer_names(&PolicyConfig::Mlp { hidden: vec![3] }, i),
            0,
        )
        .unwrap();
        let mut w = net.to_weights();
        w.tensors.remove("layers.1.bias");
        assert!(matches!(net.set_weights(&w), Err(LearnError::Weights(_))));
        assert!(DenseNet::new(&[2], |i| layer_names(&PolicyConfig::Linear, i), 0).is_err());
        assert!(DenseNet::new(&[2, 0, 2], |i| layer_names(&PolicyConfig::Linear, i), 0).is_err());
    }
}
