//! Collecting batches: the torchrl keys and shapes, trajectories across batches and
//! their ids, truncation, resets, the random policy's first frames, recycled storage,
//! seeding, and the config and NaN errors.

use super::*;
use crate::env::{Counting, CountingConfig, Registry, Transition};
use crate::policy::{Constant, PolicyConfig, PolicySpec};
use crate::EnvSpec;

fn counting(k: usize, lane: u64, lanes: u64, cfg: RolloutConfig) -> Rollout {
    let envs: Vec<Box<dyn Env>> = (0..k)
        .map(|_| Box::new(Counting::new(CountingConfig::default()).expect("env")) as Box<dyn Env>)
        .collect();
    let policy = Box::new(Constant::new(envs[0].action_spec(), 1.0).expect("policy"));
    let ids = (0..k as u64)
        .map(|i| TrajIds::new(lane + i, lanes).expect("ids"))
        .collect();
    Rollout::new(envs, policy, ids, cfg).expect("rollout")
}

fn cfg(f: usize) -> RolloutConfig {
    RolloutConfig {
        frames_per_batch: f,
        ..RolloutConfig::default()
    }
}

fn col_f32(td: &TensorDict, key: &str) -> Vec<f32> {
    td.f32(key).expect(key).iter().copied().collect()
}
fn col_i64(td: &TensorDict, key: &str) -> Vec<i64> {
    td.i64(key).expect(key).iter().copied().collect()
}
fn col_bool(td: &TensorDict, key: &str) -> Vec<bool> {
    td.bool(key).expect(key).iter().copied().collect()
}

#[test]
fn batch_has_torchrl_keys_shapes_and_exact_frames() {
    let mut r = counting(2, 0, 2, cfg(8));
    let b = r.collect().expect("collect");
    assert_eq!(b.batch_size(), &[2, 4]);
    assert_eq!(b.numel(), 8);
    assert_eq!(b.get(keys::OBSERVATION).expect("obs").shape(), &[2, 4, 1]);
    assert_eq!(b.get(keys::NEXT_OBSERVATION).expect("next").shape(), &[2, 4, 1]);
    assert_eq!(b.get(keys::ACTION).expect("action").shape(), &[2, 4, 1]);
    for k in [keys::NEXT_REWARD, keys::STEP_COUNT] {
        assert_eq!(b.get(k).expect(k).shape(), &[2, 4, 1]);
    }
    for k in [keys::NEXT_DONE, keys::NEXT_TERMINATED, keys::NEXT_TRUNCATED] {
        assert_eq!(b.bool(k).expect(k).shape(), &[2, 4, 1]);
    }
    assert_eq!(b.i64(keys::TRAJ_IDS).expect("ids").shape(), &[2, 4]);
    assert_eq!(r.frames(), 8);
}

#[test]
fn auto_reset_and_trajectories_carry_across_batches() {
    // Counting: obs 0..=5 then done (count 6 > max_steps 5); trajectory length 6.
    let mut r = counting(1, 0, 1, cfg(4));
    let b1 = r.collect().expect("b1");
    let b2 = r.collect().expect("b2");
    assert_eq!(col_f32(&b1, keys::OBSERVATION), vec![0., 1., 2., 3.]);
    assert_eq!(col_f32(&b2, keys::OBSERVATION), vec![4., 5., 0., 1.]);
    assert_eq!(col_f32(&b2, keys::NEXT_OBSERVATION), vec![5., 6., 1., 2.]);
    assert_eq!(col_bool(&b2, keys::NEXT_DONE), vec![false, true, false, false]);
    assert_eq!(col_bool(&b2, keys::NEXT_TERMINATED), vec![false, true, false, false]);
    assert_eq!(col_bool(&b2, keys::NEXT_TRUNCATED), vec![false; 4]);
    assert_eq!(col_i64(&b1, keys::TRAJ_IDS), vec![0, 0, 0, 0]);
    assert_eq!(col_i64(&b2, keys::TRAJ_IDS), vec![0, 0, 1, 1]);
    assert_eq!(col_i64(&b2, keys::STEP_COUNT), vec![4, 5, 0, 1]);
}

#[test]
fn traj_ids_follow_lanes() {
    // Two envs in lanes 1 and 2 of 3: ids 1, 4, 7 ... and 2, 5, 8 ...
    let mut r = counting(2, 1, 3, cfg(28));
    let b = r.collect().expect("collect");
    let ids = col_i64(&b, keys::TRAJ_IDS);
    let (env0, env1) = ids.split_at(14);
    assert_eq!(env0, [1, 1, 1, 1, 1, 1, 4, 4, 4, 4, 4, 4, 7, 7]);
    assert_eq!(env1, [2, 2, 2, 2, 2, 2, 5, 5, 5, 5, 5, 5, 8, 8]);
    assert!(TrajIds::new(3, 3).is_err());
    let mut t = TrajIds::new(1, 3).expect("ids");
    t.skip_below(10);
    assert_eq!(t.alloc(), 10);
}

#[test]
fn max_frames_per_traj_truncates() {
    let mut r = counting(
        1,
        0,
        1,
        RolloutConfig {
            max_frames_per_traj: Some(3),
            ..cfg(7)
        },
    );
    let b = r.collect().expect("collect");
    assert_eq!(col_f32(&b, keys::OBSERVATION), vec![0., 1., 2., 0., 1., 2., 0.]);
    assert_eq!(
        col_bool(&b, keys::NEXT_TRUNCATED),
        vec![false, false, true, false, false, true, false]
    );
    assert_eq!(col_bool(&b, keys::NEXT_DONE), col_bool(&b, keys::NEXT_TRUNCATED));
    assert_eq!(col_bool(&b, keys::NEXT_TERMINATED), vec![false; 7]);
    assert_eq!(col_i64(&b, keys::TRAJ_IDS), vec![0, 0, 0, 1, 1, 1, 2]);
}

#[test]
fn reset_at_each_iter_starts_fresh_episodes() {
    let mut r = counting(
        1,
        0,
        1,
        RolloutConfig {
            reset_at_each_iter: true,
            ..cfg(3)
        },
    );
    r.collect().expect("b1");
    let b2 = r.collect().expect("b2");
    assert_eq!(col_f32(&b2, keys::OBSERVATION), vec![0., 1., 2.]);
    assert_eq!(col_i64(&b2, keys::TRAJ_IDS), vec![1, 1, 1]);
}

#[test]
fn init_random_frames_use_the_random_policy_first() {
    let mut r = counting(
        1,
        0,
        1,
        RolloutConfig {
            init_random_frames: 50,
            ..cfg(100)
        },
    );
    let b = r.collect().expect("collect");
    let a = col_f32(&b, keys::ACTION);
    // Random samples of the box [0, 1]: almost surely none is exactly 1.0.
    assert!(a[..50].iter().all(|&x| (0.0..1.0).contains(&x)));
    assert!(a[..50].iter().filter(|&&x| x != a[0]).count() > 40);
    assert!(a[50..].iter().all(|&x| x == 1.0));
}

#[test]
fn recycled_buffers_are_reused() {
    let mut r = counting(2, 0, 2, cfg(100));
    let b = r.collect().expect("b1");
    let ptr = b.f32(keys::OBSERVATION).expect("obs").as_ptr();
    r.recycle(b);
    let b2 = r.collect().expect("b2");
    assert_eq!(b2.f32(keys::OBSERVATION).expect("obs").as_ptr(), ptr);
}

#[test]
fn same_seed_same_batches_and_set_seed_returns_next() {
    let reg = Registry::with_builtins();
    let make = || {
        let envs: Vec<Box<dyn Env>> = (0..2)
            .map(|_| reg.make(&EnvSpec::new("CartPole-v1")).expect("env"))
            .collect();
        let p = PolicySpec::from(PolicyConfig::Linear)
            .build(envs[0].observation_spec(), envs[0].action_spec(), 3)
            .expect("policy");
        let ids = vec![TrajIds::new(0, 2).expect("ids"), TrajIds::new(1, 2).expect("ids")];
        Rollout::new(envs, p, ids, cfg(600)).expect("rollout")
    };
    let (mut a, mut b) = (make(), make());
    assert_eq!(a.set_seed(10), 12);
    b.set_seed(10);
    assert_eq!(a.collect().expect("a"), b.collect().expect("b"));
    b.set_seed(11);
    assert_ne!(a.collect().expect("a"), b.collect().expect("b"));
}

#[test]
fn bad_config_names_the_field() {
    let err = |c: RolloutConfig, k: usize| match Rollout::new(
        (0..k)
            .map(|_| Box::new(Counting::new(CountingConfig::default()).expect("env")) as Box<dyn Env>)
            .collect(),
        Box::new(Constant::new(&Spec::uniform_box(1, 0.0, 1.0), 1.0).expect("p")),
        (0..k as u64)
            .map(|i| TrajIds::new(i, k.max(1) as u64).expect("ids"))
            .collect(),
        c,
    ) {
        Err(RolloutError::Config { field, .. }) => field,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("accepted a bad config"),
    };
    assert_eq!(err(cfg(0), 1), "frames_per_batch");
    assert_eq!(err(cfg(5), 2), "frames_per_batch");
    assert_eq!(err(cfg(4), 0), "envs");
    assert_eq!(
        err(
            RolloutConfig {
                max_frames_per_traj: Some(0),
                ..cfg(4)
            },
            1
        ),
        "max_frames_per_traj"
    );
    let mut r = counting(2, 0, 2, cfg(4));
    assert!(matches!(
        r.collect_frames(3),
        Err(RolloutError::Config { field: "frames", .. })
    ));
}

/// Emits a NaN observation on its second step.
struct NanEnv {
    spec: Spec,
    t: u64,
}
impl Env for NanEnv {
    fn name(&self) -> &str {
        "Nan"
    }
    fn observation_spec(&self) -> &Spec {
        &self.spec
    }
    fn action_spec(&self) -> &Spec {
        &self.spec
    }
    fn reset(&mut self, _s: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.t = 0;
        obs[0] = 0.0;
        Ok(())
    }
    fn step(&mut self, _a: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        self.t += 1;
        obs[0] = if self.t == 2 { f32::NAN } else { 1.0 };
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
        self.t
    }
    fn set_elapsed_steps(&mut self, s: u64) {
        self.t = s;
    }
}

#[test]
fn nan_observation_is_a_failure_only_when_asked() {
    for nan_is_failure in [false, true] {
        let spec = Spec::uniform_box(1, -1.0, 1.0);
        let env = NanEnv {
            spec: spec.clone(),
            t: 0,
        };
        let mut r = Rollout::new(
            vec![Box::new(env)],
            Box::new(Constant::new(&spec, 0.5).expect("p")),
            vec![TrajIds::new(0, 1).expect("ids")],
            RolloutConfig {
                nan_is_failure,
                ..cfg(4)
            },
        )
        .expect("rollout");
        let res = r.collect();
        if nan_is_failure {
            assert_eq!(res, Err(RolloutError::NanObservation { env: 0 }));
        } else {
            assert!(res.expect("collected").f32(keys::NEXT_OBSERVATION).expect("o")[[0, 1, 0]].is_nan());
        }
    }
}
