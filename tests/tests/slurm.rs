//! The `Slurm` launcher against a real SLURM cluster (no mock of `sbatch`):
//! `scripts/slurm-local.sh` sets up a one-node cluster on this machine. Every
//! trainer listens on and advertises 127.0.0.1 only.
//!
//! Without the SLURM tools these tests FAIL (they do not skip): run
//! `scripts/slurm-local.sh` (as root) first; `scripts/test.sh` does.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rollout::PolicyConfig;
use rollout_actors::{CollectError, CollectorBuilder, DistributedCollector, Launcher, SlurmOptions};
use rollout_tests::{listening_on_a_thread, poll_until, rollout_bin, run_bounded, venv_python, MarkedPythonNodes};

const DEADLINE: Duration = Duration::from_secs(30);
/// The join timeout of runs expected to fail.
const SHORT_JOIN: Duration = Duration::from_secs(15);
const HINT: &str = "run scripts/slurm-local.sh (as root) to start a local SLURM cluster";

/// Runs a SLURM command (bounded); (success, stdout, stderr).
fn slurm(program: &str, args: &[&str]) -> (bool, String, String) {
    let run = match run_bounded(Command::new(program).args(args), DEADLINE) {
        Ok(r) => r,
        Err(e) => panic!("cannot run `{program}` ({e}): the SLURM tools are not on PATH; {HINT}"),
    };
    let status = run.status.unwrap_or_else(|| panic!("`{program} {args:?}` hung"));
    (status.success(), run.stdout_text(), run.stderr_text())
}

/// Fails (never skips) unless a SLURM node is up. A node still `completing` the job of
/// the test before (its epilog) is up and about to take jobs: waited for, bounded.
fn require_slurm() {
    let up = |out: &str| {
        out.lines()
            .any(|s| s.starts_with("idle") || s.starts_with("mix") || s.starts_with("alloc"))
    };
    let sinfo = || {
        let (ok, out, err) = slurm("sinfo", &["-h", "-o", "%T"]);
        assert!(ok, "`sinfo` failed ({err}); {HINT}");
        out
    };
    let seen = poll_until(Instant::now() + DEADLINE, || {
        let out = sinfo();
        let transient = out.lines().any(|s| s.starts_with("comp"));
        (up(&out) || !transient).then_some(out)
    });
    let out = seen.unwrap_or_else(sinfo);
    assert!(up(&out), "no SLURM node is up (sinfo: {out:?}); {HINT}");
}

/// The tasks of job `id` still in the queue.
fn queued(id: &str) -> Vec<String> {
    let (ok, out, err) = slurm("squeue", &["-h", "-r", "-j", id, "-o", "%i %T %r"]);
    assert!(ok || err.contains("Invalid job id"), "squeue failed: {err}");
    out.lines()
        .map(str::to_string)
        .filter(|l| !l.trim().is_empty())
        .collect()
}

/// Waits (bounded) until `cond` holds of job `id`'s queued tasks.
fn wait_queue(id: &str, what: &str, cond: impl Fn(&[String]) -> bool) {
    let seen = poll_until(Instant::now() + DEADLINE, || cond(&queued(id)).then_some(()));
    assert!(
        seen.is_some(),
        "SLURM job {id}: {what} not within {DEADLINE:?}; queue: {:?}",
        queued(id)
    );
}

fn assert_no_job(id: &str) {
    let q = queued(id);
    assert!(q.is_empty(), "SLURM job {id} left tasks behind: {q:?}");
}

/// A fresh folder for one test's SLURM files.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rollout-slurm-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn builder(name: &str, sync: bool, total: i64, opts: SlurmOptions) -> CollectorBuilder {
    require_slurm();
    DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .frames_per_batch(100)
        .total_frames(total)
        .sync(sync)
        .seed(0)
        .launcher(Launcher::Slurm(SlurmOptions {
            job_name: format!("rollout-test-{name}"),
            output_dir: scratch(name),
            ..opts
        }))
        .listen("127.0.0.1:0")
        .advertise("127.0.0.1")
        .node_program(rollout_bin())
        .heartbeat(Duration::from_millis(100), Duration::from_millis(1500))
        .join_timeout(DEADLINE)
        .batch_timeout(DEADLINE)
}

/// Two SLURM nodes, exact frames, then no task of the job in the queue.
fn two_nodes(sync: bool) {
    let t0 = Instant::now();
    let name = if sync { "sync" } else { "async" };
    let mut c = builder(name, sync, 2000, SlurmOptions::default())
        .build()
        .expect("collector");
    let id = c.slurm_job_id().expect("a SLURM job").to_string();
    let joined = t0.elapsed();
    let (mut frames, mut nodes) = (0, Vec::new());
    while let Some(b) = c.next_batch().expect("batch") {
        assert_eq!(b.data.numel(), 100, "every batch is frames_per_batch");
        frames += b.data.numel();
        nodes.push(b.node);
    }
    assert_eq!(frames, 2000);
    if sync {
        assert!(nodes.iter().all(Option::is_none), "sync batches stack both nodes");
    } else {
        // Which node delivers which batch is timing (on a loaded machine one node can
        // take every batch while the other starts); each batch is one node's.
        assert!(
            nodes.iter().all(|n| matches!(n, Some(0) | Some(1))),
            "async batches come from one node each: {nodes:?}"
        );
    }
    c.shutdown().expect("shutdown");
    assert_no_job(&id);
    eprintln!("{name}: joined in {joined:?}, done in {:?}", t0.elapsed());
    if !sync {
        // Both SLURM nodes serve: an endless run until each delivered, bounded.
        let mut c = builder("async-both", false, -1, SlurmOptions::default())
            .build()
            .expect("collector");
        let id = c.slurm_job_id().expect("a SLURM job").to_string();
        let mut seen = [false; 2];
        let mut pulled = 0;
        while !seen.iter().all(|s| *s) {
            let b = c.next_batch().expect("batch").expect("endless");
            seen[b.node.expect("async batch names its node")] = true;
            pulled += 1;
            assert!(pulled < 100_000, "a SLURM node never delivered: {seen:?}");
        }
        c.shutdown().expect("shutdown");
        assert_no_job(&id);
    }
}

#[test]
fn sync_collection_with_two_slurm_nodes() {
    two_nodes(true);
}

#[test]
fn async_collection_with_two_slurm_nodes() {
    two_nodes(false);
}

/// `scancel ID_1` ends node 1's task; waits until SLURM no longer runs it.
fn cancel_task_1(id: &str) {
    let task = format!("{id}_1");
    let (ok, _, err) = slurm("scancel", &[&task]);
    assert!(ok, "scancel {task}: {err}");
    wait_queue(id, "task 1 gone", |q| !q.iter().any(|l| l.starts_with(&task)));
}

#[test]
fn async_run_completes_from_the_other_node_when_a_task_is_cancelled() {
    // Enough frames that node 0 alone cannot end the run before node 1 delivers, however
    // the two share the machine (Counting steps in microseconds: a count of batches is no
    // deadline under load); the wait for node 1 is bounded by time.
    const TOTAL: i64 = 200_000;
    let mut c = builder("cancel-async", false, TOTAL, SlurmOptions::default())
        .build()
        .expect("collector");
    let id = c.slurm_job_id().expect("a SLURM job").to_string();
    let mut frames = 0;
    let mut seen = Vec::new();
    let t0 = Instant::now();
    while seen.len() < 4 || !seen.contains(&Some(1)) {
        let b = c.next_batch().expect("batch").expect("not done yet");
        frames += b.data.numel();
        seen.push(b.node);
        assert!(
            t0.elapsed() < DEADLINE,
            "node 1 never delivered within {DEADLINE:?}: {} batches, all from {:?}",
            seen.len(),
            seen.iter().collect::<std::collections::BTreeSet<_>>()
        );
    }
    cancel_task_1(&id);
    let t = Instant::now();
    let mut after = Vec::new();
    while let Some(b) = c.next_batch().expect("the run goes on without node 1") {
        frames += b.data.numel();
        after.push(b.node);
    }
    assert_eq!(frames, TOTAL as usize, "exact frames");
    // At most the batch node 1 had in flight when it was killed.
    let from_1 = after.iter().filter(|n| **n == Some(1)).count();
    assert!(
        from_1 <= 1,
        "node 1 kept delivering after its task was cancelled: {after:?}"
    );
    assert!(t.elapsed() < DEADLINE, "the rest of the run took {:?}", t.elapsed());
    c.shutdown().expect("shutdown");
    assert_no_job(&id);
}

#[test]
fn sync_run_fails_clearly_when_a_task_is_cancelled() {
    let mut c = builder("cancel-sync", true, -1, SlurmOptions::default())
        .batch_timeout(Duration::from_secs(20))
        .build()
        .expect("collector");
    let id = c.slurm_job_id().expect("a SLURM job").to_string();
    for _ in 0..3 {
        c.next_batch().expect("batch").expect("endless");
    }
    cancel_task_1(&id);
    let t = Instant::now();
    // Sync rounds start only when asked for, and the last one was yielded whole before
    // the cancel: every round from here on needs node 1's share, so the first call fails.
    let err = match c.next_batch() {
        Err(e) => e,
        Ok(other) => panic!("a sync run without node 1 gave {other:?} instead of failing"),
    };
    eprintln!("sync error after {:?}: {err:?}", t.elapsed());
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "detected after {:?}",
        t.elapsed()
    );
    // `scancel` sends SIGTERM: `rollout node` leaves (`leave`) if it gets to, else its
    // connection drops; either way the sync run fails naming node 1.
    assert!(
        matches!(&err, CollectError::NodeFailed { node: 1, reason }
            if reason.contains("connection to") || reason.contains("the node left")),
        "node 1's end fails the run: {err:?}"
    );
    let _ = c.shutdown();
    assert_no_job(&id);
}

/// The job id in an error message (`SLURM job 42: ...`).
fn job_in(msg: &str) -> String {
    let rest = msg
        .split("SLURM job ")
        .nth(1)
        .unwrap_or_else(|| panic!("no SLURM job in `{msg}`"));
    rest.chars().take_while(char::is_ascii_digit).collect()
}

#[test]
fn a_job_that_cannot_start_fails_within_the_join_deadline_naming_the_reason() {
    // The node binary is built (or found fresh) before the clock starts: cargo's own
    // check is no part of the join's deadline.
    rollout_bin();
    let t = Instant::now();
    let opts = SlurmOptions {
        cpus_per_task: Some(4096),
        ..SlurmOptions::default()
    };
    let err = builder("cannot-start", false, 1000, opts)
        .join_timeout(SHORT_JOIN)
        .build()
        .expect_err("no task can start")
        .to_string();
    let took = t.elapsed();
    eprintln!("after {took:?}: {err}");
    assert!(took < SHORT_JOIN + Duration::from_secs(10), "took {took:?}");
    assert!(err.contains("missing node indices [0, 1]"), "{err}");
    assert!(
        err.contains("task 0 PENDING") && err.contains("task 1 PENDING"),
        "{err}"
    );
    assert!(err.contains("reason: PartitionConfig"), "the SLURM reason: {err}");
    assert_no_job(&job_in(&err));
}

#[test]
fn a_task_that_fails_ends_the_join_wait_early() {
    let t = Instant::now();
    let err = builder("task-fails", false, 1000, SlurmOptions::default())
        .node_program("/nonexistent/rollout")
        .join_timeout(SHORT_JOIN)
        .build()
        .expect_err("no node can start")
        .to_string();
    let took = t.elapsed();
    eprintln!("after {took:?}: {err}");
    assert!(
        took < SHORT_JOIN,
        "the failed tasks were seen early, not at the deadline ({took:?})"
    );
    assert!(err.contains("ended before joining") && err.contains("FAILED"), "{err}");
    assert!(err.contains("/nonexistent/rollout"), "the task's log is quoted: {err}");
    assert_no_job(&job_in(&err));
}

#[test]
fn dropping_the_collector_ends_the_job() {
    let mut c = builder("drop", false, -1, SlurmOptions::default())
        .build()
        .expect("collector");
    let id = c.slurm_job_id().expect("a SLURM job").to_string();
    c.next_batch().expect("batch").expect("endless");
    let t = Instant::now();
    drop(c);
    assert!(t.elapsed() < DEADLINE, "drop took {:?}", t.elapsed());
    assert_no_job(&id);
}

#[test]
fn options_map_to_sbatch_lines() {
    let dir = scratch("options");
    let mut c = builder("options", false, 400, SlurmOptions::default())
        .launcher(Launcher::Slurm(SlurmOptions {
            partition: Some("debug".into()),
            time: Some("5".into()),
            cpus_per_task: Some(1),
            mem: Some("100M".into()),
            extra_lines: vec!["#SBATCH --comment=extra-one".into(), "--comment=extra-two".into()],
            job_name: "rollout-test-options".into(),
            output_dir: dir.clone(),
        }))
        .build()
        .expect("collector");
    let id = c.slurm_job_id().expect("a SLURM job").to_string();
    let (_, show, _) = slurm("scontrol", &["-o", "show", "job", &id]);
    for want in ["JobName=rollout-test-options", "Partition=debug", "TimeLimit=00:05:00"] {
        assert!(show.contains(want), "`{want}` not in {show}");
    }
    let job_dir = std::fs::read_dir(&dir)
        .expect("output dir")
        .next()
        .expect("a job folder")
        .expect("entry")
        .path();
    let script = std::fs::read_to_string(job_dir.join("nodes.sbatch")).expect("script");
    for want in [
        "#SBATCH --partition=debug\n",
        "#SBATCH --time=5\n",
        "#SBATCH --cpus-per-task=1\n",
        "#SBATCH --mem=100M\n",
        "#SBATCH --comment=extra-one\n",
        "#SBATCH --comment=extra-two\n",
        "#SBATCH --array=0-1\n",
        "--token-file",
    ] {
        assert!(script.contains(want), "`{want}` not in\n{script}");
    }
    {
        use std::os::unix::fs::PermissionsExt;
        let token = job_dir.join("token");
        let mode = std::fs::metadata(&token).expect("token file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the token file is readable by its owner only");
        let token = std::fs::read(&token).expect("token");
        assert!(
            !script.contains(&*String::from_utf8_lossy(&token)),
            "the token is not in the script"
        );
    }
    while c.next_batch().expect("batch").is_some() {}
    c.shutdown().expect("shutdown");
    assert!(!job_dir.join("token").exists(), "the token file is removed at shutdown");
    assert_no_job(&id);
}

#[test]
fn missing_advertise_is_a_config_error_naming_the_field() {
    let err = DistributedCollector::builder()
        .env("Counting")
        .frames_per_batch(100)
        .launcher(Launcher::Slurm(SlurmOptions::default()))
        .build()
        .expect_err("advertise is required")
        .to_string();
    assert!(err.contains("advertise"), "{err}");
}

#[test]
fn external_nodes_from_a_hand_written_sbatch_script() {
    require_slurm();
    let dir = scratch("external");
    let token = "external-s3cret-for-tests";
    let token_file = dir.join("token");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token_file)
            .expect("token file");
        f.write_all(token.as_bytes()).expect("write token");
    }
    // The trainer listens first: the script is written with the port it bound.
    let (trainer, addr) = listening_on_a_thread(
        DistributedCollector::builder()
            .env("Counting")
            .policy(PolicyConfig::Constant { value: 1.0 })
            .nodes(2)
            .frames_per_batch(100)
            .total_frames(1000)
            // Sync: every batch needs both nodes (async would let one fast node take every
            // batch while the other is still starting on a loaded machine).
            .sync(true)
            .launcher(Launcher::External)
            .listen("127.0.0.1:0")
            .token(token)
            .join_timeout(DEADLINE)
            .batch_timeout(DEADLINE),
        |b| b.build().expect("collector"),
    );
    let script = dir.join("nodes.sbatch");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             #SBATCH --job-name=rollout-test-external\n\
             #SBATCH --array=0-1\n\
             #SBATCH --output={dir}/node-%a.out\n\
             exec {bin} node --join {addr} --index \"$SLURM_ARRAY_TASK_ID\" --token-file {token}\n",
            dir = dir.display(),
            bin = rollout_bin().display(),
            token = token_file.display(),
        ),
    )
    .expect("script");
    let (ok, out, err) = slurm("sbatch", &["--parsable", &script.display().to_string()]);
    assert!(ok, "sbatch: {err}");
    let id = out.trim().split(';').next().expect("job id").to_string();
    /// Cancels the hand-submitted job whatever happens.
    struct Cancel(String);
    impl Drop for Cancel {
        fn drop(&mut self) {
            let _ = Command::new("scancel").arg(&self.0).status();
        }
    }
    let _guard = Cancel(id.clone());
    let mut c = trainer.join().expect("the trainer's thread");
    let mut frames = 0;
    while let Some(b) = c.next_batch().expect("batch") {
        frames += b.data.numel();
        assert_eq!(b.data.batch_size(), [2, 1, 50], "one env of each node");
        assert_eq!(b.weights_versions.len(), 2, "a share of each node");
    }
    assert_eq!(frames, 1000);
    c.shutdown().expect("shutdown");
    // The nodes exit at Shutdown, so their tasks complete by themselves.
    wait_queue(&id, "every task done", <[String]>::is_empty);
}

/// `rollout collect ARGS` (bounded); (exit code, stdout, stderr).
fn cli(args: &[&str]) -> (Option<i32>, String, String) {
    let run = run_bounded(
        Command::new(rollout_bin()).arg("collect").args(args),
        Duration::from_secs(60),
    )
    .expect("spawn rollout");
    let status = run.status.expect("rollout collect hung");
    (status.code(), run.stdout_text(), run.stderr_text())
}

#[test]
fn cli_collects_with_the_slurm_launcher() {
    require_slurm();
    let dir = scratch("cli");
    let dir = dir.display().to_string();
    let (code, out, err) = cli(&[
        "--launcher",
        "slurm",
        "--advertise",
        "127.0.0.1",
        "--env",
        "Counting",
        "--nodes",
        "2",
        "--frames-per-batch",
        "100",
        "--total-frames",
        "1000",
        "--job-name",
        "rollout-test-cli",
        "--cpus-per-task",
        "1",
        "--sbatch-line",
        "--comment=cli",
        "--output-dir",
        &dir,
        "--json",
    ]);
    assert_eq!(code, Some(0), "stderr: {err}");
    let summary = out.lines().last().expect("a summary line");
    assert!(summary.contains("\"frames\":1000"), "{summary}");
    let job = job_in(&err);
    assert_no_job(&job);
}

#[test]
fn cli_slurm_flags_are_checked() {
    let (code, _, err) = cli(&["--launcher", "slurm", "--env", "Counting"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("advertise"), "{err}");
    let (code, _, err) = cli(&["--partition", "debug", "--env", "Counting"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("partition") && err.contains("--launcher slurm"), "{err}");
}

/// Supervised: a cancelled task is resubmitted as a single task under the same node
/// index, it rejoins, and the sync run completes with exact frames; at shutdown no job
/// of the run (the array or the resubmission) is left.
#[test]
fn a_cancelled_task_is_resubmitted_and_the_sync_run_completes() {
    let mut c = builder("resubmit", true, 3000, SlurmOptions::default())
        .node_max_restarts(3)
        .build()
        .expect("collector");
    let id = c.slurm_job_id().expect("a SLURM job").to_string();
    let mut frames = 0;
    for _ in 0..3 {
        frames += c.next_batch().expect("batch").expect("not done").data.numel();
    }
    cancel_task_1(&id);
    let t = Instant::now();
    while let Some(b) = c.next_batch().expect("the run goes on with node 1 resubmitted") {
        assert_eq!(b.data.numel(), 100, "every batch whole");
        frames += b.data.numel();
    }
    assert_eq!(frames, 3000, "exact frames");
    let stats = c.stats().expect("stats");
    assert_eq!(stats.restarts, vec![0, 1], "node 1 restarted once");
    let jobs = c.slurm_job_ids();
    assert_eq!(jobs.len(), 2, "the array and one resubmitted task: {jobs:?}");
    eprintln!("resubmitted as job {} and completed in {:?}", jobs[1], t.elapsed());
    c.shutdown().expect("shutdown");
    for j in &jobs {
        assert_no_job(j);
    }
}

/// Python nodes from a node command (`env ... python -m rollout_node`, two of its words
/// holding a space and a quote, which the batch script must keep whole): each task runs
/// it with the flags and token file `rollout node` gets; a task's Python node SIGKILLed
/// mid-run is resubmitted and the sync run completes with exact frames; at shutdown no
/// job of the run and no node process is left.
#[test]
fn python_nodes_from_a_node_command_collect_exactly_and_a_killed_one_is_resubmitted() {
    require_slurm();
    let Some(py) = venv_python() else { return };
    let root = scratch("python-nodes-root");
    let nodes = MarkedPythonNodes::new(&root);
    let mut c = builder("python-nodes", true, 3000, SlurmOptions::default())
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .node_command(nodes.command(&py))
        .node_max_restarts(3)
        .build()
        .expect("collector");
    let marks = nodes.marks();
    assert_eq!(marks.len(), 2, "one Python node per task: {marks:?}");
    let mut indices: Vec<&str> = marks.iter().filter_map(|m| m.flag("--index")).collect();
    indices.sort_unstable();
    assert_eq!(indices, ["0", "1"], "{marks:?}");
    for m in &marks {
        assert_eq!(m.flag("--import"), Some("rollout_mark"), "{m:?}");
        assert!(m.flag("--join").is_some_and(|a| a.starts_with("127.0.0.1:")), "{m:?}");
        assert!(m.flag("--name").is_some_and(|n| n.starts_with("slurm-")), "{m:?}");
        let token = m.flag("--token-file").expect("the token file");
        assert!(std::path::Path::new(token).exists(), "{m:?}");
    }
    let victim = marks
        .iter()
        .find(|m| m.flag("--index") == Some("1"))
        .expect("node 1")
        .pid;
    let mut frames = 0;
    for _ in 0..3 {
        frames += c.next_batch().expect("batch").expect("not done").data.numel();
    }
    rollout_tests::signal(victim, "KILL");
    while let Some(b) = c.next_batch().expect("the run goes on with node 1 resubmitted") {
        frames += b.data.numel();
    }
    assert_eq!(frames, 3000, "exact frames");
    let stats = c.stats().expect("stats");
    assert_eq!(stats.restarts, vec![0, 1], "node 1 restarted once");
    let jobs = c.slurm_job_ids();
    assert_eq!(jobs.len(), 2, "the array and one resubmitted task: {jobs:?}");
    let marks = nodes.marks();
    assert_eq!(marks.len(), 3, "a new Python node for node 1: {marks:?}");
    assert_eq!(
        marks.iter().filter(|m| m.flag("--index") == Some("1")).count(),
        2,
        "{marks:?}"
    );
    c.shutdown().expect("shutdown");
    for j in &jobs {
        assert_no_job(j);
    }
    for m in &marks {
        assert!(!rollout_tests::alive(m.pid), "node process {} outlived the run", m.pid);
    }
}

/// `rollout collect --launcher slurm --node-command '...'`: the batch script runs the
/// command, its words quoted for `sh`; exact frames, no job left.
#[test]
fn cli_runs_a_node_command_in_the_slurm_tasks() {
    require_slurm();
    let Some(py) = venv_python() else { return };
    let root = scratch("cli-python-root");
    let nodes = MarkedPythonNodes::new(&root);
    let dir = scratch("cli-python");
    let (code, out, err) = cli(&[
        "--launcher",
        "slurm",
        "--advertise",
        "127.0.0.1",
        "--env",
        "CartPole-v1",
        "--nodes",
        "2",
        "--frames-per-batch",
        "100",
        "--total-frames",
        "1000",
        "--job-name",
        "rollout-test-cli-python",
        "--output-dir",
        &dir.display().to_string(),
        "--node-command",
        &nodes.shell_command(&py),
        "--json",
    ]);
    assert_eq!(code, Some(0), "stderr: {err}");
    let summary = out.lines().last().expect("a summary line");
    assert!(summary.contains("\"frames\":1000"), "{summary}");
    assert_no_job(&job_in(&err));
    let marks = nodes.marks();
    assert_eq!(marks.len(), 2, "both tasks ran the command: {marks:?}");
    let script = std::fs::read_dir(&dir)
        .expect("output dir")
        .filter_map(Result::ok)
        .map(|e| e.path().join("nodes.sbatch"))
        .find(|p| p.exists())
        .expect("the batch script");
    let script = std::fs::read_to_string(script).expect("read the script");
    assert!(
        script.contains(r"node marks'\'' here"),
        "the quote is escaped for sh:\n{script}"
    );
    assert!(
        script.contains("-m rollout_node --import rollout_mark --join "),
        "{script}"
    );
    for m in &marks {
        assert!(!rollout_tests::alive(m.pid), "node process {} outlived the run", m.pid);
    }
}

#[test]
fn a_node_command_that_fails_in_its_task_ends_the_join_wait_naming_it() {
    let err = builder("command-fails", false, 1000, SlurmOptions::default())
        .node_command(["/nonexistent/python", "-m", "rollout_node"])
        .join_timeout(SHORT_JOIN)
        .build()
        .expect_err("no node can start")
        .to_string();
    assert!(err.contains("ended before joining") && err.contains("FAILED"), "{err}");
    assert!(err.contains("/nonexistent/python"), "the task's log is quoted: {err}");
    assert_no_job(&job_in(&err));
}

/// An env the trainer cannot build (MuJoCo's HalfCheetah-v5, f64 observations) collected
/// from Python nodes in SLURM tasks: the trainer learns it from their `ready`, and every
/// frame of `--output` replays by seed through a fresh gymnasium env.
#[test]
fn cli_collects_an_env_only_the_python_nodes_know_and_its_frames_replay_by_seed() {
    require_slurm();
    let Some(py) = venv_python() else { return };
    let dir = scratch("cli-any-env");
    let out = dir.join("out.msgpack");
    let (code, stdout, err) = cli(&[
        "--launcher",
        "slurm",
        "--advertise",
        "127.0.0.1",
        "--env",
        "HalfCheetah-v5",
        "--nodes",
        "2",
        "--policy",
        "linear",
        "--exploration-type",
        "deterministic",
        "--seed",
        "9",
        "--frames-per-batch",
        "100",
        "--total-frames",
        "600",
        "--job-name",
        "rollout-test-cli-any-env",
        "--output-dir",
        &dir.display().to_string(),
        "--node-command",
        &format!("{} -m rollout_node", py.display()),
        "--output",
        &out.display().to_string(),
        "--json",
    ]);
    assert_eq!(code, Some(0), "stderr: {err}");
    let summary = stdout.lines().last().expect("a summary line");
    assert!(summary.contains("\"frames\":600"), "{summary}");
    assert_no_job(&job_in(&err));
    let records = rollout_tests::read_output(&out);
    for r in &records {
        let obs = &r.data["observation"];
        assert_eq!((obs.dtype(), &obs.shape()[2..]), (rollout::DType::F64, &[17][..]));
    }
    let replay = run_bounded(
        Command::new(&py).args(["-m", "rollout_node.replay"]).arg(&out).args([
            "--env",
            "HalfCheetah-v5",
            "--seed",
            "9",
        ]),
        Duration::from_secs(120),
    )
    .expect("start the replay");
    assert_eq!(replay.code(), Some(0), "replay: {}", replay.stderr_text());
}
