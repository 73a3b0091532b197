//! A recurrent policy's state as the rollout keeps it: one row per env of each state
//! tensor, zeroed on the first frame of every episode (`is_init`), handed to the
//! policy, recorded before and after each step, and carried to the next step, the
//! next batch and checkpoints (PROTOCOL.md §8, Recurrent).

use serde::{Deserialize, Serialize};

use crate::policy::StateTensor;

/// Each env's state, and the buffers of the step in progress.
pub(super) struct Recurrent {
    /// The policy's state tensors.
    pub(super) tensors: Vec<StateTensor>,
    /// Elements per env of each tensor.
    pub(super) widths: Vec<usize>,
    /// Each tensor's rows (`K * width`): the state each env's next step reads.
    pub(super) cur: Vec<Vec<f32>>,
    /// Where the policy writes the state after the step.
    pub(super) next: Vec<Vec<f32>>,
    /// Whether each env's frame in progress is the first of its episode.
    pub(super) is_init: Vec<bool>,
}

/// A rollout's recurrent state in a checkpoint (`RolloutState.recurrent`): the tensors'
/// names, to refuse the state of another policy, and each tensor's rows, env by env.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecurrentState {
    /// The state tensors' names, in the policy's order.
    pub names: Vec<String>,
    /// Each tensor's rows: `K * elements` values, env by env.
    pub state: Vec<Vec<f32>>,
}

impl Recurrent {
    /// The state of `k` envs of a policy with these tensors, all zero; `None` for a
    /// policy without state.
    pub(super) fn new(tensors: &[StateTensor], k: usize) -> Option<Recurrent> {
        if tensors.is_empty() {
            return None;
        }
        let widths: Vec<usize> = tensors.iter().map(StateTensor::numel).collect();
        let rows = || widths.iter().map(|w| vec![0.0; w * k]).collect::<Vec<_>>();
        Some(Recurrent {
            tensors: tensors.to_vec(),
            cur: rows(),
            next: rows(),
            widths,
            is_init: vec![false; k],
        })
    }

    /// Before a step's policy call: an env whose frame is the first of its episode
    /// (`step_count` 0) is `is_init`, and its rows are zeroed.
    #[inline]
    pub(super) fn begin_step(&mut self, step_count: &[i64]) {
        for (k, &sc) in step_count.iter().enumerate() {
            let init = sc == 0;
            self.is_init[k] = init;
            if init {
                for (rows, &w) in self.cur.iter_mut().zip(&self.widths) {
                    rows[k * w..(k + 1) * w].fill(0.0);
                }
            }
        }
    }

    /// A step the policy did not take (`init_random_frames`): the state after it is the
    /// state before.
    #[inline]
    pub(super) fn hold(&mut self) {
        for (next, cur) in self.next.iter_mut().zip(&self.cur) {
            next.copy_from_slice(cur);
        }
    }

    /// Writes env `k`'s frame of this step as frame `i` of the batch: `is_init`, the
    /// state before and after.
    #[inline]
    pub(super) fn record(
        &self,
        k: usize,
        i: usize,
        is_init: &mut [bool],
        before: &mut [Vec<f32>],
        after: &mut [Vec<f32>],
    ) {
        is_init[i] = self.is_init[k];
        for (j, &w) in self.widths.iter().enumerate() {
            before[j][i * w..(i + 1) * w].copy_from_slice(&self.cur[j][k * w..(k + 1) * w]);
            after[j][i * w..(i + 1) * w].copy_from_slice(&self.next[j][k * w..(k + 1) * w]);
        }
    }

    /// After a step: the state after it is what each env's next step reads.
    #[inline]
    pub(super) fn advance(&mut self) {
        std::mem::swap(&mut self.cur, &mut self.next);
    }

    /// The state for a checkpoint.
    pub(super) fn snapshot(&self) -> RecurrentState {
        RecurrentState {
            names: self.tensors.iter().map(|t| t.name.clone()).collect(),
            state: self.cur.clone(),
        }
    }

    /// Why `state` does not fit this rollout's, if it does not.
    pub(super) fn misfit(&self, state: &RecurrentState) -> Option<String> {
        let names: Vec<&str> = self.tensors.iter().map(|t| t.name.as_str()).collect();
        if state.names != names {
            return Some(format!(
                "the checkpoint's recurrent state is {:?}, this policy's {names:?}",
                state
                    .names
                    .iter()
                    .map(|n| crate::peer_text::bounded(n))
                    .collect::<Vec<_>>()
            ));
        }
        if state.state.len() != self.cur.len() {
            return Some(format!(
                "the checkpoint has {} state tensors, this policy {}",
                state.state.len(),
                self.cur.len()
            ));
        }
        for ((rows, mine), name) in state.state.iter().zip(&self.cur).zip(&names) {
            if rows.len() != mine.len() {
                return Some(format!(
                    "state `{name}` has {} values in the checkpoint, {} here",
                    rows.len(),
                    mine.len()
                ));
            }
        }
        None
    }

    /// Puts a checked state in place.
    pub(super) fn restore(&mut self, state: &RecurrentState) {
        for (cur, rows) in self.cur.iter_mut().zip(&state.state) {
            cur.copy_from_slice(rows);
        }
    }
}
