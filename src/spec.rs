//! Observation and action specs: what an env emits and accepts.

use serde::{Deserialize, Serialize};

/// The space a value lives in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Spec {
    /// A continuous box of f32 values with per-element bounds.
    Box {
        /// Lower bounds, one per element.
        low: Vec<f32>,
        /// Upper bounds, one per element.
        high: Vec<f32>,
    },
    /// One integer in `0..n` (stored as i64).
    Discrete {
        /// Number of choices.
        n: u64,
    },
}

/// Why a spec or a value does not fit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// A box with mismatched or inverted bounds.
    #[error("invalid box spec: {0}")]
    InvalidBox(String),
    /// A discrete spec with no choice.
    #[error("discrete spec needs n >= 1")]
    EmptyDiscrete,
    /// A value of the wrong length.
    #[error("expected {expected} values, got {got}")]
    Length {
        /// Elements required.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// A NaN where a number is needed.
    #[error("value {index} is NaN")]
    NaN {
        /// Position of the NaN.
        index: usize,
    },
    /// A discrete value outside `0..n`.
    #[error("discrete value {value} outside 0..{n}")]
    OutOfRange {
        /// The value.
        value: i64,
        /// The spec's n.
        n: u64,
    },
    /// A discrete value where a continuous one is expected, or the reverse.
    #[error("expected a {expected} value, got a {got} one")]
    Kind {
        /// The kind required.
        expected: &'static str,
        /// The kind given.
        got: &'static str,
    },
}

impl Spec {
    /// A box with the same bounds for each of `dim` elements.
    pub fn uniform_box(dim: usize, low: f32, high: f32) -> Spec {
        Spec::Box {
            low: vec![low; dim],
            high: vec![high; dim],
        }
    }

    /// Checks bounds and sizes.
    pub fn validate(&self) -> Result<(), SpecError> {
        match self {
            Spec::Box { low, high } => {
                if low.len() != high.len() {
                    return Err(SpecError::InvalidBox(format!(
                        "{} lower bounds but {} upper bounds",
                        low.len(),
                        high.len()
                    )));
                }
                if low.is_empty() {
                    return Err(SpecError::InvalidBox("no element".into()));
                }
                for (i, (l, h)) in low.iter().zip(high).enumerate() {
                    if l.is_nan() || h.is_nan() || l > h {
                        return Err(SpecError::InvalidBox(format!("bounds {l}..{h} of element {i}")));
                    }
                }
                Ok(())
            }
            Spec::Discrete { n } => {
                if *n == 0 {
                    Err(SpecError::EmptyDiscrete)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Elements per value: the box's length, or 1 for discrete.
    pub fn dim(&self) -> usize {
        match self {
            Spec::Box { low, .. } => low.len(),
            Spec::Discrete { .. } => 1,
        }
    }

    /// True for a discrete spec.
    pub fn is_discrete(&self) -> bool {
        matches!(self, Spec::Discrete { .. })
    }

    /// The per-frame feature shape of a value in a batch: `[dim]` for a box, `[]` for discrete.
    pub fn feature_shape(&self) -> Vec<usize> {
        match self {
            Spec::Box { low, .. } => vec![low.len()],
            Spec::Discrete { .. } => vec![],
        }
    }

    /// Checks one continuous value: right length, no NaN (bounds are the env's to clip).
    pub fn check_continuous(&self, v: &[f32]) -> Result<(), SpecError> {
        match self {
            Spec::Box { low, .. } => {
                if v.len() != low.len() {
                    return Err(SpecError::Length {
                        expected: low.len(),
                        got: v.len(),
                    });
                }
                if let Some(index) = v.iter().position(|x| x.is_nan()) {
                    return Err(SpecError::NaN { index });
                }
                Ok(())
            }
            Spec::Discrete { .. } => Err(SpecError::Kind {
                expected: "discrete",
                got: "continuous",
            }),
        }
    }

    /// Checks one discrete value against `0..n`.
    pub fn check_discrete(&self, v: i64) -> Result<(), SpecError> {
        match self {
            Spec::Discrete { n } => {
                if v < 0 || v as u64 >= *n {
                    Err(SpecError::OutOfRange { value: v, n: *n })
                } else {
                    Ok(())
                }
            }
            Spec::Box { .. } => Err(SpecError::Kind {
                expected: "continuous",
                got: "discrete",
            }),
        }
    }
}
