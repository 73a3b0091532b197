//! A rollout told not to record (`recording(false)`, a node spec whose `policy.record` is
//! off): its batches leave out what the policy records, and every other entry is the
//! frame the recording rollout writes, on each compiled path.

use super::*;
use crate::env::Registry;
use crate::policy::{ExplorationType, PolicyConfig, PolicySpec};
use crate::schema::keys;
use crate::EnvSpec;

/// `k` built-in `env`s stepped by `policy` (explored as `exploration`), recording or not.
fn rollout(env: &str, policy: PolicyConfig, exploration: ExplorationType, k: usize, record: bool) -> Rollout {
    let reg = Registry::with_builtins();
    let envs: Vec<Box<dyn Env>> = (0..k).map(|_| reg.make(&EnvSpec::new(env)).expect("env")).collect();
    let spec = PolicySpec {
        config: policy,
        exploration,
        init_seed: 3,
        record,
    };
    let p = spec
        .build(envs[0].observation_spec(), envs[0].action_spec(), 11)
        .expect("policy");
    let ids = (0..k as u64).map(|i| TrajIds::new(i, k as u64).expect("ids")).collect();
    let cfg = RolloutConfig {
        frames_per_batch: 300 * k,
        ..RolloutConfig::default()
    };
    Rollout::new(envs, p, ids, cfg).expect("rollout").recording(record)
}

#[test]
fn an_unrecorded_rollout_leaves_out_the_records_and_nothing_else_on_every_path() {
    let cases = [
        // One env, deterministic linear CartPole: the loop that keeps the observation in registers.
        ("CartPole-v1", PolicyConfig::Linear, ExplorationType::Deterministic, 1),
        // Several envs and an MLP: the general loop, deterministic and sampling.
        (
            "CartPole-v1",
            PolicyConfig::Mlp { hidden: vec![8] },
            ExplorationType::Deterministic,
            4,
        ),
        ("Pendulum-v1", PolicyConfig::Linear, ExplorationType::Random, 3),
        ("CartPole-v1", PolicyConfig::Random, ExplorationType::Random, 2),
    ];
    for (env, policy, exploration, k) in cases {
        let case = format!("{env}, {policy:?}, {exploration:?}, {k} envs");
        let mut on = rollout(env, policy.clone(), exploration, k, true);
        let mut off = rollout(env, policy, exploration, k, false);
        assert_ne!(on.recorded(), Recorded::None, "{case}");
        assert_eq!(off.recorded(), Recorded::None, "{case}");
        for batch in 0..3 {
            let a = on.collect().expect("collect");
            let b = off.collect().expect("collect");
            assert!(a.contains(keys::ACTION_LOG_PROB), "{case}");
            for key in keys::RECORDED {
                assert!(!b.contains(key), "{case}: batch {batch} holds {key}");
            }
            let recorded: Vec<&str> = a.keys().filter(|k| keys::RECORDED.contains(k)).collect();
            assert_eq!(
                a.keys().filter(|k| !recorded.contains(k)).collect::<Vec<_>>(),
                b.keys().collect::<Vec<_>>(),
                "{case}"
            );
            for (key, t) in b.iter() {
                assert_eq!(Some(t), a.get(key).ok(), "{case}: batch {batch}, `{key}`");
            }
            assert_eq!(
                off.batch_layout().len(),
                b.len(),
                "{case}: the layout says what the batch holds"
            );
        }
    }
}
