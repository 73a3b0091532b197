//! After shutdown (or drop) no thread of the collector is left; env workers run at the
//! priority asked for.
//! Alone in its binary so no other test's threads are counted.

use rollout::PolicyConfig;
use rollout_actors::DistributedCollector;

fn collector_threads() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .filter(|name| name.starts_with("actix") || name.starts_with("rollout"))
        .count()
}

#[test]
fn shutdown_and_drop_leave_no_thread_behind() {
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
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
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
        let lowered = nices.iter().filter(|&&n| n == base + nice).count();
        if nice > 0 {
            assert_eq!(lowered, 4, "{launcher:?}: one lowered thread per env worker: {nices:?}");
            assert!(
                nices.iter().all(|&n| n == base || n == base + nice),
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
