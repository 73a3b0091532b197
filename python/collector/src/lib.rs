//! `rollout._native`: the Rust side of the `rollout` Python package.
//!
//! The Python package (`rollout/`) gives torchrl's names and the TensorDict-like
//! batch; this module holds what must be native: the collector behind a thread of
//! its own (`runner`), settings read from a dict (`config`), batches as NumPy
//! arrays viewing the run's buffers, given back when freed (`storage`), weights
//! read from NumPy (`convert`), Rust errors as Python exceptions (`errors`),
//! Rust's log events as Python `logging` records (`log_bridge`), the
//! built-in envs' spaces (`specs`) and a Rust node (`node`: `python -m rollout node`).

mod bench;
mod collector;
mod config;
mod convert;
mod errors;
mod log_bridge;
mod node;
mod runner;
mod specs;
mod storage;

use pyo3::prelude::*;

/// The module `rollout._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<collector::NativeCollector>()?;
    m.add_function(wrap_pyfunction!(bench::bench_rust_loop, m)?)?;
    m.add_function(wrap_pyfunction!(bench::bench_rust_weights, m)?)?;
    m.add_function(wrap_pyfunction!(log_bridge::refresh_log_levels, m)?)?;
    m.add_function(wrap_pyfunction!(config::check_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(specs::builtin_env_specs, m)?)?;
    m.add_function(wrap_pyfunction!(node::run_node, m)?)?;
    log_bridge::install(m.py())?;
    errors::register(m)
}
