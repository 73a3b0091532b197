//! Exploration modules a node runs after the model (PROTOCOL.md §8): torchrl's
//! Ornstein–Uhlenbeck noise (`OrnsteinUhlenbeckProcessModule`, DDPG's) after a
//! deterministic policy, and epsilon-greedy (`EGreedyModule`, DQN's, [`super::egreedy`])
//! after the `qvalue` head.
//!
//! The OU noise is a per-env state (`_ou_prev_noise`, `_ou_steps`) that the rollout
//! keeps as it keeps a recurrent model's: zeroed on each episode's first frame,
//! recorded before and after each step, carried across batches and checkpoints.
//! Epsilon-greedy keeps none. Each module's `eps` is a weight of the model, so the
//! learner's annealing (`step()`) reaches the nodes with `update_policy_weights_()`,
//! as it does in torchrl.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::egreedy::{self, EpsilonGreedy};
use super::onnx::OnnxHead;
use super::sampler::Sampler;
use super::state::{StateIo, StateTensor};
use super::{ActionsMut, ExplorationType, Policy, PolicyError, RecordMut, Recorded, SamplerState, Weights};
use crate::spec::Spec;
use crate::tensor::Tensor;

/// The state tensor holding each env's noise, less `x0` (torchrl's key).
pub const OU_NOISE: &str = "_ou_prev_noise";
/// The state tensor counting each env's noisy steps in its episode (torchrl's key).
pub const OU_STEPS: &str = "_ou_steps";

/// An exploration module a node runs after the model; travels in the `onnx` config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ExplorationModule {
    /// Ornstein–Uhlenbeck noise added to a deterministic action.
    OrnsteinUhlenbeck(OrnsteinUhlenbeck),
    /// A uniform action instead of the greedy one with probability `eps` (version 8).
    EpsilonGreedy(EpsilonGreedy),
}

impl ExplorationModule {
    /// The state tensors the module keeps for an action of `d` values: the last ones
    /// of the config's `state` list, in this order (none for epsilon-greedy).
    pub fn state(&self, d: usize) -> Vec<StateTensor> {
        match self {
            ExplorationModule::OrnsteinUhlenbeck(_) => {
                vec![StateTensor::new(OU_NOISE, [d]), StateTensor::new(OU_STEPS, [1])]
            }
            ExplorationModule::EpsilonGreedy(_) => Vec::new(),
        }
    }

    /// How many of the config's `state` tensors are the module's (the last ones).
    pub fn state_len(&self) -> usize {
        match self {
            ExplorationModule::OrnsteinUhlenbeck(_) => 2,
            ExplorationModule::EpsilonGreedy(_) => 0,
        }
    }

    /// Checks the module against the head and the action, and that `state` ends with
    /// the module's tensors; returns the model's own state (the rest of the list).
    pub fn model_state<'a>(
        &self,
        head: OnnxHead,
        action: &Spec,
        state: &'a [StateTensor],
    ) -> Result<&'a [StateTensor], PolicyError> {
        let ou = match self {
            ExplorationModule::OrnsteinUhlenbeck(ou) => ou,
            ExplorationModule::EpsilonGreedy(eg) => {
                if !action.is_discrete() {
                    return Err(PolicyError::Spec(
                        "exploration: epsilon-greedy acts on a discrete action, the env's is a box".into(),
                    ));
                }
                if head != OnnxHead::QValue {
                    return Err(PolicyError::Spec(format!(
                        "exploration: epsilon-greedy follows the `qvalue` head, not `{head}`"
                    )));
                }
                eg.check()?;
                return Ok(state);
            }
        };
        let Spec::Box { low, .. } = action else {
            return Err(PolicyError::Spec(
                "exploration: Ornstein-Uhlenbeck noise acts on a box action, the env's is discrete".into(),
            ));
        };
        if head != OnnxHead::Deterministic {
            return Err(PolicyError::Spec(
                "exploration: Ornstein-Uhlenbeck noise follows the `deterministic` head".into(),
            ));
        }
        let d = low.len();
        ou.check(d)?;
        let want = self.state(d);
        let split = state.len().checked_sub(want.len()).filter(|&n| state[n..] == want[..]);
        match split {
            Some(n) => Ok(&state[..n]),
            None => Err(PolicyError::Spec(format!(
                "state: an Ornstein-Uhlenbeck module's state ends with {OU_NOISE} [{d}] and {OU_STEPS} [1], got {:?}",
                state
                    .iter()
                    .map(|t| format!("{} {:?}", crate::peer_text::bounded(&t.name), t.shape))
                    .collect::<Vec<_>>()
            ))),
        }
    }

    /// Checks that `weights` hold the module's `eps` (one f32 value), naming it.
    pub fn check_weights(&self, weights: &Weights) -> Result<(), PolicyError> {
        eps_of(weights, self.eps_name()).map(|_| ())
    }

    /// The module's weight name (`eps`).
    fn eps_name(&self) -> &str {
        match self {
            ExplorationModule::OrnsteinUhlenbeck(ou) => &ou.eps,
            ExplorationModule::EpsilonGreedy(eg) => &eg.eps,
        }
    }
}

/// torchrl's `OrnsteinUhlenbeckProcessModule`'s numbers (its constructor's names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OrnsteinUhlenbeck {
    /// The model's f32 initializer holding the module's `eps` (one element).
    pub eps: String,
    /// Mean reversion rate.
    pub theta: f32,
    /// Long-run mean.
    pub mu: f32,
    /// Diffusion, annealed towards `sigma_min` over `n_steps_annealing` steps.
    pub sigma: f32,
    /// The annealed diffusion's floor; `None`: no annealing.
    #[serde(default)]
    pub sigma_min: Option<f32>,
    /// Steps of an episode over which `sigma` reaches `sigma_min`.
    pub n_steps_annealing: u64,
    /// Time step.
    pub dt: f32,
    /// The noise's origin: empty (0), one value, or one per action dimension.
    #[serde(default)]
    pub x0: Vec<f32>,
}

impl OrnsteinUhlenbeck {
    /// Checks every number, naming the field.
    pub fn check(&self, d: usize) -> Result<(), PolicyError> {
        let bad = |field: &str, why: String| Err(PolicyError::Spec(format!("exploration.{field}: {why}")));
        for (field, v) in [
            ("theta", self.theta),
            ("mu", self.mu),
            ("sigma", self.sigma),
            ("dt", self.dt),
        ] {
            if !v.is_finite() {
                return bad(field, format!("must be finite, got {v}"));
            }
        }
        if self.dt <= 0.0 {
            return bad("dt", format!("must be > 0, got {}", self.dt));
        }
        if self.sigma < 0.0 {
            return bad("sigma", format!("must be >= 0, got {}", self.sigma));
        }
        if let Some(m) = self.sigma_min {
            if !(m.is_finite() && m >= 0.0) {
                return bad("sigma_min", format!("must be finite and >= 0, got {m}"));
            }
        }
        if self.n_steps_annealing == 0 {
            return bad("n_steps_annealing", "must be at least 1".into());
        }
        if !matches!(self.x0.len(), 0 | 1) && self.x0.len() != d {
            return bad(
                "x0",
                format!(
                    "has {} values: give none, one, or one per action dimension ({d})",
                    self.x0.len()
                ),
            );
        }
        if let Some(v) = self.x0.iter().find(|v| !v.is_finite()) {
            return bad("x0", format!("must be finite, got {v}"));
        }
        if self.eps.is_empty() {
            return bad("eps", "must name the model's initializer holding eps".into());
        }
        Ok(())
    }

    /// The diffusion after `n` noisy steps: torchrl's `current_sigma`.
    fn sigma_at(&self, n: f32) -> f32 {
        match self.sigma_min {
            None => self.sigma,
            Some(min) => {
                let slope = -(self.sigma - min) / self.n_steps_annealing as f32;
                (slope * n + self.sigma).max(min)
            }
        }
    }
}

/// A policy with an exploration module after it: the inner policy's action, then the
/// module's, per env; an OU module's state the last tensors of [`Policy::state`].
pub struct ExploringPolicy {
    inner: Box<dyn Policy>,
    module: ExplorationModule,
    /// What the module acts on, from the action spec.
    acts_on: ActsOn,
    /// The inner policy's state, then the module's.
    state: Vec<StateTensor>,
    /// The inner policy's tensors (the first ones of `state`).
    inner_tensors: usize,
    eps: f32,
    exploration: ExplorationType,
    sampler: Sampler,
}

/// The action an exploration module changes.
enum ActsOn {
    /// OU's: a box, with the noise's origin per dimension.
    Box {
        low: Vec<f32>,
        high: Vec<f32>,
        x0: Vec<f32>,
    },
    /// Epsilon-greedy's: `n` discrete actions.
    Discrete { n: u64 },
}

impl ExploringPolicy {
    /// `inner` (a deterministic policy on a box action for OU, the `qvalue` head for
    /// epsilon-greedy) followed by `module`, its draws from a generator seeded with
    /// `seed`; `eps` read from the inner policy's weights.
    pub fn new(
        inner: Box<dyn Policy>,
        module: ExplorationModule,
        action: &Spec,
        seed: u64,
    ) -> Result<ExploringPolicy, PolicyError> {
        let acts_on = match (&module, action) {
            (ExplorationModule::OrnsteinUhlenbeck(ou), Spec::Box { low, high }) => {
                let d = low.len();
                ou.check(d)?;
                let x0 = match ou.x0.len() {
                    0 => vec![0.0; d],
                    1 => vec![ou.x0[0]; d],
                    _ => ou.x0.clone(),
                };
                ActsOn::Box {
                    low: low.clone(),
                    high: high.clone(),
                    x0,
                }
            }
            (ExplorationModule::EpsilonGreedy(eg), Spec::Discrete { n }) => {
                eg.check()?;
                ActsOn::Discrete { n: *n }
            }
            (ExplorationModule::OrnsteinUhlenbeck(_), _) => {
                return Err(PolicyError::Spec(
                    "exploration: Ornstein-Uhlenbeck noise acts on a box action, the env's is discrete".into(),
                ))
            }
            (ExplorationModule::EpsilonGreedy(_), _) => {
                return Err(PolicyError::Spec(
                    "exploration: epsilon-greedy acts on a discrete action, the env's is a box".into(),
                ))
            }
        };
        let inner_tensors = inner.state().len();
        let mut state = inner.state().to_vec();
        state.extend(module.state(action.dim()));
        let eps = eps_of(inner.weights(), module.eps_name())?;
        Ok(ExploringPolicy {
            inner,
            module,
            acts_on,
            state,
            inner_tensors,
            eps,
            exploration: ExplorationType::default(),
            sampler: Sampler::new(seed),
        })
    }

    /// The module's `eps` as the current weights hold it.
    pub fn eps(&self) -> f32 {
        self.eps
    }

    /// Epsilon-greedy on `k` actions (random exploration only).
    fn explore_discrete(&mut self, k: usize, actions: &mut [i64]) -> Result<(), PolicyError> {
        let ActsOn::Discrete { n } = self.acts_on else {
            return Err(PolicyError::Buffer(
                "an epsilon-greedy policy writes discrete actions".into(),
            ));
        };
        let a = actions
            .get_mut(..k)
            .ok_or_else(|| PolicyError::Buffer(format!("{k} actions need {k} slots")))?;
        if self.exploration == ExplorationType::Random {
            egreedy::explore(a, n, self.eps, &mut self.sampler);
        }
        Ok(())
    }

    /// Adds OU noise to `k` actions and writes the module's state after the step.
    fn explore_box(&mut self, k: usize, actions: &mut [f32], before: &[Vec<f32>], after: &mut [Vec<f32>]) {
        let (ExplorationModule::OrnsteinUhlenbeck(ou), ActsOn::Box { low, high, x0 }) = (&self.module, &self.acts_on)
        else {
            return; // built together: OU acts on a box
        };
        let d = low.len();
        let (noise_in, steps_in) = (&before[0], &before[1]);
        let [noise_out, steps_out] = after else {
            return; // checked by the caller: two tensors
        };
        if self.exploration == ExplorationType::Deterministic {
            noise_out.copy_from_slice(noise_in);
            steps_out.copy_from_slice(steps_in);
            return;
        }
        let root_dt = ou.dt.sqrt();
        for row in 0..k {
            let n = steps_in[row];
            let sigma = ou.sigma_at(n) * root_dt;
            for j in 0..d {
                let i = row * d + j;
                let p = noise_in[i] + x0[j];
                let noise = p + ou.theta * (ou.mu - p) * ou.dt + sigma * self.sampler.normal();
                noise_out[i] = noise - x0[j];
                actions[i] = clip(actions[i] + self.eps * noise, low[j], high[j]);
            }
            steps_out[row] = n + 1.0;
        }
    }
}

/// `x` clipped to the finite ones of `low` and `high`.
fn clip(x: f32, low: f32, high: f32) -> f32 {
    let x = if low.is_finite() && x < low { low } else { x };
    if high.is_finite() && x > high {
        high
    } else {
        x
    }
}

/// The one f32 value of the weight `name`.
fn eps_of(weights: &Weights, name: &str) -> Result<f32, PolicyError> {
    match weights.tensors.get(name) {
        Some(Tensor::F32(a)) if a.len() == 1 => Ok(a.iter().sum()),
        Some(_) => Err(PolicyError::Spec(format!(
            "exploration.eps: the model's initializer `{}` must be f32 with one element",
            crate::peer_text::bounded(name)
        ))),
        None => Err(PolicyError::Spec(format!(
            "exploration.eps: the model has no f32 initializer named `{}`",
            crate::peer_text::bounded(name)
        ))),
    }
}

impl Policy for ExploringPolicy {
    fn act(&mut self, obs: &[f32], k: usize, actions: ActionsMut<'_>) -> Result<(), PolicyError> {
        self.act_recording(obs, k, actions, RecordMut::nothing())
    }

    fn weights(&self) -> &Weights {
        self.inner.weights()
    }

    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
        let eps = eps_of(weights, self.module.eps_name())?;
        self.inner.set_weights(weights)?;
        self.eps = eps;
        Ok(())
    }

    fn set_shared_weights(&mut self, weights: &Arc<Weights>) -> Result<(), PolicyError> {
        let eps = eps_of(weights, self.module.eps_name())?;
        self.inner.set_shared_weights(weights)?;
        self.eps = eps;
        Ok(())
    }

    fn set_exploration(&mut self, exploration: ExplorationType) {
        self.exploration = exploration;
        self.inner.set_exploration(exploration);
    }

    fn reseed(&mut self, seed: u64) {
        self.sampler.reseed(seed);
        self.inner.reseed(seed);
    }

    fn sampler_state(&self) -> Result<Option<SamplerState>, PolicyError> {
        Ok(Some(self.sampler.state()))
    }

    fn set_sampler_state(&mut self, state: Option<&SamplerState>) -> Result<(), PolicyError> {
        self.sampler.set_state(state)
    }

    fn recorded(&self) -> Recorded {
        self.inner.recorded()
    }

    fn state(&self) -> &[StateTensor] {
        &self.state
    }

    fn act_recording(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        if !self.state.is_empty() {
            return Err(PolicyError::Buffer(
                "a policy with state acts through act_recurrent, with its state".into(),
            ));
        }
        let ActionsMut::Discrete(a) = actions else {
            return Err(PolicyError::Buffer(
                "an epsilon-greedy policy writes discrete actions".into(),
            ));
        };
        self.inner
            .act_recording(obs, k, ActionsMut::Discrete(&mut *a), record)?;
        self.explore_discrete(k, a)
    }

    fn act_recurrent(
        &mut self,
        obs: &[f32],
        k: usize,
        state: StateIo<'_>,
        mut actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        state.check(&self.state, k)?;
        let n = self.inner_tensors;
        let (inner_after, own_after) = state.after.split_at_mut(n);
        let reborrowed = match &mut actions {
            ActionsMut::Continuous(a) => ActionsMut::Continuous(a),
            ActionsMut::Discrete(a) => ActionsMut::Discrete(a),
        };
        if n == 0 {
            self.inner.act_recording(obs, k, reborrowed, record)?;
        } else {
            let io = StateIo {
                is_init: state.is_init,
                before: &state.before[..n],
                after: inner_after,
            };
            self.inner.act_recurrent(obs, k, io, reborrowed, record)?;
        }
        match (actions, &self.acts_on) {
            (ActionsMut::Continuous(a), ActsOn::Box { low, .. }) => {
                let d = low.len();
                let want = k * d;
                let a = a
                    .get_mut(..want)
                    .ok_or_else(|| PolicyError::Buffer(format!("{k} actions of {d} values need {want}")))?;
                self.explore_box(k, a, &state.before[n..], own_after);
                Ok(())
            }
            (ActionsMut::Discrete(a), ActsOn::Discrete { .. }) => self.explore_discrete(k, a),
            _ => Err(PolicyError::Buffer(
                "the actions are not of the kind the exploration module acts on".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{t, w};

    /// The action is the observation (`d` values per row); weights `eps` and `w`.
    struct Echo(Weights);

    impl Policy for Echo {
        fn act(&mut self, obs: &[f32], k: usize, actions: ActionsMut<'_>) -> Result<(), PolicyError> {
            let ActionsMut::Continuous(a) = actions else {
                return Err(PolicyError::Buffer("box".into()));
            };
            a[..obs.len().min(k * 2)].copy_from_slice(&obs[..obs.len().min(k * 2)]);
            Ok(())
        }
        fn weights(&self) -> &Weights {
            &self.0
        }
        fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
            self.0.check_layout(weights)?;
            self.0 = weights.clone();
            Ok(())
        }
        fn set_exploration(&mut self, _: ExplorationType) {}
        fn reseed(&mut self, _: u64) {}
    }

    fn weights(version: u64, eps: f32) -> Weights {
        w(
            version,
            vec![("noise.eps", t(&[], &[eps])), ("w", t(&[2], &[1.0, 2.0]))],
        )
    }

    fn ou() -> OrnsteinUhlenbeck {
        OrnsteinUhlenbeck {
            eps: "noise.eps".into(),
            theta: 0.15,
            mu: 0.1,
            sigma: 0.3,
            sigma_min: Some(0.05),
            n_steps_annealing: 4,
            dt: 0.05,
            x0: vec![0.2, -0.1],
        }
    }

    fn action() -> Spec {
        Spec::Box {
            low: vec![-1.0, -1.0],
            high: vec![1.0, f32::INFINITY],
        }
    }

    fn policy(module: OrnsteinUhlenbeck, eps: f32) -> ExploringPolicy {
        let mut p = ExploringPolicy::new(
            Box::new(Echo(weights(0, eps))),
            ExplorationModule::OrnsteinUhlenbeck(module),
            &action(),
            11,
        )
        .unwrap();
        p.set_exploration(ExplorationType::Random);
        p
    }

    /// One step of `p` for `k = 2` envs from `before`, returning (actions, after).
    fn step(p: &mut ExploringPolicy, obs: &[f32], is_init: &[bool], before: &[Vec<f32>]) -> (Vec<f32>, Vec<Vec<f32>>) {
        let mut after = vec![vec![0.0; 4], vec![0.0; 2]];
        let mut actions = vec![0.0; 4];
        let io = StateIo {
            is_init,
            before,
            after: &mut after,
        };
        p.act_recurrent(obs, 2, io, ActionsMut::Continuous(&mut actions), RecordMut::nothing())
            .unwrap();
        (actions, after)
    }

    /// torchrl's `_OrnsteinUhlenbeckProcess.add_sample` for one env, written from its
    /// formulas, with the normal draws `z` given; `(action, noise - x0, steps)`.
    fn torchrl_step(
        m: &OrnsteinUhlenbeck,
        a: &[f32],
        eps: f32,
        prev: &[f32],
        n: f32,
        z: &[f32],
    ) -> (Vec<f32>, Vec<f32>, f32) {
        let sigma_min = m.sigma_min.unwrap_or(m.sigma);
        let slope = if m.sigma_min.is_some() {
            -(m.sigma - sigma_min) / m.n_steps_annealing as f32
        } else {
            0.0
        };
        let sigma = (slope * n + m.sigma).max(sigma_min);
        let (mut act, mut next) = (vec![], vec![]);
        let bounds = action();
        let Spec::Box { low, high } = bounds else {
            unreachable!()
        };
        for j in 0..a.len() {
            let x0 = m.x0[j];
            let p = prev[j] + x0;
            let noise = p + m.theta * (m.mu - p) * m.dt + sigma * m.dt.sqrt() * z[j];
            next.push(noise - x0);
            act.push((a[j] + eps * noise).max(low[j]).min(high[j]));
        }
        (act, next, n + 1.0)
    }

    #[test]
    fn each_step_is_torchrls_ornstein_uhlenbeck_step_with_the_same_draws() {
        let m = ou();
        let mut p = policy(m.clone(), 0.7);
        // The draws the policy makes, from a generator seeded as its own.
        let mut z = Sampler::new(11);
        let obs = [0.5, -0.25, 0.9, 0.0];
        // Env 0 mid-episode (steps 6: sigma annealed to its floor), env 1 at its start.
        let mut before = vec![vec![0.3, -0.2, 0.0, 0.0], vec![6.0, 0.0]];
        for _ in 0..5 {
            let (actions, after) = step(&mut p, &obs, &[false, false], &before);
            for e in 0..2 {
                let draws: Vec<f32> = (0..2).map(|_| z.normal()).collect();
                let (act, next, n) = torchrl_step(
                    &m,
                    &obs[e * 2..e * 2 + 2],
                    0.7,
                    &before[0][e * 2..e * 2 + 2],
                    before[1][e],
                    &draws,
                );
                assert_eq!(&actions[e * 2..e * 2 + 2], &act[..], "env {e}");
                assert_eq!(&after[0][e * 2..e * 2 + 2], &next[..], "env {e}");
                assert_eq!(after[1][e], n);
            }
            before = after;
        }
        // Each env counted its five noisy steps.
        assert_eq!(before[1], vec![11.0, 5.0]);
    }

    #[test]
    fn a_weight_update_carries_eps_and_deterministic_exploration_adds_no_noise() {
        let mut p = policy(ou(), 0.7);
        assert_eq!(p.eps(), 0.7);
        p.set_weights(&weights(1, 0.0)).unwrap();
        assert_eq!(p.eps(), 0.0);
        let obs = [0.5, -0.25, 0.9, 0.0];
        let before = vec![vec![0.3, -0.2, 0.0, 0.0], vec![6.0, 0.0]];
        // eps 0: the action is the policy's (clipped), the noise still moves.
        let (actions, after) = step(&mut p, &obs, &[false, false], &before);
        assert_eq!(actions, obs.to_vec());
        assert_ne!(after[0], before[0]);
        assert_eq!(after[1], vec![7.0, 1.0]);
        // Deterministic: no noise, the state holds.
        p.set_weights(&weights(2, 0.7)).unwrap();
        p.set_exploration(ExplorationType::Deterministic);
        let (actions, after) = step(&mut p, &obs, &[false, true], &before);
        assert_eq!(actions, obs.to_vec());
        assert_eq!(after, before);
        // An update without eps is refused and changes nothing.
        let err = p.set_weights(&w(3, vec![("w", t(&[2], &[0.0, 0.0]))])).unwrap_err();
        assert!(err.to_string().contains("exploration.eps"), "{err}");
        assert_eq!((p.eps(), p.weights().version), (0.7, 2));
    }

    #[test]
    fn each_bad_number_is_refused_naming_its_field() {
        type Break = Box<dyn Fn(&mut OrnsteinUhlenbeck)>;
        let cases: Vec<(&str, Break)> = vec![
            ("exploration.theta", Box::new(|m| m.theta = f32::NAN)),
            ("exploration.dt", Box::new(|m| m.dt = 0.0)),
            ("exploration.sigma", Box::new(|m| m.sigma = -1.0)),
            ("exploration.sigma_min", Box::new(|m| m.sigma_min = Some(f32::INFINITY))),
            ("exploration.n_steps_annealing", Box::new(|m| m.n_steps_annealing = 0)),
            ("exploration.x0", Box::new(|m| m.x0 = vec![0.0; 3])),
            ("exploration.x0", Box::new(|m| m.x0 = vec![f32::NAN])),
            ("exploration.eps", Box::new(|m| m.eps = "missing".into())),
        ];
        for (field, break_it) in cases {
            let mut m = ou();
            break_it(&mut m);
            let err = ExploringPolicy::new(
                Box::new(Echo(weights(0, 0.5))),
                ExplorationModule::OrnsteinUhlenbeck(m),
                &action(),
                0,
            )
            .err()
            .unwrap_or_else(|| panic!("{field} accepted"));
            assert!(err.to_string().contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn the_state_list_ends_with_the_modules_tensors_and_the_action_is_a_box() {
        let module = ExplorationModule::OrnsteinUhlenbeck(ou());
        let lstm = StateTensor::new("recurrent_state", [1, 8]);
        let mut state = vec![lstm.clone()];
        state.extend(module.state(2));
        assert_eq!(
            module.model_state(OnnxHead::Deterministic, &action(), &state).unwrap(),
            std::slice::from_ref(&lstm)
        );
        // Out of order, the wrong size, or missing: refused naming the state.
        let swapped = vec![state[0].clone(), state[2].clone(), state[1].clone()];
        for bad in [swapped, vec![lstm], module.state(3)] {
            let err = module
                .model_state(OnnxHead::Deterministic, &action(), &bad)
                .unwrap_err()
                .to_string();
            assert!(err.contains("state") && err.contains(OU_NOISE), "{err}");
        }
        let err = module
            .model_state(OnnxHead::Normal, &action(), &state)
            .unwrap_err()
            .to_string();
        assert!(err.contains("deterministic"), "{err}");
        let err = module
            .model_state(OnnxHead::Deterministic, &Spec::Discrete { n: 2 }, &state)
            .unwrap_err()
            .to_string();
        assert!(err.contains("box action"), "{err}");
    }

    #[test]
    fn the_config_round_trips_through_messagepack_as_protocol_md_writes_it() {
        let module = ExplorationModule::OrnsteinUhlenbeck(OrnsteinUhlenbeck {
            sigma_min: None,
            x0: vec![],
            ..ou()
        });
        let bytes = rmp_serde::to_vec_named(&module).unwrap();
        let value: rmpv::Value = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let text = value.to_string();
        assert!(text.contains("\"kind\": \"ornstein_uhlenbeck\""), "{text}");
        assert_eq!(rmp_serde::from_slice::<ExplorationModule>(&bytes).unwrap(), module);
    }

    #[test]
    fn epsilon_greedy_follows_the_qvalue_head_on_a_discrete_action_and_keeps_no_state() {
        let module = ExplorationModule::EpsilonGreedy(EpsilonGreedy { eps: "eps".into() });
        assert!(module.state(2).is_empty());
        let lstm = vec![StateTensor::new("recurrent_state", [1, 8])];
        let discrete = Spec::Discrete { n: 2 };
        assert_eq!(
            module.model_state(OnnxHead::QValue, &discrete, &lstm).unwrap(),
            &lstm[..],
            "the whole state list is the model's"
        );
        let err = module
            .model_state(OnnxHead::Categorical, &discrete, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("follows the `qvalue` head, not `categorical`"), "{err}");
        let err = module
            .model_state(OnnxHead::QValue, &action(), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("discrete action"), "{err}");
        let empty = ExplorationModule::EpsilonGreedy(EpsilonGreedy { eps: String::new() });
        let err = empty
            .model_state(OnnxHead::QValue, &discrete, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("exploration.eps"), "{err}");
        let bytes = rmp_serde::to_vec_named(&module).unwrap();
        let text = rmpv::decode::read_value(&mut &bytes[..]).unwrap().to_string();
        assert!(text.contains("\"kind\": \"epsilon_greedy\""), "{text}");
        assert_eq!(rmp_serde::from_slice::<ExplorationModule>(&bytes).unwrap(), module);
    }
}
