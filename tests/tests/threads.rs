//! After shutdown (or drop) no thread of the collector is left.
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
