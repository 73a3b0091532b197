//! The soft limit on open files raised to the hard one at start: a trainer holds a
//! connection per node and per peer logging in, and the common soft default (1024)
//! is far below what the system allows this process.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; a failure is logged, not fatal
/// (the run works within the old limit, and accept errors back off).
pub(crate) fn raise_nofile_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; no other memory is touched.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot read RLIMIT_NOFILE");
        return;
    }
    if lim.rlim_cur >= lim.rlim_max {
        return;
    }
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: setrlimit only reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            soft = lim.rlim_cur,
            hard = lim.rlim_max,
            "cannot raise the open-file limit to the hard limit"
        );
    }
}
