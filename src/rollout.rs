//! The collection loop: K envs stepped by one policy into a preallocated batch.
//!
//! [`Rollout::collect`] fills exactly `frames_per_batch` frames, laid out
//! `[K, F/K]` (env first, time last, as torchrl). Trajectories carry on across
//! batches; the ids they get come from a [`TrajIds`] allocator whose lanes keep
//! them unique across envs, nodes and batches. Buffers handed back with
//! [`Rollout::recycle`] are reused, so steady-state collection allocates nothing.

use ndarray::{ArrayD, IxDyn};
use serde::{Deserialize, Serialize};

use crate::env::{Action, Env, EnvError};
use crate::policy::{ActionsMut, Policy, PolicyError, RandomPolicy, Weights};
use crate::spec::Spec;
use crate::tensor::{Tensor, TensorDict, TensorError};

/// Keys of a collected batch, torchrl's names.
pub mod keys {
    /// Observation the action was taken in, f32 `[.., D]`.
    pub const OBSERVATION: &str = "observation";
    /// Action, i64 `[..]` (discrete) or f32 `[.., A]`.
    pub const ACTION: &str = "action";
    /// Observation after the step, f32 `[.., D]`.
    pub const NEXT_OBSERVATION: &str = "next.observation";
    /// Reward of the step, f32 `[.., 1]`.
    pub const NEXT_REWARD: &str = "next.reward";
    /// `terminated || truncated`, bool `[.., 1]`.
    pub const NEXT_DONE: &str = "next.done";
    /// Terminal state reached, bool `[.., 1]`.
    pub const NEXT_TERMINATED: &str = "next.terminated";
    /// Episode cut short, bool `[.., 1]`.
    pub const NEXT_TRUNCATED: &str = "next.truncated";
    /// Trajectory id, unique across the run, i64 `[..]`.
    pub const TRAJ_IDS: &str = "collector.traj_ids";
    /// Steps taken in the trajectory before this frame, i64 `[.., 1]`.
    pub const STEP_COUNT: &str = "step_count";
    /// Real (true) or padding (false) frame, after `split_trajectories`.
    pub const MASK: &str = "collector.mask";
}

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
}

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
}

fn sized<T: Clone + Default>(mut v: Vec<T>, n: usize) -> Vec<T> {
    v.clear();
    v.resize(n, T::default());
    v
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
pub struct Rollout {
    envs: Vec<Box<dyn Env>>,
    policy: Box<dyn Policy>,
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
    ids: Vec<TrajIds>,
    frames: u64,
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
        if f % k != 0 {
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
        Ok(Rollout {
            steps: f / k,
            cur_obs: vec![0.0; k * obs_dim],
            traj_id: vec![-1; k],
            step_count: vec![0; k],
            needs_reset: vec![true; k],
            pending_seed,
            act_i: vec![0; k],
            act_f: vec![0.0; k * act_dim],
            envs,
            policy,
            random,
            config,
            discrete,
            obs_dim,
            act_dim,
            ids,
            frames: 0,
            spare: None,
        })
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
        self.policy.weights()
    }

    /// Loads new weights into the policy.
    pub fn set_weights(&mut self, weights: &Weights) -> Result<(), RolloutError> {
        Ok(self.policy.set_weights(weights)?)
    }

    /// The trajectory id allocators, one per env.
    pub fn traj_ids(&self) -> &[TrajIds] {
        &self.ids
    }

    /// Reseeds: env `k` starts a new episode seeded `seed + k` at its next step,
    /// the policy's sampling is reseeded too. Returns the next unused seed.
    pub fn set_seed(&mut self, seed: u64) -> u64 {
        let k = self.envs.len() as u64;
        for (i, s) in self.pending_seed.iter_mut().enumerate() {
            *s = Some(seed.wrapping_add(i as u64));
        }
        self.needs_reset.iter_mut().for_each(|r| *r = true);
        self.policy.reseed(seed.wrapping_add(k).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        if let Some(r) = &mut self.random {
            r.reseed(seed ^ 0x5eed_5eed_5eed_5eed);
        }
        seed.wrapping_add(k)
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
        };
        self.spare = Some(b);
    }

    fn buffers(&mut self) -> Buffers {
        let n = self.envs.len() * self.steps;
        let b = self.spare.take().unwrap_or_default();
        Buffers {
            obs: sized(b.obs, n * self.obs_dim),
            next_obs: sized(b.next_obs, n * self.obs_dim),
            action_i: if self.discrete { sized(b.action_i, n) } else { Vec::new() },
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
        }
    }

    fn reset_env(&mut self, k: usize) -> Result<(), RolloutError> {
        let d = self.obs_dim;
        let seed = self.pending_seed[k].take();
        self.envs[k]
            .reset(seed, &mut self.cur_obs[k * d..(k + 1) * d])
            .map_err(|source| RolloutError::Env { env: k, source })?;
        self.check_nan(k)?;
        self.traj_id[k] = self.ids[k].alloc();
        self.step_count[k] = 0;
        self.needs_reset[k] = false;
        Ok(())
    }

    fn check_nan(&self, k: usize) -> Result<(), RolloutError> {
        let d = self.obs_dim;
        if self.config.nan_is_failure && self.cur_obs[k * d..(k + 1) * d].iter().any(|x| x.is_nan()) {
            return Err(RolloutError::NanObservation { env: k });
        }
        Ok(())
    }

    /// Collects one batch of exactly `frames_per_batch` frames, shape `[K, F/K]`.
    pub fn collect(&mut self) -> Result<TensorDict, RolloutError> {
        self.collect_frames(self.config.frames_per_batch)
    }

    /// Collects a batch of exactly `frames` frames (a multiple of the env count), shape `[K, frames/K]`.
    pub fn collect_frames(&mut self, frames: usize) -> Result<TensorDict, RolloutError> {
        let k_envs = self.envs.len();
        if frames == 0 || frames % k_envs != 0 {
            return Err(RolloutError::Config {
                field: "frames",
                reason: format!("{frames} frames cannot be split evenly over {k_envs} envs"),
            });
        }
        self.steps = frames / k_envs;
        if self.config.reset_at_each_iter {
            self.needs_reset.iter_mut().for_each(|r| *r = true);
        }
        let mut b = self.buffers();
        let (steps, d, a) = (self.steps, self.obs_dim, self.act_dim);
        for t in 0..steps {
            for k in 0..k_envs {
                if self.needs_reset[k] {
                    self.reset_env(k)?;
                }
            }
            let random = self.frames < self.config.init_random_frames;
            let actions = if self.discrete {
                ActionsMut::Discrete(&mut self.act_i)
            } else {
                ActionsMut::Continuous(&mut self.act_f)
            };
            match (&mut self.random, random) {
                (Some(r), true) => r.act(&self.cur_obs, k_envs, actions)?,
                _ => self.policy.act(&self.cur_obs, k_envs, actions)?,
            }
            for k in 0..k_envs {
                let i = k * steps + t;
                let cur = &mut self.cur_obs[k * d..(k + 1) * d];
                b.obs[i * d..(i + 1) * d].copy_from_slice(cur);
                let action = if self.discrete {
                    b.action_i[i] = self.act_i[k];
                    Action::Discrete(self.act_i[k])
                } else {
                    let src = &self.act_f[k * a..(k + 1) * a];
                    b.action_f[i * a..(i + 1) * a].copy_from_slice(src);
                    Action::Continuous(src)
                };
                let next = &mut b.next_obs[i * d..(i + 1) * d];
                let tr = self.envs[k]
                    .step(action, next)
                    .map_err(|source| RolloutError::Env { env: k, source })?;
                cur.copy_from_slice(next);
                let sc = self.step_count[k];
                let cut = self
                    .config
                    .max_frames_per_traj
                    .is_some_and(|m| (sc + 1) as u64 >= m);
                let truncated = tr.truncated || (cut && !tr.terminated);
                b.reward[i] = tr.reward as f32;
                b.terminated[i] = tr.terminated;
                b.truncated[i] = truncated;
                b.done[i] = tr.terminated || truncated;
                b.traj_ids[i] = self.traj_id[k];
                b.step_count[i] = sc;
                self.step_count[k] = sc + 1;
                self.needs_reset[k] = tr.terminated || truncated;
                if !self.needs_reset[k] {
                    self.check_nan(k)?;
                }
            }
            self.frames += k_envs as u64;
        }
        self.into_tensordict(b)
    }

    fn into_tensordict(&self, b: Buffers) -> Result<TensorDict, RolloutError> {
        let (k, t, d, a) = (self.envs.len(), self.steps, self.obs_dim, self.act_dim);
        let bs = [k, t];
        let arr = |shape: &[usize]| IxDyn(shape);
        let e = |e: ndarray::ShapeError| TensorError::Invalid(e.to_string());
        let mut td = TensorDict::new(&bs);
        td.set(keys::OBSERVATION, ArrayD::from_shape_vec(arr(&[k, t, d]), b.obs).map_err(e)?.into())?;
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
        td.set(keys::NEXT_REWARD, ArrayD::from_shape_vec(arr(&one), b.reward).map_err(e)?.into())?;
        td.set(keys::NEXT_DONE, ArrayD::from_shape_vec(arr(&one), b.done).map_err(e)?.into())?;
        td.set(
            keys::NEXT_TERMINATED,
            ArrayD::from_shape_vec(arr(&one), b.terminated).map_err(e)?.into(),
        )?;
        td.set(
            keys::NEXT_TRUNCATED,
            ArrayD::from_shape_vec(arr(&one), b.truncated).map_err(e)?.into(),
        )?;
        td.set(keys::TRAJ_IDS, ArrayD::from_shape_vec(arr(&[k, t]), b.traj_ids).map_err(e)?.into())?;
        td.set(keys::STEP_COUNT, ArrayD::from_shape_vec(arr(&one), b.step_count).map_err(e)?.into())?;
        Ok(td)
    }
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
