//! `Counting`: a port of torchrl's `CountingEnv` test env.
//!
//! The observation is a counter that starts at 0 on reset; each step adds the action
//! to it. The reward is always 0 and the episode terminates once the count exceeds
//! `max_steps` (torchrl's `count > max_steps`). It never truncates.

use serde::{Deserialize, Serialize};

use super::{check_obs_len, Action, Env, EnvError, EnvSnapshot, Transition};
use crate::spec::Spec;

/// Serde config of [`Counting`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CountingConfig {
    /// The episode terminates on the step where the count exceeds this (torchrl: 5).
    pub max_steps: u64,
}

impl Default for CountingConfig {
    fn default() -> Self {
        CountingConfig { max_steps: 5 }
    }
}

/// torchrl's `CountingEnv`: observation `[count]`, `count += action` per step.
///
/// The action spec is the box `[0, 1]` but actions are not clipped: an action of 2
/// adds 2. Actions must have length 1 and no NaN. The env is deterministic, so the
/// seed of `reset` is ignored.
#[derive(Clone, Debug)]
pub struct Counting {
    observation_spec: Spec,
    action_spec: Spec,
    max_steps: f64,
    count: f64,
    elapsed: u64,
    needs_reset: bool,
}

impl Counting {
    /// Registered name.
    pub const NAME: &'static str = "Counting";

    /// Builds the env.
    pub fn new(config: CountingConfig) -> Result<Self, EnvError> {
        Ok(Counting {
            observation_spec: Spec::uniform_box(1, f32::NEG_INFINITY, f32::INFINITY),
            action_spec: Spec::uniform_box(1, 0.0, 1.0),
            max_steps: config.max_steps as f64,
            count: 0.0,
            elapsed: 0,
            needs_reset: true,
        })
    }
}

impl Env for Counting {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn observation_spec(&self) -> &Spec {
        &self.observation_spec
    }

    fn action_spec(&self) -> &Spec {
        &self.action_spec
    }

    fn reset(&mut self, _seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        check_obs_len(obs, 1)?;
        self.count = 0.0;
        self.elapsed = 0;
        self.needs_reset = false;
        obs[0] = 0.0;
        Ok(())
    }

    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        check_obs_len(obs, 1)?;
        let a = action.continuous(&self.action_spec)?;
        if self.needs_reset {
            return Err(EnvError::NeedsReset("before reset or after the episode ended"));
        }
        self.count += f64::from(a[0]);
        self.elapsed += 1;
        let terminated = self.count > self.max_steps;
        self.needs_reset = terminated;
        obs[0] = self.count as f32;
        Ok(Transition {
            reward: 0.0,
            terminated,
            truncated: false,
        })
    }

    fn state(&self) -> Vec<f64> {
        vec![self.count]
    }

    /// Sets `[count]`; the env can step afterwards.
    fn set_state(&mut self, state: &[f64]) -> Result<(), EnvError> {
        match state {
            [count] => {
                self.count = *count;
                self.needs_reset = false;
                Ok(())
            }
            _ => Err(EnvError::State(format!(
                "Counting state has 1 value, got {}",
                state.len()
            ))),
        }
    }

    fn elapsed_steps(&self) -> u64 {
        self.elapsed
    }

    fn set_elapsed_steps(&mut self, steps: u64) {
        self.elapsed = steps;
    }

    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        Ok(EnvSnapshot {
            state: vec![self.count],
            elapsed_steps: self.elapsed,
            needs_reset: self.needs_reset,
            rng: None,
        })
    }

    fn restore(&mut self, s: &EnvSnapshot) -> Result<(), EnvError> {
        s.check(Self::NAME, 1)?;
        if s.rng.is_some() {
            return Err(EnvError::State(
                "Counting snapshot: has a generator state, the env has none".into(),
            ));
        }
        self.count = s.state[0];
        self.elapsed = s.elapsed_steps;
        self.needs_reset = s.needs_reset;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SpecError;

    #[test]
    fn counts_and_terminates_after_max_steps() {
        let mut env = Counting::new(CountingConfig::default()).unwrap();
        let mut obs = [9.0];
        env.reset(Some(3), &mut obs).unwrap();
        assert_eq!(obs, [0.0]);
        for i in 1..=6 {
            let t = env.step(Action::Continuous(&[1.0]), &mut obs).unwrap();
            assert_eq!(obs, [i as f32]);
            assert_eq!(t.reward, 0.0);
            assert!(!t.truncated);
            // torchrl: done when count > max_steps.
            assert_eq!(t.terminated, i > 5);
            assert_eq!(t.done(), i > 5);
        }
        assert_eq!(env.elapsed_steps(), 6);
        assert!(matches!(
            env.step(Action::Continuous(&[1.0]), &mut obs),
            Err(EnvError::NeedsReset(_))
        ));
        env.reset(None, &mut obs).unwrap();
        assert_eq!((obs, env.elapsed_steps()), ([0.0], 0));
    }

    #[test]
    fn actions_are_not_clipped() {
        let mut env = Counting::new(CountingConfig { max_steps: 10 }).unwrap();
        let mut obs = [0.0];
        env.reset(None, &mut obs).unwrap();
        env.step(Action::Continuous(&[2.0]), &mut obs).unwrap();
        assert_eq!(obs, [2.0]);
        env.step(Action::Continuous(&[0.0]), &mut obs).unwrap();
        assert_eq!(obs, [2.0]);
        let t = env.step(Action::Continuous(&[9.0]), &mut obs).unwrap();
        assert_eq!(obs, [11.0]);
        assert!(t.terminated);
        assert_eq!(env.state(), vec![11.0]);
    }

    #[test]
    fn needs_reset_and_bad_actions() {
        let mut env = Counting::new(CountingConfig::default()).unwrap();
        let mut obs = [0.0];
        assert!(matches!(
            env.step(Action::Continuous(&[1.0]), &mut obs),
            Err(EnvError::NeedsReset(_))
        ));
        env.reset(None, &mut obs).unwrap();
        assert!(matches!(
            env.step(Action::Discrete(1), &mut obs),
            Err(EnvError::Action(SpecError::Kind { .. }))
        ));
        assert!(matches!(
            env.step(Action::Continuous(&[f32::NAN]), &mut obs),
            Err(EnvError::Action(SpecError::NaN { .. }))
        ));
        assert!(matches!(
            env.step(Action::Continuous(&[1.0, 1.0]), &mut obs),
            Err(EnvError::Action(SpecError::Length { .. }))
        ));
        assert!(env.step(Action::Continuous(&[1.0]), &mut [0.0; 2]).is_err());
        assert!(env.set_state(&[]).is_err());
    }

    #[test]
    fn specs_and_config() {
        let env = Counting::new(CountingConfig::default()).unwrap();
        assert_eq!(env.action_spec(), &Spec::uniform_box(1, 0.0, 1.0));
        assert_eq!(
            env.observation_spec(),
            &Spec::uniform_box(1, f32::NEG_INFINITY, f32::INFINITY)
        );
        let err = super::super::parse_config::<CountingConfig>(Counting::NAME, &serde_json::json!({"max_step": 3}))
            .unwrap_err();
        assert!(err.to_string().contains("max_step"));
        let err = super::super::parse_config::<CountingConfig>(Counting::NAME, &serde_json::json!({"max_steps": -3}))
            .unwrap_err();
        assert!(matches!(err, EnvError::Config { .. }));
        let c: CountingConfig =
            super::super::parse_config(Counting::NAME, &serde_json::json!({"max_steps": 2})).unwrap();
        assert_eq!(c.max_steps, 2);
    }
}
