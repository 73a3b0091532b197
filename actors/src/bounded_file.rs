//! Files a user names, read as bounded input: the policy file, `--env-spec @FILE`, token
//! files and checkpoints.
//!
//! [`read_bounded`] reads a file only if it is a regular file, and at most its limit + 1
//! bytes: a FIFO, a directory or a device such as `/dev/zero` is refused without being
//! read (nor, for a FIFO, waited on), and a file over its limit is refused naming the
//! file, its size, the limit and the setting that named it. Each kind of file has its
//! own documented [`FileLimit`] ([`POLICY_FILE`], [`ENV_SPEC_FILE`], [`TOKEN_FILE`],
//! [`CHECKPOINT_FILE`]).

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

/// What may be read from one kind of file: the setting that names such files (as the
/// builder, the Python module and the command line call it) and the most bytes read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLimit {
    /// The setting that names the file (`policy_file`, `env_spec`, ...), for errors.
    pub setting: &'static str,
    /// The most bytes such a file may hold.
    pub limit: u64,
}

/// An ONNX policy file: at most [`rollout::policy::MAX_MODEL_BYTES`] (128 MiB), the
/// model limit the trainer holds a model to anyway.
pub const POLICY_FILE: FileLimit = FileLimit {
    setting: "policy_file",
    limit: rollout::policy::MAX_MODEL_BYTES as u64,
};

/// `--env-spec @FILE`: at most [`MAX_SPECS_JSON_BYTES`](rollout::space_json::MAX_SPECS_JSON_BYTES)
/// (1 MiB), as inline specs.
pub const ENV_SPEC_FILE: FileLimit = FileLimit {
    setting: "env_spec",
    limit: rollout::space_json::MAX_SPECS_JSON_BYTES as u64,
};

/// A token file: at most 64 KiB (a token is a secret of some tens of bytes).
pub const TOKEN_FILE: FileLimit = FileLimit {
    setting: "token_file",
    limit: 64 << 10,
};

/// A checkpoint (`rollout collect --resume`, `rollout train --resume`, the builder's
/// checkpoint files): at most 16 GiB. A checkpoint holds the stored weights, each
/// node's weights and env states and the batches not yet yielded, each of them within
/// a frame (`max_frame`, 256 MiB by default), so a run of a few dozen nodes with
/// weights of a full frame fits; the limit is there to refuse what is not a
/// checkpoint (a device, a stream, a runaway file) before it is read.
pub const CHECKPOINT_FILE: FileLimit = FileLimit {
    setting: "resume",
    limit: 16 << 30,
};

/// Why a named file was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// It could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file, as given (control characters escaped).
        path: String,
        /// Why.
        source: io::Error,
    },
    /// It is not a regular file (a FIFO, a directory, a device, a socket).
    #[error("{path} is {kind}, not a regular file: `{setting}` reads regular files only")]
    NotRegular {
        /// The file, as given (control characters escaped).
        path: String,
        /// What it is instead (`a FIFO`, `a directory`, `a character device`, ...).
        kind: &'static str,
        /// The setting that named it.
        setting: &'static str,
    },
    /// It holds more bytes than its limit.
    #[error("{path} holds {size}, over the limit of {limit} for `{setting}`")]
    TooLarge {
        /// The file, as given (control characters escaped).
        path: String,
        /// Its size (or at least how much of it was read, when it grew meanwhile).
        size: Bytes,
        /// The limit.
        limit: Bytes,
        /// The setting that named it.
        setting: &'static str,
    },
}

/// A number of bytes, shown exactly (`134217729 bytes`) with its binary unit when
/// that is shorter to read (`(128 MiB)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        write!(f, "{n} bytes")?;
        for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
            if n >= 1 << shift {
                let whole = n >> shift;
                return if whole << shift == n {
                    write!(f, " ({whole} {unit})")
                } else {
                    write!(f, " (over {whole} {unit})")
                };
            }
        }
        Ok(())
    }
}

/// `path` as text for a one-line error: control characters (a newline in a file name)
/// escaped.
pub(crate) fn shown(path: &Path) -> String {
    let lossy = path.to_string_lossy();
    let mut out = String::with_capacity(lossy.len());
    for c in lossy.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// What a file that is not a regular one is, for the error.
fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// The bytes of the file at `path` (symbolic links followed), if it is a regular file
/// of at most `limit.limit` bytes.
///
/// A path that is not a regular file is refused from its metadata, without opening it;
/// the file is then opened non-blocking (a FIFO put in its place meanwhile is not waited
/// on) and its type checked again on the open handle; at most `limit + 1` bytes are read,
/// so a file that grows while it is read is refused too.
pub fn read_bounded(path: &Path, limit: FileLimit) -> Result<Vec<u8>, FileError> {
    let io_error = |source| FileError::Io {
        path: shown(path),
        source,
    };
    let check = |meta: &std::fs::Metadata| -> Result<u64, FileError> {
        if !meta.is_file() {
            return Err(FileError::NotRegular {
                path: shown(path),
                kind: kind_of(meta.file_type()),
                setting: limit.setting,
            });
        }
        if meta.len() > limit.limit {
            return Err(too_large(path, meta.len(), limit));
        }
        Ok(meta.len())
    };
    check(&std::fs::metadata(path).map_err(io_error)?)?;
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| io_error(e.into()))?;
    let file = File::from(fd);
    let size = check(&file.metadata().map_err(io_error)?)?;
    // The size was checked against the limit: the capacity is bounded by it.
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(limit.limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io_error)?;
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if read > limit.limit {
        return Err(too_large(path, read, limit));
    }
    Ok(bytes)
}

fn too_large(path: &Path, size: u64, limit: FileLimit) -> FileError {
    FileError::TooLarge {
        path: shown(path),
        size: Bytes(size),
        limit: Bytes(limit.limit),
        setting: limit.setting,
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use super::*;

    const SMALL: FileLimit = FileLimit {
        setting: "test_file",
        limit: 16,
    };

    fn dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rollout-bounded-file-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn a_regular_file_within_its_limit_is_read_whole() {
        let p = dir().join("ok");
        std::fs::write(&p, b"0123456789abcdef").expect("write");
        assert_eq!(read_bounded(&p, SMALL).expect("read"), b"0123456789abcdef");
        std::fs::write(&p, b"").expect("write");
        assert_eq!(read_bounded(&p, SMALL).expect("read"), b"");
    }

    #[test]
    fn a_file_over_its_limit_is_refused_naming_it_its_size_the_limit_and_the_setting() {
        let p = dir().join("big");
        std::fs::write(&p, [0u8; 17]).expect("write");
        let e = read_bounded(&p, SMALL).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{} holds 17 bytes, over the limit of 16 bytes for `test_file`",
                p.display()
            )
        );
        // A sparse file of 2 GiB and one byte: refused from its size, nothing read.
        let sparse = dir().join("sparse");
        let f = File::create(&sparse).expect("create");
        f.set_len((2 << 30) + 1).expect("set_len");
        let started = Instant::now();
        let e = read_bounded(&sparse, TOKEN_FILE).unwrap_err().to_string();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "took {:?}",
            started.elapsed()
        );
        assert!(
            e.ends_with("holds 2147483649 bytes (over 2 GiB), over the limit of 65536 bytes (64 KiB) for `token_file`"),
            "{e}"
        );
    }

    #[test]
    fn a_fifo_a_directory_and_dev_zero_are_refused_unread() {
        let fifo = dir().join("fifo");
        let _ = std::fs::remove_file(&fifo);
        let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
        assert!(made.success(), "mkfifo {}", fifo.display());
        let started = Instant::now();
        let e = read_bounded(&fifo, SMALL).unwrap_err().to_string();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "took {:?}",
            started.elapsed()
        );
        assert_eq!(
            e,
            format!(
                "{} is a FIFO, not a regular file: `test_file` reads regular files only",
                fifo.display()
            )
        );
        let e = read_bounded(&dir(), SMALL).unwrap_err().to_string();
        assert!(e.contains("is a directory, not a regular file"), "{e}");
        let e = read_bounded(Path::new("/dev/zero"), POLICY_FILE)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "/dev/zero is a character device, not a regular file: `policy_file` reads regular files only"
        );
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it_and_a_newline_in_its_name_stays_on_one_line() {
        let p = dir().join("no\nsuch");
        let e = read_bounded(&p, SMALL).unwrap_err().to_string();
        assert!(e.starts_with("cannot read "), "{e}");
        assert!(e.contains("no\\nsuch"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn sizes_show_their_binary_unit() {
        assert_eq!(Bytes(17).to_string(), "17 bytes");
        assert_eq!(Bytes(1 << 20).to_string(), "1048576 bytes (1 MiB)");
        assert_eq!(Bytes((1 << 20) + 1).to_string(), "1048577 bytes (over 1 MiB)");
        assert_eq!(Bytes(16 << 30).to_string(), "17179869184 bytes (16 GiB)");
    }
}
