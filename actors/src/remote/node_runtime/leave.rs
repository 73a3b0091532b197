//! Leaving a run cleanly: asked through a [`LeaveHandle`] or by SIGTERM and SIGINT.

use std::sync::Arc;

#[cfg(doc)]
use super::run_node;

/// Tells a node served by [`run_node`] to leave the run (`leave`, then `Ok`), from
/// any thread; pulled before the node joined, it leaves as soon as it is in.
#[derive(Clone, Debug, Default)]
pub struct LeaveHandle(Arc<tokio::sync::Notify>);

impl LeaveHandle {
    /// A handle not pulled yet.
    pub fn new() -> LeaveHandle {
        LeaveHandle::default()
    }

    /// The node leaves.
    pub fn leave(&self) {
        self.0.notify_one();
    }
}

/// Resolves when the node is to leave: a pulled [`LeaveHandle`], or with
/// `signals`, SIGTERM or SIGINT. Never, when neither is set (or the signal handlers
/// cannot be installed, which is logged).
pub(super) async fn leave_asked(handle: Option<LeaveHandle>, signals: bool) -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let pulled = async {
        match handle {
            Some(h) => h.0.notified().await,
            None => std::future::pending().await,
        }
    };
    let signalled = async {
        if !signals {
            return std::future::pending().await;
        }
        match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(mut term), Ok(mut int)) => tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            },
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "cannot handle SIGTERM and SIGINT; the node will not leave cleanly on them");
                std::future::pending().await
            }
        }
    };
    tokio::select! {
        _ = pulled => "asked to",
        why = signalled => why,
    }
}
