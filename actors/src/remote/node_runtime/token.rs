//! The shared token a node logs in with: read from its file or `ROLLOUT_TOKEN`, checked.

use std::io;
use std::path::Path;

use rollout::wire;

use super::JoinError;
use crate::bounded_file::{read_bounded, shown, FileError, TOKEN_FILE};

/// The shared token: the file's content (trailing newline removed) or `ROLLOUT_TOKEN`.
/// Never a command-line argument: those show in `ps`. Refused when shorter than
/// [`MIN_TOKEN_LEN`](wire::MIN_TOKEN_LEN) bytes, and (the way ssh refuses a key file)
/// when the file is readable by group or others, unless `insecure_file_ok`.
pub fn read_token(token_file: Option<&Path>, insecure_file_ok: bool) -> Result<Vec<u8>, JoinError> {
    let token = match token_file {
        Some(p) => {
            let mode = file_mode(p).map_err(|source| FileError::Io { path: shown(p), source })?;
            if mode & 0o077 != 0 && !insecure_file_ok {
                return Err(JoinError::InsecureTokenFile {
                    path: p.display().to_string(),
                    mode,
                });
            }
            let raw = read_bounded(p, TOKEN_FILE)?;
            let end = raw.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |i| i + 1);
            raw[..end].to_vec()
        }
        None => std::env::var("ROLLOUT_TOKEN").unwrap_or_default().into_bytes(),
    };
    if token.is_empty() {
        return Err(JoinError::NoToken);
    }
    if token.len() < wire::MIN_TOKEN_LEN {
        return Err(JoinError::ShortToken { len: token.len() });
    }
    Ok(token)
}

/// A file's permission bits (those a token file must keep to its owner).
fn file_mode(p: &Path) -> io::Result<u32> {
    use std::os::unix::fs::PermissionsExt;
    Ok(std::fs::metadata(p)?.permissions().mode() & 0o777)
}
