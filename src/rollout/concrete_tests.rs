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
    fn recorded(&self) -> Recorded {
        self.0.recorded()
    }
    fn act_recording(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        self.0.act_recording(obs, k, actions, record)
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
            record: true,
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

/// K envs and a built-in policy over two logits: the main policy's log-probabilities
/// are computed after the steps, in one pass per env from the step the random frames
/// end at; the trait path (a policy the rollout cannot see through) computes them in
/// each step. The same bits, whether the random frames end inside a batch or before it.
#[test]
fn log_probs_computed_after_the_steps_are_those_of_each_step() {
    for policy in [PolicyConfig::Linear, PolicyConfig::Mlp { hidden: vec![5] }] {
        for mode in [ExplorationType::Random, ExplorationType::Deterministic] {
            for random_frames in [0, 700] {
                let (mut fast, mut slow) = pair_random_first("CartPole-v1", policy.clone(), mode, 3, random_frames);
                assert!(
                    fast.policy.get_mut().builtin().is_some(),
                    "the compiled path defers them"
                );
                assert!(slow.policy.get_mut().builtin().is_none(), "the trait path does not");
                for batch in 0..3 {
                    let (a, b) = (fast.collect().expect("fast"), slow.collect().expect("slow"));
                    assert_eq!(a, b, "{policy:?} {mode:?} {random_frames}: batch {batch} differs");
                    fast.recycle(a);
                    slow.recycle(b);
                }
            }
        }
    }
}

#[test]
fn compiled_path_resumes_from_the_trait_paths_snapshot() {
    let (mut fast, mut slow) = pair("CartPole-v1", PolicyConfig::Linear, ExplorationType::Random, 2);
    slow.collect().expect("slow");
    let state = slow.snapshot().expect("snapshot");
    fast.restore(&state).expect("restore");
    assert_eq!(fast.collect().expect("fast"), slow.collect().expect("slow"));
}

/// The layout of a batch: its keys with their dtypes and feature shapes.
fn layout_of(td: &TensorDict) -> BatchLayout {
    td.iter()
        .map(|(k, t)| (k.to_string(), (t.dtype(), t.shape()[2..].to_vec())))
        .collect()
}

#[test]
fn batches_carry_what_the_policy_records_with_the_fill_values_of_random_frames() {
    for (env, policy, want) in [
        ("CartPole-v1", PolicyConfig::Linear, Recorded::Categorical { n: 2 }),
        (
            "CartPole-v1",
            PolicyConfig::Mlp { hidden: vec![4] },
            Recorded::Categorical { n: 2 },
        ),
        ("Pendulum-v1", PolicyConfig::Linear, Recorded::Normal { d: 1 }),
        ("Pendulum-v1", PolicyConfig::Random, Recorded::LogProb),
        ("Pendulum-v1", PolicyConfig::Constant { value: 0.5 }, Recorded::None),
    ] {
        for (k, exploration) in [1, 3]
            .into_iter()
            .flat_map(|k| [ExplorationType::Random, ExplorationType::Deterministic].map(|e| (k, e)))
        {
            let (mut r, _) = pair_random_first(env, policy.clone(), exploration, k, 30 * k as u64);
            assert_eq!(r.recorded(), want);
            // The second batch has no random frame: one env's argmax loop collects it.
            for batch in 0..2 {
                let b = r.collect().unwrap();
                assert_eq!(layout_of(&b), r.batch_layout(), "{env} {policy:?} k={k}");
                let lp = b
                    .f32(keys::ACTION_LOG_PROB)
                    .ok()
                    .map(|a| a.iter().copied().collect::<Vec<_>>());
                assert_eq!(lp.is_some(), want != Recorded::None);
                let Some(lp) = lp else { break };
                let steps = lp.len() / k;
                let random_frame = |i: usize| batch == 0 && i % steps < 30;
                match want {
                    Recorded::Categorical { n } => {
                        let z: Vec<f32> = b.f32(keys::LOGITS).unwrap().iter().copied().collect();
                        let a: Vec<i64> = b.i64(keys::ACTION).unwrap().iter().copied().collect();
                        for i in 0..lp.len() {
                            let row = &z[i * n..(i + 1) * n];
                            if random_frame(i) {
                                assert!(row.iter().all(|&v| v == 0.0), "logits 0 in random frames");
                            }
                            let total: f64 = row.iter().map(|&v| f64::from(v).exp()).sum();
                            let want = (f64::from(row[a[i] as usize]).exp() / total).ln();
                            assert!((f64::from(lp[i]) - want).abs() < 1e-5, "frame {i}");
                        }
                    }
                    Recorded::Normal { .. } => {
                        let loc: Vec<f32> = b.f32(keys::LOC).unwrap().iter().copied().collect();
                        let scale: Vec<f32> = b.f32(keys::SCALE).unwrap().iter().copied().collect();
                        let a: Vec<f32> = b.f32(keys::ACTION).unwrap().iter().copied().collect();
                        for i in 0..lp.len() {
                            if random_frame(i) {
                                assert!(loc[i].is_nan() && scale[i].is_nan());
                                assert_eq!(lp[i], -(4.0f32.ln()), "the uniform density on [-2, 2]");
                                continue;
                            }
                            let (x, m, s) = (f64::from(a[i]), f64::from(loc[i]), f64::from(scale[i]));
                            let want = -((x - m) / s).powi(2) / 2.0 - s.ln() - (2.0 * std::f64::consts::PI).sqrt().ln();
                            assert!((f64::from(lp[i]) - want).abs() < 1e-5, "frame {i}");
                        }
                    }
                    _ => assert!(lp.iter().all(|&v| v == -(4.0f32.ln()))),
                }
            }
        }
    }
}
