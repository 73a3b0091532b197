//! `Pendulum-v1`: gymnasium's inverted pendulum swing-up with its 200-step time limit.
//!
//! The dynamics replicate `gymnasium/envs/classic_control/pendulum.py` (gymnasium 1.x
//! under NumPy 2). The state is f64 but the action is f32, and NEP 50 promotion makes
//! some intermediate operations f32: `u ** 2`, `0.001 * u**2` and `3.0 * u` are computed
//! in f32 before being widened. NumPy evaluates scalar `x ** 2` with libm's `pow`
//! (not `x * x`; the two differ in the last bit for about one value in 1700), so the
//! squares here call `pow`/`powf` too: rewards match gymnasium's bit for bit.

use std::f64::consts::PI;
use std::hint::black_box;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{check_obs_len, Action, Env, EnvError, EnvSnapshot, Transition};
use crate::rng::RngState;
use crate::spec::Spec;

const MAX_SPEED: f64 = 8.0;
const MAX_TORQUE: f32 = 2.0;
const DT: f64 = 0.05;
const G: f64 = 10.0;
const M: f64 = 1.0;
const L: f64 = 1.0;

/// Serde config of [`Pendulum`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PendulumConfig {
    /// Time limit: the step that reaches this count is truncated (gymnasium: 200).
    pub max_episode_steps: u64,
}

impl Default for PendulumConfig {
    fn default() -> Self {
        PendulumConfig { max_episode_steps: 200 }
    }
}

/// gymnasium's `Pendulum-v1`: apply a torque in `[-2, 2]` to swing a pendulum up.
///
/// Observation `[cos θ, sin θ, θ̇]` (f32); reward `-(θ² + 0.1 θ̇² + 0.001 u²)` with θ
/// normalized to `[-π, π)`; never terminates, truncated at `max_episode_steps`.
/// The torque is clipped to `[-2, 2]`; a NaN torque is an error.
#[derive(Clone, Debug)]
pub struct Pendulum {
    observation_spec: Spec,
    action_spec: Spec,
    max_episode_steps: u64,
    rng: ChaCha8Rng,
    /// `[theta, theta_dot]`.
    state: [f64; 2],
    elapsed: u64,
    needs_reset: bool,
}

/// libm `pow(x, 2.0)`, as NumPy computes `np.float64 ** 2` (the exponent is hidden
/// from the optimizer so that it is not rewritten to `x * x`).
#[inline]
fn pow2(x: f64) -> f64 {
    x.powf(black_box(2.0))
}

/// libm `powf(x, 2.0f)`, as NumPy computes `np.float32 ** 2`.
#[inline]
fn pow2f(x: f32) -> f32 {
    x.powf(black_box(2.0))
}

/// NumPy's float64 `%` (Python semantics: the result has the divisor's sign).
#[inline]
fn py_mod(a: f64, b: f64) -> f64 {
    let m = a % b;
    if m != 0.0 {
        if (b < 0.0) != (m < 0.0) {
            m + b
        } else {
            m
        }
    } else {
        0.0f64.copysign(b)
    }
}

/// gymnasium's `angle_normalize`: `((x + π) % 2π) - π`.
#[inline]
fn angle_normalize(x: f64) -> f64 {
    py_mod(x + PI, 2.0 * PI) - PI
}

impl Pendulum {
    /// Registered name.
    pub const NAME: &'static str = "Pendulum-v1";

    /// Builds the env; a fresh env's generator is seeded with 0.
    pub fn new(config: PendulumConfig) -> Result<Self, EnvError> {
        if config.max_episode_steps < 1 {
            return Err(EnvError::Config {
                env: Self::NAME.to_string(),
                reason: "max_episode_steps must be >= 1".to_string(),
            });
        }
        Ok(Pendulum {
            observation_spec: Spec::Box {
                low: vec![-1.0, -1.0, -(MAX_SPEED as f32)],
                high: vec![1.0, 1.0, MAX_SPEED as f32],
            },
            action_spec: Spec::uniform_box(1, -MAX_TORQUE, MAX_TORQUE),
            max_episode_steps: config.max_episode_steps,
            rng: ChaCha8Rng::seed_from_u64(0),
            state: [0.0; 2],
            elapsed: 0,
            needs_reset: true,
        })
    }

    #[inline]
    fn write_obs(&self, obs: &mut [f32]) {
        let [theta, theta_dot] = self.state;
        obs[0] = theta.cos() as f32;
        obs[1] = theta.sin() as f32;
        obs[2] = theta_dot as f32;
    }
}

impl Env for Pendulum {
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
        check_obs_len(obs, 3)?;
        if let Some(seed) = seed {
            self.rng = ChaCha8Rng::seed_from_u64(seed);
        }
        self.state = [self.rng.random_range(-PI..PI), self.rng.random_range(-1.0..1.0)];
        self.elapsed = 0;
        self.needs_reset = false;
        self.write_obs(obs);
        Ok(())
    }

    #[inline]
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        check_obs_len(obs, 3)?;
        let a = action.continuous(&self.action_spec)?;
        if self.needs_reset {
            return Err(EnvError::NeedsReset("before reset or after the episode ended"));
        }

        let [th, thdot] = self.state;
        // np.clip of an f32 array by Python floats stays f32.
        let u: f32 = a[0].clamp(-MAX_TORQUE, MAX_TORQUE);
        // f64 terms, then `0.001 * (u ** 2)` in f32 (NEP 50), widened by the f64 sum.
        let costs = pow2(angle_normalize(th)) + 0.1 * pow2(thdot) + f64::from(0.001f32 * pow2f(u));
        // `3.0 / (m * l**2) * u` is f32; `3 * g / (2 * l) * sin(th)` is f64.
        let newthdot = thdot + (3.0 * G / (2.0 * L) * th.sin() + f64::from((3.0 / (M * L * L)) as f32 * u)) * DT;
        let newthdot = newthdot.clamp(-MAX_SPEED, MAX_SPEED);
        let newth = th + newthdot * DT;
        self.state = [newth, newthdot];

        self.elapsed += 1;
        let truncated = self.elapsed >= self.max_episode_steps;
        self.needs_reset = truncated;
        self.write_obs(obs);
        Ok(Transition {
            reward: -costs,
            terminated: false,
            truncated,
        })
    }

    fn state(&self) -> Vec<f64> {
        self.state.to_vec()
    }

    /// Sets `[theta, theta_dot]`; the env can step afterwards.
    fn set_state(&mut self, state: &[f64]) -> Result<(), EnvError> {
        let s: [f64; 2] = state
            .try_into()
            .map_err(|_| EnvError::State(format!("Pendulum state has 2 values, got {}", state.len())))?;
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

    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        Ok(EnvSnapshot {
            state: self.state.to_vec(),
            elapsed_steps: self.elapsed,
            needs_reset: self.needs_reset,
            rng: Some(RngState::of(&self.rng)),
        })
    }

    fn restore(&mut self, s: &EnvSnapshot) -> Result<(), EnvError> {
        s.check(Self::NAME, 2)?;
        let rng = s.rng(Self::NAME)?;
        self.state.copy_from_slice(&s.state);
        self.elapsed = s.elapsed_steps;
        self.needs_reset = s.needs_reset;
        self.rng = rng;
        Ok(())
    }

    fn builtin(&self) -> Option<super::BuiltinEnv<'_>> {
        Some(super::BuiltinEnv::Pendulum(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SpecError;

    fn episode(env: &mut Pendulum, seed: u64) -> Vec<([f32; 3], f64)> {
        let mut obs = [0.0f32; 3];
        env.reset(Some(seed), &mut obs).unwrap();
        let mut out = vec![(obs, 0.0)];
        for i in 0.. {
            let u = [((i % 9) as f32 - 4.0) * 0.7];
            let t = env.step(Action::Continuous(&u), &mut obs).unwrap();
            out.push((obs, t.reward));
            if t.done() {
                assert!(t.truncated && !t.terminated);
                break;
            }
        }
        out
    }

    #[test]
    fn same_seed_same_episode_and_different_seeds_differ() {
        let mut a = Pendulum::new(PendulumConfig::default()).unwrap();
        let mut b = Pendulum::new(PendulumConfig::default()).unwrap();
        let ea = episode(&mut a, 11);
        assert_eq!(ea.len(), 201);
        assert_eq!(ea, episode(&mut b, 11));
        assert_ne!(ea, episode(&mut b, 12));
        let mut obs = [0.0; 3];
        a.reset(None, &mut obs).unwrap();
        assert!(obs[2].abs() <= 1.0);
        assert!((obs[0] * obs[0] + obs[1] * obs[1] - 1.0).abs() < 1e-5);
    }

    #[test]
    fn needs_reset_after_truncation() {
        let mut env = Pendulum::new(PendulumConfig { max_episode_steps: 2 }).unwrap();
        let mut obs = [0.0; 3];
        assert!(matches!(
            env.step(Action::Continuous(&[0.0]), &mut obs),
            Err(EnvError::NeedsReset(_))
        ));
        env.reset(Some(0), &mut obs).unwrap();
        assert!(!env.step(Action::Continuous(&[0.0]), &mut obs).unwrap().done());
        assert!(env.step(Action::Continuous(&[0.0]), &mut obs).unwrap().truncated);
        assert!(matches!(
            env.step(Action::Continuous(&[0.0]), &mut obs),
            Err(EnvError::NeedsReset(_))
        ));
    }

    #[test]
    fn bad_actions() {
        let mut env = Pendulum::new(PendulumConfig::default()).unwrap();
        let mut obs = [0.0; 3];
        env.reset(Some(0), &mut obs).unwrap();
        assert!(matches!(
            env.step(Action::Discrete(0), &mut obs),
            Err(EnvError::Action(SpecError::Kind { .. }))
        ));
        assert!(matches!(
            env.step(Action::Continuous(&[f32::NAN]), &mut obs),
            Err(EnvError::Action(SpecError::NaN { index: 0 }))
        ));
        assert!(matches!(
            env.step(Action::Continuous(&[0.0, 1.0]), &mut obs),
            Err(EnvError::Action(SpecError::Length { expected: 1, got: 2 }))
        ));
        assert!(matches!(
            env.step(Action::Continuous(&[]), &mut obs),
            Err(EnvError::Action(SpecError::Length { expected: 1, got: 0 }))
        ));
        assert!(env.step(Action::Continuous(&[0.0]), &mut [0.0; 2]).is_err());
        assert!(env.set_state(&[0.0]).is_err());
    }

    #[test]
    fn out_of_range_torque_is_clipped() {
        let mut a = Pendulum::new(PendulumConfig::default()).unwrap();
        let mut b = Pendulum::new(PendulumConfig::default()).unwrap();
        let (mut o1, mut o2) = ([0.0; 3], [0.0; 3]);
        a.reset(Some(4), &mut o1).unwrap();
        b.reset(Some(4), &mut o2).unwrap();
        let t1 = a.step(Action::Continuous(&[5.0]), &mut o1).unwrap();
        let t2 = b.step(Action::Continuous(&[2.0]), &mut o2).unwrap();
        assert_eq!((o1, t1), (o2, t2));
    }

    #[test]
    fn reward_matches_hand_computation() {
        let mut env = Pendulum::new(PendulumConfig::default()).unwrap();
        let mut obs = [0.0; 3];
        env.reset(Some(0), &mut obs).unwrap();
        env.set_state(&[PI, 0.0]).unwrap();
        let t = env.step(Action::Continuous(&[0.0]), &mut obs).unwrap();
        // angle_normalize(π) = -π.
        assert_eq!(t.reward, -pow2(PI));
        assert_eq!(angle_normalize(2.0 * PI), 0.0);
        assert_eq!(angle_normalize(-0.5), -0.5);
    }

    #[test]
    fn bad_config_names_the_field() {
        let err = Pendulum::new(PendulumConfig { max_episode_steps: 0 }).unwrap_err();
        assert!(matches!(&err, EnvError::Config { env, reason }
            if env == "Pendulum-v1" && reason.contains("max_episode_steps")));
        let err =
            super::super::parse_config::<PendulumConfig>(Pendulum::NAME, &serde_json::json!({"g": 9.8})).unwrap_err();
        assert!(err.to_string().contains("`g`"));
    }
}
