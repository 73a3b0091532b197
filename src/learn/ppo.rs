//! Proximal policy optimisation (Schulman et al. 2017) for the discrete softmax
//! policies, with a separate value network, GAE and Adam; gradients by hand.

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::adam::{clip_grad_norm, Adam, AdamState};
use super::advantage::{gae, normalize};
use super::net::{layer_names, DenseNet};
use super::LearnError;
use crate::policy::{PolicyConfig, PolicySpec, Weights};
use crate::rng::RngState;
use crate::schema::keys;
use crate::spec::Spec;
use crate::tensor::TensorDict;

/// How many past policy versions are kept to recompute the log-probabilities of
/// the actions of batches collected with older weights.
const HISTORY: usize = 8;

/// Hyper-parameters of [`Ppo`]. The defaults solve CartPole-v1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PpoConfig {
    /// Discount factor.
    pub gamma: f64,
    /// GAE's lambda.
    pub gae_lambda: f64,
    /// Clip range of the probability ratio.
    pub clip: f64,
    /// Passes over each batch.
    pub epochs: usize,
    /// Frames per gradient step.
    pub minibatch: usize,
    /// Adam learning rate of the policy.
    pub lr: f64,
    /// Adam learning rate of the value network.
    pub value_lr: f64,
    /// Weight of the entropy bonus.
    pub entropy_coef: f64,
    /// Gradients are clipped to this global norm (per network).
    pub max_grad_norm: f64,
    /// Hidden widths of the value network.
    pub value_hidden: Vec<usize>,
    /// Seed of the value network's initial weights and of the minibatch shuffling.
    pub seed: u64,
}

impl Default for PpoConfig {
    fn default() -> Self {
        PpoConfig {
            gamma: 0.99,
            gae_lambda: 0.95,
            clip: 0.2,
            epochs: 10,
            minibatch: 256,
            lr: 1e-3,
            value_lr: 1e-3,
            entropy_coef: 0.0,
            max_grad_norm: 0.5,
            value_hidden: vec![32, 32],
            seed: 0,
        }
    }
}

impl PpoConfig {
    /// Checks every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), LearnError> {
        let bad = |field: &str, why: String| Err(LearnError::Config(format!("invalid `{field}`: {why}")));
        if !(0.0..=1.0).contains(&self.gamma) {
            return bad("gamma", format!("{} is not in [0, 1]", self.gamma));
        }
        if !(0.0..=1.0).contains(&self.gae_lambda) {
            return bad("gae_lambda", format!("{} is not in [0, 1]", self.gae_lambda));
        }
        if !(self.clip > 0.0 && self.clip.is_finite()) {
            return bad("clip", format!("{} must be positive", self.clip));
        }
        if self.epochs == 0 {
            return bad("epochs", "must be at least 1".into());
        }
        if self.minibatch == 0 {
            return bad("minibatch", "must be at least 1".into());
        }
        for (field, lr) in [("lr", self.lr), ("value_lr", self.value_lr)] {
            if !(lr > 0.0 && lr.is_finite()) {
                return bad(field, format!("{lr} must be a positive number"));
            }
        }
        if !(self.entropy_coef >= 0.0 && self.entropy_coef.is_finite()) {
            return bad("entropy_coef", format!("{} must be >= 0", self.entropy_coef));
        }
        if self.max_grad_norm.is_nan() || self.max_grad_norm <= 0.0 {
            return bad("max_grad_norm", format!("{} must be positive", self.max_grad_norm));
        }
        if self.value_hidden.contains(&0) {
            return bad("value_hidden", "every layer needs at least one unit".into());
        }
        Ok(())
    }
}

/// What one update did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpdateStats {
    /// Frames in the batch.
    pub frames: usize,
    /// Mean clipped surrogate loss over the last epoch.
    pub policy_loss: f64,
    /// Mean value loss over the last epoch.
    pub value_loss: f64,
    /// Mean policy entropy over the last epoch.
    pub entropy: f64,
    /// Fraction of frames whose ratio was clipped in the last epoch.
    pub clip_fraction: f64,
    /// Frames whose behaviour weights were unknown (their log-probabilities were
    /// taken from the current weights instead). Always 0 for a batch with
    /// `action_log_prob`: the recorded log-probabilities are used, nothing recomputed.
    pub unknown_behaviour: usize,
}

/// A batch flattened to `lanes` rows of `steps` frames, in f64.
struct Flat {
    steps: usize,
    obs: Vec<f64>,
    next_obs: Vec<f64>,
    actions: Vec<usize>,
    reward: Vec<f64>,
    done: Vec<bool>,
    terminated: Vec<bool>,
}

fn flatten(batch: &TensorDict, obs_dim: usize, n_actions: usize) -> Result<Flat, LearnError> {
    let bs = batch.batch_size();
    let steps = *bs
        .last()
        .ok_or_else(|| LearnError::Batch("a batch needs a time dimension".into()))?;
    let n: usize = bs.iter().product();
    let f32s = |key: &str, per: usize| -> Result<Vec<f64>, LearnError> {
        let a = batch.f32(key)?;
        if a.len() != n * per {
            return Err(LearnError::Batch(format!(
                "`{key}` has {} values, expected {}",
                a.len(),
                n * per
            )));
        }
        Ok(a.iter().map(|&v| f64::from(v)).collect())
    };
    let bools = |key: &str| -> Result<Vec<bool>, LearnError> {
        let a = batch.bool(key)?;
        if a.len() != n {
            return Err(LearnError::Batch(format!(
                "`{key}` has {} values, expected {n}",
                a.len()
            )));
        }
        Ok(a.iter().copied().collect())
    };
    let act = batch.i64(keys::ACTION)?;
    if act.len() != n {
        return Err(LearnError::Batch(format!(
            "`action` has {} values, expected {n} (one discrete choice per frame)",
            act.len()
        )));
    }
    let actions = act
        .iter()
        .map(|&a| {
            usize::try_from(a)
                .ok()
                .filter(|&a| a < n_actions)
                .ok_or_else(|| LearnError::Batch(format!("action {a} outside 0..{n_actions}")))
        })
        .collect::<Result<Vec<usize>, LearnError>>()?;
    Ok(Flat {
        steps,
        obs: f32s(keys::OBSERVATION, obs_dim)?,
        next_obs: f32s(keys::NEXT_OBSERVATION, obs_dim)?,
        actions,
        reward: f32s(keys::NEXT_REWARD, 1)?,
        done: bools(keys::NEXT_DONE)?,
        terminated: bools(keys::NEXT_TERMINATED)?,
    })
}

/// log-softmax of `z` into `out`.
fn log_softmax(z: &[f64], out: &mut [f64]) {
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    for (o, v) in out.iter_mut().zip(z) {
        *o = v - lse;
    }
}

/// Everything a [`Ppo`] learner needs to go on exactly where another one stopped:
/// networks, optimisers, the minibatch generator and the weights history. The config
/// is not in it (the caller rebuilds the learner with the same one); [`Ppo::restore`]
/// checks that the state fits. Opaque apart from the version, so that only
/// [`Ppo::state`] or a deserialiser makes one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PpoState {
    /// Weights version of the last update.
    pub version: u64,
    policy: Vec<f64>,
    value: Vec<f64>,
    pi_opt: AdamState,
    v_opt: AdamState,
    rng: RngState,
    history: VecDeque<(u64, Vec<f64>)>,
}

/// Names the part of a [`PpoState`] a checkpoint error comes from (without nesting
/// "bad checkpoint" twice).
fn in_part(part: &str, e: LearnError) -> LearnError {
    match e {
        LearnError::Checkpoint(m) => LearnError::Checkpoint(format!("{part}: {m}")),
        other => LearnError::Checkpoint(format!("{part}: {other}")),
    }
}

/// The policy and value networks being trained, their optimisers, and the
/// weights history needed to correct for batches collected with older weights.
pub struct Ppo {
    cfg: PpoConfig,
    obs_dim: usize,
    n_actions: usize,
    policy: DenseNet,
    value: DenseNet,
    pi_opt: Adam,
    v_opt: Adam,
    rng: ChaCha8Rng,
    version: u64,
    history: VecDeque<(u64, Vec<f64>)>,
}

impl std::fmt::Debug for Ppo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ppo")
            .field("version", &self.version)
            .field("policy_params", &self.policy.len())
            .field("value_params", &self.value.len())
            .finish()
    }
}

impl Ppo {
    /// A learner for `policy` (a `Linear` or `Mlp` config) over these specs. The
    /// action spec must be discrete. Starts from exactly the weights the nodes build
    /// from the same [`PolicySpec`] (its `init_seed`), as version 0.
    pub fn new(obs: &Spec, action: &Spec, policy: &PolicySpec, cfg: PpoConfig) -> Result<Ppo, LearnError> {
        cfg.validate()?;
        let Spec::Discrete { n } = action else {
            return Err(LearnError::Unsupported(
                "continuous actions (only discrete softmax policies learn)".into(),
            ));
        };
        let n_actions = usize::try_from(*n).map_err(|_| LearnError::Unsupported(format!("{n} actions")))?;
        let obs_dim = obs.dim();
        let hidden = match &policy.config {
            PolicyConfig::Linear => vec![],
            PolicyConfig::Mlp { hidden } => hidden.clone(),
            other => return Err(LearnError::Unsupported(format!("policy {other:?} has no gradient"))),
        };
        let initial = policy
            .build(obs, action, 0)
            .map_err(|e| LearnError::Config(format!("invalid `policy`: {e}")))?;
        let dims = [vec![obs_dim], hidden, vec![n_actions]].concat();
        let config = policy.config.clone();
        let mut net = DenseNet::new(&dims, |i| layer_names(&config, i), 0)?;
        net.set_weights(initial.weights())?;
        let vdims = [vec![obs_dim], cfg.value_hidden.clone(), vec![1]].concat();
        let value = DenseNet::new(
            &vdims,
            |i| (format!("value.{i}.weight"), format!("value.{i}.bias")),
            cfg.seed,
        )?;
        let mut history = VecDeque::new();
        history.push_back((0, net.params.clone()));
        Ok(Ppo {
            pi_opt: Adam::new(net.len(), cfg.lr),
            v_opt: Adam::new(value.len(), cfg.value_lr),
            rng: ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x0005_eed0_fba7_c4e5),
            obs_dim,
            n_actions,
            policy: net,
            value,
            cfg,
            version: 0,
            history,
        })
    }

    /// The learner's whole state (networks, optimisers, generator, weights history).
    pub fn state(&self) -> PpoState {
        PpoState {
            version: self.version,
            policy: self.policy.params.clone(),
            value: self.value.params.clone(),
            pi_opt: self.pi_opt.state(),
            v_opt: self.v_opt.state(),
            rng: RngState::of(&self.rng),
            history: self.history.clone(),
        }
    }

    /// Continues from `state`, taken from a learner built with the same specs, policy
    /// and config: the next updates are bit for bit those the original would have made.
    ///
    /// The state usually comes from a file, so everything is checked against this
    /// learner first (parameter counts, optimiser lengths, history, generator seed);
    /// on error nothing changes.
    pub fn restore(&mut self, state: PpoState) -> Result<(), LearnError> {
        let bad = |why: String| Err(LearnError::Checkpoint(why));
        let (np, nv) = (self.policy.len(), self.value.len());
        if state.policy.len() != np {
            return bad(format!(
                "{} policy parameters, this learner's policy has {np} (another policy config?)",
                state.policy.len()
            ));
        }
        if state.value.len() != nv {
            return bad(format!(
                "{} value parameters, this learner's value network has {nv} (another `value_hidden`?)",
                state.value.len()
            ));
        }
        if !state.policy.iter().chain(&state.value).all(|p| p.is_finite()) {
            return bad("non-finite network parameters".into());
        }
        if state.history.is_empty() || state.history.len() > HISTORY {
            return bad(format!(
                "weights history of {} entries, expected 1 to {HISTORY}",
                state.history.len()
            ));
        }
        let mut prev = None;
        for (v, params) in &state.history {
            if params.len() != np {
                return bad(format!(
                    "weights history version {v} has {} parameters, expected {np}",
                    params.len()
                ));
            }
            if !params.iter().all(|p| p.is_finite()) {
                return bad(format!("weights history version {v} has non-finite parameters"));
            }
            if prev.is_some_and(|p| p >= *v) {
                return bad("weights history versions must increase".into());
            }
            prev = Some(*v);
        }
        if prev != Some(state.version) {
            return bad(format!(
                "the newest weights in the history are version {prev:?}, the state is at version {}",
                state.version
            ));
        }
        let rng = state
            .rng
            .to_rng()
            .map_err(|e| LearnError::Checkpoint(format!("minibatch generator: {e}")))?;
        let mut pi_opt = self.pi_opt.clone();
        pi_opt
            .restore(state.pi_opt)
            .map_err(|e| in_part("policy optimiser", e))?;
        let mut v_opt = self.v_opt.clone();
        v_opt.restore(state.v_opt).map_err(|e| in_part("value optimiser", e))?;
        self.policy.params = state.policy;
        self.value.params = state.value;
        self.pi_opt = pi_opt;
        self.v_opt = v_opt;
        self.rng = rng;
        self.version = state.version;
        self.history = state.history;
        Ok(())
    }

    /// The config.
    pub fn config(&self) -> &PpoConfig {
        &self.cfg
    }

    /// Version of the current weights: 0 at the start, +1 per update (the trainer
    /// numbers stored weights the same way when this learner is the only one storing).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The current policy weights, f32, under the policy's names and shapes.
    pub fn weights(&self) -> Weights {
        self.policy.to_weights().with_version(self.version)
    }

    /// One PPO update on `batch` (any batch dims `[.., T]`, time last).
    ///
    /// `behaviour` gives the weights version that collected the frames: one entry for
    /// the whole batch, or one per index of the first batch dim (a sync batch's nodes).
    pub fn update(&mut self, batch: &TensorDict, behaviour: &[u64]) -> Result<UpdateStats, LearnError> {
        let f = flatten(batch, self.obs_dim, self.n_actions)?;
        let n = f.actions.len();
        let (d, k) = (self.obs_dim, self.n_actions);
        if n == 0 {
            return Err(LearnError::Batch("empty batch".into()));
        }
        let first = batch.batch_size()[0];
        let per_first = n / first;
        let version_of = |i: usize| -> u64 {
            match behaviour {
                [] => self.version,
                [v] => *v,
                vs => vs.get(i / per_first).copied().unwrap_or(self.version),
            }
        };

        // Log-probabilities of the actions under the weights that chose them: as the
        // policy recorded them (`action_log_prob`), or else recomputed with the weights
        // of the version that collected them.
        let recorded = match batch.f32(keys::ACTION_LOG_PROB) {
            Ok(lp) if lp.len() == n => Some(lp.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>()),
            Ok(lp) => {
                return Err(LearnError::Batch(format!(
                    "`{}` has {} values, expected {n}",
                    keys::ACTION_LOG_PROB,
                    lp.len()
                )))
            }
            Err(_) => None,
        };
        let recomputed = recorded.is_none();
        let mut old_logp = recorded.unwrap_or_else(|| vec![0.0; n]);
        let mut unknown = 0;
        let mut ls = vec![0.0; k];
        let mut i = if recomputed { 0 } else { n };
        while i < n {
            let v = version_of(i);
            let mut j = i;
            while j < n && version_of(j) == v {
                j += 1;
            }
            let params = match self.history.iter().find(|(hv, _)| *hv == v) {
                Some((_, p)) => p.as_slice(),
                None => {
                    unknown += j - i;
                    self.policy.params.as_slice()
                }
            };
            let out = self.policy.forward_with(params, &f.obs[i * d..j * d], j - i);
            for (r, row) in out.output().chunks(k).enumerate() {
                log_softmax(row, &mut ls);
                old_logp[i + r] = ls[f.actions[i + r]];
            }
            i = j;
        }

        // Advantages and value targets, lane by lane.
        let v_obs = self.value.forward(&f.obs, n);
        let v_next = self.value.forward(&f.next_obs, n);
        let mut adv = Vec::with_capacity(n);
        let mut targets = Vec::with_capacity(n);
        for lane in 0..n / f.steps {
            let s = lane * f.steps..(lane + 1) * f.steps;
            let (a, t) = gae(
                &f.reward[s.clone()],
                &v_obs.output()[s.clone()],
                &v_next.output()[s.clone()],
                &f.done[s.clone()],
                &f.terminated[s],
                self.cfg.gamma,
                self.cfg.gae_lambda,
            );
            adv.extend(a);
            targets.extend(t);
        }
        normalize(&mut adv);

        let mut order: Vec<usize> = (0..n).collect();
        let mb = self.cfg.minibatch.min(n);
        let mut stats = UpdateStats {
            frames: n,
            policy_loss: 0.0,
            value_loss: 0.0,
            entropy: 0.0,
            clip_fraction: 0.0,
            unknown_behaviour: unknown,
        };
        let mut pi_grad = vec![0.0; self.policy.len()];
        let mut v_grad = vec![0.0; self.value.len()];
        for epoch in 0..self.cfg.epochs {
            // Fisher–Yates with the learner's own generator: the same seed, the same minibatches.
            for a in (1..n).rev() {
                let b = self.rng.random_range(0..=a);
                order.swap(a, b);
            }
            let last = epoch + 1 == self.cfg.epochs;
            let (mut pl, mut vl, mut ent, mut clipped) = (0.0, 0.0, 0.0, 0.0);
            for idx in order.chunks(mb) {
                let m = idx.len();
                let mut obs = Vec::with_capacity(m * d);
                for &r in idx {
                    obs.extend_from_slice(&f.obs[r * d..(r + 1) * d]);
                }
                let acts: Vec<usize> = idx.iter().map(|&r| f.actions[r]).collect();
                let olp: Vec<f64> = idx.iter().map(|&r| old_logp[r]).collect();
                let ad: Vec<f64> = idx.iter().map(|&r| adv[r]).collect();
                let tg: Vec<f64> = idx.iter().map(|&r| targets[r]).collect();
                pi_grad.iter_mut().for_each(|g| *g = 0.0);
                let p = policy_loss_grad(
                    &self.policy,
                    &self.policy.params,
                    &obs,
                    &acts,
                    &olp,
                    &ad,
                    self.cfg.clip,
                    self.cfg.entropy_coef,
                    &mut pi_grad,
                );
                clip_grad_norm(&mut pi_grad, self.cfg.max_grad_norm);
                self.pi_opt.step(&mut self.policy.params, &pi_grad);
                v_grad.iter_mut().for_each(|g| *g = 0.0);
                let v = value_loss_grad(&self.value, &self.value.params, &obs, &tg, &mut v_grad);
                clip_grad_norm(&mut v_grad, self.cfg.max_grad_norm);
                self.v_opt.step(&mut self.value.params, &v_grad);
                if last {
                    pl += p.loss * m as f64;
                    ent += p.entropy * m as f64;
                    clipped += p.clipped as f64;
                    vl += v * m as f64;
                }
            }
            if last {
                let nf = n as f64;
                stats.policy_loss = pl / nf;
                stats.value_loss = vl / nf;
                stats.entropy = ent / nf;
                stats.clip_fraction = clipped / nf;
            }
        }
        if !self.policy.params.iter().all(|p| p.is_finite()) {
            return Err(LearnError::Diverged(
                "non-finite policy weights after the update".into(),
            ));
        }
        self.version += 1;
        self.history.push_back((self.version, self.policy.params.clone()));
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
        Ok(stats)
    }
}

/// The policy part of a minibatch's loss.
pub(crate) struct PolicyLoss {
    /// Clipped surrogate loss minus the entropy bonus, mean over the minibatch.
    pub loss: f64,
    /// Mean entropy.
    pub entropy: f64,
    /// Frames whose ratio was clipped.
    pub clipped: usize,
}

/// PPO's loss `-mean(min(r A, clip(r, 1 - eps, 1 + eps) A)) - c * mean(H)` over the
/// rows of `obs`, `r = exp(log pi(a) - old_logp)`; adds its gradient to `grad`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn policy_loss_grad(
    net: &DenseNet,
    params: &[f64],
    obs: &[f64],
    actions: &[usize],
    old_logp: &[f64],
    adv: &[f64],
    clip: f64,
    entropy_coef: f64,
    grad: &mut [f64],
) -> PolicyLoss {
    let m = actions.len();
    let k = net.n_out();
    let cache = net.forward_with(params, obs, m);
    let mut d_out = vec![0.0; m * k];
    let mut ls = vec![0.0; k];
    let (mut loss, mut entropy, mut clipped) = (0.0, 0.0, 0);
    let inv = 1.0 / m as f64;
    for r in 0..m {
        let z = &cache.output()[r * k..(r + 1) * k];
        log_softmax(z, &mut ls);
        let a = actions[r];
        let ratio = (ls[a] - old_logp[r]).exp();
        let s1 = ratio * adv[r];
        let s2 = ratio.clamp(1.0 - clip, 1.0 + clip) * adv[r];
        let h: f64 = -ls.iter().map(|l| l.exp() * l).sum::<f64>();
        loss += -s1.min(s2) - entropy_coef * h;
        entropy += h;
        // d(loss_r)/d(log pi(a)): -r A where the unclipped term is the minimum, else 0.
        let g_logp = if s1 <= s2 { -s1 } else { 0.0 };
        if s1 > s2 {
            clipped += 1;
        }
        let dz = &mut d_out[r * k..(r + 1) * k];
        for j in 0..k {
            let p = ls[j].exp();
            let dlogp = if j == a { 1.0 - p } else { -p };
            // dH/dz_j = -p_j (log p_j + H).
            let dh = -p * (ls[j] + h);
            dz[j] = inv * (g_logp * dlogp - entropy_coef * dh);
        }
    }
    net.backward_with(params, &cache, &d_out, grad);
    PolicyLoss {
        loss: loss * inv,
        entropy: entropy * inv,
        clipped,
    }
}

/// `mean(0.5 (V(obs) - target)^2)`; adds its gradient to `grad`.
pub(crate) fn value_loss_grad(net: &DenseNet, params: &[f64], obs: &[f64], target: &[f64], grad: &mut [f64]) -> f64 {
    let m = target.len();
    let cache = net.forward_with(params, obs, m);
    let inv = 1.0 / m as f64;
    let mut loss = 0.0;
    let d_out: Vec<f64> = cache
        .output()
        .iter()
        .zip(target)
        .map(|(v, t)| {
            loss += 0.5 * (v - t) * (v - t);
            inv * (v - t)
        })
        .collect();
    net.backward_with(params, &cache, &d_out, grad);
    loss * inv
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Registry;
    use crate::policy::{ActionsMut, ExplorationType};
    use crate::rollout::{Rollout, RolloutConfig, TrajIds};

    fn tiny() -> DenseNet {
        let cfg = PolicyConfig::Mlp { hidden: vec![4, 3] };
        DenseNet::new(&[3, 4, 3, 3], |i| layer_names(&cfg, i), 7).unwrap()
    }

    fn fd_check(analytic: &[f64], params: &[f64], loss: impl Fn(&[f64]) -> f64) {
        let eps = 1e-6;
        let mut p = params.to_vec();
        for i in 0..p.len() {
            let x = p[i];
            p[i] = x + eps;
            let up = loss(&p);
            p[i] = x - eps;
            let down = loss(&p);
            p[i] = x;
            let numeric = (up - down) / (2.0 * eps);
            let tol = 1e-6 + 1e-5 * numeric.abs().max(analytic[i].abs());
            assert!(
                (numeric - analytic[i]).abs() < tol,
                "parameter {i}: analytic {} vs numeric {numeric}",
                analytic[i]
            );
        }
    }

    /// The hand-written gradients of both losses against central finite differences,
    /// with ratios inside and outside the clip range and an entropy bonus.
    #[test]
    fn gradients_match_finite_differences() {
        let net = tiny();
        let obs = [0.5, -1.0, 0.3, -0.2, 0.8, 1.5, 1.0, 0.1, -0.7, -0.4, -0.6, 0.9];
        let actions = [0, 2, 1, 2];
        // Old log-probs chosen so that some ratios fall far outside [0.8, 1.2].
        let old_logp = [-1.1, -0.2, -3.0, -1.0];
        let adv = [1.0, -0.5, 2.0, -1.5];
        let loss = |p: &[f64]| {
            let mut g = vec![0.0; net.len()];
            policy_loss_grad(&net, p, &obs, &actions, &old_logp, &adv, 0.2, 0.01, &mut g).loss
        };
        let mut grad = vec![0.0; net.len()];
        let out = policy_loss_grad(&net, &net.params, &obs, &actions, &old_logp, &adv, 0.2, 0.01, &mut grad);
        assert!(
            out.clipped > 0 && out.clipped < 4,
            "exercise both branches: {}",
            out.clipped
        );
        assert!(grad.iter().any(|g| g.abs() > 1e-4));
        fd_check(&grad, &net.params, loss);

        let vnet = DenseNet::new(&[3, 5, 1], |i| (format!("v{i}w"), format!("v{i}b")), 3).unwrap();
        let target = [1.0, -2.0, 0.5, 3.0];
        let mut vgrad = vec![0.0; vnet.len()];
        value_loss_grad(&vnet, &vnet.params, &obs, &target, &mut vgrad);
        fd_check(&vgrad, &vnet.params, |p| {
            let mut g = vec![0.0; vnet.len()];
            value_loss_grad(&vnet, p, &obs, &target, &mut g)
        });
    }

    #[test]
    fn linear_policy_gradient_matches_finite_differences() {
        let net = DenseNet::new(&[2, 3], |i| layer_names(&PolicyConfig::Linear, i), 1).unwrap();
        let obs = [1.0, -2.0, 0.5, 0.25];
        let (actions, old_logp, adv) = ([2, 0], [-1.0, -1.2], [0.7, -0.3]);
        let mut grad = vec![0.0; net.len()];
        policy_loss_grad(&net, &net.params, &obs, &actions, &old_logp, &adv, 10.0, 0.0, &mut grad);
        fd_check(&grad, &net.params, |p| {
            let mut g = vec![0.0; net.len()];
            policy_loss_grad(&net, p, &obs, &actions, &old_logp, &adv, 10.0, 0.0, &mut g).loss
        });
    }

    #[test]
    fn config_and_spec_errors() {
        let obs = Spec::uniform_box(4, -1.0, 1.0);
        let d = Spec::Discrete { n: 2 };
        let mlp = PolicySpec::from(PolicyConfig::Mlp { hidden: vec![8] });
        let bad = PpoConfig {
            epochs: 0,
            ..PpoConfig::default()
        };
        assert!(matches!(Ppo::new(&obs, &d, &mlp, bad), Err(LearnError::Config(m)) if m.contains("epochs")));
        let cont = Spec::uniform_box(1, -1.0, 1.0);
        assert!(matches!(
            Ppo::new(&obs, &cont, &mlp, PpoConfig::default()),
            Err(LearnError::Unsupported(_))
        ));
        assert!(matches!(
            Ppo::new(&obs, &d, &PolicySpec::from(PolicyConfig::Random), PpoConfig::default()),
            Err(LearnError::Unsupported(_))
        ));
    }

    /// Starts from the nodes' weights, produces weights of the same layout, and on a
    /// real CartPole batch makes the actions it saw with positive advantage likelier.
    #[test]
    fn update_keeps_the_layout_and_is_deterministic() {
        let reg = Registry::with_builtins();
        let env = reg.make(&"CartPole-v1".into()).unwrap();
        let (o, a) = (env.observation_spec().clone(), env.action_spec().clone());
        let spec = PolicySpec {
            config: PolicyConfig::Mlp { hidden: vec![8] },
            exploration: ExplorationType::Random,
            init_seed: 3,
            record: true,
        };
        let envs = (0..2).map(|_| reg.make(&"CartPole-v1".into()).unwrap()).collect();
        let policy = spec.build(&o, &a, 1).unwrap();
        let cfg = RolloutConfig {
            frames_per_batch: 64,
            seed: 5,
            ..RolloutConfig::default()
        };
        let ids = (0..2).map(|i| TrajIds::new(i, 2).unwrap()).collect();
        let mut r = Rollout::new(envs, policy, ids, cfg).unwrap();
        let batch = r.collect().unwrap();
        let run = || {
            let mut l = Ppo::new(&o, &a, &spec, PpoConfig::default()).unwrap();
            assert_eq!(&l.weights(), r.weights());
            let s = l.update(&batch, &[0]).unwrap();
            assert_eq!(
                (s.frames, s.unknown_behaviour),
                (64, 0),
                "frames_per_batch counts all envs"
            );
            assert_eq!(l.version(), 1);
            l.weights()
        };
        let w = run();
        assert_eq!(w.version, 1);
        r.weights().check_layout(&w).unwrap();
        assert_ne!(&w.clone().with_version(0), r.weights());
        assert_eq!(w, run(), "same seed, same update");
        // The new weights run on a policy.
        let mut p = spec.build(&o, &a, 0).unwrap();
        p.set_weights(&w).unwrap();
        let mut act = [0i64];
        p.act(&[0.0; 4], 1, ActionsMut::Discrete(&mut act)).unwrap();
    }

    /// CartPole specs, an `Mlp { hidden }` policy spec and a two-env rollout of it.
    fn cartpole(hidden: Vec<usize>) -> (Spec, Spec, PolicySpec, Rollout) {
        let reg = Registry::with_builtins();
        let env = reg.make(&"CartPole-v1".into()).unwrap();
        let (o, a) = (env.observation_spec().clone(), env.action_spec().clone());
        let spec = PolicySpec {
            config: PolicyConfig::Mlp { hidden },
            exploration: ExplorationType::Random,
            init_seed: 11,
            record: true,
        };
        let envs = (0..2).map(|_| reg.make(&"CartPole-v1".into()).unwrap()).collect();
        let policy = spec.build(&o, &a, 1).unwrap();
        let cfg = RolloutConfig {
            frames_per_batch: 64,
            seed: 9,
            ..RolloutConfig::default()
        };
        let ids = (0..2).map(|i| TrajIds::new(i, 2).unwrap()).collect();
        let r = Rollout::new(envs, policy, ids, cfg).unwrap();
        (o, a, spec, r)
    }

    /// Several minibatches per epoch, so the generator's position matters.
    fn small_cfg() -> PpoConfig {
        PpoConfig {
            epochs: 3,
            minibatch: 16,
            ..PpoConfig::default()
        }
    }

    /// Collects a batch with `l`'s current weights; the behaviour versions name the
    /// current weights for lane 0 and the previous ones for lane 1, so the weights
    /// history is read too.
    fn collect(r: &mut Rollout, l: &Ppo) -> (TensorDict, Vec<u64>) {
        r.set_weights(&l.weights()).unwrap();
        let v = l.version();
        (r.collect().unwrap(), vec![v, v.saturating_sub(1)])
    }

    fn bytes(state: &PpoState) -> Vec<u8> {
        rmp_serde::to_vec_named(state).unwrap()
    }

    /// The recorded `action_log_prob` is what the update uses: the behaviour versions
    /// do not matter then, and the update is (up to the f32 rounding of the recorded
    /// values) the one recomputing them with the right weights.
    #[test]
    fn update_uses_the_recorded_log_probs() {
        let (o, a, spec, mut r) = cartpole(vec![8]);
        let fresh = || Ppo::new(&o, &a, &spec, small_cfg()).unwrap();
        r.set_weights(&fresh().weights()).unwrap();
        let batch = r.collect().unwrap();
        assert!(batch.f32(keys::ACTION_LOG_PROB).is_ok());
        let mut without = batch.clone();
        without.remove(keys::ACTION_LOG_PROB).expect("recorded");

        let recorded = fresh().update(&batch, &[99]).unwrap();
        assert_eq!(recorded.unknown_behaviour, 0, "nothing recomputed");
        let recomputed = fresh().update(&without, &[0]).unwrap();
        assert_eq!(recomputed.unknown_behaviour, 0);
        let unknown = fresh().update(&without, &[99]).unwrap();
        assert_eq!(unknown.unknown_behaviour, batch.batch_size().iter().product::<usize>());
        for (x, y) in [
            (recorded.policy_loss, recomputed.policy_loss),
            (recorded.value_loss, recomputed.value_loss),
            (recorded.entropy, recomputed.entropy),
        ] {
            assert!(
                (x - y).abs() < 1e-4 * y.abs().max(1.0),
                "{recorded:?} vs {recomputed:?}"
            );
        }

        // A recorded value that is off changes the update.
        let mut off = batch.clone();
        if let Ok(crate::Tensor::F32(lp)) = off.get_mut(keys::ACTION_LOG_PROB) {
            lp.mapv_inplace(|v| v - 0.5);
        }
        assert_ne!(fresh().update(&off, &[0]).unwrap(), recorded);
    }

    /// Save after two updates, load into a fresh learner: the next two updates are
    /// bit for bit the original's; a fresh learner without the state drifts apart.
    #[test]
    fn restored_learner_makes_identical_updates() {
        let (o, a, spec, mut r) = cartpole(vec![32, 32]);
        let mut orig = Ppo::new(&o, &a, &spec, small_cfg()).unwrap();
        for _ in 0..2 {
            let (batch, behaviour) = collect(&mut r, &orig);
            orig.update(&batch, &behaviour).unwrap();
        }
        let saved = bytes(&orig.state());
        let state: PpoState = rmp_serde::from_slice(&saved).unwrap();
        assert_eq!(state, orig.state(), "msgpack keeps every bit");
        let mut resumed = Ppo::new(&o, &a, &spec, small_cfg()).unwrap();
        resumed.restore(state).unwrap();
        assert_eq!(resumed.version(), 2);
        assert_eq!(resumed.weights(), orig.weights());
        let mut fresh = Ppo::new(&o, &a, &spec, small_cfg()).unwrap();
        for _ in 0..2 {
            let (batch, behaviour) = collect(&mut r, &orig);
            let want = orig.update(&batch, &behaviour).unwrap();
            assert_eq!(resumed.update(&batch, &behaviour).unwrap(), want);
            fresh.update(&batch, &behaviour).unwrap();
            assert_eq!(resumed.weights(), orig.weights());
        }
        assert_eq!(bytes(&resumed.state()), bytes(&orig.state()), "f64 state identical too");
        assert_ne!(
            fresh.weights().with_version(orig.version()),
            orig.weights(),
            "without the state the updates differ"
        );
    }

    /// Each part of the state matters: a state with only the generator moved on makes
    /// different updates (so the test above would catch a generator not restored).
    #[test]
    fn the_generator_position_is_part_of_the_state() {
        let (o, a, spec, mut r) = cartpole(vec![8]);
        let mut orig = Ppo::new(&o, &a, &spec, small_cfg()).unwrap();
        let (batch, behaviour) = collect(&mut r, &orig);
        orig.update(&batch, &behaviour).unwrap();
        let mut moved = orig.state();
        let pos = (u128::from(moved.rng.word_pos_hi) << 64) | u128::from(moved.rng.word_pos_lo);
        moved.rng.word_pos_lo = (pos + 1) as u64;
        let mut other = Ppo::new(&o, &a, &spec, small_cfg()).unwrap();
        other.restore(moved).unwrap();
        assert_eq!(other.weights(), orig.weights());
        let (batch, behaviour) = collect(&mut r, &orig);
        orig.update(&batch, &behaviour).unwrap();
        other.update(&batch, &behaviour).unwrap();
        assert_ne!(other.weights(), orig.weights());
    }

    /// States that do not fit are refused with a checkpoint error, and the learner is
    /// left as it was.
    #[test]
    fn restore_rejects_states_that_do_not_fit() {
        let (o, a, spec, mut r) = cartpole(vec![32, 32]);
        let mut mlp = Ppo::new(&o, &a, &spec, small_cfg()).unwrap();
        let (batch, behaviour) = collect(&mut r, &mlp);
        mlp.update(&batch, &behaviour).unwrap();
        let linear_spec = PolicySpec {
            config: PolicyConfig::Linear,
            ..spec.clone()
        };
        let mut linear = Ppo::new(&o, &a, &linear_spec, small_cfg()).unwrap();
        let before = linear.state();
        let err = linear.restore(mlp.state()).unwrap_err();
        assert!(
            matches!(&err, LearnError::Checkpoint(m) if m.contains("policy parameters")),
            "{err}"
        );
        assert_eq!(linear.state(), before);

        let mut target = Ppo::new(&o, &a, &spec, small_cfg()).unwrap();
        let before = target.state();
        let mut truncated = mlp.state();
        truncated.rng.seed.pop();
        let err = target.restore(truncated).unwrap_err();
        assert!(
            matches!(&err, LearnError::Checkpoint(m) if m.contains("seed has 31 bytes")),
            "{err}"
        );
        // The same through msgpack, as from a file.
        let mut truncated = mlp.state();
        truncated.rng.seed.truncate(4);
        let decoded: PpoState = rmp_serde::from_slice(&bytes(&truncated)).unwrap();
        assert!(matches!(target.restore(decoded), Err(LearnError::Checkpoint(_))));

        let mut short_adam = mlp.state();
        short_adam.v_opt = Adam::new(3, 1e-3).state();
        let err = target.restore(short_adam).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "bad checkpoint: value optimiser: Adam moments of lengths 3 and 3, expected {} (one per parameter)",
                target.value.len()
            )
        );
        let mut short_history = mlp.state();
        short_history.history[0].1.pop();
        assert!(matches!(target.restore(short_history), Err(LearnError::Checkpoint(_))));
        let mut bad_version = mlp.state();
        bad_version.version = 7;
        assert!(matches!(target.restore(bad_version), Err(LearnError::Checkpoint(_))));
        let mut no_history = mlp.state();
        no_history.history.clear();
        assert!(matches!(target.restore(no_history), Err(LearnError::Checkpoint(_))));
        assert_eq!(target.state(), before, "a refused state changes nothing");
        target.restore(mlp.state()).unwrap();
        assert_eq!(target.state(), mlp.state());
    }
}
