//! The `onnx` policy of a model file a user names (`--policy-file`, `policy_file=`):
//! read as bounded input ([`crate::bounded_file`]), then parsed once, before any node
//! starts.

use std::path::Path;

use rollout::policy::{OnnxError, OnnxHead, OnnxModel};
use rollout::PolicyConfig;

use crate::bounded_file::{read_bounded, shown, FileError, POLICY_FILE};

/// Why a policy file gave no policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    /// The file was not read: not a regular file, over
    /// [`MAX_MODEL_BYTES`](rollout::policy::MAX_MODEL_BYTES), or unreadable.
    #[error(transparent)]
    File(#[from] FileError),
    /// Its bytes are not a model rollout can run.
    #[error("{path}: {source}")]
    Onnx {
        /// The file (control characters escaped).
        path: String,
        /// Why.
        source: OnnxError,
    },
}

/// The `onnx` policy of the model in file `path` with the given head: the file read
/// (a regular file of at most [`MAX_MODEL_BYTES`](rollout::policy::MAX_MODEL_BYTES))
/// and parsed now; the fit to the env's specs is checked when the policy is built for
/// them.
pub fn onnx_policy(path: &Path, head: OnnxHead) -> Result<PolicyConfig, PolicyFileError> {
    let bytes = read_bounded(path, POLICY_FILE)?;
    let model = OnnxModel::parse(bytes).map_err(|source| PolicyFileError::Onnx {
        path: shown(path),
        source,
    })?;
    Ok(PolicyConfig::Onnx { model, head })
}
