//! Running one SLURM command (`sbatch`, `squeue`, `scancel`, ...) under a deadline, and
//! what goes wrong with SLURM: the leaf the job array (`slurm`) and the choice of a
//! host to avoid (`slurm_avoid`) both run their commands through.

use std::io::{self, Read};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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

/// Runs `program args` with a deadline; its stdout on success. The command runs in a
/// process group of its own, as node processes do (`NodeCommand::child`): Ctrl-C in the
/// trainer's terminal does not kill an `sbatch` or `squeue` under way, so the trainer's
/// own shutdown (its `scancel`) is what ends the job.
pub(super) fn run(program: &str, args: &[&str], timeout: Duration) -> Result<String, SlurmError> {
    use wait_timeout::ChildExt as _;
    let deadline = Instant::now() + timeout;
    let command = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|source| SlurmError::Spawn {
            command: command.clone(),
            source,
        })?;
    let stdout = read_on_thread(child.stdout.take());
    let stderr = read_on_thread(child.stderr.take());
    let timed_out = || SlurmError::Timeout {
        command: command.clone(),
        seconds: timeout.as_secs_f64(),
    };
    let status = match child.wait_timeout(timeout) {
        Ok(Some(status)) => status,
        waited => {
            let _ = child.kill();
            let _ = child.wait_timeout(KILL_WAIT);
            return Err(match waited {
                Err(source) => SlurmError::Spawn {
                    command: command.clone(),
                    source,
                },
                Ok(_) => timed_out(),
            });
        }
    };
    // The pipes end with the command, unless something it started holds them open.
    let collect = |pipe: mpsc::Receiver<io::Result<Vec<u8>>>| match pipe
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
    {
        Ok(read) => read.map_err(|source| SlurmError::Spawn {
            command: command.clone(),
            source,
        }),
        Err(_) => Err(timed_out()),
    };
    let stdout = collect(stdout)?;
    let stderr = collect(stderr)?;
    if !status.success() {
        return Err(SlurmError::Failed {
            command,
            status: status.to_string(),
            stderr: String::from_utf8_lossy(&stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&stdout).into_owned())
}

/// How long a command killed at its deadline is given to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Reads `pipe` to its end on a thread of its own, so that a command writing more
/// than a pipe holds never blocks on the other one; the bytes come on the receiver.
fn read_on_thread(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<io::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let read = match pipe {
            Some(mut pipe) => pipe.read_to_end(&mut bytes).map(|_| bytes),
            None => Ok(bytes),
        };
        let _ = tx.send(read);
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_succeeds_gives_its_stdout() {
        let out = run("sh", &["-c", "echo out; echo err >&2"], COMMAND_TIMEOUT);
        assert_eq!(out.ok().as_deref(), Some("out\n"));
    }

    #[test]
    fn a_command_that_fails_gives_its_status_and_stderr() {
        match run("sh", &["-c", "echo why >&2; exit 3"], COMMAND_TIMEOUT) {
            Err(SlurmError::Failed {
                command,
                status,
                stderr,
            }) => {
                assert_eq!(command, "sh -c echo why >&2; exit 3");
                assert!(status.contains('3'), "{status}");
                assert_eq!(stderr, "why");
            }
            other => panic!("expected Failed, got {other:?}"),
        }
    }

    #[test]
    fn a_command_past_its_deadline_is_killed_and_named() {
        let pid_file = std::env::temp_dir().join(format!("rollout-slurm-run-{}.pid", std::process::id()));
        let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
        let started = Instant::now();
        match run("sh", &["-c", &script], Duration::from_millis(500)) {
            Err(SlurmError::Timeout { command, seconds }) => {
                assert_eq!(command, format!("sh -c {script}"));
                assert_eq!(seconds, 0.5);
            }
            other => panic!("expected Timeout, got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "took {:?}",
            started.elapsed()
        );
        let pid = std::fs::read_to_string(&pid_file).expect("the command wrote its pid");
        let _ = std::fs::remove_file(&pid_file);
        // Killed and reaped: the pid is gone from /proc.
        let proc_dir = PathBuf::from(format!("/proc/{}", pid.trim()));
        assert!(!proc_dir.exists(), "{} still exists", proc_dir.display());
    }

    #[test]
    fn output_larger_than_a_pipe_on_both_streams_is_read_whole() {
        // 1 MiB on each stream: a reader of one pipe alone would leave the command
        // blocked on the other, full one until the deadline.
        let script = "head -c 1048576 /dev/zero | tr '\\0' a; head -c 1048576 /dev/zero >&2; exit 0";
        let out = run("sh", &["-c", script], COMMAND_TIMEOUT);
        assert_eq!(out.map(|s| s.len()).ok(), Some(1 << 20));
    }

    #[test]
    fn a_command_leads_a_process_group_of_its_own() {
        // The shell's own stat: its pid (field 1) and process group (field 5).
        let out = run("sh", &["-c", "cat /proc/$$/stat"], COMMAND_TIMEOUT).expect("sh runs");
        let rest = out.rfind(')').map(|i| &out[i + 2..]).expect("a stat line");
        let pid = out.split(' ').next().and_then(|p| p.parse::<u32>().ok());
        let group = rest.split(' ').nth(2).and_then(|g| g.parse::<u32>().ok());
        assert!(pid.is_some(), "{out}");
        assert_eq!(group, pid, "the command leads its group: {out}");
    }

    #[test]
    fn a_missing_program_is_a_spawn_error() {
        let out = run("/nonexistent/sbatch", &[], COMMAND_TIMEOUT);
        assert!(matches!(out, Err(SlurmError::Spawn { .. })), "{out:?}");
    }
}
