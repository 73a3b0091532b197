//! Async learners (issue 39) on the in-process actor system: every frame names the
//! weights that acted it, `prefetch` keeps frames exact, and `max_policy_lag` drops
//! what lags past it, asks again and counts it, while `total_frames` counts delivered
//! frames only.

use rollout::policy::Weights;
use rollout::{ExplorationType, PolicyConfig};
use rollout_actors::{CollectorBuilder, DistributedCollector};

/// Two local CartPole nodes of two envs, async, 100-frame batches, `total` frames.
fn builder(total: i64) -> CollectorBuilder {
    DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .exploration_type(ExplorationType::Random)
        .nodes(2)
        .envs_per_node(2)
        .frames_per_batch(100)
        .total_frames(total)
        .seed(3)
        .batch_timeout(std::time::Duration::from_secs(30))
}

/// The trainer's weights stored again as the next version: a learner's update.
fn renew(c: &mut DistributedCollector) -> u64 {
    let w = c.policy_weights(0).expect("weights").expect("node 0's weights");
    c.set_policy_weights(Weights::clone(&w)).expect("stored")
}

#[test]
fn with_prefetch_every_frame_names_its_version_and_total_frames_is_exact() {
    let mut c = builder(3_000)
        .prefetch(1)
        .update_after_each_batch(true)
        .build()
        .expect("collector");
    let (mut frames, mut stored, mut versions) = (0u64, 0u64, Vec::new());
    while let Some(b) = c.next_batch().expect("batch") {
        frames += b.data.numel() as u64;
        let per_frame = b.policy_version();
        assert_eq!(per_frame.shape(), b.data.batch_size(), "one version per frame");
        assert!(
            per_frame.iter().all(|&v| v == b.weights_version as i64),
            "an async batch is acted by one version"
        );
        assert_eq!(
            b.policy_lag,
            stored - b.weights_version,
            "lag against the stored version"
        );
        assert!(!b.lagging);
        versions.push(b.weights_version);
        stored = renew(&mut c);
        c.recycle(b);
    }
    assert_eq!(
        frames, 3_000,
        "exactly total_frames, prefetched batches past it dropped"
    );
    assert!(
        versions.windows(2).any(|w| w[1] > w[0]) && versions.iter().any(|&v| v > 0),
        "the pushed versions reach the frames: {versions:?}"
    );
    c.shutdown().expect("shutdown");
}

#[test]
fn a_sync_batch_gives_each_nodes_frames_its_version_split_into_trajectories_or_not() {
    for split in [false, true] {
        let mut c = builder(-1).sync(true).split_trajs(split).build().expect("collector");
        let first = c.next_batch().expect("batch").expect("endless");
        assert!(first.policy_version().iter().all(|&v| v == 0));
        c.recycle(first);
        // New weights for node 0 only: the next round's shares differ.
        let w = c.policy_weights(0).expect("weights").expect("node 0's weights");
        let v = c.update_policy_weights(Weights::clone(&w), Some(&[0])).expect("stored");
        let b = c.next_batch().expect("batch").expect("endless");
        assert_eq!(b.weights_versions, vec![v, 0]);
        let per_frame = b.policy_version();
        assert_eq!(per_frame.shape(), b.data.batch_size());
        if split {
            // Trajectories of either node, padded: half the real frames are node 0's.
            let Ok(rollout::Tensor::Bool(mask)) = b.data.get(rollout::rollout::keys::MASK) else {
                panic!("a split batch has its mask");
            };
            let newer = per_frame
                .iter()
                .zip(mask.iter())
                .filter(|(&v_, &m)| m && v_ == v as i64)
                .count();
            let older = per_frame
                .iter()
                .zip(mask.iter())
                .filter(|(&v_, &m)| m && v_ == 0)
                .count();
            assert_eq!((newer, older), (50, 50), "each node's 50 frames keep its version");
        } else {
            let node = |n: usize| {
                per_frame
                    .index_axis(ndarray::Axis(0), n)
                    .iter()
                    .copied()
                    .collect::<Vec<_>>()
            };
            assert!(node(0).iter().all(|&x| x == v as i64), "node 0's share: {:?}", node(0));
            assert!(node(1).iter().all(|&x| x == 0), "node 1's share: {:?}", node(1));
        }
        c.shutdown().expect("shutdown");
    }
}

#[test]
fn past_max_policy_lag_batches_are_dropped_asked_again_and_counted() {
    let mut c = builder(4_000)
        .max_policy_lag(0)
        .update_after_each_batch(true)
        .build()
        .expect("collector");
    let mut frames = 0u64;
    while let Some(b) = c.next_batch().expect("batch") {
        assert_eq!(b.policy_lag, 0, "nothing past the cap is delivered");
        frames += b.data.numel() as u64;
        // A new version after each batch: the other node's batch, collected meanwhile
        // with the older one, lags by one when it comes.
        renew(&mut c);
        c.recycle(b);
    }
    let stats = c.stats().expect("stats");
    assert_eq!(frames, 4_000, "total_frames counts delivered frames only");
    assert!(stats.dropped_lagging > 0, "two nodes, a version a batch: some lag");
    assert_eq!(stats.frames_dropped_lagging, stats.dropped_lagging * 100);
    assert!(
        stats.frames_collected >= frames + stats.frames_dropped_lagging,
        "every dropped frame was collected again: {stats:?}"
    );
    c.shutdown().expect("shutdown");
}

#[test]
fn lagging_batches_can_be_delivered_flagged_instead() {
    let mut c = builder(2_000)
        .max_policy_lag(0)
        .deliver_lagging(true)
        .update_after_each_batch(true)
        .build()
        .expect("collector");
    let (mut frames, mut flagged) = (0u64, 0);
    while let Some(b) = c.next_batch().expect("batch") {
        assert_eq!(b.lagging, b.policy_lag > 0, "flagged exactly when past the cap");
        flagged += usize::from(b.lagging);
        frames += b.data.numel() as u64;
        renew(&mut c);
        c.recycle(b);
    }
    assert_eq!(frames, 2_000);
    assert!(flagged > 0, "two nodes, a version a batch: some lag");
    assert_eq!(c.stats().expect("stats").dropped_lagging, 0);
    c.shutdown().expect("shutdown");
}

#[test]
fn the_cap_and_prefetch_are_refused_for_sync_runs_naming_the_field() {
    for (b, field) in [
        (builder(1_000).sync(true).max_policy_lag(1), "max_policy_lag"),
        (builder(1_000).sync(true).prefetch(1), "prefetch"),
        (builder(1_000).prefetch(17), "prefetch"),
        (builder(1_000).deliver_lagging(true), "deliver_lagging"),
    ] {
        match b.build() {
            Ok(_) => panic!("{field}: accepted"),
            Err(e) => assert!(e.to_string().contains(field), "{field}: {e}"),
        }
    }
}
