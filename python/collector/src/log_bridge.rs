//! The Rust side's log events reach Python's `logging` under the `rollout` logger.
//!
//! tracing's events become `log` records (tracing's `log` feature: no tracing
//! subscriber is set in a Python process) and pyo3-log hands them to
//! `logging.getLogger(...)` with their level; the target is renamed into the `rollout`
//! hierarchy (`rollout_actors::trainer` is the logger `rollout.actors.trainer`, this
//! crate's `rollout.python`), so a handler or level on `rollout` covers them all.
//!
//! The level check comes before any formatting: `log`'s maximum level is the effective
//! level of Python's `rollout` logger, read at import and whenever a collector starts
//! (`refresh_log_levels`); below it an event costs a load and a compare (at the default
//! WARNING, every debug and info event of the batch path), and above it pyo3-log checks
//! the logger's cached level before the message is formatted.

use std::borrow::Cow;
use std::sync::OnceLock;

use log::{LevelFilter, Log, Metadata, Record};
use pyo3::prelude::*;
use pyo3_log::{Caching, Logger, ResetHandle};

/// The Python logger every record goes under.
const ROOT: &str = "rollout";

/// Resets pyo3-log's cache of loggers and levels (set once the bridge is installed).
static RESET: OnceLock<ResetHandle> = OnceLock::new();

/// pyo3-log's logger, with targets renamed into the `rollout` hierarchy.
struct RolloutLogger(Logger);

/// The `log` target (`::`-separated, as pyo3-log reads it) of a Rust target.
fn python_target(target: &str) -> Cow<'_, str> {
    if let Some(rest) = target.strip_prefix("rollout_") {
        Cow::Owned(format!("{ROOT}::{rest}"))
    } else if let Some(rest) = target.strip_prefix("_native") {
        Cow::Owned(format!("{ROOT}::python{rest}"))
    } else {
        Cow::Borrowed(target)
    }
}

impl Log for RolloutLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        let target = python_target(metadata.target());
        self.0
            .enabled(&Metadata::builder().level(metadata.level()).target(&target).build())
    }

    fn log(&self, record: &Record<'_>) {
        let target = python_target(record.target());
        self.0.log(
            &Record::builder()
                .args(*record.args())
                .level(record.level())
                .target(&target)
                .module_path(record.module_path())
                .file(record.file())
                .line(record.line())
                .build(),
        );
    }

    fn flush(&self) {}
}

/// Installs the bridge (once per process; a second import finds it installed) and
/// reads the levels.
pub(crate) fn install(py: Python<'_>) -> PyResult<()> {
    let logger = Logger::new(py, Caching::LoggersAndLevels)?.filter(LevelFilter::Trace);
    let reset = logger.reset_handle();
    if log::set_boxed_logger(Box::new(RolloutLogger(logger))).is_ok() {
        let _ = RESET.set(reset);
    }
    refresh_log_levels(py)
}

/// Reads the level of Python's `rollout` logger again (and forgets the levels cached
/// for its children): levels set after the import take effect at the next collector.
#[pyfunction]
pub(crate) fn refresh_log_levels(py: Python<'_>) -> PyResult<()> {
    if let Some(reset) = RESET.get() {
        reset.reset();
    }
    let level: u32 = py
        .import("logging")?
        .call_method1("getLogger", (ROOT,))?
        .call_method0("getEffectiveLevel")?
        .extract()?;
    // Python's numbers (pyo3-log maps Trace to 5).
    log::set_max_level(match level {
        0..=5 => LevelFilter::Trace,
        6..=10 => LevelFilter::Debug,
        11..=20 => LevelFilter::Info,
        21..=30 => LevelFilter::Warn,
        31..=40 => LevelFilter::Error,
        _ => LevelFilter::Off,
    });
    Ok(())
}
