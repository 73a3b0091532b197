//! How a subcommand fails, and the exit status each failure maps to (see the crate docs).

use rollout_actors::CollectError;

/// A failure and the exit status it maps to.
pub(crate) enum Failure {
    /// Bad flags or values: exit 2.
    Usage(String),
    /// Failed after the start: exit 1.
    Runtime(String),
    /// Stopped by a signal (`rollout collect`): exit 128 + its number.
    Interrupted {
        /// `SIGINT` or `SIGTERM`.
        signal: &'static str,
        /// Its number.
        signo: i32,
    },
}

pub(crate) fn usage(field: &str, reason: impl std::fmt::Display) -> Failure {
    Failure::Usage(format!("invalid `{field}`: {reason}"))
}

/// A build error: a config the collector refused (exit 2) or a failure to start (exit 1).
pub(crate) fn build_failure(e: CollectError) -> Failure {
    match e {
        // A checkpoint refused at build time does not fit the flags: bad input too.
        CollectError::Config(_)
        | CollectError::Env(_)
        | CollectError::NodeBuild { .. }
        | CollectError::Checkpoint(_) => Failure::Usage(e.to_string()),
        other => Failure::Runtime(other.to_string()),
    }
}
