//! What `rollout collect` writes: `--output` records, `--json` lines (formats in the
//! crate docs).

use rollout::rollout::keys;
use rollout::{Tensor, TensorDict};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// The `data` map of an output record: every tensor under its dotted key.
pub(crate) struct Data<'a>(pub(crate) &'a TensorDict);

impl Serialize for Data<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, t) in self.0.iter() {
            m.serialize_entry(k, t)?;
        }
        m.end()
    }
}

/// One batch as written by `--output`.
#[derive(Serialize)]
pub(crate) struct Record<'a> {
    pub(crate) batch: u64,
    pub(crate) node: Option<usize>,
    pub(crate) weights_version: u64,
    pub(crate) weights_versions: &'a [u64],
    pub(crate) policy_lag: u64,
    pub(crate) data: Data<'a>,
}

/// One `--json` line per batch.
#[derive(Serialize)]
pub(crate) struct BatchLine {
    pub(crate) batch: u64,
    pub(crate) frames: u64,
    pub(crate) node: Option<usize>,
    pub(crate) weights_version: u64,
    pub(crate) policy_lag: u64,
}

/// The last `--json` line.
#[derive(Serialize)]
pub(crate) struct Summary {
    pub(crate) frames: u64,
    pub(crate) batches: u64,
    pub(crate) seconds: f64,
    pub(crate) fps: f64,
}

/// Real frames of a batch: the `collector.mask` count after `--split-trajs`, else every frame.
pub(crate) fn frames_of(data: &TensorDict) -> u64 {
    match data.get(keys::MASK) {
        Ok(Tensor::Bool(m)) => m.iter().filter(|&&b| b).count() as u64,
        _ => data.numel() as u64,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rollout::tensor::DType;
    use rollout::{Tensor, TensorDict};

    use super::{Data, Record};

    /// A decoded record's tensors (the crate docs' Rust reading of a record).
    #[derive(serde::Deserialize)]
    struct Read {
        weights_versions: Vec<u64>,
        policy_lag: u64,
        data: BTreeMap<String, Tensor>,
    }

    #[test]
    fn records_keep_every_dtype_and_nested_key_as_collected() {
        // Keys of any env: a dict observation's leaves, u8 frames, f64 and i64 values.
        let entries = [
            ("observation.pixels", DType::U8, vec![2, 3, 4, 4, 3]),
            ("observation.state.pos", DType::F64, vec![2, 3, 17]),
            ("action", DType::I64, vec![2, 3, 2]),
            ("next.done", DType::Bool, vec![2, 3, 1]),
        ];
        let data = TensorDict::from_entries(
            &[2, 3],
            entries.iter().map(|(k, d, shape)| {
                let mut t = Tensor::zeros(*d, shape);
                // Distinct values, so a mix-up of elements shows.
                match &mut t {
                    Tensor::U8(a) => a.iter_mut().enumerate().for_each(|(i, x)| *x = (i % 251) as u8),
                    Tensor::F64(a) => a.iter_mut().enumerate().for_each(|(i, x)| *x = i as f64 * 0.1 + 1e-12),
                    Tensor::I64(a) => a.iter_mut().enumerate().for_each(|(i, x)| *x = i as i64 - 3),
                    Tensor::Bool(a) => a.iter_mut().enumerate().for_each(|(i, x)| *x = i % 2 == 0),
                    _ => {}
                }
                (k.to_string(), t)
            }),
        )
        .expect("dict");
        let bytes = rmp_serde::to_vec_named(&Record {
            batch: 0,
            node: Some(1),
            weights_version: 3,
            weights_versions: &[3],
            policy_lag: 2,
            data: Data(&data),
        })
        .expect("encodes");
        let back: Read = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!((back.weights_versions, back.policy_lag), (vec![3], 2));
        assert_eq!(back.data.len(), entries.len());
        for (k, t) in data.iter() {
            assert_eq!(back.data.get(k), Some(t), "{k}");
        }
    }
}
