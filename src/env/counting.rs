//! STUB: replaced by the env implementation.
use serde::{Deserialize, Serialize};
use super::{Action, Env, EnvError, Transition};
use crate::spec::Spec;

/// Config.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CountingConfig {}

/// Env.
pub struct Counting { spec: Spec }

impl Counting {
    /// Registered name.
    pub const NAME: &'static str = "Counting";
    /// Build.
    pub fn new(_c: CountingConfig) -> Result<Self, EnvError> { Ok(Counting { spec: Spec::Discrete { n: 2 } }) }
}

impl Env for Counting {
    fn name(&self) -> &str { Self::NAME }
    fn observation_spec(&self) -> &Spec { &self.spec }
    fn action_spec(&self) -> &Spec { &self.spec }
    fn reset(&mut self, _seed: Option<u64>, _obs: &mut [f32]) -> Result<(), EnvError> { todo!() }
    fn step(&mut self, _a: Action<'_>, _obs: &mut [f32]) -> Result<Transition, EnvError> { todo!() }
    fn state(&self) -> Vec<f64> { todo!() }
    fn set_state(&mut self, _s: &[f64]) -> Result<(), EnvError> { todo!() }
    fn elapsed_steps(&self) -> u64 { 0 }
    fn set_elapsed_steps(&mut self, _s: u64) {}
}
