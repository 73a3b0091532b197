//! [`OnnxPolicy`]: an ONNX model and a head, acting for a batch of `k` observations
//! in one forward pass, on the built-in kernel (a chain of dense layers) or on tract.

use std::sync::Arc;

use super::dense_chain::DenseChain;
use super::guard::guarded;
use super::heads::{self, Pick};
use super::model::{OnnxModel, Roles, Weighting};
use super::runner::{f32_output, int_output, Runner, WeightMode};
use super::{recorded, OnnxError, OnnxHead};
use crate::policy::buffer_checks::{action_kind_error, check_actions, check_obs};
use crate::policy::logprob::{log_softmax_f64, wanted};
use crate::policy::sampler::{argmax, Sampler};
use crate::policy::{
    check_state, ActionsMut, ExplorationType, ParamsMut, Policy, PolicyError, RecordMut, Recorded, SamplerState,
    StateIo, StateTensor, Weights,
};
use crate::spec::Spec;

/// A policy running an ONNX model, on the built-in networks' kernel when the graph is
/// a chain of dense layers ([`OnnxEngine`]), else with tract; its weights are the
/// model's f32 initializers by name.
///
/// # Examples
///
/// ```no_run
/// use rollout::policy::{ActionsMut, OnnxHead, OnnxModel, OnnxPolicy};
/// use rollout::{Policy, Spec};
///
/// let model = OnnxModel::parse(std::fs::read("actor.onnx")?)?;
/// let obs = Spec::uniform_box(4, f32::NEG_INFINITY, f32::INFINITY);
/// let mut p = OnnxPolicy::new(&model, OnnxHead::Categorical, &obs, &Spec::Discrete { n: 2 }, 0)?;
/// let mut a = [0i64; 2];
/// p.act(&[0.0; 8], 2, ActionsMut::Discrete(&mut a))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct OnnxPolicy {
    engine: Engine,
    /// Which output plays which part.
    roles: Roles,
    head: OnnxHead,
    action: Spec,
    obs_dim: usize,
    /// The action box's bounds (empty for a discrete action).
    low: Vec<f32>,
    high: Vec<f32>,
    weights: Arc<Weights>,
    exploration: ExplorationType,
    sampler: Sampler,
    /// The action dimension (`d`), or the number of choices (`n`).
    width: usize,
    /// A recurrent model's state tensors; empty for a model without state.
    state: Vec<StateTensor>,
}

/// What runs an [`OnnxPolicy`]'s forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnnxEngine {
    /// The graph is a chain of dense layers (`nn.Linear`s with `tanh`, `relu` or
    /// nothing between them; docs/policies.md): it runs on the built-in `mlp`'s kernel,
    /// reading the initializers by name, so a weight update rebuilds nothing.
    DenseChain,
    /// Any other graph: tract's plan, weight versions reaching it as the mode says.
    Tract(WeightMode),
}

/// The forward pass of either engine.
enum Engine {
    DenseChain(Box<DenseChain>),
    Tract(Box<Runner>),
}

impl OnnxPolicy {
    /// The policy for these specs, with the file's weights (version 0) and its
    /// sampler seeded with `seed`; the model must fit the specs and the head. A graph
    /// that is a chain of dense layers runs on the built-in kernel
    /// ([`OnnxEngine::DenseChain`]), any other on tract, once on one observation before
    /// this returns, so a model tract cannot run is refused here.
    pub fn new(
        model: &OnnxModel,
        head: OnnxHead,
        obs: &Spec,
        action: &Spec,
        seed: u64,
    ) -> Result<OnnxPolicy, PolicyError> {
        OnnxPolicy::recurrent(model, head, &[], obs, action, seed)
    }

    /// As [`OnnxPolicy::new`], for a model with `state` (PROTOCOL.md §8, Recurrent;
    /// empty: a model without state, as `new`): the model takes `is_init` and each
    /// state tensor beside the observation, and gives `next.<name>` for each; it runs
    /// on tract, through [`Policy::act_recurrent`].
    pub fn recurrent(
        model: &OnnxModel,
        head: OnnxHead,
        state: &[StateTensor],
        obs: &Spec,
        action: &Spec,
        seed: u64,
    ) -> Result<OnnxPolicy, PolicyError> {
        obs.validate()?;
        action.validate()?;
        check_state(state)?;
        let weights = model.initial_weights()?;
        let checked = model.typed(obs, action, head, state, Weighting::Constants(None))?;
        let width = width(action);
        let roles = checked.roles;
        let parsed = model.parsed()?;
        let chain = if state.is_empty() {
            guarded("recognising a chain of dense layers", || {
                Ok(DenseChain::recognise(
                    parsed,
                    head,
                    roles,
                    &obs.feature_shape(),
                    width,
                    &weights,
                ))
            })?
        } else {
            None
        };
        let engine = match chain {
            Some(chain) => Engine::DenseChain(Box::new(chain)),
            None => {
                let mut runner =
                    Runner::from_checked(model, obs, action, head, state, WeightMode::Rebuild, None, checked)?;
                // One forward pass on one observation of zeros: an op tract types but cannot
                // evaluate (a random op's symbolic shape) fails here, where the policy is
                // built (the plan, a node's build), not at the first step of every restart.
                // Only the pass: what the head makes of zeros is not checked.
                let zeros: Vec<Vec<f32>> = state.iter().map(|s| vec![0.0; s.numel()]).collect();
                let recurrent = (!state.is_empty()).then_some((&[true][..], zeros.as_slice()));
                runner.run(&vec![0.0; obs.dim()], 1, recurrent)?;
                Engine::Tract(Box::new(runner))
            }
        };
        let mut p = OnnxPolicy::with_engine(engine, roles, head, obs, action, seed, weights)?;
        p.state = state.to_vec();
        Ok(p)
    }

    /// As [`OnnxPolicy::new`], always on tract, with weight versions reaching its plan
    /// as `mode` says (for comparing the engines and the modes).
    pub fn with_mode(
        model: &OnnxModel,
        head: OnnxHead,
        obs: &Spec,
        action: &Spec,
        seed: u64,
        mode: WeightMode,
    ) -> Result<OnnxPolicy, PolicyError> {
        obs.validate()?;
        action.validate()?;
        let weights = model.initial_weights()?;
        let runner = Runner::new(model, obs, action, head, &[], mode, None)?;
        let roles = runner.roles();
        OnnxPolicy::with_engine(Engine::Tract(Box::new(runner)), roles, head, obs, action, seed, weights)
    }

    fn with_engine(
        engine: Engine,
        roles: Roles,
        head: OnnxHead,
        obs: &Spec,
        action: &Spec,
        seed: u64,
        weights: Arc<Weights>,
    ) -> Result<OnnxPolicy, PolicyError> {
        let (low, high) = match action {
            Spec::Box { low, high } => (low.clone(), high.clone()),
            Spec::Discrete { .. } => (Vec::new(), Vec::new()),
        };
        Ok(OnnxPolicy {
            engine,
            roles,
            head,
            action: action.clone(),
            obs_dim: obs.dim(),
            low,
            high,
            weights,
            exploration: ExplorationType::default(),
            sampler: Sampler::new(seed),
            width: width(action),
            state: Vec::new(),
        })
    }

    /// The head.
    pub fn head(&self) -> OnnxHead {
        self.head
    }

    /// What runs the forward pass: the built-in kernel for a chain of dense layers,
    /// tract for anything else.
    pub fn engine(&self) -> OnnxEngine {
        match &self.engine {
            Engine::DenseChain(_) => OnnxEngine::DenseChain,
            Engine::Tract(r) => OnnxEngine::Tract(r.mode()),
        }
    }

    /// Reads a dense chain's layers from the named tensors whatever its size (as a
    /// large network does), for comparing the two ways of reading them.
    #[cfg(test)]
    pub(super) fn read_named_tensors(&mut self) {
        if let Engine::DenseChain(c) = &mut self.engine {
            c.read_named_tensors();
        }
    }

    fn pick(&self) -> Pick {
        match self.exploration {
            ExplorationType::Deterministic => Pick::Mode,
            ExplorationType::Random => Pick::Sample,
        }
    }

    /// One run for `k` rows: actions, the record if its buffers are there, and a
    /// recurrent model's state after the step.
    fn run(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
        state: Option<StateIo<'_>>,
    ) -> Result<(), PolicyError> {
        check_obs(obs, k, self.obs_dim)?;
        match &state {
            None if !self.state.is_empty() => {
                return Err(PolicyError::Buffer(
                    "a recurrent policy acts through act_recurrent, with its state".into(),
                ))
            }
            Some(io) => io.check(&self.state, k)?,
            None => {}
        }
        check_actions(&self.action, k, &actions)?;
        // Buffers of another size than this policy records are an error; empty ones
        // ask for nothing.
        let (recording, _) = wanted(&record, k, self.width)?;
        if k == 0 {
            return Ok(());
        }
        let act = Act {
            head: self.head,
            pick: self.pick(),
            action: &self.action,
            low: &self.low,
            high: &self.high,
            width: self.width,
            k,
            recording,
        };
        let sampler = &mut self.sampler;
        match &mut self.engine {
            Engine::DenseChain(chain) => {
                let (main, spread) = chain.run(obs, k);
                let outs = match self.roles {
                    Roles::Categorical { .. } => Outs::Logits(main),
                    Roles::Normal { log_std, per_row, .. } => Outs::Normal {
                        loc: main,
                        spread,
                        log_std,
                        per_row,
                    },
                    Roles::Action { .. } => Outs::Action(main),
                };
                act.apply(outs, sampler, actions, record)
            }
            Engine::Tract(runner) => {
                let outputs = runner.run(obs, k, state.as_ref().map(|io| (io.is_init, io.before)))?;
                if let Some(io) = state {
                    for ((s, &i), after) in self.state.iter().zip(runner.state_outputs()).zip(io.after.iter_mut()) {
                        after.copy_from_slice(f32_output(&outputs, i, &s.next_key())?);
                    }
                }
                let outs = match (self.roles, &actions) {
                    (Roles::Categorical { logits }, _) => Outs::Logits(f32_output(&outputs, logits, "logits")?),
                    (
                        Roles::Normal {
                            loc,
                            spread,
                            log_std,
                            per_row,
                        },
                        _,
                    ) => Outs::Normal {
                        loc: f32_output(&outputs, loc, "loc")?,
                        spread: f32_output(&outputs, spread, if log_std { "log_std" } else { "scale" })?,
                        log_std,
                        per_row,
                    },
                    (Roles::Action { action }, ActionsMut::Continuous(_)) => {
                        Outs::Action(f32_output(&outputs, action, "action")?)
                    }
                    (Roles::Action { action }, ActionsMut::Discrete(_)) => {
                        Outs::Choices(int_output(&outputs, action, "action")?)
                    }
                };
                act.apply(outs, sampler, actions, record)
            }
        }
    }
}

/// The action dimension (`d`), or the number of choices (`n`).
fn width(action: &Spec) -> usize {
    match action {
        Spec::Box { low, .. } => low.len(),
        Spec::Discrete { n } => usize::try_from(*n).unwrap_or(usize::MAX),
    }
}

/// The model's outputs for one run, row-major, as the head reads them.
enum Outs<'a> {
    /// `logits` `[k, n]`.
    Logits(&'a [f32]),
    /// `loc` `[k, d]` and the scale or log-std (`[k, d]` if `per_row`, else `[d]`).
    Normal {
        loc: &'a [f32],
        spread: &'a [f32],
        log_std: bool,
        per_row: bool,
    },
    /// A box action `[k, d]`.
    Action(&'a [f32]),
    /// A discrete action per row.
    Choices(Vec<i64>),
}

/// Everything but the outputs and the sampler that the head needs for one run.
struct Act<'a> {
    head: OnnxHead,
    pick: Pick,
    action: &'a Spec,
    low: &'a [f32],
    high: &'a [f32],
    width: usize,
    k: usize,
    recording: bool,
}

impl Act<'_> {
    /// The actions (and what `record` asks for) from the model's outputs.
    fn apply(
        &self,
        outs: Outs<'_>,
        sampler: &mut Sampler,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        let (k, w, pick, recording) = (self.k, self.width, self.pick, self.recording);
        match (outs, actions) {
            (Outs::Logits(z), ActionsMut::Discrete(a)) => {
                if z.len() != k * w {
                    return Err(
                        OnnxError::output("logits", format!("gave {} values for {k} rows of {w}", z.len())).into(),
                    );
                }
                let qvalue = self.head == OnnxHead::QValue;
                for (i, row) in z.chunks_exact(w).enumerate() {
                    if qvalue {
                        // Greedy in both explorations (epsilon-greedy is a module after
                        // it); recorded: the greedy action's value.
                        let c = argmax(row);
                        a[i] = c as i64;
                        if recording {
                            record.log_prob[i] = row[c];
                        }
                        continue;
                    }
                    let c = heads::categorical(row, pick, sampler);
                    a[i] = c as i64;
                    if recording {
                        record.log_prob[i] = log_softmax_f64(row, c) as f32;
                    }
                }
                if let ParamsMut::Logits(out) = record.params {
                    if out.len() == z.len() {
                        out.copy_from_slice(z);
                    }
                }
            }
            (
                Outs::Normal {
                    loc: loc_v,
                    spread: spread_v,
                    log_std,
                    per_row,
                },
                ActionsMut::Continuous(a),
            ) => {
                let spread_name = if log_std { "log_std" } else { "scale" };
                let need = if per_row { k * w } else { w };
                if loc_v.len() != k * w || spread_v.len() != need {
                    return Err(OnnxError::output(
                        "loc",
                        format!(
                            "gave {} locs and {} spreads for {k} rows of {w}",
                            loc_v.len(),
                            spread_v.len()
                        ),
                    )
                    .into());
                }
                let (mut loc_out, mut scale_out) = match record.params {
                    ParamsMut::Normal { loc, scale } if loc.len() == k * w && scale.len() == k * w => {
                        (Some(loc), Some(scale))
                    }
                    _ => (None, None),
                };
                let tanh = self.head == OnnxHead::TanhNormal;
                for i in 0..k {
                    let mut lp = 0.0f64;
                    for j in 0..w {
                        let m = loc_v[i * w + j];
                        let raw = spread_v[if per_row { i * w + j } else { j }];
                        let s = heads::check_scale(spread_name, if log_std { raw.exp() } else { raw })?;
                        let (act, l) = if tanh {
                            heads::tanh_normal(m, s, self.low[j], self.high[j], pick, sampler)
                        } else {
                            heads::normal(m, s, self.low[j], self.high[j], pick, sampler)
                        };
                        a[i * w + j] = act;
                        lp += l;
                        if let (Some(lo), Some(sc)) = (loc_out.as_deref_mut(), scale_out.as_deref_mut()) {
                            lo[i * w + j] = m;
                            sc[i * w + j] = s;
                        }
                    }
                    if recording {
                        record.log_prob[i] = lp as f32;
                    }
                }
            }
            (Outs::Action(v), ActionsMut::Continuous(a)) => {
                if v.len() != k * w {
                    return Err(
                        OnnxError::output("action", format!("gave {} values for {k} rows of {w}", v.len())).into(),
                    );
                }
                for (i, (out, &x)) in a.iter_mut().zip(v).enumerate() {
                    if x.is_nan() {
                        return Err(OnnxError::output("action", format!("gave NaN in row {}", i / w)).into());
                    }
                    *out = heads::clip(x, self.low[i % w], self.high[i % w]);
                }
            }
            (Outs::Choices(v), ActionsMut::Discrete(a)) => {
                if v.len() != k {
                    return Err(OnnxError::output("action", format!("gave {} values for {k} rows", v.len())).into());
                }
                for (out, x) in a.iter_mut().zip(v) {
                    if !(0..w as i64).contains(&x) {
                        return Err(OnnxError::output("action", format!("gave {x}, outside 0..{w}")).into());
                    }
                    *out = x;
                }
            }
            (_, actions) => return Err(action_kind_error(self.action, &actions)),
        }
        Ok(())
    }
}

impl Policy for OnnxPolicy {
    fn act(&mut self, obs: &[f32], k: usize, actions: ActionsMut<'_>) -> Result<(), PolicyError> {
        self.run(obs, k, actions, RecordMut::nothing(), None)
    }

    fn weights(&self) -> &Weights {
        &self.weights
    }

    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
        self.set_shared_weights(&Arc::new(weights.clone()))
    }

    fn set_shared_weights(&mut self, weights: &Arc<Weights>) -> Result<(), PolicyError> {
        self.weights.check_layout(weights)?;
        match &mut self.engine {
            Engine::Tract(runner) => runner.set_weights(weights)?,
            Engine::DenseChain(chain) => chain.set_weights(weights)?,
        }
        self.weights = weights.clone();
        Ok(())
    }

    fn set_exploration(&mut self, exploration: ExplorationType) {
        self.exploration = exploration;
    }

    fn reseed(&mut self, seed: u64) {
        self.sampler.reseed(seed);
    }

    fn sampler_state(&self) -> Result<Option<SamplerState>, PolicyError> {
        Ok(Some(self.sampler.state()))
    }

    fn set_sampler_state(&mut self, state: Option<&SamplerState>) -> Result<(), PolicyError> {
        self.sampler.set_state(state)
    }

    fn recorded(&self) -> Recorded {
        recorded(self.head, &self.action)
    }

    fn act_recording(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        self.run(obs, k, actions, record, None)
    }

    fn state(&self) -> &[StateTensor] {
        &self.state
    }

    fn act_recurrent(
        &mut self,
        obs: &[f32],
        k: usize,
        state: StateIo<'_>,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        self.run(obs, k, actions, record, Some(state))
    }
}
