//! The `Slurm` launcher: ONE `sbatch` job array of N tasks, task `i` running the node
//! command (`rollout node` by default) `--join ADVERTISE --index i`, that join the
//! trainer over TCP.
//!
//! The token goes to the tasks through a file readable by the user only (mode
//! 0600) next to the batch script, never on a command line. The trainer keeps the
//! job id: while it waits for the joins it reads the tasks' states (`squeue`, then
//! `sacct`, then `scontrol`), and at shutdown, and whenever the trainer fails or is
//! dropped, it ends the job (`scancel`) and checks that no task is left.
//!
//! A supervised run restarts a failed node by resubmitting the same batch script as a
//! single array task under the node's index ([`SlurmResubmit`]); those jobs are ended
//! with the first one.
//!
//! Every SLURM command runs with a deadline ([`COMMAND_TIMEOUT`]).

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::node_command::NodeCommand;
pub(crate) use super::slurm_command::SlurmError;
use super::slurm_command::{run, COMMAND_TIMEOUT};

/// Longest wait for the tasks to leave the queue after `scancel`, before `SIGKILL`.
const CANCEL_WAIT: Duration = Duration::from_secs(40);

/// What the job array asks SLURM for. Every field maps to one `sbatch` option;
/// `None` leaves it to the cluster's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmOptions {
    /// `--partition`; default `None`: the cluster's default partition.
    pub partition: Option<String>,
    /// `--time`, in any of sbatch's forms (`30`, `1:00:00`, `2-00:00:00`); default `None`:
    /// the partition's default time limit.
    pub time: Option<String>,
    /// `--cpus-per-task`; default `None`: SLURM's default (one CPU per task).
    pub cpus_per_task: Option<u32>,
    /// `--mem` (memory per node, e.g. `4G`); default `None`: the partition's default.
    pub mem: Option<String>,
    /// More lines for the batch script's header, one option each: `#SBATCH --qos=high` or
    /// just `--qos=high` (the `#SBATCH ` prefix is added). Default: none.
    pub extra_lines: Vec<String>,
    /// `--job-name`; default `rollout`.
    pub job_name: String,
    /// Where the batch script, the token file and the tasks' logs go, in a fresh
    /// sub-folder per job (`<job_name>-<pid>-<time>/`). It must be readable from the
    /// compute nodes (a shared file system). Default `rollout-slurm` (relative to the
    /// current directory, made absolute at submission).
    pub output_dir: PathBuf,
}

impl Default for SlurmOptions {
    fn default() -> Self {
        SlurmOptions {
            partition: None,
            time: None,
            cpus_per_task: None,
            mem: None,
            extra_lines: Vec::new(),
            job_name: "rollout".into(),
            output_dir: PathBuf::from("rollout-slurm"),
        }
    }
}

impl SlurmOptions {
    /// Checks every value before anything is submitted; `Err((field, reason))` names the
    /// builder field at fault.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        let one_line = |field: &'static str, v: &str| {
            if v.trim().is_empty() {
                Err((field, "must not be empty".to_string()))
            } else if v.contains(['\n', '\r']) {
                Err((field, format!("{v:?} must be one line")))
            } else {
                Ok(())
            }
        };
        if let Some(p) = &self.partition {
            one_line("partition", p)?;
        }
        if let Some(t) = &self.time {
            one_line("time", t)?;
        }
        if let Some(m) = &self.mem {
            one_line("mem", m)?;
        }
        if self.cpus_per_task == Some(0) {
            return Err(("cpus_per_task", "must be at least 1".into()));
        }
        one_line("job_name", &self.job_name)?;
        if self.job_name.contains(|c: char| c.is_whitespace() || c == '/') {
            return Err(("job_name", format!("{:?}: no spaces or slashes", self.job_name)));
        }
        for l in &self.extra_lines {
            one_line("extra_lines", l)?;
            let t = l.trim_start();
            if t.starts_with('#') && !t.starts_with("#SBATCH") {
                return Err((
                    "extra_lines",
                    format!("{l:?}: an option line starts with `#SBATCH` or `-`"),
                ));
            }
        }
        if self.output_dir.as_os_str().is_empty() {
            return Err(("output_dir", "must not be empty".into()));
        }
        Ok(())
    }

    /// The batch script that runs `command --join advertise` as task
    /// `$SLURM_ARRAY_TASK_ID` of a `tasks`-task array, reading the token from `token_file`
    /// and writing its log to `dir/task-<i>.out`.
    pub(crate) fn batch_script(
        &self,
        command: &NodeCommand,
        advertise: &str,
        token_file: &Path,
        dir: &Path,
        tasks: usize,
    ) -> String {
        let mut s = String::from("#!/bin/sh\n# Written by rollout: the nodes of one collector.\n");
        let mut opt = |line: String| {
            s.push_str("#SBATCH ");
            s.push_str(&line);
            s.push('\n');
        };
        opt(format!("--job-name={}", self.job_name));
        opt(format!("--array=0-{}", tasks.saturating_sub(1)));
        opt(format!("--output={}", dir.join("task-%a.out").display()));
        if let Some(p) = &self.partition {
            opt(format!("--partition={p}"));
        }
        if let Some(t) = &self.time {
            opt(format!("--time={t}"));
        }
        if let Some(c) = self.cpus_per_task {
            opt(format!("--cpus-per-task={c}"));
        }
        if let Some(m) = &self.mem {
            opt(format!("--mem={m}"));
        }
        for l in &self.extra_lines {
            let l = l.trim();
            opt(l.strip_prefix("#SBATCH").unwrap_or(l).trim().to_string());
        }
        s.push_str(&format!(
            "exec {} --join {} --index \"$SLURM_ARRAY_TASK_ID\" \
             --name \"slurm-$SLURM_ARRAY_JOB_ID-$SLURM_ARRAY_TASK_ID\" --token-file {}{}\n",
            command.shown(),
            quote(advertise),
            quote(&token_file.display().to_string()),
            command.tls_shown(),
        ));
        s
    }
}

/// A value quoted for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// One array task as SLURM sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TaskState {
    /// The array task id, which is the node index.
    pub(crate) task: usize,
    /// SLURM's state (`PENDING`, `RUNNING`, `COMPLETED`, `CANCELLED`, `FAILED`, ...), or
    /// `UNKNOWN` when the controller no longer knows the task.
    pub(crate) state: String,
    /// SLURM's reason (why pending, why failed), when there is one.
    pub(crate) reason: Option<String>,
}

impl TaskState {
    /// Whether the task ended (it will never join).
    pub(crate) fn is_finished(&self) -> bool {
        !matches!(
            self.state.as_str(),
            "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED" | "REQUEUED" | "RESIZING" | "UNKNOWN"
        ) && !self.state.starts_with("REQUEUE")
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {} {}", self.task, self.state)?;
        if let Some(r) = &self.reason {
            write!(f, " (reason: {r})")?;
        }
        Ok(())
    }
}

/// `ID_i` → `i` for array task ids of job `job`.
fn task_of(job: &str, id: &str) -> Option<usize> {
    id.strip_prefix(job)?.strip_prefix('_')?.parse().ok()
}

/// Reads the states of a job's array tasks; cheap to clone, usable from any thread.
#[derive(Clone, Debug)]
pub(crate) struct SlurmQuery {
    job: String,
    tasks: usize,
    logs: Option<PathBuf>,
}

impl SlurmQuery {
    /// A query for the `tasks` array tasks of job `job`.
    pub(crate) fn new(job: impl Into<String>, tasks: usize) -> SlurmQuery {
        SlurmQuery {
            job: job.into(),
            tasks,
            logs: None,
        }
    }

    /// The job id.
    pub(crate) fn job(&self) -> &str {
        &self.job
    }

    /// The tasks still in the queue (pending, running, completing...), per `squeue`.
    pub(crate) fn live(&self) -> Result<Vec<TaskState>, SlurmError> {
        let out = match run(
            "squeue",
            &["-h", "-r", "-j", &self.job, "-o", "%i|%T|%r"],
            COMMAND_TIMEOUT,
        ) {
            Ok(out) => out,
            // Purged from the controller: nothing of it is in the queue.
            Err(SlurmError::Failed { stderr, .. }) if stderr.contains("Invalid job id") => String::new(),
            Err(e) => return Err(e),
        };
        Ok(out
            .lines()
            .filter_map(|l| {
                let mut f = l.trim().split('|');
                let task = task_of(&self.job, f.next()?)?;
                let state = f.next()?.trim().to_string();
                let reason = f.next().map(str::trim).filter(|r| !r.is_empty() && *r != "None");
                Some(TaskState {
                    task,
                    state,
                    reason: reason.map(str::to_string),
                })
            })
            .collect())
    }

    /// Every task's state: `squeue` for the live ones, then `sacct` (when accounting is
    /// on), then `scontrol show job` (recently finished ones); `UNKNOWN` for the rest.
    pub(crate) fn states(&self) -> Result<Vec<TaskState>, SlurmError> {
        let mut found: BTreeMap<usize, TaskState> = self.live()?.into_iter().map(|t| (t.task, t)).collect();
        if found.len() < self.tasks {
            if let Ok(out) = run(
                "sacct",
                &["-n", "-P", "-X", "-j", &self.job, "-o", "JobID,State,Reason"],
                COMMAND_TIMEOUT,
            ) {
                for l in out.lines() {
                    let mut f = l.trim().split('|');
                    let (Some(id), Some(state)) = (f.next(), f.next()) else {
                        continue;
                    };
                    let Some(task) = task_of(&self.job, id) else { continue };
                    let reason = f.next().map(str::trim).filter(|r| !r.is_empty() && *r != "None");
                    found.entry(task).or_insert_with(|| TaskState {
                        task,
                        // "CANCELLED by 0" → "CANCELLED"
                        state: state.split_whitespace().next().unwrap_or(state).to_string(),
                        reason: reason.map(str::to_string),
                    });
                }
            }
        }
        if found.len() < self.tasks {
            if let Ok(out) = run("scontrol", &["-o", "show", "job", &self.job], COMMAND_TIMEOUT) {
                for l in out.lines() {
                    let field = |name: &str| {
                        l.split_whitespace()
                            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                            .map(str::to_string)
                    };
                    let (Some(task), Some(state)) =
                        (field("ArrayTaskId").and_then(|t| t.parse().ok()), field("JobState"))
                    else {
                        continue;
                    };
                    let reason = field("Reason").filter(|r| r != "None");
                    found.entry(task).or_insert(TaskState { task, state, reason });
                }
            }
        }
        Ok((0..self.tasks)
            .map(|task| {
                found.remove(&task).unwrap_or(TaskState {
                    task,
                    state: "UNKNOWN".into(),
                    reason: None,
                })
            })
            .collect())
    }

    /// One line naming the states of `which` tasks, e.g.
    /// `SLURM job 42: task 1 PENDING (reason: Resources)`.
    pub(crate) fn describe(&self, which: &[usize]) -> String {
        match self.states() {
            Ok(states) => {
                let parts: Vec<String> = states
                    .iter()
                    .filter(|t| which.contains(&t.task))
                    .map(ToString::to_string)
                    .collect();
                format!("SLURM job {}: {}", self.job, parts.join("; "))
            }
            Err(e) => format!("SLURM job {}: cannot read the task states: {e}", self.job),
        }
    }

    /// When some of `missing` have ended (they will never join): why, naming them.
    pub(crate) fn hopeless(&self, missing: &[usize]) -> Option<String> {
        let states = self.states().ok()?;
        let ended: Vec<String> = states
            .iter()
            .filter(|t| missing.contains(&t.task) && t.is_finished())
            .map(|t| match self.logs.as_deref().and_then(|d| task_log(d, t.task, 400)) {
                Some(log) if !log.trim().is_empty() => format!("{t}, log: {}", log.trim().replace('\n', " | ")),
                _ => t.to_string(),
            })
            .collect();
        (!ended.is_empty()).then(|| format!("SLURM job {} ended before joining: {}", self.job, ended.join("; ")))
    }
}

/// `advertise` with the bound port filled in: `HOST` and `HOST:0` become `HOST:PORT`.
pub(crate) fn advertise_addr(advertise: &str, bound: SocketAddr) -> String {
    let a = advertise.trim();
    if let Ok(sa) = a.parse::<SocketAddr>() {
        let port = if sa.port() == 0 { bound.port() } else { sa.port() };
        return SocketAddr::new(sa.ip(), port).to_string();
    }
    if let Ok(ip) = a.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        return SocketAddr::new(ip, bound.port()).to_string();
    }
    match a.rsplit_once(':') {
        Some((host, "0")) => format!("{host}:{}", bound.port()),
        Some((host, port)) if port.parse::<u16>().is_ok() => format!("{host}:{port}"),
        _ => format!("{a}:{}", bound.port()),
    }
}

/// The host part of an `advertise` value.
pub(crate) fn advertise_host(advertise: &str) -> &str {
    let a = advertise.trim();
    if a.starts_with('[') {
        return a.trim_start_matches('[').split(']').next().unwrap_or(a);
    }
    if a.parse::<IpAddr>().is_ok() {
        return a;
    }
    a.rsplit_once(':').map_or(a, |(h, _)| h)
}

/// A submitted job array; ended (and checked) at [`SlurmJob::shutdown`] or on drop.
#[derive(Debug)]
pub(crate) struct SlurmJob {
    query: SlurmQuery,
    token_file: PathBuf,
    script: PathBuf,
    resubmitted: Arc<Shared>,
    ended: bool,
}

/// [`Resubmitted`] and a condition to wait on resubmissions in flight.
#[derive(Debug, Default)]
struct Shared {
    state: Mutex<Resubmitted>,
    idle: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Resubmitted> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Jobs submitted after the first one, to restart single nodes.
#[derive(Debug, Default)]
struct Resubmitted {
    /// Every resubmitted job id, in order.
    jobs: Vec<String>,
    /// The task now serving each restarted node: `JOBID_i`.
    current: BTreeMap<usize, String>,
    /// Set once the job is being ended: no more resubmissions.
    closed: bool,
    /// Resubmissions running `scancel`/`sbatch` now; ending the job waits for them.
    in_flight: usize,
}

/// Restarts single nodes of a [`SlurmJob`] (cheap to clone, usable from any thread).
#[derive(Clone, Debug)]
pub(crate) struct SlurmResubmit {
    first: String,
    script: PathBuf,
    resubmitted: Arc<Shared>,
}

impl SlurmResubmit {
    /// Ends node `node`'s task (`scancel`; it may be gone already), then submits the
    /// job's batch script again as the single array task `node` (its log appends to
    /// `task-<node>.out`), excluding the host the task was lost on when SLURM has another
    /// node that answers (see `slurm_avoid`). Returns the new job id. Blocks for the SLURM commands.
    pub(crate) fn resubmit(&self, node: usize) -> Result<String, SlurmError> {
        let current = {
            let mut r = self.resubmitted.lock();
            if r.closed {
                return Err(SlurmError::Closed);
            }
            // Counted until its id is recorded, so the job's end sees (and ends) it.
            r.in_flight += 1;
            r.current
                .get(&node)
                .cloned()
                .unwrap_or_else(|| format!("{}_{node}", self.first))
        };
        let submitted = self.submit(node, &current);
        let mut r = self.resubmitted.lock();
        if let Ok(id) = &submitted {
            r.jobs.push(id.clone());
            r.current.insert(node, format!("{id}_{node}"));
        }
        r.in_flight -= 1;
        drop(r);
        self.resubmitted.idle.notify_all();
        let id = submitted?;
        tracing::warn!(node, job = %id, replaced = %current, "resubmitted the node's SLURM task");
        Ok(id)
    }

    fn submit(&self, node: usize, current: &str) -> Result<String, SlurmError> {
        // Asked before the scancel, while SLURM still shows the task where it runs.
        let avoid = match super::slurm_avoid::host_to_avoid(current) {
            Ok(avoid) => avoid,
            Err(e) => {
                tracing::debug!(task = %current, error = %e, "where the task ran is unknown");
                None
            }
        };
        if let Err(e) = run("scancel", &[current], COMMAND_TIMEOUT) {
            tracing::debug!(task = %current, error = %e, "scancel before resubmitting");
        }
        let script = self.script.display().to_string();
        let array = format!("--array={node}");
        let exclude = avoid.as_ref().map(|h| format!("--exclude={h}"));
        if let Some(h) = &avoid {
            tracing::warn!(node, task = %current, host = %h, "resubmitting the task away from the host it was lost on");
        }
        let mut args = vec!["--parsable", &array, "--open-mode=append"];
        args.extend(exclude.as_deref());
        args.push(&script);
        let out = run("sbatch", &args, COMMAND_TIMEOUT)?;
        job_id(&out).ok_or(SlurmError::NoJobId(out))
    }
}

/// The job id `sbatch --parsable` printed (`ID` or `ID;cluster`).
fn job_id(out: &str) -> Option<String> {
    let id = out.trim().split(';').next().unwrap_or("").trim();
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then(|| id.to_string())
}

impl SlurmJob {
    /// Writes the token file (mode 0600) and the batch script into a fresh folder under
    /// `opts.output_dir`, and submits the script with `sbatch --parsable`.
    pub(crate) fn submit(
        opts: &SlurmOptions,
        command: &NodeCommand,
        advertise: &str,
        token: &[u8],
        tasks: usize,
    ) -> Result<SlurmJob, SlurmError> {
        let write = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SlurmError::Write { path, source }
        };
        let base = if opts.output_dir.is_absolute() {
            opts.output_dir.clone()
        } else {
            std::env::current_dir()
                .map_err(write(&opts.output_dir))?
                .join(&opts.output_dir)
        };
        std::fs::create_dir_all(&base).map_err(write(&base))?;
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = base.join(format!("{}-{}-{stamp}", opts.job_name, std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(write(&dir))?;
        let token_file = dir.join("token");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token_file)
            .map_err(write(&token_file))?;
        f.write_all(token).map_err(write(&token_file))?;
        drop(f);
        let script = dir.join("nodes.sbatch");
        std::fs::write(&script, opts.batch_script(command, advertise, &token_file, &dir, tasks))
            .map_err(write(&script))?;
        let script_arg = script.display().to_string();
        let out = match run("sbatch", &["--parsable", &script_arg], COMMAND_TIMEOUT) {
            Ok(out) => out,
            Err(e) => {
                let _ = std::fs::remove_file(&token_file);
                return Err(e);
            }
        };
        let Some(id) = job_id(&out) else {
            let _ = std::fs::remove_file(&token_file);
            return Err(SlurmError::NoJobId(out));
        };
        tracing::info!(job = %id, tasks, script = %script.display(), "submitted the SLURM job array");
        let mut query = SlurmQuery::new(id, tasks);
        query.logs = Some(dir.clone());
        Ok(SlurmJob {
            query,
            token_file,
            script,
            resubmitted: Arc::default(),
            ended: false,
        })
    }

    /// What restarts single nodes of this job.
    pub(crate) fn resubmitter(&self) -> SlurmResubmit {
        SlurmResubmit {
            first: self.id().to_string(),
            script: self.script.clone(),
            resubmitted: self.resubmitted.clone(),
        }
    }

    /// The first job's id, then every job resubmitted to restart a node.
    pub(crate) fn job_ids(&self) -> Vec<String> {
        let r = self.resubmitted.lock();
        std::iter::once(self.id().to_string())
            .chain(r.jobs.iter().cloned())
            .collect()
    }

    /// The queued tasks of every job of this run.
    fn live(&self) -> Result<Vec<TaskState>, SlurmError> {
        let mut all = Vec::new();
        for id in self.job_ids() {
            all.extend(SlurmQuery::new(id, self.query.tasks).live()?);
        }
        Ok(all)
    }

    /// The job id (`scancel ID_i` ends task `i`).
    pub(crate) fn id(&self) -> &str {
        self.query.job()
    }

    /// A query for the task states, to hand to other threads.
    pub(crate) fn query(&self) -> SlurmQuery {
        self.query.clone()
    }

    /// Waits up to `grace` for the tasks to leave the queue by themselves (after the
    /// trainer told the nodes to stop), then `scancel`s the job and waits (bounded) for
    /// it to be gone, with `scancel --signal=KILL` as the last resort. Removes the token
    /// file. Idempotent.
    pub(crate) fn shutdown(&mut self, grace: Duration) -> Result<(), SlurmError> {
        if self.ended {
            return Ok(());
        }
        self.ended = true;
        let result = self.end(grace);
        let _ = std::fs::remove_file(&self.token_file);
        if result.is_ok() {
            tracing::info!(job = %self.id(), "the SLURM job is ended");
        }
        result
    }

    /// `scancel`s the job at once and checks that it is gone ([`Self::shutdown`] without grace).
    pub(crate) fn cancel(&mut self) -> Result<(), SlurmError> {
        self.shutdown(Duration::ZERO)
    }

    fn end(&self, grace: Duration) -> Result<(), SlurmError> {
        {
            // No resubmission starts from now on; those running finish (bounded by
            // their commands' deadlines) and record their job, which is ended below.
            let mut r = self.resubmitted.lock();
            r.closed = true;
            let until = Instant::now() + COMMAND_TIMEOUT + COMMAND_TIMEOUT + Duration::from_secs(1);
            while r.in_flight > 0 {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    tracing::error!(in_flight = r.in_flight, "a SLURM resubmission did not finish in time");
                    break;
                }
                r = self
                    .resubmitted
                    .idle
                    .wait_timeout(r, left)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        }
        let jobs = self.job_ids();
        let job = jobs.join(",");
        let ids: Vec<&str> = jobs.iter().map(String::as_str).collect();
        // Running tasks get `grace` to finish; pending ones never will.
        let until = Instant::now() + grace;
        let mut live = self.live()?;
        while !live.is_empty() && live.iter().any(|t| t.state != "PENDING") && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(200));
            live = self.live()?;
        }
        if live.is_empty() {
            return Ok(());
        }
        run("scancel", &ids, COMMAND_TIMEOUT)?;
        if self.wait_gone(CANCEL_WAIT)? {
            return Ok(());
        }
        tracing::warn!(%job, "tasks still queued after scancel: sending SIGKILL");
        let kill: Vec<&str> = ["--signal=KILL", "--full"]
            .into_iter()
            .chain(ids.iter().copied())
            .collect();
        run("scancel", &kill, COMMAND_TIMEOUT)?;
        let _ = run("scancel", &ids, COMMAND_TIMEOUT);
        if self.wait_gone(Duration::from_secs(10))? {
            return Ok(());
        }
        let states = self.live()?.iter().map(ToString::to_string).collect::<Vec<_>>();
        Err(SlurmError::NotEnded {
            job,
            states: states.join(", "),
        })
    }

    fn wait_gone(&self, wait: Duration) -> Result<bool, SlurmError> {
        let until = Instant::now() + wait;
        loop {
            if self.live()?.is_empty() {
                return Ok(true);
            }
            if Instant::now() >= until {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for SlurmJob {
    fn drop(&mut self) {
        if let Err(e) = self.cancel() {
            tracing::error!(error = %e, "cannot end the SLURM job");
        }
    }
}

/// The start (at most `max` bytes) of task `task`'s log in the job folder `dir`.
pub(crate) fn task_log(dir: &Path, task: usize, max: usize) -> Option<String> {
    let mut s = String::new();
    std::fs::File::open(dir.join(format!("task-{task}.out")))
        .ok()?
        .take(max as u64)
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last line of the script runs the command, every word whole for `sh`.
    #[test]
    fn the_batch_script_runs_the_node_command_each_word_quoted() {
        let command = NodeCommand::new(vec![
            "/opt/my env/python".into(),
            "-m".into(),
            "rollout_node".into(),
            "--import".into(),
            "it's".into(),
        ]);
        let script = SlurmOptions::default().batch_script(
            &command,
            "10.0.0.1:5000",
            Path::new("/shared/tok"),
            Path::new("/shared"),
            2,
        );
        let exec = script.lines().last().expect("a line");
        assert!(
            exec.starts_with(
                r"exec '/opt/my env/python' -m rollout_node --import 'it'\''s' --join '10.0.0.1:5000' --index "
            ),
            "{exec}"
        );
        assert!(exec.ends_with("--token-file '/shared/tok'"), "{exec}");
        assert!(script.contains("#SBATCH --array=0-1\n"), "{script}");
    }

    /// `node_program` keeps running `PROGRAM node`.
    #[test]
    fn the_default_command_is_the_node_subcommand() {
        let script = SlurmOptions::default().batch_script(
            &NodeCommand::rollout("/bin/rollout"),
            "h:1",
            Path::new("/t"),
            Path::new("/d"),
            1,
        );
        assert!(
            script.contains("\nexec /bin/rollout node --join 'h:1' --index "),
            "{script}"
        );
    }
}
