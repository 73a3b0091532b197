//! The compiled path for built-in envs and policies collects bit for bit what the
//! trait path collects: the same envs and policies, wrapped in types of our own (which
//! the rollout cannot see through), give the same batches, snapshots and weights.

use super::*;
use crate::env::{Registry, Transition};
use crate::policy::{ExplorationType, PolicyConfig, PolicySpec};
use crate::EnvSpec;

/// A built-in env behind a type of our own: the rollout steps it through the trait.
struct Opaque(Box<dyn Env>);

impl Env for Opaque {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn observation_spec(&self) -> &Spec {
        self.0.observation_spec()
    }
    fn action_spec(&self) -> &Spec {
        self.0.action_spec()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.0.reset(seed, obs)
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        self.0.step(action, obs)
    }
    fn state(&self) -> Vec<f64> {
        self.0.state()
    }
    fn set_state(&mut self, state: &[f64]) -> Result<(), EnvError> {
        self.0.set_state(state)
    }
    fn elapsed_steps(&self) -> u64 {
        self.0.elapsed_steps()
    }
    fn set_elapsed_steps(&mut self, steps: u64) {
        self.0.set_elapsed_steps(steps)
    }
    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        self.0.snapshot()
    }
    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        self.0.restore(snapshot)
    }
}

/// A built-in policy behind a type of our own: the rollout calls it through the trait.
struct OpaquePolicy(Box<dyn Policy>);

impl Policy for OpaquePolicy {
    fn act(&mut self, obs: &[f32], k: usize, actions: ActionsMut<'_>) -> Result<(), PolicyError> {
        self.0.act(obs, k, actions)
    }
    fn weights(&self) -> &Weights {
        self.0.weights()
    }
    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
        self.0.set_weights(weights)
    }
    fn set_exploration(&mut self, exploration: ExplorationType) {
        self.0.set_exploration(exploration)
    }
    fn reseed(&mut self, seed: u64) {
        self.0.reseed(seed)
    }
    fn sampler_state(&self) -> Result<Option<SamplerState>, PolicyError> {
        self.0.sampler_state()
    }
    fn set_sampler_state(&mut self, state: Option<&SamplerState>) -> Result<(), PolicyError> {
        self.0.set_sampler_state(state)
    }
}

/// The same rollout twice: built-ins as they are, and wrapped so the rollout cannot
/// tell what they are.
fn pair(env: &str, policy: PolicyConfig, exploration: ExplorationType, k: usize) -> (Rollout, Rollout) {
    pair_random_first(env, policy, exploration, k, 0)
}

/// [`pair`], the first `init_random_frames` frames acted by the random policy.
fn pair_random_first(
    env: &str,
    policy: PolicyConfig,
    exploration: ExplorationType,
    k: usize,
    init_random_frames: u64,
) -> (Rollout, Rollout) {
    let reg = Registry::with_builtins();
    let build = |opaque: bool| {
        let envs: Vec<Box<dyn Env>> = (0..k)
            .map(|_| {
                let e = reg.make(&EnvSpec::new(env)).expect("env");
                if opaque {
                    Box::new(Opaque(e)) as Box<dyn Env>
                } else {
                    e
                }
            })
            .collect();
        let spec = PolicySpec {
            config: policy.clone(),
            exploration,
            init_seed: 3,
        };
        let p = spec
            .build(envs[0].observation_spec(), envs[0].action_spec(), 11)
            .expect("policy");
        let p: Box<dyn Policy> = if opaque { Box::new(OpaquePolicy(p)) } else { p };
        let ids = (0..k as u64).map(|i| TrajIds::new(i, k as u64).expect("ids")).collect();
        let cfg = RolloutConfig {
            frames_per_batch: 600 * k,
            max_frames_per_traj: Some(170),
            seed: 5,
            init_random_frames,
            ..RolloutConfig::default()
        };
        Rollout::new(envs, p, ids, cfg).expect("rollout")
    };
    (build(false), build(true))
}

#[test]
fn builtins_are_compiled_and_wrapped_ones_are_not() {
    let (fast, slow) = pair("CartPole-v1", PolicyConfig::Linear, ExplorationType::Random, 2);
    assert!(matches!(
        (&fast.envs, &fast.policy),
        (Envs::CartPole(_), Pol::Linear(_))
    ));
    assert!(matches!((&slow.envs, &slow.policy), (Envs::Dyn(_), Pol::Dyn(_))));
}

#[test]
fn compiled_path_collects_what_the_trait_path_collects() {
    let envs = ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0"];
    let policies = [
        PolicyConfig::Linear,
        PolicyConfig::Mlp { hidden: vec![5] },
        PolicyConfig::Random,
    ];
    let modes = [ExplorationType::Random, ExplorationType::Deterministic];
    for env in envs {
        for policy in &policies {
            for mode in modes {
                for k in [1, 3] {
                    let (mut fast, mut slow) = pair(env, policy.clone(), mode, k);
                    for batch in 0..4 {
                        let (a, b) = (fast.collect().expect("fast"), slow.collect().expect("slow"));
                        assert_eq!(a, b, "{env} {policy:?} {mode:?} k={k}: batch {batch} differs");
                        fast.recycle(a);
                        slow.recycle(b);
                    }
                    assert_eq!(fast.snapshot(), slow.snapshot(), "{env} {policy:?} {mode:?} k={k}");
                    assert_eq!(fast.weights(), slow.weights());
                }
            }
        }
    }
}

/// One CartPole and the deterministic linear policy take the loop that keeps the
/// observation in registers, from the first batch that starts past the random frames;
/// before it, and in the batch the random frames end in, the general one.
#[test]
fn one_env_argmax_loop_collects_what_the_trait_path_collects_after_random_frames() {
    let (mut fast, mut slow) = pair_random_first(
        "CartPole-v1",
        PolicyConfig::Linear,
        ExplorationType::Deterministic,
        1,
        900,
    );
    let Pol::Linear(p) = &fast.policy else {
        panic!("the built-in linear policy is compiled");
    };
    assert!(p.argmax2::<4>().is_some(), "the argmax loop applies");
    for batch in 0..5 {
        let (a, b) = (fast.collect().expect("fast"), slow.collect().expect("slow"));
        assert_eq!(a, b, "batch {batch} differs");
        // Kept while writing from the first batch that starts past the 900 random frames.
        let kept = fast.batch_max_traj_id();
        assert_eq!(kept.is_some(), batch >= 2, "batch {batch}");
        if let Some(m) = kept {
            assert_eq!(u64::try_from(m).ok(), crate::schema::max_traj_id(&a), "batch {batch}");
        }
        assert_eq!(slow.batch_max_traj_id(), None);
        fast.recycle(a);
        slow.recycle(b);
    }
    assert_eq!(fast.snapshot(), slow.snapshot());
}

#[test]
fn compiled_path_resumes_from_the_trait_paths_snapshot() {
    let (mut fast, mut slow) = pair("CartPole-v1", PolicyConfig::Linear, ExplorationType::Random, 2);
    slow.collect().expect("slow");
    let state = slow.snapshot().expect("snapshot");
    fast.restore(&state).expect("restore");
    assert_eq!(fast.collect().expect("fast"), slow.collect().expect("slow"));
}
