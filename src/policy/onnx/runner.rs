//! The tract plan of a checked model, and how a new weight version reaches it.
//!
//! tract folds constants into the plan (and packs matrix weights for its kernels), so a
//! new version cannot be poked into a built plan. Two ways, both measured (see
//! BENCHMARKS.md): the f32 initializers turned into model inputs, fed with every run;
//! or the plan rebuilt once per weight version, with the new values as constants.

use std::collections::HashMap;
use std::sync::Arc;

use tract_onnx::prelude::{
    tvec, DatumType, IntoTValue, TDim, TValue, TVec, Tensor as TractTensor, TypedModel, TypedRunnableModel,
    TypedSimplePlan, TypedSimpleState,
};

use super::guard::guarded;
use super::model::{Checked, OnnxModel, Roles, Weighting, BATCH};
use super::{OnnxError, OnnxHead};
use crate::policy::{StateTensor, Weights};
use crate::spec::Spec;
use crate::tensor::Tensor;

/// How weight versions reach the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightMode {
    /// The f32 initializers are model inputs: an update converts them once and
    /// every run passes them (no rebuild; the kernels pack the weights per run).
    Inputs,
    /// The plan is rebuilt once per weight version, the values folded in as
    /// constants (each update costs an optimisation; runs are the fastest).
    #[default]
    Rebuild,
}

/// A runnable plan for one set of specs, with the current weights.
pub(super) struct Runner {
    model: OnnxModel,
    obs: Spec,
    action: Spec,
    head: OnnxHead,
    mode: WeightMode,
    /// A recurrent model's state tensors (empty: none), fed after the observation and
    /// `is_init`.
    state: Vec<StateTensor>,
    /// Each state tensor's `next.<name>` output.
    state_outputs: Vec<usize>,
    /// The observation's shape after the batch dimension.
    obs_shape: Vec<usize>,
    /// The checked model with the current weights, its batch dimension symbolic.
    typed: TypedModel,
    /// Plans for the batch sizes run lately, the batch dimension made concrete (tract
    /// then plans static shapes instead of resolving them at every run).
    plans: Vec<(usize, TypedSimpleState)>,
    /// The initializers fed as inputs (mode `Inputs`), in the plan's order.
    weight_inputs: Vec<String>,
    weight_values: Vec<TValue>,
    roles: Roles,
}

impl Runner {
    /// Checks `model` against the specs and builds its plan with `weights` (`None`:
    /// the file's).
    pub(super) fn new(
        model: &OnnxModel,
        obs: &Spec,
        action: &Spec,
        head: OnnxHead,
        state: &[StateTensor],
        mode: WeightMode,
        weights: Option<&Weights>,
    ) -> Result<Runner, OnnxError> {
        let weighting = match mode {
            WeightMode::Inputs => Weighting::Inputs,
            WeightMode::Rebuild => Weighting::Constants(weights),
        };
        let checked = model.typed(obs, action, head, state, weighting)?;
        Runner::from_checked(model, obs, action, head, state, mode, weights, checked)
    }

    /// As [`Runner::new`], with the model already checked for `mode` and `weights`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn from_checked(
        model: &OnnxModel,
        obs: &Spec,
        action: &Spec,
        head: OnnxHead,
        state: &[StateTensor],
        mode: WeightMode,
        weights: Option<&Weights>,
        checked: Checked,
    ) -> Result<Runner, OnnxError> {
        let roles = checked.roles;
        let weight_inputs = checked.weight_inputs.clone();
        let state_outputs = checked.state_outputs.clone();
        // Optimised once here so that a model tract cannot plan fails at build time.
        plan(checked.model.clone())?;
        let mut runner = Runner {
            model: model.clone(),
            obs: obs.clone(),
            action: action.clone(),
            head,
            mode,
            state: state.to_vec(),
            state_outputs,
            obs_shape: obs.feature_shape(),
            typed: checked.model,
            plans: Vec::new(),
            weight_inputs,
            weight_values: Vec::new(),
            roles,
        };
        if mode == WeightMode::Inputs {
            let initial;
            let w = match weights {
                Some(w) => w,
                None => {
                    initial = model.initial_weights()?;
                    &initial
                }
            };
            runner.weight_values = runner.values(w)?;
        }
        Ok(runner)
    }

    /// Which output plays which part.
    pub(super) fn roles(&self) -> Roles {
        self.roles
    }

    /// How weight versions reach the plan.
    pub(super) fn mode(&self) -> WeightMode {
        self.mode
    }

    /// Makes `weights` (already checked against the layout) the ones the plan uses.
    pub(super) fn set_weights(&mut self, weights: &Weights) -> Result<(), OnnxError> {
        match self.mode {
            WeightMode::Inputs => {
                self.weight_values = self.values(weights)?;
            }
            WeightMode::Rebuild => {
                let checked = self.model.typed(
                    &self.obs,
                    &self.action,
                    self.head,
                    &self.state,
                    Weighting::Constants(Some(weights)),
                )?;
                self.typed = checked.model;
                self.plans.clear();
            }
        }
        Ok(())
    }

    /// The plan's weight inputs, in order, from `weights`.
    fn values(&self, weights: &Weights) -> Result<Vec<TValue>, OnnxError> {
        self.weight_inputs
            .iter()
            .map(|name| {
                let bad = |reason: String| OnnxError::initializer(name, reason);
                match weights.tensors.get(name) {
                    Some(Tensor::F32(a)) => {
                        let t = match a.as_slice() {
                            Some(s) => TractTensor::from_shape(a.shape(), s),
                            None => TractTensor::from_shape(a.shape(), &a.iter().copied().collect::<Vec<f32>>()),
                        };
                        t.map(|t| t.into_tvalue()).map_err(|e| bad(format!("{e:#}")))
                    }
                    Some(other) => Err(bad(format!("must be f32, got {}", other.dtype()))),
                    None => Err(bad("missing from the update".into())),
                }
            })
            .collect()
    }

    /// Each state tensor's `next.<name>` output, in the state's order.
    pub(super) fn state_outputs(&self) -> &[usize] {
        &self.state_outputs
    }

    /// Runs the model on `k` observations (row-major), and for a recurrent model on
    /// `recurrent`'s `is_init` and state rows. A panic in tract is an error, and the
    /// plans are dropped (the next run rebuilds the one it needs).
    pub(super) fn run(
        &mut self,
        obs: &[f32],
        k: usize,
        recurrent: Option<(&[bool], &[Vec<f32>])>,
    ) -> Result<TVec<TValue>, OnnxError> {
        let result = guarded("running the model", || self.run_unguarded(obs, k, recurrent));
        if let Err(OnnxError::Panicked { .. }) = &result {
            self.plans.clear();
        }
        result
    }

    /// [`Runner::run`], unguarded.
    fn run_unguarded(
        &mut self,
        obs: &[f32],
        k: usize,
        recurrent: Option<(&[bool], &[Vec<f32>])>,
    ) -> Result<TVec<TValue>, OnnxError> {
        let mut shape = Vec::with_capacity(1 + self.obs_shape.len());
        shape.push(k);
        shape.extend_from_slice(&self.obs_shape);
        let x = TractTensor::from_shape(&shape, obs).map_err(OnnxError::tract)?;
        let mut inputs: TVec<TValue> = tvec![x.into_tvalue()];
        match recurrent {
            Some((is_init, rows)) if !self.state.is_empty() => {
                let init = TractTensor::from_shape(&[k, 1], is_init).map_err(OnnxError::tract)?;
                inputs.push(init.into_tvalue());
                for (s, values) in self.state.iter().zip(rows) {
                    let mut dims = Vec::with_capacity(1 + s.shape.len());
                    dims.push(k);
                    dims.extend_from_slice(&s.shape);
                    let t = TractTensor::from_shape(&dims, values)
                        .map_err(|e| OnnxError::input(&s.name, format!("{e:#}")))?;
                    inputs.push(t.into_tvalue());
                }
            }
            None if self.state.is_empty() => {}
            _ => {
                return Err(OnnxError::input(
                    crate::schema::keys::IS_INIT,
                    "internal: a recurrent model run without its state, or state given to one without",
                ))
            }
        }
        inputs.extend(self.weight_values.iter().cloned());
        let i = match self.plans.iter().position(|(pk, _)| *pk == k) {
            Some(i) => i,
            None => {
                let sym = self.typed.symbols.sym(BATCH);
                let subs = HashMap::from([(sym, TDim::from(k))]);
                let concrete = self.typed.set_symbols(&subs).map_err(OnnxError::tract)?;
                if self.plans.len() >= MAX_PLANS {
                    self.plans.remove(0);
                }
                self.plans.push((k, plan(concrete)?));
                self.plans.len() - 1
            }
        };
        self.plans[i].1.run(inputs).map_err(OnnxError::tract)
    }
}

/// Batch sizes whose plans are kept (a worker runs one; a last, shorter call another).
const MAX_PLANS: usize = 4;

/// Optimises a checked model into a plan and its state.
fn plan(model: TypedModel) -> Result<TypedSimpleState, OnnxError> {
    guarded("optimising the model into a plan", || {
        let optimized = model.into_optimized().map_err(OnnxError::tract)?;
        let plan: Arc<TypedRunnableModel> = TypedSimplePlan::new(optimized).map_err(OnnxError::tract)?;
        TypedSimpleState::new(&plan).map_err(OnnxError::tract)
    })
}

/// The f32 values of output `i`, row-major.
pub(super) fn f32_output<'a>(outputs: &'a [TValue], i: usize, name: &str) -> Result<&'a [f32], OnnxError> {
    let t = outputs
        .get(i)
        .ok_or_else(|| OnnxError::output(name, "missing from the run's outputs"))?;
    if t.datum_type() != DatumType::F32 {
        return Err(OnnxError::output(
            name,
            format!("is {:?}, expected f32", t.datum_type()),
        ));
    }
    t.try_as_plain_ram()
        .and_then(|v| v.as_slice::<f32>())
        .map_err(|e| OnnxError::output(name, format!("{e:#}")))
}

/// The integer values of output `i` (i64 or i32), as i64.
pub(super) fn int_output(outputs: &[TValue], i: usize, name: &str) -> Result<Vec<i64>, OnnxError> {
    let t = outputs
        .get(i)
        .ok_or_else(|| OnnxError::output(name, "missing from the run's outputs"))?;
    let view = t
        .try_as_plain_ram()
        .map_err(|e| OnnxError::output(name, format!("{e:#}")))?;
    match t.datum_type() {
        DatumType::I64 => view
            .as_slice::<i64>()
            .map(<[i64]>::to_vec)
            .map_err(|e| OnnxError::output(name, format!("{e:#}"))),
        DatumType::I32 => view
            .as_slice::<i32>()
            .map(|s| s.iter().map(|&v| i64::from(v)).collect())
            .map_err(|e| OnnxError::output(name, format!("{e:#}"))),
        dt => Err(OnnxError::output(name, format!("is {dt:?}, expected i64 or i32"))),
    }
}
