//! Checkpoint files: written whole or not at all, read with every check.
//!
//! A save goes to a temporary file of a name of its own next to the target (the
//! `tempfile` crate's), is flushed to disk, renamed over the target, and the rename
//! made durable by flushing the directory: a crash mid-save leaves the previous
//! checkpoint intact, and two saves at once each write a file of their own.

use std::fs::{File, Permissions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use rollout::checkpoint::Checkpoint;

use crate::bounded_file::{read_bounded, CHECKPOINT_FILE};
use crate::error::CollectError;

/// Writes `checkpoint` to `path` atomically (see [`write_atomic`]).
pub fn save(checkpoint: &Checkpoint, path: &Path) -> Result<(), CollectError> {
    write_atomic(path, &checkpoint.to_bytes()?)
}

/// Reads a checkpoint written by [`save`] (a regular file of at most
/// [`CHECKPOINT_FILE`]'s limit); names the path in every error.
pub fn load(path: &Path) -> Result<Checkpoint, CollectError> {
    let bytes = read_bounded(path, CHECKPOINT_FILE).map_err(|e| CollectError::Checkpoint(e.to_string()))?;
    Checkpoint::from_bytes(&bytes).map_err(|e| CollectError::Checkpoint(format!("{}: {e}", path.display())))
}

/// Writes `bytes` to `path` so that a reader sees the old file or the new one, never a
/// part, and the new one survives a crash once this returns: a temporary file beside it
/// (`NAME.tmp` and a random suffix, removed on failure), fsynced, renamed over `path`,
/// then the directory fsynced. The file gets the mode `File::create` gives (0666 less
/// the umask).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CollectError> {
    let err =
        |what: &str, e: std::io::Error| CollectError::Checkpoint(format!("cannot {what} {}: {e}", path.display()));
    let name = path
        .file_name()
        .ok_or_else(|| CollectError::Checkpoint(format!("{} is not a file path", path.display())))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut prefix = name.to_os_string();
    prefix.push(".tmp");
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .permissions(Permissions::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(|e| err("write", e))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| err("write", e))?;
    // On failure the temporary file is handed back and removed as it drops.
    tmp.persist(path).map_err(|e| err("replace", e.error))?;
    // The rename is an entry of the directory: durable once the directory is flushed.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| err("replace", e))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};
    use std::thread;

    use super::*;

    #[test]
    fn two_writes_at_once_to_one_path_both_succeed_and_leave_one_whole_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("run.ckpt");
        // Large enough that the two writes overlap in time.
        let payloads = [vec![b'a'; 1 << 20], vec![b'b'; 1 << 20]];
        for round in 0..20 {
            let start = Arc::new(Barrier::new(2));
            let writers: Vec<_> = payloads
                .iter()
                .map(|p| {
                    let (start, path, p) = (start.clone(), path.clone(), p.clone());
                    thread::spawn(move || {
                        start.wait();
                        write_atomic(&path, &p)
                    })
                })
                .collect();
            for w in writers {
                let r = w.join().expect("writer thread");
                assert!(r.is_ok(), "round {round}: {r:?}");
            }
            let got = std::fs::read(&path).expect("read");
            assert!(
                payloads.contains(&got),
                "round {round}: the file is neither write whole"
            );
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["run.ckpt"], "no temporary file left behind");
    }

    #[test]
    fn a_path_without_a_file_name_is_refused_by_name() {
        let err = write_atomic(Path::new("/"), b"x").expect_err("no file name");
        assert!(err.to_string().contains("/ is not a file path"), "{err}");
    }
}
