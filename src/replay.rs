//! A replay buffer: a fixed number of frames, oldest evicted first, sampled uniformly.
//!
//! torchrl's `ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=RandomSampler())`:
//! batches go in with [`ReplayBuffer::extend`] (their batch dims flattened to frames),
//! uniform samples of frames come out with [`ReplayBuffer::sample`]. The storage is
//! allocated at the first `extend`, from that batch's entries, and written in place
//! as a ring afterwards. No threads here: the collector shares one behind a mutex.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::tensor::{Tensor, TensorDict, TensorError};

/// What a replay buffer refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayError {
    /// A buffer must hold at least one frame.
    #[error("invalid `capacity`: must be at least 1 frame")]
    ZeroCapacity,
    /// Sampling from a buffer that holds no frame.
    #[error("cannot sample {0} frames from an empty replay buffer")]
    Empty(usize),
    /// A batch whose entries differ from those stored (keys, dtypes, feature shapes).
    #[error("batch does not match the replay buffer's storage: {0}")]
    Layout(String),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// Frames in a ring of fixed capacity; FIFO eviction; uniform sampling with a seeded ChaCha8.
#[derive(Debug, Clone)]
pub struct ReplayBuffer {
    capacity: usize,
    /// `[capacity]` frames, allocated at the first `extend`.
    storage: Option<TensorDict>,
    /// Where the next frame goes.
    cursor: usize,
    len: usize,
    written: u64,
    rng: ChaCha8Rng,
}

impl ReplayBuffer {
    /// An empty buffer of `capacity` frames whose sampler is seeded with `seed`.
    pub fn new(capacity: usize, seed: u64) -> Result<ReplayBuffer, ReplayError> {
        if capacity == 0 {
            return Err(ReplayError::ZeroCapacity);
        }
        Ok(ReplayBuffer {
            capacity,
            storage: None,
            cursor: 0,
            len: 0,
            written: 0,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    /// Frames held (at most [`Self::capacity`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no frame is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most frames held at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Frames ever written, evicted ones included.
    pub fn frames_written(&self) -> u64 {
        self.written
    }

    /// Appends every frame of `batch` (all batch dims flattened, row-major), evicting the
    /// oldest frames beyond capacity. The first batch fixes the entries every later one
    /// must have; a batch that differs is refused whole, nothing written.
    pub fn extend(&mut self, batch: &TensorDict) -> Result<(), ReplayError> {
        let m = batch.numel();
        if m == 0 {
            return Ok(());
        }
        let flat = batch.clone().reshape(&[m])?;
        let storage = match self.storage.as_mut() {
            Some(s) => {
                check_same_entries(s, &flat)?;
                s
            }
            None => {
                let mut s = TensorDict::new(&[self.capacity]);
                for (key, t) in flat.iter() {
                    let mut shape = t.shape().to_vec();
                    shape[0] = self.capacity;
                    s.set(key, Tensor::zeros(t.dtype(), &shape))?;
                }
                self.storage.insert(s)
            }
        };
        // Frames that would be evicted within this very call are never written.
        let skip = m.saturating_sub(self.capacity);
        let mut start = (self.cursor + skip) % self.capacity;
        let mut from = skip;
        while from < m {
            let n = (m - from).min(self.capacity - start);
            let part = flat.slice(0, from..from + n)?;
            for (key, t) in part.iter() {
                storage.get_mut(key)?.assign_rows(start, t)?;
            }
            from += n;
            start = (start + n) % self.capacity;
        }
        self.cursor = start;
        self.len = (self.len + m).min(self.capacity);
        self.written += m as u64;
        Ok(())
    }

    /// `n` frames drawn uniformly with replacement from those held, as a `[n]` dict
    /// with the stored entries.
    pub fn sample(&mut self, n: usize) -> Result<TensorDict, ReplayError> {
        let Some(storage) = self.storage.as_ref().filter(|_| self.len > 0) else {
            return Err(ReplayError::Empty(n));
        };
        // Until the ring is full the frames held are rows 0..len; after, all rows.
        let idx: Vec<usize> = (0..n).map(|_| self.rng.random_range(0..self.len)).collect();
        gather(storage, &idx)
    }

    /// Every frame held, oldest first, as a `[len]` dict (`None` when empty).
    pub fn contents(&self) -> Result<Option<TensorDict>, ReplayError> {
        let Some(storage) = self.storage.as_ref().filter(|_| self.len > 0) else {
            return Ok(None);
        };
        let oldest = (self.cursor + self.capacity - self.len) % self.capacity;
        let idx: Vec<usize> = (0..self.len).map(|i| (oldest + i) % self.capacity).collect();
        gather(storage, &idx).map(Some)
    }
}

fn gather(storage: &TensorDict, idx: &[usize]) -> Result<TensorDict, ReplayError> {
    let mut out = TensorDict::new(&[idx.len()]);
    for (key, t) in storage.iter() {
        out.set(key, t.select(0, idx)?)?;
    }
    Ok(out)
}

fn check_same_entries(storage: &TensorDict, flat: &TensorDict) -> Result<(), ReplayError> {
    for (key, t) in flat.iter() {
        let s = storage
            .get(key)
            .map_err(|_| ReplayError::Layout(format!("unexpected entry `{key}`")))?;
        if s.dtype() != t.dtype() || s.shape()[1..] != t.shape()[1..] {
            return Err(ReplayError::Layout(format!(
                "`{key}` is {} {:?} per frame, the storage holds {} {:?}",
                t.dtype(),
                &t.shape()[1..],
                s.dtype(),
                &s.shape()[1..]
            )));
        }
    }
    if let Some(missing) = storage.keys().find(|k| flat.get(k).is_err()) {
        return Err(ReplayError::Layout(format!("missing entry `{missing}`")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ArrayD;

    /// A `[rows, cols]` batch whose `x` counts up from `start` frame by frame, with a
    /// `[2]`-feature `y = (x, -x)` and a bool `d`.
    fn batch(rows: usize, cols: usize, start: i64) -> TensorDict {
        let m = rows * cols;
        let x: Vec<i64> = (start..start + m as i64).collect();
        let y: Vec<f32> = x.iter().flat_map(|&v| [v as f32, -(v as f32)]).collect();
        let d: Vec<bool> = x.iter().map(|v| v % 2 == 0).collect();
        let mut td = TensorDict::new(&[rows, cols]);
        td.set("x", Tensor::I64(ArrayD::from_shape_vec(vec![rows, cols], x).unwrap()))
            .unwrap();
        td.set(
            "next.y",
            Tensor::F32(ArrayD::from_shape_vec(vec![rows, cols, 2], y).unwrap()),
        )
        .unwrap();
        td.set(
            "d",
            Tensor::Bool(ArrayD::from_shape_vec(vec![rows, cols, 1], d).unwrap()),
        )
        .unwrap();
        td
    }

    fn xs(rb: &ReplayBuffer) -> Vec<i64> {
        rb.contents()
            .unwrap()
            .map(|c| c.i64("x").unwrap().iter().copied().collect())
            .unwrap_or_default()
    }

    #[test]
    fn capacity_and_fifo_eviction_are_exact() {
        let mut rb = ReplayBuffer::new(10, 0).unwrap();
        assert!(rb.is_empty());
        rb.extend(&batch(2, 3, 0)).unwrap();
        assert_eq!((rb.len(), rb.capacity()), (6, 10));
        assert_eq!(xs(&rb), (0..6).collect::<Vec<_>>(), "frames flattened row-major");
        rb.extend(&batch(1, 6, 6)).unwrap();
        assert_eq!(rb.len(), 10);
        assert_eq!(xs(&rb), (2..12).collect::<Vec<_>>(), "the two oldest evicted");
        rb.extend(&batch(3, 1, 12)).unwrap();
        assert_eq!(xs(&rb), (5..15).collect::<Vec<_>>());
        // A batch larger than the buffer keeps its newest frames.
        rb.extend(&batch(5, 5, 100)).unwrap();
        assert_eq!(xs(&rb), (115..125).collect::<Vec<_>>());
        assert_eq!(rb.frames_written(), 6 + 6 + 3 + 25);
        // The other entries moved with x.
        let c = rb.contents().unwrap().unwrap();
        let y = c.f32("next.y").unwrap();
        assert_eq!(y.shape(), &[10, 2]);
        assert_eq!((y[[0, 0]], y[[0, 1]], y[[9, 0]]), (115.0, -115.0, 124.0));
    }

    #[test]
    fn samples_have_the_stored_keys_and_shapes() {
        let mut rb = ReplayBuffer::new(50, 1).unwrap();
        assert_eq!(rb.sample(4).unwrap_err(), ReplayError::Empty(4));
        rb.extend(&batch(2, 5, 0)).unwrap();
        let s = rb.sample(7).unwrap();
        assert_eq!(s.batch_size(), &[7]);
        assert_eq!(s.keys().collect::<Vec<_>>(), vec!["d", "next.y", "x"]);
        assert_eq!(s.get("next.y").unwrap().shape(), &[7, 2]);
        assert_eq!(s.get("d").unwrap().shape(), &[7, 1]);
        let x = s.i64("x").unwrap();
        let y = s.f32("next.y").unwrap();
        for i in 0..7 {
            assert!((0..10).contains(&x[[i]]), "only frames held are sampled");
            assert_eq!(y[[i, 0]], x[[i]] as f32, "a sample's entries are one frame's");
        }
    }

    #[test]
    fn sampling_is_uniform_and_seeded() {
        let mut rb = ReplayBuffer::new(10, 7).unwrap();
        rb.extend(&batch(1, 10, 0)).unwrap();
        let draws = 20_000;
        let s = rb.sample(draws).unwrap();
        let mut counts = [0usize; 10];
        for &x in s.i64("x").unwrap().iter() {
            counts[x as usize] += 1;
        }
        // Expected 2000 each, sd about 42: 1800..2200 is over 4.5 sd, and the seed is fixed.
        assert!(counts.iter().all(|&c| (1800..2200).contains(&c)), "{counts:?}");
        let mut again = ReplayBuffer::new(10, 7).unwrap();
        again.extend(&batch(1, 10, 0)).unwrap();
        assert_eq!(again.sample(draws).unwrap(), s, "same seed, same samples");
    }

    #[test]
    fn a_batch_of_another_layout_is_refused_whole() {
        let mut rb = ReplayBuffer::new(8, 0).unwrap();
        rb.extend(&batch(1, 4, 0)).unwrap();
        let mut other = batch(1, 2, 50);
        other.set("extra", Tensor::zeros(crate::DType::F32, &[1, 2])).unwrap();
        assert!(matches!(rb.extend(&other), Err(ReplayError::Layout(_))));
        let mut wrong = TensorDict::new(&[3]);
        wrong.set("x", Tensor::zeros(crate::DType::F32, &[3])).unwrap();
        assert!(matches!(rb.extend(&wrong), Err(ReplayError::Layout(_))));
        assert_eq!(xs(&rb), vec![0, 1, 2, 3], "nothing written");
        assert_eq!(ReplayBuffer::new(0, 0).unwrap_err(), ReplayError::ZeroCapacity);
    }
}
