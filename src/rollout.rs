//! The collection loop: K envs stepped by one policy into a preallocated batch.
//!
//! [`Rollout::collect`] fills exactly `frames_per_batch` frames, laid out
//! `[K, F/K]` (env first, time last, as torchrl). Trajectories carry on across
//! batches; the ids they get come from a [`TrajIds`] allocator whose lanes keep
//! them unique across envs, nodes and batches. Buffers handed back with
//! [`Rollout::recycle`] are reused, so steady-state collection allocates nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ndarray::{ArrayD, IxDyn};
use serde::{Deserialize, Serialize};

use crate::env::{Action, CartPole, Env, EnvError, EnvSnapshot, MountainCarContinuous, Pendulum};
use crate::policy::{
    ActionsMut, Argmax2, Linear, Mlp, ParamsMut, Policy, PolicyError, RandomPolicy, RecordMut, Recorded, SamplerState,
    Weights,
};
use crate::spec::Spec;
use crate::tensor::{Tensor, TensorDict, TensorError};

// The batch schema lives in `crate::schema`; these names stay reachable here for
// the crates that use `rollout::rollout::{keys, BatchLayout, ..}`.
pub use crate::schema::{batch_layout, keys, layout_difference, BatchLayout};

use concrete::{EnvKind, Envs, Pol, PolicyKind};

/// What went wrong while building or running a rollout.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RolloutError {
    /// A config value is unusable; names the field.
    #[error("invalid `{field}`: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// An env failed.
    #[error("env {env} failed: {source}")]
    Env {
        /// Index of the env in this rollout.
        env: usize,
        /// The env's error.
        source: EnvError,
    },
    /// The policy failed.
    #[error("policy failed: {0}")]
    Policy(#[from] PolicyError),
    /// An observation held a NaN and the rollout treats that as a failure.
    #[error("env {env} produced a NaN observation")]
    NanObservation {
        /// Index of the env.
        env: usize,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// A [`RolloutState`] does not fit this rollout (another config, or corrupt).
    #[error("cannot restore the rollout: {0}")]
    Checkpoint(String),
    /// The stop flag given to [`Rollout::collect_frames_until`] was set: collection
    /// ended between two steps and the frames of the batch so far were dropped (not
    /// a failure: the node is shutting down).
    #[error("collection stopped between steps: the batch so far was dropped")]
    Stopped,
}

/// How many steps the collection loop takes between two looks at its stop flag
/// ([`Rollout::collect_frames_until`]): a stop is seen within this many steps, and
/// one relaxed load per this many steps keeps the hot loop's speed.
pub const STOP_CHECK_STEPS: usize = 64;

/// Allocates trajectory ids `lane, lane + lanes, lane + 2*lanes, ...`.
///
/// Each env in the whole run gets its own lane, so ids never collide across
/// envs or nodes without any coordination; `next` can be moved forward (after a
/// restart) so a new incarnation does not reuse ids either.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrajIds {
    next: u64,
    stride: u64,
}

impl TrajIds {
    /// The allocator of lane `lane` out of `lanes`.
    pub fn new(lane: u64, lanes: u64) -> Result<TrajIds, RolloutError> {
        if lanes == 0 || lane >= lanes {
            return Err(RolloutError::Config {
                field: "traj_lanes",
                reason: format!("lane {lane} is not in 0..{lanes}"),
            });
        }
        Ok(TrajIds {
            next: lane,
            stride: lanes,
        })
    }

    /// The next id to be handed out.
    pub fn peek(&self) -> u64 {
        self.next
    }

    /// The distance between two ids of this lane.
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// Hands out the next id.
    pub fn alloc(&mut self) -> i64 {
        let id = self.next;
        self.next += self.stride;
        id as i64
    }

    /// Skips ahead so that no id below `min` is handed out again.
    pub fn skip_below(&mut self, min: u64) {
        while self.next < min {
            self.next += self.stride;
        }
    }
}

/// Everything a [`Rollout`] needs to go on exactly where another one stopped: each
/// env's state and random generator, the policy's sampling generator, the episodes in
/// progress and the trajectory-id allocators. The weights travel separately.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutState {
    /// Frames collected so far.
    pub frames: u64,
    /// One entry per env, in order.
    envs: Vec<EnvState>,
    /// The policy's sampler (`None` for a policy without one).
    policy: Option<SamplerState>,
    /// The sampler of the `init_random_frames` policy, when the config has one.
    random: Option<SamplerState>,
}

impl RolloutState {
    /// The envs of the rollout this state is of.
    pub fn num_envs(&self) -> usize {
        self.envs.len()
    }
}

/// One env's part of a [`RolloutState`]: the env itself and the episode the rollout
/// is stepping in it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct EnvState {
    /// The env's name, to refuse a checkpoint of another env.
    name: String,
    env: EnvSnapshot,
    /// The observation the next action is taken in.
    obs: Vec<f32>,
    traj_id: i64,
    step_count: i64,
    needs_reset: bool,
    pending_seed: Option<u64>,
    ids: TrajIds,
}

/// Settings of one [`Rollout`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutConfig {
    /// Frames per collected batch over all envs; must be a multiple of the env count.
    pub frames_per_batch: usize,
    /// Cut trajectories longer than this (marked truncated); `None` for no limit.
    pub max_frames_per_traj: Option<u64>,
    /// Start every batch with fresh episodes.
    pub reset_at_each_iter: bool,
    /// Frames (counted over this rollout) stepped with the random policy before the real one.
    pub init_random_frames: u64,
    /// Base seed: env `k` is first reset with `seed + k`.
    pub seed: u64,
    /// Treat a NaN in an observation as a failure.
    pub nan_is_failure: bool,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            frames_per_batch: 1000,
            max_frames_per_traj: None,
            reset_at_each_iter: false,
            init_random_frames: 0,
            seed: 0,
            nan_is_failure: false,
        }
    }
}

/// The storage of one batch, reused across batches.
#[derive(Default)]
struct Buffers {
    obs: Vec<f32>,
    next_obs: Vec<f32>,
    action_i: Vec<i64>,
    action_f: Vec<f32>,
    reward: Vec<f32>,
    done: Vec<bool>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    traj_ids: Vec<i64>,
    step_count: Vec<i64>,
    /// `action_log_prob`, when the policy records it.
    log_prob: Vec<f32>,
    /// `logits` or `loc`, when the policy records them.
    param_a: Vec<f32>,
    /// `scale`, when the policy records it.
    param_b: Vec<f32>,
}

/// A buffer of exactly `n` elements. A recycled buffer of the right size is
/// returned as is: every element is overwritten by the next batch anyway.
fn sized<T: Clone + Default>(mut v: Vec<T>, n: usize) -> Vec<T> {
    if v.len() != n {
        v.clear();
        v.resize(n, T::default());
    }
    v
}

/// Copies one small row (an observation or an action). Constant lengths for the
/// common sizes let the compiler inline the copy instead of calling `memcpy`.
#[inline(always)]
fn copy_row(dst: &mut [f32], src: &[f32]) {
    match src.len() {
        1 => dst[..1].copy_from_slice(&src[..1]),
        2 => dst[..2].copy_from_slice(&src[..2]),
        3 => dst[..3].copy_from_slice(&src[..3]),
        4 => dst[..4].copy_from_slice(&src[..4]),
        _ => dst.copy_from_slice(src),
    }
}

fn take_vec<T: Clone>(t: Tensor, unwrap: fn(Tensor) -> Option<ArrayD<T>>) -> Vec<T> {
    match unwrap(t) {
        Some(a) if a.is_standard_layout() => {
            let (v, offset) = a.into_raw_vec_and_offset();
            if offset.unwrap_or(0) == 0 {
                v
            } else {
                Vec::new()
            }
        }
        _ => Vec::new(),
    }
}

/// Steps K envs with one policy and fills batches of exactly `frames_per_batch` frames.
///
/// Built-in envs and policies are stepped by their concrete type (see
/// [`concrete`](self::concrete)); envs and policies of your own through their traits.
pub struct Rollout {
    envs: Envs,
    policy: Pol,
    random: Option<RandomPolicy>,
    config: RolloutConfig,
    discrete: bool,
    obs_dim: usize,
    act_dim: usize,
    steps: usize,
    cur_obs: Vec<f32>,
    traj_id: Vec<i64>,
    step_count: Vec<i64>,
    needs_reset: Vec<bool>,
    pending_seed: Vec<Option<u64>>,
    act_i: Vec<i64>,
    act_f: Vec<f32>,
    /// What the policy records beside its actions, and the policy call's buffers for it
    /// (one row per env): log-probabilities, then logits or loc, then scale.
    recorded: Recorded,
    rec_lp: Vec<f32>,
    rec_a: Vec<f32>,
    rec_b: Vec<f32>,
    ids: Vec<TrajIds>,
    frames: u64,
    /// The largest trajectory id of the last batch, when the loop kept it as it wrote them.
    batch_max_traj_id: Option<i64>,
    spare: Option<Buffers>,
}

impl Rollout {
    /// A rollout over `envs` with `policy`. `ids[k]` hands out env `k`'s trajectory ids.
    pub fn new(
        envs: Vec<Box<dyn Env>>,
        policy: Box<dyn Policy>,
        ids: Vec<TrajIds>,
        config: RolloutConfig,
    ) -> Result<Rollout, RolloutError> {
        let k = envs.len();
        if k == 0 {
            return Err(RolloutError::Config {
                field: "envs",
                reason: "at least one env is needed".into(),
            });
        }
        if ids.len() != k {
            return Err(RolloutError::Config {
                field: "traj_lanes",
                reason: format!("{} id allocators for {k} envs", ids.len()),
            });
        }
        let f = config.frames_per_batch;
        if f == 0 {
            return Err(RolloutError::Config {
                field: "frames_per_batch",
                reason: "must be at least 1".into(),
            });
        }
        if !f.is_multiple_of(k) {
            return Err(RolloutError::Config {
                field: "frames_per_batch",
                reason: format!("{f} frames do not divide evenly over {k} envs"),
            });
        }
        if config.max_frames_per_traj == Some(0) {
            return Err(RolloutError::Config {
                field: "max_frames_per_traj",
                reason: "must be at least 1 (or unset)".into(),
            });
        }
        let obs_spec = envs[0].observation_spec().clone();
        let act_spec = envs[0].action_spec().clone();
        for (i, e) in envs.iter().enumerate() {
            if *e.observation_spec() != obs_spec || *e.action_spec() != act_spec {
                return Err(RolloutError::Config {
                    field: "envs",
                    reason: format!("env {i} ({}) has other specs than env 0 ({})", e.name(), envs[0].name()),
                });
            }
        }
        let obs_dim = match &obs_spec {
            Spec::Box { low, .. } => low.len(),
            Spec::Discrete { .. } => {
                return Err(RolloutError::Config {
                    field: "envs",
                    reason: "observations must be a box of f32".into(),
                })
            }
        };
        let discrete = act_spec.is_discrete();
        let act_dim = act_spec.dim();
        let random = if config.init_random_frames > 0 {
            Some(RandomPolicy::new(act_spec.clone(), config.seed ^ 0x5eed_5eed_5eed_5eed))
        } else {
            None
        };
        let pending_seed = (0..k).map(|i| Some(config.seed.wrapping_add(i as u64))).collect();
        let recorded = policy.recorded();
        let (lp, a, b) = record_sizes(recorded);
        Ok(Rollout {
            recorded,
            rec_lp: vec![0.0; k * lp],
            rec_a: vec![0.0; k * a],
            rec_b: vec![0.0; k * b],
            steps: f / k,
            cur_obs: vec![0.0; k * obs_dim],
            traj_id: vec![-1; k],
            step_count: vec![0; k],
            needs_reset: vec![true; k],
            pending_seed,
            act_i: vec![0; k],
            act_f: vec![0.0; k * act_dim],
            envs: Envs::new(envs),
            policy: Pol::new(policy),
            random,
            config,
            discrete,
            obs_dim,
            act_dim,
            ids,
            frames: 0,
            batch_max_traj_id: None,
            spare: None,
        })
    }

    /// The layout of every batch this rollout produces: its envs' specs' keys and
    /// what its policy records ([`Policy::recorded`]).
    pub fn batch_layout(&self) -> BatchLayout {
        let mut layout = batch_layout(self.envs.get(0).observation_spec(), self.envs.get(0).action_spec());
        self.recorded.extend_layout(&mut layout);
        layout
    }

    /// What the policy records beside its actions, in every batch.
    pub fn recorded(&self) -> Recorded {
        self.recorded
    }

    /// Its envs' observation and action spaces: what its node reports in `ready`.
    pub fn env_specs(&self) -> crate::space::EnvSpecs {
        crate::space::EnvSpecs::from_specs(self.envs.get(0).observation_spec(), self.envs.get(0).action_spec())
    }

    /// Number of envs.
    pub fn num_envs(&self) -> usize {
        self.envs.len()
    }

    /// The batch shape of every collected batch, `[K, F/K]`.
    pub fn batch_size(&self) -> [usize; 2] {
        [self.envs.len(), self.steps]
    }

    /// Frames collected so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// The config.
    pub fn config(&self) -> &RolloutConfig {
        &self.config
    }

    /// The policy's current weights.
    pub fn weights(&self) -> &Weights {
        self.policy.get().weights()
    }

    /// Loads new weights into the policy.
    pub fn set_weights(&mut self, weights: &Weights) -> Result<(), RolloutError> {
        Ok(self.policy.get_mut().set_weights(weights)?)
    }

    /// Loads weights shared with others (see [`Policy::set_shared_weights`]): what a
    /// node's workers do with the one decoded update they all receive.
    pub fn set_shared_weights(&mut self, weights: &Arc<Weights>) -> Result<(), RolloutError> {
        Ok(self.policy.get_mut().set_shared_weights(weights)?)
    }

    /// The trajectory id allocators, one per env.
    pub fn traj_ids(&self) -> &[TrajIds] {
        &self.ids
    }

    /// Moves every env's trajectory-id allocator past `min`: no id below it is handed
    /// out again (a restarted worker must not repeat ids its predecessor delivered).
    /// The trajectory in progress keeps its id; the next one gets a fresh id.
    pub fn skip_traj_ids_below(&mut self, min: u64) {
        for ids in &mut self.ids {
            ids.skip_below(min);
        }
    }

    /// Sets the count of frames collected so far, so a rollout rebuilt after a
    /// failure resumes its predecessor's count (`init_random_frames` is not redone).
    pub fn resume_frames(&mut self, frames: u64) {
        self.frames = frames;
    }

    /// Reseeds: env `k` starts a new episode seeded `seed + k` at its next step,
    /// the policy's sampling is reseeded too. Returns the next unused seed.
    pub fn set_seed(&mut self, seed: u64) -> u64 {
        let k = self.envs.len() as u64;
        for (i, s) in self.pending_seed.iter_mut().enumerate() {
            *s = Some(seed.wrapping_add(i as u64));
        }
        self.needs_reset.iter_mut().for_each(|r| *r = true);
        self.policy
            .get_mut()
            .reseed(seed.wrapping_add(k).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        if let Some(r) = &mut self.random {
            r.reseed(seed ^ 0x5eed_5eed_5eed_5eed);
        }
        seed.wrapping_add(k)
    }

    /// The rollout's state between two batches, for a checkpoint. Fails (naming it) when
    /// an env or the policy does not implement the checkpoint hooks.
    pub fn snapshot(&self) -> Result<RolloutState, RolloutError> {
        let d = self.obs_dim;
        let envs = (0..self.envs.len())
            .map(|k| (k, self.envs.get(k)))
            .map(|(k, e)| {
                Ok(EnvState {
                    name: e.name().to_string(),
                    env: e.snapshot().map_err(|source| RolloutError::Env { env: k, source })?,
                    obs: self.cur_obs[k * d..(k + 1) * d].to_vec(),
                    traj_id: self.traj_id[k],
                    step_count: self.step_count[k],
                    needs_reset: self.needs_reset[k],
                    pending_seed: self.pending_seed[k],
                    ids: self.ids[k],
                })
            })
            .collect::<Result<_, RolloutError>>()?;
        let random = match &self.random {
            Some(r) => r.sampler_state()?,
            None => None,
        };
        Ok(RolloutState {
            frames: self.frames,
            envs,
            policy: self.policy.get().sampler_state()?,
            random,
        })
    }

    /// Continues from `state` (taken from a rollout built from the same config, envs and
    /// policy): with the same weights loaded, the next batches are bit for bit the ones the
    /// snapshotted rollout would have collected. A state that does not fit is an error
    /// and leaves this rollout as it was.
    pub fn restore(&mut self, state: &RolloutState) -> Result<(), RolloutError> {
        self.check(state)?;
        let backup = self.snapshot()?;
        if let Err(e) = self.apply(state) {
            // The backup came from this very rollout: putting it back cannot fail.
            let _ = self.apply(&backup);
            return Err(e);
        }
        Ok(())
    }

    /// Checks what the rollout itself can check of an untrusted `state` (the envs and
    /// the policy check their own parts when restored).
    fn check(&self, state: &RolloutState) -> Result<(), RolloutError> {
        let bad = |why: String| Err(RolloutError::Checkpoint(why));
        let k = self.envs.len();
        if state.envs.len() != k {
            return bad(format!(
                "the checkpoint has {} envs, this rollout {k}",
                state.envs.len()
            ));
        }
        if state.frames > i64::MAX as u64 {
            return bad(format!("frame count {} is out of range", state.frames));
        }
        if state.random.is_some() != self.random.is_some() {
            return bad("the checkpoint and this rollout disagree on init_random_frames".into());
        }
        for (i, s) in state.envs.iter().enumerate() {
            let env = self.envs.get(i);
            let ids = &self.ids[i];
            if s.name != env.name() {
                return bad(format!(
                    "env {i} is `{}` in the checkpoint, `{}` here",
                    s.name,
                    env.name()
                ));
            }
            if s.obs.len() != self.obs_dim {
                return bad(format!(
                    "env {i}'s observation has {} values, expected {}",
                    s.obs.len(),
                    self.obs_dim
                ));
            }
            if s.step_count < 0 || s.step_count == i64::MAX {
                return bad(format!("env {i}'s step count {} is out of range", s.step_count));
            }
            if s.ids.stride != ids.stride || s.ids.next % ids.stride != ids.next % ids.stride {
                return bad(format!(
                    "env {i}'s trajectory ids are lane {} of {} in the checkpoint, lane {} of {} here",
                    s.ids.next % s.ids.stride.max(1),
                    s.ids.stride,
                    ids.next % ids.stride,
                    ids.stride
                ));
            }
            if s.ids.next > i64::MAX as u64 {
                return bad(format!("env {i}'s next trajectory id {} is out of range", s.ids.next));
            }
        }
        Ok(())
    }

    /// Puts a checked `state` in place; only the envs and the policies can still refuse it.
    fn apply(&mut self, state: &RolloutState) -> Result<(), RolloutError> {
        let d = self.obs_dim;
        for (k, s) in state.envs.iter().enumerate() {
            self.envs
                .get_mut(k)
                .restore(&s.env)
                .map_err(|source| RolloutError::Env { env: k, source })?;
        }
        self.policy.get_mut().set_sampler_state(state.policy.as_ref())?;
        if let Some(r) = &mut self.random {
            r.set_sampler_state(state.random.as_ref())?;
        }
        for (k, s) in state.envs.iter().enumerate() {
            self.cur_obs[k * d..(k + 1) * d].copy_from_slice(&s.obs);
            self.traj_id[k] = s.traj_id;
            self.step_count[k] = s.step_count;
            self.needs_reset[k] = s.needs_reset;
            self.pending_seed[k] = s.pending_seed;
            self.ids[k] = s.ids;
        }
        self.frames = state.frames;
        Ok(())
    }

    /// Hands a batch back so its storage is reused by the next `collect`.
    /// A batch of another layout is simply dropped.
    pub fn recycle(&mut self, batch: TensorDict) {
        if batch.batch_size() != self.batch_size() {
            return;
        }
        let mut t = batch.into_entries();
        let mut take = |k: &str| t.remove(k);
        let b = Buffers {
            obs: take(keys::OBSERVATION).map_or_else(Vec::new, |x| take_vec(x, into_f32)),
            next_obs: take(keys::NEXT_OBSERVATION).map_or_else(Vec::new, |x| take_vec(x, into_f32)),
            action_i: if self.discrete {
                take(keys::ACTION).map_or_else(Vec::new, |x| take_vec(x, into_i64))
            } else {
                Vec::new()
            },
            action_f: if self.discrete {
                Vec::new()
            } else {
                take(keys::ACTION).map_or_else(Vec::new, |x| take_vec(x, into_f32))
            },
            reward: take(keys::NEXT_REWARD).map_or_else(Vec::new, |x| take_vec(x, into_f32)),
            done: take(keys::NEXT_DONE).map_or_else(Vec::new, |x| take_vec(x, into_bool)),
            terminated: take(keys::NEXT_TERMINATED).map_or_else(Vec::new, |x| take_vec(x, into_bool)),
            truncated: take(keys::NEXT_TRUNCATED).map_or_else(Vec::new, |x| take_vec(x, into_bool)),
            traj_ids: take(keys::TRAJ_IDS).map_or_else(Vec::new, |x| take_vec(x, into_i64)),
            step_count: take(keys::STEP_COUNT).map_or_else(Vec::new, |x| take_vec(x, into_i64)),
            log_prob: take(keys::ACTION_LOG_PROB).map_or_else(Vec::new, |x| take_vec(x, into_f32)),
            param_a: take(keys::LOGITS)
                .or_else(|| take(keys::LOC))
                .map_or_else(Vec::new, |x| take_vec(x, into_f32)),
            param_b: take(keys::SCALE).map_or_else(Vec::new, |x| take_vec(x, into_f32)),
        };
        self.spare = Some(b);
    }

    fn buffers(&mut self) -> Buffers {
        let n = self.envs.len() * self.steps;
        let (lp, pa, pb) = record_sizes(self.recorded);
        let b = self.spare.take().unwrap_or_default();
        Buffers {
            obs: sized(b.obs, n * self.obs_dim),
            next_obs: sized(b.next_obs, n * self.obs_dim),
            action_i: if self.discrete {
                sized(b.action_i, n)
            } else {
                Vec::new()
            },
            action_f: if self.discrete {
                Vec::new()
            } else {
                sized(b.action_f, n * self.act_dim)
            },
            reward: sized(b.reward, n),
            done: sized(b.done, n),
            terminated: sized(b.terminated, n),
            truncated: sized(b.truncated, n),
            traj_ids: sized(b.traj_ids, n),
            step_count: sized(b.step_count, n),
            log_prob: sized(b.log_prob, n * lp),
            param_a: sized(b.param_a, n * pa),
            param_b: sized(b.param_b, n * pb),
        }
    }

    /// The largest trajectory id in the batch [`Rollout::collect_frames`] returned last,
    /// when the loop kept it while writing them (the one-env argmax loop does); `None`:
    /// not kept, read it from the batch ([`crate::schema::max_traj_id`]).
    pub fn batch_max_traj_id(&self) -> Option<i64> {
        self.batch_max_traj_id
    }

    /// Collects one batch of exactly `frames_per_batch` frames, shape `[K, F/K]`.
    pub fn collect(&mut self) -> Result<TensorDict, RolloutError> {
        self.collect_frames(self.config.frames_per_batch)
    }

    /// Collects a batch of exactly `frames` frames (a multiple of the env count), shape `[K, frames/K]`.
    pub fn collect_frames(&mut self, frames: usize) -> Result<TensorDict, RolloutError> {
        self.collect_frames_until(frames, &AtomicBool::new(false))
    }

    /// [`Rollout::collect_frames`], looking at `stop` before the first step and then
    /// every [`STOP_CHECK_STEPS`] steps: once it is set, collection ends there with
    /// [`RolloutError::Stopped`] and the frames of the batch so far are dropped (the
    /// envs keep the steps they took, as after any batch). A node shutting down sets
    /// it from another thread, so that a large batch does not hold the shutdown back.
    pub fn collect_frames_until(&mut self, frames: usize, stop: &AtomicBool) -> Result<TensorDict, RolloutError> {
        let k_envs = self.envs.len();
        if frames == 0 || !frames.is_multiple_of(k_envs) {
            return Err(RolloutError::Config {
                field: "frames",
                reason: format!("{frames} frames cannot be split evenly over {k_envs} envs"),
            });
        }
        self.steps = frames / k_envs;
        self.batch_max_traj_id = None;
        if self.config.reset_at_each_iter {
            self.needs_reset.iter_mut().for_each(|r| *r = true);
        }
        let mut b = self.buffers();
        // Compiled for each built-in env (its observation size is a constant) and
        // policy, and for one env (the env loop disappears); envs of your own are
        // specialised for common observation sizes only (0 = any size).
        let filled = match (&self.envs, &self.policy, k_envs == 1) {
            (Envs::CartPole(_), Pol::Linear(_), one) => self.fill_k::<4, CartPole, Linear>(&mut b, one, stop),
            (Envs::CartPole(_), Pol::Mlp(_), one) => self.fill_k::<4, CartPole, Mlp>(&mut b, one, stop),
            (Envs::CartPole(_), Pol::Dyn(_), one) => self.fill_k::<4, CartPole, dyn Policy>(&mut b, one, stop),
            (Envs::Pendulum(_), Pol::Linear(_), one) => self.fill_k::<3, Pendulum, Linear>(&mut b, one, stop),
            (Envs::Pendulum(_), Pol::Mlp(_), one) => self.fill_k::<3, Pendulum, Mlp>(&mut b, one, stop),
            (Envs::Pendulum(_), Pol::Dyn(_), one) => self.fill_k::<3, Pendulum, dyn Policy>(&mut b, one, stop),
            (Envs::MountainCar(_), Pol::Linear(_), one) => {
                self.fill_k::<2, MountainCarContinuous, Linear>(&mut b, one, stop)
            }
            (Envs::MountainCar(_), Pol::Mlp(_), one) => self.fill_k::<2, MountainCarContinuous, Mlp>(&mut b, one, stop),
            (Envs::MountainCar(_), Pol::Dyn(_), one) => {
                self.fill_k::<2, MountainCarContinuous, dyn Policy>(&mut b, one, stop)
            }
            (Envs::Dyn(_), _, one) => match self.obs_dim {
                1 => self.fill_k::<1, Box<dyn Env>, dyn Policy>(&mut b, one, stop),
                2 => self.fill_k::<2, Box<dyn Env>, dyn Policy>(&mut b, one, stop),
                3 => self.fill_k::<3, Box<dyn Env>, dyn Policy>(&mut b, one, stop),
                4 => self.fill_k::<4, Box<dyn Env>, dyn Policy>(&mut b, one, stop),
                _ => self.fill_k::<0, Box<dyn Env>, dyn Policy>(&mut b, one, stop),
            },
        };
        match filled {
            Ok(()) => self.to_tensordict(b),
            Err(e) => {
                self.spare = Some(b);
                Err(e)
            }
        }
    }

    /// [`Rollout::fill`] for one env (`one`) or any number.
    #[inline(always)]
    fn fill_k<const D: usize, E: EnvKind, P: PolicyKind + ?Sized>(
        &mut self,
        b: &mut Buffers,
        one: bool,
        stop: &AtomicBool,
    ) -> Result<(), RolloutError> {
        if one {
            self.fill::<D, 1, E, P>(b, stop)
        } else {
            self.fill::<D, 0, E, P>(b, stop)
        }
    }

    /// The hot loop, compiled for env type `E` and policy type `P`. Fields are borrowed
    /// apart into locals first, so the compiler keeps them in registers across the env
    /// and policy calls. `stop` is looked at every [`STOP_CHECK_STEPS`] steps.
    fn fill<const D: usize, const K: usize, E: EnvKind, P: PolicyKind + ?Sized>(
        &mut self,
        b: &mut Buffers,
        stop: &AtomicBool,
    ) -> Result<(), RolloutError> {
        let Rollout {
            envs,
            policy,
            random,
            config,
            discrete,
            obs_dim,
            act_dim,
            steps,
            cur_obs,
            traj_id,
            step_count,
            needs_reset,
            pending_seed,
            act_i,
            act_f,
            recorded,
            rec_lp,
            rec_a,
            rec_b,
            ids,
            frames,
            batch_max_traj_id,
            ..
        } = self;
        let recorded = *recorded;
        let internal = || RolloutError::Config {
            field: "buffers",
            reason: "internal: the env or policy type disagrees with the compiled loop".into(),
        };
        let envs = E::slice(envs).ok_or_else(internal)?;
        let policy = P::pick(policy).ok_or_else(internal)?;
        let d = if D == 0 { *obs_dim } else { D };
        let (a, steps, discrete) = (*act_dim, *steps, *discrete);
        let k_envs = if K == 0 { envs.len() } else { K };
        let nan_is_failure = config.nan_is_failure;
        let max_traj = config.max_frames_per_traj.unwrap_or(u64::MAX);
        let init_random = config.init_random_frames;
        let Buffers {
            obs,
            next_obs,
            action_i,
            action_f,
            reward,
            done,
            terminated,
            truncated,
            traj_ids,
            step_count: step_counts,
            log_prob,
            param_a,
            param_b,
        } = b;
        let (lp_w, pa_w, pb_w) = record_sizes(recorded);
        // Checked once here, so the compiler can drop the per-frame bounds checks.
        let n = k_envs * steps;
        let sizes_ok = obs.len() == n * d
            && next_obs.len() == n * d
            && (if discrete {
                action_i.len() == n
            } else {
                action_f.len() == n * a
            })
            && [reward.len(), traj_ids.len(), step_counts.len()]
                .iter()
                .all(|&l| l == n)
            && [done.len(), terminated.len(), truncated.len()].iter().all(|&l| l == n)
            && log_prob.len() == n * lp_w
            && param_a.len() == n * pa_w
            && param_b.len() == n * pb_w
            && rec_lp.len() == k_envs * lp_w
            && rec_a.len() == k_envs * pa_w
            && rec_b.len() == k_envs * pb_w
            && cur_obs.len() == k_envs * d
            && envs.len() == k_envs
            && [
                traj_id.len(),
                step_count.len(),
                needs_reset.len(),
                pending_seed.len(),
                ids.len(),
            ]
            .iter()
            .all(|&l| l == k_envs);
        if !sizes_ok {
            return Err(RolloutError::Config {
                field: "buffers",
                reason: "internal buffer sizes disagree with the batch shape".into(),
            });
        }
        // One env and a deterministic two-action linear policy (CartPole's argmax): the
        // observation stays in registers from the env's step to the next action. Through
        // `cur_obs` and the policy's action slice, each step waited on two stores being
        // read back, on the one dependency chain a single env's frames form.
        let argmax =
            if K == 1 && (random.is_none() || *frames >= init_random) && recorded == (Recorded::Categorical { n: 2 }) {
                policy.argmax2::<D>()
            } else {
                None
            };
        if let Some(head) = argmax {
            let env = &mut envs[0];
            let cur = &mut cur_obs[..D];
            let mut x = [0.0f32; D];
            x.copy_from_slice(cur);
            // The env's bookkeeping in locals too, written back however the batch ends.
            let (mut reset, mut tid, mut sc, mut done_frames) = (needs_reset[0], traj_id[0], step_count[0], *frames);
            let first_frame = done_frames;
            // The largest id written, kept as they are written: the node's next-id
            // bookkeeping then need not scan the batch for it.
            let mut max_tid = i64::MIN;
            let result = 'batch: {
                let mut start = 0;
                while start < steps {
                    // One look at the stop flag per chunk of steps: the loop inside is
                    // the hot loop as it was, with no test of its own.
                    if stop.load(Ordering::Relaxed) {
                        break 'batch Err(RolloutError::Stopped);
                    }
                    let end = steps.min(start + STOP_CHECK_STEPS);
                    for i in start..end {
                        if reset {
                            if let Err(source) = env.reset(pending_seed[0].take(), cur) {
                                break 'batch Err(RolloutError::Env { env: 0, source });
                            }
                            if nan_is_failure && has_nan(cur) {
                                break 'batch Err(RolloutError::NanObservation { env: 0 });
                            }
                            x.copy_from_slice(cur);
                            tid = ids[0].alloc();
                            sc = 0;
                            reset = false;
                        }
                        let (action, z0, z1) = head.logits(&x);
                        act_i[0] = action;
                        obs[i * D..(i + 1) * D].copy_from_slice(&x);
                        action_i[i] = action;
                        // The log-probabilities are computed after the loop, from these:
                        // a call to `exp` here would spill the observation off its registers.
                        param_a[2 * i] = z0;
                        param_a[2 * i + 1] = z1;
                        let tr = env.step_fast(Action::Discrete(action), &mut x);
                        // Stored, never read back in the loop: `cur_obs` is what the env wrote,
                        // as on the general path, whether or not the step failed.
                        cur.copy_from_slice(&x);
                        let tr = match tr {
                            Ok(tr) => tr,
                            Err(source) => break 'batch Err(RolloutError::Env { env: 0, source }),
                        };
                        next_obs[i * D..(i + 1) * D].copy_from_slice(&x);
                        let cut = (sc + 1) as u64 >= max_traj && !tr.terminated;
                        let trunc = tr.truncated || cut;
                        let end = tr.terminated || trunc;
                        reward[i] = tr.reward as f32;
                        terminated[i] = tr.terminated;
                        truncated[i] = trunc;
                        done[i] = end;
                        traj_ids[i] = tid;
                        max_tid = max_tid.max(tid);
                        step_counts[i] = sc;
                        sc += 1;
                        reset = end;
                        if nan_is_failure && !end && has_nan(&x) {
                            break 'batch Err(RolloutError::NanObservation { env: 0 });
                        }
                        done_frames += 1;
                    }
                    start = end;
                }
                Ok(())
            };
            (needs_reset[0], traj_id[0], step_count[0], *frames) = (reset, tid, sc, done_frames);
            let written = usize::try_from(done_frames - first_frame).unwrap_or(0).min(steps);
            Argmax2::<D>::log_probs(&param_a[..2 * written], &action_i[..written], &mut log_prob[..written]);
            *batch_max_traj_id = (result.is_ok() && steps > 0).then_some(max_tid);
            return result;
        }
        // Two logits recorded by a policy whose log-probability is theirs: the main
        // policy's log-probabilities are computed after the steps, in one vectorised
        // pass over the batch. Per step, 16 rows are two vectors whose long chain of
        // dependent operations the next env steps could not hide (BENCHMARKS.md).
        let lp_after =
            recorded == (Recorded::Categorical { n: 2 }) && lp_w == 1 && pa_w == 2 && policy.log_prob_of_two_logits();
        // The first step the main policy acted at: the random policy's frames
        // (`init_random_frames`) come first and keep their own log-probabilities.
        let mut main_from = None;
        for t in 0..steps {
            // Beside a policy call per step, one relaxed load per chunk costs nothing.
            if t % STOP_CHECK_STEPS == 0 && stop.load(Ordering::Relaxed) {
                return Err(RolloutError::Stopped);
            }
            for k in 0..k_envs {
                if needs_reset[k] {
                    let cur = &mut cur_obs[k * d..(k + 1) * d];
                    envs[k]
                        .reset(pending_seed[k].take(), cur)
                        .map_err(|source| RolloutError::Env { env: k, source })?;
                    if nan_is_failure && has_nan(cur) {
                        return Err(RolloutError::NanObservation { env: k });
                    }
                    traj_id[k] = ids[k].alloc();
                    step_count[k] = 0;
                    needs_reset[k] = false;
                }
            }
            let actions = if discrete {
                ActionsMut::Discrete(act_i)
            } else {
                ActionsMut::Continuous(act_f)
            };
            match random {
                Some(r) if *frames < init_random => {
                    // The main policy's keys, with the fill values of frames it did not act.
                    let record = RecordMut {
                        log_prob: rec_lp,
                        params: ParamsMut::None,
                    };
                    r.act_recording(cur_obs, k_envs, actions, record)?;
                    match recorded {
                        Recorded::Categorical { .. } => rec_a.fill(0.0),
                        Recorded::Normal { .. } => {
                            rec_a.fill(f32::NAN);
                            rec_b.fill(f32::NAN);
                        }
                        Recorded::None | Recorded::LogProb => {}
                    }
                }
                _ => {
                    let params = match recorded {
                        Recorded::Categorical { .. } => ParamsMut::Logits(rec_a),
                        Recorded::Normal { .. } => ParamsMut::Normal {
                            loc: rec_a,
                            scale: rec_b,
                        },
                        Recorded::None | Recorded::LogProb => ParamsMut::None,
                    };
                    let record = RecordMut {
                        log_prob: if lp_after { &mut [] } else { &mut rec_lp[..] },
                        params,
                    };
                    main_from.get_or_insert(t);
                    policy.act_fixed::<D>(cur_obs, k_envs, actions, record)?
                }
            }
            let copy_lp = lp_w == 1 && !(lp_after && main_from.is_some());
            for k in 0..k_envs {
                let i = k * steps + t;
                let cur = &mut cur_obs[k * d..(k + 1) * d];
                copy_row(&mut obs[i * d..(i + 1) * d], cur);
                let action = if discrete {
                    action_i[i] = act_i[k];
                    Action::Discrete(act_i[k])
                } else {
                    let src = &act_f[k * a..(k + 1) * a];
                    copy_row(&mut action_f[i * a..(i + 1) * a], src);
                    Action::Continuous(src)
                };
                // The env writes the next observation over the current one, which the
                // next step's policy call reads from there, and it is copied into the
                // batch after: stepping into the batch and copying it back would load
                // the row whole right after the env's narrow stores (a stalled store
                // forward, measured at about 6 % of the loop, see BENCHMARKS.md).
                let tr = match envs[k].step_fast(action, cur) {
                    Ok(tr) => tr,
                    Err(source) => return Err(RolloutError::Env { env: k, source }),
                };
                copy_row(&mut next_obs[i * d..(i + 1) * d], cur);
                if copy_lp {
                    log_prob[i] = rec_lp[k];
                }
                // Through `copy_row`: a `copy_from_slice` of a length known only at run
                // time is a call to `memmove`, 3 % of a 64-64 MLP's collection.
                if pa_w > 0 {
                    copy_row(&mut param_a[i * pa_w..(i + 1) * pa_w], &rec_a[k * pa_w..(k + 1) * pa_w]);
                }
                if pb_w > 0 {
                    copy_row(&mut param_b[i * pb_w..(i + 1) * pb_w], &rec_b[k * pb_w..(k + 1) * pb_w]);
                }
                let sc = step_count[k];
                let cut = (sc + 1) as u64 >= max_traj && !tr.terminated;
                let trunc = tr.truncated || cut;
                let end = tr.terminated || trunc;
                reward[i] = tr.reward as f32;
                terminated[i] = tr.terminated;
                truncated[i] = trunc;
                done[i] = end;
                traj_ids[i] = traj_id[k];
                step_counts[i] = sc;
                step_count[k] = sc + 1;
                needs_reset[k] = end;
                if nan_is_failure && !end && has_nan(cur) {
                    return Err(RolloutError::NanObservation { env: k });
                }
            }
            *frames += k_envs as u64;
        }
        if let (true, Some(t0)) = (lp_after, main_from) {
            if t0 == 0 {
                Argmax2::<D>::log_probs(param_a, action_i, log_prob);
            } else {
                // Each env's frames are one row of the batch: its steps from `t0` on.
                for k in 0..k_envs {
                    let (lo, hi) = (k * steps + t0, (k + 1) * steps);
                    Argmax2::<D>::log_probs(&param_a[2 * lo..2 * hi], &action_i[lo..hi], &mut log_prob[lo..hi]);
                }
            }
        }
        Ok(())
    }

    fn to_tensordict(&self, b: Buffers) -> Result<TensorDict, RolloutError> {
        let (k, t, d, a) = (self.envs.len(), self.steps, self.obs_dim, self.act_dim);
        let bs = [k, t];
        let arr = |shape: &[usize]| IxDyn(shape);
        let e = |e: ndarray::ShapeError| TensorError::Invalid(e.to_string());
        let mut td = TensorDict::new(&bs);
        td.set(
            keys::OBSERVATION,
            ArrayD::from_shape_vec(arr(&[k, t, d]), b.obs).map_err(e)?.into(),
        )?;
        td.set(
            keys::NEXT_OBSERVATION,
            ArrayD::from_shape_vec(arr(&[k, t, d]), b.next_obs).map_err(e)?.into(),
        )?;
        let action: Tensor = if self.discrete {
            ArrayD::from_shape_vec(arr(&[k, t]), b.action_i).map_err(e)?.into()
        } else {
            ArrayD::from_shape_vec(arr(&[k, t, a]), b.action_f).map_err(e)?.into()
        };
        td.set(keys::ACTION, action)?;
        let one = [k, t, 1];
        td.set(
            keys::NEXT_REWARD,
            ArrayD::from_shape_vec(arr(&one), b.reward).map_err(e)?.into(),
        )?;
        td.set(
            keys::NEXT_DONE,
            ArrayD::from_shape_vec(arr(&one), b.done).map_err(e)?.into(),
        )?;
        td.set(
            keys::NEXT_TERMINATED,
            ArrayD::from_shape_vec(arr(&one), b.terminated).map_err(e)?.into(),
        )?;
        td.set(
            keys::NEXT_TRUNCATED,
            ArrayD::from_shape_vec(arr(&one), b.truncated).map_err(e)?.into(),
        )?;
        td.set(
            keys::TRAJ_IDS,
            ArrayD::from_shape_vec(arr(&[k, t]), b.traj_ids).map_err(e)?.into(),
        )?;
        td.set(
            keys::STEP_COUNT,
            ArrayD::from_shape_vec(arr(&one), b.step_count).map_err(e)?.into(),
        )?;
        let (lp, pa, pb) = record_sizes(self.recorded);
        if lp == 1 {
            td.set(
                keys::ACTION_LOG_PROB,
                ArrayD::from_shape_vec(arr(&[k, t]), b.log_prob).map_err(e)?.into(),
            )?;
        }
        let (key_a, key_b) = match self.recorded {
            Recorded::Categorical { .. } => (keys::LOGITS, ""),
            _ => (keys::LOC, keys::SCALE),
        };
        if pa > 0 {
            td.set(
                key_a,
                ArrayD::from_shape_vec(arr(&[k, t, pa]), b.param_a).map_err(e)?.into(),
            )?;
        }
        if pb > 0 {
            td.set(
                key_b,
                ArrayD::from_shape_vec(arr(&[k, t, pb]), b.param_b).map_err(e)?.into(),
            )?;
        }
        Ok(td)
    }
}

/// Values per frame of what a policy records: log-probabilities (0 or 1), logits or
/// loc, scale.
fn record_sizes(recorded: Recorded) -> (usize, usize, usize) {
    match recorded {
        Recorded::None => (0, 0, 0),
        Recorded::LogProb => (1, 0, 0),
        Recorded::Categorical { n } => (1, n, 0),
        Recorded::Normal { d } => (1, d, d),
    }
}

fn has_nan(v: &[f32]) -> bool {
    v.iter().any(|x| x.is_nan())
}

fn into_f32(t: Tensor) -> Option<ArrayD<f32>> {
    match t {
        Tensor::F32(a) => Some(a),
        _ => None,
    }
}
fn into_i64(t: Tensor) -> Option<ArrayD<i64>> {
    match t {
        Tensor::I64(a) => Some(a),
        _ => None,
    }
}
fn into_bool(t: Tensor) -> Option<ArrayD<bool>> {
    match t {
        Tensor::Bool(a) => Some(a),
        _ => None,
    }
}

mod concrete;

#[cfg(test)]
mod checkpoint_tests;

#[cfg(test)]
mod concrete_tests;

#[cfg(test)]
mod stop_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{Counting, CountingConfig, Registry, Transition};
    use crate::policy::{Constant, PolicyConfig, PolicySpec};
    use crate::EnvSpec;

    fn counting(k: usize, lane: u64, lanes: u64, cfg: RolloutConfig) -> Rollout {
        let envs: Vec<Box<dyn Env>> = (0..k)
            .map(|_| Box::new(Counting::new(CountingConfig::default()).expect("env")) as Box<dyn Env>)
            .collect();
        let policy = Box::new(Constant::new(envs[0].action_spec(), 1.0).expect("policy"));
        let ids = (0..k as u64)
            .map(|i| TrajIds::new(lane + i, lanes).expect("ids"))
            .collect();
        Rollout::new(envs, policy, ids, cfg).expect("rollout")
    }

    fn cfg(f: usize) -> RolloutConfig {
        RolloutConfig {
            frames_per_batch: f,
            ..RolloutConfig::default()
        }
    }

    fn col_f32(td: &TensorDict, key: &str) -> Vec<f32> {
        td.f32(key).expect(key).iter().copied().collect()
    }
    fn col_i64(td: &TensorDict, key: &str) -> Vec<i64> {
        td.i64(key).expect(key).iter().copied().collect()
    }
    fn col_bool(td: &TensorDict, key: &str) -> Vec<bool> {
        td.bool(key).expect(key).iter().copied().collect()
    }

    #[test]
    fn batch_has_torchrl_keys_shapes_and_exact_frames() {
        let mut r = counting(2, 0, 2, cfg(8));
        let b = r.collect().expect("collect");
        assert_eq!(b.batch_size(), &[2, 4]);
        assert_eq!(b.numel(), 8);
        assert_eq!(b.get(keys::OBSERVATION).expect("obs").shape(), &[2, 4, 1]);
        assert_eq!(b.get(keys::NEXT_OBSERVATION).expect("next").shape(), &[2, 4, 1]);
        assert_eq!(b.get(keys::ACTION).expect("action").shape(), &[2, 4, 1]);
        for k in [keys::NEXT_REWARD, keys::STEP_COUNT] {
            assert_eq!(b.get(k).expect(k).shape(), &[2, 4, 1]);
        }
        for k in [keys::NEXT_DONE, keys::NEXT_TERMINATED, keys::NEXT_TRUNCATED] {
            assert_eq!(b.bool(k).expect(k).shape(), &[2, 4, 1]);
        }
        assert_eq!(b.i64(keys::TRAJ_IDS).expect("ids").shape(), &[2, 4]);
        assert_eq!(r.frames(), 8);
    }

    #[test]
    fn auto_reset_and_trajectories_carry_across_batches() {
        // Counting: obs 0..=5 then done (count 6 > max_steps 5); trajectory length 6.
        let mut r = counting(1, 0, 1, cfg(4));
        let b1 = r.collect().expect("b1");
        let b2 = r.collect().expect("b2");
        assert_eq!(col_f32(&b1, keys::OBSERVATION), vec![0., 1., 2., 3.]);
        assert_eq!(col_f32(&b2, keys::OBSERVATION), vec![4., 5., 0., 1.]);
        assert_eq!(col_f32(&b2, keys::NEXT_OBSERVATION), vec![5., 6., 1., 2.]);
        assert_eq!(col_bool(&b2, keys::NEXT_DONE), vec![false, true, false, false]);
        assert_eq!(col_bool(&b2, keys::NEXT_TERMINATED), vec![false, true, false, false]);
        assert_eq!(col_bool(&b2, keys::NEXT_TRUNCATED), vec![false; 4]);
        assert_eq!(col_i64(&b1, keys::TRAJ_IDS), vec![0, 0, 0, 0]);
        assert_eq!(col_i64(&b2, keys::TRAJ_IDS), vec![0, 0, 1, 1]);
        assert_eq!(col_i64(&b2, keys::STEP_COUNT), vec![4, 5, 0, 1]);
    }

    #[test]
    fn traj_ids_follow_lanes() {
        // Two envs in lanes 1 and 2 of 3: ids 1, 4, 7 ... and 2, 5, 8 ...
        let mut r = counting(2, 1, 3, cfg(28));
        let b = r.collect().expect("collect");
        let ids = col_i64(&b, keys::TRAJ_IDS);
        let (env0, env1) = ids.split_at(14);
        assert_eq!(env0, [1, 1, 1, 1, 1, 1, 4, 4, 4, 4, 4, 4, 7, 7]);
        assert_eq!(env1, [2, 2, 2, 2, 2, 2, 5, 5, 5, 5, 5, 5, 8, 8]);
        assert!(TrajIds::new(3, 3).is_err());
        let mut t = TrajIds::new(1, 3).expect("ids");
        t.skip_below(10);
        assert_eq!(t.alloc(), 10);
    }

    #[test]
    fn max_frames_per_traj_truncates() {
        let mut r = counting(
            1,
            0,
            1,
            RolloutConfig {
                max_frames_per_traj: Some(3),
                ..cfg(7)
            },
        );
        let b = r.collect().expect("collect");
        assert_eq!(col_f32(&b, keys::OBSERVATION), vec![0., 1., 2., 0., 1., 2., 0.]);
        assert_eq!(
            col_bool(&b, keys::NEXT_TRUNCATED),
            vec![false, false, true, false, false, true, false]
        );
        assert_eq!(col_bool(&b, keys::NEXT_DONE), col_bool(&b, keys::NEXT_TRUNCATED));
        assert_eq!(col_bool(&b, keys::NEXT_TERMINATED), vec![false; 7]);
        assert_eq!(col_i64(&b, keys::TRAJ_IDS), vec![0, 0, 0, 1, 1, 1, 2]);
    }

    #[test]
    fn reset_at_each_iter_starts_fresh_episodes() {
        let mut r = counting(
            1,
            0,
            1,
            RolloutConfig {
                reset_at_each_iter: true,
                ..cfg(3)
            },
        );
        r.collect().expect("b1");
        let b2 = r.collect().expect("b2");
        assert_eq!(col_f32(&b2, keys::OBSERVATION), vec![0., 1., 2.]);
        assert_eq!(col_i64(&b2, keys::TRAJ_IDS), vec![1, 1, 1]);
    }

    #[test]
    fn init_random_frames_use_the_random_policy_first() {
        let mut r = counting(
            1,
            0,
            1,
            RolloutConfig {
                init_random_frames: 50,
                ..cfg(100)
            },
        );
        let b = r.collect().expect("collect");
        let a = col_f32(&b, keys::ACTION);
        // Random samples of the box [0, 1]: almost surely none is exactly 1.0.
        assert!(a[..50].iter().all(|&x| (0.0..1.0).contains(&x)));
        assert!(a[..50].iter().filter(|&&x| x != a[0]).count() > 40);
        assert!(a[50..].iter().all(|&x| x == 1.0));
    }

    #[test]
    fn recycled_buffers_are_reused() {
        let mut r = counting(2, 0, 2, cfg(100));
        let b = r.collect().expect("b1");
        let ptr = b.f32(keys::OBSERVATION).expect("obs").as_ptr();
        r.recycle(b);
        let b2 = r.collect().expect("b2");
        assert_eq!(b2.f32(keys::OBSERVATION).expect("obs").as_ptr(), ptr);
    }

    #[test]
    fn same_seed_same_batches_and_set_seed_returns_next() {
        let reg = Registry::with_builtins();
        let make = || {
            let envs: Vec<Box<dyn Env>> = (0..2)
                .map(|_| reg.make(&EnvSpec::new("CartPole-v1")).expect("env"))
                .collect();
            let p = PolicySpec::from(PolicyConfig::Linear)
                .build(envs[0].observation_spec(), envs[0].action_spec(), 3)
                .expect("policy");
            let ids = vec![TrajIds::new(0, 2).expect("ids"), TrajIds::new(1, 2).expect("ids")];
            Rollout::new(envs, p, ids, cfg(600)).expect("rollout")
        };
        let (mut a, mut b) = (make(), make());
        assert_eq!(a.set_seed(10), 12);
        b.set_seed(10);
        assert_eq!(a.collect().expect("a"), b.collect().expect("b"));
        b.set_seed(11);
        assert_ne!(a.collect().expect("a"), b.collect().expect("b"));
    }

    #[test]
    fn bad_config_names_the_field() {
        let err = |c: RolloutConfig, k: usize| match Rollout::new(
            (0..k)
                .map(|_| Box::new(Counting::new(CountingConfig::default()).expect("env")) as Box<dyn Env>)
                .collect(),
            Box::new(Constant::new(&Spec::uniform_box(1, 0.0, 1.0), 1.0).expect("p")),
            (0..k as u64)
                .map(|i| TrajIds::new(i, k.max(1) as u64).expect("ids"))
                .collect(),
            c,
        ) {
            Err(RolloutError::Config { field, .. }) => field,
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("accepted a bad config"),
        };
        assert_eq!(err(cfg(0), 1), "frames_per_batch");
        assert_eq!(err(cfg(5), 2), "frames_per_batch");
        assert_eq!(err(cfg(4), 0), "envs");
        assert_eq!(
            err(
                RolloutConfig {
                    max_frames_per_traj: Some(0),
                    ..cfg(4)
                },
                1
            ),
            "max_frames_per_traj"
        );
        let mut r = counting(2, 0, 2, cfg(4));
        assert!(matches!(
            r.collect_frames(3),
            Err(RolloutError::Config { field: "frames", .. })
        ));
    }

    /// Emits a NaN observation on its second step.
    struct NanEnv {
        spec: Spec,
        t: u64,
    }
    impl Env for NanEnv {
        fn name(&self) -> &str {
            "Nan"
        }
        fn observation_spec(&self) -> &Spec {
            &self.spec
        }
        fn action_spec(&self) -> &Spec {
            &self.spec
        }
        fn reset(&mut self, _s: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
            self.t = 0;
            obs[0] = 0.0;
            Ok(())
        }
        fn step(&mut self, _a: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
            self.t += 1;
            obs[0] = if self.t == 2 { f32::NAN } else { 1.0 };
            Ok(Transition {
                reward: 0.0,
                terminated: false,
                truncated: false,
            })
        }
        fn state(&self) -> Vec<f64> {
            vec![]
        }
        fn set_state(&mut self, _s: &[f64]) -> Result<(), EnvError> {
            Ok(())
        }
        fn elapsed_steps(&self) -> u64 {
            self.t
        }
        fn set_elapsed_steps(&mut self, s: u64) {
            self.t = s;
        }
    }

    #[test]
    fn nan_observation_is_a_failure_only_when_asked() {
        for nan_is_failure in [false, true] {
            let spec = Spec::uniform_box(1, -1.0, 1.0);
            let env = NanEnv {
                spec: spec.clone(),
                t: 0,
            };
            let mut r = Rollout::new(
                vec![Box::new(env)],
                Box::new(Constant::new(&spec, 0.5).expect("p")),
                vec![TrajIds::new(0, 1).expect("ids")],
                RolloutConfig {
                    nan_is_failure,
                    ..cfg(4)
                },
            )
            .expect("rollout");
            let res = r.collect();
            if nan_is_failure {
                assert_eq!(res, Err(RolloutError::NanObservation { env: 0 }));
            } else {
                assert!(res.expect("collected").f32(keys::NEXT_OBSERVATION).expect("o")[[0, 1, 0]].is_nan());
            }
        }
    }
}
