//! Which SLURM node a resubmitted task should avoid: the one its predecessor died on.
//!
//! A node's connection is gone but SLURM still shows its task `RUNNING`: the task's host
//! is dead or cut off from the trainer, and SLURM has not noticed yet (it marks a node
//! down only after `SlurmdTimeout`). Resubmitted as it is, the task may be scheduled onto
//! that very host again, where it cannot start (or cannot reach the trainer) until SLURM
//! gives up on the host and requeues it, long after the join timeout. So the resubmission
//! excludes that host (`sbatch --exclude`), unless SLURM has no other node that answers,
//! in which case excluding it would leave the task nowhere to run.
//!
//! A task that ended the ordinary way (cancelled, failed, completed) is not `RUNNING`:
//! nothing is excluded and SLURM schedules the resubmission as it likes.

use super::slurm::{run, SlurmError, COMMAND_TIMEOUT};

/// The host to exclude when resubmitting in place of `task` (`JOBID_i`), per `squeue`
/// (the task and where it runs) and `sinfo` (which nodes answer). `None` when the task
/// is not running, or its host is the only one that answers.
pub(super) fn host_to_avoid(task: &str) -> Result<Option<String>, SlurmError> {
    let out = match run("squeue", &["-h", "-j", task, "-o", "%T|%N"], COMMAND_TIMEOUT) {
        Ok(out) => out,
        Err(SlurmError::Failed { stderr, .. }) if stderr.contains("Invalid job id") => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(host) = running_on(&out) else {
        return Ok(None);
    };
    let nodes = run("sinfo", &["-h", "-N", "-o", "%N|%T"], COMMAND_TIMEOUT)?;
    Ok(others_answer(&nodes, &host).then_some(host))
}

/// The node of a `RUNNING` task in `squeue -o '%T|%N'` output (one node: a node's task
/// runs on one host).
fn running_on(squeue: &str) -> Option<String> {
    squeue.lines().find_map(|l| {
        let (state, node) = l.trim().split_once('|')?;
        let node = node.trim();
        (state.trim() == "RUNNING" && !node.is_empty() && !node.contains([',', '[', ' '])).then(|| node.to_string())
    })
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
    fn only_a_running_task_names_its_host() {
        assert_eq!(running_on("RUNNING|rollout-h1\n"), Some("rollout-h1".into()));
        assert_eq!(running_on("COMPLETING|rollout-h1\n"), None);
        assert_eq!(running_on("PENDING|\n"), None);
        assert_eq!(running_on(""), None);
        assert_eq!(running_on("RUNNING|h[1-2]\n"), None, "not one host");
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
