//! [`Mlp`]: a multi-layer perceptron, tanh hidden layers, then a head as for
//! [`Linear`](super::Linear).

use super::dense_policy::{DensePolicy, MlpKind};
use super::PolicyError;
use crate::spec::Spec;

/// Dense layers of the given hidden widths with tanh activations, then a
/// linear output layer and the same action head as [`Linear`](super::Linear): the
/// [`DensePolicy`] with hidden layers.
///
/// Weights: `layers.{i}.weight` f32 `[out, in]` and `layers.{i}.bias` f32
/// `[out]` for `i` in `0..=hidden.len()`; the last layer is the output one
/// (`n` logits, or one value per action element). With no hidden layer this
/// computes exactly what [`Linear`](super::Linear) does, under other names.
///
/// Initial weights: one ChaCha8 seeded by `init_seed`, layer by layer, weight
/// then bias, uniform in `±1/sqrt(fan_in)` (torch's `nn.Linear` default).
/// Sampling and exploration noise are as for [`Linear`](super::Linear).
pub type Mlp = DensePolicy<MlpKind>;

impl Mlp {
    /// An MLP policy with these `hidden` widths (each at least 1), initial
    /// weights from `init_seed` and its sampling generator seeded with `seed`.
    pub fn new(obs: &Spec, action: &Spec, hidden: &[usize], init_seed: u64, seed: u64) -> Result<Mlp, PolicyError> {
        Mlp::build(obs, action, hidden, init_seed, seed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::test_util::{t, vals, w};
    use super::super::{ActionsMut, ExplorationType, Linear, Policy};
    use super::*;
    use crate::tensor::Tensor;

    #[test]
    fn layout_and_deterministic_init() {
        let o = Spec::uniform_box(4, -1.0, 1.0);
        let a = Spec::Discrete { n: 3 };
        let p = Mlp::new(&o, &a, &[16, 8], 5, 0).unwrap();
        let ws = p.weights();
        let shapes: Vec<(&str, &[usize])> = ws.tensors.iter().map(|(k, v)| (k.as_str(), v.shape())).collect();
        assert_eq!(
            shapes,
            [
                ("layers.0.bias", &[16][..]),
                ("layers.0.weight", &[16, 4][..]),
                ("layers.1.bias", &[8][..]),
                ("layers.1.weight", &[8, 16][..]),
                ("layers.2.bias", &[3][..]),
                ("layers.2.weight", &[3, 8][..]),
            ]
        );
        assert_eq!(ws.numel(), 16 * 4 + 16 + 8 * 16 + 8 + 3 * 8 + 3);
        for (name, bound) in [
            ("layers.0.weight", 0.5),
            ("layers.1.weight", 0.25),
            ("layers.2.bias", 1.0 / 8f32.sqrt()),
        ] {
            assert!(vals(ws, name).iter().all(|v| v.abs() <= bound), "{name}");
        }
        assert_eq!(ws, Mlp::new(&o, &a, &[16, 8], 5, 1).unwrap().weights());
        assert_ne!(ws, Mlp::new(&o, &a, &[16, 8], 6, 0).unwrap().weights());
    }

    #[test]
    fn zero_width_is_a_spec_error() {
        let o = Spec::uniform_box(4, -1.0, 1.0);
        let a = Spec::Discrete { n: 2 };
        match Mlp::new(&o, &a, &[8, 0], 0, 0) {
            Err(PolicyError::Spec(m)) => assert!(m.contains("hidden layer 1"), "{m}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted a zero width"),
        }
    }

    #[test]
    fn no_hidden_layer_equals_linear() {
        let o = Spec::uniform_box(4, -1.0, 1.0);
        let a = Spec::uniform_box(2, -3.0, 1.0);
        let mut m = Mlp::new(&o, &a, &[], 9, 4).unwrap();
        let mut l = Linear::new(&o, &a, 9, 4).unwrap();
        assert_eq!(vals(m.weights(), "layers.0.weight"), vals(l.weights(), "weight"));
        assert_eq!(vals(m.weights(), "layers.0.bias"), vals(l.weights(), "bias"));
        let obs = [0.1, -0.2, 0.3, 0.9, 1.0, 0.0, -1.0, 0.5];
        let (mut x, mut y) = ([0.0; 4], [0.0; 4]);
        for _ in 0..10 {
            m.act(&obs, 2, ActionsMut::Continuous(&mut x)).unwrap();
            l.act(&obs, 2, ActionsMut::Continuous(&mut y)).unwrap();
            assert_eq!(x, y);
        }
    }

    /// obs x = [1, 2]
    /// layer 0: W = [[1, 0], [0.5, -1]], b = [0, 0.5] -> [1, -1] -> tanh -> [t, -t], t = tanh(1)
    /// layer 1: W = [[1, -1], [-2, 0]], b = [0.1, 0] -> z = [0.1 + 2t, -2t] = [1.62318831, -1.52318831]
    /// head, bounds [-1, 1] and [0, 4]: [tanh(z0), 2 + 2 tanh(z1)] = [0.92509, 0.18150]
    fn hand_net(action: Spec) -> Mlp {
        let o = Spec::uniform_box(2, -10.0, 10.0);
        let mut p = Mlp::new(&o, &action, &[2], 0, 0).unwrap();
        p.set_weights(&w(
            1,
            vec![
                ("layers.0.weight", t(&[2, 2], &[1.0, 0.0, 0.5, -1.0])),
                ("layers.0.bias", t(&[2], &[0.0, 0.5])),
                ("layers.1.weight", t(&[2, 2], &[1.0, -1.0, -2.0, 0.0])),
                ("layers.1.bias", t(&[2], &[0.1, 0.0])),
            ],
        ))
        .unwrap();
        p.set_exploration(ExplorationType::Deterministic);
        p
    }

    #[test]
    fn hand_worked_network() {
        let a = Spec::Box {
            low: vec![-1.0, 0.0],
            high: vec![1.0, 4.0],
        };
        let mut p = hand_net(a);
        let mut out = [0.0f32; 4];
        p.act(&[1.0, 2.0, 1.0, 2.0], 2, ActionsMut::Continuous(&mut out))
            .unwrap();
        let expect = [0.925_09, 0.181_50];
        for (g, e) in out.iter().zip(expect.iter().cycle()) {
            assert!((g - e).abs() < 1e-4, "{out:?} vs {expect:?}");
        }
        // Same computation in f64, tighter.
        let t1 = 1f64.tanh();
        let exact = [(0.1 + 2.0 * t1).tanh(), 2.0 + 2.0 * (-2.0 * t1).tanh()];
        for (g, e) in out.iter().zip(exact) {
            assert!((*g as f64 - e).abs() < 1e-5);
        }
        // As logits: z0 > z1, so argmax is 0; for x = [-1, -2]: z = [0.1 - 2t, 2t] -> 1.
        let mut p = hand_net(Spec::Discrete { n: 2 });
        let mut d = [9i64; 2];
        p.act(&[1.0, 2.0, -1.0, -2.0], 2, ActionsMut::Discrete(&mut d)).unwrap();
        assert_eq!(d, [0, 1]);
    }

    #[test]
    fn set_weights_checks_every_layer() {
        let mut p = hand_net(Spec::Discrete { n: 2 });
        let mut ws = p.weights().clone().with_version(8);
        ws.tensors.insert("layers.1.bias".into(), t(&[3], &[0.0; 3]));
        assert!(matches!(p.set_weights(&ws), Err(PolicyError::Weights(_))));
        assert_eq!(p.weights().version, 1);
        ws.tensors.insert("layers.1.bias".into(), t(&[2], &[0.0, 7.0]));
        p.set_weights(&ws).unwrap();
        assert_eq!(p.weights().version, 8);
        assert_eq!(vals(p.weights(), "layers.1.bias"), [0.0, 7.0]);
        let mut d = [9i64; 1];
        p.act(&[1.0, 2.0], 1, ActionsMut::Discrete(&mut d)).unwrap();
        assert_eq!(d, [1]);
    }

    /// A network over the size from which layers are read from the named tensors.
    fn large(action: &Spec) -> Mlp {
        let o = Spec::uniform_box(6, -1.0, 1.0);
        Mlp::new(&o, action, &[300, 300], 3, 9).unwrap()
    }

    #[test]
    fn a_large_network_reads_its_named_tensors_and_computes_as_a_flat_one() {
        for action in [Spec::Discrete { n: 4 }, Spec::uniform_box(3, -2.0, 2.0)] {
            let mut named = large(&action);
            assert!(named.net.is_named());
            let mut flat = Mlp::from_net(large(&action).net.into_flat());
            assert!(!flat.net.is_named());
            assert!(!Mlp::new(&Spec::uniform_box(6, -1.0, 1.0), &action, &[64, 64], 3, 9)
                .unwrap()
                .net
                .is_named());
            let obs: Vec<f32> = (0..6 * 5).map(|i| (i as f32 * 0.37).sin()).collect();
            for exploration in [ExplorationType::Deterministic, ExplorationType::Random] {
                named.set_exploration(exploration);
                flat.set_exploration(exploration);
                for _ in 0..3 {
                    match &action {
                        Spec::Discrete { .. } => {
                            let (mut x, mut y) = ([0i64; 5], [0i64; 5]);
                            named.act(&obs, 5, ActionsMut::Discrete(&mut x)).unwrap();
                            flat.act(&obs, 5, ActionsMut::Discrete(&mut y)).unwrap();
                            assert_eq!(x, y);
                        }
                        _ => {
                            let (mut x, mut y) = ([0f32; 15], [0f32; 15]);
                            named.act(&obs, 5, ActionsMut::Continuous(&mut x)).unwrap();
                            flat.act(&obs, 5, ActionsMut::Continuous(&mut y)).unwrap();
                            assert_eq!(x, y, "bit for bit");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_large_network_keeps_shared_weights_without_copying_and_lays_out_views() {
        let action = Spec::uniform_box(3, -2.0, 2.0);
        let mut p = large(&action);
        let obs = [0.1f32, -0.3, 0.5, 0.2, 0.9, -0.7];
        let mut before = [0f32; 3];
        p.set_exploration(ExplorationType::Deterministic);
        p.act(&obs, 1, ActionsMut::Continuous(&mut before)).unwrap();
        // Scaled weights, shared: the policy computes with them and holds the same Arc.
        let mut scaled = p.weights().clone().with_version(4);
        for t in scaled.tensors.values_mut() {
            if let Tensor::F32(a) = t {
                a.mapv_inplace(|v| v * 0.5);
            }
        }
        let shared = Arc::new(scaled);
        p.set_shared_weights(&shared).unwrap();
        assert!(std::ptr::eq(p.weights(), &*shared), "no copy");
        let mut after = [0f32; 3];
        p.act(&obs, 1, ActionsMut::Continuous(&mut after)).unwrap();
        assert_ne!(before, after);
        // A transposed view of the output layer's weight is laid out anew, values kept.
        let mut viewed = (*shared).clone().with_version(5);
        let w = viewed.tensors["layers.2.weight"].as_f32().unwrap().clone();
        let t = w.t().as_standard_layout().into_owned();
        viewed
            .tensors
            .insert("layers.2.weight".into(), Tensor::F32(t.reversed_axes()));
        assert!(viewed.tensors["layers.2.weight"].as_f32().unwrap().as_slice().is_none());
        p.set_shared_weights(&Arc::new(viewed)).unwrap();
        let mut again = [0f32; 3];
        p.act(&obs, 1, ActionsMut::Continuous(&mut again)).unwrap();
        assert_eq!(after, again);
        assert_eq!(p.weights().version, 5);
        // A plain update never writes through the Arc others hold.
        let held = Arc::clone(&shared);
        p.set_shared_weights(&shared).unwrap();
        p.set_weights(&(*shared).clone().with_version(6)).unwrap();
        assert_eq!(held.version, 4);
        assert_eq!(p.weights().version, 6);
    }

    #[test]
    fn sampling_is_deterministic_by_seed() {
        let o = Spec::uniform_box(3, -1.0, 1.0);
        let a = Spec::uniform_box(2, -2.0, 2.0);
        let mut p1 = Mlp::new(&o, &a, &[4], 0, 21).unwrap();
        let mut p2 = Mlp::new(&o, &a, &[4], 0, 21).unwrap();
        let obs = [0.3f32; 9];
        let (mut x, mut y) = ([0.0; 6], [0.0; 6]);
        p1.act(&obs, 3, ActionsMut::Continuous(&mut x)).unwrap();
        p2.act(&obs, 3, ActionsMut::Continuous(&mut y)).unwrap();
        assert_eq!(x, y);
        assert_ne!(x[..2], x[2..4], "noise differs between rows");
        assert!(x.iter().all(|v| (-2.0..=2.0).contains(v)));
        p1.reseed(21);
        p1.act(&obs, 3, ActionsMut::Continuous(&mut y)).unwrap();
        assert_eq!(x, y);
    }

    /// A batch of `k` observations gives, bit for bit, the actions of its rows asked
    /// one at a time: the batched forward sums in the one-row order, and the head
    /// draws from the sampler row by row.
    #[test]
    fn a_batch_acts_as_its_rows_one_by_one() {
        let o = Spec::uniform_box(5, -1.0, 1.0);
        for (a, exploration) in [
            (Spec::Discrete { n: 3 }, ExplorationType::Random),
            (Spec::Discrete { n: 2 }, ExplorationType::Random),
            (Spec::Discrete { n: 7 }, ExplorationType::Deterministic),
            (Spec::uniform_box(3, -2.0, 2.0), ExplorationType::Random),
            (Spec::uniform_box(3, -2.0, 2.0), ExplorationType::Deterministic),
        ] {
            for k in [1, 3, 4, 16, 21, 64] {
                let mut batched = Mlp::new(&o, &a, &[64, 64], 7, 3).unwrap();
                let mut single = batched.clone();
                batched.set_exploration(exploration);
                single.set_exploration(exploration);
                let obs: Vec<f32> = (0..k * 5).map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * 3.0).collect();
                match &a {
                    Spec::Discrete { .. } => {
                        let mut all = vec![-1i64; k];
                        batched.act(&obs, k, ActionsMut::Discrete(&mut all)).unwrap();
                        for r in 0..k {
                            let mut one = [-1i64];
                            single
                                .act(&obs[r * 5..(r + 1) * 5], 1, ActionsMut::Discrete(&mut one))
                                .unwrap();
                            assert_eq!(all[r], one[0], "{a:?} {exploration:?} k {k} row {r}");
                        }
                    }
                    Spec::Box { .. } => {
                        let mut all = vec![f32::NAN; k * 3];
                        batched.act(&obs, k, ActionsMut::Continuous(&mut all)).unwrap();
                        for r in 0..k {
                            let mut one = [f32::NAN; 3];
                            single
                                .act(&obs[r * 5..(r + 1) * 5], 1, ActionsMut::Continuous(&mut one))
                                .unwrap();
                            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&all[r * 3..(r + 1) * 3]),
                                bits(&one),
                                "{a:?} {exploration:?} k {k} row {r}"
                            );
                        }
                    }
                }
            }
        }
    }
}
