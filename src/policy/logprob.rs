//! The log-probability formulas every policy records with (docs/policies.md): the
//! same functions on every path, the compiled one-env loop and the ONNX heads
//! included, so a frame's `action_log_prob` does not depend on which loop collected it.
//!
//! Computed in f64 and stored as f32, as the Python node computes them. The built-in
//! networks take two logits by [`log_softmax2`]; an ONNX categorical head takes any
//! number by the general [`log_softmax_f64`], as the Python node's ONNX policy does.

use super::record::{ParamsMut, RecordMut};
use super::PolicyError;

/// `ln sqrt(2 pi)`.
const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

/// `ln softmax(z)[a]` as the built-in networks record it: [`log_softmax2`] for two
/// logits, else [`log_softmax_f64`].
#[inline]
pub(super) fn log_softmax_at(z: &[f32], a: usize) -> f32 {
    if let [z0, z1] = *z {
        return log_softmax2(z0, z1, a);
    }
    log_softmax_f64(z, a) as f32
}

/// `ln softmax(z)[a]`: `z_a - m - ln sum_j exp(z_j - m)` with `m = max z`, in f64,
/// the sum in order: the categorical log-probability of any number of logits.
#[inline]
pub(super) fn log_softmax_f64(z: &[f32], a: usize) -> f64 {
    let m = z.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let mut s = 0.0f64;
    for &v in z {
        s += (f64::from(v) - m).exp();
    }
    (f64::from(z[a]) - m) - s.ln()
}

/// [`log_softmax_at`] for two logits: `(z_a - m) - ln(1 + exp(-|z0 - z1|))`, in f64
/// by [`ln_1p_exp_neg`]; within one f32 ulp of libm's `exp` and `ln_1p`. One row of
/// [`log_softmax2_batch`], so that it runs on the machine's fused multiply-add as the
/// batch does (outside a function compiled for it, `mul_add` is a call into libm).
#[inline]
pub(crate) fn log_softmax2(z0: f32, z1: f32, a: usize) -> f32 {
    let mut out = [0.0f32];
    log_softmax2_batch(&[z0, z1], &[a as i64], &mut out);
    out[0]
}

/// [`log_softmax2`] of every row of `logits` (two per row) for `actions`, into `out`:
/// several rows per instruction (AVX-512, AVX2 or AVX, picked at run time).
#[multiversion::multiversion(targets("x86_64+avx512f", "x86_64+avx2+fma", "x86_64+avx"))]
pub(crate) fn log_softmax2_batch(logits: &[f32], actions: &[i64], out: &mut [f32]) {
    for (lp, (z, &a)) in out.iter_mut().zip(logits.chunks_exact(2).zip(actions)) {
        *lp = log_softmax2_row(z[0], z[1], a);
    }
}

/// One row of [`log_softmax2_batch`], inlined into each of its compiled versions.
#[inline(always)]
fn log_softmax2_row(z0: f32, z1: f32, a: i64) -> f32 {
    let (z0, z1) = (f64::from(z0), f64::from(z1));
    let d = (z0 - z1).abs();
    // The taken action's logit less the larger one: 0 for the larger one.
    let za = if a == 0 { z0 } else { z1 };
    ((za - z0.max(z1)) - ln_1p_exp_neg(d)) as f32
}

/// `2^n` for a whole `n` in `-1022..=1023`, the exponent field written directly:
/// `n + 1023 + 2^52` is exact in f64 and its mantissa field is `n + 1023`, which the
/// shift moves into the exponent field. Kept in floating point: a saturating `as i64`
/// does not vectorise.
#[inline(always)]
fn pow2(n: f64) -> f64 {
    f64::from_bits((n + (1023.0 + 4_503_599_627_370_496.0)).to_bits() << 52)
}

/// `1/k!` for `k` from 0: the Taylor series of `e^r` through `r^10`, whose next term
/// is below `2.3e-13` of the sum on `|r| <= ln 2 / 2`.
const EXP_TAYLOR: [f64; 11] = [
    1.0,
    1.0,
    1.0 / 2.0,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5_040.0,
    1.0 / 40_320.0,
    1.0 / 362_880.0,
    1.0 / 3_628_800.0,
];
/// `1/(2k + 1)` for `k` from 0: `atanh(s) / s = sum u^k / (2k + 1)`, `u = s^2 <= 1/9`,
/// through `u^11`, whose next term is below `1.5e-13` of the sum. Both bounds are far
/// below half an f32 ulp (`6e-8`): all the precision a recorded f32 holds.
const ATANH_SERIES: [f64; 12] = [
    1.0,
    1.0 / 3.0,
    1.0 / 5.0,
    1.0 / 7.0,
    1.0 / 9.0,
    1.0 / 11.0,
    1.0 / 13.0,
    1.0 / 15.0,
    1.0 / 17.0,
    1.0 / 19.0,
    1.0 / 21.0,
    1.0 / 23.0,
];

/// `c[0] + z (c[1] + z (c[2] + ...))`, innermost first, each step one fused
/// multiply-add (one rounding: the same bits on every machine, with or without the
/// instruction).
#[inline(always)]
fn horner<const N: usize>(c: &[f64; N], z: f64) -> f64 {
    let mut p = c[N - 1];
    for &v in c[..N - 1].iter().rev() {
        p = p.mul_add(z, v);
    }
    p
}

/// `ln(1 + exp(-d))` for `d >= 0` (NaN for NaN), in f64 with no branch and no libm
/// call: `exp` by range reduction to `|r| <= ln 2 / 2` and its Taylor polynomial,
/// `ln(1 + e)` as `2 atanh(e / (2 + e))` by its series (`e <= 1`, so the argument is
/// at most 1/3).
#[inline(always)]
fn ln_1p_exp_neg(d: f64) -> f64 {
    const LN2_HI: f64 = 6.931_471_803_691_238e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    // exp(-700) is 1e-304: ln(1 + it) is it, far below what an f32 result can hold.
    let t = -d.min(700.0);
    let n = (t * std::f64::consts::LOG2_E - 0.5).ceil();
    let r = (t - n * LN2_HI) - n * LN2_LO;
    // n is a whole number in -1010..=0.
    let e = horner(&EXP_TAYLOR, r) * pow2(n);
    let s = e / (2.0 + e);
    let q = horner(&ATANH_SERIES, s * s);
    let v = 2.0 * s * q;
    if d.is_nan() {
        f64::NAN
    } else {
        v
    }
}

/// Log-density of `x` under a normal of mean `loc` and std `scale`, in f64:
/// `-((x - loc) / scale)^2 / 2 - ln scale - ln sqrt(2 pi)`.
#[inline]
pub(super) fn normal_log_prob(x: f32, loc: f32, scale: f32) -> f64 {
    normal_log_density(f64::from(x), f64::from(loc), f64::from(scale))
}

/// [`normal_log_prob`] of values already in f64 (an ONNX head's).
#[inline]
pub(super) fn normal_log_density(x: f64, loc: f64, scale: f64) -> f64 {
    let z = (x - loc) / scale;
    -0.5 * z * z - scale.ln() - LN_SQRT_2PI
}

/// The tanh-normal log-density of the action made from the pre-tanh `u`, with
/// half-range `h`: `normal(u) - ln h - 2 (ln 2 - u - softplus(-2u))` (torch's
/// TanhTransform then AffineTransform).
#[cfg(feature = "onnx")]
pub(super) fn tanh_normal_log_density(u: f64, loc: f64, s: f64, h: f64) -> f64 {
    normal_log_density(u, loc, s) - h.ln() - 2.0 * (std::f64::consts::LN_2 - u - softplus(-2.0 * u))
}

/// softplus(x) = ln(1 + e^x), without overflow.
#[cfg(feature = "onnx")]
fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// What a [`RecordMut`] asks of a policy writing `k` rows of `params` parameters each:
/// whether to write log-probabilities, and whether to write parameters. Empty buffers
/// ask for nothing; buffers of another size are an error.
pub(super) fn wanted(record: &RecordMut<'_>, k: usize, params: usize) -> Result<(bool, bool), PolicyError> {
    let lp = match record.log_prob.len() {
        0 => false,
        n if n == k => true,
        n => return Err(record_error("action_log_prob", n, k)),
    };
    let want = k.saturating_mul(params);
    let p = match &record.params {
        ParamsMut::None => false,
        ParamsMut::Logits(z) if z.len() == want => true,
        ParamsMut::Normal { loc, scale } if loc.len() == want && scale.len() == want => true,
        ParamsMut::Logits(z) => return Err(record_error("logits", z.len(), want)),
        ParamsMut::Normal { loc, .. } => return Err(record_error("loc/scale", loc.len(), want)),
    };
    Ok((lp, p))
}

/// The error for a record buffer of the wrong size.
#[cold]
#[inline(never)]
fn record_error(key: &str, len: usize, want: usize) -> PolicyError {
    PolicyError::Buffer(format!("{key} buffer has {len} values, expected {want}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_matches_a_softmax_by_hand() {
        for z in [
            vec![0.3f32, -1.2],
            vec![5.0, 5.0],
            vec![0.1, 2.0, -3.0, 0.7],
            vec![80.0, -80.0, 1.0],
        ] {
            let total: f64 = z.iter().map(|&v| f64::from(v).exp()).sum();
            for a in 0..z.len() {
                let by_hand = (f64::from(z[a]).exp() / total).ln();
                let got = f64::from(log_softmax_at(&z, a));
                assert!(
                    (got - by_hand).abs() < 1e-6 * by_hand.abs().max(1.0),
                    "{z:?} {a}: {got} vs {by_hand}"
                );
            }
        }
        // Stable where exp overflows f32 and f64 alike.
        assert_eq!(log_softmax_at(&[1000.0, 0.0], 0), 0.0);
        assert!((log_softmax_at(&[1000.0, 0.0, 0.0], 1) + 1000.0).abs() < 1e-3);
    }

    #[test]
    fn two_logits_equal_the_general_formula() {
        for (z0, z1) in [(0.3f32, -1.2f32), (-4.0, 7.5), (2.0, 2.0), (1e-8, -1e-8)] {
            for a in 0..2 {
                let m = f64::from(z0.max(z1));
                let s = (f64::from(z0) - m).exp() + (f64::from(z1) - m).exp();
                let za = f64::from(if a == 0 { z0 } else { z1 });
                let want = ((za - m) - s.ln()) as f32;
                assert!(
                    (log_softmax2(z0, z1, a) - want).abs() <= want.abs() * 1.2e-7,
                    "{z0} {z1} {a}"
                );
            }
        }
    }

    #[test]
    fn two_logits_match_libm_over_the_whole_range() {
        let mut z = 0.0f64;
        while z < 800.0 {
            for a in 0..2 {
                let (z0, z1) = (z as f32, 0.0f32);
                let libm = {
                    let (z0, z1) = (f64::from(z0), f64::from(z1));
                    let m = z0.max(z1);
                    let za = if a == 0 { z0 } else { z1 };
                    ((za - m) - (z0.min(z1) - m).exp().ln_1p()) as f32
                };
                let got = log_softmax2(z0, z1, a);
                // Both round an f64 to f32: at most one f32 ulp apart (subnormals included).
                let ulps = (i64::from(got.to_bits()) - i64::from(libm.to_bits())).abs();
                assert!(got == libm || ulps <= 1, "{z} {a}: {got} vs {libm}");
                assert_eq!(log_softmax2(z1, z0, 1 - a), got);
            }
            z = if z < 1.0 { z + 1e-3 } else { z * 1.01 };
        }
        assert_eq!(log_softmax2(0.0, 0.0, 0), -std::f32::consts::LN_2);
        assert!(log_softmax2(f32::NAN, 0.0, 0).is_nan());
        assert_eq!(log_softmax2(f32::INFINITY, 0.0, 1), f32::NEG_INFINITY);
    }

    #[test]
    fn the_batch_pass_equals_one_row_at_a_time() {
        let logits: Vec<f32> = (0..200).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37).collect();
        let actions: Vec<i64> = (0..100).map(|i| i % 2).collect();
        let mut out = vec![0.0f32; 100];
        log_softmax2_batch(&logits, &actions, &mut out);
        for r in 0..100 {
            assert_eq!(
                out[r],
                log_softmax2(logits[2 * r], logits[2 * r + 1], actions[r] as usize)
            );
        }
    }

    #[test]
    fn pow2_is_the_integer_exponent() {
        for n in -1022..=1023i64 {
            assert_eq!(
                pow2(n as f64).to_bits(),
                f64::from_bits(((n + 1023) as u64) << 52).to_bits(),
                "{n}"
            );
        }
    }

    #[test]
    fn normal_log_prob_is_the_closed_form() {
        let (x, loc, s) = (0.7f32, 0.2f32, 0.3f32);
        let want = -(0.5f64 / 0.3).powi(2) / 2.0 - 0.3f64.ln() - (2.0 * std::f64::consts::PI).sqrt().ln();
        assert!((normal_log_prob(x, loc, s) - want).abs() < 1e-6);
    }

    #[test]
    fn softplus_is_stable() {
        assert!((softplus(0.0) - std::f64::consts::LN_2).abs() < 1e-15);
        assert!((softplus(800.0) - 800.0).abs() < 1e-12);
        assert!(softplus(-800.0) >= 0.0);
    }

    #[test]
    fn categorical_log_probs_sum_to_one() {
        let z = [0.3f32, -1.2, 2.5];
        let total: f64 = (0..3).map(|a| log_softmax_f64(&z, a).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
    }

    #[test]
    fn wrong_record_sizes_are_errors() {
        let mut lp = [0.0f32; 3];
        let r = RecordMut {
            log_prob: &mut lp,
            params: ParamsMut::None,
        };
        assert!(wanted(&r, 2, 2).is_err());
        assert_eq!(wanted(&r, 3, 2).unwrap(), (true, false));
        assert_eq!(wanted(&RecordMut::nothing(), 3, 2).unwrap(), (false, false));
        let mut z = [0.0f32; 5];
        let r = RecordMut {
            log_prob: &mut [],
            params: ParamsMut::Logits(&mut z),
        };
        assert!(wanted(&r, 3, 2).is_err());
    }
}
