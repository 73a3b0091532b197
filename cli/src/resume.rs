//! `rollout collect --checkpoint PATH` / `--resume PATH`: the collector's checkpoint plus
//! how long the `--output` file was when it was taken, so a resumed run cuts the file back
//! to that point and appends: the file then holds every batch exactly once.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::path::Path;

use anyhow::{bail, Context as _};
use rollout::checkpoint::{decode_file, encode_file, Checkpoint};
use rollout::PolicyConfig;
use rollout_actors::bounded_file::{read_bounded, CHECKPOINT_FILE};
use rollout_actors::checkpoint_file::write_atomic;
use serde::{Deserialize, Serialize};

/// First bytes of a `rollout collect` checkpoint file.
const MAGIC: &[u8; 8] = b"ROLLCOLL";
/// Its format version.
const FORMAT: u32 = 1;

/// What `--checkpoint` writes.
#[derive(Serialize, Deserialize)]
pub struct CollectCheckpoint {
    /// The collection run.
    pub collector: Checkpoint,
    /// Bytes of the `--output` file holding exactly the batches yielded so far.
    pub output_len: Option<u64>,
    /// The policy, when the flags alone cannot rebuild it: an `onnx` policy's model
    /// (its weights are in `collector`).
    #[serde(default)]
    pub policy: Option<PolicyConfig>,
}

impl CollectCheckpoint {
    /// Writes it to `path` atomically.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let bytes = encode_file(MAGIC, FORMAT, self)?;
        write_atomic(path, &bytes).map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Reads what [`Self::save`] wrote (a regular file of at most
    /// [`CHECKPOINT_FILE`]'s limit); the error names the path.
    pub fn load(path: &Path) -> anyhow::Result<CollectCheckpoint> {
        let bytes = read_bounded(path, CHECKPOINT_FILE)?;
        decode_file(MAGIC, FORMAT, &bytes).with_context(|| path.display().to_string())
    }
}

/// The `--output` file of a resumed run: the old file cut back to `len` bytes (the
/// batches before the checkpoint), positioned at its end. Refuses a file shorter than that.
pub fn reopen_output(path: &Path, len: u64) -> anyhow::Result<File> {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open {} to append to it", path.display()))?;
    let have = f
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if have < len {
        bail!(
            "{} holds {have} bytes, the checkpoint was taken after {len}: not the run's output file",
            path.display()
        );
    }
    f.set_len(len)
        .with_context(|| format!("cannot cut {} back", path.display()))?;
    f.seek(SeekFrom::End(0))
        .with_context(|| format!("cannot seek in {}", path.display()))?;
    Ok(f)
}
