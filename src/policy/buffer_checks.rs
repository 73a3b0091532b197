//! The checks every policy makes on the buffers `act` is handed: `k` observations of
//! the right width, an action buffer of the spec's kind holding exactly `k` actions.
//! The errors are built out of line (`#[cold]`): nothing is formatted on success.

use super::{ActionsMut, PolicyError};
use crate::spec::Spec;

/// Checks that `obs` holds exactly `k` observations of `obs_dim` values.
#[inline]
pub(super) fn check_obs(obs: &[f32], k: usize, obs_dim: usize) -> Result<(), PolicyError> {
    if Some(obs.len()) == k.checked_mul(obs_dim) {
        Ok(())
    } else {
        Err(obs_len_error(obs.len(), k, obs_dim))
    }
}

/// The error for an observation buffer of the wrong length.
#[cold]
#[inline(never)]
fn obs_len_error(len: usize, k: usize, obs_dim: usize) -> PolicyError {
    PolicyError::Buffer(format!(
        "observation buffer has {len} values, expected k * obs_dim = {k} * {obs_dim}"
    ))
}

/// Checks an action buffer against the action spec: right kind, exactly `k` actions.
#[inline]
pub(super) fn check_actions(action: &Spec, k: usize, actions: &ActionsMut<'_>) -> Result<(), PolicyError> {
    let (len, dim) = match (action, actions) {
        (Spec::Discrete { .. }, ActionsMut::Discrete(a)) => (a.len(), 1),
        (Spec::Box { low, .. }, ActionsMut::Continuous(a)) => (a.len(), low.len()),
        _ => return Err(action_kind_error(action, actions)),
    };
    if Some(len) == k.checked_mul(dim) {
        Ok(())
    } else {
        Err(action_len_error(len, k, dim))
    }
}

/// The error for an action buffer of the wrong kind.
#[cold]
#[inline(never)]
pub(super) fn action_kind_error(action: &Spec, actions: &ActionsMut<'_>) -> PolicyError {
    let (spec, buffer) = match (action, actions) {
        (Spec::Discrete { .. }, _) => ("discrete", "ActionsMut::Continuous"),
        (Spec::Box { .. }, _) => ("a box", "ActionsMut::Discrete"),
    };
    PolicyError::Buffer(format!("the action spec is {spec} but the buffer is {buffer}"))
}

/// The error for an action buffer of the wrong length.
#[cold]
#[inline(never)]
pub(super) fn action_len_error(len: usize, k: usize, dim: usize) -> PolicyError {
    PolicyError::Buffer(format!(
        "action buffer has {len} values, expected k * action_dim = {k} * {dim}"
    ))
}
