//! An ONNX model as a policy sees it: the file, parsed once and shared by every
//! clone; its float initializers (the weights); and, for given specs, a typed tract
//! model whose observation input and head outputs were checked to fit them.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use tract_onnx::pb::{self, tensor_proto::DataType};
use tract_onnx::prelude::{DatumType, Framework, InferenceFact, InferenceModelExt, TDim, TypedFact, TypedModel};

use super::error::MAX_NAME_BYTES;
use super::guard::guarded;
use super::limits::{check_model, node_name};
use super::prescan::prescan;
use super::{OnnxBytes, OnnxError, OnnxHead, MAX_MODEL_BYTES};
use crate::peer_text::bounded_to as bounded;
use crate::policy::{StateTensor, Weights};
use crate::schema::{keys, BatchLayout};
use crate::spec::Spec;
use crate::tensor::Tensor;

/// The batch dimension's symbol in the typed model.
pub(super) const BATCH: &str = "K";

/// An `.onnx` file; parsing happens once, on first use, and is shared by clones.
/// Serialised as its bytes; two models are equal when their bytes are.
#[derive(Clone)]
pub struct OnnxModel {
    bytes: OnnxBytes,
    parsed: Arc<OnceLock<Result<Arc<Parsed>, OnnxError>>>,
}

/// What parsing the file gave.
pub(super) struct Parsed {
    /// The protobuf model, its f32 initializers without their data (they are in
    /// `weights`; each build writes the version it is built with): a rebuild copies no
    /// tensor it then overwrites.
    pub(super) proto: pb::ModelProto,
    /// The f32 initializers by name, in the file's order of appearance.
    pub(super) float_names: Vec<String>,
    /// The f32 initializers: version 0 of the weights.
    pub(super) weights: Arc<Weights>,
    /// The observation input's name, when the model has one input or one named
    /// `observation`; else why not (a model of several inputs, one per leaf of a dict
    /// observation, serves Python nodes only).
    pub(super) input: Result<String, OnnxError>,
    /// Every input that is not an initializer, in the graph's order.
    pub(super) inputs: Vec<String>,
}

/// Which output plays which part for a head (indices into the typed model's outputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Roles {
    /// `logits` `[K, n]`.
    Categorical {
        /// The logits output.
        logits: usize,
    },
    /// `loc` `[K, d]` and `scale` or `log_std`.
    Normal {
        /// The loc output.
        loc: usize,
        /// The scale or log-std output.
        spread: usize,
        /// `spread` is a log-std.
        log_std: bool,
        /// `spread` has one row for every observation (`[K, d]`), not one for all.
        per_row: bool,
    },
    /// `action`: f32 `[K, d]`, or integers for a discrete action.
    Action {
        /// The action output.
        action: usize,
    },
}

/// A typed model checked against specs, ready to be optimised.
pub(super) struct Checked {
    /// The decluttered model; its first input is the observation, then (a recurrent
    /// model) `is_init` and the state tensors in the policy's order.
    pub(super) model: TypedModel,
    /// The inputs after those: these initializers, in this order (only when the
    /// initializers were turned into inputs).
    pub(super) weight_inputs: Vec<String>,
    /// The outputs' parts.
    pub(super) roles: Roles,
    /// Each state tensor's `next.<name>` output (indices into the outputs), in the
    /// policy's order; empty for a model without state.
    pub(super) state_outputs: Vec<usize>,
}

impl OnnxModel {
    /// The model in `bytes`, not parsed yet (parsing errors show at first use).
    pub fn new(bytes: impl Into<OnnxBytes>) -> OnnxModel {
        OnnxModel {
            bytes: bytes.into(),
            parsed: Arc::new(OnceLock::new()),
        }
    }

    /// The model in `bytes`, parsed now: a file that is not ONNX, over
    /// [`MAX_MODEL_BYTES`], with an op tract cannot run, or whose observation input
    /// cannot be found, is an error.
    pub fn parse(bytes: impl Into<OnnxBytes>) -> Result<OnnxModel, OnnxError> {
        let m = OnnxModel::new(bytes);
        m.parsed()?;
        Ok(m)
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &OnnxBytes {
        &self.bytes
    }

    /// Version 0 of the weights: the f32 initializers by name, as in the file.
    pub fn initial_weights(&self) -> Result<Arc<Weights>, OnnxError> {
        Ok(self.parsed()?.weights.clone())
    }

    /// Checks that the model fits these specs for `head`: its observation input takes
    /// `[K, *obs_shape]` f32 and its outputs are what the head needs for `action`; a
    /// recurrent model (`state` not empty) also takes `is_init` and each state tensor,
    /// and gives `next.<name>` for each (PROTOCOL.md §8, Recurrent).
    pub fn check(&self, obs: &Spec, action: &Spec, head: OnnxHead, state: &[StateTensor]) -> Result<(), OnnxError> {
        self.typed(obs, action, head, state, Weighting::Constants(None))
            .map(|_| ())
    }

    /// The state a recurrent model declares: when it has an input named `is_init`, each
    /// input other than the observation and `is_init`, in the graph's order, with its
    /// declared shape after the batch dimension (which must be concrete); else none.
    /// A model exported with `torch.onnx.export` declares them so (docs/policies.md).
    pub fn declared_state(&self) -> Result<Vec<StateTensor>, OnnxError> {
        let parsed = self.parsed()?;
        if !parsed.inputs.iter().any(|n| n == keys::IS_INIT) {
            return Ok(Vec::new());
        }
        let graph = parsed
            .proto
            .graph
            .as_ref()
            .ok_or_else(|| OnnxError::NotOnnx("the model has no graph".into()))?;
        let obs = parsed.input.clone()?;
        let mut state = Vec::new();
        for name in parsed.inputs.iter().filter(|n| **n != obs && *n != keys::IS_INIT) {
            let dims = declared_dims(graph, name)
                .ok_or_else(|| OnnxError::input(name, "a state input must declare its shape: [batch, *state shape]"))?;
            let shape = dims
                .get(1..)
                .unwrap_or_default()
                .iter()
                .map(|d| {
                    d.ok_or_else(|| OnnxError::input(name, "a state input's dims after the batch must be concrete"))
                })
                .collect::<Result<Vec<usize>, _>>()?;
            if dims.is_empty() {
                return Err(OnnxError::input(name, "a state input needs a batch dimension"));
            }
            state.push(StateTensor::new(name.clone(), shape));
        }
        crate::policy::check_state(&state).map_err(|e| OnnxError::input(keys::IS_INIT, e.to_string()))?;
        Ok(state)
    }

    /// Checks that the model fits an env only the nodes know (specs as `ready` reports
    /// them, PROTOCOL.md §3): each model input is an observation leaf (`observation`,
    /// or `observation.<name>` of a dict; the only input may be named anything for a
    /// one-leaf observation) taking `[K, *leaf shape]` of the leaf's dtype, or a float
    /// input the node casts the leaf to (a u8 image stays u8 for a u8 input); the head's
    /// outputs fit the action (discrete or a box). `layout` is the batch layout the
    /// specs give (`EnvSpecs::batch_layout`), `action` their action as a [`Spec`].
    pub fn check_node_specs(
        &self,
        layout: &BatchLayout,
        action: &Spec,
        head: OnnxHead,
        state: &[StateTensor],
    ) -> Result<(), OnnxError> {
        let parsed = self.parsed()?;
        guarded("checking the model against the node's specs", || {
            self.check_parsed_node_specs(parsed, layout, action, head, state)
        })
    }

    /// [`OnnxModel::check_node_specs`] on the parsed model, unguarded.
    fn check_parsed_node_specs(
        &self,
        parsed: &Parsed,
        layout: &BatchLayout,
        action: &Spec,
        head: OnnxHead,
        state: &[StateTensor],
    ) -> Result<(), OnnxError> {
        let leaves: Vec<(&String, &(crate::tensor::DType, Vec<usize>))> = layout
            .iter()
            .filter(|(k, _)| *k == keys::OBSERVATION || k.starts_with("observation."))
            .collect();
        let graph = parsed
            .proto
            .graph
            .as_ref()
            .ok_or_else(|| OnnxError::NotOnnx("the model has no graph".into()))?;
        let onnx = tract_onnx::onnx();
        let mut proto = parsed.proto.clone();
        if let Some(g) = proto.graph.as_mut() {
            replace_initializers(g, &parsed.weights)?;
        }
        let mut model = onnx.model_for_proto_model(&proto).map_err(OnnxError::tract)?;
        let k = model.symbols.sym(BATCH);
        let outlets = model.input_outlets().map_err(OnnxError::tract)?.to_vec();
        check_state_inputs(parsed, state)?;
        for outlet in outlets {
            let name = model.node(outlet.node).name.clone();
            if let Some(fact) = state_fact(&name, state, &k) {
                let at = input_index(&model, outlet, &name)?;
                model
                    .set_input_fact(at, fact)
                    .map_err(|e| OnnxError::input(&name, format!("{e:#}")))?;
                continue;
            }
            let leaf = match leaves.as_slice() {
                [(_, only)] if parsed.inputs.len() == 1 => *only,
                _ => leaves
                    .iter()
                    .find(|(key, _)| **key == name)
                    .map(|(_, l)| *l)
                    .ok_or_else(|| {
                        let names: Vec<&String> = leaves.iter().map(|(k, _)| *k).collect();
                        OnnxError::input(&name, format!("names no observation entry; the env's are {names:?}"))
                    })?,
            };
            let (dtype, shape) = leaf;
            let declared = declared_type(graph, &name);
            let dt = match (declared, dtype) {
                (Some(d @ (DatumType::F32 | DatumType::F64)), _) => d,
                (Some(d), leaf_dt) if datum_of(*leaf_dt) == Some(d) => d,
                (None, leaf_dt) => datum_of(*leaf_dt).unwrap_or(DatumType::F32),
                (Some(d), leaf_dt) => {
                    return Err(OnnxError::input(
                        &name,
                        format!("is {d:?}; the observation entry is {leaf_dt} (a node casts only to a float input)"),
                    ))
                }
            };
            check_input_shape(graph, &name, shape)?;
            let dims: Vec<TDim> = std::iter::once(TDim::Sym(k.clone()))
                .chain(shape.iter().map(|&d| TDim::from(d)))
                .collect();
            let at = input_index(&model, outlet, &name)?;
            model
                .set_input_fact(at, InferenceFact::dt_shape(dt, dims))
                .map_err(|e| OnnxError::input(&name, format!("cannot take [K, {shape:?}] {dt:?}: {e:#}")))?;
        }
        let model = model.into_typed().map_err(OnnxError::tract)?;
        let model = model.into_decluttered().map_err(OnnxError::tract)?;
        let names = output_names(&proto);
        let k = TDim::Sym(k);
        roles(&model, &names, head, action, &k)?;
        state_outputs(&model, &names, state, &k).map(|_| ())
    }

    /// The parse, done once.
    pub(super) fn parsed(&self) -> Result<&Parsed, OnnxError> {
        match self.parsed.get_or_init(|| parse(self.bytes.as_slice()).map(Arc::new)) {
            Ok(p) => Ok(p),
            Err(e) => Err(e.clone()),
        }
    }

    /// The typed model for these specs, with the f32 initializers as `weighting` says.
    pub(super) fn typed(
        &self,
        obs: &Spec,
        action: &Spec,
        head: OnnxHead,
        state: &[StateTensor],
        weighting: Weighting<'_>,
    ) -> Result<Checked, OnnxError> {
        let parsed = self.parsed()?;
        guarded("typing the model", || {
            self.typed_parsed(parsed, obs, action, head, state, weighting)
        })
    }

    /// [`OnnxModel::typed`] on the parsed model, unguarded.
    fn typed_parsed(
        &self,
        parsed: &Parsed,
        obs: &Spec,
        action: &Spec,
        head: OnnxHead,
        state: &[StateTensor],
        weighting: Weighting<'_>,
    ) -> Result<Checked, OnnxError> {
        check_state_inputs(parsed, state)?;
        let mut proto = parsed.proto.clone();
        let graph = proto
            .graph
            .as_mut()
            .ok_or_else(|| OnnxError::NotOnnx("the model has no graph".into()))?;
        let input = parsed.input.clone()?;
        check_declared_input(graph, &input)?;
        check_input_shape(graph, &input, &obs.feature_shape())?;
        let mut weight_inputs = Vec::new();
        match weighting {
            Weighting::Constants(None) => replace_initializers(graph, &parsed.weights)?,
            Weighting::Constants(Some(w)) => replace_initializers(graph, w)?,
            Weighting::Inputs => {
                weight_inputs = parsed.float_names.clone();
                initializers_to_inputs(graph, &weight_inputs);
            }
        }
        let onnx = tract_onnx::onnx();
        let mut model = onnx.model_for_proto_model(&proto).map_err(OnnxError::tract)?;

        // The observation first, then `is_init` and the state (a recurrent model), then
        // the weights in `weight_inputs`' order.
        let recurrent: Vec<String> = if state.is_empty() {
            Vec::new()
        } else {
            std::iter::once(keys::IS_INIT.to_string())
                .chain(state.iter().map(|s| s.name.clone()))
                .collect()
        };
        let mut order = Vec::with_capacity(1 + recurrent.len() + weight_inputs.len());
        for name in std::iter::once(&input).chain(&recurrent).chain(&weight_inputs) {
            let outlet = model
                .input_outlets()
                .map_err(OnnxError::tract)?
                .iter()
                .copied()
                .find(|o| model.node(o.node).name == *name)
                .ok_or_else(|| OnnxError::input(name, "not an input of the parsed model"))?;
            order.push(outlet);
        }
        model.set_input_outlets(&order).map_err(OnnxError::tract)?;
        let k = model.symbols.sym(BATCH);
        let obs_shape = obs.feature_shape();
        let dims: Vec<TDim> = std::iter::once(TDim::Sym(k.clone()))
            .chain(obs_shape.iter().map(|&d| TDim::from(d)))
            .collect();
        model
            .set_input_fact(0, InferenceFact::dt_shape(DatumType::F32, dims))
            .map_err(|e| OnnxError::input(&input, format!("cannot take [K, {obs_shape:?}] f32: {e:#}")))?;
        for (i, name) in recurrent.iter().enumerate() {
            if let Some(fact) = state_fact(name, state, &k) {
                model
                    .set_input_fact(1 + i, fact)
                    .map_err(|e| OnnxError::input(name, format!("{e:#}")))?;
            }
        }
        let model = model.into_typed().map_err(OnnxError::tract)?;
        let model = model.into_decluttered().map_err(OnnxError::tract)?;
        let names = output_names(&proto);
        let k = TDim::Sym(k);
        let roles = roles(&model, &names, head, action, &k)?;
        let state_outputs = state_outputs(&model, &names, state, &k)?;
        Ok(Checked {
            model,
            weight_inputs,
            roles,
            state_outputs,
        })
    }
}

/// Where the f32 initializers go in a typed model.
#[derive(Clone, Copy)]
pub(super) enum Weighting<'a> {
    /// Constants with the file's values (`None`) or these.
    Constants(Option<&'a Weights>),
    /// Model inputs after the observation, fed at every run.
    Inputs,
}

/// Reads the protobuf, refuses unknown ops, and finds the initializers and the input.
/// The file is walked before it is decoded ([`prescan`]) and the decoded model checked
/// before tract evaluates anything ([`limits`]); the decoding itself runs guarded.
fn parse(bytes: &[u8]) -> Result<Parsed, OnnxError> {
    if bytes.len() > MAX_MODEL_BYTES {
        return Err(OnnxError::TooLarge {
            size: bytes.len(),
            limit: MAX_MODEL_BYTES,
        });
    }
    prescan(bytes)?;
    let onnx = tract_onnx::onnx();
    let mut proto = guarded("decoding the model", || {
        onnx.proto_model_for_read(&mut &*bytes)
            .map_err(|e| OnnxError::NotOnnx(bounded(&format!("{e:#}"), MAX_NAME_BYTES)))
    })?;
    let graph = proto
        .graph
        .as_ref()
        .ok_or_else(|| OnnxError::NotOnnx("the file holds no graph".into()))?;
    if graph.node.is_empty() && graph.output.is_empty() {
        return Err(OnnxError::NotOnnx("the graph has no node and no output".into()));
    }
    for node in &graph.node {
        if !onnx.op_register.0.contains_key(&node.op_type) {
            let op = if node.domain.is_empty() {
                node.op_type.clone()
            } else {
                format!("{}.{}", node.domain, node.op_type)
            };
            return Err(OnnxError::UnsupportedOp {
                node: bounded(node_name(node), MAX_NAME_BYTES),
                op: bounded(&op, MAX_NAME_BYTES),
            });
        }
    }
    check_model(&proto)?;
    let mut float_names = Vec::new();
    let mut tensors = BTreeMap::new();
    for init in &graph.initializer {
        if init.data_type != DataType::Float as i32 {
            continue;
        }
        let t = float_initializer(init)?;
        float_names.push(init.name.clone());
        tensors.insert(init.name.clone(), t);
    }
    let initialized: std::collections::HashSet<&str> = graph.initializer.iter().map(|i| i.name.as_str()).collect();
    let inputs: Vec<&str> = graph
        .input
        .iter()
        .map(|i| i.name.as_str())
        .filter(|n| !initialized.contains(n))
        .collect();
    let input = match inputs.as_slice() {
        [only] => Ok(only.to_string()),
        _ if inputs.contains(&"observation") => Ok("observation".to_string()),
        [] => return Err(OnnxError::input("observation", "the model has no input")),
        many => Err(OnnxError::input(
            "observation",
            format!("no input of that name among {many:?}, and more than one input"),
        )),
    };
    let inputs: Vec<String> = inputs.iter().map(|n| n.to_string()).collect();
    if let Some(graph) = proto.graph.as_mut() {
        for init in graph
            .initializer
            .iter_mut()
            .filter(|i| i.data_type == DataType::Float as i32)
        {
            init.raw_data = Vec::new();
            init.float_data = Vec::new();
        }
    }
    Ok(Parsed {
        proto,
        float_names,
        weights: Arc::new(Weights::new(tensors)),
        input,
        inputs,
    })
}

/// The position of input `outlet` (named `name`) among the model's inputs.
fn input_index(
    model: &tract_onnx::prelude::InferenceModel,
    outlet: tract_onnx::prelude::OutletId,
    name: &str,
) -> Result<usize, OnnxError> {
    model
        .input_outlets()
        .map_err(OnnxError::tract)?
        .iter()
        .position(|o| *o == outlet)
        .ok_or_else(|| OnnxError::input(name, "not an input of the parsed model"))
}

/// Checks that a model's inputs are what its state says: with state, the observation,
/// `is_init` and one input per state tensor, exactly; without, no `is_init` (a
/// recurrent model whose state was not declared would run without it).
fn check_state_inputs(parsed: &Parsed, state: &[StateTensor]) -> Result<(), OnnxError> {
    let has = |name: &str| parsed.inputs.iter().any(|n| n == name);
    if state.is_empty() {
        if has(keys::IS_INIT) {
            return Err(OnnxError::input(
                keys::IS_INIT,
                "the model is recurrent (it takes is_init), but the policy declares no state",
            ));
        }
        return Ok(());
    }
    let obs = parsed.input.clone()?;
    if !has(keys::IS_INIT) {
        return Err(OnnxError::input(
            keys::IS_INIT,
            format!(
                "a recurrent model takes it (bool [batch, 1]); the model's inputs are {:?}",
                parsed.inputs
            ),
        ));
    }
    let graph = parsed.proto.graph.as_ref();
    for s in state {
        if !has(&s.name) {
            return Err(OnnxError::input(
                &s.name,
                format!(
                    "the policy's state names it; the model's inputs are {:?}",
                    parsed.inputs
                ),
            ));
        }
        // A declared shape must be the state's (a symbolic dim takes any size).
        let declared = graph.and_then(|g| declared_dims(g, &s.name));
        if let Some(dims) = declared {
            let fits = dims.len() == s.shape.len() + 1
                && dims[1..]
                    .iter()
                    .zip(&s.shape)
                    .all(|(d, &want)| d.is_none_or(|d| d == want));
            if !fits {
                let shown: Vec<String> = dims.iter().map(|d| d.map_or("?".into(), |d| d.to_string())).collect();
                return Err(OnnxError::input(
                    &s.name,
                    format!(
                        "is declared [{}], the policy's state is [batch, {:?}]",
                        shown.join(", "),
                        s.shape
                    ),
                ));
            }
        }
    }
    if let Some(extra) = parsed
        .inputs
        .iter()
        .find(|n| **n != obs && *n != keys::IS_INIT && !state.iter().any(|s| s.name == **n))
    {
        return Err(OnnxError::input(
            extra,
            "is neither the observation, is_init nor a state tensor of the policy",
        ));
    }
    Ok(())
}

/// The fact of a recurrent model's input `name`: `is_init` bool `[K, 1]`, a state
/// tensor f32 `[K, *shape]`; `None` for any other input.
fn state_fact(name: &str, state: &[StateTensor], k: &tract_onnx::prelude::Symbol) -> Option<InferenceFact> {
    if state.is_empty() {
        return None;
    }
    let batch = TDim::Sym(k.clone());
    if name == keys::IS_INIT {
        return Some(InferenceFact::dt_shape(
            DatumType::Bool,
            vec![batch, TDim::from(1usize)],
        ));
    }
    let s = state.iter().find(|s| s.name == name)?;
    let dims: Vec<TDim> = std::iter::once(batch)
        .chain(s.shape.iter().map(|&d| TDim::from(d)))
        .collect();
    Some(InferenceFact::dt_shape(DatumType::F32, dims))
}

/// Each state tensor's `next.<name>` output, checked f32 `[K, *shape]`.
fn state_outputs(
    model: &TypedModel,
    names: &[String],
    state: &[StateTensor],
    k: &TDim,
) -> Result<Vec<usize>, OnnxError> {
    let mut found = Vec::with_capacity(state.len());
    for s in state {
        let want = s.next_key();
        let i = names.iter().position(|n| *n == want).ok_or_else(|| {
            OnnxError::output(
                &want,
                format!("a recurrent model gives the state after the step; the model's outputs are {names:?}"),
            )
        })?;
        let outlet = model.output_outlets().map_err(OnnxError::tract)?[i];
        let fact = model.outlet_fact(outlet).map_err(OnnxError::tract)?;
        check_dtype(&want, fact, &[DatumType::F32])?;
        let expect: Vec<TDim> = std::iter::once(k.clone())
            .chain(s.shape.iter().map(|&d| TDim::from(d)))
            .collect();
        if fact.shape.dims() != expect.as_slice() {
            return Err(OnnxError::output(
                &want,
                format!(
                    "has shape [{}], the state needs [{}]",
                    fact.shape
                        .dims()
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    expect.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        found.push(i);
    }
    Ok(found)
}

/// The dims input `name` is declared with (`None` for a symbolic one), if declared.
fn declared_dims(graph: &pb::GraphProto, name: &str) -> Option<Vec<Option<usize>>> {
    use pb::tensor_shape_proto::dimension::Value;
    let info = graph.input.iter().find(|i| i.name == name)?;
    let Some(pb::type_proto::Value::TensorType(t)) = info.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return None;
    };
    let shape = t.shape.as_ref()?;
    Some(
        shape
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(Value::DimValue(v)) => usize::try_from(*v).ok(),
                _ => None,
            })
            .collect(),
    )
}

/// The element type `name` is declared with, if the graph declares one tract knows.
fn declared_type(graph: &pb::GraphProto, name: &str) -> Option<DatumType> {
    let info = graph.input.iter().find(|i| i.name == name)?;
    let Some(pb::type_proto::Value::TensorType(t)) = info.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return None;
    };
    match DataType::try_from(t.elem_type).ok()? {
        DataType::Float => Some(DatumType::F32),
        DataType::Double => Some(DatumType::F64),
        DataType::Uint8 => Some(DatumType::U8),
        DataType::Int64 => Some(DatumType::I64),
        DataType::Int32 => Some(DatumType::I32),
        DataType::Bool => Some(DatumType::Bool),
        _ => None,
    }
}

/// tract's type for a batch entry's dtype.
fn datum_of(dtype: crate::tensor::DType) -> Option<DatumType> {
    use crate::tensor::DType;
    match dtype {
        DType::F32 => Some(DatumType::F32),
        DType::F64 => Some(DatumType::F64),
        DType::U8 => Some(DatumType::U8),
        DType::I64 => Some(DatumType::I64),
        DType::Bool => Some(DatumType::Bool),
    }
}

/// The observation input must be declared as f32 (Rust envs observe f32).
fn check_declared_input(graph: &pb::GraphProto, name: &str) -> Result<(), OnnxError> {
    let Some(info) = graph.input.iter().find(|i| i.name == name) else {
        return Ok(());
    };
    if let Some(pb::type_proto::Value::TensorType(t)) = info.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        if t.elem_type != DataType::Float as i32 {
            let dt = DataType::try_from(t.elem_type)
                .map(|d| d.as_str_name())
                .unwrap_or("unknown");
            return Err(OnnxError::input(
                name,
                format!("is {dt}; the observation is FLOAT (f32)"),
            ));
        }
    }
    Ok(())
}

/// The observation input's declared shape, where it is concrete, must be
/// `[batch, *obs_shape]` (any batch size).
fn check_input_shape(graph: &pb::GraphProto, name: &str, obs_shape: &[usize]) -> Result<(), OnnxError> {
    use pb::tensor_shape_proto::dimension::Value;
    let Some(info) = graph.input.iter().find(|i| i.name == name) else {
        return Ok(());
    };
    let Some(pb::type_proto::Value::TensorType(t)) = info.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Ok(());
    };
    let Some(shape) = &t.shape else {
        return Ok(());
    };
    let declared: Vec<String> = shape
        .dim
        .iter()
        .map(|d| match &d.value {
            Some(Value::DimValue(v)) => v.to_string(),
            Some(Value::DimParam(p)) => p.clone(),
            None => "?".into(),
        })
        .collect();
    let fits = shape.dim.len() == obs_shape.len() + 1
        && shape
            .dim
            .iter()
            .skip(1)
            .zip(obs_shape)
            .all(|(d, &want)| match &d.value {
                Some(Value::DimValue(v)) => usize::try_from(*v) == Ok(want),
                _ => true,
            });
    if fits {
        Ok(())
    } else {
        Err(OnnxError::input(
            name,
            format!(
                "is declared [{}], the observation needs [batch, {}]",
                declared.join(", "),
                obs_shape.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            ),
        ))
    }
}

/// An f32 initializer as a rollout tensor.
fn float_initializer(init: &pb::TensorProto) -> Result<Tensor, OnnxError> {
    let bad = |reason: String| OnnxError::initializer(&init.name, reason);
    if init.data_location == Some(pb::tensor_proto::DataLocation::External as i32) {
        return Err(bad("stored in an external file; export it inside the model".into()));
    }
    let shape = init
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| bad(format!("negative dimension {d}"))))
        .collect::<Result<Vec<usize>, _>>()?;
    let numel = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| bad(format!("dims {shape:?} overflow the element count")))?;
    let data: Vec<f32> = if !init.raw_data.is_empty() {
        if Some(init.raw_data.len()) != numel.checked_mul(4) {
            return Err(bad(format!(
                "{} bytes of data for shape {shape:?}",
                init.raw_data.len()
            )));
        }
        init.raw_data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else {
        if init.float_data.len() != numel {
            return Err(bad(format!("{} values for shape {shape:?}", init.float_data.len())));
        }
        init.float_data.clone()
    };
    ndarray::ArrayD::from_shape_vec(shape, data)
        .map(Tensor::F32)
        .map_err(|e| bad(e.to_string()))
}

/// Writes `weights` over the f32 initializers of the same names.
fn replace_initializers(graph: &mut pb::GraphProto, weights: &Weights) -> Result<(), OnnxError> {
    for init in graph.initializer.iter_mut() {
        if init.data_type != DataType::Float as i32 {
            continue;
        }
        let Some(values) = weights.tensors.get(&init.name) else {
            continue;
        };
        let Tensor::F32(a) = values else {
            return Err(OnnxError::initializer(
                &init.name,
                format!("must be f32, got {}", values.dtype()),
            ));
        };
        init.float_data.clear();
        init.raw_data = match a.as_slice() {
            // ONNX stores little-endian: the bytes as they are, in one copy.
            Some(v) if cfg!(target_endian = "little") => bytemuck::cast_slice(v).to_vec(),
            _ => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
    }
    Ok(())
}

/// Moves the initializers `names` to the graph's inputs (their values then come with
/// every run).
fn initializers_to_inputs(graph: &mut pb::GraphProto, names: &[String]) {
    let mut moved = Vec::new();
    graph.initializer.retain(|init| {
        if names.contains(&init.name) {
            moved.push((init.name.clone(), init.dims.clone()));
            false
        } else {
            true
        }
    });
    graph.input.retain(|i| !names.contains(&i.name));
    for (name, dims) in moved {
        let shape = pb::TensorShapeProto {
            dim: dims
                .iter()
                .map(|&d| pb::tensor_shape_proto::Dimension {
                    denotation: String::new(),
                    value: Some(pb::tensor_shape_proto::dimension::Value::DimValue(d)),
                })
                .collect(),
        };
        graph.input.push(pb::ValueInfoProto {
            name,
            r#type: Some(pb::TypeProto {
                denotation: String::new(),
                value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                    elem_type: DataType::Float as i32,
                    shape: Some(shape),
                })),
            }),
            doc_string: String::new(),
        });
    }
}

/// The graph's output names, in order.
fn output_names(proto: &pb::ModelProto) -> Vec<String> {
    proto
        .graph
        .as_ref()
        .map(|g| g.output.iter().map(|o| o.name.clone()).collect())
        .unwrap_or_default()
}

/// Finds the outputs `head` needs and checks them against the action spec.
fn roles(model: &TypedModel, names: &[String], head: OnnxHead, action: &Spec, k: &TDim) -> Result<Roles, OnnxError> {
    let find = |want: &str, any_single: bool| -> Option<usize> {
        names
            .iter()
            .position(|n| n == want)
            .or_else(|| (any_single && names.len() == 1).then_some(0))
    };
    let fact = |i: usize| -> Result<&TypedFact, OnnxError> {
        let outlet = model.output_outlets().map_err(OnnxError::tract)?[i];
        model.outlet_fact(outlet).map_err(OnnxError::tract)
    };
    let missing = |want: &str| {
        OnnxError::output(
            want,
            format!("the {head} head needs it; the model's outputs are {names:?}"),
        )
    };
    match (head, action) {
        (OnnxHead::Categorical, Spec::Discrete { n }) => {
            let i = find("logits", true).ok_or_else(|| missing("logits"))?;
            let n = usize::try_from(*n).unwrap_or(usize::MAX);
            check_fact(&names[i], fact(i)?, &[DatumType::F32], k, n, false)?;
            Ok(Roles::Categorical { logits: i })
        }
        (OnnxHead::QValue, Spec::Discrete { n }) => {
            let i = find("action_value", true).ok_or_else(|| missing("action_value"))?;
            let n = usize::try_from(*n).unwrap_or(usize::MAX);
            check_fact(&names[i], fact(i)?, &[DatumType::F32], k, n, false)?;
            Ok(Roles::Categorical { logits: i })
        }
        (OnnxHead::Normal | OnnxHead::TanhNormal, Spec::Box { low, .. }) => {
            let d = low.len();
            let loc = find("loc", false).ok_or_else(|| missing("loc"))?;
            check_fact("loc", fact(loc)?, &[DatumType::F32], k, d, false)?;
            let (spread, log_std) = match (find("scale", false), find("log_std", false)) {
                (Some(s), _) => (s, false),
                (None, Some(s)) => (s, true),
                (None, None) => return Err(missing("scale` or `log_std")),
            };
            let per_row = check_fact(&names[spread], fact(spread)?, &[DatumType::F32], k, d, true)?;
            Ok(Roles::Normal {
                loc,
                spread,
                log_std,
                per_row,
            })
        }
        (OnnxHead::Deterministic, Spec::Box { low, .. }) => {
            let i = find("action", true).ok_or_else(|| missing("action"))?;
            check_fact(&names[i], fact(i)?, &[DatumType::F32], k, low.len(), false)?;
            Ok(Roles::Action { action: i })
        }
        (OnnxHead::Deterministic, Spec::Discrete { .. }) => {
            let i = find("action", true).ok_or_else(|| missing("action"))?;
            let f = fact(i)?;
            let ints = [DatumType::I64, DatumType::I32];
            match f.shape.dims() {
                [b] if b == k => check_dtype(&names[i], f, &ints)?,
                _ => {
                    check_fact(&names[i], f, &ints, k, 1, false)?;
                }
            }
            Ok(Roles::Action { action: i })
        }
        (head, action) => Err(OnnxError::output(
            names.first().map(String::as_str).unwrap_or("?"),
            format!(
                "the {head} head does not fit a {} action",
                if action.is_discrete() { "discrete" } else { "box" }
            ),
        )),
    }
}

/// Checks an output of `[K, width]` (or, if `broadcast`, also `[1, width]` or
/// `[width]`); says whether it has a row per observation.
fn check_fact(
    name: &str,
    fact: &TypedFact,
    dtypes: &[DatumType],
    k: &TDim,
    width: usize,
    broadcast: bool,
) -> Result<bool, OnnxError> {
    check_dtype(name, fact, dtypes)?;
    let w = TDim::from(width);
    let one = TDim::from(1usize);
    match fact.shape.dims() {
        [b, x] if b == k && *x == w => Ok(true),
        [b, x] if broadcast && *b == one && *x == w => Ok(false),
        [x] if broadcast && *x == w => Ok(false),
        dims => Err(OnnxError::output(
            name,
            format!(
                "has shape [{}], the action spec needs [{k}, {width}]{}",
                dims.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                if broadcast {
                    format!(" (or [1, {width}] or [{width}])")
                } else {
                    String::new()
                }
            ),
        )),
    }
}

/// Checks an output's element type.
fn check_dtype(name: &str, fact: &TypedFact, dtypes: &[DatumType]) -> Result<(), OnnxError> {
    if dtypes.contains(&fact.datum_type) {
        Ok(())
    } else {
        Err(OnnxError::output(
            name,
            format!("is {:?}, the head needs {dtypes:?}", fact.datum_type),
        ))
    }
}

impl PartialEq for OnnxModel {
    fn eq(&self, other: &OnnxModel) -> bool {
        self.bytes == other.bytes
    }
}
