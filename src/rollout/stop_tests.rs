//! `collect_frames_until`: a set stop flag ends collection between steps, within
//! [`STOP_CHECK_STEPS`] steps, on every compiled path, and the rollout collects as
//! before once it is clear again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::*;
use crate::env::{Counting, CountingConfig, Registry, Transition};
use crate::policy::{Constant, ExplorationType, PolicyConfig, PolicySpec};
use crate::EnvSpec;

/// `k` built-in `env`s stepped by `policy` (explored as `exploration`).
fn builtin(env: &str, policy: PolicyConfig, exploration: ExplorationType, k: usize) -> Rollout {
    let reg = Registry::with_builtins();
    let envs: Vec<Box<dyn Env>> = (0..k).map(|_| reg.make(&EnvSpec::new(env)).expect("env")).collect();
    let spec = PolicySpec {
        config: policy,
        exploration,
        init_seed: 3,
        record: true,
    };
    let p = spec
        .build(envs[0].observation_spec(), envs[0].action_spec(), 11)
        .expect("policy");
    let ids = (0..k as u64).map(|i| TrajIds::new(i, k as u64).expect("ids")).collect();
    let cfg = RolloutConfig {
        frames_per_batch: 100 * k,
        ..RolloutConfig::default()
    };
    Rollout::new(envs, p, ids, cfg).expect("rollout")
}

#[test]
fn a_flag_set_before_the_batch_stops_it_before_any_step_on_every_path() {
    let cases = [
        // One env, deterministic linear CartPole: the loop that keeps the observation in registers.
        builtin("CartPole-v1", PolicyConfig::Linear, ExplorationType::Deterministic, 1),
        // Several built-in envs and an MLP: the general loop, compiled for them.
        builtin(
            "Pendulum-v1",
            PolicyConfig::Mlp { hidden: vec![8, 8] },
            ExplorationType::Random,
            2,
        ),
    ];
    for mut r in cases {
        let stop = AtomicBool::new(true);
        assert_eq!(
            r.collect_frames_until(r.config().frames_per_batch, &stop).err(),
            Some(RolloutError::Stopped)
        );
        assert_eq!(r.frames(), 0, "no step was taken");
        stop.store(false, Ordering::Relaxed);
        let b = r
            .collect_frames_until(r.config().frames_per_batch, &stop)
            .expect("collects again");
        assert_eq!(b.numel(), r.config().frames_per_batch);
        assert_eq!(r.frames(), r.config().frames_per_batch as u64);
    }
}

/// A counting env that sets `stop` at its `at`-th step, and counts its steps.
struct StopAt {
    env: Counting,
    at: u64,
    steps: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Env for StopAt {
    fn name(&self) -> &str {
        "StopAt"
    }
    fn observation_spec(&self) -> &Spec {
        self.env.observation_spec()
    }
    fn action_spec(&self) -> &Spec {
        self.env.action_spec()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.env.reset(seed, obs)
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        if self.steps.fetch_add(1, Ordering::Relaxed) + 1 == self.at {
            self.stop.store(true, Ordering::Relaxed);
        }
        self.env.step(action, obs)
    }
    fn state(&self) -> Vec<f64> {
        self.env.state()
    }
    fn set_state(&mut self, state: &[f64]) -> Result<(), EnvError> {
        self.env.set_state(state)
    }
    fn elapsed_steps(&self) -> u64 {
        self.env.elapsed_steps()
    }
    fn set_elapsed_steps(&mut self, steps: u64) {
        self.env.set_elapsed_steps(steps)
    }
}

#[test]
fn a_flag_set_mid_batch_stops_it_within_the_check_interval() {
    for at in [1, 63, 64, 65, 1000] {
        let (steps, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let env = StopAt {
            env: Counting::new(CountingConfig::default()).expect("env"),
            at,
            steps: Arc::clone(&steps),
            stop: Arc::clone(&stop),
        };
        let policy = Box::new(Constant::new(env.action_spec(), 1.0).expect("policy"));
        let ids = vec![TrajIds::new(0, 1).expect("ids")];
        let mut r = Rollout::new(vec![Box::new(env)], policy, ids, RolloutConfig::default()).expect("rollout");
        let frames = 1_000_000;
        assert_eq!(r.collect_frames_until(frames, &stop).err(), Some(RolloutError::Stopped));
        let taken = steps.load(Ordering::Relaxed);
        assert!(
            taken >= at && taken < at + STOP_CHECK_STEPS as u64,
            "set at step {at}, stopped after {taken} steps"
        );
        assert_eq!(r.frames(), taken, "the steps taken are counted, the batch is dropped");
    }
}
