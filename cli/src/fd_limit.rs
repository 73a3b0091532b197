//! The soft limit on open files raised to the hard one at start: a trainer holds a
//! connection per node and per peer logging in, and the common soft default (1024)
//! is far below what the system allows this process.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; a failure is logged, not fatal
/// (the run works within the old limit, and accept errors back off).
pub(crate) fn raise_nofile_limit() {
    if let Err(error) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::warn!(%error, "cannot raise the open-file limit to the hard limit");
    }
}
