//! The sampling generator every sampling policy draws from (ChaCha8, plus the spare
//! normal of Box–Muller, both saved in checkpoints), and the discrete choices made
//! with it: the first argmax, and a draw from softmax(logits).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{PolicyError, SamplerState};
use crate::rng::RngState;

/// The sampling generator: ChaCha8 plus the spare normal of Box–Muller.
#[derive(Clone)]
pub(super) struct Sampler {
    rng: ChaCha8Rng,
    spare: Option<f32>,
}

impl Sampler {
    /// A generator seeded with `seed`.
    pub(super) fn new(seed: u64) -> Sampler {
        Sampler {
            rng: ChaCha8Rng::seed_from_u64(seed),
            spare: None,
        }
    }

    /// Restarts the stream from `seed`.
    pub(super) fn reseed(&mut self, seed: u64) {
        *self = Sampler::new(seed);
    }

    /// The position, for a checkpoint.
    pub(super) fn state(&self) -> SamplerState {
        SamplerState {
            rng: RngState::of(&self.rng),
            spare: self.spare,
        }
    }

    /// Continues from `state`; a missing or corrupt state is an error and changes nothing.
    pub(super) fn set_state(&mut self, state: Option<&SamplerState>) -> Result<(), PolicyError> {
        let state = state.ok_or_else(|| PolicyError::Checkpoint("the policy samples but the state is empty".into()))?;
        self.rng = state.rng.to_rng().map_err(|e| PolicyError::Checkpoint(e.to_string()))?;
        self.spare = state.spare;
        Ok(())
    }

    /// The generator itself.
    pub(super) fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    /// Uniform in `[0, 1)`.
    #[inline]
    pub(super) fn uniform(&mut self) -> f32 {
        self.rng.random::<f32>()
    }

    /// Standard normal, by Box–Muller (two per pair of uniforms; the second is kept).
    #[inline]
    pub(super) fn normal(&mut self) -> f32 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let u1 = 1.0 - self.rng.random::<f32>(); // (0, 1]: ln is finite
        let u2 = self.rng.random::<f32>();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f32::consts::TAU * u2).sin_cos();
        self.spare = Some(r * s);
        r * c
    }
}

/// Index of the first maximum (NaNs are never a maximum unless first).
#[inline]
pub(super) fn argmax(z: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = z[0];
    for (i, &v) in z.iter().enumerate().skip(1) {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// Samples an index from softmax(`z`) with the uniform `u` in `[0, 1)`.
///
/// Subtracts the max before `exp`; overwrites `z` with the unnormalised
/// probabilities. Falls back to the argmax when the logits are not finite.
#[inline]
pub(super) fn sample_softmax(z: &mut [f32], u: f32) -> usize {
    let best = argmax(z);
    let m = z[best];
    let mut sum = 0.0f32;
    for v in z.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    if !(sum.is_finite() && sum > 0.0) {
        return best;
    }
    let t = u * sum;
    let mut acc = 0.0f32;
    let mut last = best;
    for (i, &e) in z.iter().enumerate() {
        acc += e;
        if t < acc {
            return i;
        }
        if e > 0.0 {
            last = i;
        }
    }
    // Rounding left `t` at or past the total: the last index with mass.
    last
}
