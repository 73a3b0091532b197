//! A Rust node from the Python package (`python -m rollout node`): the code of
//! `rollout node` (`rollout_actors::remote::run_node`) in the wheel's extension, so a
//! pip user's process and SLURM launchers have a node without the `rollout` binary.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::prelude::*;
use rollout_actors::remote::{read_token, run_node as serve, NodeOptions};

use crate::errors::{config_error, CollectorError};

/// Joins the trainer at `join` and serves it until it shuts the node down, or leaves
/// the run on SIGTERM or SIGINT; blocking, without the GIL. The token is read from
/// `token_file` (else `ROLLOUT_TOKEN`), refused when the file is readable by others
/// unless `allow_insecure_token_file`. A bad argument is a `ConfigError` naming it;
/// a failed join or run a `CollectorError`.
#[pyfunction]
#[pyo3(signature = (join, token_file=None, allow_insecure_token_file=false, name=None, index=None, connect_timeout=30.0))]
pub(crate) fn run_node(
    py: Python<'_>,
    join: String,
    token_file: Option<PathBuf>,
    allow_insecure_token_file: bool,
    name: Option<String>,
    index: Option<usize>,
    connect_timeout: f64,
) -> PyResult<()> {
    let token = read_token(token_file.as_deref(), allow_insecure_token_file).map_err(|e| config_error("token", e))?;
    let connect_timeout = Duration::try_from_secs_f64(connect_timeout).map_err(|_| {
        config_error(
            "connect_timeout",
            format!("{connect_timeout} is not a number of seconds"),
        )
    })?;
    let mut opts = NodeOptions {
        index,
        connect_timeout,
        // Nodes come and go: SIGTERM or SIGINT sends `leave` and returns, as `rollout node`.
        leave_on_signals: true,
        ..NodeOptions::default()
    };
    if let Some(n) = name {
        opts.name = n;
    }
    py.allow_threads(move || serve(&join, &token, opts))
        .map_err(|e| CollectorError::new_err(e.to_string()))
}
