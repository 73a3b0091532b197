//! The records `rollout collect --output FILE` writes, decoded with types.

use std::collections::BTreeMap;

use rollout::Tensor;
use serde::Deserialize;

/// One record of an `--output` file: a batch and what it is tagged with.
#[derive(Debug, Deserialize)]
pub struct OutputRecord {
    /// The batch's index in the run.
    pub batch: u64,
    /// The node that collected it (async), `None` for a sync batch of every node.
    pub node: Option<usize>,
    /// The oldest weights version in it.
    pub weights_version: u64,
    /// Each share's weights version (one per node in a sync batch).
    pub weights_versions: Vec<u64>,
    /// Versions `weights_version` was behind the stored weights when it was yielded.
    pub policy_lag: u64,
    /// Its tensors by key.
    pub data: BTreeMap<String, Tensor>,
}

/// Every record of an `--output` file, in order (panics on a record that does not decode).
pub fn read_output(path: &std::path::Path) -> Vec<OutputRecord> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut cur = std::io::Cursor::new(&bytes[..]);
    let mut out = Vec::new();
    while (cur.position() as usize) < bytes.len() {
        out.push(rmp_serde::from_read(&mut cur).expect("an output record"));
    }
    out
}
