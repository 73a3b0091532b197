//! A rollout's envs and policy by their concrete type when they are built-ins.
//!
//! The collection loop is generic over the env and the policy type. Built-in envs and
//! policies handed over as trait objects are copied out of their boxes here (every
//! field, generator positions included, so nothing they produce changes), and the loop
//! is then compiled for them: each step is a direct, inlinable call instead of a
//! dynamic one. Envs and policies of your own stay boxed and go through the traits.

use crate::env::{Action, BuiltinEnv, CartPole, Env, EnvError, MountainCarContinuous, Pendulum, Transition};
use crate::policy::{ActionsMut, Argmax2, BuiltinPolicy, Linear, Mlp, Policy, PolicyError, RecordMut};

/// The envs of one rollout, all of one concrete type when they are the same built-in.
pub(super) enum Envs {
    /// `CartPole-v1`.
    CartPole(Vec<CartPole>),
    /// `Pendulum-v1`.
    Pendulum(Vec<Pendulum>),
    /// `MountainCarContinuous-v0`.
    MountainCar(Vec<MountainCarContinuous>),
    /// Anything else (envs of your own, or a mix).
    Dyn(Vec<Box<dyn Env>>),
}

/// Copies of every env when all are the built-in `pick` selects.
fn all<T: Clone>(envs: &[Box<dyn Env>], pick: impl Fn(BuiltinEnv<'_>) -> Option<&T>) -> Option<Vec<T>> {
    envs.iter().map(|e| e.builtin().and_then(&pick).cloned()).collect()
}

impl Envs {
    /// The envs by their concrete type where they are all one built-in, else as given.
    pub(super) fn new(envs: Vec<Box<dyn Env>>) -> Envs {
        let Some(first) = envs.first().and_then(|e| e.builtin()) else {
            return Envs::Dyn(envs);
        };
        let concrete = match first {
            BuiltinEnv::CartPole(_) => all(&envs, |b| match b {
                BuiltinEnv::CartPole(e) => Some(e),
                _ => None,
            })
            .map(Envs::CartPole),
            BuiltinEnv::Pendulum(_) => all(&envs, |b| match b {
                BuiltinEnv::Pendulum(e) => Some(e),
                _ => None,
            })
            .map(Envs::Pendulum),
            BuiltinEnv::MountainCar(_) => all(&envs, |b| match b {
                BuiltinEnv::MountainCar(e) => Some(e),
                _ => None,
            })
            .map(Envs::MountainCar),
        };
        concrete.unwrap_or(Envs::Dyn(envs))
    }

    /// Number of envs.
    pub(super) fn len(&self) -> usize {
        match self {
            Envs::CartPole(v) => v.len(),
            Envs::Pendulum(v) => v.len(),
            Envs::MountainCar(v) => v.len(),
            Envs::Dyn(v) => v.len(),
        }
    }

    /// Env `k` through the trait (for everything but the hot loop).
    pub(super) fn get(&self, k: usize) -> &dyn Env {
        match self {
            Envs::CartPole(v) => &v[k],
            Envs::Pendulum(v) => &v[k],
            Envs::MountainCar(v) => &v[k],
            Envs::Dyn(v) => &*v[k],
        }
    }

    /// Env `k` through the trait, mutably.
    pub(super) fn get_mut(&mut self, k: usize) -> &mut dyn Env {
        match self {
            Envs::CartPole(v) => &mut v[k],
            Envs::Pendulum(v) => &mut v[k],
            Envs::MountainCar(v) => &mut v[k],
            Envs::Dyn(v) => &mut *v[k],
        }
    }
}

/// The policy of one rollout, by its concrete type when it is a built-in network.
pub(super) enum Pol {
    /// [`Linear`].
    Linear(Linear),
    /// [`Mlp`].
    Mlp(Mlp),
    /// Anything else.
    Dyn(Box<dyn Policy>),
}

impl Pol {
    /// The policy by its concrete type where it is a built-in network, else as given.
    pub(super) fn new(policy: Box<dyn Policy>) -> Pol {
        match policy.builtin() {
            Some(BuiltinPolicy::Linear(p)) => Pol::Linear(p.clone()),
            Some(BuiltinPolicy::Mlp(p)) => Pol::Mlp(p.clone()),
            None => Pol::Dyn(policy),
        }
    }

    /// The policy through the trait.
    pub(super) fn get(&self) -> &dyn Policy {
        match self {
            Pol::Linear(p) => p,
            Pol::Mlp(p) => p,
            Pol::Dyn(p) => &**p,
        }
    }

    /// The policy through the trait, mutably.
    pub(super) fn get_mut(&mut self) -> &mut (dyn Policy + 'static) {
        match self {
            Pol::Linear(p) => p,
            Pol::Mlp(p) => p,
            Pol::Dyn(p) => &mut **p,
        }
    }
}

/// An env type the collection loop is compiled for: how to find its envs in [`Envs`],
/// and how to step one.
pub(super) trait EnvKind: Env + Sized {
    /// The envs, if `envs` holds this type.
    fn slice(envs: &mut Envs) -> Option<&mut [Self]>;

    /// [`Env::step`], inlined where the env has a body written for it.
    #[inline(always)]
    fn step_fast(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        self.step(action, obs)
    }
}

impl EnvKind for CartPole {
    fn slice(envs: &mut Envs) -> Option<&mut [Self]> {
        match envs {
            Envs::CartPole(v) => Some(v),
            _ => None,
        }
    }

    #[inline(always)]
    fn step_fast(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        self.step_inline(action, obs)
    }
}

impl EnvKind for Pendulum {
    fn slice(envs: &mut Envs) -> Option<&mut [Self]> {
        match envs {
            Envs::Pendulum(v) => Some(v),
            _ => None,
        }
    }
}

impl EnvKind for MountainCarContinuous {
    fn slice(envs: &mut Envs) -> Option<&mut [Self]> {
        match envs {
            Envs::MountainCar(v) => Some(v),
            _ => None,
        }
    }
}

impl EnvKind for Box<dyn Env> {
    fn slice(envs: &mut Envs) -> Option<&mut [Self]> {
        match envs {
            Envs::Dyn(v) => Some(v),
            _ => None,
        }
    }
}

/// A policy type the collection loop is compiled for: how to find it in [`Pol`], and
/// how to call it for observations of a constant size.
pub(super) trait PolicyKind: Policy {
    /// The policy, if `policy` holds this type.
    fn pick(policy: &mut Pol) -> Option<&mut Self>;

    /// [`Policy::act_recording`] for observations of `D` values each (0: any); the
    /// same actions and records.
    #[inline(always)]
    fn act_fixed<const D: usize>(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        self.act_recording(obs, k, actions, record)
    }

    /// The deterministic two-action argmax `act_fixed` computes, when it is one
    /// (the loop over one env then keeps its observation in registers).
    #[inline(always)]
    fn argmax2<const D: usize>(&self) -> Option<Argmax2<D>> {
        None
    }

    /// Whether this policy's `action_log_prob` over two logits is exactly
    /// [`Argmax2::log_probs`] of the logits it records and the action it took (the
    /// built-in `linear` and `mlp`): the loop may then leave it out of each step and
    /// compute a batch's in one vectorised pass after its steps, the same function,
    /// so the same bits.
    #[inline(always)]
    fn log_prob_of_two_logits(&self) -> bool {
        self.builtin().is_some()
    }
}

impl PolicyKind for Linear {
    fn pick(policy: &mut Pol) -> Option<&mut Self> {
        match policy {
            Pol::Linear(p) => Some(p),
            _ => None,
        }
    }

    #[inline(always)]
    fn act_fixed<const D: usize>(
        &mut self,
        obs: &[f32],
        k: usize,
        actions: ActionsMut<'_>,
        record: RecordMut<'_>,
    ) -> Result<(), PolicyError> {
        Linear::act_fixed_recording::<D>(self, obs, k, actions, record)
    }

    #[inline(always)]
    fn argmax2<const D: usize>(&self) -> Option<Argmax2<D>> {
        Linear::argmax2::<D>(self)
    }
}

impl PolicyKind for Mlp {
    fn pick(policy: &mut Pol) -> Option<&mut Self> {
        match policy {
            Pol::Mlp(p) => Some(p),
            _ => None,
        }
    }
}

/// Any policy, through the trait: the fallback, whatever `policy` holds.
impl PolicyKind for dyn Policy {
    fn pick(policy: &mut Pol) -> Option<&mut Self> {
        Some(policy.get_mut())
    }
}
