//! Rust errors as Python exceptions, with the Rust message: a config error is a
//! `ConfigError` (a `ValueError`) whose `field` names the argument at fault, a
//! deadline a `CollectorTimeout` (a `TimeoutError`), anything else a
//! `CollectorError` (a `RuntimeError`).
//!
//! The classes are named `rollout.<Name>` (the package re-exports them there), so
//! `pickle` finds them by that name: an error crosses `multiprocessing` or Ray with
//! its message and `field`.

use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use rollout_actors::CollectError;

pyo3::create_exception!(
    rollout,
    ConfigError,
    PyValueError,
    "A setting the collector cannot run with; `field` names the argument."
);
pyo3::create_exception!(
    rollout,
    CollectorError,
    PyRuntimeError,
    "The collector failed (a node, the launcher, a checkpoint, ...)."
);
pyo3::create_exception!(
    rollout,
    CollectorTimeout,
    PyTimeoutError,
    "A bounded wait of the collector ran out."
);

/// Adds the exception types to the module; a `ConfigError` made in Python without
/// a `field` has `field = None` (a class attribute).
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let config = py.get_type::<ConfigError>();
    config.setattr("field", py.None())?;
    m.add("ConfigError", config)?;
    m.add("CollectorError", py.get_type::<CollectorError>())?;
    m.add("CollectorTimeout", py.get_type::<CollectorTimeout>())?;
    Ok(())
}

/// A `ConfigError` for `field` with its `field` attribute set.
pub(crate) fn config_error(field: &str, reason: impl std::fmt::Display) -> PyErr {
    let err = ConfigError::new_err(format!("invalid `{field}`: {reason}"));
    Python::with_gil(|py| {
        // Setting an attribute on a fresh exception object cannot fail in practice;
        // if it did, the message still names the field.
        let _ = err.value(py).setattr("field", field);
    });
    err
}

/// The Python exception for a Rust error, its message the Rust one.
pub(crate) fn collect_error(e: CollectError) -> PyErr {
    match e {
        CollectError::Config(c) => config_error(c.field, c.reason),
        // Raised while building, before anything runs: the env (or its config) is at fault.
        CollectError::Env(e) => config_error("env", e),
        e @ CollectError::Timeout { .. } => CollectorTimeout::new_err(e.to_string()),
        e => CollectorError::new_err(e.to_string()),
    }
}

/// The error of a call on a collector whose thread is gone.
pub(crate) fn stopped() -> PyErr {
    CollectorError::new_err("the collector's thread is gone (shut down, or it failed)")
}

/// The error of asking a collector that was shut down for a batch: the run is over,
/// which an empty iteration would hide.
pub(crate) fn shut_down() -> PyErr {
    CollectorError::new_err("the collector was shut down: its run is over (start a new DistributedCollector)")
}
