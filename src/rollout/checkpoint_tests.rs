//! Snapshot/restore of the collection loop: a fresh rollout restored from a checkpoint
//! (through MessagePack) collects bit for bit the batches the original would have.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::*;
use crate::env::{Counting, CountingConfig};
use crate::env::{Registry, Transition};
use crate::policy::{ExplorationType, PolicyConfig, PolicySpec};
use crate::rng::RngState;
use crate::tensor::DType;
use crate::EnvSpec;

/// How to build one rollout; building twice gives two identical fresh rollouts.
#[derive(Clone)]
struct Case {
    env: &'static str,
    env_config: serde_json::Value,
    policy: PolicyConfig,
    exploration: ExplorationType,
    k: usize,
    cfg: RolloutConfig,
}

fn case(env: &'static str, env_config: serde_json::Value, policy: PolicyConfig) -> Case {
    Case {
        env,
        env_config,
        policy,
        exploration: ExplorationType::Random,
        k: 3,
        cfg: RolloutConfig {
            frames_per_batch: 21,
            seed: 7,
            ..RolloutConfig::default()
        },
    }
}

fn mlp() -> PolicyConfig {
    PolicyConfig::Mlp { hidden: vec![5] }
}

/// Every built-in env with short episodes (so batches cross auto-resets) and the
/// policies that suit it; all sampling.
fn all_cases() -> Vec<Case> {
    let cartpole = json!({ "max_episode_steps": 12 });
    let pendulum = json!({ "max_episode_steps": 9 });
    let mountain = json!({ "max_episode_steps": 11 });
    let counting = json!({ "max_steps": 4 });
    let mut cases = Vec::new();
    for p in [PolicyConfig::Linear, mlp(), PolicyConfig::Random] {
        cases.push(case("CartPole-v1", cartpole.clone(), p.clone()));
        cases.push(case("Pendulum-v1", pendulum.clone(), p.clone()));
        cases.push(case("MountainCarContinuous-v0", mountain.clone(), p.clone()));
        cases.push(case("Counting", counting.clone(), p));
    }
    cases.push(case("Pendulum-v1", pendulum, PolicyConfig::Constant { value: 0.5 }));
    cases.push(case("Counting", counting, PolicyConfig::Constant { value: 1.0 }));
    cases
}

fn build(c: &Case) -> Rollout {
    let reg = Registry::with_builtins();
    let spec = EnvSpec::new(c.env).with_config(c.env_config.clone());
    let envs: Vec<Box<dyn Env>> = (0..c.k).map(|_| reg.make(&spec).expect("env")).collect();
    let policy = PolicySpec {
        config: c.policy.clone(),
        exploration: c.exploration,
        init_seed: 1,
        record: true,
    }
    .build(envs[0].observation_spec(), envs[0].action_spec(), 5)
    .expect("policy");
    let ids = (0..c.k as u64)
        .map(|i| TrajIds::new(i, c.k as u64).expect("ids"))
        .collect();
    Rollout::new(envs, policy, ids, c.cfg.clone()).expect("rollout")
}

/// Other weights than the initial ones, as after some training.
fn trained(w: &Weights) -> Weights {
    let mut w = w.clone().with_version(w.version + 1);
    for t in w.tensors.values_mut() {
        if let Tensor::F32(a) = t {
            a.mapv_inplace(|x| 1.5 * x + 0.1);
        }
    }
    w
}

/// A batch as exact bytes: key, dtype, shape and little-endian data of every entry.
type Bits = Vec<(String, DType, Vec<usize>, Vec<u8>)>;

fn bits(td: &TensorDict) -> Bits {
    td.iter()
        .map(|(k, t)| (k.to_string(), t.dtype(), t.shape().to_vec(), t.to_le_bytes()))
        .collect()
}

fn next_batches(r: &mut Rollout, n: usize) -> Vec<Bits> {
    (0..n).map(|_| bits(&r.collect().expect("collect"))).collect()
}

fn count(td: &Bits, key: &str) -> usize {
    let (.., data) = td.iter().find(|(k, ..)| k == key).expect(key);
    data.iter().filter(|&&b| b != 0).count()
}

fn msgpack(st: &RolloutState) -> RolloutState {
    let bytes = rmp_serde::to_vec_named(st).expect("encode");
    rmp_serde::from_slice(&bytes).expect("decode")
}

/// The original after `before` batches (then `prepare`), its snapshot, and its next
/// `after` batches.
fn original(
    c: &Case,
    before: usize,
    prepare: impl Fn(&mut Rollout),
    after: usize,
) -> (Weights, RolloutState, Vec<Bits>) {
    let mut a = build(c);
    a.set_weights(&trained(a.weights())).expect("weights");
    for _ in 0..before {
        let b = a.collect().expect("collect");
        a.recycle(b);
    }
    prepare(&mut a);
    let st = a.snapshot().expect("snapshot");
    (a.weights().clone(), st, next_batches(&mut a, after))
}

/// A fresh rollout with the same weights, moved on one step so that it is in none of
/// the states the original is snapshotted in: restoring has something to overwrite.
fn fresh(c: &Case, w: &Weights) -> Rollout {
    let mut b = build(c);
    b.set_weights(w).expect("weights");
    b.collect_frames(c.k).expect("collect");
    b
}

/// Checks that a fresh rollout restored from the (MessagePack'd) snapshot continues
/// exactly, and that without the restore it would not; returns the snapshot.
fn resumes_exactly(c: &Case, before: usize, prepare: impl Fn(&mut Rollout)) -> RolloutState {
    let after = 4;
    let (w, st, expected) = original(c, before, prepare, after);
    let decoded = msgpack(&st);
    assert_eq!(decoded, st);

    let mut b = fresh(c, &w);
    b.restore(&decoded).expect("restore");
    assert_eq!(b.snapshot().expect("snapshot"), st);
    let got = next_batches(&mut b, after);
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert!(
            g == e,
            "{} / {:?}: batch {i} after the restore differs",
            c.env,
            c.policy
        );
    }
    let dones: usize = expected.iter().map(|b| count(b, keys::NEXT_DONE)).sum();
    // (With reset_at_each_iter every batch starts with resets anyway.)
    let resets = dones > 0 || c.cfg.reset_at_each_iter;
    assert!(resets, "{}: the compared batches should cross auto-resets", c.env);

    // The same fresh rollout without the restore.
    let mut control = fresh(c, &w);
    assert_ne!(
        next_batches(&mut control, after),
        expected,
        "{} / {:?}: even without the restore the batches agree, the test proves nothing",
        c.env,
        c.policy
    );
    st
}

/// True when some env is in the middle of an episode at the snapshot.
fn mid_episode(st: &RolloutState) -> bool {
    st.envs.iter().any(|e| !e.needs_reset && e.step_count > 0)
}

#[test]
fn every_builtin_env_and_policy_resumes_mid_episode() {
    for c in all_cases() {
        let st = resumes_exactly(&c, 2, |_| {});
        assert!(mid_episode(&st), "{} / {:?}", c.env, c.policy);
    }
}

#[test]
fn box_muller_spare_is_carried() {
    // 3 envs x 7 steps = 21 normals per batch: after one batch a spare is pending.
    let c = case("Pendulum-v1", json!({ "max_episode_steps": 9 }), PolicyConfig::Linear);
    let st = resumes_exactly(&c, 1, |_| {});
    assert!(st.policy.as_ref().and_then(|p| p.spare).is_some());
}

#[test]
fn deterministic_exploration_resumes() {
    let c = Case {
        exploration: ExplorationType::Deterministic,
        ..case("CartPole-v1", json!({ "max_episode_steps": 12 }), mlp())
    };
    resumes_exactly(&c, 2, |_| {});
}

#[test]
fn set_seed_then_snapshot_before_the_next_collect() {
    for c in [
        case("CartPole-v1", json!(null), PolicyConfig::Linear),
        case("Pendulum-v1", json!({ "max_episode_steps": 9 }), mlp()),
    ] {
        let st = resumes_exactly(&c, 1, |r| {
            r.set_seed(99);
        });
        assert!(st.envs.iter().all(|e| e.pending_seed.is_some() && e.needs_reset));
    }
}

#[test]
fn init_random_frames_phase_and_crossing() {
    for env in ["CartPole-v1", "MountainCarContinuous-v0"] {
        let c = Case {
            k: 2,
            cfg: RolloutConfig {
                frames_per_batch: 12,
                init_random_frames: 30,
                seed: 3,
                ..RolloutConfig::default()
            },
            ..case(env, json!({ "max_episode_steps": 10 }), PolicyConfig::Linear)
        };
        // Snapshots at 12 (random phase) and 24 frames (the next batch crosses 30).
        for before in [1, 2] {
            let st = resumes_exactly(&c, before, |_| {});
            assert!(st.random.is_some() && st.frames < 30);
        }
    }
}

#[test]
fn max_frames_per_traj_and_reset_at_each_iter() {
    let base = case("CartPole-v1", json!(null), PolicyConfig::Linear);
    let c = Case {
        cfg: RolloutConfig {
            max_frames_per_traj: Some(5),
            ..base.cfg.clone()
        },
        ..base.clone()
    };
    let (.., batches) = original(&c, 1, |_| {}, 2);
    assert!(batches.iter().any(|b| count(b, keys::NEXT_TRUNCATED) > 0));
    resumes_exactly(&c, 1, |_| {});
    let c = Case {
        cfg: RolloutConfig {
            reset_at_each_iter: true,
            ..base.cfg.clone()
        },
        ..base
    };
    resumes_exactly(&c, 2, |_| {});
}

/// Getting any part of the state wrong changes what comes next: each part is needed.
#[test]
fn every_part_of_the_state_matters() {
    let c = case("Pendulum-v1", json!({ "max_episode_steps": 9 }), PolicyConfig::Linear);
    let (w, st, expected) = original(&c, 1, |_| {}, 3);
    let other_rng = || RngState::of(&ChaCha8Rng::seed_from_u64(42));
    type Edit = fn(&mut RolloutState, RngState);
    let edits: [(&str, Edit); 10] = [
        ("policy sampler", |s, r| s.policy.as_mut().expect("sampler").rng = r),
        ("spare normal", |s, _| s.policy.as_mut().expect("sampler").spare = None),
        ("env generators", |s, r| {
            s.envs.iter_mut().for_each(|e| e.env.rng = Some(r.clone()))
        }),
        ("env states", |s, _| {
            s.envs.iter_mut().for_each(|e| e.env.state[0] += 0.01)
        }),
        ("elapsed steps", |s, _| {
            s.envs.iter_mut().for_each(|e| e.env.elapsed_steps = 0)
        }),
        ("observations", |s, _| s.envs.iter_mut().for_each(|e| e.obs[0] += 0.5)),
        ("step counts", |s, _| s.envs.iter_mut().for_each(|e| e.step_count += 1)),
        ("needs reset", |s, _| {
            s.envs.iter_mut().for_each(|e| e.needs_reset = true)
        }),
        ("pending seeds", |s, _| {
            s.envs.iter_mut().for_each(|e| e.pending_seed = Some(5))
        }),
        ("trajectory ids", |s, _| {
            s.envs.iter_mut().for_each(|e| e.ids.next += e.ids.stride)
        }),
    ];
    let mut whole = fresh(&c, &w);
    whole.restore(&st).expect("restore");
    assert_eq!(next_batches(&mut whole, 3), expected);
    for (part, edit) in edits {
        let mut partial = st.clone();
        edit(&mut partial, other_rng());
        assert_ne!(partial, st, "{part}: the edit changed nothing");
        let mut r = fresh(&c, &w);
        r.restore(&partial).expect("restore");
        assert_ne!(next_batches(&mut r, 3), expected, "{part} does not matter?");
    }
}

/// Restores `st` into a fresh rollout of case `c`; must fail without changing it.
fn refused(c: &Case, st: &RolloutState) -> RolloutError {
    let mut r = build(c);
    r.collect_frames(c.k).expect("collect");
    let before = r.snapshot().expect("snapshot");
    let err = r.restore(&msgpack(st)).expect_err("a bad state must be refused");
    assert_eq!(
        r.snapshot().expect("snapshot"),
        before,
        "a refused restore changed the rollout"
    );
    err
}

fn cartpole_case() -> Case {
    case("CartPole-v1", json!(null), PolicyConfig::Random)
}

#[test]
fn bad_states_are_errors_not_panics() {
    let c = cartpole_case();
    let st = build(&c).snapshot().expect("snapshot");
    let checkpoint = |e: RolloutError| matches!(e, RolloutError::Checkpoint(_));
    let edit = |f: &dyn Fn(&mut RolloutState)| {
        let mut s = st.clone();
        f(&mut s);
        s
    };

    // Wrong env count: a rollout of one env more.
    let bigger = Case { k: 7, ..c.clone() };
    let err = refused(&bigger, &st);
    assert!(err.to_string().contains("3 envs"), "{err}");

    assert!(checkpoint(refused(
        &c,
        &edit(&|s| {
            s.envs[0].obs.pop();
        })
    )));
    assert!(checkpoint(refused(
        &c,
        &edit(&|s| s.envs[1].name = "Pendulum-v1".into())
    )));
    assert!(checkpoint(refused(&c, &edit(&|s| s.envs[2].step_count = -1))));
    assert!(checkpoint(refused(&c, &edit(&|s| s.envs[0].ids.stride = 0))));
    assert!(checkpoint(refused(&c, &edit(&|s| s.envs[0].ids.next += 1))));
    assert!(checkpoint(refused(&c, &edit(&|s| s.frames = u64::MAX))));
    assert!(checkpoint(refused(&c, &edit(&|s| s.random = s.policy.clone()))));

    // Env snapshots: wrong state length, truncated generator seed.
    let env_err = |e: RolloutError| {
        matches!(
            e,
            RolloutError::Env {
                env: 2,
                source: EnvError::State(_)
            }
        )
    };
    assert!(env_err(refused(&c, &edit(&|s| s.envs[2].env.state.push(0.0)))));
    let err = refused(
        &c,
        &edit(&|s| s.envs[2].env.rng.as_mut().expect("rng").seed.truncate(16)),
    );
    assert!(env_err(err.clone()) && err.to_string().contains("16 bytes"), "{err}");
    assert!(env_err(refused(&c, &edit(&|s| s.envs[2].env.rng = None))));

    // The policy's generator: truncated seed, missing state.
    let policy_err = |e: RolloutError| matches!(e, RolloutError::Policy(PolicyError::Checkpoint(_)));
    assert!(policy_err(refused(
        &c,
        &edit(&|s| { s.policy.as_mut().expect("sampler").rng.seed.clear() })
    )));
    assert!(policy_err(refused(&c, &edit(&|s| s.policy = None))));

    // MountainCar's precision flag must be 0 or 1.
    let m = case(
        "MountainCarContinuous-v0",
        json!(null),
        PolicyConfig::Constant { value: 0.5 },
    );
    let mut st = build(&m).snapshot().expect("snapshot");
    st.envs[0].env.state[2] = 0.5;
    assert!(matches!(refused(&m, &st), RolloutError::Env { env: 0, .. }));
}

/// A user env that does not implement the checkpoint hooks.
struct Plain;

impl Env for Plain {
    fn name(&self) -> &str {
        "MyPlainEnv"
    }
    fn observation_spec(&self) -> &Spec {
        static SPEC: std::sync::OnceLock<Spec> = std::sync::OnceLock::new();
        SPEC.get_or_init(|| Spec::uniform_box(1, -1.0, 1.0))
    }
    fn action_spec(&self) -> &Spec {
        self.observation_spec()
    }
    fn reset(&mut self, _seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        obs.fill(0.0);
        Ok(())
    }
    fn step(&mut self, _a: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        obs.fill(0.0);
        Ok(Transition {
            reward: 0.0,
            terminated: false,
            truncated: false,
        })
    }
    fn state(&self) -> Vec<f64> {
        vec![]
    }
    fn set_state(&mut self, _s: &[f64]) -> Result<(), EnvError> {
        Ok(())
    }
    fn elapsed_steps(&self) -> u64 {
        0
    }
    fn set_elapsed_steps(&mut self, _s: u64) {}
}

/// A user policy that does not implement the checkpoint hooks.
struct PlainPolicy(Weights);

impl Policy for PlainPolicy {
    fn act(&mut self, _obs: &[f32], _k: usize, actions: ActionsMut<'_>) -> Result<(), PolicyError> {
        if let ActionsMut::Continuous(a) = actions {
            a.fill(0.0);
        }
        Ok(())
    }
    fn weights(&self) -> &Weights {
        &self.0
    }
    fn set_weights(&mut self, _w: &Weights) -> Result<(), PolicyError> {
        Ok(())
    }
    fn set_exploration(&mut self, _e: ExplorationType) {}
    fn reseed(&mut self, _seed: u64) {}
}

#[test]
fn envs_and_policies_without_the_hooks_refuse_loudly() {
    let spec = Spec::uniform_box(1, -1.0, 1.0);
    let ids = || vec![TrajIds::new(0, 1).expect("ids")];
    let random = || Box::new(RandomPolicy::new(spec.clone(), 0));
    let cfg = || RolloutConfig {
        frames_per_batch: 4,
        ..RolloutConfig::default()
    };
    let mut r = Rollout::new(vec![Box::new(Plain)], random(), ids(), cfg()).expect("rollout");
    r.collect().expect("collect");
    let err = r.snapshot().expect_err("no hooks");
    assert!(matches!(&err, RolloutError::Env { env: 0, source: EnvError::NotCheckpointable(n) } if n == "MyPlainEnv"));
    assert!(err.to_string().contains("`MyPlainEnv` cannot be checkpointed"), "{err}");

    let counting = || Box::new(Counting::new(CountingConfig::default()).expect("env")) as Box<dyn Env>;
    let mut good = Rollout::new(vec![counting()], random(), ids(), cfg()).expect("rollout");
    let st = good.snapshot().expect("snapshot");
    let plain = || Box::new(PlainPolicy(Weights::default()));
    let mut r = Rollout::new(vec![counting()], plain(), ids(), cfg()).expect("rollout");
    let err = r.snapshot().expect_err("no hooks");
    assert!(err.to_string().contains("PlainPolicy` cannot be checkpointed"), "{err}");
    assert!(matches!(
        r.restore(&st),
        Err(RolloutError::Policy(PolicyError::NotCheckpointable(_)))
    ));
    good.restore(&st).expect("a policy with the hooks restores");
}

/// Action `i` of the env-level test.
fn action(discrete: bool, i: usize, buf: &mut [f32; 1]) -> Action<'_> {
    buf[0] = 0.3 + 0.1 * (i % 5) as f32;
    if discrete {
        Action::Discrete((i % 2) as i64)
    } else {
        Action::Continuous(&buf[..])
    }
}

/// Steps `env` to its episode's end, then twice more after unseeded resets (which draw
/// from the env's generator); every observation and reward as bits.
fn run(env: &mut dyn Env, discrete: bool) -> Vec<u64> {
    let mut out = Vec::new();
    let mut o = vec![0.0f32; env.observation_spec().dim()];
    let mut buf = [0.0];
    for round in 0..3 {
        if round > 0 {
            env.reset(None, &mut o).expect("reset");
            out.extend(o.iter().map(|x| u64::from(x.to_bits())));
        }
        for i in 0..2000 {
            let t = env.step(action(discrete, i, &mut buf), &mut o).expect("step");
            out.extend(o.iter().map(|x| u64::from(x.to_bits())));
            out.push(t.reward.to_bits());
            if t.done() {
                break;
            }
        }
    }
    out
}

/// Env-level round trip, including right after a reset (MountainCar's f64 state).
#[test]
fn env_snapshots_continue_exactly() {
    let reg = Registry::with_builtins();
    for name in ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0", "Counting"] {
        let spec = EnvSpec::new(name);
        let discrete = name == "CartPole-v1";
        for steps in [0, 3] {
            let mut a = reg.make(&spec).expect("env");
            let mut obs = vec![0.0; a.observation_spec().dim()];
            let mut buf = [0.0];
            a.reset(Some(11), &mut obs).expect("reset");
            for i in 0..steps {
                a.step(action(discrete, i, &mut buf), &mut obs).expect("step");
            }
            let snap = a.snapshot().expect("snapshot");
            let bytes = rmp_serde::to_vec_named(&snap).expect("encode");
            let decoded: EnvSnapshot = rmp_serde::from_slice(&bytes).expect("decode");
            assert_eq!(decoded, snap);
            let mut b = reg.make(&spec).expect("env");
            b.reset(Some(12), &mut obs).expect("reset");
            let mut control = reg.make(&spec).expect("env");
            control.reset(Some(12), &mut obs).expect("reset");
            b.restore(&decoded).expect("restore");
            let expected = run(a.as_mut(), discrete);
            assert_eq!(run(b.as_mut(), discrete), expected, "{name} after {steps} steps");
            if name != "Counting" {
                assert_ne!(
                    run(control.as_mut(), discrete),
                    expected,
                    "{name}: the test proves nothing"
                );
            }
        }
    }
}
