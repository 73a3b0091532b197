//! STUB
use super::*;
/// Random.
pub struct RandomPolicy { w: Weights }
impl RandomPolicy {
    /// New.
    pub fn new(_a: Spec, _seed: u64) -> Self { RandomPolicy { w: Weights::default() } }
}
impl Policy for RandomPolicy {
    fn act(&mut self, _obs: &[f32], _k: usize, _a: ActionsMut<'_>) -> Result<(), PolicyError> { todo!() }
    fn weights(&self) -> &Weights { &self.w }
    fn set_weights(&mut self, _w: &Weights) -> Result<(), PolicyError> { Ok(()) }
    fn set_exploration(&mut self, _e: ExplorationType) {}
    fn reseed(&mut self, _s: u64) {}
}
