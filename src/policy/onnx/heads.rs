//! From the model's outputs to actions, exactly as the design's formulas say; their
//! log-probabilities are [`logprob`](crate::policy::logprob)'s (in f64, stored as f32).

use super::OnnxError;
use crate::policy::logprob::{normal_log_density, tanh_normal_log_density};
use crate::policy::sampler::{argmax, Sampler};

/// Mode or sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pick {
    /// The distribution's mode.
    Mode,
    /// A sample.
    Sample,
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

/// One dimension of a normal: the action (clipped to `[low, high]`'s finite bounds)
/// and its log-density.
pub(super) fn normal(loc: f32, s: f32, low: f32, high: f32, pick: Pick, sampler: &mut Sampler) -> (f32, f64) {
    let raw = match pick {
        Pick::Mode => loc,
        Pick::Sample => loc + s * sampler.normal(),
    };
    let a = clip(raw, low, high);
    (a, normal_log_density(f64::from(a), f64::from(loc), f64::from(s)))
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
    (a, tanh_normal_log_density(u, f64::from(loc), f64::from(s), h))
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
    fn clip_keeps_infinite_bounds_open() {
        assert_eq!(clip(5.0, f32::NEG_INFINITY, f32::INFINITY), 5.0);
        assert_eq!(clip(5.0, -2.0, 2.0), 2.0);
        assert_eq!(clip(-5.0, -2.0, f32::INFINITY), -2.0);
    }
}
