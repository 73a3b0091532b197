//! Why a node could not join or stopped serving.

use rollout::rollout::RolloutError;
use rollout::wire;

use crate::bounded_file::FileError;
#[cfg(doc)]
use crate::bounded_file::TOKEN_FILE;

/// Why a node could not join or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// No token in `--token-file` or `ROLLOUT_TOKEN`.
    #[error("no token: pass --token-file PATH or set ROLLOUT_TOKEN")]
    NoToken,
    /// The token file could not be read: missing, not a regular file, or over
    /// [`TOKEN_FILE`]'s limit (64 KiB).
    #[error("the token file: {0}")]
    TokenFile(#[from] FileError),
    /// The token is too short to be a secret.
    #[error("the token is {len} bytes; at least {min} are required (e.g. `openssl rand -hex 16`)", min = wire::MIN_TOKEN_LEN)]
    ShortToken {
        /// Its length.
        len: usize,
    },
    /// The token file is readable by others than its owner (as ssh refuses such a key).
    #[error("the token file {path} is readable by group or others (mode {mode:03o}): `chmod 600 {path}`, or pass --allow-insecure-token-file")]
    InsecureTokenFile {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// A TLS setting cannot be used (a file missing, unreadable or not what it
    /// should be), naming the setting and the file.
    #[error("{0}")]
    Tls(#[from] crate::remote::tls::TlsError),
    /// The trainer could not be reached.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The trainer refused this node.
    #[error("rejected by the trainer: {0}")]
    Rejected(String),
    /// The trainer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The env workers could not be built from the trainer's config.
    #[error("cannot build the node: {0}")]
    Build(#[from] RolloutError),
    /// The connection was lost before `Shutdown`.
    #[error("lost the trainer: {0}")]
    Lost(String),
}
