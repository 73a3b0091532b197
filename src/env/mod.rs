//! Environments: the [`Env`] trait, the built-in envs and a [`Registry`] that builds them by name.
//!
//! An env writes observations straight into a caller-owned `&mut [f32]` so that the
//! collection loop can point it at the batch buffer: no allocation per step.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::rng::RngState;
use crate::spec::{Spec, SpecError};

mod cartpole;
mod counting;
mod mountain_car;
mod pendulum;

pub use cartpole::{CartPole, CartPoleConfig};
pub use counting::{Counting, CountingConfig};
pub use mountain_car::{MountainCarContinuous, MountainCarContinuousConfig};
pub use pendulum::{Pendulum, PendulumConfig};

/// One action for one env.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Action<'a> {
    /// A choice in `0..n` of a discrete action spec.
    Discrete(i64),
    /// A continuous vector for a box action spec.
    Continuous(&'a [f32]),
}

impl<'a> Action<'a> {
    /// The continuous values, checked against `spec` (a box: right length, no NaN).
    pub fn continuous(self, spec: &Spec) -> Result<&'a [f32], EnvError> {
        match self {
            Action::Continuous(a) => {
                spec.check_continuous(a)?;
                Ok(a)
            }
            Action::Discrete(_) => Err(SpecError::Kind {
                expected: "continuous",
                got: "discrete",
            }
            .into()),
        }
    }

    /// The discrete choice, checked against `spec` (in `0..n`).
    pub fn discrete(self, spec: &Spec) -> Result<i64, EnvError> {
        match self {
            Action::Discrete(a) => {
                spec.check_discrete(a)?;
                Ok(a)
            }
            Action::Continuous(_) => Err(SpecError::Kind {
                expected: "discrete",
                got: "continuous",
            }
            .into()),
        }
    }
}

/// What one step returned besides the observation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Transition {
    /// The reward, at the precision the env computes it.
    pub reward: f64,
    /// The episode ended in a terminal state.
    pub terminated: bool,
    /// The episode was cut short (time limit).
    pub truncated: bool,
}

impl Transition {
    /// `terminated || truncated`.
    pub fn done(&self) -> bool {
        self.terminated || self.truncated
    }
}

/// What went wrong inside or around an env.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EnvError {
    /// No env is registered under this name.
    #[error("unknown env `{name}` (known: {known})")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The registered names, comma separated.
        known: String,
    },
    /// The serde config did not parse or holds a bad value.
    #[error("bad config for env `{env}`: {reason}")]
    Config {
        /// The env's name.
        env: String,
        /// What is wrong.
        reason: String,
    },
    /// The action does not fit the action spec.
    #[error("bad action: {0}")]
    Action(#[from] SpecError),
    /// The observation buffer has the wrong length.
    #[error("observation buffer holds {got} values, the env writes {expected}")]
    ObservationBuffer {
        /// Length required.
        expected: usize,
        /// Length given.
        got: usize,
    },
    /// `set_state` was given a state of the wrong size.
    #[error("bad state: {0}")]
    State(String),
    /// `step` was called before `reset`, or after the episode ended.
    #[error("step called {0}; call reset first")]
    NeedsReset(&'static str),
    /// The env failed in a way of its own (user envs).
    #[error("env failed: {0}")]
    Failed(String),
    /// The env does not implement the checkpoint hooks.
    #[error("env `{0}` cannot be checkpointed: implement Env::snapshot and Env::restore")]
    NotCheckpointable(String),
}

/// An env's complete state for a checkpoint: restoring it into a fresh env of the same
/// config makes every later `reset` and `step` return exactly what the original's would.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnvSnapshot {
    /// Internal state, env-specific (for the built-in envs, what [`Env::state`] returns
    /// plus any hidden flag).
    pub state: Vec<f64>,
    /// Steps taken in the current episode.
    pub elapsed_steps: u64,
    /// The episode ended (or never started): `step` needs a `reset` first.
    pub needs_reset: bool,
    /// The generator `reset` draws from, for envs that have one.
    pub rng: Option<RngState>,
}

impl EnvSnapshot {
    /// Checks a snapshot for env `name` whose state has `len` values.
    pub(crate) fn check(&self, name: &str, len: usize) -> Result<(), EnvError> {
        if self.state.len() != len {
            return Err(snapshot_error(
                name,
                format!("state has {} values, expected {len}", self.state.len()),
            ));
        }
        if self.elapsed_steps == u64::MAX {
            return Err(snapshot_error(name, "elapsed step count is at its maximum"));
        }
        Ok(())
    }

    /// The generator of a snapshot for env `name`, which has one.
    pub(crate) fn rng(&self, name: &str) -> Result<ChaCha8Rng, EnvError> {
        let r = self
            .rng
            .as_ref()
            .ok_or_else(|| snapshot_error(name, "no generator state"))?;
        r.to_rng().map_err(|e| snapshot_error(name, e))
    }
}

fn snapshot_error(name: &str, why: impl fmt::Display) -> EnvError {
    EnvError::State(format!("{name} snapshot: {why}"))
}

/// A reinforcement-learning environment with gymnasium's step semantics.
///
/// `step` after an episode ended is an error: the caller resets. Time limits
/// (gymnasium's `TimeLimit`) are part of each env and show as `truncated`.
///
/// # Examples
///
/// A tiny env of your own: a walk on a line, left or right, that ends at ±3 (terminated)
/// or after 10 steps (truncated). Registered in a [`Registry`], it is built by name, the
/// way a node builds the env of its spec.
///
/// ```
/// use rollout::{Action, Env, EnvError, EnvSpec, Registry, Spec, Transition};
///
/// struct Walk {
///     x: i64,
///     steps: u64,
///     done: bool,
///     obs_spec: Spec,
///     action_spec: Spec,
/// }
///
/// impl Walk {
///     fn new() -> Walk {
///         Walk {
///             x: 0,
///             steps: 0,
///             done: true,
///             obs_spec: Spec::uniform_box(1, -3.0, 3.0),
///             action_spec: Spec::Discrete { n: 2 },
///         }
///     }
/// }
///
/// impl Env for Walk {
///     fn name(&self) -> &str {
///         "Walk"
///     }
///     fn observation_spec(&self) -> &Spec {
///         &self.obs_spec
///     }
///     fn action_spec(&self) -> &Spec {
///         &self.action_spec
///     }
///     fn reset(&mut self, _seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
///         (self.x, self.steps, self.done) = (0, 0, false);
///         obs[0] = 0.0;
///         Ok(())
///     }
///     fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
///         if self.done {
///             return Err(EnvError::NeedsReset("after the episode ended"));
///         }
///         // `discrete` checks the action against the spec (0 or 1 here).
///         self.x += if action.discrete(&self.action_spec)? == 1 { 1 } else { -1 };
///         self.steps += 1;
///         obs[0] = self.x as f32;
///         let terminated = self.x.abs() >= 3;
///         let truncated = !terminated && self.steps >= 10;
///         self.done = terminated || truncated;
///         Ok(Transition { reward: 1.0, terminated, truncated })
///     }
///     fn state(&self) -> Vec<f64> {
///         vec![self.x as f64]
///     }
///     fn set_state(&mut self, state: &[f64]) -> Result<(), EnvError> {
///         let [x] = state else {
///             return Err(EnvError::State(format!("Walk has 1 state value, got {}", state.len())));
///         };
///         self.x = *x as i64;
///         Ok(())
///     }
///     fn elapsed_steps(&self) -> u64 {
///         self.steps
///     }
///     fn set_elapsed_steps(&mut self, steps: u64) {
///         self.steps = steps;
///     }
/// }
///
/// let mut registry = Registry::with_builtins();
/// registry.register("Walk", |_config| Ok(Box::new(Walk::new())));
/// let mut env = registry.make(&EnvSpec::new("Walk"))?;
///
/// let mut obs = [0.0f32];
/// env.reset(Some(0), &mut obs)?;
/// // Always right: terminated on the third step, at x = 3.
/// let mut last = None;
/// for _ in 0..3 {
///     last = Some(env.step(Action::Discrete(1), &mut obs)?);
/// }
/// assert_eq!(obs, [3.0]);
/// assert_eq!(last, Some(Transition { reward: 1.0, terminated: true, truncated: false }));
/// // The episode is over: stepping again is an error until the next reset.
/// assert!(env.step(Action::Discrete(0), &mut obs).is_err());
/// // An action outside the spec is refused, not clamped.
/// env.reset(None, &mut obs)?;
/// assert!(matches!(env.step(Action::Discrete(2), &mut obs), Err(EnvError::Action(_))));
/// // Without `snapshot`/`restore` the env refuses to be checkpointed, naming itself.
/// assert!(matches!(env.snapshot(), Err(EnvError::NotCheckpointable(name)) if name == "Walk"));
/// # Ok::<(), EnvError>(())
/// ```
///
/// A built-in env, by name with a config (`null` for the defaults):
///
/// ```
/// use rollout::{Action, EnvSpec, Registry};
///
/// let spec = EnvSpec::new("CartPole-v1").with_config(serde_json::json!({"max_episode_steps": 5}));
/// let mut env = Registry::with_builtins().make(&spec)?;
/// let mut obs = vec![0.0f32; env.observation_spec().dim()];
/// env.reset(Some(42), &mut obs)?;
/// let mut steps = 0;
/// loop {
///     steps += 1;
///     let t = env.step(Action::Discrete(steps % 2), &mut obs)?;
///     if t.done() {
///         assert!(t.truncated, "alternating pushes keep the pole up for 5 steps");
///         break;
///     }
/// }
/// assert_eq!(steps, 5);
/// # Ok::<(), rollout::EnvError>(())
/// ```
pub trait Env: Send {
    /// The registered name, e.g. `CartPole-v1`.
    fn name(&self) -> &str;
    /// The observation space (a box; observations are f32).
    fn observation_spec(&self) -> &Spec;
    /// The action space.
    fn action_spec(&self) -> &Spec;
    /// Starts an episode and writes the first observation into `obs`.
    /// With a seed the env's random generator is reseeded first.
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError>;
    /// Applies `action` and writes the next observation into `obs`.
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError>;
    /// The internal state, widened to f64 (for parity tests and checkpoints).
    fn state(&self) -> Vec<f64>;
    /// Sets the internal state exactly (as `state` returns it) mid-episode.
    fn set_state(&mut self, state: &[f64]) -> Result<(), EnvError>;
    /// Steps taken in the current episode (what the time limit counts).
    fn elapsed_steps(&self) -> u64;
    /// Sets the elapsed step count (to replay a transition near the time limit).
    fn set_elapsed_steps(&mut self, steps: u64);
    /// Everything later `reset`s and `step`s depend on, for a checkpoint. Envs that do
    /// not implement it refuse, so that a resumed run never silently diverges.
    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        Err(EnvError::NotCheckpointable(self.name().to_string()))
    }
    /// Continues from `snapshot` (taken from an env of the same config). A snapshot that
    /// does not fit is an error and leaves the env as it was.
    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        let _ = snapshot;
        Err(EnvError::NotCheckpointable(self.name().to_string()))
    }
    /// Which built-in env this is, if it is one: the collection loop then steps a copy
    /// of it by its concrete type, with no dynamic call per step. Envs of your own keep
    /// the default, `None`, and are stepped through the trait.
    #[doc(hidden)]
    fn builtin(&self) -> Option<BuiltinEnv<'_>> {
        None
    }
}

/// A built-in env behind a trait object (see [`Env::builtin`]).
#[doc(hidden)]
pub enum BuiltinEnv<'a> {
    /// `CartPole-v1`.
    CartPole(&'a CartPole),
    /// `Pendulum-v1`.
    Pendulum(&'a Pendulum),
    /// `MountainCarContinuous-v0`.
    MountainCar(&'a MountainCarContinuous),
}

/// A boxed env is an env: the collection loop is generic over the env type, and its
/// fallback for envs of your own steps `Box<dyn Env>`.
impl<E: Env + ?Sized> Env for Box<E> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn observation_spec(&self) -> &Spec {
        (**self).observation_spec()
    }
    fn action_spec(&self) -> &Spec {
        (**self).action_spec()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        (**self).reset(seed, obs)
    }
    #[inline]
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        (**self).step(action, obs)
    }
    fn state(&self) -> Vec<f64> {
        (**self).state()
    }
    fn set_state(&mut self, state: &[f64]) -> Result<(), EnvError> {
        (**self).set_state(state)
    }
    fn elapsed_steps(&self) -> u64 {
        (**self).elapsed_steps()
    }
    fn set_elapsed_steps(&mut self, steps: u64) {
        (**self).set_elapsed_steps(steps)
    }
    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        (**self).snapshot()
    }
    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        (**self).restore(snapshot)
    }
    fn builtin(&self) -> Option<BuiltinEnv<'_>> {
        (**self).builtin()
    }
}

/// Checks that an observation buffer has the length an env writes.
pub(crate) fn check_obs_len(obs: &[f32], expected: usize) -> Result<(), EnvError> {
    if obs.len() != expected {
        return Err(EnvError::ObservationBuffer {
            expected,
            got: obs.len(),
        });
    }
    Ok(())
}

/// Parses an env's serde config; `null` means all defaults.
pub fn parse_config<T: for<'de> Deserialize<'de> + Default>(
    env: &str,
    config: &serde_json::Value,
) -> Result<T, EnvError> {
    if config.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(config.clone()).map_err(|e| EnvError::Config {
        env: env.to_string(),
        reason: e.to_string(),
    })
}

/// Which env to build: a registered name plus its serde config (`null` for defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnvSpec {
    /// Registered name, e.g. `CartPole-v1`.
    pub name: String,
    /// Env-specific config; `null` means defaults.
    #[serde(default)]
    pub config: serde_json::Value,
    /// When a multi-agent env's episode ends: once **any** agent is done (`true`, torchrl's
    /// `PettingZooWrapper(done_on_any=True)`) or once every agent is (`false`, the default).
    /// The env's `next.done`, `next.terminated` and `next.truncated` follow the same rule.
    /// An env of one agent ends alike either way. Absent on the wire: `false` (and not
    /// written when `false`); sent only to nodes of protocol version 12 or later.
    #[serde(default, skip_serializing_if = "is_false")]
    pub done_on_any: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl EnvSpec {
    /// An env by name with its default config.
    pub fn new(name: impl Into<String>) -> EnvSpec {
        EnvSpec {
            name: name.into(),
            config: serde_json::Value::Null,
            done_on_any: false,
        }
    }

    /// The same env with a config.
    pub fn with_config(mut self, config: serde_json::Value) -> EnvSpec {
        self.config = config;
        self
    }

    /// The same env, its episodes ending once any agent is done (see [`EnvSpec::done_on_any`]).
    pub fn with_done_on_any(mut self, done_on_any: bool) -> EnvSpec {
        self.done_on_any = done_on_any;
        self
    }
}

impl From<&str> for EnvSpec {
    fn from(name: &str) -> EnvSpec {
        EnvSpec::new(name)
    }
}

/// Builds an env from its config.
pub type EnvFactory = Arc<dyn Fn(&serde_json::Value) -> Result<Box<dyn Env>, EnvError> + Send + Sync>;

/// Env constructors by name. Users register their own envs here so that nodes
/// (local or remote) can build them from an [`EnvSpec`].
#[derive(Clone)]
pub struct Registry {
    factories: BTreeMap<String, EnvFactory>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.factories.keys()).finish()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::with_builtins()
    }
}

impl Registry {
    /// A registry with no env at all.
    pub fn empty() -> Registry {
        Registry {
            factories: BTreeMap::new(),
        }
    }

    /// A registry with `CartPole-v1`, `Pendulum-v1`, `MountainCarContinuous-v0` and `Counting`.
    pub fn with_builtins() -> Registry {
        let mut r = Registry::empty();
        r.register("CartPole-v1", |c| {
            Ok(Box::new(CartPole::new(parse_config(CartPole::NAME, c)?)?))
        });
        r.register("Pendulum-v1", |c| {
            Ok(Box::new(Pendulum::new(parse_config(Pendulum::NAME, c)?)?))
        });
        r.register("MountainCarContinuous-v0", |c| {
            Ok(Box::new(MountainCarContinuous::new(parse_config(
                MountainCarContinuous::NAME,
                c,
            )?)?))
        });
        r.register("Counting", |c| {
            Ok(Box::new(Counting::new(parse_config(Counting::NAME, c)?)?))
        });
        r
    }

    /// Registers (or replaces) a constructor under `name`.
    pub fn register<F>(&mut self, name: &str, factory: F)
    where
        F: Fn(&serde_json::Value) -> Result<Box<dyn Env>, EnvError> + Send + Sync + 'static,
    {
        self.factories.insert(name.to_string(), Arc::new(factory));
    }

    /// True when `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.factories.contains_key(name)
    }

    /// The registered names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.factories.keys().map(String::as_str)
    }

    /// Builds the env `spec` names.
    pub fn make(&self, spec: &EnvSpec) -> Result<Box<dyn Env>, EnvError> {
        let f = self.factories.get(&spec.name).ok_or_else(|| EnvError::Unknown {
            name: spec.name.clone(),
            known: self.names().collect::<Vec<_>>().join(", "),
        })?;
        f(&spec.config)
    }
}
