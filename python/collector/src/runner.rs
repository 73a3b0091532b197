//! The collector on a thread of its own, so that Python never blocks inside it:
//! every call is a job sent to that thread, and the caller waits for the answer in
//! short slices with the GIL released, checking for signals (Ctrl-C) in between.
//! A wait interrupted by a signal leaves its job running; its answer is not lost
//! (the caller keeps the receiver, see `collector`).

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use pyo3::prelude::*;
use rollout_actors::{CollectError, CollectorBuilder, DistributedCollector};

use crate::errors::{collect_error, stopped};

/// How long one slice of a wait lasts: the delay before Ctrl-C is seen.
const SLICE: Duration = Duration::from_millis(50);

type Job = Box<dyn FnOnce(&mut DistributedCollector) + Send>;

/// The thread that owns the collector, and the queue of its jobs. Any Python thread
/// may queue a job (the locks are held only to queue or to take the thread).
pub(crate) struct Runner {
    jobs: Mutex<Option<Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Why a wait ended without an answer.
pub(crate) enum WaitError<R> {
    /// A signal handler raised (e.g. `KeyboardInterrupt`); the job goes on and its
    /// answer will come on the receiver handed back.
    Interrupted(PyErr, Receiver<R>),
    /// The collector's thread is gone.
    Gone,
}

impl<R> From<WaitError<R>> for PyErr {
    fn from(e: WaitError<R>) -> PyErr {
        match e {
            WaitError::Interrupted(e, _) => e,
            WaitError::Gone => stopped(),
        }
    }
}

impl Runner {
    /// Builds the collector on a new thread (starting nodes can take a while:
    /// processes, SLURM jobs) and waits until it runs. Interrupted (Ctrl-C), it waits on
    /// for the start to end and shuts the run down before raising, so that no node it
    /// started is left looking for its trainer; a second Ctrl-C raises at once.
    pub(crate) fn start(py: Python<'_>, builder: CollectorBuilder) -> PyResult<Runner> {
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), CollectError>>();
        let thread = std::thread::Builder::new()
            .name("rollout-python".into())
            .spawn(move || {
                let mut collector = match builder.build() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                while let Ok(job) = jobs_rx.recv() {
                    job(&mut collector);
                }
                // The queue closed without a shutdown job: dropping shuts down too.
                drop(collector);
            })
            .map_err(|e| crate::errors::CollectorError::new_err(format!("cannot spawn the collector's thread: {e}")))?;
        let runner = Runner {
            jobs: Mutex::new(Some(jobs_tx)),
            thread: Mutex::new(Some(thread)),
        };
        match wait(py, ready_rx) {
            Ok(built) => built.map_err(collect_error)?,
            Err(WaitError::Interrupted(e, ready_rx)) => {
                // Ctrl-C while the nodes start: Python never gets this run, so it ends
                // here. Node processes do not take the terminal's SIGINT (groups of
                // their own): once they joined, the closed queue makes the thread shut
                // the collector down, which stops them; joined before the
                // KeyboardInterrupt goes on. A second Ctrl-C stops waiting for that.
                if wait(py, ready_rx).is_ok() {
                    runner.join(py);
                }
                return Err(e);
            }
            Err(WaitError::Gone) => return Err(stopped()),
        }
        Ok(runner)
    }

    /// Queues `f` on the collector's thread; its answer comes on the receiver.
    pub(crate) fn call<R, F>(&self, f: F) -> PyResult<Receiver<R>>
    where
        R: Send + 'static,
        F: FnOnce(&mut DistributedCollector) -> R + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move |c| {
            let _ = tx.send(f(c));
        });
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .ok_or_else(stopped)?
            .send(job)
            .map_err(|_| stopped())?;
        Ok(rx)
    }

    /// Closes the queue and joins the thread (which drops, so shuts down, the collector).
    pub(crate) fn join(&self, py: Python<'_>) {
        *self.jobs.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(t) = thread {
            py.allow_threads(|| {
                let _ = t.join();
            });
        }
    }
}

/// Waits for an answer with the GIL released, in slices, checking signals between them.
pub(crate) fn wait<R: Send>(py: Python<'_>, mut rx: Receiver<R>) -> Result<R, WaitError<R>> {
    loop {
        // The receiver travels into the GIL-free closure and back (it is not `Sync`).
        let (back, answer) = py.allow_threads(move || {
            let answer = rx.recv_timeout(SLICE);
            (rx, answer)
        });
        rx = back;
        match answer {
            Ok(r) => return Ok(r),
            Err(RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    return Err(WaitError::Interrupted(e, rx));
                }
            }
            Err(RecvTimeoutError::Disconnected) => return Err(WaitError::Gone),
        }
    }
}
