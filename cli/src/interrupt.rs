//! SIGINT (Ctrl-C) and SIGTERM during `rollout collect`: the wait for a batch is
//! cancelled and the run ends as it ends when done (the output flushed, the collector
//! shut down: every node stops between steps and is waited for, bounded), instead of
//! the process dying with a batch in flight and node processes behind it. A second
//! signal exits at once.
//!
//! Node processes (`--launcher process`) lead process groups of their own, so Ctrl-C
//! in a terminal (SIGINT to its foreground group) reaches this process alone: the
//! shutdown here is what stops them. The signals are caught from before the collector
//! is built, so one that comes while the nodes start ends the run once they have
//! started, rather than leaving them to find their trainer gone.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rollout_actors::CollectorHandle;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// How often the wait is cancelled again until the run has left its loop: a cancel that
/// comes while no `next_batch` waits does nothing, and the loop may be about to wait.
const CANCEL_AGAIN: Duration = Duration::from_millis(50);

/// The signals caught for one run.
pub(crate) struct Interrupt {
    /// The signal's number once one came, else 0.
    caught: Arc<AtomicI32>,
    /// Set once the run left its loop: cancelling stops.
    finished: Arc<AtomicBool>,
    /// The run's handle, once it is built: what a signal cancels.
    handle: Arc<OnceLock<CollectorHandle>>,
}

impl Interrupt {
    /// Catches SIGINT and SIGTERM from now on, on a thread of its own: the first one
    /// is recorded ([`Self::caught`]) and, once [`Self::attach`] gave the run's handle,
    /// cancels its wait for a batch (again every 50 ms until [`Self::finish`]); a
    /// second one exits with status 128 + its number.
    pub(crate) fn catch() -> std::io::Result<Interrupt> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        // Registered here, before the collection starts, so no signal is missed.
        let (int, term) = {
            let _in_rt = rt.enter();
            (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?)
        };
        let caught = Arc::new(AtomicI32::new(0));
        let finished = Arc::new(AtomicBool::new(false));
        let handle = Arc::new(OnceLock::new());
        let (c, f, h) = (Arc::clone(&caught), Arc::clone(&finished), Arc::clone(&handle));
        std::thread::Builder::new()
            .name("rollout-signals".into())
            .spawn(move || rt.block_on(watch(int, term, h, c, f)))?;
        Ok(Interrupt {
            caught,
            finished,
            handle,
        })
    }

    /// The run is built: a signal (already caught, or to come) cancels `handle`'s wait
    /// for a batch.
    pub(crate) fn attach(&self, handle: CollectorHandle) {
        // Only one run per `Interrupt`: a second handle would be the same run's.
        let _ = self.handle.set(handle);
    }

    /// The signal caught (`SIGINT` or `SIGTERM`) and its number, if one came.
    pub(crate) fn caught(&self) -> Option<(&'static str, i32)> {
        match self.caught.load(Ordering::SeqCst) {
            0 => None,
            n => Some((name(n), n)),
        }
    }

    /// The run left its loop: no wait is to be cancelled any more.
    pub(crate) fn finish(&self) {
        self.finished.store(true, Ordering::SeqCst);
    }
}

/// `SIGINT` or `SIGTERM` by number.
fn name(signo: i32) -> &'static str {
    if signo == SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    }
}

const SIGINT: i32 = 2;
const SIGTERM: i32 = 15;

async fn watch(
    mut int: Signal,
    mut term: Signal,
    handle: Arc<OnceLock<CollectorHandle>>,
    caught: Arc<AtomicI32>,
    finished: Arc<AtomicBool>,
) {
    let first = tokio::select! {
        _ = int.recv() => SIGINT,
        _ = term.recv() => SIGTERM,
    };
    caught.store(first, Ordering::SeqCst);
    eprintln!("{}: stopping (again to exit at once)", name(first));
    let cancel = async {
        while !finished.load(Ordering::SeqCst) {
            // Before the run is built there is no wait to cancel: the run sees the
            // signal before its first batch.
            if let Some(h) = handle.get().cloned() {
                // The trainer answers at once; a run already gone has nothing to cancel.
                let _ = tokio::task::spawn_blocking(move || h.cancel_next_batch()).await;
            }
            tokio::time::sleep(CANCEL_AGAIN).await;
        }
        std::future::pending::<()>().await;
    };
    let second = tokio::select! {
        _ = int.recv() => SIGINT,
        _ = term.recv() => SIGTERM,
        _ = cancel => SIGINT,
    };
    std::process::exit(128 + second);
}
