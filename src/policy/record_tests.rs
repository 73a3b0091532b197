//! Every built-in policy's records against an independent computation: a softmax by
//! hand in f64, the normal's closed form, the uniform density.

use super::*;

/// The records of `k` rows of `p` for `recorded`, with its actions.
struct Rows {
    discrete: Vec<i64>,
    continuous: Vec<f32>,
    log_prob: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
}

fn run(p: &mut dyn Policy, action: &Spec, obs: &[f32], k: usize) -> Rows {
    let m = match p.recorded() {
        Recorded::Categorical { n } => n,
        Recorded::Normal { d } => d,
        _ => 0,
    };
    let mut r = Rows {
        discrete: vec![-1; k],
        continuous: vec![f32::NAN; k * action.dim()],
        log_prob: vec![f32::NAN; k],
        a: vec![f32::NAN; k * m],
        b: vec![f32::NAN; k * m],
    };
    let params = match p.recorded() {
        Recorded::Categorical { .. } => ParamsMut::Logits(&mut r.a),
        Recorded::Normal { .. } => ParamsMut::Normal {
            loc: &mut r.a,
            scale: &mut r.b,
        },
        _ => ParamsMut::None,
    };
    let record = RecordMut {
        log_prob: &mut r.log_prob,
        params,
    };
    let actions = if action.is_discrete() {
        ActionsMut::Discrete(&mut r.discrete)
    } else {
        ActionsMut::Continuous(&mut r.continuous)
    };
    p.act_recording(obs, k, actions, record).unwrap();
    r
}

fn obs(k: usize, dim: usize) -> Vec<f32> {
    (0..k * dim).map(|i| ((i * 37 % 17) as f32 - 8.0) / 5.0).collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * b.abs().max(1.0)
}

#[test]
fn categorical_records_logits_and_their_log_softmax() {
    for (n, hidden) in [(2u64, None), (3, None), (4, Some(vec![5]))] {
        for exploration in [ExplorationType::Deterministic, ExplorationType::Random] {
            let (o, a) = (Spec::uniform_box(4, -1.0, 1.0), Spec::Discrete { n });
            let config = hidden
                .clone()
                .map_or(PolicyConfig::Linear, |hidden| PolicyConfig::Mlp { hidden });
            let spec = PolicySpec {
                config: config.clone(),
                exploration,
                init_seed: 3,
                record: true,
            };
            let mut p = spec.build(&o, &a, 11).unwrap();
            let n = n as usize;
            assert_eq!(p.recorded(), Recorded::Categorical { n });
            assert_eq!(config.recorded(&a), p.recorded());
            let k = 50;
            let x = obs(k, 4);
            let r = run(p.as_mut(), &a, &x, k);
            // The same actions as without recording, from a policy in the same state.
            let mut q = spec.build(&o, &a, 11).unwrap();
            let mut plain = vec![0i64; k];
            q.act(&x, k, ActionsMut::Discrete(&mut plain)).unwrap();
            assert_eq!(plain, r.discrete);
            for row in 0..k {
                let z = &r.a[row * n..(row + 1) * n];
                let total: f64 = z.iter().map(|&v| f64::from(v).exp()).sum();
                let act = r.discrete[row] as usize;
                let want = (f64::from(z[act]).exp() / total).ln();
                assert!(close(f64::from(r.log_prob[row]), want), "{config:?} row {row}");
                if exploration == ExplorationType::Deterministic {
                    assert!(z.iter().all(|&v| v <= z[act]), "the mode is the argmax");
                }
            }
        }
    }
}

#[test]
fn normal_records_the_tanh_mean_the_noise_std_and_the_clipped_density() {
    // One bounded element, one unbounded (mean tanh(z), std 0.1, never clipped).
    let o = Spec::uniform_box(3, -8.0, 8.0);
    let a = Spec::Box {
        low: vec![-2.0, f32::NEG_INFINITY],
        high: vec![2.0, f32::INFINITY],
    };
    for exploration in [ExplorationType::Deterministic, ExplorationType::Random] {
        let spec = PolicySpec {
            config: PolicyConfig::Mlp { hidden: vec![6] },
            exploration,
            init_seed: 1,
            record: true,
        };
        let mut p = spec.build(&o, &a, 5).unwrap();
        // Large outputs, so that the noise pushes some actions past the bounds.
        let mut w = p.weights().clone();
        if let Some(Tensor::F32(b)) = w.tensors.get_mut("layers.1.bias") {
            b[[0]] = 2.5;
        }
        p.set_weights(&w).unwrap();
        assert_eq!(p.recorded(), Recorded::Normal { d: 2 });
        let k = 400;
        let x = obs(k, 3);
        let r = run(p.as_mut(), &a, &x, k);
        let mut clipped = 0;
        for row in 0..k {
            let mut want = 0.0f64;
            for j in 0..2 {
                let (act, loc, s) = (r.continuous[2 * row + j], r.a[2 * row + j], r.b[2 * row + j]);
                assert_eq!(s, if j == 0 { 0.2 } else { 0.1 }, "the noise std");
                let (act, loc, s) = (f64::from(act), f64::from(loc), f64::from(s));
                want += -((act - loc) / s).powi(2) / 2.0 - s.ln() - (2.0 * std::f64::consts::PI).sqrt().ln();
                if j == 0 && act == 2.0 {
                    clipped += 1;
                }
                if exploration == ExplorationType::Deterministic {
                    assert_eq!(act, loc.clamp(-2.0, 2.0));
                }
            }
            assert!(close(f64::from(r.log_prob[row]), want), "row {row}");
        }
        if exploration == ExplorationType::Random {
            assert!(clipped > 0, "some actions were clipped");
        }
    }
}

#[test]
fn random_records_the_uniform_density() {
    let inf = f32::INFINITY;
    let cases = [
        (Spec::Discrete { n: 6 }, -(6.0f64.ln())),
        (
            Spec::Box {
                low: vec![-2.0, 0.0],
                high: vec![2.0, 0.5],
            },
            -(4.0f64.ln()) - 0.5f64.ln(),
        ),
        (
            Spec::Box {
                low: vec![-inf, 0.0],
                high: vec![inf, inf],
            },
            -2.0 * 2.0f64.ln(),
        ),
    ];
    for (a, want) in cases {
        let mut p = PolicySpec::from(PolicyConfig::Random)
            .build(&Spec::uniform_box(1, -1.0, 1.0), &a, 2)
            .unwrap();
        assert_eq!(p.recorded(), Recorded::LogProb);
        assert_eq!(PolicyConfig::Random.recorded(&a), Recorded::LogProb);
        let r = run(p.as_mut(), &a, &[0.0; 8], 8);
        assert!(
            r.log_prob.iter().all(|&lp| lp == want as f32),
            "{a:?}: {:?}",
            r.log_prob
        );
    }
}

#[test]
fn constant_records_nothing() {
    let (o, a) = (Spec::uniform_box(2, -1.0, 1.0), Spec::Discrete { n: 3 });
    let config = PolicyConfig::Constant { value: 1.0 };
    let mut p = PolicySpec::from(config.clone()).build(&o, &a, 0).unwrap();
    assert_eq!(p.recorded(), Recorded::None);
    assert_eq!(config.recorded(&a), Recorded::None);
    let mut actions = [0i64; 2];
    p.act_recording(&[0.0; 4], 2, ActionsMut::Discrete(&mut actions), RecordMut::nothing())
        .unwrap();
    assert_eq!(actions, [1, 1]);
}

#[test]
fn the_compiled_path_records_as_act_does() {
    let (o, a) = (Spec::uniform_box(4, -1.0, 1.0), Spec::Discrete { n: 2 });
    for exploration in [ExplorationType::Deterministic, ExplorationType::Random] {
        let mut p = Linear::new(&o, &a, 4, 9).unwrap();
        p.set_exploration(exploration);
        let mut q = p.clone();
        let k = 64;
        let x = obs(k, 4);
        let r = run(&mut p, &a, &x, k);
        let (mut act, mut lp, mut z) = (vec![0i64; k], vec![0.0f32; k], vec![0.0f32; 2 * k]);
        let record = RecordMut {
            log_prob: &mut lp,
            params: ParamsMut::Logits(&mut z),
        };
        q.act_fixed_recording::<4>(&x, k, ActionsMut::Discrete(&mut act), record)
            .unwrap();
        assert_eq!(act, r.discrete);
        assert_eq!(z, r.a);
        assert_eq!(
            lp.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            r.log_prob.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn record_buffers_of_the_wrong_size_are_errors() {
    let (o, a) = (Spec::uniform_box(4, -1.0, 1.0), Spec::Discrete { n: 3 });
    let mut p = Linear::new(&o, &a, 0, 0).unwrap();
    let mut actions = [0i64; 2];
    let mut z = [0.0f32; 5];
    let record = RecordMut {
        log_prob: &mut [],
        params: ParamsMut::Logits(&mut z),
    };
    assert!(matches!(
        p.act_recording(&[0.0; 8], 2, ActionsMut::Discrete(&mut actions), record),
        Err(PolicyError::Buffer(_))
    ));
}
