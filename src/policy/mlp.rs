//! STUB
use super::*;
/// Random.
pub struct Mlp { w: Weights }
impl Mlp {
    /// New.
    pub fn new(_o: &Spec, _a: &Spec, _h: &[usize], _i: u64, _s: u64) -> Result<Self, PolicyError> { Ok(Self { w: Weights::default() }) }
    #[allow(dead_code)] fn x() -> Self { Mlp { w: Weights::default() } }
}
impl Policy for Mlp {
    fn act(&mut self, _obs: &[f32], _k: usize, _a: ActionsMut<'_>) -> Result<(), PolicyError> { todo!() }
    fn weights(&self) -> &Weights { &self.w }
    fn set_weights(&mut self, _w: &Weights) -> Result<(), PolicyError> { Ok(()) }
    fn set_exploration(&mut self, _e: ExplorationType) {}
    fn reseed(&mut self, _s: u64) {}
}
