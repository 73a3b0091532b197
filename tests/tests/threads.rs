//! After shutdown (or drop) no thread of the collector is left; env workers run at the
//! priority asked for.
//! Alone in its binary so no other binary's threads are counted; the tests here count
//! every thread of the process, so each holds [`ALONE`] while it runs (`cargo test`
//! runs a binary's tests side by side in one process).

use std::sync::{Mutex, MutexGuard};

use rollout::PolicyConfig;
use rollout_actors::DistributedCollector;

/// Held by each test of this binary for its whole run, so no test sees another's threads.
static ALONE: Mutex<()> = Mutex::new(());

fn alone() -> MutexGuard<'static, ()> {
    // A test that failed holding the lock poisons it; the next one still runs alone.
    ALONE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The threads of process `pid` (`"self"` for this one): the entries of `/proc/<pid>/task`.
/// Panics when they cannot be read, so that a count of none is a count, never a
/// missing `/proc`.
fn tasks(pid: &str) -> std::fs::ReadDir {
    let path = format!("/proc/{pid}/task");
    std::fs::read_dir(&path).unwrap_or_else(|e| panic!("cannot read {path} to count threads: {e}"))
}

/// The collector's threads of this process (actix arbiters and `rollout` workers). A
/// thread that ends while it is looked at is not counted.
fn collector_threads() -> usize {
    tasks("self")
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .filter(|name| name.starts_with("actix") || name.starts_with("rollout"))
        .count()
}

#[test]
fn shutdown_and_drop_leave_no_thread_behind() {
    let _alone = alone();
    assert_eq!(collector_threads(), 0);
    for use_drop in [false, true] {
        let mut c = DistributedCollector::builder()
            .env("CartPole-v1")
            .policy(PolicyConfig::Linear)
            .nodes(2)
            .envs_per_node(2)
            .frames_per_batch(100)
            .total_frames(-1)
            .build()
            .expect("valid");
        c.next_batch().expect("ok").expect("batch");
        // system thread + 4 env-worker arbiters
        assert!(
            collector_threads() >= 5,
            "threads while running: {}",
            collector_threads()
        );
        if use_drop {
            drop(c);
        } else {
            c.shutdown().expect("shutdown");
        }
        assert_eq!(collector_threads(), 0, "threads left after shutdown (drop={use_drop})");
    }
}

/// Every thread of process `pid` (`"self"` for this one): its nice value.
fn thread_nices(pid: &str) -> Vec<i32> {
    tasks(pid)
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|stat| {
            // Fields after the command name (which may hold spaces): state is field 3,
            // nice is field 19.
            let rest = &stat[stat.rfind(')')? + 2..];
            rest.split(' ').nth(19 - 3)?.parse().ok()
        })
        .collect()
}

#[test]
fn env_worker_threads_run_at_the_configured_nice_and_no_other_thread_does() {
    use rollout_actors::Launcher;
    let _alone = alone();
    for (launcher, nice) in [(Launcher::Local, 7), (Launcher::Local, 0), (Launcher::Process, 12)] {
        let mut b = DistributedCollector::builder()
            .env("CartPole-v1")
            .policy(PolicyConfig::Linear)
            .nodes(2)
            .envs_per_node(2)
            .sync(true)
            .frames_per_batch(400)
            .total_frames(-1)
            .worker_nice(nice)
            .launcher(launcher.clone());
        if launcher == Launcher::Process {
            b = b.node_program(rollout_tests::rollout_bin());
        }
        let mut c = b.build().expect("valid");
        // A sync batch holds a share of every worker: all four have started.
        c.next_batch().expect("ok").expect("batch");
        let nices: Vec<i32> = match launcher {
            Launcher::Local => thread_nices("self"),
            _ => c
                .node_pids()
                .iter()
                .flat_map(|p| thread_nices(&p.to_string()))
                .collect(),
        };
        let base = thread_nices("self").into_iter().min().expect("threads");
        // The kernel caps a nice value at 19: under `nice -n 10`, 12 more is 19.
        let target = (base + nice).min(19);
        let lowered = nices.iter().filter(|&&n| n == target).count();
        if nice > 0 {
            assert!(target > base, "run the tests below nice 19 to tell a lowered thread");
            assert_eq!(lowered, 4, "{launcher:?}: one lowered thread per env worker: {nices:?}");
            assert!(
                nices.iter().all(|&n| n == base || n == target),
                "{launcher:?}: other threads untouched: {nices:?}"
            );
        } else {
            assert!(
                nices.iter().all(|&n| n == base),
                "{launcher:?}: nothing lowered: {nices:?}"
            );
        }
        c.shutdown().expect("shutdown");
    }
}
