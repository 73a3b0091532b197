//! The built-in networks' action head: how raw outputs become actions (logits, or a
//! tanh-scaled mean with exploration noise, clipped to the box).

use super::dense_layout::MAX_PARAMS;
use super::PolicyError;
use crate::spec::Spec;

/// Std of the exploration noise, as a fraction of the half-range of the action box.
pub(super) const NOISE_FRACTION: f32 = 0.1;

/// How raw outputs become actions.
#[derive(Clone)]
pub(super) enum Head {
    /// Logits over `n` choices.
    Discrete {
        /// Number of choices.
        n: usize,
    },
    /// `mid + half * tanh(z)`, plus noise `noise * N(0, 1)` when exploring,
    /// clipped to `[low, high]`. For an element with an infinite bound,
    /// `mid = 0`, `half = 1`, `noise = 0.1`.
    Continuous {
        low: Vec<f32>,
        high: Vec<f32>,
        mid: Vec<f32>,
        half: Vec<f32>,
        noise: Vec<f32>,
    },
}

impl Head {
    /// The head for `action` (which must be valid).
    pub(super) fn new(action: &Spec) -> Result<Head, PolicyError> {
        action.validate()?;
        Ok(match action {
            Spec::Discrete { n } => Head::Discrete {
                n: usize::try_from(*n)
                    .ok()
                    .filter(|&n| n <= MAX_PARAMS)
                    .ok_or_else(|| PolicyError::Spec(format!("{n} discrete actions are too many")))?,
            },
            Spec::Box { low, high } => {
                let mut mid = Vec::with_capacity(low.len());
                let mut half = Vec::with_capacity(low.len());
                for (&l, &h) in low.iter().zip(high) {
                    if l.is_finite() && h.is_finite() {
                        // Halve first so that huge finite bounds cannot overflow.
                        mid.push(0.5 * l + 0.5 * h);
                        half.push(0.5 * h - 0.5 * l);
                    } else {
                        mid.push(0.0);
                        half.push(1.0);
                    }
                }
                let noise = half.iter().map(|h| NOISE_FRACTION * h).collect();
                Head::Continuous {
                    low: low.clone(),
                    high: high.clone(),
                    mid,
                    half,
                    noise,
                }
            }
        })
    }

    /// Number of raw outputs: `n` logits, or one per action element.
    pub(super) fn out_dim(&self) -> usize {
        match self {
            Head::Discrete { n } => *n,
            Head::Continuous { low, .. } => low.len(),
        }
    }
}
