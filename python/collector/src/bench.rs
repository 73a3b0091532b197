//! The Rust side of the module's benchmark (python/collector/bench): the same
//! collection and weight pushes driven from Rust in the Python process, the
//! baseline the Python figures are divided by. Not part of the public API.

use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use rollout_actors::CollectError;

use crate::config;
use crate::convert::weights_from_py;
use crate::errors::collect_error;

/// Seconds the Rust facade takes for `batches` batches of the run `settings`
/// describes (started before the clock), touching one element of each batch's
/// `observation`; with `recycle` each batch's storage goes back to the nodes.
/// Returns `(seconds, frames)`.
#[pyfunction]
pub(crate) fn bench_rust_loop(
    py: Python<'_>,
    settings: Bound<'_, PyDict>,
    batches: usize,
    recycle: bool,
) -> PyResult<(f64, usize)> {
    let builder = config::builder(settings.copy()?)?;
    py.allow_threads(move || -> Result<(f64, usize), CollectError> {
        let mut c = builder.build()?;
        let mut frames = 0;
        let mut touched = 0.0f32;
        let start = Instant::now();
        for _ in 0..batches {
            let Some(b) = c.next_batch()? else { break };
            frames += b.data.numel();
            touched += b
                .data
                .f32("observation")
                .ok()
                .and_then(|a| a.iter().next().copied())
                .unwrap_or(0.0);
            if recycle {
                c.recycle(b);
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        std::hint::black_box(touched);
        c.shutdown()?;
        Ok((seconds, frames))
    })
    .map_err(collect_error)
}

/// Seconds per `update_policy_weights` of `weights` (converted once, cloned per
/// push as a learner's fresh weights would be new memory) over `rounds` pushes.
#[pyfunction]
pub(crate) fn bench_rust_weights(
    py: Python<'_>,
    settings: Bound<'_, PyDict>,
    weights: Bound<'_, PyDict>,
    rounds: usize,
) -> PyResult<f64> {
    let builder = config::builder(settings.copy()?)?;
    let w = weights_from_py(&weights)?;
    py.allow_threads(move || -> Result<f64, CollectError> {
        let mut c = builder.build()?;
        let start = Instant::now();
        for _ in 0..rounds {
            c.update_policy_weights(w.clone(), None)?;
        }
        let seconds = start.elapsed().as_secs_f64() / rounds.max(1) as f64;
        c.shutdown()?;
        Ok(seconds)
    })
    .map_err(collect_error)
}
