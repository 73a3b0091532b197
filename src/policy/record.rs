//! What a policy records beside its actions: the log-probability of each action
//! under the distribution it was drawn from, and that distribution's parameters
//! (torchrl's `action_log_prob`, `logits`, `loc`, `scale`). A learner such as PPO
//! needs the behaviour policy's log-probabilities; with them in the batch it does
//! not have to recompute them with the exact weights of each batch.

use serde::{Deserialize, Serialize};

use crate::schema::{keys, BatchLayout};
use crate::tensor::DType;

/// Which keys a policy writes beside `action`, with their sizes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Recorded {
    /// Nothing: the policy has no distribution (`constant`, a deterministic ONNX head).
    #[default]
    None,
    /// `action_log_prob` only (the `random` policy: a uniform distribution has no
    /// parameters worth recording).
    LogProb,
    /// `action_log_prob` and `logits` f32 `[n]`: a categorical distribution.
    Categorical {
        /// Number of actions.
        n: usize,
    },
    /// `action_log_prob`, `loc` and `scale` f32 `[d]`: a normal distribution per action
    /// dimension (for a tanh-normal, of the action before the squashing).
    Normal {
        /// Action dimension.
        d: usize,
    },
    /// `action_value` f32 `[n]` and `chosen_action_value` f32 `[1]`: a Q-value actor
    /// (torchrl's `QValueModule`; the `onnx` `qvalue` head). No log-probability: the
    /// greedy action has none worth recording. Carried in the log-probability and
    /// first parameter columns.
    QValue {
        /// Number of actions.
        n: usize,
    },
}

impl Recorded {
    /// Adds the keys this writes to a batch layout.
    pub fn extend_layout(&self, layout: &mut BatchLayout) {
        let mut put = |key: &str, shape: Vec<usize>| {
            layout.insert(key.to_string(), (DType::F32, shape));
        };
        match *self {
            Recorded::None => {}
            Recorded::LogProb => put(keys::ACTION_LOG_PROB, vec![]),
            Recorded::Categorical { n } => {
                put(keys::ACTION_LOG_PROB, vec![]);
                put(keys::LOGITS, vec![n]);
            }
            Recorded::Normal { d } => {
                put(keys::ACTION_LOG_PROB, vec![]);
                put(keys::LOC, vec![d]);
                put(keys::SCALE, vec![d]);
            }
            Recorded::QValue { n } => {
                put(keys::ACTION_VALUE, vec![n]);
                put(keys::CHOSEN_ACTION_VALUE, vec![1]);
            }
        }
    }

    /// The same kind sized for `action` (a multi-agent group's own): `Categorical` and
    /// `QValue` take its choices, `Normal` its dimension; `None` when the kind cannot
    /// act on it (its node refuses the policy).
    pub fn sized_for(&self, action: &crate::spec::Spec) -> Recorded {
        use crate::spec::Spec;
        match (*self, action) {
            (Recorded::None, _) => Recorded::None,
            (Recorded::LogProb, _) => Recorded::LogProb,
            (Recorded::Categorical { .. }, Spec::Discrete { n }) => Recorded::Categorical {
                n: usize::try_from(*n).unwrap_or(usize::MAX),
            },
            (Recorded::QValue { .. }, Spec::Discrete { n }) => Recorded::QValue {
                n: usize::try_from(*n).unwrap_or(usize::MAX),
            },
            (Recorded::Normal { .. }, Spec::Box { low, .. }) => Recorded::Normal { d: low.len() },
            _ => Recorded::None,
        }
    }

    /// Values per frame of the distribution's parameters (`n`, `2 * d`, or 0).
    pub fn params_per_frame(&self) -> usize {
        match *self {
            Recorded::None | Recorded::LogProb => 0,
            Recorded::Categorical { n } | Recorded::QValue { n } => n,
            Recorded::Normal { d } => d.saturating_mul(2),
        }
    }
}

/// Where a policy writes what it records for `k` rows (see [`Recorded`]); slices a
/// policy does not record into are empty.
#[derive(Debug)]
pub struct RecordMut<'a> {
    /// `k` log-probabilities, one per action written (summed over an action's
    /// dimensions); for [`Recorded::QValue`], the greedy action's value; empty for
    /// [`Recorded::None`].
    pub log_prob: &'a mut [f32],
    /// The distribution's parameters.
    pub params: ParamsMut<'a>,
}

impl RecordMut<'_> {
    /// Nothing to record into: for a policy whose [`Recorded`] is `None`.
    pub fn nothing() -> RecordMut<'static> {
        RecordMut {
            log_prob: &mut [],
            params: ParamsMut::None,
        }
    }
}

/// The parameter buffers of a [`RecordMut`].
#[derive(Debug)]
pub enum ParamsMut<'a> {
    /// No parameters ([`Recorded::None`], [`Recorded::LogProb`]).
    None,
    /// `k * n` logits (for [`Recorded::QValue`], action values), row-major.
    Logits(&'a mut [f32]),
    /// `k * d` locations and `k * d` scales, row-major.
    Normal {
        /// Means.
        loc: &'a mut [f32],
        /// Standard deviations.
        scale: &'a mut [f32],
    },
}
