//! The replay buffer the collector writes into, shared with the learner.
//!
//! The core [`ReplayBuffer`] knows nothing of threads; here it sits behind a mutex so
//! the collector can extend it while a learner samples from it on another thread.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rollout::replay::{ReplayBuffer, ReplayError};
use rollout::TensorDict;

/// A [`ReplayBuffer`] shared between the collector (writer) and learners (samplers).
pub type SharedReplayBuffer = Arc<Mutex<ReplayBuffer>>;

/// A new shared buffer of `capacity` frames, its sampler seeded with `seed`.
pub fn shared(capacity: usize, seed: u64) -> Result<SharedReplayBuffer, ReplayError> {
    Ok(Arc::new(Mutex::new(ReplayBuffer::new(capacity, seed)?)))
}

/// Locks `buffer`; a panic of another holder does not make the frames unusable
/// (every write is checked before it starts), so a poisoned lock is taken over.
pub fn lock(buffer: &SharedReplayBuffer) -> MutexGuard<'_, ReplayBuffer> {
    buffer.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `n` frames drawn uniformly from `buffer` (see [`ReplayBuffer::sample`]); holds the
/// lock only while gathering.
pub fn sample(buffer: &SharedReplayBuffer, n: usize) -> Result<TensorDict, ReplayError> {
    lock(buffer).sample(n)
}
