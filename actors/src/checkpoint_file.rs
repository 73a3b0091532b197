//! Checkpoint files: written whole or not at all, read with every check.
//!
//! A save goes to a temporary file next to the target, is flushed to disk, then
//! renamed over it: a crash mid-save leaves the previous checkpoint intact.

use std::io::Write;
use std::path::{Path, PathBuf};

use rollout::checkpoint::Checkpoint;

use crate::bounded_file::{read_bounded, CHECKPOINT_FILE};
use crate::error::CollectError;

/// Writes `checkpoint` to `path` atomically (temporary file, fsync, rename).
pub fn save(checkpoint: &Checkpoint, path: &Path) -> Result<(), CollectError> {
    write_atomic(path, &checkpoint.to_bytes()?)
}

/// Reads a checkpoint written by [`save`] (a regular file of at most
/// [`CHECKPOINT_FILE`]'s limit); names the path in every error.
pub fn load(path: &Path) -> Result<Checkpoint, CollectError> {
    let bytes = read_bounded(path, CHECKPOINT_FILE).map_err(|e| CollectError::Checkpoint(e.to_string()))?;
    Checkpoint::from_bytes(&bytes).map_err(|e| CollectError::Checkpoint(format!("{}: {e}", path.display())))
}

/// Writes `bytes` to `path` so that a reader sees the old file or the new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CollectError> {
    let err =
        |what: &str, e: std::io::Error| CollectError::Checkpoint(format!("cannot {what} {}: {e}", path.display()));
    let name = path
        .file_name()
        .ok_or_else(|| CollectError::Checkpoint(format!("{} is not a file path", path.display())))?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp: PathBuf = path.with_file_name(tmp_name);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(err("write", e));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err("replace", e)
    })
}
