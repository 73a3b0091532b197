//! Running one SLURM command (`sbatch`, `squeue`, `scancel`, ...) under a deadline, and
//! what goes wrong with SLURM: the leaf the job array (`slurm`) and the choice of a
//! host to avoid (`slurm_avoid`) both run their commands through.

use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Longest any one SLURM command (`sbatch`, `squeue`, `scancel`, ...) may take.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a SLURM job could not be submitted, queried or ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SlurmError {
    /// A file of the job (folder, script, token) could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A SLURM command could not be started (not on `PATH`?).
    #[error("cannot run `{command}` (are the SLURM tools on PATH?): {source}")]
    Spawn {
        /// The command.
        command: String,
        /// Why.
        source: io::Error,
    },
    /// A SLURM command failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A SLURM command did not finish in time (and was killed).
    #[error("`{command}` did not finish within {seconds:.0} s")]
    Timeout {
        /// The command line.
        command: String,
        /// The deadline.
        seconds: f64,
    },
    /// `sbatch --parsable` printed something that is not a job id.
    #[error("sbatch printed no job id: {0:?}")]
    NoJobId(String),
    /// The job is being ended: no node is resubmitted any more.
    #[error("the SLURM job is being ended")]
    Closed,
    /// Tasks of the job were still in the queue after `scancel` and `scancel --signal=KILL`.
    #[error("SLURM job {job} is not ended after scancel: {states}")]
    NotEnded {
        /// The job id.
        job: String,
        /// The tasks still listed.
        states: String,
    },
}

/// Runs `program args` with a deadline; its stdout on success.
pub(super) fn run(program: &str, args: &[&str], timeout: Duration) -> Result<String, SlurmError> {
    let command = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| SlurmError::Spawn {
            command: command.clone(),
            source,
        })?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => {
            // SAFETY: kill(2) on the pid of a child we have not reaped yet.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            let _ = rx.recv_timeout(Duration::from_secs(5));
            return Err(SlurmError::Timeout {
                command,
                seconds: timeout.as_secs_f64(),
            });
        }
    }
    .map_err(|source| SlurmError::Spawn {
        command: command.clone(),
        source,
    })?;
    if !out.status.success() {
        return Err(SlurmError::Failed {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
