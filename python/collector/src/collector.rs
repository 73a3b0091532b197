//! `NativeCollector`: the Python class over [`rollout_actors::DistributedCollector`].
//!
//! Each method queues a job on the collector's thread (`runner`) and waits with the
//! GIL released; `rollout.DistributedCollector` (Python) wraps it with torchrl's
//! names, iteration and the batch type.

use std::sync::mpsc::Receiver;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use rollout_actors::{CollectError, Collected};

use crate::config;
use crate::convert::{batch_to_py, weights_from_py};
use crate::errors::{collect_error, stopped};
use crate::runner::{wait, Runner, WaitError};

type NextAnswer = Result<Option<Collected>, CollectError>;

/// A running collection (see `rollout.DistributedCollector`).
#[pyclass(module = "rollout._native")]
pub(crate) struct NativeCollector {
    runner: Runner,
    /// A `next_batch` whose wait was interrupted (Ctrl-C): its batch is the next one.
    /// (A `Mutex` only because a Python class must be `Sync`; `&mut self` reaches it.)
    pending: Mutex<Option<Receiver<NextAnswer>>>,
    nodes: usize,
    down: bool,
}

impl NativeCollector {
    /// Runs `f` on the collector's thread and waits for its answer.
    fn ask<R, F>(&self, py: Python<'_>, f: F) -> PyResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut rollout_actors::DistributedCollector) -> Result<R, CollectError> + Send + 'static,
    {
        if self.down {
            return Err(stopped());
        }
        let rx = self.runner.call(f)?;
        wait(py, rx)?.map_err(collect_error)
    }
}

#[pymethods]
impl NativeCollector {
    /// Starts the run the settings dict describes (see `config`).
    #[new]
    fn new(py: Python<'_>, settings: Bound<'_, PyDict>) -> PyResult<NativeCollector> {
        let builder = config::builder(settings.copy()?)?;
        let runner = Runner::start(py, builder)?;
        let mut c = NativeCollector {
            runner,
            pending: Mutex::new(None),
            nodes: 0,
            down: false,
        };
        c.nodes = c.ask(py, |c| Ok(c.nodes()))?;
        Ok(c)
    }

    /// The next batch as a dict (see `convert::batch_to_py`), or `None` once
    /// `total_frames` have been yielded.
    fn next_batch(&mut self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        if self.down {
            return Ok(None);
        }
        let pending = self.pending.get_mut().unwrap_or_else(|p| p.into_inner());
        let rx = match pending.take() {
            Some(rx) => rx,
            None => self.runner.call(|c| c.next_batch())?,
        };
        let answer = match wait(py, rx) {
            Ok(a) => a,
            Err(WaitError::Interrupted(e, rx)) => {
                *self.pending.get_mut().unwrap_or_else(|p| p.into_inner()) = Some(rx);
                return Err(e);
            }
            Err(WaitError::Gone) => return Err(stopped()),
        };
        match answer.map_err(collect_error)? {
            Some(c) => batch_to_py(py, c).map(Some),
            None => Ok(None),
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
        self.ask(py, move |c| c.update_policy_weights(w, worker_ids.as_deref()))
    }

    /// Pushes the stored weights to `worker_ids` (all when `None`).
    #[pyo3(signature = (worker_ids=None))]
    fn push_policy_weights(&self, py: Python<'_>, worker_ids: Option<Vec<usize>>) -> PyResult<()> {
        self.ask(py, move |c| c.push_policy_weights(worker_ids.as_deref()))
    }

    /// Reseeds every node; returns the next seed.
    fn set_seed(&self, py: Python<'_>, seed: u64) -> PyResult<u64> {
        self.ask(py, move |c| c.set_seed(seed))
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

    /// Node restarts, late batches dropped, frames collected.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.ask(py, |c| c.stats())?;
        let d = PyDict::new(py);
        d.set_item("restarts", s.restarts)?;
        d.set_item("dropped_late", s.dropped_late)?;
        d.set_item("frames_collected", s.frames_collected)?;
        d.set_item("joined", s.joined)?;
        d.set_item("left", s.left)?;
        Ok(d)
    }

    /// Number of nodes.
    #[getter]
    fn nodes(&self) -> usize {
        self.nodes
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

    /// Stops the nodes and joins every thread; idempotent.
    fn shutdown(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.down {
            return Ok(());
        }
        *self.pending.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
        let r = self.ask(py, |c| c.shutdown());
        self.down = true;
        self.runner.join(py);
        r
    }
}
