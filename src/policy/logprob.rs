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

/// [`log_softmax_at`] for two logits (the same value; one `exp`, as `exp(0) = 1`).
#[inline(always)]
pub(super) fn log_softmax2(z0: f32, z1: f32, a: usize) -> f32 {
    let (z0, z1) = (f64::from(z0), f64::from(z1));
    let m = z0.max(z1);
    let za = if a == 0 { z0 } else { z1 };
    let other = if z0 >= z1 { z1 } else { z0 };
    ((za - m) - (1.0 + (other - m).exp()).ln()) as f32
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
        for (z0, z1) in [(0.3f32, -1.2f32), (-4.0, 7.5), (2.0, 2.0), (1e-8, -1e-8)] {
            for a in 0..2 {
                let m = f64::from(z0.max(z1));
                let s = (f64::from(z0) - m).exp() + (f64::from(z1) - m).exp();
                let za = f64::from(if a == 0 { z0 } else { z1 });
                assert_eq!(log_softmax2(z0, z1, a), ((za - m) - s.ln()) as f32);
            }
        }
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
