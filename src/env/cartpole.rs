//! `CartPole-v1`: gymnasium's cart-pole with its 500-step time limit.
//!
//! The dynamics replicate `gymnasium/envs/classic_control/cartpole.py` (gymnasium 1.x)
//! operation by operation in f64, so states, observations and rewards match bit for bit.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{check_obs_len, Action, Env, EnvError, EnvSnapshot, Transition};
use crate::rng::RngState;
use crate::spec::Spec;

const GRAVITY: f64 = 9.8;
const MASSCART: f64 = 1.0;
const MASSPOLE: f64 = 0.1;
const TOTAL_MASS: f64 = MASSPOLE + MASSCART;
const LENGTH: f64 = 0.5;
const POLEMASS_LENGTH: f64 = MASSPOLE * LENGTH;
const FORCE_MAG: f64 = 10.0;
const TAU: f64 = 0.02;
const THETA_THRESHOLD_RADIANS: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
const X_THRESHOLD: f64 = 2.4;
const RESET_BOUND: f64 = 0.05;

/// Serde config of [`CartPole`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CartPoleConfig {
    /// Time limit: the step that reaches this count is truncated (gymnasium: 500).
    pub max_episode_steps: u64,
}

impl Default for CartPoleConfig {
    fn default() -> Self {
        CartPoleConfig { max_episode_steps: 500 }
    }
}

/// gymnasium's `CartPole-v1`: push a cart left (0) or right (1) to keep a pole upright.
///
/// Observation `[x, x_dot, theta, theta_dot]` (f32), reward 1 per step, terminated
/// when `|x| > 2.4` or `|theta| > 12°`, truncated at `max_episode_steps`.
#[derive(Clone, Debug)]
pub struct CartPole {
    observation_spec: Spec,
    action_spec: Spec,
    max_episode_steps: u64,
    rng: ChaCha8Rng,
    state: [f64; 4],
    elapsed: u64,
    /// True before the first reset and after the episode ended.
    needs_reset: bool,
}

impl CartPole {
    /// Registered name.
    pub const NAME: &'static str = "CartPole-v1";

    /// Builds the env; a fresh env's generator is seeded with 0.
    pub fn new(config: CartPoleConfig) -> Result<Self, EnvError> {
        if config.max_episode_steps < 1 {
            return Err(EnvError::Config {
                env: Self::NAME.to_string(),
                reason: "max_episode_steps must be >= 1".to_string(),
            });
        }
        let high = [
            (X_THRESHOLD * 2.0) as f32,
            f32::INFINITY,
            (THETA_THRESHOLD_RADIANS * 2.0) as f32,
            f32::INFINITY,
        ];
        Ok(CartPole {
            observation_spec: Spec::Box {
                low: high.iter().map(|h| -h).collect(),
                high: high.to_vec(),
            },
            action_spec: Spec::Discrete { n: 2 },
            max_episode_steps: config.max_episode_steps,
            rng: ChaCha8Rng::seed_from_u64(0),
            state: [0.0; 4],
            elapsed: 0,
            needs_reset: true,
        })
    }

    /// [`Env::step`], always inlined: the collection loop's compiled path for
    /// CartPole steps through this, so the step's stores and the loop's loads of the
    /// same observation meet in one function (the trait's `step` calls it too). Public
    /// so a hand-written loop (the collect benchmark's bare baseline) can use it.
    #[inline(always)]
    pub fn step_inline(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        check_obs_len(obs, 4)?;
        let a = action.discrete(&self.action_spec)?;
        if self.needs_reset {
            return Err(EnvError::NeedsReset("before reset or after the episode ended"));
        }

        let [x, x_dot, theta, theta_dot] = self.state;
        let force = if a == 1 { FORCE_MAG } else { -FORCE_MAG };
        let costheta = theta.cos();
        let sintheta = theta.sin();
        let temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS;
        let thetaacc = (GRAVITY * sintheta - costheta * temp)
            / (LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / TOTAL_MASS));
        let xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS;
        // Euler integration, as gymnasium's default `kinematics_integrator`.
        let x = x + TAU * x_dot;
        let x_dot = x_dot + TAU * xacc;
        let theta = theta + TAU * theta_dot;
        let theta_dot = theta_dot + TAU * thetaacc;
        self.state = [x, x_dot, theta, theta_dot];

        // gymnasium's comparisons, written out (a NaN state does not terminate, as there).
        #[allow(clippy::manual_range_contains)]
        let terminated =
            x < -X_THRESHOLD || x > X_THRESHOLD || theta < -THETA_THRESHOLD_RADIANS || theta > THETA_THRESHOLD_RADIANS;
        self.elapsed += 1;
        let truncated = self.elapsed >= self.max_episode_steps;
        self.needs_reset = terminated || truncated;
        self.write_obs(obs);
        Ok(Transition {
            reward: 1.0,
            terminated,
            truncated,
        })
    }

    #[inline]
    fn write_obs(&self, obs: &mut [f32]) {
        for (o, s) in obs.iter_mut().zip(&self.state) {
            *o = *s as f32;
        }
    }
}

impl Env for CartPole {
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
        check_obs_len(obs, 4)?;
        if let Some(seed) = seed {
            self.rng = ChaCha8Rng::seed_from_u64(seed);
        }
        for s in &mut self.state {
            *s = self.rng.random_range(-RESET_BOUND..RESET_BOUND);
        }
        self.elapsed = 0;
        self.needs_reset = false;
        self.write_obs(obs);
        Ok(())
    }

    // Out of line, as it was before `step_inline` existed: a loop calling this (the bare
    // baseline of benches/collect) compiles as it did; inlined there, it ran 8 % slower.
    #[inline(never)]
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        self.step_inline(action, obs)
    }

    fn state(&self) -> Vec<f64> {
        self.state.to_vec()
    }

    fn set_state(&mut self, state: &[f64]) -> Result<(), EnvError> {
        let s: [f64; 4] = state
            .try_into()
            .map_err(|_| EnvError::State(format!("CartPole state has 4 values, got {}", state.len())))?;
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
        s.check(Self::NAME, 4)?;
        let rng = s.rng(Self::NAME)?;
        self.state.copy_from_slice(&s.state);
        self.elapsed = s.elapsed_steps;
        self.needs_reset = s.needs_reset;
        self.rng = rng;
        Ok(())
    }

    fn builtin(&self) -> Option<super::BuiltinEnv<'_>> {
        Some(super::BuiltinEnv::CartPole(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SpecError;

    fn episode(env: &mut CartPole, seed: u64) -> Vec<[f32; 4]> {
        let mut obs = [0.0f32; 4];
        env.reset(Some(seed), &mut obs).unwrap();
        let mut out = vec![obs];
        for i in 0.. {
            let t = env.step(Action::Discrete(i % 2), &mut obs).unwrap();
            out.push(obs);
            if t.done() {
                break;
            }
        }
        out
    }

    #[test]
    fn same_seed_same_episode_and_different_seeds_differ() {
        let mut a = CartPole::new(CartPoleConfig::default()).unwrap();
        let mut b = CartPole::new(CartPoleConfig::default()).unwrap();
        assert_eq!(episode(&mut a, 7), episode(&mut b, 7));
        assert_ne!(episode(&mut a, 7), episode(&mut b, 8));
        // A fresh env is seeded with 0 and reset(None) continues the stream.
        let mut c = CartPole::new(CartPoleConfig::default()).unwrap();
        let mut d = CartPole::new(CartPoleConfig::default()).unwrap();
        let (mut o1, mut o2) = ([0.0; 4], [0.0; 4]);
        c.reset(None, &mut o1).unwrap();
        d.reset(Some(0), &mut o2).unwrap();
        assert_eq!(o1, o2);
        c.reset(None, &mut o1).unwrap();
        assert_ne!(o1, o2);
        assert!(o1.iter().all(|v| v.abs() < 0.05));
    }

    #[test]
    fn terminates_and_then_needs_reset() {
        let mut env = CartPole::new(CartPoleConfig::default()).unwrap();
        let mut obs = [0.0; 4];
        assert!(matches!(
            env.step(Action::Discrete(0), &mut obs),
            Err(EnvError::NeedsReset(_))
        ));
        env.reset(Some(3), &mut obs).unwrap();
        let mut steps = 0;
        loop {
            steps += 1;
            let t = env.step(Action::Discrete(1), &mut obs).unwrap();
            assert_eq!(t.reward, 1.0);
            if t.done() {
                assert!(t.terminated && !t.truncated);
                break;
            }
        }
        assert!(steps < 100);
        assert_eq!(env.elapsed_steps(), steps);
        assert!(matches!(
            env.step(Action::Discrete(1), &mut obs),
            Err(EnvError::NeedsReset(_))
        ));
    }

    #[test]
    fn truncates_at_the_time_limit() {
        let mut env = CartPole::new(CartPoleConfig { max_episode_steps: 3 }).unwrap();
        let mut obs = [0.0; 4];
        env.reset(Some(1), &mut obs).unwrap();
        for i in 0..3 {
            let t = env.step(Action::Discrete(i % 2), &mut obs).unwrap();
            assert_eq!(t.truncated, i == 2);
            assert!(!t.terminated);
        }
        assert!(env.step(Action::Discrete(0), &mut obs).is_err());
    }

    #[test]
    fn bad_actions_and_buffers() {
        let mut env = CartPole::new(CartPoleConfig::default()).unwrap();
        let mut obs = [0.0; 4];
        env.reset(Some(1), &mut obs).unwrap();
        for a in [-1, 2] {
            assert!(matches!(
                env.step(Action::Discrete(a), &mut obs),
                Err(EnvError::Action(SpecError::OutOfRange { .. }))
            ));
        }
        assert!(matches!(
            env.step(Action::Continuous(&[1.0]), &mut obs),
            Err(EnvError::Action(SpecError::Kind { .. }))
        ));
        let mut short = [0.0; 3];
        assert!(matches!(
            env.step(Action::Discrete(0), &mut short),
            Err(EnvError::ObservationBuffer { expected: 4, got: 3 })
        ));
        assert!(env.set_state(&[0.0; 3]).is_err());
        // The episode is still usable after rejected actions.
        env.step(Action::Discrete(0), &mut obs).unwrap();
    }

    #[test]
    fn bad_config_names_the_field() {
        let err = CartPole::new(CartPoleConfig { max_episode_steps: 0 }).unwrap_err();
        assert!(matches!(&err, EnvError::Config { reason, .. } if reason.contains("max_episode_steps")));
        let err = super::super::parse_config::<CartPoleConfig>(CartPole::NAME, &serde_json::json!({"max_steps": 3}))
            .unwrap_err();
        assert!(err.to_string().contains("max_steps"));
        let c: CartPoleConfig = super::super::parse_config(CartPole::NAME, &serde_json::json!({})).unwrap();
        assert_eq!(c.max_episode_steps, 500);
    }

    #[test]
    fn state_round_trips() {
        let mut env = CartPole::new(CartPoleConfig::default()).unwrap();
        let mut obs = [0.0; 4];
        env.reset(Some(5), &mut obs).unwrap();
        env.step(Action::Discrete(1), &mut obs).unwrap();
        let s = env.state();
        let mut other = CartPole::new(CartPoleConfig::default()).unwrap();
        other.set_state(&s).unwrap();
        other.set_elapsed_steps(env.elapsed_steps());
        let (mut o1, mut o2) = ([0.0; 4], [0.0; 4]);
        let t1 = env.step(Action::Discrete(0), &mut o1).unwrap();
        let t2 = other.step(Action::Discrete(0), &mut o2).unwrap();
        assert_eq!((o1, t1), (o2, t2));
        assert_eq!(env.state(), other.state());
    }
}
