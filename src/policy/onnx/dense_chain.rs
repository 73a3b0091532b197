//! The fast path: an ONNX graph that is exactly a chain of dense layers runs on the
//! built-in networks' kernel ([`dense_cols`], [`tanh_in_place`]) instead of tract.
//!
//! tract costs a few microseconds per call and a plan rebuild per weight version; the
//! graph a torch actor most often is can skip both. Recognised: `nn.Linear` layers
//! (`Gemm` with `alpha = beta = 1` and `transB = 1`, or `transB = 0` with an
//! `[in, out]` weight; or `MatMul` by an `[in, out]` weight, optionally then `Add` of
//! the bias) with `Tanh`, `Relu` or nothing between them, and
//! optionally `Identity` and multiplications by a scalar `Constant` (`2 * tanh(x)`).
//! For a normal head, the spread output must be state-independent: an f32 initializer,
//! through `Identity` or scalar multiplications (`log_std * 1.0`). Every node of the
//! graph must be on those paths; anything else is left to tract.
//!
//! The weights are read from the initializers by name, laid out as torch stores them
//! (`[out, in]`: nothing transposed; an `[in, out]` one is copied transposed at each
//! version); a weight version is the update's tensors
//! themselves (a large network, as the built-in `mlp` does) or one copy of them (a
//! small one), so an update rebuilds nothing. The sums are the built-in's order (bias
//! first, then each product in input order), not tract's: within rounding of it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tract_onnx::pb::{self, tensor_proto::DataType};

use super::model::{Parsed, Roles};
use super::OnnxHead;
use crate::policy::contiguous::{contiguous_copy, is_contiguous};
use crate::policy::dense::{dense_cols, to_cols};
use crate::policy::net::NAMED_MIN_PARAMS;
use crate::policy::tanh::tanh_in_place;
use crate::policy::{PolicyError, Weights};

/// One step of the chain, on `[features, k]` activations.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    /// Layer `i` of [`DenseChain::layers`].
    Dense(usize),
    /// `tanh`, rollout's (docs/policies.md).
    Tanh,
    /// `max(x, 0)`.
    Relu,
    /// `x * c` for a scalar constant `c`.
    Scale(f32),
}

/// Where a layer's weight or bias is read from for the current version.
#[derive(Clone, Copy, Debug)]
enum Slot {
    /// At this offset of the flat copy.
    Flat(usize),
    /// The named tensor itself.
    Named,
}

/// A dense layer: `y = b + W x`, `W` `[n_out, n_in]`.
#[derive(Clone, Debug)]
struct Layer {
    n_in: usize,
    n_out: usize,
    /// The weight's initializer.
    weight: String,
    /// The initializer is `[n_in, n_out]` (`MatMul`, or `Gemm` with `transB = 0`):
    /// each version is copied transposed.
    transposed: bool,
    /// The bias's initializer (none: zeros).
    bias: Option<String>,
    w_at: Slot,
    b_at: Slot,
}

/// The state-independent spread of a normal head: an initializer times constants.
#[derive(Clone, Debug)]
struct Spread {
    init: String,
    factors: Vec<f32>,
}

/// A recognised chain with the current weights and its scratch buffers.
pub(super) struct DenseChain {
    ops: Vec<Op>,
    layers: Vec<Layer>,
    obs_dim: usize,
    out_dim: usize,
    /// The widest activation (inputs included).
    width: usize,
    spread: Option<Spread>,
    /// Layers are read from the named tensors (a large network): an update copies
    /// nothing (but transposed weights and missing biases, which live in `params`).
    named: bool,
    params: Vec<f32>,
    weights: Arc<Weights>,
    /// The spread's values for the current version.
    spread_values: Vec<f32>,
    cols_a: Vec<f32>,
    cols_b: Vec<f32>,
    /// The chain's output, row-major `[k, out_dim]`.
    rows: Vec<f32>,
}

impl DenseChain {
    /// The chain that `parsed`'s graph is, from an observation of `obs_shape` to the
    /// `out_dim` values of the output playing the main part of `roles` for `head`, with
    /// `weights` (of the file's layout); `None` if the graph is anything else.
    pub(super) fn recognise(
        parsed: &Parsed,
        head: OnnxHead,
        roles: Roles,
        obs_shape: &[usize],
        out_dim: usize,
        weights: &Arc<Weights>,
    ) -> Option<DenseChain> {
        let [obs_dim] = *obs_shape else {
            return None;
        };
        let input = parsed.input.as_ref().ok()?;
        let graph = Graph::new(parsed.proto.graph.as_ref()?, weights);
        let names: Vec<&str> = graph.g.output.iter().map(|o| o.name.as_str()).collect();
        let (main, spread_out) = match (head, roles) {
            (OnnxHead::Categorical | OnnxHead::QValue, Roles::Categorical { logits }) => (logits, None),
            (OnnxHead::Deterministic, Roles::Action { action }) => (action, None),
            (
                OnnxHead::Normal | OnnxHead::TanhNormal,
                Roles::Normal {
                    loc,
                    spread,
                    per_row: false,
                    ..
                },
            ) => (loc, Some(spread)),
            _ => return None,
        };
        let mut used = HashSet::new();
        let (ops, layers) = graph.chain(names.get(main)?, input, &mut used)?;
        let spread = match spread_out {
            Some(i) => {
                let s = graph.spread(names.get(i)?, &mut used)?;
                Some((weights.tensors.get(&s.init)?.len() == out_dim).then_some(s)?)
            }
            None => None,
        };
        // Outputs no head reads may only copy an initializer (an exploration module's
        // `eps`, kept in the graph by the exporter; the node reads it from the weights).
        for (i, name) in names.iter().enumerate() {
            if i != main && Some(i) != spread_out {
                let node = graph.node(name, &mut used)?;
                match (node.op_type.as_str(), node.input.as_slice()) {
                    ("Identity", [x]) if graph.shapes.contains_key(x.as_str()) => {}
                    _ => return None,
                }
            }
        }
        if used.len() != graph.g.node.len() {
            return None;
        }
        // The features through the chain: each layer takes what the one before gave.
        let mut f = obs_dim;
        let mut width = obs_dim;
        for op in &ops {
            if let Op::Dense(i) = op {
                let l = &layers[*i];
                if l.n_in != f {
                    return None;
                }
                f = l.n_out;
                width = width.max(f);
            }
        }
        if f != out_dim || layers.is_empty() {
            return None;
        }
        let total: usize = layers.iter().map(|l| l.n_in * l.n_out + l.n_out).sum();
        let mut chain = DenseChain {
            ops,
            layers,
            obs_dim,
            out_dim,
            width,
            spread,
            named: total >= NAMED_MIN_PARAMS,
            params: Vec::new(),
            weights: Arc::clone(weights),
            spread_values: Vec::new(),
            cols_a: Vec::new(),
            cols_b: Vec::new(),
            rows: Vec::new(),
        };
        chain.set_weights(weights).ok()?;
        Some(chain)
    }

    /// Makes `weights` (already checked against the layout) the current version; on
    /// error nothing changed.
    pub(super) fn set_weights(&mut self, weights: &Arc<Weights>) -> Result<(), PolicyError> {
        let weights = if weights.tensors.values().all(is_contiguous) {
            Arc::clone(weights)
        } else {
            Arc::new(contiguous_copy(weights))
        };
        let read = |name: &str| weights.f32_slice(name);
        // Every tensor read first, so that an error changes nothing.
        for l in &self.layers {
            read(&l.weight)?;
            if let Some(b) = &l.bias {
                read(b)?;
            }
        }
        if let Some(s) = &self.spread {
            read(&s.init)?;
        }
        self.params.clear();
        for l in &mut self.layers {
            let w = read(&l.weight)?;
            l.w_at = if l.transposed {
                let at = self.params.len();
                self.params.resize(at + w.len(), 0.0);
                // `[n_in, n_out]` to `[n_out, n_in]`.
                let dst = &mut self.params[at..];
                for (i, row) in w.chunks_exact(l.n_out).enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        dst[j * l.n_in + i] = v;
                    }
                }
                Slot::Flat(at)
            } else if self.named {
                Slot::Named
            } else {
                self.params.extend_from_slice(w);
                Slot::Flat(self.params.len() - w.len())
            };
            l.b_at = match &l.bias {
                Some(b) if self.named => {
                    read(b)?;
                    Slot::Named
                }
                Some(b) => {
                    self.params.extend_from_slice(read(b)?);
                    Slot::Flat(self.params.len() - l.n_out)
                }
                None => {
                    self.params.resize(self.params.len() + l.n_out, 0.0);
                    Slot::Flat(self.params.len() - l.n_out)
                }
            };
        }
        if let Some(s) = &self.spread {
            self.spread_values.clear();
            self.spread_values.extend_from_slice(read(&s.init)?);
            for &c in &s.factors {
                self.spread_values.iter_mut().for_each(|v| *v *= c);
            }
        }
        self.weights = weights;
        Ok(())
    }

    /// Reads the layers from the named tensors whatever the network's size.
    #[cfg(test)]
    pub(super) fn read_named_tensors(&mut self) {
        self.named = true;
        let w = Arc::clone(&self.weights);
        if let Err(e) = self.set_weights(&w) {
            unreachable!("the current weights were read before: {e}");
        }
    }

    /// Runs `k` observations (row-major); gives the main output row-major
    /// (`[k, out_dim]`) and the spread (`[out_dim]`, empty without one).
    pub(super) fn run(&mut self, obs: &[f32], k: usize) -> (&[f32], &[f32]) {
        let need = self.width * k;
        if self.cols_a.len() < need {
            self.cols_a.resize(need, 0.0);
            self.cols_b.resize(need, 0.0);
        }
        // The current activations are in `cur`; a layer writes `next`, then they swap.
        let (mut cur, mut next) = (&mut self.cols_a, &mut self.cols_b);
        to_cols(obs, k, self.obs_dim, cur);
        let mut f = self.obs_dim;
        for op in &self.ops {
            match *op {
                Op::Dense(i) => {
                    let l = &self.layers[i];
                    let (w, b) = layer_slices(l, &self.params, &self.weights);
                    dense_cols(w, b, l.n_in, l.n_out, &cur[..l.n_in * k], k, &mut next[..l.n_out * k]);
                    std::mem::swap(&mut cur, &mut next);
                    f = l.n_out;
                }
                Op::Tanh => tanh_in_place(&mut cur[..f * k]),
                Op::Relu => relu_in_place(&mut cur[..f * k]),
                Op::Scale(c) => cur[..f * k].iter_mut().for_each(|v| *v *= c),
            }
        }
        let d = self.out_dim;
        self.rows.resize(d * k, 0.0);
        for (j, col) in cur.chunks_exact(k).take(d).enumerate() {
            for (r, &v) in col.iter().enumerate() {
                self.rows[r * d + j] = v;
            }
        }
        (&self.rows, &self.spread_values)
    }
}

/// A layer's weight `[n_out, n_in]` and bias `[n_out]` for the current version.
#[inline]
fn layer_slices<'a>(l: &Layer, params: &'a [f32], weights: &'a Weights) -> (&'a [f32], &'a [f32]) {
    let named = |name: &str| match weights.f32_slice(name) {
        Ok(s) => s,
        Err(_) => unreachable!("the named tensors were checked f32 and contiguous when set"),
    };
    let w = match l.w_at {
        Slot::Flat(at) => &params[at..at + l.n_in * l.n_out],
        Slot::Named => named(&l.weight),
    };
    let b = match (l.b_at, &l.bias) {
        (Slot::Flat(at), _) => &params[at..at + l.n_out],
        (Slot::Named, Some(name)) => named(name),
        (Slot::Named, None) => unreachable!("a missing bias is zeros in the flat copy"),
    };
    (w, b)
}

/// `max(x, 0)` in place (NaN stays NaN, as torch's `relu`).
fn relu_in_place(v: &mut [f32]) {
    for x in v {
        if *x < 0.0 {
            *x = 0.0;
        }
    }
}

/// The graph, indexed for walking back from an output.
struct Graph<'a> {
    g: &'a pb::GraphProto,
    /// Which node writes each tensor.
    producer: HashMap<&'a str, usize>,
    /// The f32 initializers' shapes (from the weights: the parsed file keeps no data).
    shapes: HashMap<&'a str, Vec<usize>>,
}

impl<'a> Graph<'a> {
    fn new(g: &'a pb::GraphProto, weights: &'a Weights) -> Graph<'a> {
        let mut producer = HashMap::new();
        for (i, n) in g.node.iter().enumerate() {
            for o in &n.output {
                producer.insert(o.as_str(), i);
            }
        }
        let shapes = g
            .initializer
            .iter()
            .filter(|t| t.data_type == DataType::Float as i32)
            .filter_map(|t| {
                let s = weights.tensors.get(&t.name)?.shape().to_vec();
                Some((t.name.as_str(), s))
            })
            .collect();
        Graph { g, producer, shapes }
    }

    /// The node writing `tensor`, marked used; a node met twice (shared, or a cycle in a malformed file) is no chain.
    fn node(&self, tensor: &str, used: &mut HashSet<usize>) -> Option<&'a pb::NodeProto> {
        let i = *self.producer.get(tensor)?;
        used.insert(i).then(|| &self.g.node[i])
    }

    /// The ops from `input` to `output`, in order, and their layers.
    fn chain(&self, output: &str, input: &str, used: &mut HashSet<usize>) -> Option<(Vec<Op>, Vec<Layer>)> {
        let mut ops = Vec::new();
        let mut layers = Vec::new();
        let mut t: &str = output;
        while t != input {
            let node = self.node(t, used)?;
            if !node.domain.is_empty() && node.domain != "ai.onnx" {
                return None;
            }
            let ins: Vec<&str> = node.input.iter().map(String::as_str).collect();
            t = match (node.op_type.as_str(), ins.as_slice()) {
                ("Identity", [x]) => *x,
                ("Tanh", [x]) => {
                    ops.push(Op::Tanh);
                    *x
                }
                ("Relu", [x]) => {
                    ops.push(Op::Relu);
                    *x
                }
                ("Mul", [a, b]) => {
                    let (x, c) = match (self.scalar(a, used), self.scalar(b, used)) {
                        (None, Some(c)) => (*a, c),
                        (Some(c), None) => (*b, c),
                        _ => return None,
                    };
                    ops.push(Op::Scale(c));
                    x
                }
                ("Gemm", [x, w, rest @ ..]) => {
                    let ok = attr_f(node, "alpha", 1.0) == 1.0
                        && attr_i(node, "transA", 0) == 0
                        && (rest.is_empty() || attr_f(node, "beta", 1.0) == 1.0);
                    let transposed = match attr_i(node, "transB", 0) {
                        1 => false,
                        0 => true,
                        _ => return None,
                    };
                    let bias = match rest {
                        [] | [""] => None,
                        [b] => Some(*b),
                        _ => return None,
                    };
                    if !ok {
                        return None;
                    }
                    ops.push(Op::Dense(layers.len()));
                    layers.push(self.layer(w, transposed, bias)?);
                    *x
                }
                ("MatMul", [x, w]) => {
                    ops.push(Op::Dense(layers.len()));
                    layers.push(self.layer(w, true, None)?);
                    *x
                }
                // `MatMul` then `Add` of a bias: one dense layer.
                ("Add", [a, b]) => {
                    let (mm, bias) = match (self.shapes.contains_key(a), self.shapes.contains_key(b)) {
                        (false, true) => (*a, *b),
                        (true, false) => (*b, *a),
                        _ => return None,
                    };
                    let m = self.node(mm, used)?;
                    let [x, w] = m.input.as_slice() else {
                        return None;
                    };
                    if m.op_type != "MatMul" || !(m.domain.is_empty() || m.domain == "ai.onnx") {
                        return None;
                    }
                    ops.push(Op::Dense(layers.len()));
                    layers.push(self.layer(w, true, Some(bias))?);
                    x.as_str()
                }
                _ => return None,
            };
        }
        ops.reverse();
        // Layers were numbered from the output back: renumber in running order.
        let n = layers.len();
        for op in &mut ops {
            if let Op::Dense(i) = op {
                *i = n - 1 - *i;
            }
        }
        layers.reverse();
        Some((ops, layers))
    }

    /// A dense layer over the f32 initializers `w` (`[n_out, n_in]`, or `[n_in, n_out]`
    /// if `transposed`) and `bias` (`[n_out]` or `[1, n_out]`).
    fn layer(&self, w: &str, transposed: bool, bias: Option<&str>) -> Option<Layer> {
        let [a, b] = self.shapes.get(w)?.as_slice() else {
            return None;
        };
        let (n_out, n_in) = if transposed { (*b, *a) } else { (*a, *b) };
        if let Some(bias) = bias {
            match self.shapes.get(bias)?.as_slice() {
                [n] | [1, n] if *n == n_out => {}
                _ => return None,
            }
        }
        Some(Layer {
            n_in,
            n_out,
            weight: w.to_string(),
            transposed,
            bias: bias.map(str::to_string),
            w_at: Slot::Named,
            b_at: Slot::Named,
        })
    }

    /// A normal head's spread written from one f32 initializer by `Identity` and
    /// scalar multiplications.
    fn spread(&self, output: &str, used: &mut HashSet<usize>) -> Option<Spread> {
        let mut factors = Vec::new();
        let mut t = output;
        while !self.shapes.contains_key(t) {
            let node = self.node(t, used)?;
            t = match (node.op_type.as_str(), node.input.as_slice()) {
                ("Identity", [x]) => x.as_str(),
                ("Mul", [a, b]) => {
                    let (x, c) = match (self.scalar(a, used), self.scalar(b, used)) {
                        (None, Some(c)) => (a, c),
                        (Some(c), None) => (b, c),
                        _ => return None,
                    };
                    factors.push(c);
                    x.as_str()
                }
                _ => return None,
            };
        }
        factors.reverse();
        let shape = self.shapes.get(t)?;
        matches!(shape.as_slice(), [_] | [1, _]).then(|| Spread {
            init: t.to_string(),
            factors,
        })
    }

    /// The value of a scalar f32 `Constant` node's output (its node marked used).
    fn scalar(&self, tensor: &str, used: &mut HashSet<usize>) -> Option<f32> {
        let i = *self.producer.get(tensor)?;
        let node = &self.g.node[i];
        if node.op_type != "Constant" {
            return None;
        }
        let value = node.attribute.iter().find_map(|a| match a.name.as_str() {
            "value" => a.t.as_ref().and_then(scalar_tensor),
            "value_float" => Some(a.f),
            _ => None,
        })?;
        used.insert(i);
        Some(value)
    }
}

/// The one value of an f32 tensor of one element.
fn scalar_tensor(t: &pb::TensorProto) -> Option<f32> {
    if t.data_type != DataType::Float as i32 || t.dims.iter().product::<i64>() != 1 {
        return None;
    }
    match (t.float_data.as_slice(), t.raw_data.as_slice()) {
        ([v], _) => Some(*v),
        ([], [a, b, c, d]) => Some(f32::from_le_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// A float attribute, or its default.
fn attr_f(node: &pb::NodeProto, name: &str, default: f32) -> f32 {
    node.attribute.iter().find(|a| a.name == name).map_or(default, |a| a.f)
}

/// An integer attribute, or its default.
fn attr_i(node: &pb::NodeProto, name: &str, default: i64) -> i64 {
    node.attribute.iter().find(|a| a.name == name).map_or(default, |a| a.i)
}
