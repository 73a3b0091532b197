//! The built-in dense policies as one type: [`DensePolicy`], a [`Net`] whose kind `K`
//! names its tensors and says which built-in it is. [`Linear`](super::Linear) is
//! the network with no hidden layer, [`Mlp`](super::Mlp) the one with hidden layers.

use std::marker::PhantomData;
use std::sync::Arc;

use super::net::Net;
use super::{
    ActionsMut, BuiltinPolicy, ExplorationType, Policy, PolicyError, RecordMut, Recorded, SamplerState, Weights,
};
use crate::spec::Spec;

/// What tells the built-in dense policies apart: the names of their tensors (the
/// learner names them the same way) and which [`BuiltinPolicy`] they are.
pub trait DenseKind: Clone + Send + 'static {
    /// The names of layer `i`'s weight and bias.
    fn layer_names(i: usize) -> (String, String);
    /// The policy as the collection loop's built-in (see [`Policy::builtin`]).
    #[doc(hidden)]
    fn builtin(policy: &DensePolicy<Self>) -> BuiltinPolicy<'_>;
}

/// [`Linear`](super::Linear)'s kind: tensors `weight` and `bias`.
#[derive(Clone, Copy, Debug)]
pub struct LinearKind;

impl DenseKind for LinearKind {
    fn layer_names(_: usize) -> (String, String) {
        ("weight".to_string(), "bias".to_string())
    }

    fn builtin(policy: &DensePolicy<LinearKind>) -> BuiltinPolicy<'_> {
        BuiltinPolicy::Linear(policy)
    }
}

/// [`Mlp`](super::Mlp)'s kind: tensors `layers.{i}.weight` and `layers.{i}.bias`.
#[derive(Clone, Copy, Debug)]
pub struct MlpKind;

impl DenseKind for MlpKind {
    fn layer_names(i: usize) -> (String, String) {
        (format!("layers.{i}.weight"), format!("layers.{i}.bias"))
    }

    fn builtin(policy: &DensePolicy<MlpKind>) -> BuiltinPolicy<'_> {
        BuiltinPolicy::Mlp(policy)
    }
}

/// A built-in dense policy: tanh hidden layers (none for [`Linear`](super::Linear)),
/// a linear output layer and an action head; see [`Linear`](super::Linear) and
/// [`Mlp`](super::Mlp) for what it computes and how its tensors are named.
#[derive(Clone)]
pub struct DensePolicy<K: DenseKind> {
    pub(super) net: Net,
    kind: PhantomData<K>,
}

impl<K: DenseKind> DensePolicy<K> {
    /// The network `obs -> hidden... -> action head` with initial weights from
    /// `init_seed` and its sampling generator seeded with `seed`.
    pub(super) fn build(
        obs: &Spec,
        action: &Spec,
        hidden: &[usize],
        init_seed: u64,
        seed: u64,
    ) -> Result<DensePolicy<K>, PolicyError> {
        Ok(DensePolicy::from_net(Net::new(
            obs,
            action,
            hidden,
            K::layer_names,
            init_seed,
            seed,
        )?))
    }

    /// The policy over `net`.
    pub(super) fn from_net(net: Net) -> DensePolicy<K> {
        DensePolicy { net, kind: PhantomData }
    }
}

impl<K: DenseKind> Policy for DensePolicy<K> {
    #[inline]
    fn act(&mut self, obs: &[f32], k: usize, actions: ActionsMut<'_>) -> Result<(), PolicyError> {
        self.net.act(obs, k, actions, RecordMut::nothing())
    }

    /// [`Recorded::Categorical`] (the logits) for discrete actions, [`Recorded::Normal`]
    /// for a box: `loc` the scaled-tanh mean, `scale` the noise std it samples with.
    fn recorded(&self) -> Recorded {
        self.net.recorded()
    }

    fn act_recording(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        self.net.act(obs, k, actions, record)
    }

    fn weights(&self) -> &Weights {
        self.net.weights()
    }

    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
        self.net.set_weights(weights)
    }

    fn set_shared_weights(&mut self, weights: &Arc<Weights>) -> Result<(), PolicyError> {
        self.net.set_shared_weights(weights)
    }

    fn set_exploration(&mut self, exploration: ExplorationType) {
        self.net.set_exploration(exploration);
    }

    fn reseed(&mut self, seed: u64) {
        self.net.reseed(seed);
    }

    fn sampler_state(&self) -> Result<Option<SamplerState>, PolicyError> {
        Ok(Some(self.net.sampler_state()))
    }

    fn set_sampler_state(&mut self, state: Option<&SamplerState>) -> Result<(), PolicyError> {
        self.net.set_sampler_state(state)
    }

    fn builtin(&self) -> Option<BuiltinPolicy<'_>> {
        Some(K::builtin(self))
    }
}
