//! What a whole run yielded, and the checks every scenario makes of it.

use rollout::rollout::keys;
use rollout::TensorDict;
use rollout_actors::{Collected, DistributedCollector};

use crate::records::OutputRecord;

/// Every batch of a run, in order, until it ends (a run with `total_frames` set).
/// Panics on an error, and past 10,000 batches (a run that does not end).
pub fn drain(c: &mut DistributedCollector) -> Vec<Collected> {
    let mut out = Vec::new();
    while let Some(b) = c.next_batch().expect("batch") {
        out.push(b);
        assert!(out.len() < 10_000, "runaway collection");
    }
    out
}

/// How many trajectories end, in what was yielded, on a frame that is not `done`:
/// cut short by a failure (a killed node, a panicking env) or still running when
/// the run stopped (at most one per env lane).
pub fn cut_trajectories(batches: &[Collected]) -> usize {
    let mut last_done: std::collections::HashMap<i64, bool> = std::collections::HashMap::new();
    for b in batches {
        let ids = b.data.i64(keys::TRAJ_IDS).expect("ids");
        let done = b.data.bool(keys::NEXT_DONE).expect("done");
        let t = *ids.shape().last().expect("time dim");
        let ids = ids.as_slice().expect("contiguous");
        let done = done.as_slice().expect("contiguous");
        // Rows are lanes, time last: within a batch a lane's frames are in order.
        for r in 0..ids.len() / t {
            for i in 0..t {
                last_done.insert(ids[r * t + i], done[r * t + i]);
            }
        }
    }
    last_done.values().filter(|d| !**d).count()
}

/// Asserts that each trajectory id belongs to exactly one (node, env) lane and that its frames
/// there are consecutive steps, across all `batches` (async `[envs, T]` or sync `[nodes, envs, T]`).
pub fn assert_unique_traj_ids(batches: &[Collected]) {
    check_traj_ids(batches.iter().map(|b| (b.node, &b.data)));
}

/// [`assert_unique_traj_ids`] of the records of a `rollout collect --output` file.
pub fn assert_unique_traj_ids_in_records(records: &[OutputRecord]) {
    let dicts: Vec<(Option<usize>, TensorDict)> = records
        .iter()
        .map(|r| {
            let lead = r.data[keys::TRAJ_IDS].shape().to_vec();
            let entries = r.data.iter().map(|(k, t)| (k.clone(), t.clone()));
            (
                r.node,
                TensorDict::from_entries(&lead, entries).expect("a record's tensors share its batch shape"),
            )
        })
        .collect();
    check_traj_ids(dicts.iter().map(|(n, d)| (*n, d)));
}

fn check_traj_ids<'a>(batches: impl Iterator<Item = (Option<usize>, &'a TensorDict)>) {
    let mut seen: std::collections::HashMap<i64, (Vec<usize>, i64)> = std::collections::HashMap::new();
    for (node, data) in batches {
        let ids = data.i64(keys::TRAJ_IDS).expect("ids");
        let steps = data.i64(keys::STEP_COUNT).expect("steps");
        let shape = ids.shape().to_vec();
        let t = *shape.last().expect("time dim");
        let rows = ids.len() / t;
        let ids = ids.as_slice().expect("contiguous");
        let steps = steps.as_slice().expect("contiguous");
        for r in 0..rows {
            let lane = match node {
                Some(n) => vec![n, r],
                None => vec![r / shape[1], r % shape[1]],
            };
            for i in 0..t {
                let (id, sc) = (ids[r * t + i], steps[r * t + i]);
                match seen.get_mut(&id) {
                    None => {
                        seen.insert(id, (lane.clone(), sc));
                    }
                    Some((l, last)) => {
                        assert_eq!(*l, lane, "traj id {id} appears in two lanes");
                        assert_eq!(sc, *last + 1, "traj id {id} frames are not consecutive");
                        *last = sc;
                    }
                }
            }
        }
    }
    assert!(seen.len() > 1, "too few trajectories to tell");
}
