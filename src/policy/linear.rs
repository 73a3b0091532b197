//! [`Linear`]: one linear layer from observations to logits (discrete) or tanh-squashed
//! means (continuous); the dense policy with no hidden layer.

use super::dense_policy::{DensePolicy, LinearKind};
use super::fixed_width::Argmax2;
use super::{ActionsMut, PolicyError, RecordMut};
use crate::spec::Spec;

/// A single linear layer `z = W x + b` and an action head: the [`DensePolicy`] with
/// no hidden layer.
///
/// Weights: `weight` f32 `[out, obs_dim]` and `bias` f32 `[out]`, where `out`
/// is `n` for a `Discrete { n }` action spec and the box's length otherwise.
/// A discrete observation spec is fed as one input (the index as f32).
///
/// * Discrete actions: `z` are logits. [`ExplorationType::Deterministic`]
///   takes the argmax (the first one on ties); [`ExplorationType::Random`]
///   samples softmax(`z`) (max-subtracted, so numerically stable).
/// * Continuous actions: the mean of element `j` is
///   `low + (tanh(z) + 1) / 2 * (high - low)`, or plain `tanh(z)` if one of
///   its bounds is infinite. `Random` adds gaussian noise of std
///   `0.1 * (high - low) / 2` (0.1 for infinite bounds). The result is always
///   clipped to `[low, high]`.
///
/// Initial weights are drawn from ChaCha8 seeded by `init_seed`, uniform in
/// `±1/sqrt(obs_dim)` (torch's `nn.Linear` default), `weight` then `bias`.
/// Sampling uses a separate ChaCha8 seeded by `seed` (see [`Policy::reseed`]).
/// The exploration type starts as [`ExplorationType::Random`].
///
/// [`ExplorationType::Deterministic`]: super::ExplorationType::Deterministic
/// [`ExplorationType::Random`]: super::ExplorationType::Random
/// [`Policy::reseed`]: super::Policy::reseed
pub type Linear = DensePolicy<LinearKind>;

impl Linear {
    /// A linear policy for these specs, with initial weights from `init_seed`
    /// and its sampling generator seeded with `seed`.
    pub fn new(obs: &Spec, action: &Spec, init_seed: u64, seed: u64) -> Result<Linear, PolicyError> {
        Linear::build(obs, action, &[], init_seed, seed)
    }

    /// [`Policy::act`](super::Policy::act) for observations of `D` values, a constant
    /// of the collection loop's compiled path: the same actions, from fixed-length
    /// rows. Public so a hand-written loop (the collect benchmark's bare baseline) can
    /// use the same code.
    #[inline(always)]
    pub fn act_fixed<const D: usize>(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
    ) -> Result<(), PolicyError> {
        self.net.act_fixed::<D>(obs, k, actions, RecordMut::nothing())
    }

    /// [`Linear::act_fixed`], recording as
    /// [`Policy::act_recording`](super::Policy::act_recording) does.
    #[inline(always)]
    pub fn act_fixed_recording<const D: usize>(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        self.net.act_fixed::<D>(obs, k, actions, record)
    }

    /// Its deterministic two-action argmax for observations of `D` values, when that is
    /// what [`Linear::act_fixed`] computes (see `Net::argmax2`).
    pub(crate) fn argmax2<const D: usize>(&self) -> Option<Argmax2<D>> {
        self.net.argmax2::<D>()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::test_util::{t, vals, w};
    use super::super::{ExplorationType, Policy};
    use super::*;
    use crate::tensor::Tensor;

    fn cartpole() -> (Spec, Spec) {
        (
            Spec::uniform_box(4, f32::NEG_INFINITY, f32::INFINITY),
            Spec::Discrete { n: 2 },
        )
    }

    fn run_discrete(p: &mut Linear, obs: &[f32], k: usize) -> Vec<i64> {
        let mut out = vec![-1; k];
        p.act(obs, k, ActionsMut::Discrete(&mut out)).unwrap();
        out
    }

    fn run_continuous(p: &mut Linear, obs: &[f32], k: usize, dim: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; k * dim];
        p.act(obs, k, ActionsMut::Continuous(&mut out)).unwrap();
        out
    }

    #[test]
    fn init_is_deterministic_and_torch_like() {
        let (o, a) = cartpole();
        let p1 = Linear::new(&o, &a, 7, 0).unwrap();
        let p2 = Linear::new(&o, &a, 7, 99).unwrap();
        let p3 = Linear::new(&o, &a, 8, 0).unwrap();
        assert_eq!(p1.weights(), p2.weights());
        assert_ne!(p1.weights(), p3.weights());
        let ws = p1.weights();
        assert_eq!(ws.version, 0);
        assert_eq!(ws.tensors.keys().collect::<Vec<_>>(), ["bias", "weight"]);
        assert_eq!(ws.tensors["weight"].shape(), &[2, 4]);
        assert_eq!(ws.tensors["bias"].shape(), &[2]);
        assert_eq!(ws.numel(), 10);
        for v in vals(ws, "weight").into_iter().chain(vals(ws, "bias")) {
            assert!(v.abs() <= 0.5, "{v} outside ±1/sqrt(4)");
        }
    }

    #[test]
    fn sampling_is_deterministic_by_seed() {
        let (o, a) = cartpole();
        let obs: Vec<f32> = (0..32).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut p1 = Linear::new(&o, &a, 1, 5).unwrap();
        let mut p2 = Linear::new(&o, &a, 1, 5).unwrap();
        let mut p3 = Linear::new(&o, &a, 1, 6).unwrap();
        // Make the choice genuinely random: equal logits.
        let zero = w(0, vec![("weight", t(&[2, 4], &[0.0; 8])), ("bias", t(&[2], &[0.0; 2]))]);
        for p in [&mut p1, &mut p2, &mut p3] {
            p.set_weights(&zero).unwrap();
        }
        let s1: Vec<i64> = (0..50).flat_map(|_| run_discrete(&mut p1, &obs, 8)).collect();
        let s2: Vec<i64> = (0..50).flat_map(|_| run_discrete(&mut p2, &obs, 8)).collect();
        let s3: Vec<i64> = (0..50).flat_map(|_| run_discrete(&mut p3, &obs, 8)).collect();
        assert_eq!(s1, s2);
        assert_ne!(s1, s3);
        p1.reseed(5);
        let again: Vec<i64> = (0..50).flat_map(|_| run_discrete(&mut p1, &obs, 8)).collect();
        assert_eq!(s1, again);
    }

    #[test]
    fn deterministic_is_argmax_first_on_ties() {
        let o = Spec::uniform_box(2, -10.0, 10.0);
        let a = Spec::Discrete { n: 3 };
        let mut p = Linear::new(&o, &a, 0, 0).unwrap();
        p.set_exploration(ExplorationType::Deterministic);
        // logits = [x0, x1, 0.5 * (x0 + x1)] + [0, 0, 0]
        let weights = w(
            3,
            vec![
                ("weight", t(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 0.5, 0.5])),
                ("bias", t(&[3], &[0.0, 0.0, 0.0])),
            ],
        );
        p.set_weights(&weights).unwrap();
        assert_eq!(p.weights().version, 3);
        let obs = [3.0, 1.0, 1.0, 3.0, 2.0, 2.0, -1.0, -1.0];
        assert_eq!(run_discrete(&mut p, &obs, 4), [0, 1, 0, 0]);
        // The middle one wins when both inputs are negative but the bias lifts it.
        let weights = w(
            4,
            vec![
                ("weight", t(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 0.0, 0.0])),
                ("bias", t(&[3], &[0.0, 0.0, 0.5])),
            ],
        );
        p.set_weights(&weights).unwrap();
        assert_eq!(run_discrete(&mut p, &[-1.0, -2.0], 1), [2]);
    }

    #[test]
    fn softmax_sampling_frequencies() {
        let (o, a) = cartpole();
        let mut p = Linear::new(&o, &a, 0, 42).unwrap();
        let weights = w(
            0,
            vec![
                ("weight", t(&[2, 4], &[0.0; 8])),
                ("bias", t(&[2], &[0.8f32.ln() + 3.0, 0.2f32.ln() + 3.0])),
            ],
        );
        p.set_weights(&weights).unwrap();
        let obs = [0.5f32; 32];
        let mut zeros = 0;
        for _ in 0..1250 {
            zeros += run_discrete(&mut p, &obs, 8).iter().filter(|&&x| x == 0).count();
        }
        let f = zeros as f64 / 10_000.0;
        assert!((0.75..0.85).contains(&f), "frequency of action 0: {f}");
    }

    #[test]
    fn softmax_sampling_frequencies_three_actions() {
        let o = Spec::uniform_box(1, -1.0, 1.0);
        let a = Spec::Discrete { n: 3 };
        let mut p = Linear::new(&o, &a, 0, 8).unwrap();
        let probs = [0.5f32, 0.3, 0.2];
        let bias: Vec<f32> = probs.iter().map(|p| p.ln() - 2.0).collect();
        p.set_weights(&w(0, vec![("weight", t(&[3, 1], &[0.0; 3])), ("bias", t(&[3], &bias))]))
            .unwrap();
        let mut counts = [0usize; 3];
        for _ in 0..10_000 {
            counts[run_discrete(&mut p, &[0.3], 1)[0] as usize] += 1;
        }
        for (c, p) in counts.iter().zip(probs) {
            let f = *c as f32 / 10_000.0;
            assert!((f - p).abs() < 0.05, "{counts:?}");
        }
    }

    #[test]
    fn softmax_is_stable_for_huge_logits() {
        let o = Spec::uniform_box(1, -1.0, 1.0);
        let a = Spec::Discrete { n: 3 };
        let mut p = Linear::new(&o, &a, 0, 0).unwrap();
        let weights = w(
            0,
            vec![
                ("weight", t(&[3, 1], &[0.0; 3])),
                ("bias", t(&[3], &[1e30, 0.0, -1e30])),
            ],
        );
        p.set_weights(&weights).unwrap();
        for _ in 0..100 {
            assert_eq!(run_discrete(&mut p, &[0.0], 1), [0]);
        }
    }

    #[test]
    fn continuous_mean_scales_to_bounds() {
        let o = Spec::uniform_box(1, -1.0, 1.0);
        let a = Spec::Box {
            low: vec![0.0, -2.0, f32::NEG_INFINITY, 0.0],
            high: vec![1.0, 2.0, f32::INFINITY, f32::INFINITY],
        };
        let mut p = Linear::new(&o, &a, 0, 0).unwrap();
        p.set_exploration(ExplorationType::Deterministic);
        let bias = [0.3f32, -0.7, 0.4, -0.4];
        p.set_weights(&w(0, vec![("weight", t(&[4, 1], &[0.0; 4])), ("bias", t(&[4], &bias))]))
            .unwrap();
        let out = run_continuous(&mut p, &[0.0, 5.0], 2, 4);
        let expect = [
            0.0 + (0.3f32.tanh() + 1.0) / 2.0 * 1.0,
            -2.0 + ((-0.7f32).tanh() + 1.0) / 2.0 * 4.0,
            0.4f32.tanh(),
            0.0, // tanh(-0.4) < 0, clipped to the finite lower bound
        ];
        for row in out.chunks(4) {
            for (g, e) in row.iter().zip(expect) {
                assert!((g - e).abs() < 1e-6, "{row:?} vs {expect:?}");
            }
        }
        // Saturation stays inside the box.
        p.set_weights(&w(
            0,
            vec![("weight", t(&[4, 1], &[100.0; 4])), ("bias", t(&[4], &[0.0; 4]))],
        ))
        .unwrap();
        let out = run_continuous(&mut p, &[1.0, -1.0], 2, 4);
        assert_eq!(&out[..2], [1.0, 2.0]);
        assert_eq!(&out[4..6], [0.0, -2.0]);
    }

    #[test]
    fn random_noise_stays_in_bounds() {
        let o = Spec::uniform_box(2, -1.0, 1.0);
        let a = Spec::Box {
            low: vec![-1.0, 0.0],
            high: vec![1.0, 10.0],
        };
        let mut p = Linear::new(&o, &a, 3, 4).unwrap();
        // Means near the upper bounds, so noise often pushes past them.
        let weights = w(
            0,
            vec![("weight", t(&[2, 2], &[0.0; 4])), ("bias", t(&[2], &[2.0, 2.0]))],
        );
        p.set_weights(&weights).unwrap();
        let mean1 = 5.0 + 5.0 * 2.0f32.tanh();
        let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
        let mut hit_high = false;
        for _ in 0..2000 {
            let out = run_continuous(&mut p, &[0.0; 4], 2, 2);
            for r in out.chunks(2) {
                assert!((-1.0..=1.0).contains(&r[0]), "{r:?}");
                assert!((0.0..=10.0).contains(&r[1]), "{r:?}");
                hit_high |= r[1] == 10.0;
                lo = lo.min(r[1]);
                hi = hi.max(r[1]);
            }
        }
        assert!(hit_high, "noise never reached the bound");
        assert!(lo < mean1 - 0.5 && hi > mean1, "no noise: {lo}..{hi}");
        // Deterministic mode: no noise.
        p.set_exploration(ExplorationType::Deterministic);
        let out = run_continuous(&mut p, &[0.0; 2], 1, 2);
        assert!((out[1] - mean1).abs() < 1e-5);
    }

    #[test]
    fn noise_has_the_documented_std() {
        let o = Spec::uniform_box(1, -1.0, 1.0);
        let a = Spec::Box {
            low: vec![-100.0, f32::NEG_INFINITY],
            high: vec![100.0, f32::INFINITY],
        };
        let mut p = Linear::new(&o, &a, 0, 11).unwrap();
        p.set_weights(&w(
            0,
            vec![("weight", t(&[2, 1], &[0.0; 2])), ("bias", t(&[2], &[0.0; 2]))],
        ))
        .unwrap();
        let n = 10_000;
        let (mut s, mut ss) = ([0.0f64; 2], [0.0f64; 2]);
        for _ in 0..n {
            let out = run_continuous(&mut p, &[0.0], 1, 2);
            for j in 0..2 {
                s[j] += out[j] as f64;
                ss[j] += (out[j] as f64).powi(2);
            }
        }
        for (j, want) in [(0, 10.0), (1, 0.1)] {
            let mean = s[j] / n as f64;
            let std = (ss[j] / n as f64 - mean * mean).sqrt();
            assert!(mean.abs() < 0.1 * want, "mean {mean} for std {want}");
            assert!((std / want - 1.0).abs() < 0.05, "std {std}, expected {want}");
        }
    }

    #[test]
    fn set_weights_checks_layout_and_copies() {
        let (o, a) = cartpole();
        let mut p = Linear::new(&o, &a, 0, 0).unwrap();
        let before = p.weights().clone();
        let good_w = t(&[2, 4], &[1.0; 8]);
        let good_b = t(&[2], &[2.0; 2]);
        let bad = [
            w(1, vec![("weight", t(&[4, 2], &[1.0; 8])), ("bias", good_b.clone())]),
            w(1, vec![("weight", good_w.clone()), ("bias", t(&[3], &[0.0; 3]))]),
            w(1, vec![("weight", good_w.clone())]),
            w(
                1,
                vec![
                    ("weight", good_w.clone()),
                    ("bias", good_b.clone()),
                    ("extra", t(&[1], &[0.0])),
                ],
            ),
            w(1, vec![("weight", good_w.clone()), ("b", good_b.clone())]),
            w(
                1,
                vec![
                    ("weight", Tensor::zeros(crate::tensor::DType::F64, &[2, 4])),
                    ("bias", good_b.clone()),
                ],
            ),
        ];
        for b in &bad {
            assert!(matches!(p.set_weights(b), Err(PolicyError::Weights(_))), "{b:?}");
            assert_eq!(p.weights(), &before);
        }
        p.set_weights(&w(17, vec![("weight", good_w), ("bias", good_b)]))
            .unwrap();
        assert_eq!(p.weights().version, 17);
        assert_eq!(vals(p.weights(), "weight"), [1.0; 8]);
        assert_eq!(vals(p.weights(), "bias"), [2.0; 2]);
    }

    #[test]
    fn shared_weights_are_kept_not_copied_and_never_written_through() {
        let o = Spec::uniform_box(2, -1.0, 1.0);
        let a = Spec::Discrete { n: 2 };
        let mut p = Linear::new(&o, &a, 0, 0).unwrap();
        p.set_exploration(ExplorationType::Deterministic);
        // Action 1 wins for any positive observation.
        let shared = Arc::new(w(
            5,
            vec![
                ("weight", t(&[2, 2], &[0.0, 0.0, 1.0, 1.0])),
                ("bias", t(&[2], &[0.0; 2])),
            ],
        ));
        p.set_shared_weights(&shared).unwrap();
        assert!(
            std::ptr::eq(p.weights(), &*shared),
            "the policy's named copy is the Arc"
        );
        assert_eq!(run_discrete(&mut p, &[0.5, 0.5], 1), [1]);
        // A plain update afterwards must not write into what others share.
        let own = w(
            6,
            vec![
                ("weight", t(&[2, 2], &[1.0, 1.0, 0.0, 0.0])),
                ("bias", t(&[2], &[0.0; 2])),
            ],
        );
        p.set_weights(&own).unwrap();
        assert_eq!(shared.version, 5);
        assert_eq!(vals(&shared, "weight"), [0.0, 0.0, 1.0, 1.0]);
        assert_eq!(p.weights(), &own);
        assert_eq!(run_discrete(&mut p, &[0.5, 0.5], 1), [0]);
        // A bad layout is refused and changes nothing.
        let bad = Arc::new(w(7, vec![("weight", t(&[2, 2], &[0.0; 4]))]));
        assert!(matches!(p.set_shared_weights(&bad), Err(PolicyError::Weights(_))));
        assert_eq!(p.weights(), &own);
    }

    #[test]
    fn set_weights_accepts_non_contiguous_tensors() {
        let o = Spec::uniform_box(2, -1.0, 1.0);
        let a = Spec::Discrete { n: 2 };
        let mut p = Linear::new(&o, &a, 0, 0).unwrap();
        p.set_exploration(ExplorationType::Deterministic);
        // Stored [[0, 1], [5, 0]], seen transposed: [[0, 5], [1, 0]].
        let stored = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[2, 2]), vec![0.0f32, 1.0, 5.0, 0.0]).unwrap();
        let weights = w(
            2,
            vec![
                ("weight", Tensor::F32(stored.reversed_axes())),
                ("bias", t(&[2], &[0.0; 2])),
            ],
        );
        p.set_weights(&weights).unwrap();
        assert_eq!(vals(p.weights(), "weight"), [0.0, 5.0, 1.0, 0.0]);
        // logits = [5 * x1, x0]
        assert_eq!(run_discrete(&mut p, &[1.0, 1.0, 10.0, 1.0], 2), [0, 1]);
    }

    #[test]
    fn bad_buffers_are_errors() {
        let (o, a) = cartpole();
        let mut p = Linear::new(&o, &a, 0, 0).unwrap();
        let mut d = [0i64; 2];
        let mut c = [0f32; 2];
        let obs = [0f32; 8];
        let buffer = |r: Result<(), PolicyError>| matches!(r, Err(PolicyError::Buffer(_)));
        assert!(buffer(p.act(&obs[..7], 2, ActionsMut::Discrete(&mut d))));
        assert!(buffer(p.act(&obs, 2, ActionsMut::Discrete(&mut d[..1]))));
        assert!(buffer(p.act(&obs, 2, ActionsMut::Continuous(&mut c))));
        assert!(buffer(p.act(&obs, usize::MAX, ActionsMut::Discrete(&mut d))));
        p.act(&obs, 2, ActionsMut::Discrete(&mut d)).unwrap();
        p.act(&[], 0, ActionsMut::Discrete(&mut [])).unwrap();

        let a = Spec::uniform_box(3, -1.0, 1.0);
        let mut p = Linear::new(&o, &a, 0, 0).unwrap();
        let mut c = [0f32; 6];
        assert!(buffer(p.act(&obs, 2, ActionsMut::Continuous(&mut c[..5]))));
        assert!(buffer(p.act(&obs, 2, ActionsMut::Discrete(&mut d))));
        p.act(&obs, 2, ActionsMut::Continuous(&mut c)).unwrap();
    }

    #[test]
    fn bad_specs_are_errors() {
        let o = Spec::uniform_box(2, -1.0, 1.0);
        assert!(Linear::new(&o, &Spec::Discrete { n: 0 }, 0, 0).is_err());
        assert!(Linear::new(&Spec::uniform_box(0, 0.0, 1.0), &Spec::Discrete { n: 2 }, 0, 0).is_err());
        let inverted = Spec::Box {
            low: vec![1.0],
            high: vec![0.0],
        };
        assert!(Linear::new(&o, &inverted, 0, 0).is_err());
        assert!(matches!(
            Linear::new(&o, &Spec::Discrete { n: 1 << 40 }, 0, 0),
            Err(PolicyError::Spec(_))
        ));
        // A discrete observation is one input.
        let p = Linear::new(&Spec::Discrete { n: 16 }, &Spec::Discrete { n: 4 }, 0, 0).unwrap();
        assert_eq!(p.weights().tensors["weight"].shape(), &[4, 1]);
    }
}
