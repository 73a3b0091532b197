//! `Counting`: a port of torchrl's `CountingEnv` test env.
//!
//! The observation is a counter that starts at 0 on reset; each step adds the action
//! to it. The reward is always 0 and the episode terminates once the count exceeds
//! `max_steps` (torchrl's `count > max_steps`). It never truncates.
//!
//! For supervision tests it can also fail on purpose: with `panic_between` it panics
//! on a step drawn from the seed of its last seeded reset, as a buggy user env would.

use serde::{Deserialize, Serialize};

use super::{check_obs_len, Action, Env, EnvError, EnvSnapshot, Transition};
use crate::spec::Spec;

/// Serde config of [`Counting`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CountingConfig {
    /// The episode terminates on the step where the count exceeds this (torchrl: 5).
    pub max_steps: u64,
    /// Fault injection: `[lo, hi]` makes the env panic on step `lo + h % (hi - lo)`
    /// after each seeded reset (counted across the automatic resets that follow),
    /// `h` a hash of that reset's seed. A restarted env is reseeded differently, so it
    /// panics elsewhere. `None` (the default): never. Needs `1 <= lo < hi`.
    pub panic_between: Option<[u64; 2]>,
}

impl Default for CountingConfig {
    fn default() -> Self {
        CountingConfig {
            max_steps: 5,
            panic_between: None,
        }
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
    panic_between: Option<[u64; 2]>,
    /// Steps left until the injected panic, once a seeded reset drew it.
    panic_in: Option<u64>,
}

impl Counting {
    /// Registered name.
    pub const NAME: &'static str = "Counting";

    /// Builds the env.
    pub fn new(config: CountingConfig) -> Result<Self, EnvError> {
        if let Some([lo, hi]) = config.panic_between {
            if lo == 0 || hi <= lo {
                return Err(EnvError::Config {
                    env: Self::NAME.into(),
                    reason: format!("panic_between [{lo}, {hi}] needs 1 <= lo < hi"),
                });
            }
        }
        Ok(Counting {
            panic_between: config.panic_between,
            panic_in: None,
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

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        check_obs_len(obs, 1)?;
        if let (Some([lo, hi]), Some(seed)) = (self.panic_between, seed) {
            self.panic_in = Some(lo + mix(seed) % (hi - lo));
        }
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
        if let Some(left) = self.panic_in {
            if left <= 1 {
                self.panic_in = None;
                let [lo, hi] = self.panic_between.unwrap_or_default();
                panic!("Counting: injected panic (panic_between [{lo}, {hi}])");
            }
            self.panic_in = Some(left - 1);
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
        if self.panic_between.is_some() {
            return Err(EnvError::Failed(
                "a Counting env with `panic_between` cannot be checkpointed (its fault schedule is not in a snapshot)"
                    .into(),
            ));
        }
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

/// splitmix64's finaliser: a seed spread over all 64 bits.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SpecError;

    /// Steps (with auto-reset) until `env` panics; `None` if it lasts `limit` steps.
    fn steps_until_panic(env: &mut Counting, limit: u64) -> Option<u64> {
        let mut obs = [0.0];
        for i in 1..=limit {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                env.step(Action::Continuous(&[1.0]), &mut obs)
            }));
            match r {
                Err(_) => return Some(i),
                Ok(Ok(t)) if t.done() => env.reset(None, &mut obs).unwrap(),
                Ok(r) => {
                    r.unwrap();
                }
            }
        }
        None
    }

    #[test]
    fn panics_where_the_seed_says_and_never_without_a_seeded_reset() {
        let cfg = CountingConfig {
            panic_between: Some([10, 40]),
            ..CountingConfig::default()
        };
        let mut at = Vec::new();
        for seed in 0..20 {
            let mut env = Counting::new(cfg.clone()).unwrap();
            env.reset(Some(seed), &mut [0.0]).unwrap();
            let n = steps_until_panic(&mut env, 100).expect("panics");
            assert!((10..40).contains(&n), "seed {seed}: step {n}");
            // Same seed, same step.
            let mut again = Counting::new(cfg.clone()).unwrap();
            again.reset(Some(seed), &mut [0.0]).unwrap();
            assert_eq!(steps_until_panic(&mut again, 100), Some(n));
            at.push(n);
        }
        at.sort_unstable();
        at.dedup();
        assert!(at.len() > 5, "seeds spread the step: {at:?}");
        let mut unseeded = Counting::new(cfg).unwrap();
        unseeded.reset(None, &mut [0.0]).unwrap();
        assert_eq!(steps_until_panic(&mut unseeded, 100), None);
        assert!(unseeded.snapshot().is_err(), "its schedule is not checkpointable");
    }

    #[test]
    fn a_bad_fault_range_is_a_config_error() {
        for range in [[0, 5], [5, 5], [9, 3]] {
            let cfg = CountingConfig {
                panic_between: Some(range),
                ..CountingConfig::default()
            };
            match Counting::new(cfg) {
                Err(EnvError::Config { reason, .. }) => assert!(reason.contains("panic_between"), "{reason}"),
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("{range:?} accepted"),
            }
        }
    }

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
        let mut env = Counting::new(CountingConfig {
            max_steps: 10,
            ..CountingConfig::default()
        })
        .unwrap();
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
