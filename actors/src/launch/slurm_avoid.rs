//! Which SLURM node a resubmitted task should avoid: the one its predecessor ran on.
//!
//! A node's connection was lost, so its task's host is suspect: dead, cut off from the
//! trainer, or unable to reach it. Resubmitted as it is, the task may be scheduled onto that
//! very host again (least loaded, or best fit, once the old task is gone from it), where it
//! cannot start, or starts and cannot join, until the join timeout; SLURM itself marks a dead
//! host down only after `SlurmdTimeout`, and a host cut off from the trainer alone never. So
//! the resubmission excludes that host (`sbatch --exclude`), unless SLURM has no other node
//! that answers, in which case excluding it would leave the task nowhere to run (a one-node
//! cluster: the task goes back where it was).

use super::slurm_command::{run, SlurmError, COMMAND_TIMEOUT};

/// The host to exclude when resubmitting in place of `task` (`JOBID_i`): where it runs or
/// ran, per `squeue` (still queued) or `scontrol show job` (ended lately), when `sinfo`
/// shows another node that answers. `None` when SLURM does not say where it ran.
pub(super) fn host_to_avoid(task: &str) -> Result<Option<String>, SlurmError> {
    let queued = match run("squeue", &["-h", "-j", task, "-o", "%N"], COMMAND_TIMEOUT) {
        Ok(out) => out,
        Err(SlurmError::Failed { stderr, .. }) if stderr.contains("Invalid job id") => String::new(),
        Err(e) => return Err(e),
    };
    let host = match one_host(&queued) {
        Some(h) => h,
        None => match run("scontrol", &["-o", "show", "job", task], COMMAND_TIMEOUT) {
            Ok(out) => match batch_host(&out) {
                Some(h) => h,
                None => return Ok(None),
            },
            Err(_) => return Ok(None),
        },
    };
    let nodes = run("sinfo", &["-h", "-N", "-o", "%N|%T"], COMMAND_TIMEOUT)?;
    Ok(others_answer(&nodes, &host).then_some(host))
}

/// The one node of `squeue -o '%N'` output (a node's task runs on one host; a pending
/// task has none).
fn one_host(squeue: &str) -> Option<String> {
    let node = squeue.lines().map(str::trim).find(|l| !l.is_empty())?;
    (!node.contains([',', '[', ' ', '(']) && node != "None").then(|| node.to_string())
}

/// `BatchHost=` of `scontrol -o show job` output: where the task's script ran.
fn batch_host(scontrol: &str) -> Option<String> {
    scontrol
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("BatchHost="))
        .filter(|h| !h.is_empty() && *h != "(null)")
        .map(str::to_string)
}

/// Whether `sinfo -N -o '%N|%T'` lists a node other than `host` that answers: not down,
/// drained, failing or unknown, and not marked `*` (not responding).
fn others_answer(sinfo: &str, host: &str) -> bool {
    sinfo.lines().any(|l| {
        let Some((node, state)) = l.trim().split_once('|') else {
            return false;
        };
        let state = state.trim();
        node.trim() != host
            && !state.ends_with('*')
            && !["down", "drain", "fail", "unknown", "future", "maint", "reboot", "power"]
                .iter()
                .any(|bad| state.starts_with(bad))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_where_the_task_runs_or_ran() {
        assert_eq!(one_host("rollout-h1\n"), Some("rollout-h1".into()));
        assert_eq!(one_host("\n"), None, "pending: no host yet");
        assert_eq!(one_host(""), None, "not queued");
        assert_eq!(one_host("h[1-2]\n"), None, "not one host");
        let show = "JobId=5 ArrayJobId=4 ArrayTaskId=1 JobState=FAILED BatchHost=rollout-h1 NumNodes=1";
        assert_eq!(batch_host(show), Some("rollout-h1".into()));
        assert_eq!(batch_host("JobId=5 JobState=PENDING BatchHost=(null)"), None);
        assert_eq!(batch_host("JobId=5 JobState=PENDING"), None);
    }

    #[test]
    fn the_host_is_avoided_only_when_another_node_answers() {
        let two = "rollout-h1|mixed\nrollout-h2|mixed\n";
        assert!(others_answer(two, "rollout-h1"));
        assert!(!others_answer("rollout-h1|mixed\n", "rollout-h1"), "the only node");
        assert!(!others_answer("rollout-h1|mixed\nrollout-h2|down*\n", "rollout-h1"));
        assert!(!others_answer("rollout-h1|idle\nrollout-h2|idle*\n", "rollout-h1"));
        assert!(!others_answer("rollout-h1|idle\nrollout-h2|drained\n", "rollout-h1"));
        assert!(others_answer("rollout-h1|down*\nrollout-h2|idle\n", "rollout-h1"));
    }
}
