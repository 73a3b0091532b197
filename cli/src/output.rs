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
    pub(crate) data: Data<'a>,
}

/// One `--json` line per batch.
#[derive(Serialize)]
pub(crate) struct BatchLine {
    pub(crate) batch: u64,
    pub(crate) frames: u64,
    pub(crate) node: Option<usize>,
    pub(crate) weights_version: u64,
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
