//! The exact position of a ChaCha8 generator, as plain serde data for checkpoints.
//!
//! A ChaCha stream is a pure function of (seed, stream, word position), so these three
//! are all it takes to continue a generator bit for bit in another process. The 68-bit
//! word position is split into two u64 halves: MessagePack has no u128.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Words a ChaCha stream can address: positions are 68 bits.
const WORD_POS_BITS: u32 = 68;

/// Where a [`ChaCha8Rng`] is in its output stream; [`RngState::to_rng`] rebuilds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    /// The 32-byte key.
    #[serde(with = "serde_bytes")]
    pub seed: Vec<u8>,
    /// The stream (nonce) number.
    pub stream: u64,
    /// High 64 bits of the word position (at most 4 bits are used).
    pub word_pos_hi: u64,
    /// Low 64 bits of the word position.
    pub word_pos_lo: u64,
}

/// A [`RngState`] that does not describe a generator (e.g. from a corrupt checkpoint).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RngStateError {
    /// The seed is not 32 bytes.
    #[error("rng seed has {0} bytes, expected 32")]
    SeedLength(usize),
    /// The word position is beyond the 2^68 words of a stream.
    #[error("rng word position {hi:#x}:{lo:016x} is past the end of the stream (2^68 words)")]
    WordPos {
        /// High half.
        hi: u64,
        /// Low half.
        lo: u64,
    },
}

impl RngState {
    /// The position of `rng`.
    pub fn of(rng: &ChaCha8Rng) -> RngState {
        let pos = rng.get_word_pos();
        RngState {
            seed: rng.get_seed().to_vec(),
            stream: rng.get_stream(),
            word_pos_hi: (pos >> 64) as u64,
            word_pos_lo: pos as u64,
        }
    }

    /// A generator that continues exactly where the one this was taken `of` stood.
    pub fn to_rng(&self) -> Result<ChaCha8Rng, RngStateError> {
        let seed: [u8; 32] = self
            .seed
            .as_slice()
            .try_into()
            .map_err(|_| RngStateError::SeedLength(self.seed.len()))?;
        let pos = (u128::from(self.word_pos_hi) << 64) | u128::from(self.word_pos_lo);
        if pos >> WORD_POS_BITS != 0 {
            return Err(RngStateError::WordPos {
                hi: self.word_pos_hi,
                lo: self.word_pos_lo,
            });
        }
        let mut rng = ChaCha8Rng::from_seed(seed);
        // The stream first: `set_word_pos` then refills the buffer from the right stream.
        rng.set_stream(self.stream);
        rng.set_word_pos(pos);
        Ok(rng)
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, RngCore};

    use super::*;

    #[test]
    fn restored_generator_continues_the_exact_stream() {
        let mut a = ChaCha8Rng::seed_from_u64(7);
        a.set_stream(3);
        // Odd offsets, across buffer (64-word) boundaries, and a split u64 read.
        for skip in [0usize, 1, 15, 16, 63, 64, 65, 127, 300] {
            for _ in 0..skip {
                a.next_u32();
            }
            let state = RngState::of(&a);
            let bytes = rmp_serde::to_vec_named(&state).expect("encode");
            let decoded: RngState = rmp_serde::from_slice(&bytes).expect("decode");
            assert_eq!(decoded, state);
            let mut b = decoded.to_rng().expect("valid state");
            let expected: Vec<u64> = (0..200).map(|_| a.next_u64()).collect();
            let got: Vec<u64> = (0..200).map(|_| b.next_u64()).collect();
            assert_eq!(got, expected, "after skipping {skip} words");
            assert_eq!(a.random::<f64>().to_bits(), b.random::<f64>().to_bits());
        }
        // Without the position, a fresh generator of the same seed is elsewhere.
        let mut fresh = ChaCha8Rng::seed_from_u64(7);
        fresh.set_stream(3);
        assert_ne!(fresh.next_u64(), a.next_u64());
    }

    #[test]
    fn bad_states_are_errors() {
        let good = RngState::of(&ChaCha8Rng::seed_from_u64(1));
        let short = RngState {
            seed: vec![0; 31],
            ..good.clone()
        };
        assert_eq!(short.to_rng().err(), Some(RngStateError::SeedLength(31)));
        let far = RngState {
            word_pos_hi: 16,
            ..good.clone()
        };
        assert!(matches!(far.to_rng(), Err(RngStateError::WordPos { .. })));
        let last = RngState {
            word_pos_hi: 15,
            word_pos_lo: u64::MAX,
            ..good
        };
        assert!(last.to_rng().is_ok());
    }
}
