//! The log-probability formulas every policy records with (docs/policies.md): the
//! same functions on every path, the compiled one-env loop included, so a frame's
//! `action_log_prob` does not depend on which loop collected it.
//!
//! Computed in f64 and stored as f32, as the Python node computes them.

use super::record::{ParamsMut, RecordMut};
use super::PolicyError;

/// `ln sqrt(2 pi)`.
const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

/// `ln softmax(z)[a]`: `z_a - m - ln sum_j exp(z_j - m)` with `m = max z`, in f64.
#[inline]
pub(super) fn log_softmax_at(z: &[f32], a: usize) -> f32 {
    if let [z0, z1] = *z {
        return log_softmax2(z0, z1, a);
    }
    let m = z.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let mut s = 0.0f64;
    for &v in z {
        s += (f64::from(v) - m).exp();
    }
    ((f64::from(z[a]) - m) - s.ln()) as f32
}

/// [`log_softmax_at`] for two logits: `(z_a - m) - ln(1 + exp(-|z_0 - z_1|))`, in f64
/// with the branch-free [`softplus_neg`] instead of calls to `exp` and `ln` (the one-env
/// argmax loop computes this for every frame; the calls cost more than its env step).
#[inline(always)]
pub(super) fn log_softmax2(z0: f32, z1: f32, a: usize) -> f32 {
    let (z0, z1) = (f64::from(z0), f64::from(z1));
    let m = z0.max(z1);
    let za = if a == 0 { z0 } else { z1 };
    let other = if z0 >= z1 { z1 } else { z0 };
    ((za - m) - softplus_neg(m - other)) as f32
}

/// `ln(1 + exp(-x))` for `x >= 0` (NaN for NaN), to within a few f64 ulps, with no call
/// and no branch: `exp(-x) = 2^-k exp(-r)`, `|r| <= ln 2 / 2` (Taylor to degree 13), then
/// `ln(1 + e) = 2 atanh(e / (2 + e))` (the odd series to degree 35, `e / (2 + e) <= 1/3`).
#[inline(always)]
fn softplus_neg(x: f64) -> f64 {
    const LN2_HI: f64 = 6.931_471_803_691_238_2e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    // Past 708, exp(-x) is below f64's normal range: ln(1 + e) is 0 to f64's precision.
    let big = !(x <= 708.0);
    let xc = if big { 0.0 } else { x };
    let k = (xc * std::f64::consts::LOG2_E + 0.5).floor();
    let r = (xc - k * LN2_HI) - k * LN2_LO;
    // exp(-r), |r| <= 0.35.
    let mut p = 1.0 / 6_227_020_800.0; // 1/13!
    for c in [
        479_001_600.0f64,
        39_916_800.0,
        3_628_800.0,
        362_880.0,
        40_320.0,
        5_040.0,
        720.0,
        120.0,
        24.0,
        6.0,
        2.0,
        1.0,
        1.0,
    ] {
        p = p * -r + 1.0 / c;
    }
    let two_k = f64::from_bits(((1023 - k as i64) as u64) << 52);
    let e = p * two_k;
    let s = e / (2.0 + e);
    let s2 = s * s;
    let mut q = 1.0 / 35.0;
    let mut d = 33.0f64;
    while d >= 1.0 {
        q = q * s2 + 1.0 / d;
        d -= 2.0;
    }
    let y = 2.0 * s * q;
    if x.is_nan() {
        f64::NAN
    } else if big {
        0.0
    } else {
        y
    }
}

/// Log-density of `x` under a normal of mean `loc` and std `scale`, in f64:
/// `-((x - loc) / scale)^2 / 2 - ln scale - ln sqrt(2 pi)`.
#[inline]
pub(super) fn normal_log_prob(x: f32, loc: f32, scale: f32) -> f64 {
    let z = (f64::from(x) - f64::from(loc)) / f64::from(scale);
    -0.5 * z * z - f64::from(scale).ln() - LN_SQRT_2PI
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
        let mut z = vec![
            (0.3f32, -1.2f32),
            (-4.0, 7.5),
            (2.0, 2.0),
            (1e-8, -1e-8),
            (0.0, 800.0),
            (-30.0, 30.0),
        ];
        let mut x = 0.123f32;
        for _ in 0..20_000 {
            x = (x * 7.31 + 0.377).fract();
            z.push(((x - 0.5) * 40.0, (0.5 - x * x) * 9.0));
        }
        for (z0, z1) in z {
            for a in 0..2 {
                let m = f64::from(z0.max(z1));
                let s = (f64::from(z0) - m).exp() + (f64::from(z1) - m).exp();
                let za = f64::from(if a == 0 { z0 } else { z1 });
                let want = ((za - m) - s.ln()) as f32;
                let got = log_softmax2(z0, z1, a);
                // Within one f32 ulp of the libm computation (almost always equal); near 0,
                // where libm's `1 + e` rounds `e` away, within 1e-10.
                let tol = want.abs().max(1e-3) * f32::EPSILON;
                assert!((got - want).abs() <= tol, "{z0} {z1} {a}: {got} vs {want}");
            }
        }
        assert!(log_softmax2(f32::NAN, 1.0, 0).is_nan());
        assert_eq!(log_softmax2(f32::INFINITY, 0.0, 1), f32::NEG_INFINITY);
    }

    #[test]
    fn softplus_is_within_a_few_ulps_of_libm() {
        let mut worst = 0.0f64;
        // Up to 700: past 708 it is 0, where the true value is below 1e-307.
        for i in 0..189_000 {
            let x = f64::from(i) * 0.0037;
            let want = (-x).exp().ln_1p();
            let got = softplus_neg(x);
            worst = worst.max((got - want).abs() / want.max(f64::MIN_POSITIVE));
        }
        assert!(worst < 1e-14, "relative error {worst}");
        assert_eq!(softplus_neg(1e6), 0.0);
        assert_eq!(softplus_neg(f64::INFINITY), 0.0);
    }

    #[test]
    fn normal_log_prob_is_the_closed_form() {
        let (x, loc, s) = (0.7f32, 0.2f32, 0.3f32);
        let want = -(0.5f64 / 0.3).powi(2) / 2.0 - 0.3f64.ln() - (2.0 * std::f64::consts::PI).sqrt().ln();
        assert!((normal_log_prob(x, loc, s) - want).abs() < 1e-6);
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
