//! A constant action read from a weight: a port of torchrl's `CountingPolicy`.

use std::collections::BTreeMap;

use ndarray::{ArrayD, IxDyn};

use super::buffer_checks::check_actions;
use super::{ActionsMut, ExplorationType, Policy, PolicyError, SamplerState, Weights};
use crate::spec::Spec;
use crate::tensor::Tensor;

/// Every action is the weight `value` (torchrl's `CountingPolicy`): useful to
/// check that weight updates reach the collectors.
///
/// One weight, `value` f32 `[1]`, initially the value given to [`Constant::new`].
/// Continuous actions get `value` in every element, *without* clipping to the
/// action bounds (tests rely on out-of-bounds actions reaching the env).
/// Discrete actions get `value` rounded to the nearest integer (halves away
/// from zero, saturating at the i64 range, NaN as 0), not checked against `n`.
/// Observations are ignored and the exploration type has no effect.
pub struct Constant {
    action: Spec,
    value: f32,
    weights: Weights,
}

impl Constant {
    /// A constant policy over `action` whose `value` weight starts at `value`.
    pub fn new(action: &Spec, value: f32) -> Result<Constant, PolicyError> {
        action.validate()?;
        let mut tensors = BTreeMap::new();
        tensors.insert("value".to_string(), Tensor::F32(ArrayD::from_elem(IxDyn(&[1]), value)));
        Ok(Constant {
            action: action.clone(),
            value,
            weights: Weights::new(tensors),
        })
    }
}

impl Policy for Constant {
    fn act(&mut self, _obs: &[f32], k: usize, actions: ActionsMut<'_>) -> Result<(), PolicyError> {
        check_actions(&self.action, k, &actions)?;
        match actions {
            ActionsMut::Discrete(out) => out.fill(self.value.round() as i64),
            ActionsMut::Continuous(out) => out.fill(self.value),
        }
        Ok(())
    }

    fn weights(&self) -> &Weights {
        &self.weights
    }

    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
        self.weights.check_layout(weights)?;
        let src = weights.tensors["value"].as_f32().expect("layout checked: f32");
        let value = src.iter().next().copied().expect("layout checked: one element");
        match self.weights.tensors.get_mut("value") {
            Some(Tensor::F32(dst)) => dst.fill(value),
            _ => unreachable!("own weight is f32"),
        }
        self.value = value;
        self.weights.version = weights.version;
        Ok(())
    }

    fn set_exploration(&mut self, _exploration: ExplorationType) {}

    fn reseed(&mut self, _seed: u64) {}

    /// No generator: the state is `None`.
    fn sampler_state(&self) -> Result<Option<SamplerState>, PolicyError> {
        Ok(None)
    }

    fn set_sampler_state(&mut self, state: Option<&SamplerState>) -> Result<(), PolicyError> {
        match state {
            None => Ok(()),
            Some(_) => Err(PolicyError::Checkpoint("the constant policy has no generator".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{t, vals, w};
    use super::*;

    #[test]
    fn value_then_new_value() {
        let mut p = Constant::new(&Spec::uniform_box(2, 0.0, 1.0), 1.0).unwrap();
        assert_eq!(vals(p.weights(), "value"), [1.0]);
        assert_eq!(p.weights().tensors["value"].shape(), &[1]);
        let mut out = [0f32; 6];
        p.act(&[0.0; 9], 3, ActionsMut::Continuous(&mut out)).unwrap();
        assert_eq!(out, [1.0; 6]);
        // Out of bounds on purpose: not clipped.
        p.set_weights(&w(4, vec![("value", t(&[1], &[2.0]))])).unwrap();
        assert_eq!(p.weights().version, 4);
        assert_eq!(vals(p.weights(), "value"), [2.0]);
        p.set_exploration(ExplorationType::Deterministic);
        p.act(&[], 3, ActionsMut::Continuous(&mut out)).unwrap();
        assert_eq!(out, [2.0; 6]);
    }

    #[test]
    fn discrete_rounds() {
        let mut p = Constant::new(&Spec::Discrete { n: 5 }, 2.6).unwrap();
        let mut out = [0i64; 2];
        p.act(&[], 2, ActionsMut::Discrete(&mut out)).unwrap();
        assert_eq!(out, [3, 3]);
        p.set_weights(&w(1, vec![("value", t(&[1], &[-0.4]))])).unwrap();
        p.act(&[], 2, ActionsMut::Discrete(&mut out)).unwrap();
        assert_eq!(out, [0, 0]);
    }

    #[test]
    fn bad_weights_and_buffers() {
        let mut p = Constant::new(&Spec::Discrete { n: 5 }, 1.0).unwrap();
        for bad in [
            w(1, vec![("value", t(&[2], &[1.0, 2.0]))]),
            w(1, vec![("value", t(&[], &[1.0]))]),
            w(1, vec![("v", t(&[1], &[1.0]))]),
            w(1, vec![("value", Tensor::zeros(crate::tensor::DType::I64, &[1]))]),
        ] {
            assert!(matches!(p.set_weights(&bad), Err(PolicyError::Weights(_))));
        }
        assert_eq!(p.weights().version, 0);
        assert_eq!(vals(p.weights(), "value"), [1.0]);
        let buffer = |r: Result<(), PolicyError>| matches!(r, Err(PolicyError::Buffer(_)));
        assert!(buffer(p.act(&[], 2, ActionsMut::Discrete(&mut [0; 1]))));
        assert!(buffer(p.act(&[], 1, ActionsMut::Continuous(&mut [0.0]))));
        assert!(Constant::new(&Spec::Discrete { n: 0 }, 1.0).is_err());
    }
}
