//! From the model's outputs to actions and what is recorded beside them, exactly as
//! the design's formulas say (log-probabilities in f64, stored as f32).

use super::OnnxError;
use crate::policy::common::{argmax, Sampler};

/// ln sqrt(2 pi).
const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

/// Mode or sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pick {
    /// The distribution's mode.
    Mode,
    /// A sample.
    Sample,
}

/// The categorical log-probability of `a` under `logits`: z_a - m - ln sum exp(z - m).
pub(super) fn categorical_log_prob(logits: &[f32], a: usize) -> f64 {
    let m = logits.iter().fold(f64::NEG_INFINITY, |m, &z| m.max(f64::from(z)));
    let sum: f64 = logits.iter().map(|&z| (f64::from(z) - m).exp()).sum();
    f64::from(logits[a]) - m - sum.ln()
}

/// One categorical choice: the first argmax, or a sample by inverse CDF in f64.
pub(super) fn categorical(logits: &[f32], pick: Pick, sampler: &mut Sampler) -> usize {
    let best = argmax(logits);
    if pick == Pick::Mode {
        return best;
    }
    let u = f64::from(sampler.uniform());
    let m = f64::from(logits[best]);
    let total: f64 = logits.iter().map(|&z| (f64::from(z) - m).exp()).sum();
    if !(total.is_finite() && total > 0.0) {
        return best;
    }
    let t = u * total;
    let mut acc = 0.0;
    let mut last = best;
    for (i, &z) in logits.iter().enumerate() {
        let e = (f64::from(z) - m).exp();
        acc += e;
        if t < acc {
            return i;
        }
        if e > 0.0 {
            last = i;
        }
    }
    last
}

/// The normal log-density of `a`: -((a - loc) / s)^2 / 2 - ln s - ln sqrt(2 pi).
pub(super) fn normal_log_prob(a: f64, loc: f64, s: f64) -> f64 {
    let z = (a - loc) / s;
    -0.5 * z * z - s.ln() - LN_SQRT_2PI
}

/// softplus(x) = ln(1 + e^x), without overflow.
fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// One dimension of a normal: the action (clipped to `[low, high]`'s finite bounds)
/// and its log-density.
pub(super) fn normal(loc: f32, s: f32, low: f32, high: f32, pick: Pick, sampler: &mut Sampler) -> (f32, f64) {
    let raw = match pick {
        Pick::Mode => loc,
        Pick::Sample => loc + s * sampler.normal(),
    };
    let a = clip(raw, low, high);
    (a, normal_log_prob(f64::from(a), f64::from(loc), f64::from(s)))
}

/// One dimension of a tanh-normal: u = loc or loc + s eps, action = c + h tanh(u), and
/// lp = normal_lp(u) - ln h - 2 (ln 2 - u - softplus(-2u)) (torch's TanhTransform then
/// AffineTransform). c = 0, h = 1 where a bound is infinite.
pub(super) fn tanh_normal(loc: f32, s: f32, low: f32, high: f32, pick: Pick, sampler: &mut Sampler) -> (f32, f64) {
    let u = match pick {
        Pick::Mode => f64::from(loc),
        Pick::Sample => f64::from(loc) + f64::from(s) * f64::from(sampler.normal()),
    };
    let (c, h) = centre_half(low, high);
    let a = clip((c + h * u.tanh()) as f32, low, high);
    (a, tanh_normal_log_prob(u, f64::from(loc), f64::from(s), h))
}

/// The tanh-normal log-density of the action made from the pre-tanh `u`, with half-range `h`.
pub(super) fn tanh_normal_log_prob(u: f64, loc: f64, s: f64, h: f64) -> f64 {
    normal_log_prob(u, loc, s) - h.ln() - 2.0 * (std::f64::consts::LN_2 - u - softplus(-2.0 * u))
}

/// The affine map of a tanh-normal for one dimension: (c, h).
pub(super) fn centre_half(low: f32, high: f32) -> (f64, f64) {
    if low.is_finite() && high.is_finite() {
        let (l, h) = (f64::from(low), f64::from(high));
        ((h + l) / 2.0, (h - l) / 2.0)
    } else {
        (0.0, 1.0)
    }
}

/// `v` clipped to the finite ones of `low` and `high`.
pub(super) fn clip(v: f32, low: f32, high: f32) -> f32 {
    let v = if low.is_finite() && v < low { low } else { v };
    if high.is_finite() && v > high {
        high
    } else {
        v
    }
}

/// Checks a standard deviation: finite and positive, or names the output.
pub(super) fn check_scale(name: &str, s: f32) -> Result<f32, OnnxError> {
    if s.is_finite() && s > 0.0 {
        Ok(s)
    } else {
        Err(OnnxError::output(
            name,
            format!("gave the standard deviation {s}; it must be finite and > 0"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softplus_is_stable() {
        assert!((softplus(0.0) - std::f64::consts::LN_2).abs() < 1e-15);
        assert!((softplus(800.0) - 800.0).abs() < 1e-12);
        assert!(softplus(-800.0) >= 0.0);
    }

    #[test]
    fn clip_keeps_infinite_bounds_open() {
        assert_eq!(clip(5.0, f32::NEG_INFINITY, f32::INFINITY), 5.0);
        assert_eq!(clip(5.0, -2.0, 2.0), 2.0);
        assert_eq!(clip(-5.0, -2.0, f32::INFINITY), -2.0);
    }

    #[test]
    fn categorical_log_probs_sum_to_one() {
        let z = [0.3f32, -1.2, 2.5];
        let total: f64 = (0..3).map(|a| categorical_log_prob(&z, a).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
    }
}
