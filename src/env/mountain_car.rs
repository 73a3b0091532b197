//! `MountainCarContinuous-v0`: gymnasium's continuous mountain car with its 999-step time limit.
//!
//! The dynamics replicate `gymnasium/envs/classic_control/continuous_mountain_car.py`
//! (gymnasium 1.x under NumPy 2), including its mixed precision:
//!
//! * the state right after `reset` is an f64 array; every `step` stores it as f32;
//! * Python's `min`/`max` clip the force, so an in-range force stays an `np.float32`
//!   (its product with `power` and the velocity update then run in f32 under NEP 50)
//!   while a clipped force is the Python float `±1.0` (f64 arithmetic);
//! * comparisons of an `np.float32` with a Python float happen in f32;
//! * the reward uses the *unclipped* action: `-0.1 * a²` (plus 100 at the goal).
//!
//! The env tracks whether its state is "f32" (after a step) or "f64" (after reset)
//! to pick the precision of each operation, so results match gymnasium bit for bit.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{check_obs_len, Action, Env, EnvError, EnvSnapshot, Transition};
use crate::rng::RngState;
use crate::spec::Spec;

const MIN_ACTION: f32 = -1.0;
const MAX_ACTION: f32 = 1.0;
const MIN_POSITION: f64 = -1.2;
const MAX_POSITION: f64 = 0.6;
const MAX_SPEED: f64 = 0.07;
const GOAL_POSITION: f64 = 0.45;
const POWER: f64 = 0.0015;

/// Serde config of [`MountainCarContinuous`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MountainCarContinuousConfig {
    /// Time limit: the step that reaches this count is truncated (gymnasium: 999).
    pub max_episode_steps: u64,
}

impl Default for MountainCarContinuousConfig {
    fn default() -> Self {
        MountainCarContinuousConfig { max_episode_steps: 999 }
    }
}

/// gymnasium's `MountainCarContinuous-v0`: drive an underpowered car up a hill.
///
/// Observation `[position, velocity]` (f32); the force is clipped to `[-1, 1]`; reward
/// `-0.1 a²` per step plus 100 on reaching `position >= 0.45` (terminated); truncated at
/// `max_episode_steps`. A NaN action is an error.
#[derive(Clone, Debug)]
pub struct MountainCarContinuous {
    observation_spec: Spec,
    action_spec: Spec,
    max_episode_steps: u64,
    rng: ChaCha8Rng,
    /// `[position, velocity]`, exact f32 values when `f32_state`.
    state: [f64; 2],
    /// The state is gymnasium's float32 array (after a step) rather than the float64 one of reset.
    f32_state: bool,
    elapsed: u64,
    needs_reset: bool,
}

/// `a > b` where `a` has the state's precision and `b` is a Python float.
#[inline]
fn gt(f32_state: bool, a: f64, b: f64) -> bool {
    if f32_state {
        (a as f32) > (b as f32)
    } else {
        a > b
    }
}

impl MountainCarContinuous {
    /// Registered name.
    pub const NAME: &'static str = "MountainCarContinuous-v0";

    /// Builds the env; a fresh env's generator is seeded with 0.
    pub fn new(config: MountainCarContinuousConfig) -> Result<Self, EnvError> {
        if config.max_episode_steps < 1 {
            return Err(EnvError::Config {
                env: Self::NAME.to_string(),
                reason: "max_episode_steps must be >= 1".to_string(),
            });
        }
        Ok(MountainCarContinuous {
            observation_spec: Spec::Box {
                low: vec![MIN_POSITION as f32, -MAX_SPEED as f32],
                high: vec![MAX_POSITION as f32, MAX_SPEED as f32],
            },
            action_spec: Spec::uniform_box(1, MIN_ACTION, MAX_ACTION),
            max_episode_steps: config.max_episode_steps,
            rng: ChaCha8Rng::seed_from_u64(0),
            state: [0.0; 2],
            f32_state: false,
            elapsed: 0,
            needs_reset: true,
        })
    }

    #[inline]
    fn write_obs(&self, obs: &mut [f32]) {
        obs[0] = self.state[0] as f32;
        obs[1] = self.state[1] as f32;
    }
}

impl Env for MountainCarContinuous {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn observation_spec(&self) -> &Spec {
        &self.observation_spec
    }

    fn action_spec(&self) -> &Spec {
        &self.action_spec
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        check_obs_len(obs, 2)?;
        if let Some(seed) = seed {
            self.rng = ChaCha8Rng::seed_from_u64(seed);
        }
        self.state = [self.rng.random_range(-0.6..-0.4), 0.0];
        self.f32_state = false;
        self.elapsed = 0;
        self.needs_reset = false;
        self.write_obs(obs);
        Ok(())
    }

    #[inline]
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        check_obs_len(obs, 2)?;
        let a = action.continuous(&self.action_spec)?;
        if self.needs_reset {
            return Err(EnvError::NeedsReset("before reset or after the episode ended"));
        }

        let a = a[0];
        let f32s = self.f32_state;
        let [position, velocity] = self.state;

        // `0.0025 * math.cos(3 * position)`: `3 * position` has the state's precision,
        // `math.cos` and the product are f64.
        let three_pos = if f32s {
            f64::from(3.0f32 * position as f32)
        } else {
            3.0 * position
        };
        let slope = 0.0025 * three_pos.cos();
        // `force * power - slope`: f32 when the force is the (unclipped) np.float32,
        // f64 when `min`/`max` replaced it by the Python float ±1.0.
        let clipped = !(MIN_ACTION..=MAX_ACTION).contains(&a);
        let delta = if clipped {
            let force = if a > MAX_ACTION { 1.0 } else { -1.0 };
            force * POWER - slope
        } else {
            f64::from(a * POWER as f32 - slope as f32)
        };
        // `velocity += delta` in the state's precision.
        let mut velocity = if f32s {
            f64::from(velocity as f32 + delta as f32)
        } else {
            velocity + delta
        };
        if gt(f32s, velocity, MAX_SPEED) {
            velocity = MAX_SPEED;
        } else if gt(f32s, -MAX_SPEED, velocity) {
            velocity = -MAX_SPEED;
        }
        let mut position = if f32s {
            f64::from(position as f32 + velocity as f32)
        } else {
            position + velocity
        };
        if gt(f32s, position, MAX_POSITION) {
            position = MAX_POSITION;
        } else if gt(f32s, MIN_POSITION, position) {
            position = MIN_POSITION;
        }
        let at_left_wall = if f32s {
            position as f32 == MIN_POSITION as f32
        } else {
            position == MIN_POSITION
        };
        if at_left_wall && velocity < 0.0 {
            velocity = 0.0;
        }
        let terminated = !gt(f32s, GOAL_POSITION, position) && velocity >= 0.0;
        let a = f64::from(a);
        let reward = if terminated { 100.0 } else { 0.0 } - a * a * 0.1;

        self.state = [f64::from(position as f32), f64::from(velocity as f32)];
        self.f32_state = true;
        self.elapsed += 1;
        let truncated = self.elapsed >= self.max_episode_steps;
        self.needs_reset = terminated || truncated;
        self.write_obs(obs);
        Ok(Transition {
            reward,
            terminated,
            truncated,
        })
    }

    fn state(&self) -> Vec<f64> {
        self.state.to_vec()
    }

    /// Sets `[position, velocity]`; the env can step afterwards. A state whose two values
    /// are exact f32 values is taken as gymnasium's float32 state (as after a step),
    /// any other as the float64 state of a reset.
    fn set_state(&mut self, state: &[f64]) -> Result<(), EnvError> {
        let s: [f64; 2] = state
            .try_into()
            .map_err(|_| EnvError::State(format!("MountainCarContinuous state has 2 values, got {}", state.len())))?;
        self.f32_state = s.iter().all(|&v| f64::from(v as f32) == v);
        self.state = s;
        self.needs_reset = false;
        Ok(())
    }

    fn elapsed_steps(&self) -> u64 {
        self.elapsed
    }

    fn set_elapsed_steps(&mut self, steps: u64) {
        self.elapsed = steps;
    }

    /// The state is `[position, velocity, f32_state]`, the last 1.0 when the state is
    /// gymnasium's float32 array (after a step), 0.0 when it is reset's float64 one.
    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        let [position, velocity] = self.state;
        Ok(EnvSnapshot {
            state: vec![position, velocity, if self.f32_state { 1.0 } else { 0.0 }],
            elapsed_steps: self.elapsed,
            needs_reset: self.needs_reset,
            rng: Some(RngState::of(&self.rng)),
        })
    }

    fn restore(&mut self, s: &EnvSnapshot) -> Result<(), EnvError> {
        s.check(Self::NAME, 3)?;
        let rng = s.rng(Self::NAME)?;
        let f32_state = s.state[2] == 1.0;
        if !f32_state && s.state[2] != 0.0 {
            let why = format!("{} snapshot: f32 flag is {}, expected 0 or 1", Self::NAME, s.state[2]);
            return Err(EnvError::State(why));
        }
        self.state = [s.state[0], s.state[1]];
        self.f32_state = f32_state;
        self.elapsed = s.elapsed_steps;
        self.needs_reset = s.needs_reset;
        self.rng = rng;
        Ok(())
    }

    fn builtin(&self) -> Option<super::BuiltinEnv<'_>> {
        Some(super::BuiltinEnv::MountainCar(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SpecError;

    fn env() -> MountainCarContinuous {
        MountainCarContinuous::new(MountainCarContinuousConfig::default()).unwrap()
    }

    fn rollout(env: &mut MountainCarContinuous, seed: u64, n: usize) -> Vec<([f32; 2], f64)> {
        let mut obs = [0.0f32; 2];
        env.reset(Some(seed), &mut obs).unwrap();
        let mut out = vec![(obs, 0.0)];
        for i in 0..n {
            let a = [((i % 7) as f32 - 3.0) * 0.5];
            let t = env.step(Action::Continuous(&a), &mut obs).unwrap();
            out.push((obs, t.reward));
        }
        out
    }

    #[test]
    fn same_seed_same_episode_and_different_seeds_differ() {
        let (mut a, mut b) = (env(), env());
        let ea = rollout(&mut a, 2, 50);
        assert_eq!(ea, rollout(&mut b, 2, 50));
        assert_ne!(ea, rollout(&mut b, 3, 50));
        assert!((-0.6..-0.4).contains(&ea[0].0[0]) && ea[0].0[1] == 0.0);
    }

    #[test]
    fn reaches_the_goal_and_then_needs_reset() {
        let mut env = env();
        let mut obs = [0.0; 2];
        assert!(matches!(
            env.step(Action::Continuous(&[0.0]), &mut obs),
            Err(EnvError::NeedsReset(_))
        ));
        env.reset(Some(0), &mut obs).unwrap();
        env.set_state(&[0.449, 0.05]).unwrap();
        let t = env.step(Action::Continuous(&[0.5]), &mut obs).unwrap();
        assert!(t.terminated && !t.truncated);
        assert_eq!(t.reward, 100.0 - 0.25 * 0.1);
        assert!(matches!(
            env.step(Action::Continuous(&[0.0]), &mut obs),
            Err(EnvError::NeedsReset(_))
        ));
    }

    #[test]
    fn truncates_at_the_time_limit() {
        let mut env = MountainCarContinuous::new(MountainCarContinuousConfig { max_episode_steps: 2 }).unwrap();
        let mut obs = [0.0; 2];
        env.reset(Some(0), &mut obs).unwrap();
        assert!(!env.step(Action::Continuous(&[0.0]), &mut obs).unwrap().done());
        let t = env.step(Action::Continuous(&[0.0]), &mut obs).unwrap();
        assert!(t.truncated && !t.terminated);
    }

    #[test]
    fn reward_uses_the_unclipped_action_and_the_force_is_clipped() {
        let (mut a, mut b) = (env(), env());
        let (mut o1, mut o2) = ([0.0; 2], [0.0; 2]);
        a.reset(Some(9), &mut o1).unwrap();
        b.reset(Some(9), &mut o2).unwrap();
        let t1 = a.step(Action::Continuous(&[5.0]), &mut o1).unwrap();
        let t2 = b.step(Action::Continuous(&[1.0]), &mut o2).unwrap();
        assert_eq!(o1, o2);
        assert_eq!(t1.reward, -2.5);
        assert_eq!(t2.reward, -0.1);
    }

    #[test]
    fn left_wall_stops_the_car() {
        let mut env = env();
        let mut obs = [0.0; 2];
        env.reset(Some(0), &mut obs).unwrap();
        env.set_state(&[f64::from(-1.19f32), f64::from(-0.07f32)]).unwrap();
        env.step(Action::Continuous(&[-1.0]), &mut obs).unwrap();
        assert_eq!(obs, [-1.2, 0.0]);
    }

    #[test]
    fn bad_actions() {
        let mut env = env();
        let mut obs = [0.0; 2];
        env.reset(Some(0), &mut obs).unwrap();
        assert!(matches!(
            env.step(Action::Discrete(1), &mut obs),
            Err(EnvError::Action(SpecError::Kind { .. }))
        ));
        assert!(matches!(
            env.step(Action::Continuous(&[f32::NAN]), &mut obs),
            Err(EnvError::Action(SpecError::NaN { index: 0 }))
        ));
        assert!(matches!(
            env.step(Action::Continuous(&[0.0, 0.0]), &mut obs),
            Err(EnvError::Action(SpecError::Length { expected: 1, got: 2 }))
        ));
        assert!(env.step(Action::Continuous(&[0.0]), &mut [0.0; 3]).is_err());
        assert!(env.set_state(&[0.0; 3]).is_err());
    }

    #[test]
    fn bad_config_names_the_field() {
        let err = MountainCarContinuous::new(MountainCarContinuousConfig { max_episode_steps: 0 }).unwrap_err();
        assert!(matches!(&err, EnvError::Config { reason, .. } if reason.contains("max_episode_steps")));
        let err = super::super::parse_config::<MountainCarContinuousConfig>(
            MountainCarContinuous::NAME,
            &serde_json::json!({"max_episode_steps": -1}),
        )
        .unwrap_err();
        assert!(matches!(err, EnvError::Config { .. }));
    }
}
