//! A real run's batches carry what the policy records beside its actions
//! (`action_log_prob`, `logits` or `loc`/`scale`; PROTOCOL.md §3), in-process and from
//! process nodes, sync and async, consistent with the recorded logits or normal and the
//! recorded actions, and with the fill values on the frames of `init_random_frames`.
//! (The Python node's batches are checked in python_node.rs, against the Rust policy.)

use rollout::rollout::keys;
use rollout::{PolicyConfig, Tensor};
use rollout_actors::{DistributedCollector, Launcher};
use rollout_tests::rollout_bin;

/// The f32 values of `key`, flattened.
fn f32s(data: &rollout::TensorDict, key: &str) -> Vec<f32> {
    match data.get(key) {
        Ok(Tensor::F32(a)) => a.iter().copied().collect(),
        other => panic!("`{key}` is {other:?}"),
    }
}

/// Checks every frame of `data` from a linear/mlp policy; returns how many were the
/// random policy's (`init_random_frames`): in each row they come first.
fn check_frames(data: &rollout::TensorDict, discrete: bool) -> usize {
    let lp = f32s(data, keys::ACTION_LOG_PROB);
    assert_eq!(data.get(keys::ACTION_LOG_PROB).expect("lp").shape(), data.batch_size());
    let steps = data.batch_size()[1];
    let mut is_random = vec![false; lp.len()];
    if discrete {
        let z = f32s(data, keys::LOGITS);
        let Ok(Tensor::I64(a)) = data.get(keys::ACTION) else {
            panic!("discrete actions")
        };
        let a: Vec<i64> = a.iter().copied().collect();
        for i in 0..lp.len() {
            let row = &z[2 * i..2 * i + 2];
            is_random[i] = row == [0.0, 0.0];
            let total: f64 = row.iter().map(|&v| f64::from(v).exp()).sum();
            let want = (f64::from(row[a[i] as usize]).exp() / total).ln();
            assert!((f64::from(lp[i]) - want).abs() < 1e-5, "frame {i}: {} vs {want}", lp[i]);
        }
    } else {
        let (loc, scale, a) = (f32s(data, keys::LOC), f32s(data, keys::SCALE), f32s(data, keys::ACTION));
        for i in 0..lp.len() {
            if loc[i].is_nan() {
                assert!(scale[i].is_nan());
                assert_eq!(lp[i], -(4.0f32.ln()), "frame {i}: the uniform density on [-2, 2]");
                is_random[i] = true;
                continue;
            }
            let (x, m, s) = (f64::from(a[i]), f64::from(loc[i]), f64::from(scale[i]));
            let want = -((x - m) / s).powi(2) / 2.0 - s.ln() - (2.0 * std::f64::consts::PI).sqrt().ln();
            assert!((f64::from(lp[i]) - want).abs() < 1e-5, "frame {i}: {} vs {want}", lp[i]);
        }
    }
    for row in is_random.chunks(steps) {
        let policy_from = row.iter().position(|r| !r).unwrap_or(row.len());
        assert!(
            row[policy_from..].iter().all(|r| !r),
            "a random frame after the policy's: {row:?}"
        );
    }
    is_random.iter().filter(|&&r| r).count()
}

#[test]
fn batches_of_a_run_carry_the_recorded_keys_consistent_with_the_actions() {
    for launcher in [Launcher::Local, Launcher::Process] {
        for sync in [false, true] {
            for (env, policy, discrete) in [
                ("CartPole-v1", PolicyConfig::Linear, true),
                ("Pendulum-v1", PolicyConfig::Mlp { hidden: vec![8] }, false),
            ] {
                let mut b = DistributedCollector::builder()
                    .env(env)
                    .policy(policy.clone())
                    .nodes(2)
                    .envs_per_node(2)
                    .frames_per_batch(80)
                    .total_frames(320)
                    .init_random_frames(30)
                    .sync(sync)
                    .seed(4)
                    .launcher(launcher.clone());
                if launcher == Launcher::Process {
                    b = b.node_program(rollout_bin());
                }
                let mut c = b.build().expect("collector");
                let mut random = 0;
                let mut frames = 0;
                while let Some(batch) = c.next_batch().expect("batch") {
                    let has = |k: &str| batch.data.get(k).is_ok();
                    assert_eq!(
                        (has(keys::LOGITS), has(keys::LOC), has(keys::SCALE)),
                        (discrete, !discrete, !discrete)
                    );
                    random += check_frames(&batch.data, discrete);
                    frames += batch.data.numel();
                }
                c.shutdown().expect("shutdown");
                assert_eq!(frames, 320);
                // The first frames of the run are the random policy's (how many of them
                // each worker takes is the collector's split of `init_random_frames`).
                assert!(
                    (1..frames).contains(&random),
                    "{launcher:?} sync={sync} {env}: {random} random frames"
                );
            }
        }
    }
}
