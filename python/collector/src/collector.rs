//! `NativeCollector`: the Python class over [`rollout_actors::DistributedCollector`].
//!
//! Each method queues a job on the collector's thread (`runner`) and waits with the
//! GIL released; weights and stats go through the collector's handle instead, so that
//! they do not wait behind a `next_batch` another thread is waiting in. Every method
//! takes `&self`: any Python thread may call any of them at any time.
//! `rollout.DistributedCollector` (Python) wraps it with torchrl's names, iteration and
//! the batch type.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use rollout::machine::SupervisionStats;
use rollout_actors::{CollectError, Collected, CollectorHandle};

use crate::config;
use crate::convert::weights_from_py;
use crate::errors::{collect_error, shut_down, stopped};
use crate::runner::{wait, Runner, WaitError};
use crate::storage::batch_to_py;

type NextAnswer = Result<Option<Collected>, CollectError>;

/// A running collection (see `rollout.DistributedCollector`).
#[pyclass(module = "rollout._native")]
pub(crate) struct NativeCollector {
    runner: Runner,
    /// Weights, stats and cancelling a wait, answered by the trainer at once.
    handle: CollectorHandle,
    /// A `next_batch` whose wait was interrupted (Ctrl-C): its batch is the next one.
    /// Locked only to take or put the receiver, never across a wait.
    pending: Mutex<Option<Receiver<NextAnswer>>>,
    nodes: usize,
    /// Frames of each batch; frames of the whole run (`None`: endless).
    frames: (usize, Option<u64>),
    /// Set by the first `shutdown`; read by `next_batch` jobs before they start.
    down: Arc<AtomicBool>,
    /// The stats as the run shut down (`stats` after `shutdown`).
    last_stats: Mutex<Option<SupervisionStats>>,
}

impl NativeCollector {
    /// Runs `f` on the collector's thread and waits for its answer.
    fn ask<R, F>(&self, py: Python<'_>, f: F) -> PyResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut rollout_actors::DistributedCollector) -> Result<R, CollectError> + Send + 'static,
    {
        if self.down.load(Ordering::SeqCst) {
            return Err(stopped());
        }
        let rx = self.runner.call(f)?;
        wait(py, rx)?.map_err(collect_error)
    }

    /// Runs `f` on the collector's handle with the GIL released: on the caller's
    /// thread, not queued behind the collector's jobs.
    fn on_handle<R, F>(&self, py: Python<'_>, f: F) -> PyResult<R>
    where
        R: Send,
        F: FnOnce(&CollectorHandle) -> Result<R, CollectError> + Send,
    {
        if self.down.load(Ordering::SeqCst) {
            return Err(stopped());
        }
        let handle = self.handle.clone();
        py.allow_threads(move || f(&handle)).map_err(collect_error)
    }
}

#[pymethods]
impl NativeCollector {
    /// Starts the run the settings dict describes (see `config`).
    #[new]
    fn new(py: Python<'_>, settings: Bound<'_, PyDict>) -> PyResult<NativeCollector> {
        let builder = config::builder(settings.copy()?)?;
        let runner = Runner::start(py, builder)?;
        let (nodes, handle, frames) = wait(
            py,
            runner.call(|c| (c.nodes(), c.handle(), (c.frames_per_batch(), c.total_frames())))?,
        )?;
        Ok(NativeCollector {
            runner,
            handle,
            pending: Mutex::new(None),
            nodes,
            frames,
            down: Arc::new(AtomicBool::new(false)),
            last_stats: Mutex::new(None),
        })
    }

    /// The next batch as a dict (see `storage::batch_to_py`; its storage goes back to
    /// the run when Python frees its arrays), or `None` once
    /// `total_frames` have been yielded.
    /// A `shutdown` on another thread meanwhile ends the wait with `None`; asked after
    /// `shutdown`, a `CollectorError`: the run is over, not empty.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        if self.down.load(Ordering::SeqCst) {
            return Err(shut_down());
        }
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner).take();
        let rx = match pending {
            Some(rx) => rx,
            None => {
                let down = Arc::clone(&self.down);
                self.runner.call(move |c| {
                    if down.load(Ordering::SeqCst) {
                        return Ok(None);
                    }
                    c.next_batch()
                })?
            }
        };
        let answer = match wait(py, rx) {
            Ok(a) => a,
            Err(WaitError::Interrupted(e, rx)) => {
                *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = Some(rx);
                return Err(e);
            }
            Err(WaitError::Gone) if self.down.load(Ordering::SeqCst) => return Ok(None),
            Err(WaitError::Gone) => return Err(stopped()),
        };
        match answer {
            Ok(Some(c)) => batch_to_py(py, c, Some(self.handle.clone())).map(Some),
            Ok(None) => Ok(None),
            Err(_) if self.down.load(Ordering::SeqCst) => Ok(None),
            Err(e) => Err(collect_error(e)),
        }
    }

    /// Stores `weights` (names to NumPy arrays) as the next version and pushes them
    /// to `worker_ids` (all nodes when `None`); returns the new version.
    #[pyo3(signature = (weights, worker_ids=None))]
    fn update_policy_weights(
        &self,
        py: Python<'_>,
        weights: Bound<'_, PyDict>,
        worker_ids: Option<Vec<usize>>,
    ) -> PyResult<u64> {
        let w = weights_from_py(&weights)?;
        self.on_handle(py, move |h| h.update_policy_weights(w, worker_ids.as_deref()))
    }

    /// Pushes the stored weights to `worker_ids` (all when `None`).
    #[pyo3(signature = (worker_ids=None))]
    fn push_policy_weights(&self, py: Python<'_>, worker_ids: Option<Vec<usize>>) -> PyResult<()> {
        self.on_handle(py, move |h| h.push_policy_weights(worker_ids.as_deref()))
    }

    /// Reseeds every node; returns the next seed.
    fn set_seed(&self, py: Python<'_>, seed: u64) -> PyResult<u64> {
        self.ask(py, move |c| c.set_seed(seed))
    }

    /// Every env of every node starts a new episode, reseeded from the run's next
    /// unused seeds; returns the next unused seed after them.
    fn reset_envs(&self, py: Python<'_>) -> PyResult<u64> {
        self.ask(py, |c| c.reset_envs())
    }

    /// A checkpoint of the whole run, as bytes (resume with `resume=`).
    fn checkpoint<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.ask(py, |c| {
            c.checkpoint()?
                .to_bytes()
                .map_err(|e| CollectError::Checkpoint(e.to_string()))
        })?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Node restarts, late batches dropped, frames collected; after `shutdown`, the
    /// last ones, read as the run shut down.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = match self.last_stats.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            Some(last) => last,
            None => self.on_handle(py, |h| h.stats())?,
        };
        let d = PyDict::new(py);
        d.set_item("restarts", s.restarts)?;
        d.set_item("dropped_late", s.dropped_late)?;
        d.set_item("dropped_lagging", s.dropped_lagging)?;
        d.set_item("frames_dropped_lagging", s.frames_dropped_lagging)?;
        d.set_item("frames_collected", s.frames_collected)?;
        d.set_item("joined", s.joined)?;
        d.set_item("left", s.left)?;
        d.set_item("batches_recycled", s.batches_recycled)?;
        Ok(d)
    }

    /// Number of nodes.
    #[getter]
    fn nodes(&self) -> usize {
        self.nodes
    }

    /// Frames of each batch.
    #[getter]
    fn frames_per_batch(&self) -> usize {
        self.frames.0
    }

    /// Frames of the whole run; -1: endless.
    #[getter]
    fn total_frames(&self) -> i64 {
        self.frames.1.map_or(-1, |t| i64::try_from(t).unwrap_or(i64::MAX))
    }

    /// The address remote nodes join (`HOST:PORT`), when they do.
    fn listen_addr(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.ask(py, |c| Ok(c.listen_addr().map(|a| a.to_string())))
    }

    /// The address the run's metrics are served on (`HOST:PORT`), when they are.
    fn metrics_addr(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.ask(py, |c| Ok(c.metrics_addr().map(|a| a.to_string())))
    }

    /// Process ids of the node processes started (`process` launcher).
    fn node_pids(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        self.ask(py, |c| Ok(c.node_pids()))
    }

    /// Every SLURM job of the run (`slurm` launcher).
    fn slurm_job_ids(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.ask(py, |c| Ok(c.slurm_job_ids()))
    }

    /// Stops the nodes and joins every thread; idempotent. A `next_batch` waiting on
    /// another thread returns `None` first (it would hold the collector's thread until
    /// its batch came).
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        if self.down.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let handle = self.handle.clone();
        // A run whose trainer is gone has no wait to cancel; shutdown says what happened.
        let _ = py.allow_threads(move || handle.cancel_next_batch());
        // The stats read as the run went down stay readable (`stats` after `with`).
        let r = self
            .runner
            .call(|c| (c.shutdown(), c.stats().ok()))
            .and_then(|rx| wait(py, rx).map_err(PyErr::from))
            .and_then(|(down, last)| {
                *self.last_stats.lock().unwrap_or_else(PoisonError::into_inner) = last;
                down.map_err(collect_error)
            });
        self.runner.join(py);
        r
    }
}
