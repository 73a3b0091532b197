//! A recurrent policy's state: the tensors it carries for each env from one step to
//! the next (torchrl's `recurrent_state_h`, `recurrent_state_c` for an `LSTMModule`,
//! `recurrent_state` for a `GRUModule`), what it says about the batch's keys, and the
//! buffers one call reads and writes it in (PROTOCOL.md §8, Recurrent).
//!
//! The policy itself keeps no state: the collection loop holds each env's rows, zeroes
//! them where an episode starts (`is_init`), hands them to the policy and keeps what it
//! returns. So a weight update, a batch boundary or a checkpoint never touches them
//! behind the loop's back.

use serde::{Deserialize, Serialize};

use super::PolicyError;
use crate::schema::{keys, BatchLayout};
use crate::tensor::DType;

/// The most state tensors a recurrent policy may carry.
pub const MAX_STATE_TENSORS: usize = 8;
/// The most elements one state tensor may hold per env.
pub const MAX_STATE_ELEMENTS: usize = 1 << 20;
/// The longest state name, in bytes.
pub const MAX_STATE_NAME_BYTES: usize = 128;
/// The highest rank of a state tensor's per-env shape.
pub const MAX_STATE_RANK: usize = 8;

/// One tensor of a recurrent policy's state: its batch key and its shape per env
/// (f32; torchrl's `[num_layers, hidden_size]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateTensor {
    /// The batch key it is recorded under (`next.<name>` for the state after a step),
    /// and the model's input of that name.
    pub name: String,
    /// The shape per env.
    pub shape: Vec<usize>,
}

impl StateTensor {
    /// A state tensor named `name` of `shape` per env.
    pub fn new(name: impl Into<String>, shape: impl Into<Vec<usize>>) -> StateTensor {
        StateTensor {
            name: name.into(),
            shape: shape.into(),
        }
    }

    /// Elements per env (a checked state's product fits: [`check_state`]).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The batch key of the state after a step, and the model's output of that name.
    pub fn next_key(&self) -> String {
        format!("next.{}", self.name)
    }
}

/// Keys a state tensor may neither take nor nest under: the batch's own, and the
/// groups the batch owns (`next.`, `collector.`).
const RESERVED: &[&str] = &[
    keys::OBSERVATION,
    keys::ACTION,
    keys::IS_INIT,
    keys::STEP_COUNT,
    keys::ACTION_LOG_PROB,
    keys::LOGITS,
    keys::LOC,
    keys::SCALE,
    keys::ACTION_VALUE,
    keys::CHOSEN_ACTION_VALUE,
    "next",
    "collector",
];

/// Whether `name` is `key` or nests under it (`key.…`).
fn under(name: &str, key: &str) -> bool {
    name.strip_prefix(key)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// Checks a recurrent policy's state against PROTOCOL.md §8's rules: at most
/// [`MAX_STATE_TENSORS`] tensors, names that are batch keys of their own (dotted,
/// non-empty segments, at most [`MAX_STATE_NAME_BYTES`]; neither one of the batch's
/// keys nor nested under one, nor under `next.` or `collector.`; none equal to or nested
/// under another), shapes of at most [`MAX_STATE_RANK`] dims and [`MAX_STATE_ELEMENTS`]
/// elements, none zero. The error names the tensor.
pub fn check_state(state: &[StateTensor]) -> Result<(), PolicyError> {
    if state.len() > MAX_STATE_TENSORS {
        return Err(PolicyError::Spec(format!(
            "a recurrent policy carries at most {MAX_STATE_TENSORS} state tensors, got {}",
            state.len()
        )));
    }
    for (i, s) in state.iter().enumerate() {
        let bad = |reason: String| PolicyError::Spec(format!("state[{i}]: {reason}"));
        let name = &s.name;
        if name.is_empty() || name.len() > MAX_STATE_NAME_BYTES {
            return Err(bad(format!(
                "a name of 1 to {MAX_STATE_NAME_BYTES} bytes is needed, got {} bytes",
                name.len()
            )));
        }
        let shown = crate::peer_text::bounded(name);
        if name.split('.').any(str::is_empty) {
            return Err(bad(format!("`{shown}` has an empty segment")));
        }
        if RESERVED.iter().any(|key| under(name, key)) {
            return Err(bad(format!(
                "`{shown}` is a key of the batch itself, or nested under one"
            )));
        }
        if state[..i].iter().any(|o| o.name == *name) {
            return Err(bad(format!("`{shown}` is named twice")));
        }
        if let Some(o) = state[..i].iter().find(|o| under(name, &o.name) || under(&o.name, name)) {
            return Err(bad(format!(
                "`{shown}` and `{}` nest one under the other",
                crate::peer_text::bounded(&o.name)
            )));
        }
        if s.shape.len() > MAX_STATE_RANK {
            return Err(bad(format!(
                "`{shown}` has rank {}, at most {MAX_STATE_RANK}",
                s.shape.len()
            )));
        }
        let elements = s.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        match elements {
            Some(0) => return Err(bad(format!("`{shown}` has a zero dim: {:?}", s.shape))),
            Some(n) if n <= MAX_STATE_ELEMENTS => {}
            _ => {
                return Err(bad(format!(
                    "`{shown}` of shape {:?} holds more than {MAX_STATE_ELEMENTS} elements per env",
                    s.shape
                )))
            }
        }
    }
    Ok(())
}

/// Adds the keys a recurrent policy's frames carry: `is_init` (bool `[1]`), and per
/// state tensor `<name>` and `next.<name>` (f32, its shape). Nothing for no state.
pub fn extend_layout(state: &[StateTensor], layout: &mut BatchLayout) {
    if state.is_empty() {
        return;
    }
    layout.insert(keys::IS_INIT.to_string(), (DType::Bool, vec![1]));
    for s in state {
        layout.insert(s.name.clone(), (DType::F32, s.shape.clone()));
        layout.insert(s.next_key(), (DType::F32, s.shape.clone()));
    }
}

/// The state one recurrent call reads and writes, for `k` envs: tensor `j` of
/// [`Policy::state`](super::Policy::state) is `before[j]` and `after[j]`, `k` rows of
/// its elements each, row-major.
#[derive(Debug)]
pub struct StateIo<'a> {
    /// Whether each env's frame is the first of its episode (its `before` rows are zero).
    pub is_init: &'a [bool],
    /// The state each env's step reads.
    pub before: &'a [Vec<f32>],
    /// Where the state after the step goes.
    pub after: &'a mut [Vec<f32>],
}

impl StateIo<'_> {
    /// Checks the buffers of a call for `k` envs of a policy with these `tensors`: `k`
    /// flags, and `k` rows of each tensor before and after.
    pub fn check(&self, tensors: &[StateTensor], k: usize) -> Result<(), PolicyError> {
        let n = tensors.len();
        if self.is_init.len() != k || self.before.len() != n || self.after.len() != n {
            return Err(PolicyError::Buffer(format!(
                "a recurrent call for {k} envs needs {k} is_init flags and {n} state tensors"
            )));
        }
        for ((t, b), a) in tensors.iter().zip(self.before).zip(self.after.iter()) {
            let want = t.numel() * k;
            if b.len() != want || a.len() != want {
                return Err(PolicyError::Buffer(format!(
                    "state `{}` needs {want} values for {k} envs, got {} and {}",
                    t.name,
                    b.len(),
                    a.len()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lstm() -> Vec<StateTensor> {
        vec![
            StateTensor::new("recurrent_state_h", [1, 64]),
            StateTensor::new("recurrent_state_c", [1, 64]),
        ]
    }

    #[test]
    fn torchrls_names_pass_and_give_the_batch_keys() {
        check_state(&lstm()).unwrap();
        let mut layout = BatchLayout::new();
        extend_layout(&lstm(), &mut layout);
        let keys: Vec<&str> = layout.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "is_init",
                "next.recurrent_state_c",
                "next.recurrent_state_h",
                "recurrent_state_c",
                "recurrent_state_h"
            ]
        );
        assert_eq!(layout["is_init"], (DType::Bool, vec![1]));
        assert_eq!(layout["next.recurrent_state_h"], (DType::F32, vec![1, 64]));
        let mut empty = BatchLayout::new();
        extend_layout(&[], &mut empty);
        assert!(empty.is_empty());
    }

    #[test]
    fn each_broken_rule_is_refused_naming_the_tensor() {
        let cases: Vec<(Vec<StateTensor>, &str)> = vec![
            (vec![StateTensor::new("", [1])], "state[0]: a name of 1 to"),
            (vec![StateTensor::new("a..b", [1])], "empty segment"),
            (vec![StateTensor::new("is_init", [1])], "key of the batch"),
            (vec![StateTensor::new("next.h", [1])], "key of the batch"),
            (vec![StateTensor::new("observation", [1])], "key of the batch"),
            (vec![StateTensor::new("collector.h", [1])], "key of the batch"),
            (vec![StateTensor::new("logits.h", [1])], "nested under one"),
            (vec![StateTensor::new("is_init.h", [1])], "nested under one"),
            (vec![StateTensor::new("next", [1])], "key of the batch"),
            (
                vec![StateTensor::new("h", [1]), StateTensor::new("h.c", [1])],
                "`h.c` and `h` nest one under the other",
            ),
            (
                vec![StateTensor::new("h", [1]), StateTensor::new("h", [2])],
                "state[1]: `h` is named twice",
            ),
            (vec![StateTensor::new("h", [1, 0])], "zero dim"),
            (vec![StateTensor::new("h", [1 << 11, 1 << 10])], "more than 1048576"),
            (vec![StateTensor::new("h", [usize::MAX, 2])], "more than 1048576"),
            (vec![StateTensor::new("h", [1; 9])], "rank 9"),
            (
                (0..9).map(|i| StateTensor::new(format!("s{i}"), [1])).collect(),
                "at most 8 state tensors",
            ),
        ];
        for (state, want) in cases {
            let err = check_state(&state).unwrap_err().to_string();
            assert!(err.contains(want), "{state:?}: {err}");
        }
        check_state(&[StateTensor::new("h", [1 << 10, 1 << 10])]).unwrap();
        check_state(&[StateTensor::new("a.b", [])]).unwrap();
        check_state(&[
            StateTensor::new("nextstate", [1]),
            StateTensor::new("hc", [1]),
            StateTensor::new("h", [1]),
        ])
        .unwrap();
    }
}
